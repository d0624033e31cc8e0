// Scalar number formats of the released checkpoint and the reference's quantize-dequantize (QDQ)
// recipes (../shared/spec/architecture.md §2.1, §3.1). All conversions are exact and table-free
// where possible; rounding is round-to-nearest-even unless a recipe says otherwise.
//
// Formats:
//   bf16      — upper 16 bits of an IEEE binary32, RNE on conversion, NaN kept quiet.
//   fp8 e4m3  — OCP e4m3fn: bias 7, max ±448, no Inf, NaN = 0x7F/0xFF. Conversion saturates.
//   ue8m0     — 8-bit biased exponent: value 2^(b-127), 0xFF = NaN.
//   fp4 e2m1  — sign + 2-bit exponent + 1-bit mantissa: magnitudes {0,.5,1,1.5,2,3,4,6};
//               packed two per byte, element 2i in the low nibble.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace cedar {

// ---- scalar conversions -------------------------------------------------------------------
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float x);           // RNE; NaN -> quiet NaN
float round_to_bf16(float x);            // f32 -> bf16 -> f32

float e4m3_to_f32(uint8_t bits);         // NaN for 0x7F/0xFF
uint8_t f32_to_e4m3(float x);            // RNE, saturating to ±448; NaN -> 0x7F (sign kept)

float ue8m0_to_f32(uint8_t bits);        // 2^(bits-127); NaN for 0xFF
// Exponent byte of the power of two 2^ceil(log2(x)) for x > 0 (bit-exact, see §3.1).
uint8_t ue8m0_ceil_pow2(float x);

float e2m1_to_f32(uint8_t code);         // low 4 bits used
uint8_t f32_to_e2m1(float x);            // RNE on magnitude (ties to even code), saturating to ±6
uint8_t e2m1_get(std::span<const uint8_t> packed, size_t i);     // element i of a packed array
void e2m1_set(std::span<uint8_t> packed, size_t i, uint8_t code);

// ---- QDQ recipes (in place on fp32 values that hold bf16-exact numbers) ----------------------
// Each returns the dequantized values (exactly representable in bf16) and, where asked, the packed
// codes and scales exactly as the KV cache stores them (§3.12).

// FP8 activation / SWA KV: blocks of 32, UE8M0 scale, amax clamped at 1e-4.
// codes: one e4m3 byte per value (may be empty); scales: one ue8m0 byte per block (may be empty).
void qdq_fp8_block32_ue8m0(std::span<float> x, std::span<uint8_t> codes = {}, std::span<uint8_t> scales = {});

// Compressed (global) KV: blocks of 16, E4M3 scale = e4m3(amax/6), amax clamped at 6*2^-9.
// codes: packed e2m1 (x.size()/2 bytes); scales: one e4m3 byte per block.
void qdq_fp4_block16_e4m3(std::span<float> x, std::span<uint8_t> codes = {}, std::span<uint8_t> scales = {});

// Indexer K/Q: blocks of 32, UE8M0 scale = 2^ceil(log2(amax/6)), amax clamped at 6*2^-126.
void qdq_fp4_block32_ue8m0(std::span<float> x, std::span<uint8_t> codes = {}, std::span<uint8_t> scales = {});

// Quantizes one 32-wide activation block for an FP8 GEMM: returns the scale exponent byte and
// writes e4m3 codes. (The GEMM uses Σ q_a·q_w · s_a · s_w.)
uint8_t quantize_act_block32(std::span<const float> x, std::span<uint8_t> codes);

}  // namespace cedar
