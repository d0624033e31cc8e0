// The critical half of a split decode mHC site (CudaKernelPaths::mhc_split) in one launch: expand +
// collapse + the next sublayer's input RMSNorm of `collapsed` (mhc_fused with fn = null and normed, up
// to kMhcNormFuseMaxTokens rows). Before, that was mhc_elementwise_kernel and then rms_norm: two
// launches, the second ~2.5 µs plus its launch on the critical path of every site (80 per step).
//
// Block = 256 channels × all n rows (thread = row × channel, blockDim = 256·n <= 1024; d = 5120: 20
// blocks). Each thread expands and collapses its channel as mhc_elementwise_kernel does (the same
// device functions: the same bits), stores `collapsed`, and takes a ticket (threadfence, then one
// atomic per block on MhcWorkspace::norm_counter — not the coefficient kernel's counter, which may be
// in use on the coefficient stream at the same time); X_out is stored after the ticket, off the fence.
// The last block normalizes row t with its threads 256·t .. 256·t + 255 (norm_row: rms_norm_kernel's
// arithmetic op for op, x and the weight in one round trip), all rows at once, and re-arms the counter.
// With a.normed_quant (s8-quantfold) it also writes normed's FP8 codes + scales (quantize_act_fp8's
// recipe, act_quant.cuh): the quantize launch before the next GEMVs is gone. With a.y_combine
// (paths.site_combine) y is the MoE's output still to be combined: each thread combines its channel from
// the routed rows and the shared one (moe_combine.cuh: moe_combine's operations and order), stores it to y
// and expands with it — the combine launch before the site is gone.
#include <string>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mhc_common.cuh"
#include "backend/cuda/mma_bf16.cuh"
#include "backend/cuda/moe_combine.cuh"

namespace cedar::cuda {
namespace {

using namespace mhc_detail;

constexpr int kMaxRows = static_cast<int>(kMhcNormFuseMaxTokens);
constexpr int kMaxThreads = kMaxRows * kNormThreads;
static_assert(kMaxThreads <= 1024, "one row per 256 threads of one block");

// kQuant: the last block also writes the FP8 codes of normed (a.normed_quant), so the next GEMVs need
// no quantize_act_fp8 launch.
template <bool kQuant>
__global__ void __launch_bounds__(kMaxThreads) mhc_expand_collapse_norm_kernel(MhcFusedArgs a, unsigned* counter) {
  __shared__ float warp_sums[kMaxRows][kNormThreads / 32];
  __shared__ bool is_last;
  __shared__ int32_t ids[kMaxRows][kMhcCombineMaxTopk], order[kMaxRows][kMhcCombineMaxTopk];
  detail::pdl_launch_dependents();
  const int tid = threadIdx.x % kNormThreads;
  const int tok = threadIdx.x / kNormThreads;  // blockDim = n · 256: every row is live
  const int64_t d = a.d, width = kHc * d;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kNormThreads + tid;
  const bool live = c < d;  // d % 32 == 0: the last block may own fewer channels
  detail::pdl_wait();
  float x[kHc];  // issued before the combine's barriers
#pragma unroll
  for (int j = 0; j < kHc; ++j) x[j] = live ? a.X[tok * width + j * d + c] : 0.0f;
  float yv = 0.0f;  // this channel's sublayer output
  if (a.y_combine.routed != nullptr) {  // block-uniform: combine the MoE rows as moe_combine does (moe_combine.cuh)
    const MhcYCombine& yc = a.y_combine;
    const int K = static_cast<int>(yc.topk);  // <= kMhcCombineMaxTopk (mhc_fused)
    float rv[detail::kCombinePrefetch];
#pragma unroll
    for (int q = 0; q < detail::kCombinePrefetch; ++q) rv[q] = live && q < K ? yc.routed[(tok * K + q) * d + c] : 0.0f;
    const float sh = live && yc.shared ? yc.shared[tok * d + c] : 0.0f;
    if (tid < K) ids[tok][tid] = yc.experts[tok * K + tid];
    __syncthreads();
    if (tid < K) order[tok][detail::combine_rank(ids[tok], K, tid)] = tid;
    __syncthreads();
    if (live) {
      yv = detail::combine_channel(rv, order[tok], K, yc.shared != nullptr, sh);
      yc.y[tok * d + c] = yv;
    }
  } else if (live && a.y) {
    yv = a.y[tok * d + c];
  }
  float v[kHc];
  if (live) {
    if (a.y) {
      expand_channel(x, yv, a.post + tok * a.post_stride, a.comb + tok * a.comb_stride, v);
    } else {
#pragma unroll
      for (int j = 0; j < kHc; ++j) v[j] = x[j];
    }
    a.collapsed[tok * d + c] = collapse_channel(v, a.collapse_w + tok * a.collapse_w_stride);
  }
  __threadfence();  // collapsed visible to the last block
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (live && a.y) {
#pragma unroll
    for (int j = 0; j < kHc; ++j) a.X_out[tok * width + j * d + c] = v[j];
  }
  if (!is_last) return;
  __threadfence();
  ActQuantOut q;
  if constexpr (kQuant) q = ActQuantOut{a.normed_quant.codes + tok * d, a.normed_quant.scales + tok * (d / 32)};
  norm_row<true, kQuant>(a.collapsed + tok * d, a.norm_weight, d, a.normed_eps, a.normed + tok * d, warp_sums[tok],
                         tid, q);
  if (threadIdx.x == 0) *counter = 0;  // re-armed for the next launch / graph replay
}

}  // namespace

namespace mhc_detail {

Status launch_expand_collapse_norm(const MhcFusedArgs& a, unsigned* counter, cudaStream_t stream) {
  if (a.n < 1 || a.n > kMhcNormFuseMaxTokens || !a.normed || !a.collapse_w || !counter)
    return make_error("cuda::mhc_fused: the expand + collapse + norm kernel needs 1.." +
                      std::to_string(kMhcNormFuseMaxTokens) + " rows (n=" + std::to_string(a.n) +
                      "), normed, collapse_w and the workspace's norm_counter");
  const auto grid = static_cast<unsigned>((a.d + kNormThreads - 1) / kNormThreads);
  const auto threads = static_cast<unsigned>(a.n * kNormThreads);
  if (a.normed_quant.on())
    return launch_kernel(mhc_expand_collapse_norm_kernel<true>, dim3(grid), dim3(threads), 0, stream,
                         a.programmatic_launch, "mhc_expand_collapse_norm_kernel<quant>", a, counter);
  return launch_kernel(mhc_expand_collapse_norm_kernel<false>, dim3(grid), dim3(threads), 0, stream,
                       a.programmatic_launch, "mhc_expand_collapse_norm_kernel", a, counter);
}

}  // namespace mhc_detail

const void* mhc_expand_collapse_norm_kernel_ptr() {
  return reinterpret_cast<const void*>(&mhc_expand_collapse_norm_kernel<false>);
}
const void* mhc_expand_collapse_norm_quant_kernel_ptr() {
  return reinterpret_cast<const void*>(&mhc_expand_collapse_norm_kernel<true>);
}

}  // namespace cedar::cuda
