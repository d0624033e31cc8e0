#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row: a block-wide sum of squares, then the scaled, weighted, bf16-rounded output.
// kQuant: also the FP8 codes of the output. In the output loop warp w holds channels 256·i + 32·w + lane
// — one aligned 32-block per warp and iteration (dim % 32 == 0: a warp's lanes run the same
// iterations) — so the block's scale is one warp_max away (act_quant.cuh: quantize_act_fp8's ops).
template <bool kQuant>
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(const float* x, int64_t dim, const float* weight,
                                                            float eps, float* y, uint16_t* codes, float* scales) {
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float rstd_s;
  detail::pdl_launch_dependents();
  detail::pdl_wait();
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < dim; c += kThreads) ss = fmaf(xr[c], xr[c], ss);
  ss = detail::warp_sum(ss);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    rstd_s = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);  // IEEE div/sqrt (no fast-math)
  }
  __syncthreads();
  const float r = rstd_s;
  for (int64_t c = threadIdx.x; c < dim; c += kThreads) {
    const float v = __fmul_rn(xr[c], r);
    const float out = detail::round_bf16(weight ? __fmul_rn(weight[c], v) : v);
    yr[c] = out;
    if constexpr (kQuant) {
      const int64_t e = static_cast<int64_t>(blockIdx.x) * dim + c;  // element of [rows, dim]
      detail::quantize_act_warp(out, codes + (e & ~int64_t{31}), scales + (e >> 5), threadIdx.x & 31);
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
