// Rules: roofline.h. Every number is a sum over the expected weight list (model/weights.h) by the part
// of the block a tensor belongs to, and over the layer plan's roles.
#include "model/roofline.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "model/model_stats.h"

namespace cedar {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Where in a block (or outside) a tensor is used.
enum class Part {
  Lookup,       // embedding, Engram tables: a few rows per token
  Engram,       // Engram wkv / q / k (before the block)
  AttnSite,     // hc_attn_*, attn_norm
  Attention,    // q / kv / output projections, their norms, the sink
  Compressor,   // KV sources
  IndexerKeys,  // KV sources
  Indexer,      // index sources
  FfnSite,      // hc_ffn_*, ffn_norm
  Router,       // gate weight + bias
  RouterImage,  // gate bias_vl: image tokens only
  Shared,
  Routed,
  Head,  // final norm, head (V4: hc_head)
  Skip,  // draft blocks, vision
};

Part part_of(const WeightSpec& w) {
  if (w.draft_block >= 0) return Part::Skip;
  switch (w.component) {
    case Component::Embedding:
    case Component::EngramTable:
      return Part::Lookup;
    case Component::Head:
    case Component::FinalNorm:
      return Part::Head;
    case Component::HyperConnections:
      if (w.layer < 0) return Part::Head;
      return w.name.find(".hc_attn_") != std::string::npos ? Part::AttnSite : Part::FfnSite;
    case Component::Norms:
      return ends_with(w.name, "attn_norm.weight") ? Part::AttnSite : Part::FfnSite;
    case Component::Attention:
      return Part::Attention;
    case Component::Compressor:
      return Part::Compressor;
    case Component::IndexerKeys:
      return Part::IndexerKeys;
    case Component::Indexer:
      return Part::Indexer;
    case Component::Router:
      return ends_with(w.name, "bias_vl") ? Part::RouterImage : Part::Router;
    case Component::RoutedExperts:
      return Part::Routed;
    case Component::SharedExpert:
      return Part::Shared;
    case Component::Engram:
      return Part::Engram;
    case Component::Draft:
    case Component::Vision:
      return Part::Skip;
  }
  return Part::Skip;
}

bool is_wo_a(const WeightSpec& w) { return w.name.find(".attn.wo_a.") != std::string::npos; }

// BF16 tensors the CPU binding converts to fp32 apart from the router (norms, Engram q / k).
bool is_f32_vector(const WeightSpec& w) {
  const std::string_view n = w.name;
  return w.dtype == DType::BF16 &&
         (ends_with(n, "norm.weight") || ends_with(n, "engram.q_weight") || ends_with(n, "engram.k_weight"));
}

// Bytes a decode step reads for one tensor in the device layout.
uint64_t device_bytes(const WeightSpec& w, const DecodeTrafficOptions& o) {
  if (o.wo_a_bf16 && is_wo_a(w))
    return w.format == WeightFormat::Scale ? 0 : static_cast<uint64_t>(w.logical_params) * 2;
  if (o.vectors_f32 && is_f32_vector(w)) return static_cast<uint64_t>(w.logical_params) * 4;
  if (w.format == WeightFormat::Other) return 0;
  return w.nbytes();
}

int64_t entries_visible(int64_t positions, int64_t ratio) { return ratio > 0 ? positions / ratio : 0; }

// Indexer keys a query at `positions` visible positions scores in layer `r`.
int64_t scored_keys(const ModelConfig& c, const LayerRole& r, int64_t positions) {
  const int64_t entries = entries_visible(positions, r.compress_ratio);
  if (!r.uses_candidates) return entries;
  return std::min(entries, c.candidate_topk_blocks * c.candidate_block_size);
}

// Logical parameters per (layer, part); routed experts: one expert's.
struct LayerParams {
  double part[static_cast<int>(Part::Skip) + 1] = {};
};

}  // namespace

double expected_distinct_experts(int64_t experts, int64_t topk, int64_t batch) {
  if (experts <= 0 || topk <= 0 || batch <= 0) return 0;
  if (batch == 1) return static_cast<double>(std::min(topk, experts));
  const double miss = 1.0 - static_cast<double>(topk) / static_cast<double>(experts);
  return static_cast<double>(experts) * (1.0 - std::pow(miss, static_cast<double>(batch)));
}

