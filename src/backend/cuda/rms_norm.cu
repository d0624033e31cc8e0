#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma_bf16.cuh"
#include "backend/cuda/rms_norm_block.cuh"

namespace cedar::cuda {
namespace {

constexpr int kThreads = detail::kRmsNormThreads;

// One block per row: rms_norm_block (rms_norm_block.cuh).
template <bool kQuant>
__global__ void __launch_bounds__(detail::kRmsNormThreads) rms_norm_kernel(const float* x, int64_t dim,
                                                                           const float* weight, float eps, float* y,
                                                                           uint16_t* codes, float* scales) {
  detail::rms_norm_block<kQuant>(x, dim, weight, eps, y, codes, scales, blockIdx.x);
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
