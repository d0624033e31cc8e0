// Reference-op checks against independent formulations (double precision, dequantize-then-multiply)
// and the spec's worked values (YaRN low/high).
#include "backend/cpu/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/numeric.h"

namespace cedar::cpu {
namespace {

std::vector<float> random_bf16(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = round_to_bf16(d(rng));
  return v;
}

TEST(CpuLinear, Bf16MatchesDoublePrecisionWithinBf16Rounding) {
  const int64_t n = 3, in = 64, out = 40;
  auto x = random_bf16(n * in, 1);
  auto wf = random_bf16(out * in, 2, 0.1f);
  std::vector<uint8_t> wb(out * in * 2);
  for (size_t i = 0; i < wf.size(); ++i) {
    const uint16_t b = f32_to_bf16(wf[i]);
    wb[2 * i] = b & 0xFF;
    wb[2 * i + 1] = b >> 8;
  }
  LinearWeight w{.format = WeightFormat::BF16, .out = out, .in = in, .data = wb.data()};
  std::vector<float> y(n * out);
  ASSERT_TRUE(linear(w, x, n, y, {}, nullptr).ok());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double ref = 0;
      for (int64_t c = 0; c < in; ++c) ref += double(x[t * in + c]) * wf[o * in + c];
      EXPECT_NEAR(y[t * out + o], ref, std::fabs(ref) * 1e-2 + 1e-4) << t << "," << o;
      EXPECT_EQ(y[t * out + o], round_to_bf16(y[t * out + o]));
    }
}

// FP8 block GEMM equals "quantize activations with the FP8 recipe, dequantize everything, multiply in
// double" — an independent formulation through the QDQ recipe of core/numeric.
TEST(CpuLinear, Fp8BlockEqualsDequantizedProduct) {
  const int64_t n = 2, in = 96, out = 70;  // out not a multiple of 32: partial scale block
  auto x = random_bf16(n * in, 3, 2.0f);
  auto wf = random_bf16(out * in, 4, 0.05f);
  const int64_t sr = (out + 31) / 32, sc = in / 32;
  std::vector<uint8_t> codes(out * in), scales(sr * sc);
  std::vector<float> wdq(out * in);
  for (int64_t br = 0; br < sr; ++br)
    for (int64_t bc = 0; bc < sc; ++bc) {
      float amax = 1e-8f;
      for (int64_t r = br * 32; r < std::min(out, br * 32 + 32); ++r)
        for (int64_t c = bc * 32; c < bc * 32 + 32; ++c) amax = std::max(amax, std::fabs(wf[r * in + c]));
      const uint8_t sb = ue8m0_ceil_pow2(amax / 448.0f);
      scales[br * sc + bc] = sb;
      for (int64_t r = br * 32; r < std::min(out, br * 32 + 32); ++r)
        for (int64_t c = bc * 32; c < bc * 32 + 32; ++c) {
          codes[r * in + c] = f32_to_e4m3(wf[r * in + c] / ue8m0_to_f32(sb));
          wdq[r * in + c] = e4m3_to_f32(codes[r * in + c]) * ue8m0_to_f32(sb);
        }
    }
  LinearWeight w{.format = WeightFormat::FP8Block, .out = out, .in = in, .data = codes.data(), .scale = scales.data()};
  std::vector<float> y(n * out);
  ASSERT_TRUE(linear(w, x, n, y, {}, nullptr).ok());
  std::vector<float> xq = x;
  ASSERT_TRUE(qdq_fp8_block32_ue8m0(xq).ok());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double ref = 0;
      for (int64_t c = 0; c < in; ++c) ref += double(xq[t * in + c]) * wdq[o * in + c];
      EXPECT_NEAR(y[t * out + o], ref, std::fabs(ref) * 8e-3 + 1e-5) << t << "," << o;
    }
}

TEST(CpuLinear, Mxfp4EqualsDequantizedProduct) {
  const int64_t n = 2, in = 64, out = 8;
  auto x = random_bf16(n * in, 5);
  std::mt19937 rng(6);
  std::vector<uint8_t> packed(out * in / 2), scales(out * in / 32);
  for (auto& b : packed) b = static_cast<uint8_t>(rng());
  for (auto& s : scales) s = static_cast<uint8_t>(120 + rng() % 8);
  LinearWeight w{.format = WeightFormat::MXFP4, .out = out, .in = in, .data = packed.data(), .scale = scales.data()};
  std::vector<float> y(n * out);
  ASSERT_TRUE(linear(w, x, n, y, {}, nullptr).ok());
  std::vector<float> xq = x;
  ASSERT_TRUE(qdq_fp8_block32_ue8m0(xq).ok());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double ref = 0;
      for (int64_t c = 0; c < in; ++c) {
        const uint8_t byte = packed[(o * in + c) / 2];
        const uint8_t code = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);  // element 2i in the low nibble
        ref += double(xq[t * in + c]) * e2m1_to_f32(code) * std::ldexp(1.0, scales[o * 2 + c / 32] - 127);
      }
      EXPECT_NEAR(y[t * out + o], ref, std::fabs(ref) * 8e-3 + 1e-6) << t << "," << o;
    }
}

