// DeepSeek-V4 attention of one layer over one chunk of a sequence (../shared/spec/architecture.md §5,
// with the V4 notes of §3; official V4 inference `Attention`, `Compressor`, `Indexer`).
//
// Per token at absolute position p (rope: main for ratio-0 layers, compress + YaRN otherwise):
//   qr = RMSNorm_q(wq_a·x); q = wq_b·qr; per-head unweighted RMS norm of q (bf16 arithmetic, as the
//   reference's `q * rsqrt(mean(q²) + eps)` on a bf16 tensor); RoPE at p
//   kv = RMSNorm_kv(wkv·x), RoPE at p, FP8 QDQ (blocks of 64, UE8M0) on the nope channels only; the
//   RoPE channels stay bf16 → the layer's SWA ring
// Compressed layers own their compressor (compressor.h, compress_chunk_v4); every complete window j
// appends one main entry: RoPE(latent, j·ratio), FP8 QDQ of the nope channels as above.
//   * CSA (ratio 4, overlapping windows): the layer's indexer has its own compressor at index_head_dim;
//     its entries are RoPE'd, Hadamard-rotated and FP4-QDQ'd (block 32, UE8M0) into index_k. Queries:
//     wq_b_i·qr → RoPE → Hadamard → FP4 QDQ; scores and top-k as in V4.1 (indexer.h, bf16 scores).
//   * HCA (ratio 128): no indexer; the query attends every visible entry (j < (p+1)/ratio).
// One softmax over window ∪ compressed entries with the sink, inverse RoPE at p, grouped wo_a / wo_b.
// Chunked prefill and token-by-token decode equal a one-shot prefill bit for bit.
#pragma once

#include <span>

#include "core/status.h"
#include "core/threads.h"
#include "model/attention.h"

namespace cedar {

// call.pass must be Exact and call.swa_start 0 (V4 has no bounded replay). Errors name the layer.
Status attention_v4_forward(const AttentionCall& call, std::span<const float> x, const AttentionWeights& w,
                            const AttentionParams& p, AttentionState& st, AttentionScratch& scratch,
                            std::span<float> out, ThreadPool* pool);

// The reference's per-head query norm on bf16 values, in place (q: n_vec vectors of `width`):
// ms = bf16(Σ bf16(q²) / width), r = bf16(rsqrt(bf16(ms + eps))), q = bf16(q·r).
void v4_query_norm(std::span<float> q, int64_t width, double eps);

}  // namespace cedar
