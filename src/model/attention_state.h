// Per-sequence attention state of every layer (../shared/spec/architecture.md §3.7, §3.12, §4.3) and
// the per-chunk scratch that layers of one forward share (top-k indices, candidate blocks).
//
// Everything that must survive from one chunk to the next lives here, so chunked prefill and
// token-by-token decode reproduce a one-shot prefill exactly:
//   * one SWA ring per layer: `window + swa_history` slots (swa_history = 0 unless the sequence keeps
//     extra history for prefix-cache snapshots), slot = pos % slots, each holding the layer's FP8 KV
//     record (e4m3 + UE8M0/32, 528 B for head_dim 512) and the position it belongs to; the attention
//     reads only the last `window` positions and writes the last `slots` of every chunk;
//   * per KV source layer: the compressed (main) KV entries (FP4 E2M1 + E4M3/16, 288 B, after RoPE at
//     the group's first position) and the indexer keys (FP4 E2M1 + UE8M0/32, 68 B, after RoPE), in
//     paged blocks of a BlockPool (kv/block_pool.h), and the fp32 projections of the tokens of a not
//     yet complete ratio-2 group.
// Containers store records in a KvRecordFormat (kv/kv_format.h) and decode on read. Writers hand them
// the raw values: the container quantizes (a record cannot be rebuilt from dequantized values), and
// a read gives back exactly the reference's QDQ values. Containers built with only a width (the
// raw-f32 format, recipe None) store values as given; append_quantized / write_quantized quantize for
// those before storing, so the forward gives the same result with either kind of container.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_format.h"
#include "kv/kv_layout.h"
#include "model/attention_params.h"
#include "model/layer_plan.h"

namespace cedar {

struct KvEntriesOptions {
  KvRecordFormat format;
  int64_t position_stride = 0;      // > 0: entry j is at position j·stride (checked on append, not stored)
  int64_t entries_per_block = 64;
  std::shared_ptr<BlockPool> pool = nullptr;  // null: a private unbounded pool
};

// Append-only list of cache entries of one width (compressed KV: head_dim; indexer K: index_head_dim),
// one record per entry in paged blocks. Copies share blocks (prefix sharing) and copy a shared block
// before writing to it.
class KvEntries {
 public:
  KvEntries() = default;
  // Raw-f32 records with explicit positions in a private pool (containers whose writer quantizes).
  explicit KvEntries(int64_t width);
  static Result<KvEntries> create(const KvEntriesOptions& options);

  int64_t width() const { return format_.width; }
  int64_t size() const { return size_; }
  const KvRecordFormat& format() const { return format_; }
  const BlockTable& blocks() const { return table_; }
  // Source position of entry j: the first token of its group (j·ratio).
  int64_t position(int64_t j) const {
    return stride_ > 0 ? j * stride_ : positions_[static_cast<size_t>(j)];
  }
  // Quantizes `values` (raw, width values) with the format's recipe and appends the record. Errors:
  // wrong width, a position out of order, the pool is full (the list is unchanged then).
  Status append(std::span<const float> values, int64_t position);
  // Decodes entry j (0 <= j < size()) into out (width values).
  void read(int64_t j, std::span<float> out) const { format_.decode(record(j), out); }
  std::vector<float> decoded(int64_t j) const;  // read() into a new vector
  // Drops entries from `size` on (rollback to a prefix).
  void truncate(int64_t size);
  // Starts an empty list with `entries` entries held in existing full blocks of the list's pool (a
  // cached prefix, shared by reference count; later appends go to new blocks). Needs derived
  // positions (position_stride > 0) and entries == blocks.size() · entries_per_block.
  Status adopt(std::span<const BlockId> blocks, int64_t entries);

 private:
  std::span<const uint8_t> record(int64_t j) const {
    return {table_.record(j), static_cast<size_t>(format_.record_bytes())};
  }
  KvRecordFormat format_;
  int64_t stride_ = 0;
  int64_t size_ = 0;
  BlockTable table_;
  std::vector<int64_t> positions_;  // only when stride_ == 0
  std::vector<float> scratch_;
};

// One layer's sliding-window KV: slot = pos % slots; an empty slot has position -1.
class SwaRing {
 public:
  SwaRing() = default;
  SwaRing(int64_t slots, int64_t width);  // raw-f32 records (containers whose writer quantizes)
  SwaRing(int64_t slots, const KvRecordFormat& format);
  int64_t slots() const { return slots_; }
  int64_t width() const { return format_.width; }
  const KvRecordFormat& format() const { return format_; }
  int64_t bytes() const { return static_cast<int64_t>(records_.size()); }
  // Whether the ring holds position `pos` (written, and not overwritten by a later position).
  bool holds(int64_t pos) const {
    return pos >= 0 && slots_ > 0 && positions_[static_cast<size_t>(pos % slots_)] == pos;
  }
  // Decodes the KV of `pos` into out (width values); false (out untouched) if the ring does not hold it.
  bool read(int64_t pos, std::span<float> out) const;
  std::vector<float> decoded(int64_t pos) const;  // empty if not held
  int64_t slot_position(int64_t slot) const { return positions_[static_cast<size_t>(slot)]; }
  // Quantizes `kv` (raw, width values) with the format's recipe into the slot of `pos`.
  Status write(int64_t pos, std::span<const float> kv);
  // Empties the slots of positions >= pos (a ring restored at an earlier length).
  void forget_from(int64_t pos);

 private:
  int64_t slots_ = 0;
  KvRecordFormat format_;
  std::vector<uint8_t> records_;   // [slots, record_bytes]
  std::vector<int64_t> positions_;
  std::vector<float> scratch_;
};

// Writers of the forward: quantize raw values with `recipe` — in the container's codec when it uses
// that recipe, here when the container stores values as given (recipe None); a container with another
// recipe is an error.
Status append_quantized(KvEntries& entries, std::span<const float> raw, int64_t position, KvRecipe recipe);
Status write_quantized(SwaRing& ring, int64_t pos, std::span<const float> raw, KvRecipe recipe);
// Whether a container of format `f` can take values of `recipe` through the functions above.
bool accepts_recipe(const KvRecordFormat& f, KvRecipe recipe);

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

  // Empty rings for every layer and empty caches for every KV source of the plan. V4.1 plans get the
  // packed formats of §3.12 (or their fp32-storage twins, options.storage = F32); other architectures
  // get raw-f32 containers (their forward quantizes). Global-KV blocks come from options.pool, or from
  // a private unbounded pool. Errors: shapes the formats cannot hold, a tokens_per_block that does not
  // nest with a compress ratio.
  // Rings get p.window + swa_history slots (swa_history >= 0).
  static Result<AttentionState> create(const LayerPlan& plan, const AttentionParams& p,
                                       const KvCacheOptions& options, int64_t swa_history = 0);
  // The same with default options (packed, private pool); shapes are assumed valid (validated params):
  // an invalid shape gives empty caches that every forward call then rejects.
  static AttentionState create(const LayerPlan& plan, const AttentionParams& p);

  KvSourceState* source(int64_t layer);
  const KvSourceState* source(int64_t layer) const;

  // The global-KV streams in kv_layout.h's global_kv_streams order: per KV source layer with a ratio,
  // its main KV, then its indexer keys when the layer owns them. Errors: a source the plan names is
  // missing from the state.
  Result<std::vector<KvEntries*>> global_kv_entries(const LayerPlan& plan);
  Result<std::vector<const KvEntries*>> global_kv_entries(const LayerPlan& plan) const;
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
