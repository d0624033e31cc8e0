// mHC coefficient predictor, collapse and expand (architecture.md §3.3) against an independent
// double-precision formulation of the spec and hand-built exact cases.
#include "model/mhc.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/numeric.h"

namespace cedar {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float scale, bool bf16) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16 ? round_to_bf16(dist(rng)) : dist(rng);
  return v;
}

struct DoubleMix {
  std::vector<double> pre, post, comb;
};

// The spec's steps 1–5 in double precision, written from the text: normalize v first (the same math
// as applying the RMS factor after the GEMV), sigmoid/softmax with std::exp in double.
DoubleMix reference_mix(const std::vector<float>& X, const std::vector<float>& fn, const std::vector<float>& base,
                        const std::vector<float>& scale, int64_t hc, int64_t d, int64_t iters, double hc_eps,
                        double norm_eps) {
  const int64_t width = hc * d, n_mix = (2 + hc) * hc;
  double ms = 0;
  for (float v : X) ms += double(v) * v;
  ms /= double(width);
  const double inv_rms = 1.0 / std::sqrt(ms + norm_eps);
  std::vector<double> m(n_mix);
  for (int64_t i = 0; i < n_mix; ++i) {
    double acc = 0;
    for (int64_t c = 0; c < width; ++c) acc += double(fn[i * width + c]) * (double(X[c]) * inv_rms);
    m[i] = acc;
  }
  auto sig = [](double z) { return 1.0 / (1.0 + std::exp(-z)); };
  DoubleMix r;
  for (int64_t k = 0; k < hc; ++k) {
    r.pre.push_back(sig(m[k] * scale[0] + base[k]) + hc_eps);
    r.post.push_back(2.0 * sig(m[hc + k] * scale[1] + base[hc + k]));
  }
  std::vector<double> c(hc * hc);
  for (int64_t j = 0; j < hc; ++j) {
    double mx = -1e300, s = 0;
    for (int64_t k = 0; k < hc; ++k) mx = std::max(mx, m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k]);
    for (int64_t k = 0; k < hc; ++k) s += std::exp(m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k] - mx);
    for (int64_t k = 0; k < hc; ++k)
      c[j * hc + k] = std::exp(m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k] - mx) / s + hc_eps;
  }
  auto col_norm = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      double s = 0;
      for (int64_t j = 0; j < hc; ++j) s += c[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) c[j * hc + k] /= s + hc_eps;
    }
  };
  auto row_norm = [&] {
    for (int64_t j = 0; j < hc; ++j) {
      double s = 0;
      for (int64_t k = 0; k < hc; ++k) s += c[j * hc + k];
      for (int64_t k = 0; k < hc; ++k) c[j * hc + k] /= s + hc_eps;
    }
  };
  col_norm();
  for (int64_t it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
  r.comb = c;
  return r;
}

struct Fixture {
  int64_t hc = 4, d = 64;
  std::vector<float> X, fn, base, scale;
  HcParams params() const { return HcParams{.hc = hc, .dim = d, .sinkhorn_iters = 20, .hc_eps = 1e-6, .norm_eps = 1e-20}; }
  HcWeights weights() const { return HcWeights{fn, base, scale}; }
};

Fixture make_fixture(uint32_t seed, float fn_scale = 0.05f) {
  Fixture f;
  const int64_t n_mix = (2 + f.hc) * f.hc;
  f.X = random_values(f.hc * f.d, seed, 1.5f, true);
  f.fn = random_values(n_mix * f.hc * f.d, seed + 1, fn_scale, false);
  f.base = random_values(n_mix, seed + 2, 0.5f, false);
  f.scale = {0.7f, 1.3f, 0.9f};
  return f;
}

TEST(HcMix, MatchesDoublePrecisionSpecFormulation) {
  for (uint32_t seed : {1u, 7u, 21u}) {
    const Fixture f = make_fixture(seed);
    const HcMix got = hc_mix(f.X, f.weights(), f.params());
    const DoubleMix want = reference_mix(f.X, f.fn, f.base, f.scale, f.hc, f.d, 20, 1e-6, 1e-20);
    ASSERT_EQ(got.pre.size(), 4u);
    ASSERT_EQ(got.post.size(), 4u);
    ASSERT_EQ(got.comb.size(), 16u);
    for (int k = 0; k < 4; ++k) {
      EXPECT_NEAR(got.pre[k], want.pre[k], 1e-5) << "pre " << k;
      EXPECT_NEAR(got.post[k], want.post[k], 2e-5) << "post " << k;
    }
    for (int i = 0; i < 16; ++i) EXPECT_NEAR(got.comb[i], want.comb[i], 1e-5) << "comb " << i;
  }
}

