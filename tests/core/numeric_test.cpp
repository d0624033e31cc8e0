// Numeric formats and QDQ recipes against values derived from the spec (architecture.md §2.1, §3.1,
// §3.12) by independent formulas (ldexp/frexp in double) and hand-computed blocks. The Python test
// tests/python/test_numeric_formats.py checks the same code against ml_dtypes on large random inputs.
#include "core/numeric.h"

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace cedar {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
float up(float x) { return std::nextafter(x, kInf); }
float down(float x) { return std::nextafter(x, -kInf); }

// Bitwise float equality (distinguishes -0.0 from 0.0; NaN equals NaN).
::testing::AssertionResult SameFloat(float a, float b) {
  if ((std::isnan(a) && std::isnan(b)) || bits(a) == bits(b)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << a << " (0x" << std::hex << bits(a) << ") != " << b << " (0x" << bits(b)
                                       << ")";
}

// ---- independent decoders (double arithmetic straight from the format definitions) ----------

double ref_e4m3(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

double ref_e2m1(uint8_t c) {
  const int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
  const double mag = e == 0 ? m * 0.5 : std::ldexp(1.0 + m / 2.0, e - 1);
  return s ? -mag : mag;
}

// ---- bf16 -----------------------------------------------------------------------------------

TEST(NumericBf16, DecodeIsUpperHalfOfF32) {
  for (uint32_t b = 0; b < 0x10000; ++b) EXPECT_EQ(bits(bf16_to_f32(static_cast<uint16_t>(b))), b << 16);
}

TEST(NumericBf16, EncodeRoundsToNearestEvenAtEveryMidpoint) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    if (((b >> 7) & 0xFF) == 0xFF) continue;  // Inf/NaN have no midpoints
    const uint16_t lo = static_cast<uint16_t>(b);
    ASSERT_EQ(f32_to_bf16(bf16_to_f32(lo)), lo);
    const float mid = std::bit_cast<float>((b << 16) | 0x8000u);  // halfway to the next magnitude
    const uint16_t even = (b & 1) ? static_cast<uint16_t>(b + 1) : lo;
    ASSERT_EQ(f32_to_bf16(mid), even) << std::hex << b;
    ASSERT_EQ(f32_to_bf16(std::bit_cast<float>((b << 16) | 0x8001u)), b + 1) << std::hex << b;
    ASSERT_EQ(f32_to_bf16(std::bit_cast<float>((b << 16) | 0x7FFFu)), b) << std::hex << b;
  }
}

TEST(NumericBf16, NonFinite) {
  EXPECT_EQ(f32_to_bf16(kNaN), 0x7FC0);
  EXPECT_EQ(f32_to_bf16(-kNaN), 0xFFC0);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7F800001u)), 0x7FC0);  // signalling NaN stays a NaN
  EXPECT_EQ(f32_to_bf16(kInf), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-kInf), 0xFF80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // past the bf16 range: RNE overflows
  EXPECT_TRUE(SameFloat(round_to_bf16(1.0f + 0x1p-8f), 1.0f));         // tie to even
  EXPECT_TRUE(SameFloat(round_to_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f));
}

// ---- fp8 e4m3 -------------------------------------------------------------------------------

TEST(NumericE4m3, AllCodesDecodeAndReencode) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const double want = ref_e4m3(code);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(e4m3_to_f32(code))) << c;
      continue;
    }
    EXPECT_TRUE(SameFloat(e4m3_to_f32(code), static_cast<float>(want))) << c;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(code)), code) << c;
  }
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x08), 0x1p-6f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_TRUE(SameFloat(e4m3_to_f32(0x80), -0.0f));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
}

