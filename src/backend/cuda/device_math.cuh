// Device-side scalar helpers shared by the kernels: the bit-exact UE8M0 / bf16 conversions of
// core/numeric.h, and warp reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cedar::cuda::detail {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

// 2^(b-127); b = 0 is 2^-127 (subnormal); 0xFF is NaN.
__device__ __forceinline__ float ue8m0_to_float(uint32_t b) {
  if (b == 0) return __uint_as_float(0x00400000u);
  if (b == 0xFF) return __uint_as_float(0x7FC00000u);
  return __uint_as_float(b << 23);
}

// Weight-scale decode for the GEMV inner loop: a shift and one FMNMX (b << 23 is 2^(b-127) for b >= 1
// and 0 for b = 0, below the subnormal 2^-127 that byte 0 means). Byte 0 (2^-127) is exact; byte 0xFF
// (NaN, which no checkpoint uses) decodes to +Inf instead of NaN.
__device__ __forceinline__ float ue8m0_scale(uint32_t b) {
  return fmaxf(__uint_as_float(b << 23), __uint_as_float(0x00400000u));
}

// Exponent byte of the smallest power of two >= x (core/numeric.cpp ue8m0_ceil_pow2, bit for bit).
__device__ __forceinline__ uint32_t ue8m0_ceil_pow2(float x) {
  if (!(x >= 0.0f) || isinf(x)) return 0xFF;
  const uint32_t a = __float_as_uint(x) & 0x7FFFFFFFu;
  const uint32_t exp = a >> 23, man = a & 0x7FFFFFu;
  if (exp == 0) return man > 0x400000u ? 1u : 0u;
  const uint32_t byte = exp + (man != 0 ? 1u : 0u);
  return byte > 254 ? 0xFFu : byte;
}

// f32 → bf16 (RNE) → f32.
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

}  // namespace cedar::cuda::detail