// Columns sum to 1 after every step (the last step normalizes columns); rows approach 1 as the iterations
// grow — after the model's 20 for moderately spread logits, and for strongly skewed ones with more.
TEST(HcMix, SinkhornMakesCombDoublyStochastic) {
  struct Case {
    float fn_scale;
    int64_t iters;
    double row_tol;
  };
  for (const Case& c : {Case{0.05f, 20, 1e-3}, Case{0.2f, 20, 1e-2}, Case{0.2f, 400, 1e-5}}) {
    const Fixture f = make_fixture(3, c.fn_scale);
    HcParams p = f.params();
    p.sinkhorn_iters = c.iters;
    const HcMix m = hc_mix(f.X, f.weights(), p);
    for (int a = 0; a < 4; ++a) {
      double row = 0, col = 0;
      for (int b = 0; b < 4; ++b) {
        row += m.comb[a * 4 + b];
        col += m.comb[b * 4 + a];
        EXPECT_GT(m.comb[a * 4 + b], 0.0f);
      }
      EXPECT_NEAR(col, 1.0, 1e-5) << "column " << a << " iters " << c.iters;
      EXPECT_NEAR(row, 1.0, c.row_tol) << "row " << a << " fn_scale " << c.fn_scale << " iters " << c.iters;
    }
  }
}

// One iteration = softmax over k (+eps) and one column normalization, no row step.
TEST(HcMix, SingleIterationIsSoftmaxThenColumnNormalization) {
  Fixture f = make_fixture(5);
  HcParams p = f.params();
  p.sinkhorn_iters = 1;
  const HcMix got = hc_mix(f.X, f.weights(), p);
  const DoubleMix want = reference_mix(f.X, f.fn, f.base, f.scale, f.hc, f.d, 1, 1e-6, 1e-20);
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(got.comb[i], want.comb[i], 1e-6) << i;
  for (int k = 0; k < 4; ++k) {
    double col = 0;
    for (int j = 0; j < 4; ++j) col += got.comb[j * 4 + k];
    EXPECT_NEAR(col, 1.0, 1e-5);
  }
}

// pre = sigmoid(...) + hc_eps: a saturated-off gate still gives hc_eps; post saturates at 2.
TEST(HcMix, PreCarriesEpsAndPostSaturatesAtTwo) {
  Fixture f = make_fixture(9);
  std::fill(f.fn.begin(), f.fn.end(), 0.0f);
  for (int k = 0; k < 4; ++k) {
    f.base[k] = -200.0f;    // sigmoid → 0
    f.base[4 + k] = 50.0f;  // sigmoid → 1
  }
  const HcMix m = hc_mix(f.X, f.weights(), f.params());
  for (int k = 0; k < 4; ++k) {
    EXPECT_FLOAT_EQ(m.pre[k], 1e-6f);
    EXPECT_FLOAT_EQ(m.post[k], 2.0f);
  }
  // fn = 0: all comb logits are the base; with equal bases the matrix is uniform 1/4.
  std::fill(f.base.begin() + 8, f.base.end(), 0.3f);
  const HcMix u = hc_mix(f.X, f.weights(), f.params());
  for (float c : u.comb) EXPECT_NEAR(c, 0.25f, 1e-6f);
}

// The RMS factor scales m, so scaling X by 2^k (exact in bf16) leaves the coefficients unchanged.
TEST(HcMix, InvariantToPowerOfTwoScalingOfTheStreams) {
  Fixture f = make_fixture(11);
  const HcMix a = hc_mix(f.X, f.weights(), f.params());
  for (auto& v : f.X) v *= 8.0f;
  const HcMix b = hc_mix(f.X, f.weights(), f.params());
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(a.pre[i], b.pre[i], 1e-6f);
    EXPECT_NEAR(a.post[i], b.post[i], 1e-6f);
  }
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(a.comb[i], b.comb[i], 1e-6f);
}

TEST(HcMix, RowsVariantEqualsPerTokenCallsWithAndWithoutPool) {
  const Fixture f = make_fixture(13);
  const int64_t n = 5, width = f.hc * f.d;
  const std::vector<float> X = random_values(n * width, 99, 1.0f, true);
  std::vector<HcMix> serial(n), threaded(n);
  ASSERT_TRUE(hc_mix_rows(X, n, f.weights(), f.params(), serial, nullptr).ok());
  ThreadPool pool(2);
  ASSERT_TRUE(hc_mix_rows(X, n, f.weights(), f.params(), threaded, &pool).ok());
  for (int64_t t = 0; t < n; ++t) {
    const HcMix one = hc_mix(std::span<const float>(X).subspan(t * width, width), f.weights(), f.params());
    EXPECT_EQ(serial[t].pre, one.pre);
    EXPECT_EQ(serial[t].post, one.post);
    EXPECT_EQ(serial[t].comb, one.comb);
    EXPECT_EQ(threaded[t].comb, one.comb);
  }
}

