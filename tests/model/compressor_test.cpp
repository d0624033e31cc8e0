// CSA2 compressor (architecture.md §3.5): pooled latents against a double-precision formulation,
// ratio-2 pairing across chunks (chunked == one-shot bit for bit, odd tokens carried in fp32), and the
// cache entries (RoPE at the group's first position, FP4 QDQ recipes).
#include "model/compressor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attention_test_util.h"
#include "core/numeric.h"

namespace cedar {
namespace {

using test::random_bf16;
using test::WeightStore;

constexpr int64_t kDim = 64, kHd = 64, kIhd = 32, kRope = 16;

KvSourceState make_source(int64_t ratio) {
  KvSourceState s;
  s.layer = 2;
  s.ratio = ratio;
  s.kv = KvEntries(kHd);
  s.index_k = KvEntries(kIhd);
  return s;
}

std::vector<double> matvec(const std::vector<double>& w, const float* x, int64_t out, int64_t in) {
  std::vector<double> y(static_cast<size_t>(out), 0.0);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < in; ++c) y[r] += w[r * in + c] * x[c];
  return y;
}

// bf16( w ⊙ v / rms(v) ) in double.
std::vector<double> rms_norm_ref(const std::vector<double>& v, std::span<const float> w) {
  double ss = 0;
  for (double a : v) ss += a * a;
  const double r = 1.0 / std::sqrt(ss / double(v.size()) + 1e-20);
  std::vector<double> y(v.size());
  for (size_t i = 0; i < v.size(); ++i) y[i] = round_to_bf16(static_cast<float>(w[i] * v[i] * r));
  return y;
}

struct Fixture {
  WeightStore ws;
  cpu::LinearWeight wkv = ws.bf16(kHd, kDim, 1, 0.125f);
  cpu::LinearWeight wgate = ws.bf16(kHd, kDim, 2, 0.25f);
  std::span<const float> norm = ws.vec(kHd, 3, 0.1f, 1.0f);
  CompressorWeights weights(bool gate) const { return {.wkv = &wkv, .wgate = gate ? &wgate : nullptr, .norm = norm}; }
};

// Feeds x in the given chunk sizes; returns all latents in order.
std::vector<float> feed(const Fixture& f, KvSourceState& src, const std::vector<float>& x,
                        const std::vector<int64_t>& chunks, double eps = 1e-20) {
  std::vector<float> all;
  int64_t at = 0;
  for (int64_t n : chunks) {
    CompressedGroups g;
    EXPECT_TRUE(compress_chunk(f.weights(src.ratio > 1), eps,
                               std::span<const float>(x).subspan(static_cast<size_t>(at * kDim), static_cast<size_t>(n * kDim)),
                               n, src, g, nullptr)
                    .ok());
    EXPECT_EQ(g.first_group, src.kv.size());
    all.insert(all.end(), g.latent.begin(), g.latent.end());
    // Pretend the cache took them so the next chunk's first_group advances.
    for (int64_t i = 0; i < g.count; ++i)
      EXPECT_TRUE(src.kv.append(std::span<const float>(g.latent).subspan(static_cast<size_t>(i * kHd), kHd),
                                (g.first_group + i) * src.ratio)
                      .ok());
    at += n;
  }
  return all;
}

TEST(Compressor, Ratio2PoolingMatchesDoublePrecisionSoftmaxGate) {
  Fixture f;
  const int64_t n = 9;
  const auto x = random_bf16(n * kDim, 10, 1.0f);
  KvSourceState src = make_source(2);
  const auto latent = feed(f, src, x, {n});
  ASSERT_EQ(latent.size(), size_t(4 * kHd));  // 4 complete pairs, token 8 waits
  const auto wk = test::dequantize(f.wkv), wg = test::dequantize(f.wgate);
  for (int64_t j = 0; j < 4; ++j) {
    const auto k0 = matvec(wk, &x[(2 * j) * kDim], kHd, kDim), k1 = matvec(wk, &x[(2 * j + 1) * kDim], kHd, kDim);
    const auto g0 = matvec(wg, &x[(2 * j) * kDim], kHd, kDim), g1 = matvec(wg, &x[(2 * j + 1) * kDim], kHd, kDim);
    std::vector<double> pooled(kHd);
    for (int64_t c = 0; c < kHd; ++c) {
      const double a = 1.0 / (1.0 + std::exp(g1[c] - g0[c]));  // softmax weight of the first token
      pooled[c] = round_to_bf16(static_cast<float>(a * k0[c] + (1 - a) * k1[c]));
    }
    const auto ref = rms_norm_ref(pooled, f.norm);
    for (int64_t c = 0; c < kHd; ++c)
      EXPECT_NEAR(latent[j * kHd + c], ref[c], std::fabs(ref[c]) * std::ldexp(1.0, -7) + 1e-6) << j << "," << c;
  }
}

TEST(Compressor, Ratio1IsNormOfBf16Projection) {
  Fixture f;
  const int64_t n = 5;
  const auto x = random_bf16(n * kDim, 11, 1.0f);
  KvSourceState src = make_source(1);
  const auto latent = feed(f, src, x, {n});
  ASSERT_EQ(latent.size(), size_t(n * kHd));
  EXPECT_EQ(src.pending, 0);
  const auto wk = test::dequantize(f.wkv);
  for (int64_t t = 0; t < n; ++t) {
    auto k = matvec(wk, &x[t * kDim], kHd, kDim);
    for (double& v : k) v = round_to_bf16(static_cast<float>(v));
    const auto ref = rms_norm_ref(k, f.norm);
    for (int64_t c = 0; c < kHd; ++c)
      EXPECT_NEAR(latent[t * kHd + c], ref[c], std::fabs(ref[c]) * std::ldexp(1.0, -7) + 1e-6);
  }
}

TEST(Compressor, Ratio2ChunkedEqualsOneShotBitwise) {
  Fixture f;
  const int64_t n = 17;
  const auto x = random_bf16(n * kDim, 12, 1.0f);
  KvSourceState one = make_source(2);
  const auto ref = feed(f, one, x, {n});
  for (const std::vector<int64_t>& chunks :
       {std::vector<int64_t>{3, 1, 4, 1, 5, 3}, std::vector<int64_t>(17, 1), std::vector<int64_t>{1, 16},
        std::vector<int64_t>{2, 2, 13}}) {
    KvSourceState src = make_source(2);
    const auto got = feed(f, src, x, chunks);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], ref[i]) << i;
    EXPECT_EQ(src.pending, 1);
    EXPECT_EQ(src.pending_kv, one.pending_kv);
    EXPECT_EQ(src.pending_gate, one.pending_gate);
  }
}

