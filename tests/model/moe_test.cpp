// MoE FFN (architecture.md §3.8, V4 hash routing §5) against the independent double-precision
// reference in moe_reference.h (own weight decoders, own bf16/e4m3 rounding, double accumulation).
#include "model/moe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "moe_reference.h"

namespace cedar {
namespace {

// ---- stored test weights (owning buffers; views are built on demand) ------------------------------

struct StoredWeight {
  WeightFormat format = WeightFormat::BF16;
  int64_t out = 0, in = 0, block = 32;
  std::vector<uint8_t> data, scale;
  cpu::LinearWeight view() const {
    return {.format = format, .out = out, .in = in, .data = data.data(),
            .scale = scale.empty() ? nullptr : scale.data(), .block_out = block, .block_in = block};
  }
};

StoredWeight bf16_weight(int64_t out, int64_t in, const std::vector<float>& values) {
  StoredWeight w{WeightFormat::BF16, out, in, 32, std::vector<uint8_t>(static_cast<size_t>(2 * out * in)), {}};
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t b = f32_to_bf16(values[i]);
    w.data[2 * i] = static_cast<uint8_t>(b & 0xFF);
    w.data[2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
  return w;
}

std::vector<float> normal_bf16(size_t n, double stddev, std::mt19937& rng) {
  std::normal_distribution<double> dist(0.0, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = round_to_bf16(static_cast<float>(dist(rng)));
  return v;
}

// Uniform random E2M1 codes (every nibble is a valid code) with scales 2^(scale_exp + {-1, 0, 1}).
StoredWeight mxfp4_weight(int64_t out, int64_t in, int scale_exp, std::mt19937& rng) {
  StoredWeight w{WeightFormat::MXFP4, out, in, 32, std::vector<uint8_t>(static_cast<size_t>(out * in / 2)),
                 std::vector<uint8_t>(static_cast<size_t>(out * in / 32))};
  for (auto& b : w.data) b = static_cast<uint8_t>(rng() & 0xFF);
  for (auto& s : w.scale) s = static_cast<uint8_t>(127 + scale_exp + static_cast<int>(rng() % 3) - 1);
  return w;
}

// E4M3 codes of N(0, 8²) values, scales 2^(scale_exp + {-1, 0, 1}) per block×block.
StoredWeight fp8_weight(int64_t out, int64_t in, int64_t block, int scale_exp, std::mt19937& rng) {
  const int64_t rows = (out + block - 1) / block, cols = (in + block - 1) / block;
  StoredWeight w{WeightFormat::FP8Block, out, in, block, std::vector<uint8_t>(static_cast<size_t>(out * in)),
                 std::vector<uint8_t>(static_cast<size_t>(rows * cols))};
  std::normal_distribution<float> dist(0.0f, 8.0f);
  for (auto& b : w.data) b = f32_to_e4m3(dist(rng));
  for (auto& s : w.scale) s = static_cast<uint8_t>(127 + scale_exp + static_cast<int>(rng() % 3) - 1);
  return w;
}

struct StoredExpert {
  StoredWeight w1, w2, w3;
  ExpertWeights view() const { return {w1.view(), w2.view(), w3.view()}; }
};

enum class Formats { Mxfp4RoutedFp8Shared, Bf16 };

struct LayerSpec {
  int64_t d = 128, inter = 64, n_experts = 16, topk = 4;
  Formats formats = Formats::Mxfp4RoutedFp8Shared;
  int64_t act_block = 32, fp8_block = 32;
  bool hash = false;  // V4 hash-routed layer: tid2eid, no bias
  // Odd 32-channel blocks of x are 2^-13 smaller and the matching MXFP4 W1/W3 scales 2^13 larger, so
  // they contribute as much as the others: with activation blocks wider than 32 they fall into the
  // e4m3 subnormal range and lose precision, so the activation block size becomes visible.
  bool wide_range = false;
  int64_t vocab = 50;
  uint32_t seed = 1;
};

struct TestLayer {
  LayerSpec spec;
  std::vector<float> gate, bias, bias_vl;
  std::vector<int64_t> tid2eid;
  std::vector<StoredExpert> experts;
  StoredExpert shared;
  MoeParams params;

  MoeWeights view() const {
    MoeWeights w{.gate = gate, .bias = bias, .bias_vl = bias_vl, .experts = {}, .shared = shared.view(),
                 .tid2eid = tid2eid};
    for (const auto& e : experts) w.experts.push_back(e.view());
    return w;
  }
  moe_ref::Layer reference() const {
    moe_ref::Layer L;
    L.router = {.gate = {gate.begin(), gate.end()}, .bias = {bias.begin(), bias.end()}, .topk = params.topk,
                .route_scale = params.route_scale, .gate_temp = params.gate_temp, .norm = params.norm_topk_prob};
    L.bias_vl.assign(bias_vl.begin(), bias_vl.end());
    for (const auto& e : experts) L.experts.push_back(moe_ref::dequantize(e.view()));
    L.shared = moe_ref::dequantize(shared.view());
    L.limit = params.swiglu_limit;
    L.act_block = params.act_block;
    return L;
  }
};

// Magnitudes: x ~ N(0, 1); W1/W3 rms ≈ 0.35 so that |g|, |u| pass the limit 10 for a few percent of
// the elements (both clamps are exercised); W2 small so the outputs stay O(1).
TestLayer make_layer(const LayerSpec& s) {
  std::mt19937 rng(s.seed);
  TestLayer L;
  L.spec = s;
  L.params = {.topk = s.topk, .route_scale = 1.5, .swiglu_limit = 10.0, .act_block = s.act_block};
  L.gate = normal_bf16(static_cast<size_t>(s.n_experts * s.d), 0.1, rng);
  if (s.hash) {
    std::uniform_int_distribution<int64_t> pick(0, s.n_experts - 1);
    L.tid2eid.resize(static_cast<size_t>(s.vocab * s.topk));
    for (auto& e : L.tid2eid) e = pick(rng);
  } else {
    for (auto& b : normal_bf16(static_cast<size_t>(s.n_experts), 0.1, rng)) L.bias.push_back(b);
    for (auto& b : normal_bf16(static_cast<size_t>(s.n_experts), 0.1, rng)) L.bias_vl.push_back(b);
  }
  const double w13 = 0.35, w2 = 0.01;
  auto expert = [&](bool shared) {
    if (s.formats == Formats::Bf16)
      return StoredExpert{bf16_weight(s.inter, s.d, normal_bf16(static_cast<size_t>(s.inter * s.d), w13, rng)),
                          bf16_weight(s.d, s.inter, normal_bf16(static_cast<size_t>(s.d * s.inter), w2, rng)),
                          bf16_weight(s.inter, s.d, normal_bf16(static_cast<size_t>(s.inter * s.d), w13, rng))};
    if (shared)  // FP8 codes have rms 8: scale 2^-5 → 0.25, 2^-10 → 0.008
      return StoredExpert{fp8_weight(s.inter, s.d, s.fp8_block, -5, rng),
                          fp8_weight(s.d, s.inter, s.fp8_block, -10, rng),
                          fp8_weight(s.inter, s.d, s.fp8_block, -5, rng)};
    // E2M1 codes have rms 2.9: scale 2^-3 → 0.37, 2^-8 → 0.011
    StoredExpert e{mxfp4_weight(s.inter, s.d, -3, rng), mxfp4_weight(s.d, s.inter, -8, rng),
                   mxfp4_weight(s.inter, s.d, -3, rng)};
    if (s.wide_range)
      for (StoredWeight* w : {&e.w1, &e.w3})
        for (size_t i = 0; i < w->scale.size(); ++i)
          if (i % static_cast<size_t>(w->in / 32) % 2 == 1) w->scale[i] = static_cast<uint8_t>(w->scale[i] + 13);
    return e;
  };
  for (int64_t e = 0; e < s.n_experts; ++e) L.experts.push_back(expert(false));
  L.shared = expert(true);
  return L;
}

std::vector<double> row(std::span<const float> x, int64_t t, int64_t d) {
  return {x.begin() + t * d, x.begin() + (t + 1) * d};
}

// A gate whose logits are exactly `logits` for the input e_0 (one-hot): row e = logits[e]·e_0.
std::vector<float> one_hot_gate(const std::vector<float>& logits, int64_t d) {
  std::vector<float> g(logits.size() * d, 0.0f);
  for (size_t e = 0; e < logits.size(); ++e) g[e * d] = logits[e];
  return g;
}

// ---- router ------------------------------------------------------------------------------------

TEST(MoeRouter, MatchesDoublePrecisionRouterIncludingImageBias) {
  LayerSpec spec{.d = 128, .n_experts = 32, .topk = 6, .seed = 11};
  const TestLayer L = make_layer(spec);
  const moe_ref::Layer ref = L.reference();
  std::mt19937 rng(12);
  const int64_t n = 16;
  const auto x = normal_bf16(static_cast<size_t>(n * spec.d), 1.0, rng);
  std::vector<uint8_t> image(n, 0);
  for (int64_t t = 0; t < n; t += 3) image[t] = 1;
  auto r = route_tokens(x, n, L.view(), L.params, {}, image, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  for (int64_t t = 0; t < n; ++t) {
    moe_ref::RouterSpec rs = ref.router;
    if (image[t]) rs.bias = ref.bias_vl;
    const moe_ref::Route want = moe_ref::route(rs, row(x, t, spec.d));
    // fp32 vs double scores differ by ~1e-6 relative: the selection is comparable only off ties.
    ASSERT_GT(want.margin, 1e-4) << "test data has a near-tie at token " << t << "; pick another seed";
    for (int64_t e = 0; e < spec.n_experts; ++e)
      EXPECT_NEAR(r->scores[t * spec.n_experts + e], want.scores[e], 1e-5 * want.scores[e]) << t << "," << e;
    for (int64_t k = 0; k < spec.topk; ++k) {
      EXPECT_EQ(r->experts[t * spec.topk + k], want.experts[k]) << t << "," << k;
      EXPECT_NEAR(r->weights[t * spec.topk + k], want.weights[k], 1e-5 * want.weights[k]) << t << "," << k;
    }
  }
}

// Scores for the one-hot input e_0 on a hand-made gate: logits are exact, so are the expectations.
struct HandRouter {
  int64_t d = 32;
  std::vector<float> gate, bias, bias_vl;
  std::vector<StoredExpert> experts;  // unused by route_tokens, present for the shape checks
  MoeWeights view() const {
    MoeWeights w{.gate = gate, .bias = bias, .bias_vl = bias_vl, .experts = {}, .shared = {}, .tid2eid = {}};
    w.experts.resize(gate.size() / d);
    return w;
  }
  std::vector<float> x(int64_t n) const {
    std::vector<float> v(static_cast<size_t>(n * d), 0.0f);
    for (int64_t t = 0; t < n; ++t) v[t * d] = 1.0f;
    return v;
  }
};

HandRouter hand_router(const std::vector<float>& logits) {
  HandRouter h;
  h.gate = one_hot_gate(logits, h.d);
  h.bias.assign(logits.size(), 0.0f);
  h.bias_vl.assign(logits.size(), 0.0f);
  return h;
}

double sqrt_softplus(double l) { return std::sqrt(l > 20 ? l : std::log1p(std::exp(l))); }

TEST(MoeRouter, BiasSteersSelectionButNotWeights) {
  HandRouter h = hand_router({3, 2.5, 2, 1.5, 1, 0.5, 0, -0.5});
  const MoeParams p{.topk = 2, .route_scale = 1.5};
  auto plain = route_tokens(h.x(1), 1, h.view(), p, {}, {}, nullptr);
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_EQ(plain->experts, (std::vector<int64_t>{0, 1}));
  h.bias[7] = 10.0f;  // lifts the weakest expert to the top of the selection
  auto steered = route_tokens(h.x(1), 1, h.view(), p, {}, {}, nullptr);
  ASSERT_TRUE(steered.ok()) << steered.error().message;
  EXPECT_EQ(steered->experts, (std::vector<int64_t>{7, 0}));
  EXPECT_EQ(steered->scores, plain->scores);  // scores are unbiased
  const double s7 = sqrt_softplus(-0.5), s0 = sqrt_softplus(3.0);
  EXPECT_NEAR(steered->weights[0], s7 / (s7 + s0) * 1.5, 1e-6);
  EXPECT_NEAR(steered->weights[1], s0 / (s7 + s0) * 1.5, 1e-6);
}

TEST(MoeRouter, RenormalisationAndRouteScale) {
  HandRouter h = hand_router({1.25, -2, 0.5, 4, -1, 2});
  MoeParams p{.topk = 3, .route_scale = 2.5};
  auto r = route_tokens(h.x(1), 1, h.view(), p, {}, {}, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->experts, (std::vector<int64_t>{3, 5, 0}));
  const double s[3] = {sqrt_softplus(4), sqrt_softplus(2), sqrt_softplus(1.25)};
  const double sum = s[0] + s[1] + s[2];
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(r->weights[k], s[k] / sum * 2.5, 1e-6) << k;
  EXPECT_NEAR(r->weights[0] + r->weights[1] + r->weights[2], 2.5, 1e-6);
  p.norm_topk_prob = false;  // raw scores × route scale
  auto raw = route_tokens(h.x(1), 1, h.view(), p, {}, {}, nullptr);
  ASSERT_TRUE(raw.ok()) << raw.error().message;
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(raw->weights[k], s[k] * 2.5, 1e-6) << k;
}

TEST(MoeRouter, ExactTiesPickTheLowerExpertIdFirst) {
  // Experts 1, 4 and 6 have identical gate rows (identical scores); only two of them fit.
  HandRouter h = hand_router({3, 2, -1, -1, 2, 0, 2, -3});
  const MoeParams p{.topk = 3, .route_scale = 1.0};
  auto r = route_tokens(h.x(2), 2, h.view(), p, {}, {}, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->experts, (std::vector<int64_t>{0, 1, 4, 0, 1, 4}));
  EXPECT_EQ(r->weights[1], r->weights[2]);
  // Ties created by the bias: equal scores plus equal biases on experts 2 and 5.
  HandRouter level = hand_router(std::vector<float>(8, 0.5f));
  level.bias[5] = level.bias[2] = 1.0f;
  auto rb = route_tokens(level.x(1), 1, level.view(), p, {}, {}, nullptr);
  ASSERT_TRUE(rb.ok()) << rb.error().message;
  EXPECT_EQ(rb->experts, (std::vector<int64_t>{2, 5, 0}));
  // All-equal scores: the first k ids in order.
  HandRouter flat = hand_router(std::vector<float>(8, 0.5f));
  auto rf = route_tokens(flat.x(1), 1, flat.view(), p, {}, {}, nullptr);
  ASSERT_TRUE(rf.ok()) << rf.error().message;
  EXPECT_EQ(rf->experts, (std::vector<int64_t>{0, 1, 2}));
}

TEST(MoeRouter, ImageTokensUseBiasVl) {
  HandRouter h = hand_router({1, 1, 1, 1, 1, 1});
  h.bias[3] = 5.0f;
  h.bias_vl[5] = 5.0f;
  const MoeParams p{.topk = 2, .route_scale = 1.0};
  const std::vector<uint8_t> image{0, 1, 0};
  auto r = route_tokens(h.x(3), 3, h.view(), p, {}, image, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->experts, (std::vector<int64_t>{3, 0, 5, 0, 3, 0}));
  for (float w : r->weights) EXPECT_FLOAT_EQ(w, 0.5f);  // equal unbiased scores
  h.bias_vl.clear();
  auto missing = route_tokens(h.x(3), 3, h.view(), p, {}, image, nullptr);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("bias_vl"), std::string::npos) << missing.error().message;
}

TEST(MoeRouter, SoftplusThresholdAndGateTemperature) {
  // softplus(v) = v above 20 (log1p(exp(100)) would overflow fp32 to inf).
  HandRouter h = hand_router({100, 0, -100, 30});
  MoeParams p{.topk = 2, .route_scale = 1.0, .norm_topk_prob = false};
  auto r = route_tokens(h.x(1), 1, h.view(), p, {}, {}, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->scores[0], 10.0f);
  EXPECT_FLOAT_EQ(r->scores[1], static_cast<float>(std::sqrt(std::log(2.0))));
  EXPECT_GE(r->scores[2], 0.0f);
  EXPECT_LT(r->scores[2], 1e-20f);
  EXPECT_FLOAT_EQ(r->scores[3], static_cast<float>(std::sqrt(30.0)));
  p.gate_temp = 4.0;  // logits / 4
  auto t = route_tokens(h.x(1), 1, h.view(), p, {}, {}, nullptr);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->scores[0], 5.0f);
  EXPECT_FLOAT_EQ(t->scores[3], static_cast<float>(sqrt_softplus(7.5)));
}

TEST(MoeRouter, V4HashRoutingTakesTid2eidRowsAndScoresThere) {
  LayerSpec spec{.d = 64, .n_experts = 16, .topk = 4, .hash = true, .vocab = 20, .seed = 21};
  TestLayer L = make_layer(spec);
  // Token 7's row lists expert 9 twice: the reference gathers (and later runs) it twice.
  L.tid2eid[7 * 4 + 0] = 9;
  L.tid2eid[7 * 4 + 2] = 9;
  std::mt19937 rng(22);
  const std::vector<int64_t> ids{3, 7, 19, 0, 7};
  const auto n = static_cast<int64_t>(ids.size());
  const auto x = normal_bf16(static_cast<size_t>(n * spec.d), 1.0, rng);
  auto r = route_tokens(x, n, L.view(), L.params, ids, {}, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const moe_ref::Layer ref = L.reference();
  for (int64_t t = 0; t < n; ++t) {
    const auto want = moe_ref::route(ref.router, row(x, t, spec.d), L.tid2eid.data() + ids[t] * 4);
    for (int64_t k = 0; k < 4; ++k) {
      EXPECT_EQ(r->experts[t * 4 + k], L.tid2eid[ids[t] * 4 + k]) << t << "," << k;
      EXPECT_NEAR(r->weights[t * 4 + k], want.weights[k], 1e-5 * want.weights[k]) << t << "," << k;
    }
  }
}

// ---- SwiGLU expert -----------------------------------------------------------------------------

// W1/W3 put chosen bf16 values g_i, u_i on the one-hot input; W2 = identity reads h back unchanged.
TEST(MoeExpert, SwigluClampsGateFromAboveAndUpOnBothSides) {
  const std::vector<float> g{-30, -12, -10.5f, -1, 0, 0.5f, 2, 5, 9.5f, 10, 10.5f, 12, 50, 5, 5, 5};
  const std::vector<float> u{1, 1, 2, -3, 4, 0.5f, -2, 40, 3, -1, 2, 1, -1, -40, 10.5f, -10.5f};
  const int64_t d = 32, inter = static_cast<int64_t>(g.size());
  std::vector<float> w1(inter * d, 0.0f), w3(inter * d, 0.0f), w2(d * inter, 0.0f);
  for (int64_t i = 0; i < inter; ++i) {
    w1[i * d] = g[i];
    w3[i * d] = u[i];
    w2[i * inter + i] = 1.0f;
  }
  const StoredExpert e{bf16_weight(inter, d, w1), bf16_weight(d, inter, w2), bf16_weight(inter, d, w3)};
  std::vector<float> x(d, 0.0f);
  x[0] = 1.0f;
  for (double limit : {10.0, 0.0})
    for (float weight : {1.0f, 0.75f}) {
      const MoeParams p{.topk = 1, .swiglu_limit = limit};
      std::vector<float> out(d);
      const std::vector<float> wt{weight};
      ASSERT_TRUE(expert_forward(e.view(), x, 1, wt, p, out, nullptr).ok());
      for (int64_t i = 0; i < inter; ++i) {
        const double want = moe_ref::swiglu(g[i], u[i], weight, limit);
        const double bf16_ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(want), 1e-30)) - 7);
        EXPECT_NEAR(out[i], want, bf16_ulp)
            << "limit " << limit << " weight " << weight << " g " << g[i] << " u " << u[i];
      }
      for (int64_t c = inter; c < d; ++c) EXPECT_EQ(out[c], 0.0f);
    }
  // Spot values with the limit: g = -30 is not clamped from below (silu(-10) would give -4.5e-4),
  // u = ±40 clamps to ±10, g = 12 and 50 clamp to 10.
  std::vector<float> out(d);
  ASSERT_TRUE(expert_forward(e.view(), x, 1, {}, {.topk = 1, .swiglu_limit = 10.0}, out, nullptr).ok());
  EXPECT_LT(std::fabs(out[0]), 1e-10);
  const double silu5 = 5.0 / (1.0 + std::exp(-5.0)), silu10 = 10.0 / (1.0 + std::exp(-10.0));
  EXPECT_NEAR(out[7], silu5 * 10, 0.25);  // bf16 step at 32..64 is 0.25
  EXPECT_NEAR(out[13], -silu5 * 10, 0.25);
  EXPECT_NEAR(out[11], silu10 * 1, 0.05);
  EXPECT_NEAR(out[12], -silu10, 0.05);
}

// ---- full forward ------------------------------------------------------------------------------

// Tolerances. The reference applies the same rounding points in double; what remains is fp32 vs
// double accumulation (~1e-6 relative), which only matters where it moves a value across a rounding
// midpoint: a bf16 GEMM output or SwiGLU value by one bf16 step (2^-8 relative), or an FP8 activation
// code of one h element by one e4m3 step (≤ 2^-3 of that element, one of the ≥ 64 similar-sized terms
// of every W2 output of its row, so ≈ 1/64 of the row rms). Hence:
//   strict: 2 bf16 steps of the value (output rounding on both sides) + 1e-5 of the row rms (fp32
//           cancellation near zero) — must hold for all but 1% of the elements (midpoint crossings
//           are rare: the observed count with these seeds is 0);
//   loose:  strict + 1/32 of the row rms (an isolated e4m3 code flip) — must hold everywhere;
//   whole output: cosine ≥ 0.9999.
// Dropping a rounding point, a clamp, the routing weight or the activation block size breaks strict
// for most elements.
void expect_matches_reference(const std::vector<float>& y, const std::vector<double>& ref, int64_t d) {
  double dot = 0, nn = 0, rr = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    dot += y[i] * ref[i];
    nn += double(y[i]) * y[i];
    rr += ref[i] * ref[i];
  }
  ASSERT_GT(rr, 0.0);
  const double cosine = dot / std::sqrt(nn * rr);
  EXPECT_GE(cosine, 0.9999);
  int64_t beyond_loose = 0, beyond_strict = 0;
  for (size_t t = 0; t < y.size() / d; ++t) {
    double ss = 0;
    for (int64_t c = 0; c < d; ++c) ss += ref[t * d + c] * ref[t * d + c];
    const double rms = std::sqrt(ss / d);
    for (int64_t c = 0; c < d; ++c) {
      const size_t i = t * d + c;
      const double err = std::fabs(y[i] - ref[i]);
      const double strict = std::ldexp(std::fabs(ref[i]), -7) + 1e-5 * rms;
      if (err > strict) ++beyond_strict;
      if (err > strict + rms / 32 && beyond_loose++ < 5)
        ADD_FAILURE() << "token " << t << " channel " << c << ": " << y[i] << " vs " << ref[i];
      EXPECT_EQ(y[i], round_to_bf16(y[i]));
    }
  }
  EXPECT_EQ(beyond_loose, 0);
  EXPECT_LE(beyond_strict, static_cast<int64_t>(y.size()) / 100) << "elements beyond 2 bf16 steps";
  ::testing::Test::RecordProperty("beyond_strict", std::to_string(beyond_strict));
  ::testing::Test::RecordProperty("cosine", std::to_string(cosine));
}