TEST(HcMix, ShapeErrorsNameTheTensor) {
  Fixture f = make_fixture(15);
  f.base.pop_back();
  const Status st = check_hc_weights(f.weights(), f.params());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("base"), std::string::npos) << st.error().message;
  std::vector<HcMix> out(1);
  EXPECT_FALSE(hc_mix_rows(f.X, 1, f.weights(), f.params(), out, nullptr).ok());
  Fixture g = make_fixture(16);
  std::vector<HcMix> out2(2);
  EXPECT_FALSE(hc_mix_rows(g.X, 2, g.weights(), g.params(), out2, nullptr).ok());  // X holds one token
}

TEST(HcCollapse, ExactWeightedSumRoundedToBf16) {
  const int64_t hc = 4, d = 3;
  // Stream k, channel c (bf16-exact values).
  const std::vector<float> X = {1.0f, -2.0f, 0.5f,   //
                                3.0f, 4.0f, -1.0f,   //
                                0.25f, 8.0f, 2.0f,   //
                                -1.0f, 1.0f, 6.0f};
  const std::vector<float> a = {0.5f, 0.25f, 2.0f, 1.0f};
  std::vector<float> out(d);
  hc_collapse(X, a, hc, d, out);
  EXPECT_EQ(out[0], 0.5f + 0.75f + 0.5f - 1.0f);
  EXPECT_EQ(out[1], -1.0f + 1.0f + 16.0f + 1.0f);
  EXPECT_EQ(out[2], 0.25f - 0.25f + 4.0f + 6.0f);

  // bf16 rounding of the fp32 sum: 1 + 2^-9 rounds to 1, 1 + 3·2^-9 rounds up to 1 + 2^-7.
  const std::vector<float> Y = {1.0f, 1.0f, std::ldexp(1.0f, -9), std::ldexp(3.0f, -9), 0, 0, 0, 0};
  const std::vector<float> ones = {1.0f, 1.0f, 0.0f, 0.0f};
  std::vector<float> r(2);
  hc_collapse(Y, ones, hc, 2, r);
  EXPECT_EQ(r[0], 1.0f);
  EXPECT_EQ(r[1], 1.0f + std::ldexp(1.0f, -7));
}

TEST(HcExpand, PostTimesOutputPlusCombMixedStreams) {
  const int64_t hc = 4, d = 2;
  const std::vector<float> X = {1, 2, 3, 4, 5, 6, 7, 8};  // stream j = {2j+1, 2j+2}
  const std::vector<float> y = {10, -20};
  HcMix m;
  m.post = {1.0f, 0.5f, 0.0f, 2.0f};
  m.comb.assign(16, 0.0f);
  // Output k takes input stream (k+1)%4 with weight 1, plus half of stream 0 for k = 2.
  for (int k = 0; k < 4; ++k) m.comb[((k + 1) % 4) * 4 + k] = 1.0f;
  m.comb[0 * 4 + 2] = 0.5f;
  std::vector<float> out(hc * d);
  hc_expand(y, X, m, hc, d, out);
  const std::vector<float> want = {10 + 3, -20 + 4,              // k=0: y + X_1
                                   5 + 5, -10 + 6,               // k=1: 0.5y + X_2
                                   0 + 7 + 0.5f, 0 + 8 + 1,      // k=2: X_3 + 0.5 X_0
                                   20 + 1, -40 + 2};             // k=3: 2y + X_0
  EXPECT_EQ(out, want);
  // In place gives the same result.
  std::vector<float> inplace = X;
  hc_expand(y, inplace, m, hc, d, inplace);
  EXPECT_EQ(inplace, want);
}

TEST(HcExpand, MatchesDoubleFormulationWithinBf16Rounding) {
  const int64_t hc = 4, d = 32;
  const std::vector<float> X = random_values(hc * d, 31, 1.0f, true);
  const std::vector<float> y = random_values(d, 32, 1.0f, true);
  const Fixture f = make_fixture(33);
  const HcMix m = hc_mix(f.X, f.weights(), f.params());
  std::vector<float> out(hc * d);
  hc_expand(y, X, m, hc, d, out);
  for (int64_t k = 0; k < hc; ++k)
    for (int64_t c = 0; c < d; ++c) {
      double ref = double(m.post[k]) * y[c];
      for (int64_t j = 0; j < hc; ++j) ref += double(m.comb[j * hc + k]) * X[j * d + c];
      EXPECT_NEAR(out[k * d + c], ref, std::fabs(ref) * std::ldexp(1.0, -8) + 1e-6) << k << "," << c;
      EXPECT_EQ(out[k * d + c], round_to_bf16(out[k * d + c]));
    }
}

}  // namespace
}  // namespace cedar
