// The decode kernel timeline of `cedar bench --device cuda --timeline STEPS` (bench_cuda_timeline.h).
#include "cli/bench_cuda_timeline.h"

#ifdef CEDAR_HAVE_CUDA
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/kernel_timeline.h"
#include "core/kernel_timeline_stats.h"

namespace cedar::cli {
namespace {

using json = nlohmann::ordered_json;

double us(double ns) { return ns / 1e3; }

// The same records keyed by hardware channel instead of stream: which of the two tells a graph's
// concurrent branches apart is CUPTI's business, so both are shown.
std::vector<KernelRecord> by_channel(std::vector<KernelRecord> step) {
  for (KernelRecord& r : step) r.stream_id = r.channel_id;
  return step;
}

json lanes_json(const MeanTimelineStats& m) {
  json j = json::array();
  for (const MeanStreamBusy& s : m.streams)
    j.push_back({{"id", s.stream_id}, {"kernels", s.kernels}, {"busy_us", us(s.busy_ns)}});
  return j;
}

// The busiest lanes first, at most kShownLanes of them: CUPTI gives every graph-branch segment of a decode
// step its own stream id (s8 run 7: hundreds), so the rest is summed into one entry (all are in the JSON).
constexpr size_t kShownLanes = 8;
std::string lanes_text(const char* what, const MeanTimelineStats& m) {
  std::vector<MeanStreamBusy> lanes = m.streams;
  std::stable_sort(lanes.begin(), lanes.end(),
                   [](const MeanStreamBusy& a, const MeanStreamBusy& b) { return a.busy_ns > b.busy_ns; });
  std::string text;
  for (size_t i = 0; i < lanes.size() && i < kShownLanes; ++i) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s%s %u busy %.1f us (%.1f kernels)", text.empty() ? "" : ", ", what,
                  lanes[i].stream_id, us(lanes[i].busy_ns), lanes[i].kernels);
    text += buf;
  }
  if (lanes.size() > kShownLanes) {
    double busy = 0, kernels = 0;
    for (size_t i = kShownLanes; i < lanes.size(); ++i) busy += lanes[i].busy_ns, kernels += lanes[i].kernels;
    char buf[128];
    std::snprintf(buf, sizeof buf, ", %zu more %ss busy %.1f us (%.1f kernels) together", lanes.size() - kShownLanes,
                  what, us(busy), kernels);
    text += buf;
  }
  return text;
}

// One step's kernels as offsets from `origin`: the layer sequence (with the gap before each kernel) and the
// full step in the JSON.
json sequence_json(const std::vector<KernelRecord>& records, uint64_t origin, bool print) {
  json j = json::array();
  uint64_t max_end = origin;
  if (print)
    std::fprintf(stderr, "  %10s %9s %9s %7s %5s  %s\n", "offset_us", "dur_us", "gap_us", "stream", "chan", "name");
  for (const KernelRecord& r : records) {
    const double offset = us(static_cast<double>(r.start_ns - origin));
    const double dur = us(static_cast<double>(r.end_ns - r.start_ns));
    // > 0: the GPU ran nothing of this window for that long before the kernel; < 0: it starts beside another.
    const double gap = us(static_cast<double>(r.start_ns) - static_cast<double>(max_end));
    max_end = std::max(max_end, r.end_ns);
    if (print)
      std::fprintf(stderr, "  %10.2f %9.2f %9.2f %7u %5u  %s\n", offset, dur, gap, r.stream_id, r.channel_id,
                   r.name.c_str());
    j.push_back({{"offset_us", offset},
                 {"dur_us", dur},
                 {"gap_us", gap},
                 {"stream", r.stream_id},
                 {"channel", r.channel_id},
                 {"name", r.name},
                 {"grid", {r.grid[0], r.grid[1], r.grid[2]}},
                 {"block", {r.block[0], r.block[1], r.block[2]}},
                 {"registers", r.registers},
                 {"shared_bytes", r.shared_bytes}});
  }
  return j;
}

json fail(json j, int64_t batch, const std::string& why) {
  std::fprintf(stderr, "\ndecode timeline at batch %lld: %s (the rest of the bench goes on)\n",
               static_cast<long long>(batch), why.c_str());
  j["error"] = why;
  return j;
}

}  // namespace

