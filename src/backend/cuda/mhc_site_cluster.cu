// The critical half of a split decode mHC site as one thread-block cluster (MhcFusedArgs::site_cluster,
// CudaKernelPaths::site_cluster): expand + collapse + the input RMSNorm + normed's FP8 codes, with no ticket
// and no serial last block.
//
// Why: the ticket kernel (mhc_norm.cu) has every block expand / collapse its channels, then one block — the
// last to take the ticket — normalizes the whole row and, with codes requested, quantizes it alone (s8: 10.4
// instead of 6.9 µs with the codes, so the model quantizes in a separate launch). In the decode timeline the
// site kernel and its quantize take ~7 µs of the critical path, twice per layer. Here the row's blocks form
// one cluster (kSiteBlocks blocks, block r owning channels [r·span, (r+1)·span), one thread per channel and
// row, at least 256 per row: at d = 5120, 640 threads, one row per launch): each keeps its collapsed channels
// in shared memory, one cluster barrier makes them visible through distributed shared memory, every block
// copies the other slices into its own copy of the row (16-byte loads) and computes the row's sum of squares
// itself, in norm_row's order (thread t: channels t, t + 256, ... by FMAs, warp_sum, the warps in order), so
// every block has rms_norm's rstd bit for bit; then each block normalizes and quantizes only its own channels
// (a warp's 32 channels are one aligned quantization block). The copy and the redundant sum (d / 256 FMAs per
// thread) replace a global round trip, a fence, the ticket and a one-block tail.
//
// Same bits as mhc_expand_collapse_norm_kernel (+ quantize_act_fp8): the same device functions for expand,
// collapse and the combine, norm_row's operations for the norm, act_quant.cuh's recipe for the codes.
#include <cooperative_groups.h>

#include <algorithm>
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

constexpr int kSiteBlocks = 8;  // a portable cluster size
constexpr int kMaxThreads = 1024;

// Threads per row: one per channel of the block's slice, and at least norm_row's 256 (the sum's order).
int64_t row_threads(int64_t d) { return std::max<int64_t>(kNormThreads, d / kSiteBlocks); }

__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// kQuant: also normed's FP8 codes + scales (a.normed_quant). Block = row_threads(d) threads per row × n rows.
template <bool kQuant>
__global__ void __cluster_dims__(kSiteBlocks, 1, 1) __launch_bounds__(kMaxThreads)
    mhc_site_cluster_kernel(MhcFusedArgs a) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  // [n][d]: the collapsed rows. This block writes its slice [rank·span, (rank+1)·span) of each row, then copies
  // the other blocks' slices from their shared memory.
  extern __shared__ float4 rows4[];
  float* const rows = reinterpret_cast<float*>(rows4);
  __shared__ float warp_sums[kMhcNormFuseMaxTokens][kNormThreads / 32];
  __shared__ int32_t ids[kMhcNormFuseMaxTokens][kMhcCombineMaxTopk], order[kMhcNormFuseMaxTokens][kMhcCombineMaxTopk];
  detail::pdl_launch_dependents();
  const int d = static_cast<int>(a.d);           // <= 8192 (mhc_site_cluster_fits): 32-bit channel math
  const int span = d / kSiteBlocks;              // a multiple of 32 (the launcher checks)
  const int T = static_cast<int>(blockDim.x / a.n);  // threads per row: max(256, span)
  const int tid = static_cast<int>(threadIdx.x) % T, tok = static_cast<int>(threadIdx.x) / T;
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t width = kHc * a.d;
  const bool mine = tid < span;  // a channel of this block's slice (warp-uniform: span % 32 == 0)
  const int c = rank * span + (mine ? tid : 0);
  float* const row = rows + tok * d;
  // The norm weight before the wait (a weight); after it, every input at once: the streams, the sublayer rows,
  // the token's mix (post, comb, collapse weights) — not one round trip after each stage's stores (s30).
  const float wv = mine && a.norm_weight ? __ldg(a.norm_weight + c) : 0.0f;
  detail::pdl_wait();
  // Expand + collapse of one channel per thread, as mhc_expand_collapse_norm_kernel does (its loads issued
  // before the combine's barriers, as there).
  float x[kHc];
