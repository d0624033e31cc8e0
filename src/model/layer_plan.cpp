// Layer roles from the config (architecture.md §1.2, §3.5–3.6, §3.10–3.11, §5). Nothing here knows
// the released layer ids: V4.1 roles come from the three id lists and the ratios, V4 roles from the
// ratios alone.
#include "model/layer_plan.h"

#include <algorithm>

namespace cedar {
namespace {

// Collects problems as "field: message", reported together under the config's file name.
class Problems {
 public:
  explicit Problems(const ModelConfig& c) : c_(c) {}
  // Field named in the spelling of the file it came from.
  std::string field(std::string_view hf, std::string_view inference) const {
    return std::string(c_.source_format == "inference" ? inference : hf);
  }
  void add(std::string_view hf, std::string_view inference, const std::string& what) {
    list_.push_back(field(hf, inference) + ": " + what);
  }
  bool empty() const { return list_.empty(); }
  Error error() const {
    const std::string label = c_.source.empty() ? "config" : c_.source;
    if (list_.size() == 1) return make_error(label + ": " + list_[0]);
    std::string out = label + ": " + std::to_string(list_.size()) + " problems:";
    for (const auto& p : list_) out += "\n  - " + p;
    return make_error(out);
  }

 private:
  const ModelConfig& c_;
  std::vector<std::string> list_;
};

std::string str(int64_t v) { return std::to_string(v); }

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + str(v[i]);
  return s + "]";
}

bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// The largest entry <= l of a sorted list, or -1.
int64_t latest_at_or_before(const std::vector<int64_t>& sorted, int64_t l) {
  int64_t best = -1;
  for (int64_t s : sorted)
    if (s <= l) best = s;
  return best;
}

// Ids must be strictly increasing layer ids in [0, n). Returns false (after reporting) otherwise.
bool check_ids(const std::vector<int64_t>& ids, std::string_view hf, std::string_view inf, int64_t n, Problems& p) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= n) {
      p.add(hf, inf, "layer id " + str(ids[i]) + " is out of range [0, " + str(n) + ") in " + list_str(ids));
      return false;
    }
    if (i > 0 && ids[i] <= ids[i - 1]) {
      p.add(hf, inf, "ids must be strictly increasing, got " + list_str(ids));
      return false;
    }
  }
  return true;
}

// compress_ratios = backbone entries, then one per draft block (all 0: draft blocks are SWA-only).
bool check_ratio_length(const ModelConfig& c, Problems& p) {
  const int64_t n = c.num_hidden_layers;
  const int64_t drafts = c.num_draft_blocks();
  const auto len = static_cast<int64_t>(c.compress_ratios.size());
  if (len != n && len != n + drafts) {
    p.add("compress_ratios", "compress_ratios",
          "has " + str(len) + " entries; expected num_hidden_layers (" + str(n) + ") or num_hidden_layers + " +
              str(drafts) + " draft blocks (" + str(n + drafts) + ")");
    return false;
  }
  for (int64_t i = n; i < len; ++i)
    if (c.compress_ratios[i] != 0)
      p.add("compress_ratios", "compress_ratios",
            "entry " + str(i) + " (draft block " + str(i - n) + ") must be 0 (draft blocks use the window only), got " +
                str(c.compress_ratios[i]));
  return true;
}

void build_drafts(const ModelConfig& c, LayerPlan& plan) {
  const int64_t n = c.num_hidden_layers;
  const int64_t drafts = c.num_draft_blocks();
  plan.draft_kind = drafts > 0 ? c.draft_kind : DraftKind::None;
  for (int64_t k = 0; k < drafts; ++k) {
    DraftBlockRole d;
    d.index = k;
    const size_t at = static_cast<size_t>(n + k);
    d.compress_ratio = at < c.compress_ratios.size() ? c.compress_ratios[at] : 0;
    d.is_first = k == 0;
    d.is_last = k == drafts - 1;
    plan.drafts.push_back(d);
  }
}

void check_dspark_targets(const ModelConfig& c, Problems& p) {
  if (c.draft_kind != DraftKind::DSpark || c.num_draft_blocks() == 0) return;
  if (c.dspark_target_layer_ids.empty())
    p.add("dspark_target_layer_ids", "dspark_target_layer_ids", "must list the backbone layers feeding the drafter");
  check_ids(c.dspark_target_layer_ids, "dspark_target_layer_ids", "dspark_target_layer_ids", c.num_hidden_layers, p);
}

