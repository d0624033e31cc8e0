// MoE glue on the device: the grouped-GEMV item tables built from the router's expert ids, SwiGLU
// (+ the W2 activation quantization), and the combine of the routed and shared expert outputs.
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/ffn_device.cuh"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma_bf16.cuh"
#include "backend/cuda/moe_combine.cuh"
#include "backend/cuda/moe_items_build.cuh"

namespace cedar::cuda {
namespace {

constexpr int kDispatchThreads = 1024;
static_assert(4 * kDispatchThreads >= kMoeMaxExperts, "build_moe_items scans n_experts <= 4 x threads");
constexpr int kSwigluThreads = 256;  // 8 warps = 8 blocks of 32 values
constexpr int kCombineThreads = 256;
constexpr int kMaxCombineTopk = 64;

// One block: build_moe_items (moe_items_build.cuh) once the router's expert ids are written.
__global__ void __launch_bounds__(kDispatchThreads) moe_build_items_kernel(MoeDispatchArgs a) {
  extern __shared__ int32_t sm[];
  __shared__ int32_t warp_tot[32];
  detail::pdl_launch_dependents();
  detail::pdl_wait();  // the router's experts
  detail::build_moe_items(a, [&](int64_t p) { return a.experts[p]; }, sm, warp_tot);
}

// One warp per 32-value block of h: SwiGLU with the CPU's rounding steps, then (optionally) the FP8
// activation quantization of the block.
__global__ void __launch_bounds__(kSwigluThreads) swiglu_kernel(SwigluArgs a, int64_t n_blocks) {
  detail::pdl_launch_dependents();
  detail::pdl_wait();
  const int64_t blk = (static_cast<int64_t>(blockIdx.x) * kSwigluThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (blk >= n_blocks) return;  // whole warps
  const int64_t i = blk * 32 + lane;
  const int64_t row = i / a.inter;
  float gv = a.g[i], uv = a.u[i];
  // The row's routing weight is requested with g and u, not one L2 round trip after the arithmetic (s31).
  const float rw = a.row_weights ? a.row_weights[row] : 1.0f;
  if (a.limit > 0.0f) {  // gate from above only, up on both sides; NaN passes through
    gv = gv > a.limit ? a.limit : gv;
    uv = uv > a.limit ? a.limit : (uv < -a.limit ? -a.limit : uv);
  }
  // silu(g)·u = g / (1 + exp(−g)) · u, each step one fp32 rounding as the CPU's expression.
  float h = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, detail::expf_cr(-gv))), uv);
  if (a.row_weights) h = __fmul_rn(rw, h);
  h = detail::round_bf16(h);
  if (a.h) a.h[i] = h;
  if (a.codes) {
    float s;
    a.codes[i] = detail::quantize_act_value(h, detail::warp_max(fabsf(h)), &s);
    if (lane == 0) a.scales[blk] = s;
  }
}

// Block (token, channel slice): the token's slots sorted by (expert id, slot) once, then each channel
// sums its routed rows in that order from 0.0f and adds the shared row, as moe_forward.
// Thread = one channel of token blockIdx.y: y = bf16(Σ_k routed[slot order_k] (+ shared)) with the slots
// in stable expert-id order (the CPU's combine). Latency-bound at decode (5120 floats): the ids are
// loaded once by K threads and ranked in parallel (rank of slot k = #{j: id_j < id_k, or id_j == id_k and
// j < k}: the stable order), while every thread already has its channel's K <= 8 routed values in
// flight; one channel per thread (all loads of the block at once). (The first version: thread 0
// insertion-sorted with a global load per comparison, 4 channels per thread with dependent loads:
// ~10 µs per layer in the model.) Same additions in the same order: the old kernel's bits. The channel's
// arithmetic is moe_combine.cuh's, which the mHC site kernel shares (MhcFusedArgs::y_combine).
using detail::kCombinePrefetch;

__global__ void __launch_bounds__(kCombineThreads) moe_combine_kernel(MoeCombineArgs a) {
  __shared__ int32_t ids[kMaxCombineTopk];
  __shared__ int32_t order[kMaxCombineTopk];
  const int64_t t = blockIdx.y, d = a.d;
  const int K = static_cast<int>(a.topk), tid = threadIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kCombineThreads + tid;
  const bool live = c < d;
  if (tid < K) ids[tid] = a.experts[t * K + tid];
  float v[kCombinePrefetch];
#pragma unroll
  for (int q = 0; q < kCombinePrefetch; ++q)
    v[q] = live && q < K && K <= kCombinePrefetch ? a.routed[(t * K + q) * d + c] : 0.0f;
  const float sh = live && a.shared ? a.shared[t * d + c] : 0.0f;
  __syncthreads();
  if (tid < K) order[detail::combine_rank(ids, K, tid)] = tid;
  __syncthreads();
  if (!live) return;
  if (K <= kCombinePrefetch) {
    a.y[t * d + c] = detail::combine_channel(v, order, K, a.shared != nullptr, sh);
    return;
  }
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc = __fadd_rn(acc, a.routed[(t * K + order[k]) * d + c]);
  a.y[t * d + c] = detail::round_bf16(a.shared ? __fadd_rn(acc, sh) : acc);
}

}  // namespace