DecodeTraffic decode_traffic(const ModelConfig& c, const LayerPlan& plan, const std::vector<WeightSpec>& weights,
                             const DecodeTrafficOptions& o) {
  DecodeTraffic t;
  t.batch = std::max<int64_t>(o.batch, 1);
  int64_t expert_layer = -1;
  for (const WeightSpec& w : weights) {
    const Part p = part_of(w);
    switch (p) {
      case Part::Lookup:
      case Part::RouterImage:
      case Part::Skip:
        break;
      case Part::Head:
        t.head_bytes += device_bytes(w, o);
        break;
      case Part::Routed:
        if (expert_layer < 0) expert_layer = w.layer;
        if (w.layer == expert_layer && w.expert == 0) t.expert_bytes_each += w.nbytes();
        break;
      case Part::Router:
        t.router_bytes += w.nbytes();
        [[fallthrough]];
      default:
        t.layer_weight_bytes += device_bytes(w, o);
        break;
    }
  }
  int64_t expert_layers = 0;
  for (const LayerRole& r : plan.layers) expert_layers += r.layer >= 0 ? 1 : 0;
  t.distinct_experts_per_layer = o.distinct_experts_per_layer
                                     ? *o.distinct_experts_per_layer
                                     : expected_distinct_experts(c.n_routed_experts, c.num_experts_per_tok, t.batch);
  t.expert_bytes =
      t.distinct_experts_per_layer * static_cast<double>(expert_layers) * static_cast<double>(t.expert_bytes_each);

  // Per-token lookups: the embedding row and every Engram layer's rows (table + scale bytes per row).
  double engram_row_bytes = 0;
  for (const WeightSpec& w : weights) {
    if (w.draft_block >= 0) continue;
    if (w.component == Component::Embedding && !w.shape.empty())
      t.lookup_bytes_per_token += static_cast<double>(w.nbytes()) / static_cast<double>(w.shape[0]);
    if (w.component == Component::EngramTable && !w.shape.empty())
      engram_row_bytes += static_cast<double>(w.nbytes()) / static_cast<double>(w.shape[0]);
  }
  const int64_t engram_cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
  t.lookup_bytes_per_token += engram_row_bytes * static_cast<double>(std::max<int64_t>(engram_cols, 0));

  // KV: the new token sees positions [0, context].
  const KvBudget kv = compute_kv_budget(c, plan);
  const int64_t positions = std::max<int64_t>(o.context, 0) + 1;
  for (const LayerRole& r : plan.layers) {
    double read = static_cast<double>(std::min(positions, c.sliding_window) * kv.swa_entry_bytes);
    if (r.compress_ratio > 0) {
      read += static_cast<double>(std::min(c.index_topk, entries_visible(positions, r.compress_ratio)) *
                                  kv.main_entry_bytes);
      if (r.owns_indexer) read += static_cast<double>(scored_keys(c, r, positions) * kv.indexer_entry_bytes);
    }
    t.kv_read_bytes_per_token += read;
    t.kv_write_bytes_per_token += static_cast<double>(kv.swa_entry_bytes);
    if (r.owns_compressor && r.compress_ratio > 0) {
      const double ratio = static_cast<double>(r.compress_ratio);
      t.kv_write_bytes_per_token += static_cast<double>(kv.main_entry_bytes) / ratio;
      if (r.owns_indexer_keys) t.kv_write_bytes_per_token += static_cast<double>(kv.indexer_entry_bytes) / ratio;
    }
  }
  return t;
}

