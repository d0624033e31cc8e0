#include "model/inventory.h"

#include <algorithm>
#include <cstdio>
#include <unordered_map>

namespace cedar {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string human_bytes(uint64_t b) {
  const double v = static_cast<double>(b);
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof(buf), "%.2f GB", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof(buf), "%.2f MB", v / 1e6);
  else std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

template <typename T, typename Fn>
void append_group(std::string& out, const std::string& title, const std::vector<T>& items, size_t max_names,
                  Fn describe) {
  if (items.empty()) return;
  out += "\n" + title + " (" + std::to_string(items.size()) + "):";
  const size_t shown = std::min(items.size(), max_names);
  for (size_t i = 0; i < shown; ++i) out += "\n  " + describe(items[i]);
  if (items.size() > shown) out += "\n  ... and " + std::to_string(items.size() - shown) + " more";
}

int64_t count_where(const LayerPlan& plan, bool LayerRole::*flag) {
  return std::count_if(plan.layers.begin(), plan.layers.end(), [flag](const LayerRole& r) { return r.*flag; });
}

}  // namespace

bool matches_pattern(std::string_view name, std::string_view pattern) {
  while (true) {
    const size_t np = name.find('.'), pp = pattern.find('.');
    const std::string_view nseg = name.substr(0, np), pseg = pattern.substr(0, pp);
    if (pseg == "*" ? nseg.empty() : nseg != pseg) return false;
    if (np == std::string_view::npos || pp == std::string_view::npos) return np == pp;
    name.remove_prefix(np + 1);
    pattern.remove_prefix(pp + 1);
  }
}

std::vector<CountContract> tensor_count_contract(const ModelConfig& c, const LayerPlan& plan) {
  const int64_t n = plan.num_layers();
  const auto drafts = static_cast<int64_t>(plan.drafts.size());
  std::vector<CountContract> out = {
      {"layers.*.attn.wq_a.weight", n},
      {"layers.*.attn.compressor.wkv.weight", count_where(plan, &LayerRole::owns_compressor)},
      {"layers.*.attn.compressor.wgate.weight", count_where(plan, &LayerRole::compressor_has_gate)},
      {"layers.*.attn.indexer.wq_b.weight", count_where(plan, &LayerRole::owns_indexer)},
  };
  if (c.arch == Arch::DeepseekV41) {
    out.push_back({"layers.*.attn.indexer.wk.weight", count_where(plan, &LayerRole::owns_indexer_keys)});
    out.push_back({"layers.*.engram.embed.weight", count_where(plan, &LayerRole::has_engram)});
  } else {
    out.push_back({"layers.*.attn.indexer.compressor.wkv.weight", count_where(plan, &LayerRole::owns_indexer_keys)});
    out.push_back({"layers.*.ffn.gate.tid2eid", count_where(plan, &LayerRole::hash_routed)});
  }
  out.push_back({"layers.*.ffn.experts.*.*.weight", n * c.n_routed_experts * 3});
  if (drafts > 0) {
    out.push_back({"mtp.*.attn.wq_a.weight", drafts});
    out.push_back({"mtp.*.ffn.experts.*.*.weight", drafts * c.draft_n_routed_experts() * 3});
  }
  return out;
}

InventoryOptions inventory_options(const ModelConfig& c, const LayerPlan& plan) {
  InventoryOptions o;
  o.accept_vision = c.has_vision;
  o.contract = tensor_count_contract(c, plan);
  return o;
}

bool InventoryReport::ok() const {
  return missing.empty() && unexpected.empty() && dtype_mismatches.empty() && shape_mismatches.empty() &&
         count_mismatches.empty();
}

std::string InventoryReport::format(size_t max_names) const {
  std::string out = "inventory: " + std::to_string(expected_tensors) + " tensors expected, " +
                    std::to_string(actual_tensors) + " found (" + human_bytes(actual_bytes) + "), " +
                    std::to_string(matched_tensors) + " match";
  if (vision_tensors > 0)
    out += "; vision group: " + std::to_string(vision_tensors) + " tensors (" + human_bytes(vision_bytes) + ")";
  if (ok()) return out + "; OK";
  append_group(out, "missing", missing, max_names, [](const std::string& s) { return s; });
  append_group(out, "unexpected", unexpected, max_names, [](const std::string& s) { return s; });
  auto mismatch = [](const Mismatch& m) { return m.name + ": expected " + m.expected + ", found " + m.actual; };
  append_group(out, "dtype mismatches", dtype_mismatches, max_names, mismatch);
  append_group(out, "shape mismatches", shape_mismatches, max_names, mismatch);
  append_group(out, "tensor-count contract violations", count_mismatches, max_names, [](const CountResult& r) {
    return r.pattern + ": expected " + std::to_string(r.expected) + ", found " + std::to_string(r.actual);
  });
  return out;
}

InventoryReport compare_inventory(const std::vector<WeightSpec>& expected, const std::vector<TensorRecord>& actual,
                                  const InventoryOptions& options) {
  InventoryReport r;
  r.expected_tensors = static_cast<int64_t>(expected.size());
  r.actual_tensors = static_cast<int64_t>(actual.size());
  std::unordered_map<std::string_view, size_t> by_name;
  by_name.reserve(expected.size());
  for (size_t i = 0; i < expected.size(); ++i) by_name.emplace(expected[i].name, i);
  std::vector<bool> seen(expected.size(), false);

  std::vector<const TensorRecord*> sorted;
  sorted.reserve(actual.size());
  for (const auto& t : actual) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](const TensorRecord* a, const TensorRecord* b) { return a->name < b->name; });

  for (const TensorRecord* t : sorted) {
    const uint64_t bytes = t->nbytes ? t->nbytes : static_cast<uint64_t>(numel(t->shape)) * dtype_size(t->dtype);
    r.actual_bytes += bytes;
    auto it = by_name.find(t->name);
    if (it == by_name.end()) {
      if (options.accept_vision && is_vision_tensor(t->name)) {
        ++r.vision_tensors;
        r.vision_bytes += bytes;
        r.vision_params += numel(t->shape);
      } else {
        r.unexpected.push_back(t->name);
      }
      continue;
    }
    const WeightSpec& w = expected[it->second];
    seen[it->second] = true;
    bool match = true;
    if (t->dtype != w.dtype) {
      r.dtype_mismatches.push_back({t->name, std::string(dtype_name(w.dtype)), std::string(dtype_name(t->dtype))});
      match = false;
    }
    if (t->shape != w.shape) {
      r.shape_mismatches.push_back({t->name, shape_str(w.shape), shape_str(t->shape)});
      match = false;
    }
    if (match) ++r.matched_tensors;
  }
  for (size_t i = 0; i < expected.size(); ++i)
    if (!seen[i]) r.missing.push_back(expected[i].name);

  for (const CountContract& cc : options.contract) {
    int64_t n = 0;
    for (const auto& t : actual) n += matches_pattern(t.name, cc.pattern) ? 1 : 0;
    if (n != cc.expected) r.count_mismatches.push_back({cc.pattern, cc.expected, n});
  }
  return r;
}

Status check_inventory(const std::vector<WeightSpec>& expected, const std::vector<TensorRecord>& actual,
                       const InventoryOptions& options) {
  InventoryReport r = compare_inventory(expected, actual, options);
  if (r.ok()) return Status::Ok();
  return make_error(r.format(options.max_names));
}

}  // namespace cedar
