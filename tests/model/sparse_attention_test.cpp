// Sparse attention with sink against an independent double-precision softmax (sink inside or outside
// the max), and the inverse RoPE that undoes the key's rotation on the output.
#include "model/sparse_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention_test_util.h"
#include "backend/cpu/ops.h"
#include "core/numeric.h"

namespace cedar {
namespace {

using test::random_bf16;

// o_h = Σ e^{s_j−M} k_j / (Σ e^{s_j−M} + e^{sink_h−M}) in double; M with or without the sink.
// mass[h] = Σ_j e^{s_j−M} / denominator: the share of the keys (1 − the sink's share).
std::vector<double> reference(const std::vector<float>& q, const std::vector<std::vector<float>>& keys,
                              const std::vector<float>& sink, int64_t heads, int64_t hd, bool sink_in_max,
                              std::vector<double>* mass = nullptr) {
  std::vector<double> out(static_cast<size_t>(heads * hd), 0.0);
  if (mass) mass->assign(static_cast<size_t>(heads), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<double> s(keys.size());
    double m = sink_in_max ? sink[h] : -INFINITY;
    for (size_t j = 0; j < keys.size(); ++j) {
      double dot = 0;
      for (int64_t c = 0; c < hd; ++c) dot += double(q[h * hd + c]) * keys[j][c];
      s[j] = dot * scale;
      m = std::max(m, s[j]);
    }
    double den = std::exp(double(sink[h]) - m);
    for (size_t j = 0; j < keys.size(); ++j) den += std::exp(s[j] - m);
    for (size_t j = 0; j < keys.size(); ++j) {
      if (mass) (*mass)[h] += std::exp(s[j] - m) / den;
      for (int64_t c = 0; c < hd; ++c) out[h * hd + c] += std::exp(s[j] - m) * keys[j][c] / den;
    }
  }
  return out;
}

struct Case {
  int64_t heads, hd, n_keys;
  float sink_mean;
};

class SparseAttentionVsDouble : public ::testing::TestWithParam<Case> {};

TEST_P(SparseAttentionVsDouble, MatchesWithinRounding) {
  const Case c = GetParam();
  const auto q = random_bf16(static_cast<size_t>(c.heads * c.hd), 11, 2.0f);
  std::vector<std::vector<float>> keys;
  std::vector<const float*> ptrs;
  for (int64_t j = 0; j < c.n_keys; ++j) keys.push_back(random_bf16(static_cast<size_t>(c.hd), 100 + j, 1.0f));
  for (auto& k : keys) ptrs.push_back(k.data());
  const auto sink = random_bf16(static_cast<size_t>(c.heads), 7, 1.0f, c.sink_mean);
  float kmax = 0;
  for (auto& k : keys)
    for (float v : k) kmax = std::max(kmax, std::fabs(v));

  const auto ref_out = reference(q, keys, sink, c.heads, c.hd, false);
  std::vector<double> mass;
  const auto ref_in = reference(q, keys, sink, c.heads, c.hd, true, &mass);
  for (size_t i = 0; i < ref_out.size(); ++i) EXPECT_NEAR(ref_out[i], ref_in[i], 1e-12 * (1 + kmax));

  for (bool bf16_probs : {false, true}) {
    SCOPED_TRACE(bf16_probs ? "bf16 probabilities" : "fp32 probabilities");
    const SparseAttentionShape shape{.n_heads = c.heads,
                                     .head_dim = c.hd,
                                     .scale = static_cast<float>(1.0 / std::sqrt(double(c.hd))),
                                     .bf16_probabilities = bf16_probs};
    std::vector<float> out(static_cast<size_t>(c.heads * c.hd)), work;
    sparse_attention_row(q, ptrs, sink, shape, out, work);
    // bf16 output rounding (2^-9 relative) + fp32 arithmetic; bf16 numerators err by up to
    // 2^-9 of the keys' probability mass times max|k|.
    for (size_t i = 0; i < out.size(); ++i) {
      const double abs_tol = (bf16_probs ? std::ldexp(1.0, -8) : 1e-4) * kmax * mass[i / c.hd];
      EXPECT_NEAR(out[i], ref_in[i], std::fabs(ref_in[i]) * std::ldexp(1.0, -8) + abs_tol) << i;
      EXPECT_EQ(out[i], round_to_bf16(out[i]));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SparseAttentionVsDouble,
                         ::testing::Values(Case{4, 64, 1, 0.0f}, Case{4, 64, 37, 0.0f}, Case{2, 512, 200, 0.0f},
                                           Case{3, 32, 12, 40.0f},    // sink dominates: larger than every score
                                           Case{3, 32, 12, -60.0f})); // sink negligible

TEST(SparseAttention, EmptyKeySetGivesZero) {
  const std::vector<float> q(64, 1.0f), sink(2, 0.0f);
  std::vector<float> out(64, 5.0f), work;
  sparse_attention_row(q, {}, sink, {.n_heads = 2, .head_dim = 32, .scale = 0.1f}, out, work);
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

// With one key and a sink of -inf, the output is the key itself; inverse RoPE at the key's
// position then gives back the unrotated latent (within the bf16 roundings of the two rotations).
TEST(SparseAttention, InverseRopeAtQueryPositionUndoesKeyRotation) {
  const int64_t hd = 64, rd = 16, pos = 37;
  const cpu::RopeTable rope(cpu::RopeConfig{.rope_dim = rd, .base = 160000.0, .yarn_factor = 4.0,
                                            .original_max_position = 256});
  const auto latent = random_bf16(hd, 5, 1.0f);
  std::vector<float> key = latent;
  rope.apply(key, 1, hd, pos);
  const auto q = random_bf16(2 * hd, 6, 1.0f);
  const std::vector<float> sink(2, -std::numeric_limits<float>::infinity());
  const float* keys[] = {key.data()};
  std::vector<float> out(2 * hd), work;
  sparse_attention_row(q, keys, sink, {.n_heads = 2, .head_dim = hd, .scale = 0.125f}, out, work);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t c = 0; c < hd; ++c) ASSERT_EQ(out[h * hd + c], key[c]);
  rope.apply(out, 2, hd, pos, /*inverse=*/true);
  // Independent inverse: rotate by −angle in double.
  const auto freq = rope.inv_freq();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t c = 0; c < hd; ++c) {
      if (c < hd - rd) {
        EXPECT_EQ(out[h * hd + c], latent[c]);  // nope channels untouched
        continue;
      }
      const int64_t i = (c - (hd - rd)) / 2;
      const double a = double(static_cast<float>(pos) * freq[i]);
      const int64_t e = hd - rd + 2 * i;
      const double ref = (c == e) ? key[e] * std::cos(a) + key[e + 1] * std::sin(a)
                                  : -key[e] * std::sin(a) + key[e + 1] * std::cos(a);
      EXPECT_NEAR(out[h * hd + c], ref, std::fabs(ref) * std::ldexp(1.0, -8) + 1e-6);
      EXPECT_NEAR(out[h * hd + c], latent[c], 0.02 * (std::fabs(latent[c]) + 0.1));
    }
}

}  // namespace
}  // namespace cedar
