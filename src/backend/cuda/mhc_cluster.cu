// The cluster variant of the fused mHC (ffn_kernels.h mhc_fused_cluster; owner of the original:
// cuda-ffn). Expand / collapse as mhc_fused (mhc_common.cuh), the coefficients by finish_mix.
#include <cooperative_groups.h>

#include <string>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mhc_common.cuh"

namespace cedar::cuda {
namespace {

using namespace mhc_detail;

// ---- cluster variant (mhc_fused_cluster) ---------------------------------------------------------
// One cluster of 16 blocks per tile of <= 8 tokens, block r owning a contiguous channel range of all
// 4 streams. Thread 0 streams the block's fn slice (24 rows × 4 streams × its channels, contiguous
// runs) into shared memory with TMA bulk copies on one mbarrier while the block expands / collapses X;
// the per-token 25 partial sums are reduced in the block (butterfly + warps in order), exchanged
// through distributed shared memory after one cluster barrier (block t sums token t's 16 partials in
// rank order: deterministic), and the Sinkhorn of token t runs in one thread of block t.

constexpr int kClusterBlocks = 16;
constexpr int kClThreads = 256;
constexpr int kClWarps = kClThreads / 32;

struct MhcClusterArgs {
  MhcFusedArgs a;
  int64_t chunks_per_block;  // 32-channel chunks per block (the last blocks may own fewer)
};

__global__ void __launch_bounds__(kClThreads, 1) mhc_cluster_kernel(MhcClusterArgs args) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const MhcFusedArgs& a = args.a;
  extern __shared__ __align__(128) float dyn[];
  __shared__ __align__(8) uint64_t bar;
  __shared__ float part[kMaxTokens][kSlot];  // this block's partial sums per token (read remotely)
  __shared__ float red[kClWarps][kSlot];
  __shared__ float m_tok[kSlot];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t tile = blockIdx.x / kClusterBlocks;
  const int64_t d = a.d, width = kHc * d, n_chunks = d / kChannels;
  const int64_t cb = rank * args.chunks_per_block;
  const int64_t ce = cb + args.chunks_per_block < n_chunks ? cb + args.chunks_per_block : n_chunks;
  const int64_t ncl = ce > cb ? (ce - cb) * kChannels : 0;   // channels of this block
  const int64_t stride = args.chunks_per_block * kChannels;  // floats per (row, stream) in shared memory
  const int64_t c_begin = cb * kChannels;
  float* fs = dyn;                        // [kMix][kHc][stride]
  float* xn = dyn + kMix * kHc * stride;  // [kMaxTokens][kHc][stride]
  const int64_t t0 = tile * kMaxTokens;
  const int nt = static_cast<int>(a.n - t0 < kMaxTokens ? a.n - t0 : kMaxTokens);