TEST(NumericE4m3, TiesBetweenEveryPairOfNeighboursGoToEven) {
  // Includes the subnormal ties ((k + 1/2) * 2^-9), the subnormal/normal boundary (7.5 * 2^-9) and the
  // last pair below the maximum (416, 448).
  for (int c = 0; c < 0x7E; ++c) {
    for (uint8_t sign : {0x00, 0x80}) {
      const auto lo = static_cast<uint8_t>(sign | c), hi = static_cast<uint8_t>(sign | (c + 1));
      const float mid = static_cast<float>((ref_e4m3(lo) + ref_e4m3(hi)) / 2);  // exact in fp32
      const uint8_t even = (c % 2 == 0) ? lo : hi;
      EXPECT_EQ(f32_to_e4m3(mid), even) << "tie after code " << c;
      const float toward_hi = sign ? down(mid) : up(mid), toward_lo = sign ? up(mid) : down(mid);
      EXPECT_EQ(f32_to_e4m3(toward_hi), hi) << c;
      EXPECT_EQ(f32_to_e4m3(toward_lo), lo) << c;
    }
  }
  EXPECT_EQ(f32_to_e4m3(0.5f * 0x1p-9f), 0x00);  // 0 and 2^-9: tie to 0
  EXPECT_EQ(f32_to_e4m3(1.5f * 0x1p-9f), 0x02);
  EXPECT_EQ(f32_to_e4m3(7.5f * 0x1p-9f), 0x08);  // rounds up into the smallest normal
  EXPECT_EQ(f32_to_e4m3(432.0f), 0x7E);          // tie between 416 (odd mantissa) and 448
  EXPECT_EQ(f32_to_e4m3(-432.0f), 0xFE);
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);
  EXPECT_EQ(f32_to_e4m3(up(0x1p-10f)), 0x01);
  EXPECT_EQ(f32_to_e4m3(-1e-30f), 0x80);  // sign kept when rounding to zero
  EXPECT_EQ(f32_to_e4m3(std::bit_cast<float>(1u)), 0x00);  // fp32 subnormal input
}

TEST(NumericE4m3, SaturatesAndKeepsNaN) {
  for (float v : {448.0f, up(448.0f), 463.99f, 464.0f, 465.0f, 480.0f, 1e6f, std::numeric_limits<float>::max(), kInf}) {
    EXPECT_EQ(f32_to_e4m3(v), 0x7E) << v;
    EXPECT_EQ(f32_to_e4m3(-v), 0xFE) << v;
  }
  EXPECT_EQ(f32_to_e4m3(kNaN), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-kNaN), 0xFF);
}

// ---- ue8m0 ----------------------------------------------------------------------------------

TEST(NumericUe8m0, AllCodesDecode) {
  for (int b = 0; b < 255; ++b)
    EXPECT_TRUE(SameFloat(ue8m0_to_f32(static_cast<uint8_t>(b)), static_cast<float>(std::ldexp(1.0, b - 127)))) << b;
  EXPECT_TRUE(std::isnan(ue8m0_to_f32(0xFF)));
  EXPECT_EQ(ue8m0_to_f32(127), 1.0f);
}

TEST(NumericUe8m0, CeilPow2AtEveryPowerOfTwo) {
  for (int b = 0; b < 255; ++b) {
    const float p = ue8m0_to_f32(static_cast<uint8_t>(b));
    EXPECT_EQ(ue8m0_ceil_pow2(p), b);
    EXPECT_EQ(ue8m0_ceil_pow2(down(p)), b) << b;
    EXPECT_EQ(ue8m0_ceil_pow2(up(p)), b == 254 ? 0xFF : b + 1) << b;
  }
}

TEST(NumericUe8m0, CeilPow2MatchesFrexpOnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any_bits(0x00800000u, 0x7F000000u);  // normal, <= 2^127
  for (int i = 0; i < 100000; ++i) {
    const float x = std::bit_cast<float>(any_bits(rng));
    int e = 0;
    const double m = std::frexp(static_cast<double>(x), &e);  // x = m * 2^e, m in [0.5, 1)
    const int ceil_log2 = (m == 0.5) ? e - 1 : e;
    ASSERT_EQ(ue8m0_ceil_pow2(x), ceil_log2 + 127) << x;
  }
}

TEST(NumericUe8m0, CeilPow2Edges) {
  EXPECT_EQ(ue8m0_ceil_pow2(0.0f), 0);
  EXPECT_EQ(ue8m0_ceil_pow2(-0.0f), 0);
  EXPECT_EQ(ue8m0_ceil_pow2(std::bit_cast<float>(1u)), 0);          // smallest subnormal
  EXPECT_EQ(ue8m0_ceil_pow2(std::bit_cast<float>(0x00400001u)), 1);  // just above 2^-127
  EXPECT_EQ(ue8m0_ceil_pow2(0x1p127f), 254);
  EXPECT_EQ(ue8m0_ceil_pow2(std::numeric_limits<float>::max()), 0xFF);
  EXPECT_EQ(ue8m0_ceil_pow2(kInf), 0xFF);
  EXPECT_EQ(ue8m0_ceil_pow2(kNaN), 0xFF);
  EXPECT_EQ(ue8m0_ceil_pow2(-1.0f), 0xFF);
  EXPECT_EQ(ue8m0_ceil_pow2(3.0f), 129);
  EXPECT_EQ(ue8m0_ceil_pow2(0.75f), 127);
}

