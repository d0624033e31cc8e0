// The exact f16 staging of bf16 activations for the FP8 GEMV (stage_act_f16, kernels.h): the rule, as
// integer bit functions usable from host code (tests, no CUDA headers) and device code (gemv.cu).
//
// Per 32-value block of bf16 values v with amax = max |v| over its finite values: J = e − 15, e = ⌊log2
// amax⌋, so amax·2^−J lies in [2^15, 2^16). f16 keeps 11 significant bits down to 2^−14 and subnormals
// with quantum 2^−24, and a bf16 value has at most 8: so v·2^−J is an f16 value exactly whenever
// |v·2^−J| >= 2^−17, i.e. |v| >= 2^(e−32) (everything within a factor 2^32 of the block's amax). The top
// end fits too: the largest bf16 mantissa below 2^16 is 65280 <= 65504 (f16 max). Smaller values round
// to nearest even on the f16 subnormal grid (error <= 2^(J−25) each, far below the output's bf16 ulp).
// Then e4m3(w) × f16(v·2^−J) is exact in fp32 and the FP8 GEMV's (Σ products)·s_w·2^J is the reference's
// Σ bf16(w)·v up to the fp32 summation order.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CEDAR_F16_STAGE_HD __host__ __device__
#else
#define CEDAR_F16_STAGE_HD
#endif

namespace cedar::cuda {

// J for a block whose largest finite |v| has fp32 bits `amax_bits` (sign ignored). A zero block (and a
// non-finite amax, which callers exclude) takes J = 0. Never below −149, so 2^J is an fp32 value
// (bf16 inputs have amax >= 2^−133: J >= −148).
CEDAR_F16_STAGE_HD constexpr int f16_stage_exponent(uint32_t amax_bits) {
  const uint32_t a = amax_bits & 0x7FFFFFFFu;
  if (a == 0 || a >= 0x7F800000u) return 0;
  int e = static_cast<int>(a >> 23) - 127;
  if ((a >> 23) == 0) {  // fp32 subnormal: a · 2^−149, e = position of its top bit − 149
    int top = 22;
    while (((a >> top) & 1u) == 0) --top;
    e = top - 149;
  }
  const int j = e - 15;
  return j < -149 ? -149 : j;
}

// fp32 bits of 2^e for e in [−149, 127] (subnormal below −126).
CEDAR_F16_STAGE_HD constexpr uint32_t f16_stage_pow2_bits(int e) {
  return e >= -126 ? static_cast<uint32_t>(e + 127) << 23 : 1u << (e + 149);
}

// v·2^−J is formed as (v·2^a)·2^b with both factors normal fp32 powers of two and the intermediate
// between v and the result in magnitude (so no step rounds where the result would not): a = 64 when
// −J > 127, else 0.
struct F16StageFactors {
  int a = 0, b = 0;
};
CEDAR_F16_STAGE_HD constexpr F16StageFactors f16_stage_factors(int j) {
  return -j > 127 ? F16StageFactors{64, -j - 64} : F16StageFactors{0, -j};
}

// Host reference: f16 bits of RNE(v·2^−J) for any fp32 bits v (the device gets them from two fp32
// multiplies and cvt.rn.f16.f32). NaN → a quiet NaN (sign kept), ±inf → ±inf, ±0 → ±0, overflow → ±inf.
CEDAR_F16_STAGE_HD constexpr uint16_t f16_stage_code(uint32_t v_bits, int j) {
  const auto sign = static_cast<uint16_t>((v_bits >> 16) & 0x8000u);
  const uint32_t a = v_bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);
  if (a == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (a == 0) return sign;
  // |v| = m · 2^E exactly (m < 2^24), then scaled by 2^−J.
  const uint32_t exp = a >> 23;
  const uint32_t m = exp ? ((a & 0x7FFFFFu) | 0x800000u) : a;
  const int E = (exp ? static_cast<int>(exp) - 150 : -149) - j;
  int top = 23;
  while (((m >> top) & 1u) == 0) --top;
  // f16 quantum exponent: 11 significant bits, not below the subnormal quantum 2^−24.
  int qe = top + E - 10;
  if (qe < -24) qe = -24;
  const int shift = qe - E;  // bits of m below the quantum
  uint32_t q = 0;
  if (shift <= 0) {
    q = m << -shift;  // exact (m has at most 11 bits left of the quantum here)
  } else if (shift < 26) {
    q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
  }                  // shift >= 26: |value| < 2^−25 (half the smallest subnormal): rounds to ±0
  if (q == 2048u) {  // rounding carried into the next binade
    q = 1024u;
    ++qe;
  }
  if (q >= 1024u) {  // normal: exponent field qe + 25 (qe = −24 is the smallest normal binade)
    if (qe > 5) return static_cast<uint16_t>(sign | 0x7C00u);
    return static_cast<uint16_t>(sign | (static_cast<uint32_t>(qe + 25) << 10) | (q - 1024u));
  }
  return static_cast<uint16_t>(sign | q);  // subnormal (or zero)
}

}  // namespace cedar::cuda