Status check_moe_dispatch(const MoeDispatchArgs& a) {
  auto fail = [](const std::string& m) { return make_error("cuda::moe_build_items: " + m); };
  const int64_t P = a.n * a.topk;
  if (a.n < 0 || a.topk <= 0 || P > kMoeMaxPairs)
    return fail("n=" + std::to_string(a.n) + ", topk=" + std::to_string(a.topk) +
                " (n·topk <= " + std::to_string(kMoeMaxPairs) + " per dispatch)");
  if (a.n_experts <= 0 || a.n_experts > kMoeMaxExperts)
    return fail("n_experts=" + std::to_string(a.n_experts) + " (1.." + std::to_string(kMoeMaxExperts) + ")");
  if (!a.experts) return fail("experts is required");
  if (a.n_tables < 1 || a.n_tables > 2) return fail("n_tables=" + std::to_string(a.n_tables) + " (1 or 2)");
  for (int i = 0; i < a.n_tables; ++i) {
    const MoeItemTable& t = a.tables[i];
    const std::string which = "table " + std::to_string(i) + ": ";
    if (t.n_mats < 1 || t.n_mats > 2) return fail(which + "n_mats=" + std::to_string(t.n_mats) + " (1 or 2)");
    for (int m = 0; m < t.n_mats; ++m)
      if (!t.mats[m].data || !t.mats[m].scales || !t.y[m])
        return fail(which + "matrix " + std::to_string(m) + " needs weight pointer tables and an output");
    if (!t.act_codes || !t.act_scales || !t.items || !t.count)
      return fail(which + "activations, items and count are required");
    if (t.capacity < P * t.n_mats)
      return fail(which + "capacity " + std::to_string(t.capacity) +
                  " < n·topk·n_mats = " + std::to_string(P * t.n_mats));
  }
  return Status::Ok();
}

Status moe_build_items(const MoeDispatchArgs& a, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_moe_dispatch(a));
  const int64_t P = a.n * a.topk;
  const size_t smem = static_cast<size_t>(detail::moe_items_smem_ints(P, a.n_experts)) * sizeof(int32_t);
  if (smem > 48 * 1024) {
    CEDAR_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(moe_build_items_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    static_cast<int>(smem)));
  }
  return launch_kernel(moe_build_items_kernel, dim3(1), dim3(kDispatchThreads), smem, stream, a.programmatic_launch,
                       "moe_build_items_kernel", a);
}

Status swiglu(const SwigluArgs& a, cudaStream_t stream) {
  if (a.rows < 0 || a.inter <= 0 || a.inter % 32 != 0)
    return make_error("cuda::swiglu: rows=" + std::to_string(a.rows) + ", inter=" + std::to_string(a.inter) +
                      " (inter must be a positive multiple of 32)");
  if (!a.g || !a.u || (!a.h && !a.codes) || (a.codes && !a.scales))
    return make_error("cuda::swiglu: g, u and an output (h, or codes with scales) are required");
  const int64_t n_blocks = a.rows * a.inter / 32;
  if (n_blocks == 0) return Status::Ok();
  const int64_t grid = (n_blocks * 32 + kSwigluThreads - 1) / kSwigluThreads;
  if (grid > 0x7FFFFFFF) return make_error("cuda::swiglu: too many rows (" + std::to_string(a.rows) + ")");
  return launch_kernel(swiglu_kernel, dim3(static_cast<unsigned>(grid)), dim3(kSwigluThreads), 0, stream,
                       a.programmatic_launch, "swiglu_kernel", a, n_blocks);
}

Status moe_combine(const MoeCombineArgs& a, cudaStream_t stream) {
  if (a.n < 0 || a.n > 65535 || a.topk < 1 || a.topk > kMaxCombineTopk || a.d <= 0)
    return make_error("cuda::moe_combine: n=" + std::to_string(a.n) + " (<= 65535), topk=" + std::to_string(a.topk) +
                      " (1.." + std::to_string(kMaxCombineTopk) + "), d=" + std::to_string(a.d));
  if (!a.experts || !a.routed || !a.y) return make_error("cuda::moe_combine: experts, routed and y are required");
  if (a.n == 0) return Status::Ok();
  const int64_t slices = (a.d + kCombineThreads - 1) / kCombineThreads;
  if (slices > 0x7FFFFFFF) return make_error("cuda::moe_combine: d=" + std::to_string(a.d) + " too large");
  moe_combine_kernel<<<dim3(static_cast<unsigned>(slices), static_cast<unsigned>(a.n)), kCombineThreads, 0, stream>>>(
      a);
  return launch_status("moe_combine_kernel");
}

const void* moe_build_items_kernel_ptr() { return reinterpret_cast<const void*>(&moe_build_items_kernel); }
const void* swiglu_kernel_ptr() { return reinterpret_cast<const void*>(&swiglu_kernel); }
const void* moe_combine_kernel_ptr() { return reinterpret_cast<const void*>(&moe_combine_kernel); }

}  // namespace cedar::cuda