// ---- fp4 e2m1 -------------------------------------------------------------------------------

TEST(NumericE2m1, AllCodesDecodeAndReencode) {
  const std::array<float, 8> magnitudes = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};  // §2.1
  for (int c = 0; c < 16; ++c) {
    const auto code = static_cast<uint8_t>(c);
    EXPECT_TRUE(SameFloat(e2m1_to_f32(code), static_cast<float>(ref_e2m1(code)))) << c;
    EXPECT_EQ(std::fabs(e2m1_to_f32(code)), magnitudes[c & 7]) << c;
    EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(code)), code) << c;
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(0xF0 | c)), e2m1_to_f32(code));  // high bits ignored
  }
}

TEST(NumericE2m1, EveryTieFollowsTheSpecRule) {
  // §3.1: ties at 0.25, 1.25, 2.5, 5.0 round down; at 0.75, 1.75, 3.5 round up (to the even code).
  struct Tie { float at; uint8_t below, above, tie; };
  const Tie ties[] = {{0.25f, 0, 1, 0}, {0.75f, 1, 2, 2}, {1.25f, 2, 3, 2}, {1.75f, 3, 4, 4},
                      {2.5f, 4, 5, 4},  {3.5f, 5, 6, 6},  {5.0f, 6, 7, 6}};
  for (const Tie& t : ties) {
    EXPECT_EQ(f32_to_e2m1(t.at), t.tie) << t.at;
    EXPECT_EQ(f32_to_e2m1(down(t.at)), t.below) << t.at;
    EXPECT_EQ(f32_to_e2m1(up(t.at)), t.above) << t.at;
    EXPECT_EQ(f32_to_e2m1(-t.at), t.tie | 0x8) << t.at;
    EXPECT_EQ(f32_to_e2m1(-down(t.at)), t.below | 0x8) << t.at;
    EXPECT_EQ(f32_to_e2m1(-up(t.at)), t.above | 0x8) << t.at;
  }
}

TEST(NumericE2m1, SaturatesAndHandlesNonFinite) {
  for (float v : {6.0f, up(6.0f), 7.0f, 1e30f, kInf}) {
    EXPECT_EQ(f32_to_e2m1(v), 0x7) << v;
    EXPECT_EQ(f32_to_e2m1(-v), 0xF) << v;
  }
  EXPECT_EQ(f32_to_e2m1(kNaN), 0x7);
  EXPECT_EQ(f32_to_e2m1(-kNaN), 0xF);
  EXPECT_EQ(f32_to_e2m1(-0.1f), 0x8);  // negative zero
  EXPECT_EQ(f32_to_e2m1(0.1f), 0x0);
}

TEST(NumericE2m1, PackingPutsEvenElementsInTheLowNibble) {
  std::vector<uint8_t> packed(3, 0xAA);
  const uint8_t codes[6] = {0x1, 0x2, 0x3, 0x4, 0xF, 0x0};
  for (size_t i = 0; i < 6; ++i) e2m1_set(packed, i, codes[i]);
  EXPECT_EQ(packed, (std::vector<uint8_t>{0x21, 0x43, 0x0F}));
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(e2m1_get(packed, i), codes[i]);
  e2m1_set(packed, 1, 0x7);  // rewriting one nibble leaves its neighbour alone
  EXPECT_EQ(packed[0], 0x71);
}

// ---- QDQ recipes on hand-built blocks --------------------------------------------------------

struct Qdq {
  std::vector<float> values;
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales;
};

Qdq run_fp8(std::vector<float> x) {
  Qdq r{x, std::vector<uint8_t>(x.size()), std::vector<uint8_t>(x.size() / 32)};
  EXPECT_TRUE(qdq_fp8_block32_ue8m0(r.values, r.codes, r.scales).ok());
  return r;
}
Qdq run_fp4_e4m3(std::vector<float> x) {
  Qdq r{x, std::vector<uint8_t>(x.size() / 2), std::vector<uint8_t>(x.size() / 16)};
  EXPECT_TRUE(qdq_fp4_block16_e4m3(r.values, r.codes, r.scales).ok());
  return r;
}
Qdq run_fp4_ue8m0(std::vector<float> x) {
  Qdq r{x, std::vector<uint8_t>(x.size() / 2), std::vector<uint8_t>(x.size() / 32)};
  EXPECT_TRUE(qdq_fp4_block32_ue8m0(r.values, r.codes, r.scales).ok());
  return r;
}