TEST(CpuLinear, ShapeErrorsAreReported) {
  std::vector<uint8_t> wb(4 * 8 * 2);
  LinearWeight w{.format = WeightFormat::BF16, .out = 4, .in = 8, .data = wb.data()};
  std::vector<float> x(7), y(4);
  auto st = linear(w, x, 1, y, {}, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("input has 7 values"), std::string::npos);
}

TEST(CpuLinear, ThreadedEqualsSerialBitwise) {
  const int64_t n = 4, in = 64, out = 100;
  auto x = random_bf16(n * in, 7);
  std::vector<float> wf = random_bf16(out * in, 8, 0.1f);
  LinearWeight w{.format = WeightFormat::F32, .out = out, .in = in, .data = reinterpret_cast<const uint8_t*>(wf.data())};
  std::vector<float> y1(n * out), y2(n * out);
  ThreadPool pool(3);
  ASSERT_TRUE(linear(w, x, n, y1, {.bf16_output = false}, nullptr).ok());
  ASSERT_TRUE(linear(w, x, n, y2, {.bf16_output = false}, &pool).ok());
  EXPECT_EQ(y1, y2);
}

TEST(CpuRmsNorm, MatchesFormula) {
  auto x = random_bf16(2 * 16, 9);
  auto wt = random_bf16(16, 10);
  std::vector<float> y(32);
  rms_norm(x, 16, wt, 1e-20, y);
  for (int t = 0; t < 2; ++t) {
    double ss = 0;
    for (int c = 0; c < 16; ++c) ss += double(x[t * 16 + c]) * x[t * 16 + c];
    const double r = 1.0 / std::sqrt(ss / 16 + 1e-20);
    for (int c = 0; c < 16; ++c) EXPECT_NEAR(y[t * 16 + c], wt[c] * x[t * 16 + c] * r, std::fabs(wt[c] * x[t * 16 + c] * r) / 128 + 1e-6);
  }
}

// Spec §3.1: base 160000, factor 16, beta 32/1, original 65536 → low = 15, high = 25.
TEST(CpuRope, YarnRampMatchesSpecLowHigh) {
  RopeTable plain({.rope_dim = 64, .base = 160000.0});
  RopeTable yarn({.rope_dim = 64, .base = 160000.0, .yarn_factor = 16.0, .beta_fast = 32.0, .beta_slow = 1.0,
                  .original_max_position = 65536});
  for (int i = 0; i < 32; ++i) {
    const double f = plain.inv_freq()[i], g = yarn.inv_freq()[i];
    if (i <= 15) EXPECT_FLOAT_EQ(g, f) << i;                      // ramp 0: unchanged
    else if (i >= 25) EXPECT_FLOAT_EQ(g, f / 16.0) << i;          // ramp 1: interpolated
    else EXPECT_NEAR(g, f / 16 * ((i - 15) / 10.0) + f * (1 - (i - 15) / 10.0), f * 1e-6) << i;
    EXPECT_NEAR(f, std::pow(160000.0, -2.0 * i / 64), f * 1e-6);
  }
}

TEST(CpuRope, InverseUndoesRotationAndTouchesOnlyTail) {
  RopeTable t({.rope_dim = 8, .base = 10000.0});
  auto x = random_bf16(2 * 16, 11);
  auto y = x;
  t.apply(y, 2, 16, 37);
  for (int v = 0; v < 2; ++v)
    for (int c = 0; c < 8; ++c) EXPECT_EQ(y[v * 16 + c], x[v * 16 + c]);
  // pair (2i, 2i+1) rotated by angle pos·f_i (interleaved, GPT-J style)
  const double a = 37.0 * t.inv_freq()[1];
  EXPECT_NEAR(y[8 + 2], x[8 + 2] * std::cos(a) - x[8 + 3] * std::sin(a), 2e-2);
  t.apply(y, 2, 16, 37, /*inverse=*/true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], std::fabs(x[i]) / 64 + 1e-3);
}

}  // namespace
}  // namespace cedar::cpu