void check_engram(const ModelConfig& c, Problems& p) {
  if (c.engram_layer_ids.empty()) return;
  check_ids(c.engram_layer_ids, "engram_layer_ids", "engram_layer_ids", c.num_hidden_layers, p);
  if (c.engram_num_embeddings.size() != c.engram_layer_ids.size())
    p.add("engram_num_embeddings", "engram_num_embeddings",
          "has " + str(static_cast<int64_t>(c.engram_num_embeddings.size())) + " entries for " +
              str(static_cast<int64_t>(c.engram_layer_ids.size())) + " Engram layers " + list_str(c.engram_layer_ids));
  if (c.engram_n_heads <= 0 || c.engram_head_dim <= 0 || c.engram_max_ngram_size < 2)
    p.add("engram_n_heads", "engram_n_heads",
          "Engram needs n_heads > 0, head_dim > 0 and max_ngram_size >= 2, got " + str(c.engram_n_heads) + ", " +
              str(c.engram_head_dim) + ", " + str(c.engram_max_ngram_size));
}

// V4.1 CSA2: Full = KV source, Reindex = index source that is not a KV source, Reuse otherwise.
void build_v41(const ModelConfig& c, LayerPlan& plan, Problems& p) {
  const int64_t n = c.num_hidden_layers;
  const auto& r = c.compress_ratios;
  const auto& kv = c.kv_source_layer_ids;
  const auto& ix = c.index_source_layer_ids;
  for (int64_t l = 0; l < n; ++l)
    if (r[l] != 0 && r[l] != 1 && r[l] != 2)
      p.add("compress_ratios", "compress_ratios",
            "layer " + str(l) + " has ratio " + str(r[l]) + "; deepseek_v41 layers use 0 (window only), 1 or 2");
  if (c.num_hash_layers != 0)
    p.add("num_hash_layers", "n_hash_layers", "deepseek_v41 has no hash-routed layers, got " + str(c.num_hash_layers));
  const bool kv_ok = check_ids(kv, "kv_source_layer_ids", "kv_source_layers", n, p);
  const bool ix_ok = check_ids(ix, "index_source_layer_ids", "index_source_layers", n, p);
  if (kv_ok)
    for (int64_t s : kv)
      if (r[s] == 0) p.add("kv_source_layer_ids", "kv_source_layers", "layer " + str(s) + " has compress ratio 0");
  if (ix_ok)
    for (int64_t s : ix)
      if (r[s] == 0) p.add("index_source_layer_ids", "index_source_layers", "layer " + str(s) + " has compress ratio 0");
  if (c.candidate_source_layer_id >= 0 && !contains(ix, c.candidate_source_layer_id))
    p.add("candidate_source_layer_id", "candidate_source_layer",
          "layer " + str(c.candidate_source_layer_id) + " is not an index source " + list_str(ix));
  check_engram(c, p);
  check_dspark_targets(c, p);
  if (!kv_ok || !ix_ok || !p.empty()) return;

  // Every ratio>0 layer reads the most recent KV source and index source at or before it; the index
  // source must score that same KV source's keys, whose cache has this layer's ratio.
  for (int64_t l = 0; l < n; ++l) {
    LayerRole& role = plan.layers[l];
    if (r[l] == 0) continue;
    const int64_t k = latest_at_or_before(kv, l);
    const int64_t i = latest_at_or_before(ix, l);
    if (k < 0) {
      p.add("kv_source_layer_ids", "kv_source_layers",
            "layer " + str(l) + " has compress ratio " + str(r[l]) + " but no KV source at or before it in " + list_str(kv));
      continue;
    }
    if (r[k] != r[l])
      p.add("compress_ratios", "compress_ratios",
            "layer " + str(l) + " (ratio " + str(r[l]) + ") reads KV source layer " + str(k) + " (ratio " + str(r[k]) + ")");
    if (i < 0) {
      p.add("index_source_layer_ids", "index_source_layers",
            "layer " + str(l) + " has compress ratio " + str(r[l]) + " but no index source at or before it in " +
                list_str(ix));
      continue;
    }
    if (latest_at_or_before(kv, i) != k)
      p.add("index_source_layer_ids", "index_source_layers",
            "layer " + str(l) + " reads KV source " + str(k) + " but top-k from index source " + str(i) +
                ", which scores KV source " + str(latest_at_or_before(kv, i)));
    role.kv_source = k;
    role.index_source = i;
    role.owns_compressor = role.owns_indexer_keys = l == k;
    role.owns_indexer = l == i;
    role.compressor_has_gate = role.owns_compressor && r[l] > 1;
    role.mode = l == k ? AttnMode::Full : (l == i ? AttnMode::Reindex : AttnMode::Reuse);
    role.is_candidate_source = l == c.candidate_source_layer_id;
    role.uses_candidates = role.owns_indexer && c.candidate_source_layer_id >= 0 && l > c.candidate_source_layer_id;
  }
  for (int64_t e : c.engram_layer_ids) plan.layers[e].has_engram = true;

  plan.last_kv_source = kv.empty() ? -1 : kv.back();
  const int64_t last = plan.last_kv_source;
  if (last < 0) {
    plan.ced_unavailable_reason = "no KV source layers";
  } else if (!c.engram_layer_ids.empty() && c.engram_layer_ids.back() > last) {
    plan.ced_unavailable_reason =
        "Engram layer " + str(c.engram_layer_ids.back()) + " follows the last KV source " + str(last);
  } else if (plan.draft_kind == DraftKind::DSpark && !c.dspark_target_layer_ids.empty() &&
             c.dspark_target_layer_ids.front() <= last) {
    plan.ced_unavailable_reason = "DSpark target layer " + str(c.dspark_target_layer_ids.front()) +
                                  " is not after the last KV source " + str(last);
  } else {
    plan.ced = true;
  }
  plan.encoder_layers = plan.ced ? last : n;
}