// A block of n zeros with the given leading values.
std::vector<float> block(size_t n, std::initializer_list<float> head) {
  std::vector<float> x(n, 0.0f);
  std::copy(head.begin(), head.end(), x.begin());
  return x;
}

void expect_values(const Qdq& r, std::initializer_list<float> want) {
  size_t i = 0;
  for (float w : want) {
    EXPECT_TRUE(SameFloat(r.values[i], w)) << "element " << i;
    ++i;
  }
}

TEST(NumericQdqFp8, AllZeroBlockUsesTheAmaxClamp) {
  const Qdq r = run_fp8(std::vector<float>(32, 0.0f));
  // 1e-4 / 448 = 2.23e-7 lies in (2^-23, 2^-22], so s = 2^-22: byte 127 - 22.
  EXPECT_EQ(r.scales[0], 105);
  for (float v : r.values) EXPECT_TRUE(SameFloat(v, 0.0f));
  for (uint8_t c : r.codes) EXPECT_EQ(c, 0);
}

TEST(NumericQdqFp8, AmaxNearTheClamp) {
  const float x = round_to_bf16(1e-4f);  // 1.640625 * 2^-14, just above the clamp
  Qdq r = run_fp8(block(32, {x, -x / 2}));
  EXPECT_EQ(r.scales[0], 105);
  // x / 2^-22 = 420 -> 416 (spacing 32 in [256, 512)); -210 -> -208 (spacing 16).
  EXPECT_EQ(r.codes[0], 0x7D);
  expect_values(r, {416.0f * 0x1p-22f, -208.0f * 0x1p-22f});
  r = run_fp8(block(32, {x / 2}));  // below the clamp: same scale, 210 -> 208
  EXPECT_EQ(r.scales[0], 105);
  expect_values(r, {208.0f * 0x1p-22f});
}

TEST(NumericQdqFp8, MixedSignsWithUnitScale) {
  const Qdq r = run_fp8(block(32, {-448.0f, 3.0f, 0.30078125f, -0.0009765625f, 0.0001f, -0.0001f, 0.00146484375f}));
  EXPECT_EQ(r.scales[0], 127);  // 448 / 448 = 1 exactly
  // 0.30078125 = 9.625 * 2^-5 -> 10 * 2^-5; -2^-10 is a tie between 0 and 2^-9 -> -0; 1e-4 -> 0;
  // 0.00146484375 = 0.75 * 2^-9 -> 2^-9.
  expect_values(r, {-448.0f, 3.0f, 0.3125f, -0.0f, 0.0f, -0.0f, 0x1p-9f});
  EXPECT_EQ(r.codes[0], 0xFE);
  EXPECT_EQ(r.codes[3], 0x80);
  EXPECT_EQ(r.codes[5], 0x80);
}

TEST(NumericQdqFp8, NonPowerOfTwoRatioRoundsTheScaleUp) {
  const Qdq r = run_fp8(block(32, {500.0f, -250.0f}));
  EXPECT_EQ(r.scales[0], 128);  // 500/448 = 1.116 -> s = 2
  // 500/2 = 250 -> 256 (spacing 16 in [128, 256)); -250/2 = -125 -> -128 (spacing 8 in [64, 128)).
  expect_values(r, {512.0f, -256.0f});
}

TEST(NumericQdqFp4E4m3, AllZeroBlockUsesTheAmaxClamp) {
  const Qdq r = run_fp4_e4m3(std::vector<float>(16, 0.0f));
  EXPECT_EQ(r.scales[0], 0x01);  // (6 * 2^-9) / 6 = 2^-9, the smallest e4m3 subnormal
  for (float v : r.values) EXPECT_TRUE(SameFloat(v, 0.0f));
  for (uint8_t c : r.codes) EXPECT_EQ(c, 0);
}