struct ForwardCase {
  TestLayer layer;
  std::vector<float> x;
  std::vector<int64_t> ids;
  std::vector<uint8_t> image;
  int64_t n = 0;
};

ForwardCase make_case(const LayerSpec& spec, int64_t n, uint32_t seed) {
  ForwardCase c{make_layer(spec), {}, {}, {}, n};
  std::mt19937 rng(seed);
  c.x = normal_bf16(static_cast<size_t>(n * spec.d), 1.0, rng);
  if (spec.wide_range)
    for (size_t i = 0; i < c.x.size(); ++i)
      if (i / 32 % 2 == 1) c.x[i] = std::ldexp(c.x[i], -13);
  std::uniform_int_distribution<int64_t> tok(0, spec.vocab - 1);
  for (int64_t t = 0; t < n; ++t) c.ids.push_back(tok(rng));
  if (!spec.hash) {
    c.image.assign(static_cast<size_t>(n), 0);
    for (int64_t t = 1; t < n; t += 4) c.image[t] = 1;
  }
  return c;
}

void check_forward_against_reference(const ForwardCase& c) {
  const int64_t d = c.layer.spec.d;
  std::vector<float> y(static_cast<size_t>(c.n * d));
  const Status st = moe_forward(c.x, c.n, c.layer.view(), c.layer.params, c.ids, c.image, y, nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  const moe_ref::Layer ref = c.layer.reference();
  std::vector<double> want;
  for (int64_t t = 0; t < c.n; ++t) {
    double margin = INFINITY;
    const int64_t* hash_row = c.layer.spec.hash ? c.layer.tid2eid.data() + c.ids[t] * c.layer.spec.topk : nullptr;
    const auto yr = moe_ref::moe_row(ref, row(c.x, t, d), !c.image.empty() && c.image[t], hash_row, &margin);
    ASSERT_GT(margin, 1e-4) << "test data has a near-tie at token " << t << "; pick another seed";
    want.insert(want.end(), yr.begin(), yr.end());
  }
  expect_matches_reference(y, want, d);
}

TEST(MoeForward, Mxfp4RoutedFp8SharedMatchesDequantizedDoubleReference) {
  check_forward_against_reference(make_case({.d = 128, .inter = 64, .n_experts = 16, .topk = 4, .seed = 31}, 24, 32));
}

TEST(MoeForward, Bf16ExpertsMatchDoubleReference) {
  check_forward_against_reference(
      make_case({.d = 64, .inter = 96, .n_experts = 8, .topk = 3, .formats = Formats::Bf16, .seed = 41}, 12, 42));
}

// V4 shapes of the numerics: activation blocks of 128, FP8 weight blocks 128×128, hash routing.
TEST(MoeForward, V4HashRoutedLayerMatchesDoubleReference) {
  check_forward_against_reference(make_case({.d = 256, .inter = 128, .n_experts = 16, .topk = 4, .act_block = 128,
                                             .fp8_block = 128, .hash = true, .wide_range = true, .vocab = 30,
                                             .seed = 51},
                                            10, 52));
}

TEST(MoeForward, V4ContentRoutedLayerWithoutVisionBias) {
  ForwardCase c = make_case({.d = 256, .inter = 128, .n_experts = 16, .topk = 6, .act_block = 128,
                             .fp8_block = 128, .seed = 61}, 8, 62);
  c.layer.bias_vl.clear();
  c.image.clear();
  check_forward_against_reference(c);
}

// A token's output is bitwise independent of the other tokens of the chunk and of threading.
TEST(MoeForward, BatchInvariantBitwise) {
  const ForwardCase c = make_case({.d = 128, .inter = 64, .n_experts = 16, .topk = 4, .seed = 71}, 20, 72);
  const int64_t d = c.layer.spec.d;
  const MoeWeights w = c.layer.view();
  std::vector<float> full(static_cast<size_t>(c.n * d));
  ASSERT_TRUE(moe_forward(c.x, c.n, w, c.layer.params, c.ids, c.image, full, nullptr).ok());
  ThreadPool pool(2);
  std::vector<float> threaded(full.size());
  ASSERT_TRUE(moe_forward(c.x, c.n, w, c.layer.params, c.ids, c.image, threaded, &pool).ok());
  EXPECT_EQ(std::memcmp(full.data(), threaded.data(), full.size() * sizeof(float)), 0);
  for (int64_t t = 0; t < c.n; ++t) {  // one token at a time
    std::vector<float> one(static_cast<size_t>(d));
    const std::vector<uint8_t> img{c.image[t]};
    const auto xt = std::span<const float>(c.x).subspan(t * d, d);
    ASSERT_TRUE(moe_forward(xt, 1, w, c.layer.params, {}, img, one, &pool).ok());
    EXPECT_EQ(std::memcmp(one.data(), full.data() + t * d, d * sizeof(float)), 0) << "token " << t;
  }
  // Reversed order, in a different company.
  std::vector<float> xr;
  std::vector<uint8_t> ir;
  for (int64_t t = c.n - 1; t >= 0; --t) {
    xr.insert(xr.end(), c.x.begin() + t * d, c.x.begin() + (t + 1) * d);
    ir.push_back(c.image[t]);
  }
  std::vector<float> rev(full.size());
  ASSERT_TRUE(moe_forward(xr, c.n, w, c.layer.params, {}, ir, rev, nullptr).ok());
  for (int64_t t = 0; t < c.n; ++t)
    EXPECT_EQ(std::memcmp(rev.data() + (c.n - 1 - t) * d, full.data() + t * d, d * sizeof(float)), 0) << "token " << t;
}

TEST(MoeForward, EmptyChunkIsFine) {
  const ForwardCase c = make_case({.d = 64, .inter = 64, .n_experts = 4, .topk = 2, .seed = 81}, 1, 82);
  std::vector<float> y;
  EXPECT_TRUE(moe_forward({}, 0, c.layer.view(), c.layer.params, {}, {}, y, nullptr).ok());
}

// ---- errors ------------------------------------------------------------------------------------

void expect_error(const Status& st, const std::string& needle) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning \"" << needle << "\"";
  EXPECT_NE(st.error().message.find(needle), std::string::npos) << st.error().message;
}

