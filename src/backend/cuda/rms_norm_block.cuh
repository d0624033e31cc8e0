// rms_norm_kernel's row (rms_norm.cu): one row of y = bf16(weight ⊙ (x · rstd)) by a block of 256 threads,
// also used by kernels that run it beside other work in one launch (rope_swa.cu: q_norm with the SWA KV
// encode). Include from .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda::detail {

constexpr int kRmsNormThreads = 256;
constexpr int kRmsNormBatch = 20;  // loads in flight per thread: 5120 channels in one round trip
// Rows up to this long keep x and the weight in shared memory.
constexpr int64_t kRmsNormStaged = int64_t{kRmsNormThreads} * kRmsNormBatch;

// Row `row` by the block's kRmsNormThreads threads. Pass 1 loads x and the weight in batches of 20 per
// thread (one round trip for a 5120 row) and sums the squares as rms_norm always has (thread t: channels t, t + 256, ... by FMAs;
// warp_sum; the warps in order), keeping both in shared memory; pass 2 writes the scaled, weighted,
// bf16-rounded output (kQuant: and its FP8 codes, quantize_act_fp8's ops) in a rolled loop over
// warp-uniform bases. Rolled on purpose: the kernel runs once per layer with cold instruction caches,
// and pass 2 unrolled 20 times (norm_row) made q_norm's kernel 8.5 k SASS instructions and 11-17 µs
// instead of ~8.5 µs (s9 runs 3-4); a shuffle under a lane-dependent loop bound would compile to
// divergence-safe collective code. (The first version loaded x, then x and the weight again, one
// dependent round trip per 256 channels.) Rows past kRmsNormStaged reload x and the weight in pass 2.
template <bool kQuant>
__device__ __forceinline__ void rms_norm_block(const float* x, int64_t dim, const float* weight, float eps, float* y,
                                               uint16_t* codes, float* scales, int64_t row) {
  __shared__ float warp_sums[kRmsNormThreads / 32];
  __shared__ float xs[kRmsNormStaged], ws[kRmsNormStaged];
  const int tid = threadIdx.x, lane = tid & 31;
  detail::pdl_launch_dependents();
  // The first batch's weights before the PDL wait (weights, not written by any kernel): the chain after it
  // is x's round trip alone.
  float w0[kRmsNormBatch];
#pragma unroll
  for (int q = 0; q < kRmsNormBatch; ++q) {
    const int64_t c = tid + int64_t{kRmsNormThreads} * q;
    w0[q] = c < dim && weight ? __ldg(weight + c) : 0.0f;
  }
  detail::pdl_wait();
  const float* xr = x + row * dim;
  float* yr = y + row * dim;
  const bool staged = dim <= kRmsNormStaged;
  float ss = 0.0f;
  for (int64_t base = 0; base < dim; base += kRmsNormStaged) {
    float v[kRmsNormBatch], w[kRmsNormBatch];
#pragma unroll
    for (int q = 0; q < kRmsNormBatch; ++q) {
      const int64_t c = base + tid + int64_t{kRmsNormThreads} * q;
      v[q] = c < dim ? __ldcg(xr + c) : 0.0f;
      w[q] = base == 0 ? w0[q] : c < dim && weight ? __ldg(weight + c) : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < kRmsNormBatch; ++q) {
      const int64_t c = base + tid + int64_t{kRmsNormThreads} * q;
      if (c < dim) {
        ss = fmaf(v[q], v[q], ss);
        if (staged) {  // each thread later reads back only the channels it wrote
          xs[c] = v[q];
          ws[c] = w[q];
        }
      }
    }
  }
  ss = detail::warp_sum(ss);
  if (lane == 0) warp_sums[tid >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < kRmsNormThreads / 32; ++i) total += warp_sums[i];
  const float r = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);  // IEEE div/sqrt (no fast-math)
#pragma unroll 1
  for (int64_t base = 0; base < dim; base += kRmsNormThreads) {
    const int64_t c = base + tid;
    const bool live = c < dim;  // the same in the 32 lanes of a warp where kQuant (dim % 32 == 0)
    float xv = 0.0f, wv = 0.0f;
    if (live) {
      xv = staged ? xs[c] : __ldcg(xr + c);
      wv = !weight ? 0.0f : staged ? ws[c] : __ldg(weight + c);
    }
    const float v = __fmul_rn(xv, r);
    const float out = detail::round_bf16(weight ? __fmul_rn(wv, v) : v);
    if (live) yr[c] = out;
    if constexpr (kQuant) {
      const int64_t e = row * dim + c;  // element of [rows, dim]
      const float s = detail::act_block_scale(detail::warp_max(live ? fabsf(out) : 0.0f));
      if (live) {
        codes[e] = detail::act_code_f16(out, s);
        if (lane == 0) scales[e >> 5] = s;
      }
    }
  }
}

}  // namespace cedar::cuda::detail