TEST(NumericQdqFp4E4m3, AmaxAtTheClamp) {
  const float amax = 6.0f * 0x1p-9f;
  const Qdq r = run_fp4_e4m3(block(16, {amax, -amax / 4, amax / 24}));
  EXPECT_EQ(r.scales[0], 0x01);
  // x/s = 6, -1.5, 0.25 (tie -> 0).
  expect_values(r, {amax, -1.5f * 0x1p-9f, 0.0f});
  EXPECT_EQ(r.codes[0], 0xB7);  // element 0 = 0x7 (low nibble), element 1 = -1.5 = 0xB (high nibble)
}

TEST(NumericQdqFp4E4m3, EveryTieWithUnitScale) {
  const Qdq r =
      run_fp4_e4m3(block(16, {6.0f, -6.0f, 0.25f, -0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -5.0f, 0.3f, -0.25f}));
  EXPECT_EQ(r.scales[0], 0x38);  // 6/6 = 1
  expect_values(r, {6.0f, -6.0f, 0.0f, -1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, -4.0f, 0.5f, -0.0f});
}

TEST(NumericQdqFp4E4m3, NonPowerOfTwoScaleWithExactTies) {
  // amax 7: 7/6 = 1.1667 -> e4m3 1.125 (spacing 0.125). 2.8125 / 1.125 = 2.5 and 3.9375 / 1.125 = 3.5
  // exactly: ties that the IEEE division must reproduce exactly.
  Qdq r = run_fp4_e4m3(block(16, {7.0f, 2.8125f, 3.9375f, -2.8125f, 1.40625f}));
  EXPECT_EQ(r.scales[0], 0x39);
  // 7/1.125 = 6.22 -> clamp 6; 2.5 -> 2; 3.5 -> 4; 1.40625/1.125 = 1.25 -> 1.
  expect_values(r, {6.75f, 2.25f, 4.5f, -2.25f, 1.125f});
  // amax 5.625: s = 0.9375 exactly. 2.34375 * fp32(1/s) would give 2.5000002 (-> 3), IEEE division
  // gives the tie 2.5 (-> 2); likewise 1.171875 / s = 1.25 (-> 1).
  r = run_fp4_e4m3(block(16, {5.625f, 2.34375f, -1.171875f}));
  EXPECT_EQ(r.scales[0], 0x37);
  expect_values(r, {5.625f, 1.875f, -0.9375f});
}

TEST(NumericQdqFp4E4m3, ScaleSaturatesAt448) {
  const Qdq r = run_fp4_e4m3(block(16, {6000.0f, -1000.0f}));
  EXPECT_EQ(r.scales[0], 0x7E);
  expect_values(r, {2688.0f, -896.0f});  // 6000/448 = 13.4 -> 6; -1000/448 = -2.23 -> -2
}

TEST(NumericQdqFp4Ue8m0, AllZeroAndTinyBlocksUseTheAmaxClamp) {
  Qdq r = run_fp4_ue8m0(std::vector<float>(32, 0.0f));
  EXPECT_EQ(r.scales[0], 1);  // (6 * 2^-126) * fp32(1/6) rounds to 2^-126
  for (float v : r.values) EXPECT_TRUE(SameFloat(v, 0.0f));
  r = run_fp4_ue8m0(block(32, {0x1p-130f, -0x1p-125f}));
  EXPECT_EQ(r.scales[0], 1);
  expect_values(r, {0.0f, -0x1p-125f});  // 2^-4 -> 0; -2 -> -2
}

TEST(NumericQdqFp4Ue8m0, MixedSignsAndTies) {
  Qdq r = run_fp4_ue8m0(block(32, {6.0f, -0.75f, 1.25f, 3.5f, -5.0f}));
  EXPECT_EQ(r.scales[0], 127);  // 6 * fp32(1/6) rounds to exactly 1
  expect_values(r, {6.0f, -1.0f, 1.0f, 4.0f, -4.0f});
  r = run_fp4_ue8m0(block(32, {7.0f, 5.0f, -0.5f, 2.5f}));
  EXPECT_EQ(r.scales[0], 128);  // 7/6 -> s = 2
  // 3.5 -> 4; 2.5 -> 2; -0.25 -> -0; 1.25 -> 1.
  expect_values(r, {8.0f, 4.0f, -0.0f, 2.0f});
  EXPECT_EQ(r.codes[0], 0x46);  // element 0: 3.5 -> code 6 (low nibble); element 1: 2.5 -> code 4
}

