// Accounting rules: docs/inspect.md. Everything is a sum over the expected weight list filtered by the
// tensors' plan-derived tags (layer, draft block, component); no model numbers are typed in.
#include "model/model_stats.h"

#include <cmath>

namespace cedar {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string group_of(const WeightSpec& w) {
  if (w.draft_block >= 0) return "draft";
  switch (w.component) {
    case Component::Embedding: return "embedding";
    case Component::Head:
    case Component::FinalNorm: return "head";
    case Component::HyperConnections: return w.layer < 0 ? "head" : "dense";
    case Component::Attention:
    case Component::Compressor:
    case Component::Indexer:
    case Component::IndexerKeys: return "attention";
    case Component::Norms:
    case Component::Router:
    case Component::SharedExpert: return "dense";
    case Component::RoutedExperts: return "routed_experts";
    case Component::Engram: return "engram";
    case Component::EngramTable: return "engram_tables";
    case Component::Draft: return "draft";
    case Component::Vision: return "vision";
  }
  return "other";
}

// Lookups (token embedding, Engram rows, tid2eid, the Markov embedding) read a few rows per token;
// they are not active parameters in the matmul sense.
bool is_lookup(const WeightSpec& w) {
  return w.component == Component::Embedding || w.component == Component::EngramTable ||
         w.format == WeightFormat::Other || ends_with(w.name, "markov_head.embed.weight");
}

// What the last KV source computes for every prompt token under CED: its attention input
// (hc_attn pre-mix, attn_norm) and the compressor + indexer keys that write the decoder's global KV.
bool is_boundary_piece(const WeightSpec& w) {
  return w.component == Component::Compressor || w.component == Component::IndexerKeys ||
         ends_with(w.name, ".attn_norm.weight") || w.name.find(".hc_attn_") != std::string::npos;
}

// Routed experts count with the fraction of experts a token visits.
double active_fraction(const ModelConfig& c, const WeightSpec& w) {
  if (w.component != Component::RoutedExperts) return 1.0;
  if (w.draft_block >= 0)
    return static_cast<double>(c.draft_num_experts_per_tok()) / static_cast<double>(c.draft_n_routed_experts());
  return static_cast<double>(c.num_experts_per_tok) / static_cast<double>(c.n_routed_experts);
}

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

}  // namespace

KvBudget compute_kv_budget(const ModelConfig& c, const LayerPlan& plan) {
  KvBudget kv;
  if (c.arch == Arch::DeepseekV41) {
    kv.main_entry_bytes = c.head_dim / 2 + c.head_dim / 16;  // E2M1 pairs + one E4M3 per 16
    kv.swa_entry_bytes = c.head_dim + c.head_dim / 32;       // e4m3 + one UE8M0 per 32
  } else {
    // FlashMLA V4 record: e4m3 nope dims + bf16 rope dims + one UE8M0 per 64 nope dims, padded to 8 B.
    const int64_t nope = c.head_dim - c.qk_rope_head_dim;
    kv.main_entry_bytes = nope + 2 * c.qk_rope_head_dim + round_up((nope + 63) / 64, 8);
    kv.swa_entry_bytes = kv.main_entry_bytes;
  }
  kv.indexer_entry_bytes = c.index_head_dim / 2 + c.index_head_dim / 32;  // E2M1 pairs + UE8M0 per 32
  for (const LayerRole& r : plan.layers) {
    if (!r.owns_compressor || r.compress_ratio <= 0) continue;
    const double ratio = static_cast<double>(r.compress_ratio);
    kv.main_bytes_per_token += static_cast<double>(kv.main_entry_bytes) / ratio;
    if (r.owns_indexer_keys) kv.indexer_bytes_per_token += static_cast<double>(kv.indexer_entry_bytes) / ratio;
  }
  kv.swa_layers = plan.num_layers() + static_cast<int64_t>(plan.drafts.size());
  kv.swa_bytes_per_sequence = kv.swa_layers * c.sliding_window * kv.swa_entry_bytes;
  return kv;
}

