#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBatch = 20;                          // loads in flight per thread: 5120 channels in one round trip
constexpr int64_t kStaged = int64_t{kThreads} * kBatch;  // rows up to this long keep x and the weight in shared memory

// One block per row. Pass 1 loads x and the weight in batches of 20 per thread (one round trip for a
// 5120 row) and sums the squares as rms_norm always has (thread t: channels t, t + 256, ... by FMAs;
// warp_sum; the warps in order), keeping both in shared memory; pass 2 writes the scaled, weighted,
// bf16-rounded output (kQuant: and its FP8 codes, quantize_act_fp8's ops) in a rolled loop over
// warp-uniform bases. Rolled on purpose: the kernel runs once per layer with cold instruction caches,
// and pass 2 unrolled 20 times (norm_row) made q_norm's kernel 8.5 k SASS instructions and 11-17 µs
// instead of ~8.5 µs (s9 runs 3-4); a shuffle under a lane-dependent loop bound would compile to
// divergence-safe collective code. (The first version loaded x, then x and the weight again, one
// dependent round trip per 256 channels.) Rows past kStaged reload x and the weight in pass 2.
template <bool kQuant>
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(const float* x, int64_t dim, const float* weight,
                                                            float eps, float* y, uint16_t* codes, float* scales) {
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float xs[kStaged], ws[kStaged];
  detail::pdl_launch_dependents();
  detail::pdl_wait();
  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t row = blockIdx.x;
  const float* xr = x + row * dim;
  float* yr = y + row * dim;
  const bool staged = dim <= kStaged;
  float ss = 0.0f;
  for (int64_t base = 0; base < dim; base += kStaged) {
    float v[kBatch], w[kBatch];
#pragma unroll
    for (int q = 0; q < kBatch; ++q) {
      const int64_t c = base + tid + int64_t{kThreads} * q;
      v[q] = c < dim ? __ldcg(xr + c) : 0.0f;
      w[q] = c < dim && weight ? __ldg(weight + c) : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < kBatch; ++q) {
      const int64_t c = base + tid + int64_t{kThreads} * q;
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
  for (int i = 0; i < kThreads / 32; ++i) total += warp_sums[i];
  const float r = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);  // IEEE div/sqrt (no fast-math)
#pragma unroll 1
  for (int64_t base = 0; base < dim; base += kThreads) {
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

}  // namespace

Status rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* y,
                cudaStream_t stream, bool programmatic_launch) {
  return rms_norm(x, rows, dim, weight, eps, y, stream, programmatic_launch, ActQuantOut{});
}

Status rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* y,
                cudaStream_t stream, bool programmatic_launch, const ActQuantOut& quant) {
  if (rows < 0 || dim <= 0 || rows > 0x7FFFFFFF)
    return make_error("cuda::rms_norm: rows=" + std::to_string(rows) + ", dim=" + std::to_string(dim));
  if (quant.on() != (quant.scales != nullptr))
    return make_error("cuda::rms_norm: the FP8 output needs both codes and scales");
  if (quant.on() && dim % 32 != 0)
    return make_error("cuda::rms_norm: FP8 codes of the output need dim % 32 == 0 (dim=" + std::to_string(dim) + ")");
  if (rows == 0) return Status::Ok();
  if (quant.on())
    return launch_kernel(rms_norm_kernel<true>, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream,
                         programmatic_launch, "rms_norm_kernel<quant>", x, dim, weight, eps, y, quant.codes,
                         quant.scales);
  return launch_kernel(rms_norm_kernel<false>, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream,
                       programmatic_launch, "rms_norm_kernel", x, dim, weight, eps, y, static_cast<uint16_t*>(nullptr),
                       static_cast<float*>(nullptr));
}

}  // namespace cedar::cuda

namespace cedar::cuda {
const void* rms_norm_kernel_ptr() { return reinterpret_cast<const void*>(&rms_norm_kernel<false>); }
const void* rms_norm_quant_kernel_ptr() { return reinterpret_cast<const void*>(&rms_norm_kernel<true>); }
}  // namespace cedar::cuda
