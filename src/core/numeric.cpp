#include "core/numeric.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <limits>
#include <string>

namespace cedar {
namespace {

uint32_t bits_of(float x) { return std::bit_cast<uint32_t>(x); }
float float_of(uint32_t bits) { return std::bit_cast<float>(bits); }

constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
constexpr uint32_t kF32Inf = 0x7F800000u;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// v / 2^shift rounded to nearest, ties to even. Integer arithmetic, so independent of the FPU mode.
uint32_t shift_right_rne(uint32_t v, unsigned shift) {
  if (shift == 0) return v;
  if (shift >= 32) return 0;  // only reached with v < 2^24, below half of 2^shift
  const uint32_t q = v >> shift;
  const uint32_t rem = v & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

constexpr float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// ---- QDQ recipes as traits: scale from the (finite) block amax, per-value code, decode -------------

constexpr float kFp8Max = 448.0f;
constexpr float kFp4Max = 6.0f;
// The reference multiplies by fp32 reciprocal constants for the power-of-two scales (kernel.py
// fp8_max_inv / fp4_max_inv; §3.1 "amax·(1/448)"). For bf16 amax this equals dividing (tested).
constexpr float kInvFp8Max = 1.0f / kFp8Max;
constexpr float kInvFp4Max = 1.0f / kFp4Max;

struct Fp8Block32Ue8m0 {
  static constexpr const char* kName = "qdq_fp8_block32_ue8m0";
  static constexpr size_t kBlock = 32;
  static constexpr bool kPacked4 = false;
  static constexpr uint8_t kScaleNaN = 0xFF;
  static constexpr uint8_t kCodeNaN = 0x7F;
  static uint8_t scale_byte(float amax) { return ue8m0_ceil_pow2(std::max(amax, 1e-4f) * kInvFp8Max); }
  static float scale_value(uint8_t byte) { return ue8m0_to_f32(byte); }
  static uint8_t encode(float v) { return f32_to_e4m3(std::clamp(v, -kFp8Max, kFp8Max)); }
  static float decode(uint8_t code) { return e4m3_to_f32(code); }
};

struct Fp4Block16E4m3 {
  static constexpr const char* kName = "qdq_fp4_block16_e4m3";
  static constexpr size_t kBlock = 16;
  static constexpr bool kPacked4 = true;
  static constexpr uint8_t kScaleNaN = 0x7F;
  static constexpr uint8_t kCodeNaN = 0;  // e2m1 has no NaN; the NaN scale makes the value NaN
  // amax >= 6*2^-9 keeps the scale >= 2^-9 (the smallest e4m3 subnormal), so it is never zero.
  static uint8_t scale_byte(float amax) { return f32_to_e4m3(std::max(amax, kFp4Max * 0x1p-9f) / kFp4Max); }
  static float scale_value(uint8_t byte) { return e4m3_to_f32(byte); }
  static uint8_t encode(float v) { return f32_to_e2m1(std::clamp(v, -kFp4Max, kFp4Max)); }
  static float decode(uint8_t code) { return e2m1_to_f32(code); }
};

struct Fp4Block32Ue8m0 {
  static constexpr const char* kName = "qdq_fp4_block32_ue8m0";
  static constexpr size_t kBlock = 32;
  static constexpr bool kPacked4 = true;
  static constexpr uint8_t kScaleNaN = 0xFF;
  static constexpr uint8_t kCodeNaN = 0;
  // amax >= 6*2^-126 keeps amax/6 a normal fp32, so the scale is at least 2^-126.
  static uint8_t scale_byte(float amax) { return ue8m0_ceil_pow2(std::max(amax, kFp4Max * 0x1p-126f) * kInvFp4Max); }
  static float scale_value(uint8_t byte) { return ue8m0_to_f32(byte); }
  static uint8_t encode(float v) { return f32_to_e2m1(std::clamp(v, -kFp4Max, kFp4Max)); }
  static float decode(uint8_t code) { return e2m1_to_f32(code); }
};

template <typename R>
size_t code_bytes(size_t n_values) { return R::kPacked4 ? n_values / 2 : n_values; }

template <typename R>
Status check_sizes(const char* name, size_t n_values, size_t n_codes, size_t n_scales, bool allow_empty) {
  if (n_values % R::kBlock != 0)
    return make_error(std::string(name) + ": " + std::to_string(n_values) +
                      " values is not a multiple of the block size " + std::to_string(R::kBlock));
  const size_t want_codes = code_bytes<R>(n_values);
  if (n_codes != want_codes && !(allow_empty && n_codes == 0))
    return make_error(std::string(name) + ": codes has " + std::to_string(n_codes) + " bytes, expected " +
                      std::to_string(want_codes) +
                      (R::kPacked4 ? " (two e2m1 codes per byte)" : " (one byte per value)"));
  const size_t want_scales = n_values / R::kBlock;
  if (n_scales != want_scales && !(allow_empty && n_scales == 0))
    return make_error(std::string(name) + ": scales has " + std::to_string(n_scales) + " bytes, expected " +
                      std::to_string(want_scales) + " (one per block of " + std::to_string(R::kBlock) + ")");
  return Status::Ok();
}

template <typename R>
void store_code(std::span<uint8_t> codes, size_t i, uint8_t code) {
  if constexpr (R::kPacked4) e2m1_set(codes, i, code);
  else codes[i] = code;
}

template <typename R>
uint8_t load_code(std::span<const uint8_t> codes, size_t i) {
  if constexpr (R::kPacked4) return e2m1_get(codes, i);
  else return codes[i];
}

// Max |v| over the block; false if the block holds a NaN or an Inf (the block is then poisoned).
bool finite_amax(std::span<const float> block, float& amax) {
  amax = 0.0f;
  for (float v : block) {
    if (!std::isfinite(v)) return false;
    amax = std::max(amax, std::fabs(v));
  }
  return true;
}

template <typename R>
Status qdq(std::span<float> x, std::span<uint8_t> codes, std::span<uint8_t> scales) {
  CEDAR_RETURN_IF_ERROR(check_sizes<R>(R::kName, x.size(), codes.size(), scales.size(), /*allow_empty=*/true));
  for (size_t b = 0; b < x.size() / R::kBlock; ++b) {
    const std::span<float> block = x.subspan(b * R::kBlock, R::kBlock);
    float amax = 0.0f;
    const bool finite = finite_amax(block, amax);
    const uint8_t scale_byte = finite ? R::scale_byte(amax) : R::kScaleNaN;
    const float s = R::scale_value(scale_byte);
    for (size_t j = 0; j < R::kBlock; ++j) {
      const uint8_t code = finite ? R::encode(block[j] / s) : R::kCodeNaN;
      if (!codes.empty()) store_code<R>(codes, b * R::kBlock + j, code);
      block[j] = R::decode(code) * s;  // exact: see numeric.h
    }
    if (!scales.empty()) scales[b] = scale_byte;
  }
  return Status::Ok();
}

template <typename R>
Status dequant(std::span<const uint8_t> codes, std::span<const uint8_t> scales, std::span<float> out,
               const char* name) {
  CEDAR_RETURN_IF_ERROR(check_sizes<R>(name, out.size(), codes.size(), scales.size(), /*allow_empty=*/false));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = R::decode(load_code<R>(codes, i)) * R::scale_value(scales[i / R::kBlock]);
  return Status::Ok();
}

}  // namespace

// ---- bf16 -----------------------------------------------------------------------------------

float bf16_to_f32(uint16_t bits) { return float_of(static_cast<uint32_t>(bits) << 16); }

uint16_t f32_to_bf16(float x) {
  const uint32_t b = bits_of(x);
  if ((b & kF32AbsMask) > kF32Inf) return static_cast<uint16_t>(((b >> 16) & 0x8000u) | 0x7FC0u);
  // RNE on the low 16 bits; sign-magnitude makes this symmetric, and a carry out of the mantissa
  // correctly bumps the exponent (up to Inf for values past the bf16 range).
  return static_cast<uint16_t>(shift_right_rne(b, 16));
}

float round_to_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// ---- fp8 e4m3 -------------------------------------------------------------------------------

float e4m3_to_f32(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const uint32_t exp = (bits >> 3) & 0xFu;
  const uint32_t man = bits & 0x7u;
  if (exp == 0xF && man == 0x7) return kNaN;
  if (exp == 0) return float_of(sign | bits_of(static_cast<float>(man) * 0x1p-9f));  // subnormal: man * 2^-9
  return float_of(sign | ((exp + 120u) << 23) | (man << 20));                           // rebias 7 -> 127
}

uint8_t f32_to_e4m3(float x) {
  const uint32_t b = bits_of(x);
  const uint8_t sign = static_cast<uint8_t>((b >> 24) & 0x80u);
  const uint32_t a = b & kF32AbsMask;
  if (a > kF32Inf) return sign | 0x7F;               // NaN
  if (a >= bits_of(448.0f)) return sign | 0x7E;      // >= 448 and Inf saturate to 448
  const uint32_t exp = a >> 23;
  if (exp >= 121) {
    // |x| >= 2^-6, normal e4m3: keep 3 of 23 mantissa bits (RNE); a carry bumps the exponent.
    // (exp << 3 | man3) - (120 << 3) is the e4m3 code; a < bits(448) keeps it <= 0x7E.
    return sign | static_cast<uint8_t>(shift_right_rne(a, 20) - (120u << 3));
  }
  // |x| < 2^-6: e4m3 subnormals are multiples of 2^-9, so the code is round(|x| * 2^9); a result of
  // 8 is code 0x08 = 2^-6, the smallest normal, which is the right encoding.
  // |x| = sig * 2^(max(exp, 1) - 150), hence |x| * 2^9 = sig / 2^(141 - max(exp, 1)).
  const uint32_t sig = exp != 0 ? ((a & 0x7FFFFFu) | 0x800000u) : a;
  const unsigned shift = 141u - std::max(exp, 1u);
  return sign | static_cast<uint8_t>(shift_right_rne(sig, shift));
}

// ---- ue8m0 ----------------------------------------------------------------------------------

float ue8m0_to_f32(uint8_t bits) {
  if (bits == 0xFF) return kNaN;
  if (bits == 0) return float_of(0x00400000u);  // 2^-127 is an fp32 subnormal
  return float_of(static_cast<uint32_t>(bits) << 23);
}

uint8_t ue8m0_ceil_pow2(float x) {
  if (!(x >= 0.0f) || std::isinf(x)) return 0xFF;  // NaN, negative, +Inf
  const uint32_t a = bits_of(x) & kF32AbsMask;     // -0.0 -> +0.0
  const uint32_t exp = a >> 23;
  const uint32_t man = a & 0x7FFFFFu;
  if (exp == 0) return man > 0x400000u ? 1 : 0;    // zero / subnormal: 2^-127 (byte 0) covers x <= 2^-127
  const uint32_t byte = exp + (man != 0 ? 1u : 0u);  // §3.1: exponent, +1 if not a power of two
  return byte > 254 ? 0xFF : static_cast<uint8_t>(byte);
}

// ---- fp4 e2m1 -------------------------------------------------------------------------------

float e2m1_to_f32(uint8_t code) { return kE2m1Values[code & 0xFu]; }

uint8_t f32_to_e2m1(float x) {
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  if (std::isnan(a)) return sign | 0x7;
  // Count the thresholds passed; ">" at a tie rounds down to the even code, ">=" rounds up to it.
  const int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return sign | static_cast<uint8_t>(code);
}

uint8_t e2m1_get(std::span<const uint8_t> packed, size_t i) {
  assert(i / 2 < packed.size());
  return (i % 2 == 0) ? (packed[i / 2] & 0xFu) : (packed[i / 2] >> 4);
}

void e2m1_set(std::span<uint8_t> packed, size_t i, uint8_t code) {
  assert(i / 2 < packed.size());
  uint8_t& byte = packed[i / 2];
  byte = (i % 2 == 0) ? static_cast<uint8_t>((byte & 0xF0u) | (code & 0xFu))
                      : static_cast<uint8_t>((byte & 0x0Fu) | ((code & 0xFu) << 4));
}

// ---- QDQ ------------------------------------------------------------------------------------

Status qdq_fp8_block32_ue8m0(std::span<float> x, std::span<uint8_t> codes, std::span<uint8_t> scales) {
  return qdq<Fp8Block32Ue8m0>(x, codes, scales);
}

void qdq_fp8_ue8m0(std::span<float> x, size_t block) {
  for (size_t b0 = 0; b0 < x.size(); b0 += block) {
    const std::span<float> blk = x.subspan(b0, std::min(block, x.size() - b0));
    float amax = 0.0f;
    for (float v : blk) amax = std::max(amax, std::fabs(v));
    const float s = Fp8Block32Ue8m0::scale_value(Fp8Block32Ue8m0::scale_byte(amax));
    for (float& v : blk) v = Fp8Block32Ue8m0::decode(Fp8Block32Ue8m0::encode(v / s)) * s;
  }
}

Status qdq_fp4_block16_e4m3(std::span<float> x, std::span<uint8_t> codes, std::span<uint8_t> scales) {
  return qdq<Fp4Block16E4m3>(x, codes, scales);
}

Status qdq_fp4_block32_ue8m0(std::span<float> x, std::span<uint8_t> codes, std::span<uint8_t> scales) {
  return qdq<Fp4Block32Ue8m0>(x, codes, scales);
}

Status dequant_fp8_block32_ue8m0(std::span<const uint8_t> codes, std::span<const uint8_t> scales,
                                 std::span<float> out) {
  return dequant<Fp8Block32Ue8m0>(codes, scales, out, "dequant_fp8_block32_ue8m0");
}

Status dequant_fp4_block16_e4m3(std::span<const uint8_t> codes, std::span<const uint8_t> scales,
                                std::span<float> out) {
  return dequant<Fp4Block16E4m3>(codes, scales, out, "dequant_fp4_block16_e4m3");
}

Status dequant_fp4_block32_ue8m0(std::span<const uint8_t> codes, std::span<const uint8_t> scales,
                                 std::span<float> out) {
  return dequant<Fp4Block32Ue8m0>(codes, scales, out, "dequant_fp4_block32_ue8m0");
}

uint8_t quantize_act_block32(std::span<const float, 32> x, std::span<uint8_t, 32> codes) {
  using R = Fp8Block32Ue8m0;
  float amax = 0.0f;
  if (!finite_amax(x, amax)) {
    std::fill(codes.begin(), codes.end(), R::kCodeNaN);
    return R::kScaleNaN;
  }
  const uint8_t scale_byte = R::scale_byte(amax);
  const float s = R::scale_value(scale_byte);
  for (size_t j = 0; j < 32; ++j) codes[j] = R::encode(x[j] / s);
  return scale_byte;
}

}  // namespace cedar
