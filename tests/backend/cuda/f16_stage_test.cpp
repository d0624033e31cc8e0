// The exact f16 staging rule of bf16 activations (backend/cuda/f16_stage.h; the device kernel
// stage_act_f16 is checked against it in gemv_staged_cutest.cpp). Host only: runs in CI without CUDA.
// References are computed here in double with <cmath> (frexp / ldexp / nearbyint) and an f16 decoder
// written out below, not with the header's functions.
#include "backend/cuda/f16_stage.h"

#include <gtest/gtest.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"

namespace cedar::cuda {
namespace {

uint32_t bits(float v) { return std::bit_cast<uint32_t>(v); }

// IEEE binary16 bits → double (independent of f16_stage.h).
double f16_value(uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  double v = 0;
  if (exp == 0x1F) {
    v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(man), -24);
  } else {
    v = std::ldexp(static_cast<double>(man + 1024), exp - 25);
  }
  return sign ? -v : v;
}

// ⌊log2 |a|⌋ for finite a != 0 (subnormals included).
int floor_log2(double a) {
  int e = 0;
  (void)std::frexp(a, &e);  // a = f·2^e, f in [0.5, 1)
  return e - 1;
}

// RNE of y to binary16 as a double (±inf on overflow): 11 significant bits, quantum >= 2^-24.
double f16_round(double y) {
  if (y == 0 || !std::isfinite(y)) return y;
  const int q = std::max(floor_log2(std::fabs(y)) - 10, -24);
  const double r = std::ldexp(std::nearbyint(std::ldexp(y, -q)), q);
  if (std::fabs(r) > 65504.0) return std::copysign(std::numeric_limits<double>::infinity(), y);
  return r == 0 ? std::copysign(0.0, y) : r;
}

// J of a block by the documented rule, from the block's values (not from f16_stage_exponent).
int reference_exponent(const std::vector<float>& block) {
  double amax = 0;
  for (float v : block)
    if (std::isfinite(v)) amax = std::max(amax, std::fabs(static_cast<double>(v)));
  return amax == 0 ? 0 : std::max(floor_log2(amax) - 15, -149);
}

TEST(F16Stage, ExponentPutsAmaxInTheTopBinade) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  EXPECT_EQ(f16_stage_exponent(bits(0.0f)), 0);
  EXPECT_EQ(f16_stage_exponent(bits(-0.0f)), 0);
  EXPECT_EQ(f16_stage_exponent(bits(std::numeric_limits<float>::infinity())), 0);
  EXPECT_EQ(f16_stage_exponent(bits(std::numeric_limits<float>::quiet_NaN())), 0);
  int checked = 0;
  // Every binade of fp32 (normals and subnormals), at its bottom, its largest bf16 mantissa and its top.
  for (int k = -149; k <= 127; ++k) {
    for (const double m : {1.0, 1.0 + 0x1p-7, 2.0 - 0x1p-7, 2.0 - 0x1p-23}) {
      const float a = static_cast<float>(std::ldexp(m, k));
      if (a == 0 || !std::isfinite(a)) continue;
      const int want = std::max(floor_log2(a) - 15, -149);
      ASSERT_EQ(f16_stage_exponent(bits(a)), want) << "amax " << a;
      ASSERT_EQ(f16_stage_exponent(bits(-a)), want) << "amax " << -a << " (the sign is ignored)";
      if (want > -149) {
        const double scaled = std::ldexp(static_cast<double>(a), -want);
        ASSERT_GE(scaled, 32768.0) << a;
        ASSERT_LT(scaled, 65536.0) << a;
      }
      ++checked;
    }
  }
  // bf16 amax never reaches the clamp: the smallest bf16 subnormal 2^-133 gives J = -148.
  EXPECT_EQ(f16_stage_exponent(bits(0x1p-133f)), -148);
  EXPECT_EQ(f16_stage_exponent(bits(0x1p-149f)), -149);  // clamped (fp32 only)
  std::printf("F16STAGE exponent rule: %d amax values\n", checked);
}

TEST(F16Stage, PowersOfTwoAndFactorsAreExact) {
  for (int e = -149; e <= 127; ++e) ASSERT_EQ(f16_stage_pow2_bits(e), bits(std::ldexp(1.0f, e))) << "2^" << e;
  for (int j = -149; j <= 112; ++j) {  // every J a finite amax can give
    const F16StageFactors f = f16_stage_factors(j);
    ASSERT_EQ(f.a + f.b, -j) << j;
    ASSERT_TRUE(f.a >= -126 && f.a <= 127 && f.b >= -126 && f.b <= 127) << "J " << j << ": factors must be normal";
    ASSERT_TRUE(f.a == 0 || f.b > 0) << "J " << j << ": the intermediate must lie between v and the result";
  }
}

