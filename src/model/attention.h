// V4.1 CSA2 attention of one layer over one chunk of a sequence
// (../shared/spec/architecture.md §3.4–§3.7, §3.11, §4.1–§4.3).
//
// Per token at absolute position p, every layer computes its own query and its own SWA KV:
//   qr = RMSNorm_q(wq_a·x); q = wq_b·qr, RoPE on the last rope_dim channels of each head at p
//   kv = RMSNorm_kv(wkv·x), RoPE at p, FP8 QDQ (block 32, UE8M0) → the layer's ring
// (the rope is the compress rope for ratio>0 layers, the main rope for ratio-0 layers). Ratio>0
// layers also attend compressed entries of their KV source: the KV source (Full) runs the
// compressor and appends main KV + indexer keys (compressor.h); an index source (Full / Reindex)
// scores them and publishes per-query top-k ids (indexer.h); Reuse layers use the top-k of their
// index source from the same chunk. Attention is one softmax over window ∪ selected with the sink
// (sparse_attention.h), then inverse RoPE at p, grouped wo_a (BF16 values) and wo_b (FP8).
//
// Layers of one chunk must be called in layer order with the same AttentionScratch, so that sources
// run before the layers that read them. Chunked prefill and token-by-token decode equal a one-shot
// prefill bit for bit (every cross-chunk quantity lives in AttentionState).
#pragma once

#include <cstdint>
#include <span>

#include "backend/cpu/ops.h"
#include "core/status.h"
#include "core/threads.h"
#include "model/attention_params.h"
#include "model/attention_state.h"
#include "model/layer_plan.h"

namespace cedar {

// Borrowed weights of one layer's attention (names after the checkpoint's `layers.{L}.attn.*`).
struct AttentionWeights {
  cpu::LinearWeight wq_a;   // [q_lora, dim] FP8
  cpu::LinearWeight wq_b;   // [n_heads·head_dim, q_lora] FP8
  cpu::LinearWeight wkv;    // [head_dim, dim] FP8
  cpu::LinearWeight wo_a;   // [o_groups·o_lora, n_heads·head_dim/o_groups], BF16 or F32 holding bf16 values
  cpu::LinearWeight wo_b;   // [dim, o_groups·o_lora] FP8
  std::span<const float> q_norm, kv_norm;  // [q_lora], [head_dim]
  std::span<const float> attn_sink;        // [n_heads] f32
  // Compressor (owns_compressor): compressor.wkv / .wgate (ratio > 1) [head_dim, dim] BF16, used in
  // fp32 at ratio > 1; compressor.norm [head_dim].
  cpu::LinearWeight wkv_c, wgate_c;
  std::span<const float> norm_c;
  // Indexer keys (owns_indexer_keys): indexer.wk [index_head_dim, head_dim] BF16, indexer.k_norm.
  cpu::LinearWeight wk;
  std::span<const float> k_norm;
  // Indexer (owns_indexer): indexer.wq_b [index_heads·index_head_dim, q_lora] FP8,
  // indexer.weights_proj [index_heads, dim] BF16.
  cpu::LinearWeight wq_b_i, weights_proj;
  // V4 only (attention_v4.h): the learned position bias of the compressor, compressor.ape
  // [ratio, coff·head_dim] f32 (wkv_c / wgate_c are then [coff·head_dim, dim]); the CSA indexer's own
  // compressor, indexer.compressor.{wkv, wgate} [coff·index_head_dim, dim] BF16, .ape, .norm.
  std::span<const float> ape_c;
  cpu::LinearWeight wkv_ic, wgate_ic;
  std::span<const float> ape_ic, norm_ic;
};

// What a call computes.
enum class AttentionPass {
  // Exact (reference) step: q, own SWA KV into the ring, KV-source caches, top-k, attention.
  Exact,
  // KV source layers only: append compressed KV + indexer keys for the chunk, nothing else (no
  // ring write, no output). Decoder SWA bounded replay runs the last KV source this way over the
  // prompt head before the decoder tail.
  GlobalKvOnly,
  // Encoder SWA bounded replay of already cached positions: q, own SWA KV into the ring, top-k
  // and attention over the existing global caches, which are not written (they must already
  // cover the chunk).
  SwaReplay,
};

struct AttentionCall {
  int64_t layer = 0;
  const LayerRole* role = nullptr;
  int64_t pos0 = 0;  // absolute position of the chunk's first token
  int64_t n = 0;     // tokens in the chunk
  // SWA truncation (bounded replay, §3.11): a query at p sees SWA keys in [max(swa_start, p−W+1), p].
  // 0 = exact. Must be <= pos0. Compressed attention is not truncated.
  int64_t swa_start = 0;
  AttentionPass pass = AttentionPass::Exact;
};

// x: [n, dim] normed collapsed input (bf16 values); out: [n, dim] bf16 attention output (after wo_b);
// out may be empty for GlobalKvOnly. Errors name the layer and what is inconsistent (shapes, chunk
// not contiguous with the state, SWA keys missing from the ring, a source that did not run).
// out = wo_b · concat_g(wo_a[g] · o_g) for o [n, n_heads·head_dim]: the grouped BF16 projection (bf16
// output, no activation quantization), then the FP8 GEMM (shared by V4.1 and V4).
Status attention_output_projection(std::span<const float> o, int64_t n, const AttentionWeights& w,
                                   const AttentionParams& p, std::span<float> out, ThreadPool* pool);

Status attention_forward(const AttentionCall& call, std::span<const float> x, const AttentionWeights& w,
                         const AttentionParams& p, AttentionState& st, AttentionScratch& scratch,
                         std::span<float> out, ThreadPool* pool);

}  // namespace cedar
