// Sparse MQA attention of one query over a gathered key set (K = V), with a per-head sink
// (../shared/spec/architecture.md §3.4, §3.7; reference kernel `sparse_attn`).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace cedar {

struct SparseAttentionShape {
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  float scale = 0.0f;               // head_dim^-0.5 in fp32
  bool bf16_probabilities = true;   // see AttentionParams::bf16_probabilities
};

// For each head h (q_h = q[h·head_dim, (h+1)·head_dim)):
//   s_j = fp32(q_h · k_j) · scale          (fp32 accumulation over channels, in channel order)
//   M   = max_j s_j                         (the sink is not part of the max, as in the kernel)
//   p_j = exp(s_j − M)                      (fp32)
//   o_h = bf16( Σ_j p'_j · k_j / (Σ_j p_j + exp(sink_h − M)) ),  p'_j = bf16(p_j) or p_j
// Keys are summed in the order given (the caller passes window keys by position, then compressed
// entries by id), so results do not depend on how a sequence was chunked. An empty key set gives 0.
// `work` is caller-owned scratch (resized as needed) so rows can run in parallel without allocation.
void sparse_attention_row(std::span<const float> q, std::span<const float* const> keys,
                          std::span<const float> sink, const SparseAttentionShape& shape, std::span<float> out,
                          std::vector<float>& work);

// exp in fp32, correctly rounded in all but the rarest cases (double exp rounded once); every
// softmax of the attention module uses it so results are libm-independent in practice.
float exp_f32(float x);

}  // namespace cedar
