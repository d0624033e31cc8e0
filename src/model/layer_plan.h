// The layer plan: what each layer of the model does, derived from the config and validated
// (../shared/spec/architecture.md §1.2). Every other component (weight inventory, forward, KV
// cache, inspect) reads the plan instead of re-deriving layer roles.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "io/config.h"

namespace cedar {

// CSA2 attention modes (V4.1) and the V4 equivalents.
enum class AttnMode {
  SwaOnly,   // ratio 0: sliding window only
  Full,      // owns a compressor + global KV + indexer keys (+ indexer)
  Reindex,   // own indexer queries over a source's keys (V4.1 decoder index sources)
  Reuse,     // reads the nearest KV source and the nearest index source's top-k
  V4Csa,     // V4: compressed ratio-4 layer with its own compressor and indexer
  V4Hca,     // V4: heavily compressed (ratio 128) layer, own compressor, no indexer
};
std::string_view attn_mode_name(AttnMode m);

struct LayerRole {
  int64_t layer = 0;
  int64_t compress_ratio = 0;
  AttnMode mode = AttnMode::SwaOnly;
  int64_t kv_source = -1;          // layer whose global KV this layer reads (-1: none)
  int64_t index_source = -1;       // layer whose top-k indices this layer uses (-1: none)
  bool owns_compressor = false;    // writes global KV (+ indexer keys in V4.1)
  bool owns_indexer_keys = false;  // has indexer.wk / k_norm
  bool owns_indexer = false;       // has indexer.wq_b / weights_proj (computes its own top-k)
  bool is_candidate_source = false;
  bool uses_candidates = false;    // restricted to the candidate source's pool
  bool has_engram = false;
  bool hash_routed = false;        // V4: MoE routed by token id (tid2eid)
  bool is_encoder = false;         // CED: layer runs on every prompt token under `ced` prefill
  bool compressor_has_gate = false;
  bool uses_compress_rope = false; // θ = compress_rope_theta + YaRN (ratio > 0)
};

struct DraftBlockRole {
  int64_t index = 0;               // mtp.{index}
  int64_t compress_ratio = 0;
  bool is_first = false;           // has main_proj / main_norm
  bool is_last = false;            // has norm, markov_head, confidence_head
};

struct LayerPlan {
  Arch arch = Arch::DeepseekV41;
  std::vector<LayerRole> layers;        // backbone, index = layer id
  std::vector<DraftBlockRole> drafts;   // DSpark blocks / NextN
  DraftKind draft_kind = DraftKind::None;
  // CED (architecture.md §3.10–3.11): prefill may run layers [0, encoder_layers) on every prompt token
  // plus the last KV source's compressor, and the decoder only on the tail. Valid when the last KV
  // source exists, no Engram layer follows it and every DSpark target follows it (ATOM's
  // `decoder_replay_unsupported` conditions); otherwise encoder_layers = all layers.
  bool ced = false;
  std::string ced_unavailable_reason;   // set when !ced
  int64_t encoder_layers = 0;           // CED: layers [0, encoder_layers) are the encoder
  int64_t last_kv_source = -1;

  int64_t count(AttnMode m) const;
  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
};

// Derives and validates the plan; every inconsistency (ids out of range, a KV source with ratio 0,
// a Reuse layer with no source before it, Engram count mismatch, ...) is an Error naming the config
// file (ModelConfig::source) and the field. All problems found are reported together.
Result<LayerPlan> build_layer_plan(const ModelConfig& c);

}  // namespace cedar
