// Scalar number formats of the released checkpoint and the reference's quantize-dequantize (QDQ)
// recipes (../shared/spec/architecture.md §2.1, §3.1, §3.12). This is the CPU oracle that the CUDA
// kernels are checked against: every function is exact and deterministic (no dependence on the FPU
// rounding mode, no fast-math), and rounding is round-to-nearest-even unless a recipe says otherwise.
//
// Formats:
//   bf16      — upper 16 bits of an IEEE binary32 (subnormals kept), RNE on conversion.
//   fp8 e4m3  — OCP e4m3fn: bias 7, max ±448, min subnormal 2^-9, no Inf, NaN = 0x7F/0xFF.
//   ue8m0     — 8-bit biased exponent: value 2^(b-127) (b = 0 is 2^-127), 0xFF = NaN.
//   fp4 e2m1  — sign (bit 3) + 2-bit exponent + 1-bit mantissa: magnitudes {0,.5,1,1.5,2,3,4,6};
//               packed two per byte, element 2i in the low nibble, 2i+1 in the high nibble.
//
// Signed zero: conversions keep the sign of their input, so a negative value that rounds to zero
// encodes as negative zero (e4m3 0x80, e2m1 0x8) and dequantizes to -0.0f, as in the reference.
//
// Non-finite inputs:
//   f32_to_bf16   NaN -> canonical quiet NaN (sign kept: 0x7FC0 / 0xFFC0); ±Inf -> ±Inf;
//                 finite values beyond the bf16 range round to ±Inf (IEEE RNE overflow).
//   f32_to_e4m3   NaN -> 0x7F / 0xFF (sign kept); ±Inf and |x| > 448 saturate to ±448 (0x7E / 0xFE),
//                 like PTX cvt.rn.satfinite.
//   f32_to_e2m1   e2m1 has no NaN: NaN and ±Inf saturate to ±6 (code 0x7 / 0xF, sign of the input).
//   QDQ recipes   a block containing any NaN or ±Inf is poisoned: its scale byte is the scale
//                 format's NaN (ue8m0 0xFF, e4m3 0x7F), its e4m3 codes are 0x7F (its e2m1 codes 0),
//                 and every dequantized value of the block is NaN. (Torch's amax propagates NaN and
//                 an Inf amax yields Inf/Inf = NaN, so the reference loses such blocks too; poisoning
//                 makes it deterministic and impossible to miss.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/status.h"

namespace cedar {

// ---- scalar conversions -------------------------------------------------------------------
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float x);           // RNE; see the non-finite rules above
float round_to_bf16(float x);            // f32 -> bf16 -> f32

float e4m3_to_f32(uint8_t bits);         // NaN for 0x7F/0xFF
uint8_t f32_to_e4m3(float x);            // RNE incl. subnormals, saturating to ±448

float ue8m0_to_f32(uint8_t bits);        // 2^(bits-127); NaN for 0xFF
// Exponent byte of the smallest ue8m0 value >= x, i.e. of 2^ceil(log2(x)), computed bit-exactly from
// the fp32 bits (§3.1: biased exponent, +1 if the mantissa is non-zero). 0 <= x <= 2^-127 gives 0;
// x > 2^127, +Inf, NaN and x < 0 give 0xFF (NaN: no ue8m0 value is >= x).
uint8_t ue8m0_ceil_pow2(float x);

float e2m1_to_f32(uint8_t code);         // low 4 bits used
// RNE on the magnitude: thresholds 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0; ties at 0.25, 1.25, 2.5,
// 5.0 round down and ties at 0.75, 1.75, 3.5 round up (to the even code); saturates to ±6.
uint8_t f32_to_e2m1(float x);
// Element i of a packed e2m1 array (precondition: i < 2 * packed.size()).
uint8_t e2m1_get(std::span<const uint8_t> packed, size_t i);
// Sets element i (precondition: i < 2 * packed.size(); only the low 4 bits of code are used).
void e2m1_set(std::span<uint8_t> packed, size_t i, uint8_t code);

