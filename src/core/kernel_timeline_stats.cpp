#include "core/kernel_timeline_stats.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <tuple>

namespace cedar {
namespace {

bool has_time(const KernelRecord& r) { return !(r.start_ns == 0 && r.end_ns == 0) && r.end_ns >= r.start_ns; }

template <typename Stats>
void sort_by_total(std::vector<Stats>& v) {
  std::sort(v.begin(), v.end(), [](const Stats& a, const Stats& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  });
}

}  // namespace

TimelineStats analyze_timeline(std::span<const KernelRecord> records) {
  TimelineStats s;
  std::map<std::string, size_t> name_index;
  std::map<uint32_t, size_t> stream_index;
  std::vector<size_t> name_of, stream_of;  // per record: its name / stream slot
  // (time, 0 = end / 1 = start, record): ends sort before starts at the same time (half-open intervals).
  std::vector<std::tuple<uint64_t, int, size_t>> events;
  name_of.resize(records.size());
  stream_of.resize(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const KernelRecord& r = records[i];
    if (!has_time(r)) {
      ++s.skipped;
      continue;
    }
    auto [n, new_name] = name_index.try_emplace(r.name, s.by_name.size());
    if (new_name) s.by_name.push_back({r.name, 0, 0, 0});
    auto [st, new_stream] = stream_index.try_emplace(r.stream_id, s.streams.size());
    if (new_stream) s.streams.push_back({r.stream_id, 0, 0});
    name_of[i] = n->second;
    stream_of[i] = st->second;
    KernelNameStats& k = s.by_name[n->second];
    ++k.calls;
    k.total_ns += static_cast<int64_t>(r.end_ns - r.start_ns);
    ++s.streams[st->second].kernels;
    if (s.kernels == 0 || r.start_ns < s.first_start_ns) s.first_start_ns = r.start_ns;
    if (s.kernels == 0 || r.end_ns > s.last_end_ns) s.last_end_ns = r.end_ns;
    ++s.kernels;
    events.emplace_back(r.start_ns, 1, i);
    events.emplace_back(r.end_ns, 0, i);
  }
  std::sort(events.begin(), events.end());
  // Between two consecutive event times the set of running kernels is constant. The sum of the running
  // records' indices names the one running kernel when only one runs.
  int64_t running = 0;
  size_t index_sum = 0;
  std::vector<int64_t> stream_running(s.streams.size(), 0);
  uint64_t prev = events.empty() ? 0 : std::get<0>(events.front());
  for (const auto& [t, is_start, i] : events) {
    const auto dt = static_cast<int64_t>(t - prev);
    if (dt > 0 && running > 0) {
      s.busy_ns += dt;
      if (running >= 2) s.overlap_ns += dt;
      if (running == 1) s.by_name[name_of[index_sum]].exposed_ns += dt;
      for (size_t k = 0; k < s.streams.size(); ++k)
        if (stream_running[k] > 0) s.streams[k].busy_ns += dt;
    }
    prev = t;
    const int64_t d = is_start ? 1 : -1;
    running += d;
    index_sum = is_start ? index_sum + i : index_sum - i;
    stream_running[stream_of[i]] += d;
  }
  s.wall_ns = s.kernels > 0 ? static_cast<int64_t>(s.last_end_ns - s.first_start_ns) : 0;
  s.idle_ns = s.wall_ns - s.busy_ns;
  sort_by_total(s.by_name);
  std::sort(s.streams.begin(), s.streams.end(),
            [](const StreamBusy& a, const StreamBusy& b) { return a.stream_id < b.stream_id; });
  return s;
}

MeanTimelineStats average_timelines(std::span<const TimelineStats> steps) {
  MeanTimelineStats m;
  m.steps = static_cast<int64_t>(steps.size());
  if (steps.empty()) return m;
  std::map<std::string, MeanKernelStats> names;
  std::map<uint32_t, MeanStreamBusy> streams;
  for (const TimelineStats& s : steps) {
    m.kernels += static_cast<double>(s.kernels);
    m.wall_ns += static_cast<double>(s.wall_ns);
    m.busy_ns += static_cast<double>(s.busy_ns);
    m.idle_ns += static_cast<double>(s.idle_ns);
    m.overlap_ns += static_cast<double>(s.overlap_ns);
    for (const KernelNameStats& k : s.by_name) {
      MeanKernelStats& a = names[k.name];
      a.name = k.name;
      a.calls += static_cast<double>(k.calls);
      a.total_ns += static_cast<double>(k.total_ns);
      a.exposed_ns += static_cast<double>(k.exposed_ns);
    }
    for (const StreamBusy& b : s.streams) {
      MeanStreamBusy& a = streams[b.stream_id];
      a.stream_id = b.stream_id;
      a.kernels += static_cast<double>(b.kernels);
      a.busy_ns += static_cast<double>(b.busy_ns);
    }
  }
  const auto n = static_cast<double>(steps.size());
  m.kernels /= n;
  m.wall_ns /= n;
  m.busy_ns /= n;
  m.idle_ns /= n;
  m.overlap_ns /= n;
  for (auto& [name, a] : names) {
    a.calls /= n;
    a.total_ns /= n;
    a.exposed_ns /= n;
    m.by_name.push_back(a);
  }
  sort_by_total(m.by_name);
  for (auto& [id, a] : streams) {
    a.kernels /= n;
    a.busy_ns /= n;
    m.streams.push_back(a);
  }
  return m;
}

Result<std::vector<std::vector<KernelRecord>>> split_steps(std::span<const KernelRecord> records,
                                                           std::span<const uint64_t> stamps) {
  if (stamps.size() < 2) return make_error("split_steps: need at least 2 stamps, got " + std::to_string(stamps.size()));
  for (size_t i = 1; i < stamps.size(); ++i)
    if (stamps[i] < stamps[i - 1])
      return make_error("split_steps: stamp " + std::to_string(i) + " (" + std::to_string(stamps[i]) +
                        " ns) is before stamp " + std::to_string(i - 1) + " (" + std::to_string(stamps[i - 1]) +
                        " ns)");
  std::vector<std::vector<KernelRecord>> steps(stamps.size() - 1);
  for (const KernelRecord& r : records) {
    // The last stamp <= start opens the record's window.
    const auto it = std::upper_bound(stamps.begin(), stamps.end(), r.start_ns);
    if (it == stamps.begin() || it == stamps.end()) continue;
    steps[static_cast<size_t>(it - stamps.begin()) - 1].push_back(r);
  }
  for (auto& s : steps)
    std::stable_sort(s.begin(), s.end(),
                     [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  return steps;
}

Result<LayerCut> cut_layer(std::span<const KernelRecord> step, int64_t layers, int64_t layer,
                           std::span<const std::string> heads) {
  if (layers <= 0 || layer < 0 || layer >= layers)
    return make_error("cut_layer: layer " + std::to_string(layer) + " of " + std::to_string(layers) +
                      " is out of range");
  std::vector<const KernelRecord*> sorted;
  for (const KernelRecord& r : step)
    if (has_time(r)) sorted.push_back(&r);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const KernelRecord* a, const KernelRecord* b) { return a->start_ns < b->start_ns; });
  auto is_head = [&](const std::string& name) { return std::find(heads.begin(), heads.end(), name) != heads.end(); };
  auto starts_of = [&](const auto& match) {  // the start of every record whose name matches, in time order
    std::vector<uint64_t> s;
    for (const KernelRecord* r : sorted)
      if (match(r->name)) s.push_back(r->start_ns);
    return s;
  };
  std::string anchor_name;
  std::vector<uint64_t> starts = starts_of(is_head);
  if (!heads.empty() && static_cast<int64_t>(starts.size()) == layers) {
    std::vector<std::string> ran;  // the heads that ran, in the order of their first call
    for (const KernelRecord* r : sorted)
      if (is_head(r->name) && std::find(ran.begin(), ran.end(), r->name) == ran.end()) ran.push_back(r->name);
    for (const std::string& name : ran) anchor_name += (anchor_name.empty() ? "" : " | ") + name;
  } else {
    std::map<std::string, std::pair<int64_t, uint64_t>> seen;  // name -> (calls, first start)
    for (const KernelRecord* r : sorted) {
      auto [it, fresh] = seen.try_emplace(r->name, 0, r->start_ns);
      ++it->second.first;
    }
    const std::string* anchor = nullptr;
    uint64_t anchor_first = 0;
    for (const auto& [name, v] : seen)  // map order: the first name wins a tie
      if (v.first == layers && (anchor == nullptr || v.second < anchor_first)) {
        anchor = &name;
        anchor_first = v.second;
      }
    if (anchor == nullptr)
      return make_error("cut_layer: no kernel runs exactly " + std::to_string(layers) + " times in the step (" +
                        std::to_string(sorted.size()) + " kernels, " + std::to_string(seen.size()) +
                        " names): no per-layer anchor");
    anchor_name = *anchor;
    starts = starts_of([&](const std::string& name) { return name == anchor_name; });
  }
  const uint64_t from = starts[static_cast<size_t>(layer)];
  const bool last = layer + 1 == layers;
  const uint64_t to = last ? 0 : starts[static_cast<size_t>(layer) + 1];
  LayerCut cut;
  cut.anchor = anchor_name;
  cut.layer = layer;
  for (const KernelRecord* r : sorted)
    if (r->start_ns >= from && (last || r->start_ns < to)) cut.records.push_back(*r);
  return cut;
}

std::string tidy_kernel_name(std::string s) {
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  // The parameter list: the parenthesized group that ends the name (template arguments may hold parentheses).
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++depth;
      if (s[i] == '(' && --depth == 0) {
        s.erase(i);
        break;
      }
    }
  }
  for (const std::string q : {"(anonymous namespace)::", "cedar::cuda::", "cedar::"})
    for (size_t p; (p = s.find(q)) != std::string::npos;) s.erase(p, q.size());
  return s;
}

std::string demangle_kernel_name(const char* symbol) {
  if (symbol == nullptr) return "(unnamed)";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(symbol, nullptr, nullptr, &status), std::free);
  return tidy_kernel_name(status == 0 && out ? std::string(out.get()) : std::string(symbol));
}

}  // namespace cedar
