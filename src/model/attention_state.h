// Per-sequence attention state of every layer (../shared/spec/architecture.md §3.7, §3.12, §4.3) and
// the per-chunk scratch that layers of one forward share (top-k indices, candidate blocks).
//
// Everything that must survive from one chunk to the next lives here, so chunked prefill and
// token-by-token decode reproduce a one-shot prefill exactly:
//   * one SWA ring per layer: `window` slots, slot = pos % window, each holding the layer's FP8-QDQ'd
//     KV (dequantized values) and the position it belongs to;
//   * per KV source layer: the compressed (main) KV entries (FP4 block-16 / E4M3 QDQ, after RoPE at
//     the group's first position), the indexer keys (FP4 block-32 / UE8M0 QDQ, after RoPE), and the
//     fp32 projections of the tokens of a not yet complete ratio-2 group.
// Cached values are the dequantized values the reference keeps; they are bit-identical to what a
// packed store + dequant gives back (core/numeric.h), so a packed KV cache can replace these containers
// entry for entry: one entry = `width` values + its source position.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/attention_params.h"
#include "model/layer_plan.h"

namespace cedar {

// Append-only list of cache entries of one width (compressed KV: head_dim; indexer K: index_head_dim).
class KvEntries {
 public:
  KvEntries() = default;
  explicit KvEntries(int64_t width) : width_(width) {}
  int64_t width() const { return width_; }
  int64_t size() const { return static_cast<int64_t>(positions_.size()); }
  std::span<const float> entry(int64_t j) const {
    return {values_.data() + j * width_, static_cast<size_t>(width_)};
  }
  // Source position of entry j: the first token of its group (j·ratio).
  int64_t position(int64_t j) const { return positions_[static_cast<size_t>(j)]; }
  void append(std::span<const float> values, int64_t position);

 private:
  int64_t width_ = 0;
  std::vector<float> values_;      // [size, width]
  std::vector<int64_t> positions_;
};

// One layer's sliding-window KV: slot = pos % slots; an empty slot has position -1.
class SwaRing {
 public:
  SwaRing() = default;
  SwaRing(int64_t slots, int64_t width);
  int64_t slots() const { return slots_; }
  int64_t width() const { return width_; }
  // The KV of position `pos`, or nullptr if its slot does not hold that position (never written,
  // or overwritten by a later position).
  const float* find(int64_t pos) const;
  int64_t slot_position(int64_t slot) const { return positions_[static_cast<size_t>(slot)]; }
  void write(int64_t pos, std::span<const float> kv);

 private:
  int64_t slots_ = 0, width_ = 0;
  std::vector<float> values_;      // [slots, width]
  std::vector<int64_t> positions_;
};

// State of one V4 compressor (../shared/spec/architecture.md §5; official V4 `Compressor`) between
// chunks: the fp32 projections of the tokens of the open window (gate already biased by `ape`), and,
// for overlapping CSA windows, the first half (Ca) of the last complete window, which the next
// window's entry pools together with its own second half (Cb).
struct V4PoolState {
  std::vector<float> pending_kv, pending_gate;  // [pending, coff·width]
  int64_t pending = 0;
  std::vector<float> prev_kv, prev_gate;        // [ratio, width]; empty before the first window
};

// Global caches of one KV source layer (Full mode), read by every layer of its group.
struct KvSourceState {
  int64_t layer = -1;
  int64_t ratio = 0;
  KvEntries kv;       // compressed main KV, one entry per complete group
  KvEntries index_k;  // indexer keys, one per complete group
  // ratio > 1: fp32 wkv / wgate projections of the `pending` tokens of the group being filled
  // (positions kv.size()·ratio + [0, pending)), [pending, head_dim] each.
  std::vector<float> pending_kv, pending_gate;
  int64_t pending = 0;
  // V4 layers: the main compressor's and the CSA indexer compressor's state (index_k holds the
  // indexer compressor's entries).
  V4PoolState v4_kv, v4_index;

  // Positions the compressor has consumed so far; the next chunk must start here.
  int64_t consumed() const { return kv.size() * ratio + pending + v4_kv.pending; }
};

struct AttentionState {
  std::vector<SwaRing> rings;           // one per backbone layer
  std::vector<KvSourceState> sources;   // one per KV source layer, in layer order
  std::vector<int64_t> source_slot;     // per layer: index into `sources`, -1 if not a KV source

  // Empty rings for every layer and empty caches for every KV source of the plan.
  static AttentionState create(const LayerPlan& plan, const AttentionParams& p);

  KvSourceState* source(int64_t layer);
  const KvSourceState* source(int64_t layer) const;
};

// Results that layers of one forward (one chunk) hand to later layers. Each entry records the chunk
// it was computed for; a layer reading an entry of another chunk is an error, not stale data.
struct AttentionScratch {
  struct TopK {
    int64_t pos0 = -1, n = 0;
    int64_t width = 0;          // index_topk
    std::vector<int32_t> idx;   // [n, width]: compressed-entry ids ascending, then -1
  };
  struct Candidates {
    int64_t layer = -1, kv_source = -1;
    int64_t pos0 = -1, n = 0;
    int64_t width = 0;          // candidate_topk_blocks
    std::vector<int32_t> blocks;  // [n, width]: kept block ids ascending, then -1
  };
  std::vector<TopK> topk;       // indexed by layer; filled by index sources
  Candidates candidates;        // published by the candidate source

  TopK& topk_of(int64_t layer);
};

}  // namespace cedar