  if (tid == 0) {
    detail::mbar_init(&bar);
    detail::mbar_init_fence();
  }
  __syncthreads();
  if (tid == 0 && ncl > 0) {
    const unsigned bytes = static_cast<unsigned>(ncl * sizeof(float));
    detail::mbar_expect_tx(&bar, bytes * kMix * kHc);
    for (int i = 0; i < kMix; ++i)
      for (int k = 0; k < kHc; ++k)
        detail::bulk_copy(fs + (i * kHc + k) * stride, a.fn + i * width + k * d + c_begin, bytes, &bar);
  }
  // Programmatic dependent launch: everything above touches only fn (a weight); X, y and the
  // coefficients come from the previous kernel. A no-op unless launched with programmatic serialization.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  // Expand + collapse while fn streams in: a thread owns one channel of one token (all 4 streams), so
  // X_out may alias X. Same expressions as mhc_fused_kernel (bit-exact with model/mhc.h).
  for (int64_t idx = tid; idx < nt * ncl; idx += kClThreads) {
    const int t = static_cast<int>(idx / ncl);
    const int64_t cl = idx % ncl, c = c_begin + cl, tok = t0 + t;
    float x[kHc], v[kHc];
#pragma unroll
    for (int k = 0; k < kHc; ++k) x[k] = a.X[tok * width + k * d + c];
    if (a.y) {
      const float* cmb = a.comb + tok * a.comb_stride;
#pragma unroll
      for (int k = 0; k < kHc; ++k) {
        float mixed = __fmul_rn(cmb[k], x[0]);
        for (int jj = 1; jj < kHc; ++jj) mixed = __fadd_rn(mixed, __fmul_rn(cmb[jj * kHc + k], x[jj]));
        v[k] = detail::round_bf16(__fadd_rn(__fmul_rn(a.post[tok * a.post_stride + k], a.y[tok * d + c]), mixed));
      }
#pragma unroll
      for (int k = 0; k < kHc; ++k) a.X_out[tok * width + k * d + c] = v[k];
    } else {
#pragma unroll
      for (int k = 0; k < kHc; ++k) v[k] = x[k];
    }
#pragma unroll
    for (int k = 0; k < kHc; ++k) xn[(t * kHc + k) * stride + cl] = v[k];
    if (a.collapse_w) {
      const float* w = a.collapse_w + tok * a.collapse_w_stride;
      float acc = __fmul_rn(w[0], v[0]);
      for (int kk = 1; kk < kHc; ++kk) acc = __fadd_rn(acc, __fmul_rn(w[kk], v[kk]));
      a.collapsed[tok * d + c] = detail::round_bf16(acc);
    }
  }
  if (ncl > 0) detail::mbar_wait(&bar, 0);
  __syncthreads();
  // Per token: 24 dot products with fn + the sum of squares over this block's 4·ncl values (a thread
  // sums its values in order), butterfly reduce-scatter per warp, then the warps in order.
  for (int t = 0; t < nt; ++t) {
    float acc[kSlot];
#pragma unroll
    for (int i = 0; i < kSlot; ++i) acc[i] = 0.0f;
    for (int64_t q = tid; q < kHc * ncl; q += kClThreads) {
      const int64_t k = q / ncl, cl = q % ncl;
      const float x = xn[(t * kHc + k) * stride + cl];
#pragma unroll
      for (int i = 0; i < kMix; ++i) acc[i] = fmaf(fs[(i * kHc + k) * stride + cl], x, acc[i]);
      acc[kMix] = fmaf(x, x, acc[kMix]);
    }
    float v[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = i < kSlot ? acc[i] : 0.0f;
    warp_reduce_scatter32(v, lane);
    if (lane < kSlot) red[warp][lane] = v[0];
    __syncthreads();
    if (tid < kSlot) {
      float s = 0.0f;
      for (int w = 0; w < kClWarps; ++w) s += red[w][tid];
      part[t][tid] = s;
    }
    __syncthreads();
  }
  cluster.sync();  // every block's partials are visible cluster-wide
  if (rank < nt) {
    if (tid < kSlot) {
      float s = 0.0f;
      for (int r = 0; r < kClusterBlocks; ++r) s += cluster.map_shared_rank(&part[rank][0], r)[tid];
      m_tok[tid] = s;
    }
    __syncthreads();
    if (tid == 0) {
      float m[kSlot];
#pragma unroll
      for (int i = 0; i < kSlot; ++i) m[i] = m_tok[i];
      finish_mix(m, a, a.mix_out + (t0 + rank) * a.mix_stride);
    }
  }
  cluster.sync();  // no block leaves while its partials may still be read
}

size_t mhc_cluster_smem(int64_t d, int64_t* chunks_per_block) {
  const int64_t n_chunks = d / kChannels;
  *chunks_per_block = (n_chunks + kClusterBlocks - 1) / kClusterBlocks;
  return static_cast<size_t>((kMix + kMaxTokens) * kHc * *chunks_per_block * kChannels) * sizeof(float);
}

Status check_mhc_args(const MhcFusedArgs& a, const char* who) {
  if (a.hc != kHc)
    return make_error(std::string(who) + ": hc=" + std::to_string(a.hc) + " (the kernel is built for 4)");
  if (a.d <= 0 || a.d % kChannels != 0 || a.d / kChannels > 0x7FFFFFFF)
    return make_error(std::string(who) + ": d=" + std::to_string(a.d) + " must be a positive multiple of 32");
  if (a.n < 0 || a.sinkhorn_iters < 1)
    return make_error(std::string(who) + ": n=" + std::to_string(a.n) +
                      ", sinkhorn_iters=" + std::to_string(a.sinkhorn_iters));
  if (a.y && (!a.post || !a.comb || !a.X_out))
    return make_error(std::string(who) + ": expand (y given) needs post, comb and X_out");
  if (a.collapse_w && !a.collapsed) return make_error(std::string(who) + ": collapse_w given without collapsed");
  if (a.post_stride < 0 || a.comb_stride < 0 || a.collapse_w_stride < 0 || a.mix_stride < 0)
    return make_error(std::string(who) + ": negative row stride");
  return Status::Ok();
}

}  // namespace

Status mhc_cluster_supported(int64_t d) {
  if (d <= 0 || d % kChannels != 0)
    return make_error("cuda::mhc_fused_cluster: d=" + std::to_string(d) + " must be a positive multiple of 32");
  int64_t cpb = 0;
  const size_t smem = mhc_cluster_smem(d, &cpb);
  int dev = 0, optin = 0, cc_major = 0;
  CEDAR_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (cc_major < 9) return make_error("cuda::mhc_fused_cluster: needs thread-block clusters (compute capability 9.0+)");
  if (smem + 4096 > static_cast<size_t>(optin))
    return make_error("cuda::mhc_fused_cluster: d=" + std::to_string(d) + " needs " + std::to_string(smem) +
                      " bytes of shared memory per block, the device allows " + std::to_string(optin));
  CEDAR_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(mhc_cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CEDAR_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(mhc_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(kClusterBlocks);
  cfg.blockDim = dim3(kClThreads);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kClusterBlocks;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  CEDAR_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveClusters(&clusters, mhc_cluster_kernel, &cfg));
  if (clusters < 1)
    return make_error("cuda::mhc_fused_cluster: the device cannot co-schedule a cluster of " +
                      std::to_string(kClusterBlocks) + " blocks with " + std::to_string(smem) + " bytes each");
  return Status::Ok();
}

Status mhc_fused_cluster(const MhcFusedArgs& in, cudaStream_t stream, bool programmatic_launch) {
  const char* who = "cuda::mhc_fused_cluster";
  CEDAR_RETURN_IF_ERROR(check_mhc_args(in, who));
  const MhcFusedArgs a = resolve_strides(in);
  if (!a.X || !a.fn || !a.base || !a.scale || !a.mix_out)
    return make_error(std::string(who) + ": X, fn, base, scale and mix_out are required");
  if (reinterpret_cast<uintptr_t>(a.fn) % 16 != 0) return make_error(std::string(who) + ": fn must be 16-byte aligned");
  if (a.n == 0) return Status::Ok();
  const int64_t tiles = (a.n + kMaxTokens - 1) / kMaxTokens;
  if (tiles * kClusterBlocks > 0x7FFFFFFF)
    return make_error(std::string(who) + ": n=" + std::to_string(a.n) + " too large");
  int64_t cpb = 0;
  const size_t smem = mhc_cluster_smem(a.d, &cpb);
  // The attributes are per function: setting them again costs nothing and keeps the call self-contained.
  CEDAR_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(mhc_cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CEDAR_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(mhc_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(tiles * kClusterBlocks));
  cfg.blockDim = dim3(kClThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kClusterBlocks;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic_launch ? 2 : 1;
  MhcClusterArgs args{a, cpb};
  CEDAR_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, mhc_cluster_kernel, args));
  return launch_status("mhc_cluster_kernel");
}

const void* mhc_cluster_kernel_ptr() { return reinterpret_cast<const void*>(&mhc_cluster_kernel); }

}  // namespace cedar::cuda