// V4: every compressed layer owns its compressor; ratio 4 = CSA (own indexer with its own
// compressor), 128 = HCA (no indexer); the first num_hash_layers MoE layers route by token id.
void build_v4(const ModelConfig& c, LayerPlan& plan, Problems& p) {
  const int64_t n = c.num_hidden_layers;
  const auto& r = c.compress_ratios;
  if (!c.kv_source_layer_ids.empty() || !c.index_source_layer_ids.empty())
    p.add("kv_source_layer_ids", "kv_source_layers", "deepseek_v4 layers own their caches; CSA2 source lists are V4.1 only");
  if (!c.engram_layer_ids.empty()) p.add("engram_layer_ids", "engram_layer_ids", "deepseek_v4 has no Engram");
  if (c.num_hash_layers > n)
    p.add("num_hash_layers", "n_hash_layers",
          str(c.num_hash_layers) + " exceeds num_hidden_layers " + str(n));
  check_dspark_targets(c, p);
  for (int64_t l = 0; l < n; ++l) {
    LayerRole& role = plan.layers[l];
    role.hash_routed = l < c.num_hash_layers;
    if (r[l] == 0) continue;
    if (r[l] != 4 && r[l] != 128) {
      p.add("compress_ratios", "compress_ratios",
            "layer " + str(l) + " has ratio " + str(r[l]) + "; deepseek_v4 layers use 0, 4 (CSA) or 128 (HCA)");
      continue;
    }
    const bool csa = r[l] == 4;
    role.mode = csa ? AttnMode::V4Csa : AttnMode::V4Hca;
    role.kv_source = l;
    role.index_source = csa ? l : -1;
    role.owns_compressor = true;
    role.compressor_has_gate = true;
    role.owns_indexer = role.owns_indexer_keys = csa;
  }
  plan.last_kv_source = -1;
  for (int64_t l = 0; l < n; ++l)
    if (plan.layers[l].owns_compressor) plan.last_kv_source = l;
  plan.ced = false;
  plan.ced_unavailable_reason = "deepseek_v4 has no causal encoder-decoder split";
  plan.encoder_layers = n;
}

}  // namespace

std::string_view attn_mode_name(AttnMode m) {
  switch (m) {
    case AttnMode::SwaOnly: return "swa";
    case AttnMode::Full: return "full";
    case AttnMode::Reindex: return "reindex";
    case AttnMode::Reuse: return "reuse";
    case AttnMode::V4Csa: return "csa";
    case AttnMode::V4Hca: return "hca";
  }
  return "?";
}

int64_t LayerPlan::count(AttnMode m) const {
  return std::count_if(layers.begin(), layers.end(), [m](const LayerRole& r) { return r.mode == m; });
}

Result<LayerPlan> build_layer_plan(const ModelConfig& c) {
  Problems p(c);
  LayerPlan plan;
  plan.arch = c.arch;
  const int64_t n = c.num_hidden_layers;
  if (n <= 0) {
    p.add("num_hidden_layers", "n_layers", "must be >= 1, got " + str(n));
    return p.error();
  }
  if (!check_ratio_length(c, p)) return p.error();
  for (int64_t l = 0; l < n; ++l) {
    LayerRole role;
    role.layer = l;
    role.compress_ratio = c.compress_ratios[l];
    role.uses_compress_rope = role.compress_ratio > 0;
    plan.layers.push_back(role);
  }
  build_drafts(c, plan);
  if (c.arch == Arch::DeepseekV41) build_v41(c, plan, p);
  else build_v4(c, plan, p);
  if (!p.empty()) return p.error();
  for (auto& role : plan.layers) role.is_encoder = role.layer < plan.encoder_layers;
  return plan;
}

}  // namespace cedar
