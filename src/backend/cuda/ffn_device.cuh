// Device helpers shared by the cuda-ffn kernels: float transcendentals rounded as the CPU's libm calls
// round, the FP8 activation-quantization recipe for one value, bf16 decoding, and block reductions in
// a fixed order.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/device_math.cuh"

namespace cedar::cuda::detail {

// expf / log1pf as the CPU's std::exp(float) / std::log1p(float) return them: evaluated in double
// (CUDA's double exp / log1p are within 1 double ulp) and rounded once to fp32 — the correctly rounded
// result except when the exact value lies within ~2^-29 of a float rounding midpoint. glibc's float
// functions are correctly rounded in all but rare cases, so the two agree except in rare cases.
__device__ __forceinline__ float expf_cr(float x) { return static_cast<float>(exp(static_cast<double>(x))); }
__device__ __forceinline__ float log1pf_cr(float x) { return static_cast<float>(log1p(static_cast<double>(x))); }

// bf16 bits → fp32 (exact).
__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits) { return __uint_as_float(bits << 16); }

// e4m3 byte → fp32 (exact; via the f16 conversion).
__device__ __forceinline__ float e4m3_to_float(uint32_t byte) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte & 0xFFu), __NV_E4M3);
  return __half2float(__half(h));
}

// The FP8 activation recipe (act_quant.cuh: quantize_act_fp8, core/numeric.cpp quantize_act_block32) for one value
// of a 32-block whose max |x| is `block_amax`: returns the code's f16 bits; *scale = the block scale.
__device__ __forceinline__ uint16_t quantize_act_value(float v, float block_amax, float* scale) {
  const float s = act_block_scale(block_amax);
  *scale = s;
  return act_code_f16(v, s);
}

// Max of |v| over the 4 lanes of an aligned quad (lanes 4i..4i+3), all 32 lanes participating.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}

// Block-wide sum of one float per thread in a fixed order (warp butterflies, then the warps in index
// order): deterministic. Every thread gets the result. `scratch` holds >= 32 floats; blockDim.x % 32 == 0.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

}  // namespace cedar::cuda::detail