Result<PrefillFlops> prefill_flops(const ModelConfig& c, const LayerPlan& plan, const std::vector<WeightSpec>& weights,
                                   const PrefillFlopsOptions& o) {
  if (o.prompt < 1) return make_error("prefill_flops: prompt length must be >= 1, got " + std::to_string(o.prompt));
  if (o.mode == ForwardMode::Ced && !plan.ced)
    return make_error("prefill_flops: ced mode is unavailable for this model: " + plan.ced_unavailable_reason);
  const int64_t n_layers = plan.num_layers();
  std::vector<LayerParams> params(static_cast<size_t>(n_layers));
  double head_params = 0;
  for (const WeightSpec& w : weights) {
    const Part p = part_of(w);
    if (p == Part::Skip || p == Part::Lookup || p == Part::RouterImage || w.logical_params == 0) continue;
    if (p == Part::Head) {
      head_params += static_cast<double>(w.logical_params);
      continue;
    }
    if (w.layer < 0 || w.layer >= n_layers) continue;
    if (p == Part::Routed && w.expert != 0) continue;  // one expert's; scaled by top-k below
    params[static_cast<size_t>(w.layer)].part[static_cast<int>(p)] += static_cast<double>(w.logical_params);
  }

  PrefillFlops f;
  f.prompt = o.prompt;
  const int64_t tail = o.ced_tail > 0 ? o.ced_tail : c.sliding_window;
  f.replay_start = o.mode == ForwardMode::Ced ? std::max<int64_t>(0, o.prompt - tail) : 0;
  const int64_t s = f.replay_start, n = o.prompt;
  const bool kv_only = o.boundary == CedBoundary::GlobalKvOnly;
  const double heads = static_cast<double>(c.num_attention_heads), hd = static_cast<double>(c.head_dim);
  const double ih = static_cast<double>(c.index_n_heads), ihd = static_cast<double>(c.index_head_dim);
  const double topk = static_cast<double>(c.num_experts_per_tok);

  for (const LayerRole& r : plan.layers) {
    const LayerParams& lp = params[static_cast<size_t>(r.layer)];
    auto sum = [&](std::initializer_list<Part> parts) {
      double v = 0;
      for (Part p : parts) v += lp.part[static_cast<int>(p)] * (p == Part::Routed ? topk : 1.0);
      return v;
    };
    const double all = sum({Part::Engram, Part::AttnSite, Part::Attention, Part::Compressor, Part::IndexerKeys,
                            Part::Indexer, Part::FfnSite, Part::Router, Part::Shared, Part::Routed});
    const bool encoder = r.layer < plan.encoder_layers;
    const bool boundary = r.layer == plan.last_kv_source;
    // Rows before the replay start: which parts run, and whether the attention core runs.
    double head_rows_params = 0;
    bool head_rows_attend = false;
    if (encoder) {
      head_rows_params = all;
      head_rows_attend = true;
    } else if (boundary) {
      head_rows_params = kv_only ? sum({Part::AttnSite, Part::Compressor, Part::IndexerKeys})
                                 : sum({Part::Engram, Part::AttnSite, Part::Attention, Part::Compressor,
                                        Part::IndexerKeys, Part::Indexer});
      head_rows_attend = !kv_only;
    }
    f.linear_flops += 2.0 * (static_cast<double>(s) * head_rows_params + static_cast<double>(n - s) * all);

    // Decoder layers on tail rows see SWA keys from the replay start on (and the boundary under
    // GlobalKvOnly); encoder layers and an exact-source boundary see the whole window.
    const bool truncated = o.mode == ForwardMode::Ced && (r.layer > plan.last_kv_source || (boundary && kv_only));
    for (int64_t p = 0; p < n; ++p) {
      if (p < s && !head_rows_attend) continue;
      int64_t window = std::min(p + 1, c.sliding_window);
      if (truncated && p >= s) window = std::min(window, p - s + 1);
      double flops = 4.0 * heads * hd * static_cast<double>(window);
      if (r.compress_ratio > 0) {
        const int64_t entries = entries_visible(p + 1, r.compress_ratio);
        flops += 4.0 * heads * hd * static_cast<double>(std::min(c.index_topk, entries));
        if (r.owns_indexer) flops += 2.0 * ih * ihd * static_cast<double>(scored_keys(c, r, p + 1));
      }
      f.attention_flops += flops;
    }
  }
  f.linear_flops += 2.0 * head_params;  // logits of the last row
  return f;
}

}  // namespace cedar
