// The end of the forward on the device: final collapse of the hc streams with the last ffn site's pre
// (§3.3), final RMSNorm, and the fp32 head (§2.3: bf16 weights, fp32 products and sums, fp32 logits)
// through gemv_bf16 (attention_kernels.h, owner cuda-attn).
#include <cstdint>
#include <string>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/ffn_device.cuh"
#include "backend/cuda/ffn_kernels.h"

namespace cedar::cuda {
namespace {

constexpr int kCollapseThreads = 256;

// out[t, c] = bf16(Σ_k w[t, k]·X[t, k, c]) from the first product, in stream order, no contraction
// (model/mhc.h hc_collapse, bit-exact).
__global__ void __launch_bounds__(kCollapseThreads)
    hc_collapse_kernel(const float* X, const float* w, int64_t hc, int64_t d, float* out) {
  const int64_t t = blockIdx.y;
  const float* wt = w + t * hc;
  const float* xt = X + t * hc * d;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kCollapseThreads + threadIdx.x; c < d;
       c += static_cast<int64_t>(gridDim.x) * kCollapseThreads) {
    float acc = __fmul_rn(wt[0], xt[c]);
    for (int64_t k = 1; k < hc; ++k) acc = __fadd_rn(acc, __fmul_rn(wt[k], xt[k * d + c]));
    out[t * d + c] = detail::round_bf16(acc);
  }
}

}  // namespace

Status hc_collapse_rows(const float* X, const float* weights, int64_t n, int64_t hc, int64_t d, float* out,
                        cudaStream_t stream) {
  if (n < 0 || n > 65535 || hc <= 0 || d <= 0)
    return make_error("cuda::hc_collapse_rows: n=" + std::to_string(n) + " (<= 65535), hc=" + std::to_string(hc) +
                      ", d=" + std::to_string(d));
  if (!X || !weights || !out) return make_error("cuda::hc_collapse_rows: X, weights and out are required");
  if (n == 0) return Status::Ok();
  const int64_t slices = (d + kCollapseThreads * 4 - 1) / (kCollapseThreads * 4);
  hc_collapse_kernel<<<dim3(static_cast<unsigned>(slices), static_cast<unsigned>(n)), kCollapseThreads, 0, stream>>>(
      X, weights, hc, d, out);
  return launch_status("hc_collapse_kernel");
}

Status final_head(const FinalHeadArgs& a, cudaStream_t stream) {
  if (a.n < 0 || a.d <= 0 || a.vocab <= 0 || a.hc <= 0)
    return make_error("cuda::final_head: n=" + std::to_string(a.n) + ", hc=" + std::to_string(a.hc) +
                      ", d=" + std::to_string(a.d) + ", vocab=" + std::to_string(a.vocab));
  if (!a.X || !a.pre || !a.norm_weight || !a.head || !a.x || !a.logits)
    return make_error("cuda::final_head: X, pre, norm_weight, head, x and logits are required");
  if (a.n == 0) return Status::Ok();
  CEDAR_RETURN_IF_ERROR(hc_collapse_rows(a.X, a.pre, a.n, a.hc, a.d, a.x, stream));
  CEDAR_RETURN_IF_ERROR(rms_norm(a.x, a.n, a.d, a.norm_weight, a.norm_eps, a.x, stream));
  Bf16GemvArgs g;
  g.w = a.head;
  g.out = a.vocab;
  g.in = a.d;
  g.x = a.x;
  g.y = a.logits;
  g.n = a.n;
  g.bf16_output = false;
  return gemv_bf16(g, stream, a.splitk);
}

const void* hc_collapse_kernel_ptr() { return reinterpret_cast<const void*>(&hc_collapse_kernel); }

}  // namespace cedar::cuda