// A block of bf16 values (as floats) through the rule: every code checked against the reference.
struct BlockStats {
  int exact = 0, rounded = 0;
};
void check_block(const std::string& what, const std::vector<float>& block, BlockStats& st) {
  const int j = reference_exponent(block);
  double amax = 0;
  for (float v : block)
    if (std::isfinite(v)) amax = std::max(amax, std::fabs(static_cast<double>(v)));
  ASSERT_EQ(f16_stage_exponent(bits(static_cast<float>(amax))), j) << what;
  for (size_t i = 0; i < block.size(); ++i) {
    const float v = block[i];
    const uint16_t code = f16_stage_code(bits(v), j);
    const double got = f16_value(code);
    if (std::isnan(v)) {
      ASSERT_TRUE(std::isnan(got)) << what << " value " << i << ": NaN must stay NaN";
      continue;
    }
    if (std::isinf(v)) {
      ASSERT_EQ(got, static_cast<double>(v)) << what << " value " << i << ": inf must stay inf";
      continue;
    }
    const double y = std::ldexp(static_cast<double>(v), -j);  // exact in double
    ASSERT_TRUE(std::isfinite(got)) << what << " value " << i << " = " << v << " overflowed (J " << j << ")";
    ASSERT_EQ(std::signbit(got), std::signbit(v)) << what << " value " << i << " = " << v << ": sign";
    if (v != 0 && std::fabs(y) >= 0x1p-17) {  // the exact range: |v| >= 2^(⌊log2 amax⌋ − 32)
      ASSERT_EQ(got, y) << what << " value " << i << " = " << v << " (J " << j << ") must be staged exactly";
      ASSERT_EQ(std::ldexp(got, j), static_cast<double>(v)) << what << " value " << i;
      ++st.exact;
    } else {
      ASSERT_EQ(got, f16_round(y)) << what << " value " << i << " = " << v << " (J " << j << "): not RNE";
      ASSERT_LE(std::fabs(got - y), 0x1p-25) << what << " value " << i;
      ++st.rounded;
    }
  }
}

std::vector<float> bf16_block(std::vector<float> v) {
  for (float& x : v) x = round_to_bf16(x);
  v.resize(32, 0.0f);
  return v;
}

TEST(F16Stage, BlocksOfBf16ValuesAreStagedExactly) {
  BlockStats st;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // amax exactly a power of two, and at the largest bf16 mantissa (scaled to 65280, the top of the range).
  for (int k : {-133, -127, -126, -100, -40, -14, -1, 0, 1, 15, 16, 100, 127}) {
    const float p = std::ldexp(1.0f, k);
    check_block("amax 2^" + std::to_string(k), bf16_block({p, -p / 3, p / 7, p * 0.5f}), st);
    const float top = std::ldexp(2.0f - 0x1p-7f, k);
    if (std::isfinite(top)) check_block("amax (2-2^-7)·2^" + std::to_string(k), bf16_block({-top, top / 5}), st);
  }
  // Values 2^-30 .. 2^-40 below amax: the f16 subnormal range, exact down to 2^(e−32), rounded below.
  std::vector<float> wide = {1.5f};
  for (int d = 10; d <= 40; ++d) wide.push_back(std::ldexp(d % 2 ? -1.0f - 0x1p-7f : 1.0f + 0x3p-7f, -d));
  check_block("wide dynamic range", bf16_block(wide), st);
  // Ties on the f16 subnormal grid (amax 2^15 → J = 0: quantum 2^-24): 2^-25 (→ 0), 3·2^-25 (→ 2^-23).
  check_block("subnormal ties", bf16_block({32768.0f, 0x1p-25f, 0x3p-25f, -0x5p-25f, 0x1p-26f}), st);
  check_block("zero block", bf16_block({}), st);
  check_block("negative zeros", bf16_block({-0.0f, 0.0f, -0.0f}), st);
  check_block("bf16 subnormals", bf16_block({0x1p-133f, -0x3p-130f, 0x7Fp-133f}), st);
  check_block("large", bf16_block({3.3895314e38f, -1e38f, 2e30f, 1.0f}), st);
  check_block("inf and NaN (amax of the finite values)", bf16_block({inf, -inf, nan, 0.75f, -3.0f, 1e-9f}), st);
  check_block("only non-finite", bf16_block({inf, nan, -inf}), st);
  // Random blocks with per-block magnitudes over most of the bf16 range.
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-120, 120);
  for (int b = 0; b < 2000; ++b) {
    std::vector<float> v(32);
    const float s = std::ldexp(1.0f, ex(rng));
    for (float& x : v) x = nd(rng) * s * (rng() % 7 == 0 ? 0x1p-20f : 1.0f);
    check_block("random block " + std::to_string(b), bf16_block(v), st);
  }
  std::printf("F16STAGE bf16 blocks: %d values staged exactly, %d below the exact range rounded (RNE)\n", st.exact,
              st.rounded);
  EXPECT_GT(st.rounded, 0) << "the test never reached the rounded range";
}

TEST(F16Stage, CodeIsRoundToNearestEvenForAnyFloat) {
  // f16_stage_code is the host reference of the device's cvt.rn.f16.f32 on v·2^-J: any fp32 input.
  std::mt19937 rng(9);
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_int_distribution<int> jd(-149, 112);
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    const float v = std::bit_cast<float>(any(rng));
    if (!std::isfinite(v)) continue;
    // J near the value's own binade (the interesting range) or anywhere.
    int j = i % 2 ? jd(rng) : (v == 0 ? 0 : std::clamp(floor_log2(std::fabs(v)) - 15 + (i % 41) - 20, -149, 127));
    const double want = f16_round(std::ldexp(static_cast<double>(v), -j));
    const double got = f16_value(f16_stage_code(bits(v), j));
    ASSERT_EQ(std::signbit(got), std::signbit(want)) << v << " J " << j;
    ASSERT_EQ(got, want) << v << " J " << j;
    ++checked;
  }
  EXPECT_EQ(f16_stage_code(bits(std::numeric_limits<float>::infinity()), 3), 0x7C00);
  EXPECT_EQ(f16_stage_code(bits(-std::numeric_limits<float>::infinity()), -3), 0xFC00);
  EXPECT_TRUE(std::isnan(f16_value(f16_stage_code(bits(std::numeric_limits<float>::quiet_NaN()), 0))));
  EXPECT_EQ(f16_stage_code(bits(65520.0f), 0), 0x7C00);  // RNE overflow: 65520 rounds up to inf
  EXPECT_EQ(f16_stage_code(bits(65519.0f), 0), 0x7BFF);  // and 65519 down to 65504
  std::printf("F16STAGE RNE of random floats: %d checked\n", checked);
}

}  // namespace
}  // namespace cedar::cuda