TEST(MoeForward, BadInputsAreReported) {
  ForwardCase c = make_case({.d = 64, .inter = 64, .n_experts = 4, .topk = 2, .seed = 91}, 2, 92);
  const int64_t d = 64;
  std::vector<float> y(static_cast<size_t>(2 * d));
  auto run = [&](const TestLayer& L, const MoeParams& p, std::span<const float> x, std::span<const int64_t> ids,
                 std::span<const uint8_t> img, std::span<float> out) {
    return moe_forward(x, 2, L.view(), p, ids, img, out, nullptr);
  };
  const auto short_x = std::span<const float>(c.x).first(100);
  expect_error(run(c.layer, c.layer.params, short_x, {}, c.image, y), "input has 100 values");
  expect_error(run(c.layer, c.layer.params, c.x, {}, c.image, std::span<float>(y).first(10)), "output has 10 values");
  MoeParams p = c.layer.params;
  p.topk = 5;
  expect_error(run(c.layer, p, c.x, {}, c.image, y), "topk 5");
  p = c.layer.params;
  p.scoring_func = "sigmoid";
  expect_error(run(c.layer, p, c.x, {}, c.image, y), "scoring_func");
  const std::vector<uint8_t> img3{0, 0, 0};
  expect_error(run(c.layer, c.layer.params, c.x, {}, img3, y), "is_image has 3 flags");
  TestLayer bad = c.layer;
  bad.experts[2].w2.out = 32;
  expect_error(run(bad, bad.params, c.x, {}, c.image, y), "routed expert 2");
  bad = c.layer;
  bad.bias.pop_back();
  expect_error(run(bad, bad.params, c.x, {}, c.image, y), "gate bias has 3 values");

  TestLayer hashed =
      make_layer({.d = 64, .inter = 64, .n_experts = 4, .topk = 2, .hash = true, .vocab = 5, .seed = 93});
  const std::vector<int64_t> ids{1, 5};
  expect_error(run(hashed, hashed.params, c.x, ids, {}, y), "token id 5 at position 1");
  expect_error(run(hashed, hashed.params, c.x, {}, {}, y), "one token id per token");
  hashed.tid2eid[3] = 4;
  const std::vector<int64_t> ok_ids{1, 2};
  expect_error(run(hashed, hashed.params, c.x, ok_ids, {}, y), "tid2eid[1][1] = 4");
}

}  // namespace
}  // namespace cedar
