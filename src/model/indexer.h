// CSA2 sparse indexer of an index source layer and the hierarchical top-k
// (../shared/spec/architecture.md §3.6, §6 item 4).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/status.h"
#include "core/threads.h"
#include "model/attention_params.h"
#include "model/attention_state.h"

namespace cedar {

// Per-query indexer inputs of one chunk.
struct IndexQueries {
  std::vector<float> q;  // [n, index_heads·index_head_dim]: wq_b·qr → RoPE at p → FP4 QDQ (block 32)
  std::vector<float> w;  // [n, index_heads]: head weights, scaled as the precision mode says
};

struct IndexQueryInputs {
  const cpu::LinearWeight* wq_b = nullptr;          // [index_heads·index_head_dim, q_lora], FP8
  const cpu::LinearWeight* weights_proj = nullptr;  // [index_heads, dim], BF16
  std::span<const float> qr = {};                   // [n, q_lora] = RMSNorm_q(wq_a·x)
  std::span<const float> x = {};                    // [n, dim]
  int64_t n = 0, pos0 = 0;
  bool hadamard = false;  // V4: Hadamard rotation of each head after RoPE, before the FP4 QDQ
};
Status index_queries(const IndexQueryInputs& in, const AttentionParams& p, const cpu::RopeTable& rope,
                     IndexQueries& out, ThreadPool* pool);

// In-place Walsh–Hadamard rotation of each of the x.size()/width vectors (width a power of two):
// fp32 butterflies in the fast-transform order, times width^-0.5, rounded to bf16 (the V4 reference's
// `rotate_activation` on bf16 tensors).
Status hadamard_rotate(std::span<float> x, int64_t width);

// I(t) for one query (q: [heads·head_dim], w: [heads]) and one key (k: [head_dim]).
float index_score(const float* q, const float* w, const float* k, int64_t heads, int64_t head_dim,
                  IndexScorePrecision precision, float relu_scale);

// Top-k of one query: among entries with a score > −inf, the `k` highest (ties: lower id first),
// written to out ascending and padded with −1. `ids` names the entry of each score (ascending);
// empty means scores[i] belongs to entry i. Returns how many were selected.
int64_t select_topk(std::span<const float> scores, std::span<const int32_t> ids, int64_t k, std::span<int32_t> out);

// Level one of the hierarchical top-k for one query whose visible entries have `scores` (one per
// entry 0..V-1): block score = max over its entries; the newest block ((V−1)/block_size) is pinned
// with +inf; the top `topk_blocks` blocks with a score > −inf are kept (ties: lower block first),
// written to out ascending and padded with −1. Returns how many were kept.
int64_t select_candidate_blocks(std::span<const float> scores, int64_t block_size, int64_t topk_blocks,
                                std::span<int32_t> out);

// Scores and selects for every query of the chunk of an index source layer (owns_indexer):
// visible entries of the query at p are j < (p+1)/ratio of the KV source's indexer-K cache; a layer
// restricted to the candidate pool (uses_candidates) scores only the entries of the query's kept
// blocks; the candidate source also publishes its kept blocks. Results go to scratch.
struct IndexerRun {
  const LayerRole* role = nullptr;
  const KvSourceState* source = nullptr;  // the layer's KV source
  const IndexQueries* queries = nullptr;
  int64_t pos0 = 0, n = 0;
};
Status run_indexer(const IndexerRun& run, const AttentionParams& p, AttentionScratch& scratch, ThreadPool* pool);

}  // namespace cedar
