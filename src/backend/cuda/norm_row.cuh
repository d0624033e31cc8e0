// One row's RMSNorm by 256 threads (norm_row): the fused input norms of the mHC sites (mhc_norm.cu,
// mhc.cu), rms_norm_kernel's arithmetic (rms_norm.cu) op for op, so every RMSNorm of the model has its bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"

namespace cedar::cuda::detail {

constexpr int kNormThreads = 256;  // threads per row (the order of the sum)
constexpr int kNormBatch = 20;     // loads in flight per thread and batch: d = 5120 in one round trip

// One row by kNormThreads threads (tid = 0..255; warp_sums: 8 floats of shared memory these threads
// own): thread t sums channels t, t + 256, ... with FMAs, warp_sum, the warps in order; the same rstd in
// every thread, as rms_norm_kernel (so the row has rms_norm's bits). x is
// read through L2 (__ldcg: other blocks wrote it). Every thread of the block calls it (barriers).
// kOnePass and dim <= 256 · kNormBatch: x and the weight loaded once (one round trip instead of two).
// kQuant: also the FP8 codes of the row (quant: codes / scales of this row) — warp tid / 32 stores
// channels c0 + 256·q + 32·(tid / 32) + lane, one aligned 32-block per warp and q (dim % 32 == 0: the
// warp's lanes agree on c < dim), quantized as quantize_act_fp8 does (act_quant.cuh).
template <bool kOnePass, bool kQuant = false>
__device__ __forceinline__ void norm_row(const float* xr, const float* weight, int64_t dim, float eps, float* yr,
                                         float* warp_sums, int tid, ActQuantOut quant = {}) {
  const bool one = kOnePass && dim <= int64_t{kNormThreads} * kNormBatch;
  float v[kNormBatch], wv[kNormBatch];
  float ss = 0.0f;
  // Loops over warp-uniform bases (c0 = base + tid): shuffles inside a loop whose trip count depends on
  // tid compile to divergence-safe collective sequences (s9: 11 k SASS lines, q_norm 17 µs for one row).
  for (int64_t base = 0; base < dim; base += int64_t{kNormThreads} * kNormBatch) {
    const int64_t c0 = base + tid;
#pragma unroll
    for (int q = 0; q < kNormBatch; ++q) {
      const int64_t c = c0 + int64_t{kNormThreads} * q;
      v[q] = c < dim ? __ldcg(xr + c) : 0.0f;
      if (kOnePass) wv[q] = one && c < dim && weight ? __ldg(weight + c) : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < kNormBatch; ++q)
      if (c0 + int64_t{kNormThreads} * q < dim) ss = fmaf(v[q], v[q], ss);
  }
  ss = detail::warp_sum(ss);
  if ((tid & 31) == 0) warp_sums[tid >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kNormThreads / 32; ++w) total += warp_sums[w];
  const float r = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  for (int64_t base = 0; base < dim; base += int64_t{kNormThreads} * kNormBatch) {
    const int64_t c0 = base + tid;
    if (!one) {
#pragma unroll
      for (int q = 0; q < kNormBatch; ++q) {
        const int64_t c = c0 + int64_t{kNormThreads} * q;
        v[q] = c < dim ? __ldcg(xr + c) : 0.0f;
        wv[q] = c < dim && weight ? __ldg(weight + c) : 0.0f;
      }
    }
#pragma unroll
    for (int q = 0; q < kNormBatch; ++q) {
      if (int64_t{kNormThreads} * q >= dim - base) break;  // no lane has channels left (uniform)
      const int64_t c = c0 + int64_t{kNormThreads} * q;
      const bool live = c < dim;  // the same in the 32 lanes of a warp where kQuant (dim % 32 == 0)
      const float x = __fmul_rn(v[q], r);
      const float out = detail::round_bf16(weight ? __fmul_rn(wv[q], x) : x);  // v = 0 past dim
      if (live) yr[c] = out;
      if constexpr (kQuant) {  // quantize_act_warp with the block at c − lane
        // The warp max outside the branch (likewise a shuffle under a condition not provably uniform).
        const float s = detail::act_block_scale(detail::warp_max(live ? fabsf(out) : 0.0f));
        if (live) {
          quant.codes[c] = detail::act_code_f16(out, s);
          if ((tid & 31) == 0) quant.scales[c >> 5] = s;
        }
      }
    }
  }
  __syncthreads();  // warp_sums is reused by the next row
}

}  // namespace cedar::cuda::detail