#pragma unroll
  for (int j = 0; j < kHc; ++j) x[j] = mine ? a.X[tok * width + j * a.d + c] : 0.0f;
  float post[kHc], comb[kHc * kHc], cw[kHc];
  if (a.y) {
#pragma unroll
    for (int k = 0; k < kHc; ++k) post[k] = a.post[tok * a.post_stride + k];
#pragma unroll
    for (int k = 0; k < kHc * kHc; ++k) comb[k] = a.comb[tok * a.comb_stride + k];
  }
#pragma unroll
  for (int k = 0; k < kHc; ++k) cw[k] = a.collapse_w[tok * a.collapse_w_stride + k];
  float yv = 0.0f;  // this channel's sublayer output
  if (a.y_combine.routed != nullptr) {  // block-uniform: combine the MoE rows as moe_combine does (moe_combine.cuh)
    const MhcYCombine& yc = a.y_combine;
    const int K = static_cast<int>(yc.topk);  // <= kMhcCombineMaxTopk (mhc_fused)
    float rv[detail::kCombinePrefetch];
#pragma unroll
    for (int q = 0; q < detail::kCombinePrefetch; ++q)
      rv[q] = mine && q < K ? yc.routed[(static_cast<int64_t>(tok) * K + q) * a.d + c] : 0.0f;
    const float sh = mine && yc.shared ? yc.shared[tok * a.d + c] : 0.0f;
    if (tid < K) ids[tok][tid] = yc.experts[tok * K + tid];
    __syncthreads();
    if (tid < K) order[tok][detail::combine_rank(ids[tok], K, tid)] = tid;
    __syncthreads();
    if (mine) yv = detail::combine_channel(rv, order[tok], K, yc.shared != nullptr, sh);
  } else if (mine && a.y) {
    yv = a.y[tok * a.d + c];
  }
  // The outputs stay in registers until the first cluster barrier is passed: its release fence
  // (MEMBAR.ALL.GPU) would otherwise wait for their global stores, which no peer reads (s30).
  float v[kHc];
  float col = 0.0f;
  if (mine) {
    if (a.y) {
      expand_channel(x, yv, post, comb, v);
    } else {
#pragma unroll
      for (int j = 0; j < kHc; ++j) v[j] = x[j];
    }
    col = collapse_channel(v, cw);
    row[c] = col;
  }
  cluster_arrive_release();  // this block's slices are written ...
  cluster_wait_acquire();    // ... and every other block's are visible
  if (mine) {
    if (a.y_combine.routed != nullptr) a.y_combine.y[tok * a.d + c] = yv;
    if (a.y) {
#pragma unroll
      for (int j = 0; j < kHc; ++j) a.X_out[tok * width + j * a.d + c] = v[j];
    }
    a.collapsed[tok * a.d + c] = col;
  }
  // The other blocks' slices into this block's rows: 16-byte pieces (span % 4 == 0: a piece has one owner).
  const int pieces = static_cast<int>(a.n) * d / 4;
  for (int i = static_cast<int>(threadIdx.x); i < pieces; i += static_cast<int>(blockDim.x)) {
    const int owner = (4 * i % d) / span;
    if (owner != rank) rows4[i] = *cluster.map_shared_rank(rows4 + i, owner);
  }
  // Done reading the others' shared memory (each block waits for this before it exits). Relaxed: it orders
  // nothing this block wrote, and the values read are already in this block's registers / shared memory.
  cluster_arrive_relaxed();
  __syncthreads();
  // The row's sum of squares in norm_row's order: thread t < 256 takes channels t, t + 256, ... by FMAs in
  // channel order, warp_sum, the warps in order — the same operations on the same values in every block, so
  // every block has rms_norm's rstd.
  // (Shuffles outside the branches: their conditions are warp-uniform but not provably so, and a shuffle under
  // such a condition compiles to a divergence-safe collective sequence.)
  float ss = 0.0f;
  if (tid < kNormThreads) {
    for (int base = 0; base < d; base += kNormThreads * kNormBatch) {
      float v[kNormBatch];
#pragma unroll
      for (int q = 0; q < kNormBatch; ++q) {
        const int ch = base + tid + kNormThreads * q;
        v[q] = ch < d ? row[ch] : 0.0f;
      }
#pragma unroll
      for (int q = 0; q < kNormBatch; ++q)
        if (base + tid + kNormThreads * q < d) ss = fmaf(v[q], v[q], ss);
    }
  }
  ss = detail::warp_sum(ss);
  if (tid < kNormThreads && (tid & 31) == 0) warp_sums[tok][tid >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kNormThreads / 32; ++w) total += warp_sums[tok][w];
  const float r = 1.0f / sqrtf(total / static_cast<float>(a.d) + a.normed_eps);
  // This block's channels: normed (and its codes). A warp's lanes agree on `mine` and hold one aligned
  // 32-channel block (span % 32 == 0, T % 32 == 0): its warp max is the block's.
  const float xr = __fmul_rn(mine ? row[c] : 0.0f, r);
  const float out = detail::round_bf16(a.norm_weight ? __fmul_rn(wv, xr) : xr);
  if (mine) a.normed[tok * a.d + c] = out;
  if constexpr (kQuant) {
    const float s = detail::act_block_scale(detail::warp_max(mine ? fabsf(out) : 0.0f));
    if (mine) {
      a.normed_quant.codes[tok * a.d + c] = detail::act_code_f16(out, s);
      if ((tid & 31) == 0) a.normed_quant.scales[tok * (a.d / 32) + (c >> 5)] = s;
    }
  }
  cluster_wait_acquire();  // no block leaves while another may still read its shared memory
}

