#include "model/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/numeric.h"

namespace cedar {

float exp_f32(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

void sparse_attention_row(std::span<const float> q, std::span<const float* const> keys,
                          std::span<const float> sink, const SparseAttentionShape& shape, std::span<float> out,
                          std::vector<float>& work) {
  const int64_t hd = shape.head_dim;
  const size_t n_keys = keys.size();
  if (n_keys == 0) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  work.resize(n_keys + static_cast<size_t>(hd));
  float* scores = work.data();
  float* acc = work.data() + n_keys;
  for (int64_t h = 0; h < shape.n_heads; ++h) {
    const float* qh = q.data() + h * hd;
    float m = -std::numeric_limits<float>::infinity();
    for (size_t j = 0; j < n_keys; ++j) {
      const float* k = keys[j];
      float dot = 0.0f;
      for (int64_t c = 0; c < hd; ++c) dot += qh[c] * k[c];
      scores[j] = dot * shape.scale;
      m = std::max(m, scores[j]);
    }
    float denom = 0.0f;
    std::fill(acc, acc + hd, 0.0f);
    for (size_t j = 0; j < n_keys; ++j) {
      const float p = exp_f32(scores[j] - m);
      denom += p;
      const float pv = shape.bf16_probabilities ? round_to_bf16(p) : p;
      const float* k = keys[j];
      for (int64_t c = 0; c < hd; ++c) acc[c] += pv * k[c];
    }
    denom += exp_f32(sink[static_cast<size_t>(h)] - m);
    float* oh = out.data() + h * hd;
    for (int64_t c = 0; c < hd; ++c) oh[c] = round_to_bf16(acc[c] / denom);
  }
}

}  // namespace cedar
