// Which cache streams a model keeps and in which record formats (../shared/spec/architecture.md §3.12,
// §4.3), and the measured global-KV bytes per token: what the block pool really allocates for a
// sequence of N tokens, obtained by growing every stream's block table in a dry-run pool.
//
// Streams (global KV, paged): per KV source layer (LayerRole::owns_compressor) one main-KV stream and,
// when the layer owns indexer keys, one indexer-key stream; a ratio-r source stores one entry per r
// positions. A block of a stream covers `tokens_per_block` positions (entries_per_block =
// tokens_per_block / ratio), so block boundaries fall on complete ratio-r groups; a ratio above
// tokens_per_block stores one entry per block.
// Per-sequence state outside the pool (not in the per-token figure): one SWA ring per layer
// (window × SWA record), the fp32 partial ratio-r group of each source, scalars.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/config.h"
#include "kv/block_pool.h"
#include "kv/kv_format.h"
#include "model/layer_plan.h"

namespace cedar {

struct KvCacheOptions {
  KvStorage storage = KvStorage::Packed;  // F32: same quantization, values kept as fp32 (reference runs)
  int64_t tokens_per_block = 64;          // positions per block of every stream (multiple of each ratio)
  std::shared_ptr<BlockPool> pool = nullptr;  // global-KV blocks; null: a private unbounded pool per sequence
};

struct KvDims {
  Arch arch = Arch::DeepseekV41;
  int64_t head_dim = 0, index_head_dim = 0, rope_dim = 0;
};

struct KvFormats {
  KvRecordFormat main, index, swa;
};
// V4.1: FP4/E4M3-16 main KV, FP4/UE8M0-32 indexer keys, FP8/UE8M0-32 SWA. V4: the FlashMLA record for
// main KV and SWA, FP4/UE8M0-32 indexer keys.
Result<KvFormats> kv_formats(const KvDims& dims, KvStorage storage);

enum class KvStreamKind { MainKv, IndexKey };
struct KvStreamSpec {
  int64_t layer = 0;
  KvStreamKind kind = KvStreamKind::MainKv;
  int64_t ratio = 0;
  KvRecordFormat format;
  int64_t entries_per_block = 0;
};
Result<std::vector<KvStreamSpec>> global_kv_streams(const LayerPlan& plan, const KvFormats& formats,
                                                    int64_t tokens_per_block);
// entries_per_block of a ratio-r stream, or an error when tokens_per_block and r do not nest.
Result<int64_t> kv_entries_per_block(int64_t ratio, int64_t tokens_per_block);

struct KvMeasurement {
  int64_t tokens = 0;
  int64_t allocated_bytes = 0;  // pool bytes in use after growing every stream to the sequence
  int64_t payload_bytes = 0;    // Σ stored entries × record bytes
  int64_t padding_bytes = 0;    // allocated − payload: unfilled records of each stream's last block
  int64_t blocks = 0;
  double bytes_per_token() const { return tokens > 0 ? static_cast<double>(allocated_bytes) / tokens : 0.0; }
  double padding_per_token() const { return tokens > 0 ? static_cast<double>(padding_bytes) / tokens : 0.0; }
};

// Dry run: builds the streams of `config`'s plan (packed formats), grows each stream's block table in
// a dry-run pool to the entries a sequence of `tokens` positions stores (floor(tokens / ratio)), and
// reads the pool's used bytes.
Result<KvMeasurement> measure_kv_bytes(const ModelConfig& config, const LayerPlan& plan, int64_t tokens,
                                       int64_t tokens_per_block = 64);

// bytes/token for the engine's stats: measured at 1,048,576 tokens (a multiple of every block span),
// where page padding is zero for the released configs.
Result<double> kv_bytes_per_token_measured(const ModelConfig& config, const LayerPlan& plan);

}  // namespace cedar