TEST(Compressor, OddTokenWaitsInFp32StateUntilItsPartnerArrives) {
  Fixture f;
  const auto x = random_bf16(4 * kDim, 13, 1.0f);
  KvSourceState src = make_source(2);
  EXPECT_TRUE(feed(f, src, std::vector<float>(x.begin(), x.begin() + 3 * kDim), {3}).size() == size_t(kHd));
  ASSERT_EQ(src.pending, 1);
  EXPECT_EQ(src.consumed(), 3);
  // The buffered row is the unrounded fp32 projection of token 2.
  std::vector<float> k(kHd), g(kHd);
  const std::span<const float> x2(&x[2 * kDim], kDim);
  ASSERT_TRUE(cpu::linear(f.wkv, x2, 1, k, {.bf16_output = false}, nullptr).ok());
  ASSERT_TRUE(cpu::linear(f.wgate, x2, 1, g, {.bf16_output = false}, nullptr).ok());
  EXPECT_EQ(src.pending_kv, k);
  EXPECT_EQ(src.pending_gate, g);
  bool unrounded = false;
  for (float v : k) unrounded |= v != round_to_bf16(v);
  EXPECT_TRUE(unrounded) << "state must hold fp32 values, not bf16";
  // Its partner completes group 1, equal to a one-shot compression of the 4 tokens.
  const auto last = feed(f, src, std::vector<float>(x.begin() + 3 * kDim, x.end()), {1});
  KvSourceState one = make_source(2);
  const auto ref = feed(f, one, x, {4});
  ASSERT_EQ(last.size(), size_t(kHd));
  for (int64_t c = 0; c < kHd; ++c) EXPECT_EQ(last[c], ref[kHd + c]);
  EXPECT_EQ(src.pending, 0);
}