json bench_decode_timeline(cuda::CudaModel& m, const cuda::CudaSequence& base, const DecodeTimelineOptions& o) {
  json j = {{"batch", o.batch}, {"steps", o.steps}};
  std::vector<cuda::CudaSequence> seqs;
  std::vector<cuda::CudaSequence*> ptrs;
  for (int64_t b = 0; b < o.batch; ++b) {
    auto s = m.fork_sequence(base);
    if (!s.ok()) return fail(j, o.batch, "fork: " + s.error().message);
    seqs.push_back(std::move(*s));
  }
  for (auto& s : seqs) ptrs.push_back(&s);
  auto tokens = [&](int64_t step) {
    std::vector<int64_t> t(static_cast<size_t>(o.batch));
    for (int64_t b = 0; b < o.batch; ++b) t[static_cast<size_t>(b)] = (3000 + 7919 * b + 104729 * step) % 128000;
    return t;
  };
  auto timeline = cuda::KernelTimeline::start();
  if (!timeline.ok()) return fail(j, o.batch, timeline.error().message);
  // The step's graph is captured again with CUPTI attached (set_paths drops the graphs), so its kernel nodes
  // are traced whether or not CUPTI sees graphs instantiated before it was enabled. Two warm-up steps: the
  // first runs directly, the second captures; the recorded steps are replays.
  m.set_paths(m.options().paths);
  cuda::CudaStepOutput out;
  std::vector<uint64_t> stamps;
  Status st = Status::Ok();
  for (int64_t i = 0; i < 2 && st.ok(); ++i) st = m.decode_step(ptrs, tokens(i), out);
  for (int64_t i = 0; i <= o.steps && st.ok(); ++i) {
    if (i > 0) st = m.decode_step(ptrs, tokens(2 + i), out);
    if (!st.ok()) break;
    auto stamp = timeline->synchronize_and_stamp();
    if (!stamp.ok())
      st = stamp.error();
    else
      stamps.push_back(*stamp);
  }
  auto records = timeline->stop_and_collect();
  if (!st.ok()) return fail(j, o.batch, "decode step: " + st.error().message);
  if (!records.ok()) return fail(j, o.batch, records.error().message);
  auto steps = split_steps(*records, stamps);
  if (!steps.ok()) return fail(j, o.batch, steps.error().message);
  std::vector<TimelineStats> stats, channel_stats;
  for (const auto& s : *steps) {
    if (s.empty())
      return fail(j, o.batch,
                  "a recorded step has no kernel records (" + std::to_string(records->size()) +
                      " records in all): CUPTI did not trace the step's graph");
    stats.push_back(analyze_timeline(s));
    channel_stats.push_back(analyze_timeline(by_channel(s)));
  }
  const MeanTimelineStats mean = average_timelines(stats), channels = average_timelines(channel_stats);
  const double host_step_us = us(static_cast<double>(stamps.back() - stamps.front()) / static_cast<double>(o.steps));
  const double wall = mean.wall_ns > 0 ? mean.wall_ns : 1;

  std::fprintf(stderr,
               "\ndecode timeline at batch %lld (CUPTI kernel records of %lld graph replays; traced step %.1f us "
               "host",
               static_cast<long long>(o.batch), static_cast<long long>(o.steps), host_step_us);
  if (o.untraced_step_s > 0) std::fprintf(stderr, " vs untraced TPOT %.1f us", 1e6 * o.untraced_step_s);
  std::fprintf(stderr, "; means per step):\n");
  std::fprintf(stderr,
               "  wall %.1f us (first kernel start -> last end), busy %.1f (%.1f %%), idle %.1f (%.1f %%), >= 2 "
               "kernels %.1f us (%.1f %%), %.0f kernels\n",
               us(mean.wall_ns), us(mean.busy_ns), 100 * mean.busy_ns / wall, us(mean.idle_ns),
               100 * mean.idle_ns / wall, us(mean.overlap_ns), 100 * mean.overlap_ns / wall, mean.kernels);
  std::fprintf(stderr, "  %s\n  %s\n", lanes_text("stream", mean).c_str(), lanes_text("channel", channels).c_str());
  std::fprintf(stderr, "  %-64s %7s %10s %9s %10s %6s\n", "kernel", "calls", "total_us", "mean_us", "exposed_us",
               "%wall");
  json names = json::array();
  for (size_t i = 0; i < mean.by_name.size(); ++i) {
    const MeanKernelStats& k = mean.by_name[i];
    if (static_cast<int64_t>(i) < o.top_kernels)
      std::fprintf(stderr, "  %-64s %7.1f %10.1f %9.2f %10.1f %6.1f\n", k.name.c_str(), k.calls, us(k.total_ns),
                   us(k.mean_ns()), us(k.exposed_ns), 100 * k.total_ns / wall);
    names.push_back({{"name", k.name},
                     {"calls", k.calls},
                     {"total_us", us(k.total_ns)},
                     {"mean_us", us(k.mean_ns())},
                     {"exposed_us", us(k.exposed_ns)},
                     {"pct_wall", 100 * k.total_ns / wall}});
  }
  if (static_cast<int64_t>(mean.by_name.size()) > o.top_kernels)
    std::fprintf(stderr, "  (%zu more names in the JSON)\n", mean.by_name.size() - static_cast<size_t>(o.top_kernels));
  j["host_step_us"] = host_step_us;
  if (o.untraced_step_s > 0) j["untraced_step_us"] = 1e6 * o.untraced_step_s;
  j["wall_us"] = us(mean.wall_ns);
  j["busy_us"] = us(mean.busy_ns);
  j["idle_us"] = us(mean.idle_ns);
  j["overlap_us"] = us(mean.overlap_ns);
  j["kernels_per_step"] = mean.kernels;
  j["streams"] = lanes_json(mean);
  j["channels"] = lanes_json(channels);
  j["kernels"] = names;

  // Two middle layers of the middle step (layer kinds alternate: e.g. an indexer layer and an SWA-only one):
  // the chain and its gaps.
  const size_t mid = steps->size() / 2;
  const std::vector<KernelRecord>& step = (*steps)[mid];
  const int64_t layers = m.config().num_hidden_layers;
  auto layer_json = [&](int64_t layer) -> json {
    // A layer opens with q_norm: its own launch, or one with the SWA KV encode (q_norm_kv_encode), both with
    // the codes (fused_act_quant). Not the <false> forms: the final norm is rms_norm_kernel<false>, and one
    // call more than the layers sends cut_layer back to its single-name rule.
    static const std::string heads[] = {"rms_norm_kernel<true>", "q_norm_swa_kv_encode_kernel<true>"};
    auto cut = cut_layer(step, layers, layer, heads);
    if (!cut.ok() || cut->records.empty()) {
      const std::string why = cut.ok() ? "the layer has no kernels" : cut.error().message;
      std::fprintf(stderr, "\n  layer sequence: %s\n", why.c_str());
      return {{"error", why}};
    }
    const uint64_t origin = cut->records.front().start_ns;
    const TimelineStats ls = analyze_timeline(cut->records);
    std::fprintf(stderr,
                 "\n  layer %lld of %lld in step %zu (from the %lld-th start of %s to the next): %zu kernels, span "
                 "%.1f us, busy %.1f, idle %.1f, >= 2 kernels %.1f\n",
                 static_cast<long long>(layer), static_cast<long long>(layers), mid, static_cast<long long>(layer + 1),
                 cut->anchor.c_str(), cut->records.size(), us(static_cast<double>(ls.wall_ns)),
                 us(static_cast<double>(ls.busy_ns)), us(static_cast<double>(ls.idle_ns)),
                 us(static_cast<double>(ls.overlap_ns)));
    return {{"layer", layer},
            {"layers", layers},
            {"step", mid},
            {"anchor", cut->anchor},
            {"busy_us", us(static_cast<double>(ls.busy_ns))},
            {"overlap_us", us(static_cast<double>(ls.overlap_ns))},
            {"kernels", sequence_json(cut->records, origin, true)}};
  };
  j["layer"] = layer_json(layers / 2);
  if (layers / 2 + 1 < layers) j["next_layer"] = layer_json(layers / 2 + 1);
  j["step_records"] = sequence_json(step, step.front().start_ns, false);
  return j;
}

}  // namespace cedar::cli
#endif
