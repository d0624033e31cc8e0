// Small device helpers of the CUDA model (model_kernels.h).
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/model_kernels.h"

namespace cedar::cuda {
namespace {

__global__ void split_mix_kernel(const float* __restrict__ mix, int64_t n, int hc, float* __restrict__ pre,
                                 float* __restrict__ post, float* __restrict__ comb) {
  const int width = 2 * hc + hc * hc;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * width) return;
  const int64_t t = i / width;
  const int c = static_cast<int>(i % width);
  const float v = mix[i];
  if (c < hc)
    pre[t * hc + c] = v;
  else if (c < 2 * hc)
    post[t * hc + c - hc] = v;
  else
    comb[t * hc * hc + c - 2 * hc] = v;
}

}  // namespace

Status split_mix_rows(const float* mix, int64_t n, int64_t hc, float* pre, float* post, float* comb,
                      cudaStream_t stream) {
  if (n < 0 || hc < 1 || hc > 16)
    return make_error("cuda::split_mix_rows: n=" + std::to_string(n) + ", hc=" + std::to_string(hc));
  if (n == 0) return Status::Ok();
  if (!mix || !pre || !post || !comb) return make_error("cuda::split_mix_rows: null pointer");
  const int64_t total = n * (2 * hc + hc * hc);
  const int threads = 256;
  split_mix_kernel<<<static_cast<unsigned>((total + threads - 1) / threads), threads, 0, stream>>>(
      mix, n, static_cast<int>(hc), pre, post, comb);
  return launch_status("split_mix_kernel");
}

}  // namespace cedar::cuda