// Entry j = FP4-QDQ16(RoPE(latent_j, j·ratio)); indexer key j = FP4-QDQ32(RoPE(RMSNorm_k(bf16(wk·latent_j)),
// j·ratio)) — composed here from the spec's steps.
TEST(Compressor, CacheEntriesAreRotatedAtGroupStartAndFp4Quantized) {
  WeightStore ws;
  const auto wk = ws.bf16(kIhd, kHd, 20, 0.125f);
  const auto k_norm = ws.vec(kIhd, 21, 0.1f, 1.0f);
  const cpu::RopeTable rope(cpu::RopeConfig{.rope_dim = kRope, .base = 160000.0, .yarn_factor = 4.0, .original_max_position = 256});
  for (int64_t ratio : {1, 2}) {
    SCOPED_TRACE("ratio " + std::to_string(ratio));
    KvSourceState src = make_source(ratio);
    CompressedGroups g{.first_group = 0, .count = 3, .latent = random_bf16(3 * kHd, 22, 1.0f)};
    ASSERT_TRUE(append_cache_entries(g, {.rope = &rope, .wk = &wk, .k_norm = k_norm, .eps = 1e-20}, src, nullptr).ok());
    g.first_group = 3;
    g.latent = random_bf16(3 * kHd, 23, 1.0f);
    ASSERT_TRUE(append_cache_entries(g, {.rope = &rope, .wk = &wk, .k_norm = k_norm, .eps = 1e-20}, src, nullptr).ok());
    ASSERT_EQ(src.kv.size(), 6);
    ASSERT_EQ(src.index_k.size(), 6);
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t j = 3 + i;
      EXPECT_EQ(src.kv.position(j), j * ratio);
      std::vector<float> e(g.latent.begin() + i * kHd, g.latent.begin() + (i + 1) * kHd);
      rope.apply(e, 1, kHd, j * ratio);
      ASSERT_TRUE(qdq_fp4_block16_e4m3(e).ok());
      const std::vector<float> stored = src.kv.decoded(j);
      for (int64_t c = 0; c < kHd; ++c) ASSERT_EQ(stored[c], e[c]) << j << "," << c;
      // A rotation at the group's last token would differ (the test can tell positions apart).
      if (ratio == 2) {
        std::vector<float> other(g.latent.begin() + i * kHd, g.latent.begin() + (i + 1) * kHd);
        rope.apply(other, 1, kHd, j * ratio + 1);
        ASSERT_TRUE(qdq_fp4_block16_e4m3(other).ok());
        EXPECT_NE(other, e);
      }
      std::vector<float> k(kIhd), kn(kIhd);
      ASSERT_TRUE(cpu::linear(wk, std::span<const float>(g.latent).subspan(i * kHd, kHd), 1, k, {}, nullptr).ok());
      cpu::rms_norm(k, kIhd, k_norm, 1e-20, kn);
      rope.apply(kn, 1, kIhd, j * ratio);
      ASSERT_TRUE(qdq_fp4_block32_ue8m0(kn).ok());
      const std::vector<float> key = src.index_k.decoded(j);
      for (int64_t c = 0; c < kIhd; ++c) ASSERT_EQ(key[c], kn[c]) << j << "," << c;
    }
  }
}

TEST(Compressor, RejectsGroupsThatDoNotContinueTheCache) {
  WeightStore ws;
  const cpu::RopeTable rope(cpu::RopeConfig{.rope_dim = kRope});
  KvSourceState src = make_source(2);
  CompressedGroups g{.first_group = 1, .count = 1, .latent = random_bf16(kHd, 1, 1.0f)};
  const auto s = append_cache_entries(g, {.rope = &rope}, src, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("start at 1"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace cedar
