// CSA2 compressor of a KV source layer and the cache entries it feeds
// (../shared/spec/architecture.md §3.5, §3.6 "Keys", §3.12).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/status.h"
#include "core/threads.h"
#include "model/attention_state.h"

namespace cedar {

struct CompressorWeights {
  const cpu::LinearWeight* wkv = nullptr;    // [head_dim, dim]
  const cpu::LinearWeight* wgate = nullptr;  // [head_dim, dim], ratio > 1 only
  std::span<const float> norm = {};          // [head_dim]
};

// Latents (before RoPE) of the groups completed by one chunk.
struct CompressedGroups {
  int64_t first_group = 0;   // id of the first completed group (= entries before the chunk)
  int64_t count = 0;
  std::vector<float> latent = {};  // [count, head_dim], bf16 values
};

// Feeds the chunk x [n, dim] (positions [src.consumed(), +n)) to the compressor of `src`:
//   ratio 1: latent_p = RMSNorm(bf16(wkv · x_p))   (BF16 GEMM), one group per token;
//   ratio r: per group of r tokens, k_t = wkv·x_t and g_t = wgate·x_t in fp32, per channel
//            pooled = Σ_t softmax_t(g_t)·k_t (fp32), latent = RMSNorm(bf16(pooled)).
// Tokens of an incomplete group stay in src.pending_* (fp32) until the group completes, so any
// chunking gives the same latents as one shot. Does not touch the caches.
Status compress_chunk(const CompressorWeights& w, double eps, std::span<const float> x, int64_t n,
                      KvSourceState& src, CompressedGroups& out, ThreadPool* pool);

// Appends the groups' entries to the caches of `src`:
//   indexer key: k = RMSNorm_k(wk · latent) (BF16 GEMM) → RoPE on the last rope_dim channels at j·ratio
//                → FP4 QDQ (block 32, UE8M0)            (skipped when wk is null: no indexer keys)
//   main entry:  RoPE(latent, j·ratio) → FP4 QDQ (block 16, E4M3 scale)
// The quantization happens on write (append_quantized): in the cache's codec for packed caches, here
// for raw-f32 containers; either way the cache reads back the same values.
struct CacheWriteParams {
  const cpu::RopeTable* rope = nullptr;      // the layer's (compress) rope
  const cpu::LinearWeight* wk = nullptr;     // [index_head_dim, head_dim] or null
  std::span<const float> k_norm = {};        // [index_head_dim]
  double eps = 1e-6;
};
Status append_cache_entries(const CompressedGroups& groups, const CacheWriteParams& p, KvSourceState& src,
                            ThreadPool* pool);

}  // namespace cedar