ModelStats compute_model_stats(const ModelConfig& c, const LayerPlan& plan, const std::vector<WeightSpec>& weights,
                               const std::optional<ParamBytes>& vision_actual) {
  ModelStats s;
  double prefill = 0, decode = 0, draft = 0, decode_bytes = 0;
  for (const WeightSpec& w : weights) {
    const uint64_t bytes = w.nbytes();
    const int64_t params = w.logical_params;
    s.by_format[std::string(weight_format_name(w.format))].add(1, params, bytes);
    s.by_component[w.draft_block >= 0 ? "draft" : std::string(component_name(w.component))].add(1, params, bytes);
    s.by_group[group_of(w)].add(1, params, bytes);
    s.total.add(1, params, bytes);

    if (is_lookup(w)) continue;
    // Scales (0 parameters) count with their weight's bytes: a GEMV reads them too.
    if (w.draft_block < 0) decode_bytes += static_cast<double>(bytes) * active_fraction(c, w);
    if (params == 0) continue;
    const double active = static_cast<double>(params) * active_fraction(c, w);
    if (w.draft_block >= 0) {
      draft += active;
      continue;
    }
    decode += active;  // every backbone layer, plus head / final norm / global hc_head
    const bool in_prefill = plan.ced ? (w.layer >= 0 && w.layer < plan.encoder_layers) ||
                                           (w.layer == plan.last_kv_source && is_boundary_piece(w))
                                     : w.layer >= 0;
    if (in_prefill) prefill += active;
  }
  s.params_active_prefill = std::llround(prefill);
  s.params_active_decode = std::llround(decode);
  s.params_active_draft = std::llround(draft);
  s.bytes_active_decode = static_cast<uint64_t>(std::llround(decode_bytes));

  ParamBytes vision;
  if (vision_actual) {
    vision = *vision_actual;
  } else if (c.has_vision) {
    const VisionEstimate e = estimate_vision(c);
    vision.add(e.tensors, e.params, static_cast<uint64_t>(e.params) * 2);  // the tower is BF16
    s.vision_estimated = true;
  }
  if (vision.tensors > 0) {
    s.by_group["vision"] = vision;
    s.by_component["vision"] = vision;
    s.by_format["bf16"].add(vision.tensors, vision.params, vision.bytes);
    s.total.add(vision.tensors, vision.params, vision.bytes);
  }
  s.kv = compute_kv_budget(c, plan);
  return s;
}

std::vector<MemoryScenario> plan_memory(const ModelStats& stats, const MemoryPlanOptions& options) {
  auto group_bytes = [&](const char* g) {
    auto it = stats.by_group.find(g);
    return it == stats.by_group.end() ? uint64_t{0} : it->second.bytes;
  };
  const uint64_t vision = group_bytes("vision");
  const uint64_t text = stats.total.bytes - vision;
  const uint64_t tables = group_bytes("engram_tables");
  // Backbone experts only: the drafter's small expert bank runs every step and stays in HBM.
  const uint64_t experts = group_bytes("routed_experts");

  struct Split {
    const char* name;
    uint64_t host;
  };
  const Split splits[] = {
      {"all-in-hbm", 0},
      {"engram-tables-in-host", tables},
      {"experts-and-engram-in-host", tables + experts},
  };
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const auto gpus = static_cast<uint64_t>(std::max<int64_t>(options.gpus, 1));
  const auto capacity = static_cast<int64_t>(options.gpu_mem_gib * gib);
  const auto reserve = static_cast<int64_t>(options.reserve_gib * gib);
  std::vector<MemoryScenario> out;
  for (const Split& sp : splits) {
    MemoryScenario m;
    m.name = sp.name;
    m.host_weight_bytes = sp.host;
    m.gpu_weight_bytes = text - sp.host;
    m.per_gpu_weight_bytes = (m.gpu_weight_bytes + gpus - 1) / gpus;
    m.per_gpu_free_bytes = capacity - reserve - static_cast<int64_t>(m.per_gpu_weight_bytes);
    m.fits = m.per_gpu_free_bytes > 0;
    const double per_token = stats.kv.bytes_per_token();
    if (m.fits && per_token > 0)
      m.kv_token_capacity =
          static_cast<int64_t>(static_cast<double>(m.per_gpu_free_bytes) * static_cast<double>(gpus) / per_token);
    out.push_back(m);
  }
  return out;
}

}  // namespace cedar