TEST(NumericQdq, OverflowAtTheTopOfTheFp32RangeGivesInf) {
  // Documented in numeric.h: q·s rounds to 2^128, as in the reference's fp32 arithmetic.
  Qdq r = run_fp4_ue8m0(block(32, {3.0e38f, -2.9e38f}));
  EXPECT_EQ(r.scales[0], 253);  // 3e38 * fp32(1/6) = 5e37 -> 2^126
  expect_values(r, {kInf, -3.0f * 0x1p126f});  // 3e38 / 2^126 = 3.53 -> 4 -> 2^128; -2.9e38 -> -3.41 -> -3
  r = run_fp8(block(32, {3.3e38f, 3.2e38f}));
  EXPECT_EQ(r.scales[0], 247);  // 3.3e38 / 448 -> 2^120
  expect_values(r, {kInf, 240.0f * 0x1p120f});  // 3.2e38 / 2^120 = 240.7 -> 240
}

TEST(NumericQdq, NonFiniteInputPoisonsOnlyItsBlock) {
  for (float bad : {kNaN, kInf, -kInf}) {
    std::vector<float> x(64, 1.0f);
    x[40] = bad;
    Qdq r = run_fp8(x);
    EXPECT_EQ(r.scales[0], 119);  // 1/448 -> 2^-8
    EXPECT_EQ(r.scales[1], 0xFF);
    for (size_t i = 32; i < 64; ++i) {
      EXPECT_TRUE(std::isnan(r.values[i])) << i;
      EXPECT_EQ(r.codes[i], 0x7F);
    }
    EXPECT_EQ(r.values[0], 1.0f);

    r = run_fp4_e4m3(x);
    EXPECT_EQ(r.scales[2], 0x7F);
    for (size_t i = 32; i < 48; ++i) EXPECT_TRUE(std::isnan(r.values[i])) << i;
    // Neighbouring blocks are unaffected: s = e4m3(1/6) = 0.171875, 1/s = 5.8 -> 6, 6 * s = 1.03125.
    EXPECT_EQ(r.values[48], 1.03125f);
    EXPECT_EQ(r.values[31], 1.03125f);

    r = run_fp4_ue8m0(x);
    EXPECT_EQ(r.scales[0], 125);  // 1/6 -> 2^-2
    EXPECT_EQ(r.scales[1], 0xFF);
    for (size_t i = 32; i < 64; ++i) EXPECT_TRUE(std::isnan(r.values[i])) << i;
    EXPECT_EQ(r.values[0], 1.0f);
  }
  std::array<float, 32> act{};
  act[3] = kNaN;
  std::array<uint8_t, 32> codes{};
  EXPECT_EQ(quantize_act_block32(act, codes), 0xFF);
  EXPECT_EQ(codes[0], 0x7F);
}

TEST(NumericQdq, RejectsBadSizesAndLeavesInputAlone) {
  std::vector<float> x(33, 1.5f);
  Status s = qdq_fp8_block32_ue8m0(x);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("multiple of the block size 32"), std::string::npos) << s.error().message;
  EXPECT_EQ(x[0], 1.5f);

  std::vector<float> y(32, 1.7f);
  std::vector<uint8_t> codes(15), scales(1);
  s = qdq_fp4_block32_ue8m0(y, codes, scales);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("codes has 15 bytes, expected 16"), std::string::npos) << s.error().message;
  EXPECT_EQ(y[0], 1.7f);

  std::vector<uint8_t> codes16(8), scales3(3);
  std::vector<float> z(16, 1.0f);
  s = qdq_fp4_block16_e4m3(z, codes16, scales3);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("scales has 3 bytes, expected 1"), std::string::npos) << s.error().message;

  std::vector<float> out(32);
  EXPECT_FALSE(dequant_fp8_block32_ue8m0(std::vector<uint8_t>(32), {}, out).ok());  // scales required
}

// ---- random blocks: packed store + dequant reproduces QDQ; outputs are bf16-exact -------------

std::vector<float> random_bf16_blocks(size_t n, size_t block_size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-40, 40);
  std::vector<float> x(n);
  for (size_t b = 0; b < n / block_size; ++b) {
    const float scale = std::ldexp(1.0f, exponent(rng));  // a different magnitude per block
    for (size_t j = 0; j < block_size; ++j) x[b * block_size + j] = round_to_bf16(normal(rng) * scale);
  }
  return x;
}