size_t rows_bytes(int64_t n, int64_t d) { return sizeof(float) * static_cast<size_t>(n * d); }

}  // namespace

namespace mhc_detail {

bool site_cluster_fits(const MhcFusedArgs& a) {
  return mhc_site_cluster_fits(a.n, a.d) && a.normed && a.collapse_w && a.collapsed;
}

Status launch_site_cluster(const MhcFusedArgs& a, cudaStream_t stream) {
  if (!site_cluster_fits(a))
    return make_error("cuda::mhc_fused: the cluster site kernel needs 1.." + std::to_string(kMhcNormFuseMaxTokens) +
                      " rows (n=" + std::to_string(a.n) + "), d a multiple of " + std::to_string(32 * kSiteBlocks) +
                      " (d=" + std::to_string(a.d) + ") with n·max(256, d/" + std::to_string(kSiteBlocks) +
                      ") <= 1024 threads, normed, collapse_w and collapsed");
  const dim3 grid(kSiteBlocks), block(static_cast<unsigned>(a.n * row_threads(a.d)));
  const size_t smem = rows_bytes(a.n, a.d);
  if (a.normed_quant.on())
    return launch_kernel(mhc_site_cluster_kernel<true>, grid, block, smem, stream, a.programmatic_launch,
                         "mhc_site_cluster_kernel<quant>", a);
  return launch_kernel(mhc_site_cluster_kernel<false>, grid, block, smem, stream, a.programmatic_launch,
                       "mhc_site_cluster_kernel", a);
}

}  // namespace mhc_detail

// The thread bound implies n·d <= 8 · 1024: the rows take at most 32 KB of dynamic shared memory (no opt-in),
// and d fits the kernel's 32-bit channel math.
bool mhc_site_cluster_fits(int64_t n, int64_t d) {
  return n >= 1 && n <= kMhcNormFuseMaxTokens && d >= 32 * kSiteBlocks && d % (32 * kSiteBlocks) == 0 &&
         n * row_threads(d) <= kMaxThreads;
}

const void* mhc_site_cluster_kernel_ptr() { return reinterpret_cast<const void*>(&mhc_site_cluster_kernel<true>); }

}  // namespace cedar::cuda