// ---- QDQ recipes (§3.1 table, §3.12 layouts) ------------------------------------------------
// Each quantizes x in place to its dequantized values and, where asked, writes the codes and scales
// exactly as the KV cache stores them. x.size() must be a multiple of the block; codes and scales are
// either empty (not wanted) or exactly the stated size; anything else is an error and leaves x as is.
//
// Arithmetic, all in fp32 as in the reference (which loads bf16 x, promotes it to fp32 and computes
// in fp32): amax = max |x| over the block; the scale comes from the clamped amax; q = code(clamp(x/s))
// with IEEE division; the result is code_value(q) * s. That product is exact in fp32 and in bf16
// (q has <= 4 significant bits, s <= 4, and it never underflows), so the reference's final bf16 store
// is a no-op and no intermediate bf16 rounding takes place; the outputs are bit-identical to what a
// packed store + dequant (the dequant_* functions below) gives back. The one exception is overflow at
// the very top of the fp32 range, reproduced as the reference's fp32 arithmetic has it: a value that
// rounds to q·s = 2^128 becomes ±Inf (FP8 recipe: |x| >= 248·2^120 ≈ 3.30e38; indexer recipe:
// |x| >= 3.5·2^126 ≈ 2.98e38).

// FP8 activation / SWA KV: blocks of 32, amax clamped at 1e-4, UE8M0 scale
// s = 2^ceil(log2(amax * fp32(1/448))), q = e4m3(clamp(x/s, ±448)).
// codes: one e4m3 byte per value; scales: one ue8m0 byte per block.
Status qdq_fp8_block32_ue8m0(std::span<float> x, std::span<uint8_t> codes = {}, std::span<uint8_t> scales = {});

// V4 main KV (SWA and compressed, nope channels only): the FP8 recipe above with blocks of `block`
// values (V4: 64); a shorter tail forms its own block (tiny models only: the reference requires
// x.size() % block == 0). No codes/scales output. block must be > 0.
void qdq_fp8_ue8m0(std::span<float> x, size_t block);

// Compressed (global) KV: blocks of 16, amax clamped at 6*2^-9, E4M3 scale s = e4m3(amax / 6),
// q = e2m1(clamp(x/s, ±6)). codes: packed e2m1 (x.size()/2 bytes); scales: one e4m3 byte per block.
Status qdq_fp4_block16_e4m3(std::span<float> x, std::span<uint8_t> codes = {}, std::span<uint8_t> scales = {});

// Indexer K/Q: blocks of 32, amax clamped at 6*2^-126, UE8M0 scale
// s = 2^ceil(log2(amax * fp32(1/6))), q = e2m1(clamp(x/s, ±6)).
// codes: packed e2m1 (x.size()/2 bytes); scales: one ue8m0 byte per block.
Status qdq_fp4_block32_ue8m0(std::span<float> x, std::span<uint8_t> codes = {}, std::span<uint8_t> scales = {});

// Dequantizes what the recipes above store: out[i] = code_value(codes[i]) * scale(block of i).
// out.size() must be a multiple of the block and match codes/scales; NaN scale bytes give NaN.
Status dequant_fp8_block32_ue8m0(std::span<const uint8_t> codes, std::span<const uint8_t> scales, std::span<float> out);
Status dequant_fp4_block16_e4m3(std::span<const uint8_t> codes, std::span<const uint8_t> scales, std::span<float> out);
Status dequant_fp4_block32_ue8m0(std::span<const uint8_t> codes, std::span<const uint8_t> scales, std::span<float> out);

// Quantizes one 32-wide activation block for an FP8 GEMM (the FP8 recipe above without the dequant):
// returns the ue8m0 scale byte and writes the e4m3 codes. The GEMM uses Σ q_a·q_w · s_a · s_w.
uint8_t quantize_act_block32(std::span<const float, 32> x, std::span<uint8_t, 32> codes);

}  // namespace cedar