TEST(NumericQdq, PackedCodesAndScalesDequantizeToTheQdqValues) {
  const size_t n = 4096;
  {
    const Qdq r = run_fp8(random_bf16_blocks(n, 32, 1));
    std::vector<float> back(n);
    ASSERT_TRUE(dequant_fp8_block32_ue8m0(r.codes, r.scales, back).ok());
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(SameFloat(back[i], r.values[i])) << i;
    for (float v : r.values) ASSERT_TRUE(SameFloat(round_to_bf16(v), v));
  }
  {
    const Qdq r = run_fp4_e4m3(random_bf16_blocks(n, 16, 2));
    std::vector<float> back(n);
    ASSERT_TRUE(dequant_fp4_block16_e4m3(r.codes, r.scales, back).ok());
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(SameFloat(back[i], r.values[i])) << i;
    for (float v : r.values) ASSERT_TRUE(SameFloat(round_to_bf16(v), v));
  }
  {
    const Qdq r = run_fp4_ue8m0(random_bf16_blocks(n, 32, 3));
    std::vector<float> back(n);
    ASSERT_TRUE(dequant_fp4_block32_ue8m0(r.codes, r.scales, back).ok());
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(SameFloat(back[i], r.values[i])) << i;
    for (float v : r.values) ASSERT_TRUE(SameFloat(round_to_bf16(v), v));
  }
}

TEST(NumericQdq, QdqValuesAreIdempotent) {
  // Dequantized values lie on the grid of their scale, so a second pass keeps every value (the codes
  // may differ: an amax that rounds down to exactly 224 * s halves the next scale).
  for (uint32_t seed : {4u, 5u}) {
    const Qdq a = run_fp8(random_bf16_blocks(1024, 32, seed));
    const Qdq b = run_fp8(a.values);
    for (size_t i = 0; i < a.values.size(); ++i) ASSERT_TRUE(SameFloat(a.values[i], b.values[i])) << i;
    const Qdq c = run_fp4_ue8m0(random_bf16_blocks(1024, 32, seed));
    const Qdq d = run_fp4_ue8m0(c.values);
    for (size_t i = 0; i < c.values.size(); ++i) ASSERT_TRUE(SameFloat(c.values[i], d.values[i])) << i;
  }
}

TEST(NumericQdq, ActBlockQuantizerMatchesTheFp8Recipe) {
  const std::vector<float> x = random_bf16_blocks(32 * 64, 32, 6);
  const Qdq r = run_fp8(x);
  for (size_t b = 0; b < 64; ++b) {
    std::array<uint8_t, 32> codes{};
    const uint8_t scale = quantize_act_block32(std::span<const float>(x).subspan(b * 32).first<32>(), codes);
    EXPECT_EQ(scale, r.scales[b]);
    for (size_t j = 0; j < 32; ++j) ASSERT_EQ(codes[j], r.codes[b * 32 + j]);
  }
}

// The recipes multiply by fp32(1/448) and fp32(1/6) for the power-of-two scales (as the reference
// kernel does) and divide by 6 for the e4m3 scale (as the spec writes it). For every positive finite
// bf16 amax the other choice gives the same scale, so the choice cannot cause a mismatch.
TEST(NumericQdq, ReciprocalAndDivisionAgreeForEveryBf16Amax) {
  for (uint32_t b = 1; b < 0x7F80; ++b) {
    const float amax = bf16_to_f32(static_cast<uint16_t>(b));
    ASSERT_EQ(ue8m0_ceil_pow2(amax * (1.0f / 448.0f)), ue8m0_ceil_pow2(amax / 448.0f)) << amax;
    ASSERT_EQ(ue8m0_ceil_pow2(amax * (1.0f / 6.0f)), ue8m0_ceil_pow2(amax / 6.0f)) << amax;
    ASSERT_EQ(f32_to_e4m3(amax * (1.0f / 6.0f)), f32_to_e4m3(amax / 6.0f)) << amax;
  }
  // The fp32 constants are those a Python double 1/448 becomes when narrowed to fp32.
  EXPECT_EQ(1.0f / 448.0f, static_cast<float>(1.0 / 448.0));
  EXPECT_EQ(1.0f / 6.0f, static_cast<float>(1.0 / 6.0));
}

}  // namespace
}  // namespace cedar
