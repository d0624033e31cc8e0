#include "cli/inspect_report.h"

#include <cstdio>

#include "kv/kv_layout.h"

namespace cedar::cli {
namespace {

using nlohmann::ordered_json;

ordered_json pb_json(const ParamBytes& p) {
  return ordered_json{{"tensors", p.tensors}, {"params", p.params}, {"bytes", p.bytes}};
}

ordered_json map_json(const std::map<std::string, ParamBytes>& m) {
  ordered_json out = ordered_json::object();
  for (const auto& [k, v] : m) out[k] = pb_json(v);
  return out;
}

template <typename T>
ordered_json first_n(const std::vector<T>& v, size_t n) {
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < v.size() && i < n; ++i) out.push_back(v[i]);
  return out;
}

ordered_json role_json(const LayerRole& r) {
  return ordered_json{{"layer", r.layer},
                      {"compress_ratio", r.compress_ratio},
                      {"mode", attn_mode_name(r.mode)},
                      {"kv_source", r.kv_source},
                      {"index_source", r.index_source},
                      {"owns_compressor", r.owns_compressor},
                      {"owns_indexer_keys", r.owns_indexer_keys},
                      {"owns_indexer", r.owns_indexer},
                      {"compressor_has_gate", r.compressor_has_gate},
                      {"is_candidate_source", r.is_candidate_source},
                      {"uses_candidates", r.uses_candidates},
                      {"engram", r.has_engram},
                      {"hash_routed", r.hash_routed},
                      {"encoder", r.is_encoder},
                      {"compress_rope", r.uses_compress_rope}};
}

ordered_json plan_json(const LayerPlan& p) {
  ordered_json counts = ordered_json::object();
  for (AttnMode m : {AttnMode::SwaOnly, AttnMode::Full, AttnMode::Reindex, AttnMode::Reuse, AttnMode::V4Csa,
                     AttnMode::V4Hca})
    if (p.count(m) > 0) counts[std::string(attn_mode_name(m))] = p.count(m);
  ordered_json layers = ordered_json::array();
  for (const auto& r : p.layers) layers.push_back(role_json(r));
  ordered_json drafts = ordered_json::array();
  for (const auto& d : p.drafts)
    drafts.push_back({{"index", d.index}, {"compress_ratio", d.compress_ratio}, {"first", d.is_first}, {"last", d.is_last}});
  return ordered_json{{"counts", counts},
                      {"ced", p.ced},
                      {"ced_unavailable_reason", p.ced_unavailable_reason},
                      {"encoder_layers", p.encoder_layers},
                      {"last_kv_source", p.last_kv_source},
                      {"draft_kind", draft_kind_name(p.draft_kind)},
                      {"layers", layers},
                      {"drafts", drafts}};
}

ordered_json config_json(const ModelConfig& c) {
  return ordered_json{{"format", c.source_format},
                      {"vocab_size", c.vocab_size},
                      {"hidden_size", c.hidden_size},
                      {"num_hidden_layers", c.num_hidden_layers},
                      {"draft_blocks", c.num_draft_blocks()},
                      {"num_attention_heads", c.num_attention_heads},
                      {"n_routed_experts", c.n_routed_experts},
                      {"num_experts_per_tok", c.num_experts_per_tok},
                      {"sliding_window", c.sliding_window},
                      {"quantized", c.quant.quantized()},
                      {"weight_block", {c.quant.weight_block_rows, c.quant.weight_block_cols}},
                      {"expert_dtype", c.quant.expert_dtype},
                      {"vision", c.has_vision}};
}

ordered_json inventory_json(const InventoryReport& r, size_t n) {
  auto mismatches = [n](const std::vector<InventoryReport::Mismatch>& v) {
    ordered_json out = ordered_json::array();
    for (size_t i = 0; i < v.size() && i < n; ++i)
      out.push_back({{"name", v[i].name}, {"expected", v[i].expected}, {"found", v[i].actual}});
    return out;
  };
  ordered_json counts = ordered_json::array();
  for (const auto& c : r.count_mismatches)
    counts.push_back({{"pattern", c.pattern}, {"expected", c.expected}, {"found", c.actual}});
  return ordered_json{{"ok", r.ok()},
                      {"expected_tensors", r.expected_tensors},
                      {"found_tensors", r.actual_tensors},
                      {"matched_tensors", r.matched_tensors},
                      {"vision_tensors", r.vision_tensors},
                      {"missing_count", r.missing.size()},
                      {"missing", first_n(r.missing, n)},
                      {"unexpected_count", r.unexpected.size()},
                      {"unexpected", first_n(r.unexpected, n)},
                      {"dtype_mismatch_count", r.dtype_mismatches.size()},
                      {"dtype_mismatches", mismatches(r.dtype_mismatches)},
                      {"shape_mismatch_count", r.shape_mismatches.size()},
                      {"shape_mismatches", mismatches(r.shape_mismatches)},
                      {"count_contract_violations", counts}};
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

// Parameter counts and byte sizes in decimal units that keep small test models readable.
std::string billions(int64_t p) {
  const double v = static_cast<double>(p);
  if (v >= 1e9) return fmt("%.3f B", v / 1e9);
  if (v >= 1e6) return fmt("%.3f M", v / 1e6);
  return std::to_string(p);
}
std::string gb(uint64_t b) {
  const double v = static_cast<double>(b);
  if (v >= 1e9) return fmt("%.2f GB", v / 1e9);
  if (v >= 1e6) return fmt("%.2f MB", v / 1e6);
  return std::to_string(b) + " B";
}

// One text line per run of layers with the same role.
std::string describe_role(const LayerRole& r) {
  std::string s = "ratio " + std::to_string(r.compress_ratio) + "  " + std::string(attn_mode_name(r.mode));
  if (r.kv_source >= 0) s += "  kv<-" + std::to_string(r.kv_source);
  if (r.index_source >= 0) s += "  topk<-" + std::to_string(r.index_source);
  if (r.is_candidate_source) s += "  candidate-source";
  if (r.uses_candidates) s += "  uses-candidates";
  if (r.has_engram) s += "  engram";
  if (r.hash_routed) s += "  hash-routed";
  if (r.compressor_has_gate) s += "  gated-compressor";
  return s;
}

}  // namespace

ordered_json inspect_json(const InspectResult& r) {
  const ModelStats& s = r.stats;
  ordered_json out;
  out["path"] = r.path;
  out["arch"] = arch_name(r.config.arch);
  out["config"] = config_json(r.config);
  if (r.checkpoint) {
    out["checkpoint"] = {{"present", true},
                         {"shards", r.checkpoint->shards},
                         {"tensors", r.checkpoint->tensors},
                         {"tensor_bytes", r.checkpoint->tensor_bytes},
                         {"file_bytes", r.checkpoint->file_bytes}};
  } else {
    out["checkpoint"] = {{"present", false}};
  }
  out["params_total"] = s.total.params;
  out["bytes_total"] = s.total.bytes;
  out["tensors_total"] = s.total.tensors;
  out["tensors_expected_text"] = r.expected_tensors;
  out["params_active_prefill"] = s.params_active_prefill;
  out["params_active_decode"] = s.params_active_decode;
  out["params_active_draft"] = s.params_active_draft;
  out["bytes_active_decode"] = s.bytes_active_decode;
  out["kv_bytes_per_token"] = s.kv.bytes_per_token();
  // Measured: what the KV block pool allocates per token (dry run over 2^20 tokens, kv/kv_layout.h).
  if (Result<double> measured = kv_bytes_per_token_measured(r.config, r.plan); measured.ok())
    out["kv_bytes_per_token_measured"] = *measured;
  out["swa_bytes_per_sequence"] = s.kv.swa_bytes_per_sequence;
  out["kv"] = {{"main_entry_bytes", s.kv.main_entry_bytes},
               {"indexer_entry_bytes", s.kv.indexer_entry_bytes},
               {"swa_entry_bytes", s.kv.swa_entry_bytes},
               {"main_bytes_per_token", s.kv.main_bytes_per_token},
               {"indexer_bytes_per_token", s.kv.indexer_bytes_per_token},
               {"swa_layers", s.kv.swa_layers},
               {"window", r.config.sliding_window}};
  out["vision"] = {{"present", r.config.has_vision}, {"estimated", s.vision_estimated}};
  out["by_group"] = map_json(s.by_group);
  out["by_format"] = map_json(s.by_format);
  out["by_component"] = map_json(s.by_component);
  ordered_json scenarios = ordered_json::array();
  for (const auto& m : r.memory)
    scenarios.push_back({{"name", m.name},
                         {"gpu_weight_bytes", m.gpu_weight_bytes},
                         {"host_weight_bytes", m.host_weight_bytes},
                         {"per_gpu_weight_bytes", m.per_gpu_weight_bytes},
                         {"per_gpu_free_bytes", m.per_gpu_free_bytes},
                         {"fits", m.fits},
                         {"kv_token_capacity", m.kv_token_capacity}});
  out["memory_plan"] = {{"gpus", r.memory_options.gpus},
                        {"gpu_mem_gib", r.memory_options.gpu_mem_gib},
                        {"reserve_gib", r.memory_options.reserve_gib},
                        {"scenarios", scenarios}};
  out["layer_plan"] = plan_json(r.plan);
  if (r.inventory) out["inventory"] = inventory_json(*r.inventory, r.max_names);
  else out["inventory"] = {{"checked", false}};
  return out;
}

std::string inspect_text(const InspectResult& r) {
  const ModelConfig& c = r.config;
  const ModelStats& s = r.stats;
  std::string o;
  o += r.path + ": " + std::string(arch_name(c.arch)) + " (" + c.source_format + " config), " +
       std::to_string(c.num_hidden_layers) + " layers" +
       (c.num_draft_blocks() > 0 ? " + " + std::to_string(c.num_draft_blocks()) + " " +
                                       std::string(draft_kind_name(r.plan.draft_kind)) + " draft blocks"
                                 : std::string(", no draft blocks")) +
       ", d=" + std::to_string(c.hidden_size) + ", " +
       std::to_string(c.n_routed_experts) + " experts top-" + std::to_string(c.num_experts_per_tok) + "\n";
  o += "weights: " + (c.quant.quantized() ? "fp8 " + std::to_string(c.quant.weight_block_rows) + "x" +
                                                std::to_string(c.quant.weight_block_cols) + " blocks, experts " +
                                                (c.quant.expert_dtype.empty() ? "fp8" : c.quant.expert_dtype)
                                          : std::string("bf16 (no quantization_config)")) +
       (c.has_vision ? ", vision tower present" : "") + "\n";
  if (r.checkpoint)
    o += "checkpoint: " + std::to_string(r.checkpoint->shards) + " shards, " + std::to_string(r.checkpoint->tensors) +
         " tensors, " + gb(r.checkpoint->tensor_bytes) + " of tensor data, " + gb(r.checkpoint->file_bytes) +
         " on disk\n";
  else
    o += "checkpoint: none (config only)\n";

  o += "\nparameters: " + billions(s.total.params) + " total, " + gb(s.total.bytes) +
       (s.vision_estimated ? " (vision estimated from vision_config)" : "") + "\n";
  for (const auto& [k, v] : s.by_group)
    o += "  " + k + std::string(k.size() < 16 ? 16 - k.size() : 1, ' ') + billions(v.params) + "  " + gb(v.bytes) +
         "  (" + std::to_string(v.tensors) + " tensors)\n";
  o += "by format:\n";
  for (const auto& [k, v] : s.by_format)
    o += "  " + k + std::string(k.size() < 16 ? 16 - k.size() : 1, ' ') + billions(v.params) + "  " + gb(v.bytes) +
         "  (" + std::to_string(v.tensors) + " tensors)\n";
  o += "active per token: prefill " + billions(s.params_active_prefill) +
       (r.plan.ced ? " (CED: layers 0-" + std::to_string(r.plan.encoder_layers - 1) + " + layer " +
                         std::to_string(r.plan.last_kv_source) + " compressor)"
                   : " (all layers" + std::string(r.plan.ced_unavailable_reason.empty() ? "" : "; " + r.plan.ced_unavailable_reason) + ")") +
       ", decode " + billions(s.params_active_decode) + ", draft " + billions(s.params_active_draft) + "\n";
  o += "decode weight bytes per token (batch 1, as stored, scales included): " + gb(s.bytes_active_decode) + "\n";

  o += "\nKV cache: " + fmt("%.2f", s.kv.bytes_per_token()) + " B/token global (main " +
       fmt("%.2f", s.kv.main_bytes_per_token) + " + indexer " + fmt("%.2f", s.kv.indexer_bytes_per_token) +
       "; entries " + std::to_string(s.kv.main_entry_bytes) + " / " + std::to_string(s.kv.indexer_entry_bytes) +
       " B)\n";
  if (Result<double> measured = kv_bytes_per_token_measured(c, r.plan); measured.ok())
    o += "KV cache measured (block pool, 2^20 tokens): " + fmt("%.2f", *measured) + " B/token\n";
  o += "SWA rings: " + std::to_string(s.kv.swa_bytes_per_sequence) + " B per sequence (" +
       std::to_string(s.kv.swa_layers) + " layers x " + std::to_string(c.sliding_window) + " x " +
       std::to_string(s.kv.swa_entry_bytes) + " B)\n";

  o += "\nlayer plan: ";
  for (AttnMode m : {AttnMode::SwaOnly, AttnMode::Full, AttnMode::Reindex, AttnMode::Reuse, AttnMode::V4Csa,
                     AttnMode::V4Hca})
    if (r.plan.count(m) > 0) o += std::to_string(r.plan.count(m)) + " " + std::string(attn_mode_name(m)) + "  ";
  o += "\n";
  const auto& layers = r.plan.layers;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i + 1;
    while (j < layers.size() && describe_role(layers[j]) == describe_role(layers[i]) &&
           layers[j].kv_source == layers[i].kv_source && layers[j].is_encoder == layers[i].is_encoder)
      ++j;
    const std::string range = j - i == 1 ? std::to_string(i) : std::to_string(i) + "-" + std::to_string(j - 1);
    o += "  " + range + std::string(range.size() < 8 ? 8 - range.size() : 1, ' ') + describe_role(layers[i]) +
         (r.plan.ced && layers[i].is_encoder ? "  [encoder]" : "") + "\n";
    i = j;
  }

  o += "\nmemory plan: " + std::to_string(r.memory_options.gpus) + " GPUs x " +
       fmt("%.0f", r.memory_options.gpu_mem_gib) + " GiB (" + fmt("%.0f", r.memory_options.reserve_gib) +
       " GiB reserved each)\n";
  for (const auto& m : r.memory)
    o += "  " + m.name + std::string(m.name.size() < 28 ? 28 - m.name.size() : 1, ' ') + gb(m.per_gpu_weight_bytes) +
         " weights/GPU, host " + gb(m.host_weight_bytes) + ": " +
         (m.fits ? "fits, room for " + std::to_string(m.kv_token_capacity) + " KV tokens" : std::string("does not fit")) +
         "\n";

  if (r.inventory) o += "\n" + r.inventory->format(r.max_names) + "\n";
  return o;
}

}  // namespace cedar::cli
