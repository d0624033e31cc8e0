// The FP8 block-32 activation recipe (kernels.h quantize_act_fp8, core/numeric.cpp quantize_act_block32)
// as device pieces, so that every kernel that writes activation codes — quantize_act_fp8 itself, and the
// producers that write the codes of their own output (rms_norm, the mHC site norms, SwiGLU, the Engram
// gather) — computes them with the same operations and so the same bits by construction:
//   s = UE8M0 ceil pow2 of max(amax, 1e-4) / 448 (as fp32), code = e4m3_RNE_satfinite(clamp(v / s, ±448)),
//   stored as the exact f16 value of the code (the GEMV's MMA operand).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/f16_stage.h"

namespace cedar::cuda::detail {

// The scale of a block whose max |x| is `block_amax` (any order of the max: fmaxf ignores NaN).
__device__ __forceinline__ float act_block_scale(float block_amax) {
  const float amax = fmaxf(block_amax, 1e-4f);
  return ue8m0_to_float(ue8m0_ceil_pow2(amax * (1.0f / 448.0f)));
}

// 1 / s for a block scale s = ue8m0_to_float(byte), exact and branch-free: every such s is a power of
// two (2^-127 subnormal for byte 0) or NaN (byte 0xFF). v · (1/s) is then v / s bit for bit (the same
// exact value, rounded once), without the IEEE division's slow-path subroutine call in every kernel that
// writes codes.
__device__ __forceinline__ float act_scale_reciprocal(float s) {
  const uint32_t e = __float_as_uint(s) >> 23;  // s > 0 or NaN: the sign bit is clear
  uint32_t r = (254u - e) << 23;                // bytes 1..253: 2^(127 - (byte - 127)) ... as bits
  r = e == 0 ? 0x7F000000u : r;                 // byte 0 (2^-127): 2^127
  r = e == 254 ? 0x00400000u : r;               // 2^127: the subnormal 2^-127
  r = e >= 255 ? 0x7FC00000u : r;               // NaN
  return __uint_as_float(r);
}

// The code of v in a block of scale s, as its f16 bits (v / s as the CPU's division: by the exact
// reciprocal, see above).
__device__ __forceinline__ uint16_t act_code_f16(float v, float s) {
  const float q = fminf(fmaxf(v * act_scale_reciprocal(s), -448.0f), 448.0f);
  const __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
  return __nv_cvt_fp8_to_halfraw(code, __NV_E4M3).x;
}

// One 32-value block held one value per lane (lane i: value i of the block): all 32 lanes call it (a
// warp_max); the lane's code goes to codes[lane], the block's scale (lane 0) to *scale.
__device__ __forceinline__ void quantize_act_warp(float v, uint16_t* codes, float* scale, int lane) {
  const float s = act_block_scale(warp_max(fabsf(v)));
  codes[lane] = act_code_f16(v, s);
  if (lane == 0) *scale = s;
}

// ---- exact f16 staging of bf16 activations (kernels.h stage_act_f16, f16_stage.h) ------------------
// The f16 code of v in a block of exponent j = f16_stage_exponent(bits of the block's finite amax):
// (v·2^a)·2^b = v·2^−J, exact in fp32 wherever the f16 result is (f16_stage_factors), then one RNE.
__device__ __forceinline__ uint16_t f16_stage_code_of(float v, int j) {
  const F16StageFactors f = f16_stage_factors(j);
  const float scaled =
      __fmul_rn(__fmul_rn(v, __uint_as_float(f16_stage_pow2_bits(f.a))), __uint_as_float(f16_stage_pow2_bits(f.b)));
  return __half_as_ushort(__float2half_rn(scaled));
}
__device__ __forceinline__ float f16_stage_scale_of(int j) { return __uint_as_float(f16_stage_pow2_bits(j)); }

}  // namespace cedar::cuda::detail
