// Fused single-pass mHC kernel (§3.3): expand + collapse + the next site's coefficients (RMS-scaled
// GEMV with fn, sigmoid/softmax, Sinkhorn) in one launch.
//
// Each block owns 32 channels of every stream (128 threads: warp k = stream k, lane = channel), so
// expand and collapse are channel-local. H needs a reduction over all hc·d channels: each block
// writes its partial dot products (24 + the sum of squares, per token) to a workspace slot, and the
// last block to finish (atomic ticket, threadfence-reduction pattern) sums the slots in block order —
// deterministic — and runs the Sinkhorn: one warp per two tokens, lane = entry (j, k) of the 4×4
// matrix, sums gathered in index order to round as the CPU oracle does.
#include <cooperative_groups.h>

#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/kernels.h"

namespace cedar::cuda {
namespace {

constexpr int kHc = 4;
constexpr int kMix = (2 + kHc) * kHc;  // 24
constexpr int kSlot = kMix + 1;        // 24 dot products + the sum of squares
constexpr int kChannels = 32;          // per block
constexpr int kThreads = kHc * kChannels;
constexpr int kMaxTokens = 8;          // tokens per launch (the host loops over tiles)

struct MhcKernelArgs {
  MhcFusedArgs a;
  float* partials;  // [n][kSlot][gridDim.x]
  unsigned* counter;
};

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// Sum of the 4 values held by lanes base, base+stride, base+2·stride, base+3·stride, in that order.
__device__ __forceinline__ float ordered_sum4(float v, int base, int stride) {
  const float v0 = __shfl_sync(detail::kFullMask, v, base);
  const float v1 = __shfl_sync(detail::kFullMask, v, base + stride);
  const float v2 = __shfl_sync(detail::kFullMask, v, base + 2 * stride);
  const float v3 = __shfl_sync(detail::kFullMask, v, base + 3 * stride);
  return __fadd_rn(__fadd_rn(__fadd_rn(v0, v1), v2), v3);
}

__device__ __forceinline__ float ordered_max4(float v, int base, int stride) {
  float m = __shfl_sync(detail::kFullMask, v, base);
  for (int i = 1; i < 4; ++i) m = fmaxf(m, __shfl_sync(detail::kFullMask, v, base + i * stride));
  return m;
}

// Coefficients of one token from its reduced m (unscaled dot products) and sum of squares; `lane16`
// is the entry (j = lane16/4, k = lane16%4) this lane owns. All 32 lanes call it (two tokens per warp).
__device__ void finish_token(const MhcFusedArgs& a, int tok, const float* m_raw, float ss, int lane16, bool active) {
  const int half = (threadIdx.x & 31) & 16;  // lane offset of this token's 16 lanes
  const int j = lane16 >> 2, k = lane16 & 3;
  const float width = static_cast<float>(kHc * a.d);
  const float rstd = 1.0f / sqrtf(ss / width + a.norm_eps);
  const float eps = a.hc_eps;
  float* out = a.mix_out + static_cast<int64_t>(tok) * kMix;
  // pre (j == 0) and post (j == 1) lanes.
  if (active && j == 0) out[k] = sigmoidf(__fadd_rn(__fmul_rn(__fmul_rn(m_raw[k], rstd), a.scale[0]), a.base[k])) + eps;
  if (active && j == 1)
    out[kHc + k] = 2.0f * sigmoidf(__fadd_rn(__fmul_rn(__fmul_rn(m_raw[kHc + k], rstd), a.scale[1]), a.base[kHc + k]));
  // comb: softmax over k of row j, + eps, then column / row normalizations.
  const int idx = 2 * kHc + j * kHc + k;
  float c = __fadd_rn(__fmul_rn(__fmul_rn(m_raw[idx], rstd), a.scale[2]), a.base[idx]);
  const int row_base = half + j * kHc, col_base = half + k;
  const float mx = ordered_max4(c, row_base, 1);
  c = expf(c - mx);
  const float sum = ordered_sum4(c, row_base, 1);
  c = __fadd_rn(c / sum, eps);
  c = c / __fadd_rn(ordered_sum4(c, col_base, kHc), eps);
  for (int64_t it = 1; it < a.sinkhorn_iters; ++it) {
    c = c / __fadd_rn(ordered_sum4(c, row_base, 1), eps);
    c = c / __fadd_rn(ordered_sum4(c, col_base, kHc), eps);
  }
  if (active) out[2 * kHc + j * kHc + k] = c;
}

__global__ void __launch_bounds__(kThreads) mhc_fused_kernel(MhcKernelArgs args) {
  const MhcFusedArgs& a = args.a;
  __shared__ float xs[kMaxTokens][kHc][kChannels];
  __shared__ float xn[kMaxTokens][kHc][kChannels];
  __shared__ float red[kMaxTokens][kHc][kSlot];
  __shared__ bool is_last;
  const int k = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kChannels + lane;
  const int64_t d = a.d, width = kHc * a.d;
  const int n = static_cast<int>(a.n);

  // fn does not depend on X: its loads go first so their latency overlaps the expand.
  float fw[kMix];
#pragma unroll
  for (int i = 0; i < kMix; ++i) fw[i] = __ldg(a.fn + i * width + k * d + c);
  // Stage X (every thread reads its own (stream, channel) for each token) so X_out may alias X.
  for (int t = 0; t < n; ++t) xs[t][k][lane] = a.X[t * width + k * d + c];
  __syncthreads();
  for (int t = 0; t < n; ++t) {
    float v = xs[t][k][lane];
    if (a.y) {  // X'_k = bf16(post_k·y + Σ_j comb[j,k]·X_j), sums in stream order, no contraction
      const float* cb = a.comb + t * kHc * kHc;
      float mixed = __fmul_rn(cb[k], xs[t][0][lane]);
      for (int jj = 1; jj < kHc; ++jj) mixed = __fadd_rn(mixed, __fmul_rn(cb[jj * kHc + k], xs[t][jj][lane]));
      v = detail::round_bf16(__fadd_rn(__fmul_rn(a.post[t * kHc + k], a.y[t * d + c]), mixed));
      a.X_out[t * width + k * d + c] = v;
    }
    xn[t][k][lane] = v;
  }
  __syncthreads();
  if (a.collapse_w && k == 0) {
    for (int t = 0; t < n; ++t) {
      const float* w = a.collapse_w + t * kHc;
      float acc = __fmul_rn(w[0], xn[t][0][lane]);
      for (int kk = 1; kk < kHc; ++kk) acc = __fadd_rn(acc, __fmul_rn(w[kk], xn[t][kk][lane]));
      a.collapsed[t * d + c] = detail::round_bf16(acc);
    }
  }
  // Partial dot products of this block's 128 channels with the 24 rows of fn (loaded at the top), per token.
  // The warp's 32 lanes reduce their 25 values (24 products + the square, padded to 32) with a
  // reduce-scatter butterfly: 31 shuffles instead of 25 × 5, and lane i ends with the sum of value i
  // (a fixed order: deterministic).
  for (int t = 0; t < n; ++t) {
    const float x = xn[t][k][lane];
    float v[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = i < kMix ? fw[i] * x : (i == kMix ? x * x : 0.0f);
#pragma unroll
    for (int half = 16; half >= 1; half >>= 1) {
      const bool upper = (lane & half) != 0;
#pragma unroll
      for (int i = 0; i < half; ++i) {
        const float keep = upper ? v[i + half] : v[i];
        const float send = upper ? v[i] : v[i + half];
        v[i] = keep + __shfl_xor_sync(detail::kFullMask, send, half);
      }
    }
    if (lane < kSlot) red[t][k][lane] = v[0];
  }
  __syncthreads();
  const int64_t blocks = gridDim.x;
  for (int e = threadIdx.x; e < n * kSlot; e += kThreads) {
    const int t = e / kSlot, i = e % kSlot;
    const float s = ((red[t][0][i] + red[t][1][i]) + red[t][2][i]) + red[t][3][i];
    args.partials[(static_cast<int64_t>(t) * kSlot + i) * blocks + blockIdx.x] = s;
  }
  // Last block: reduce the slots in block order and finish every token.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(args.counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  __shared__ float m_all[kMaxTokens][kSlot];
  // Warp-per-slot sums, kPer slots per warp at once (independent loads in flight); lanes stride the
  // blocks, then a fixed shuffle tree: the order is fixed, so the result is deterministic.
  constexpr int kPer = 8;
  const int total = n * kSlot;
  for (int e0 = (threadIdx.x >> 5) * kPer; e0 < total; e0 += (kThreads / 32) * kPer) {
    float s[kPer];
#pragma unroll
    for (int q = 0; q < kPer; ++q) s[q] = 0.0f;
    for (int64_t b = lane; b < blocks; b += 32) {
#pragma unroll
      for (int q = 0; q < kPer; ++q)
        if (e0 + q < total) s[q] += __ldcg(args.partials + static_cast<int64_t>(e0 + q) * blocks + b);
    }
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const float v = detail::warp_sum(s[q]);
      if (lane == 0 && e0 + q < total) m_all[(e0 + q) / kSlot][(e0 + q) % kSlot] = v;
    }
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  for (int t0 = 2 * warp; t0 < n; t0 += 2 * (kThreads / 32)) {
    const int tok = t0 + (lane >> 4);
    const bool active = tok < n;
    const int tt = active ? tok : t0;  // inactive lanes mirror a valid token so the shuffles stay uniform
    finish_token(a, tt, m_all[tt], m_all[tt][kMix], lane & 15, active);
  }
  if (threadIdx.x == 0) *args.counter = 0;  // ready for the next launch / graph replay
}


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

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned phase) {
  asm volatile(
      "{\n .reg .pred p;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(phase)
      : "memory");
}

// Coefficients of one token by one thread: the CPU's op order (mhc.cpp hc_mix) with the Sinkhorn
// normalizations as multiplications by a correctly rounded reciprocal (16 independent divisions per
// half-step would dominate a single thread; the reciprocal differs from a division by <= 1 ulp, and
// each normalization contracts the error).
__device__ void finish_token_serial(const MhcFusedArgs& a, int64_t tok, const float* m_raw) {
  const float width = static_cast<float>(kHc * a.d);
  const float rstd = 1.0f / sqrtf(m_raw[kMix] / width + a.norm_eps);
  const float eps = a.hc_eps;
  float* out = a.mix_out + tok * kMix;
  for (int k = 0; k < kHc; ++k) {
    out[k] = __fadd_rn(sigmoidf(__fadd_rn(__fmul_rn(__fmul_rn(m_raw[k], rstd), a.scale[0]), a.base[k])), eps);
    out[kHc + k] = 2.0f * sigmoidf(__fadd_rn(__fmul_rn(__fmul_rn(m_raw[kHc + k], rstd), a.scale[1]), a.base[kHc + k]));
  }
  float c[kHc][kHc];
#pragma unroll
  for (int j = 0; j < kHc; ++j) {
#pragma unroll
    for (int k = 0; k < kHc; ++k) {
      const int idx = 2 * kHc + j * kHc + k;
      c[j][k] = __fadd_rn(__fmul_rn(__fmul_rn(m_raw[idx], rstd), a.scale[2]), a.base[idx]);
    }
    const float mx = fmaxf(fmaxf(fmaxf(c[j][0], c[j][1]), c[j][2]), c[j][3]);
#pragma unroll
    for (int k = 0; k < kHc; ++k) c[j][k] = expf(c[j][k] - mx);
    const float sum = __fadd_rn(__fadd_rn(__fadd_rn(c[j][0], c[j][1]), c[j][2]), c[j][3]);
#pragma unroll
    for (int k = 0; k < kHc; ++k) c[j][k] = __fadd_rn(c[j][k] / sum, eps);
  }
  auto columns = [&] {
#pragma unroll
    for (int k = 0; k < kHc; ++k) {
      const float r = __frcp_rn(__fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[0][k], c[1][k]), c[2][k]), c[3][k]), eps));
#pragma unroll
      for (int j = 0; j < kHc; ++j) c[j][k] = __fmul_rn(c[j][k], r);
    }
  };
  auto rows = [&] {
#pragma unroll
    for (int j = 0; j < kHc; ++j) {
      const float r = __frcp_rn(__fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[j][0], c[j][1]), c[j][2]), c[j][3]), eps));
#pragma unroll
      for (int k = 0; k < kHc; ++k) c[j][k] = __fmul_rn(c[j][k], r);
    }
  };
  columns();
  for (int64_t it = 1; it < a.sinkhorn_iters; ++it) {
    rows();
    columns();
  }
#pragma unroll
  for (int j = 0; j < kHc; ++j)
#pragma unroll
    for (int k = 0; k < kHc; ++k) out[2 * kHc + j * kHc + k] = c[j][k];
}

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
  const int64_t ncl = ce > cb ? (ce - cb) * kChannels : 0;  // channels of this block
  const int64_t stride = args.chunks_per_block * kChannels;  // floats per (row, stream) in shared memory
  const int64_t c_begin = cb * kChannels;
  float* fs = dyn;                          // [kMix][kHc][stride]
  float* xn = dyn + kMix * kHc * stride;    // [kMaxTokens][kHc][stride]
  const int64_t t0 = tile * kMaxTokens;
  const int nt = static_cast<int>(a.n - t0 < kMaxTokens ? a.n - t0 : kMaxTokens);

  if (tid == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(&bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (tid == 0 && ncl > 0) {
    const unsigned bytes = static_cast<unsigned>(ncl * sizeof(float));
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(&bar)),
                 "r"(bytes * kMix * kHc)
                 : "memory");
    for (int i = 0; i < kMix; ++i)
      for (int k = 0; k < kHc; ++k)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                smem_u32(fs + (i * kHc + k) * stride)),
            "l"(a.fn + i * width + k * d + c_begin), "r"(bytes), "r"(smem_u32(&bar))
            : "memory");
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
      const float* cmb = a.comb + tok * kHc * kHc;
#pragma unroll
      for (int k = 0; k < kHc; ++k) {
        float mixed = __fmul_rn(cmb[k], x[0]);
        for (int jj = 1; jj < kHc; ++jj) mixed = __fadd_rn(mixed, __fmul_rn(cmb[jj * kHc + k], x[jj]));
        v[k] = detail::round_bf16(__fadd_rn(__fmul_rn(a.post[tok * kHc + k], a.y[tok * d + c]), mixed));
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
      const float* w = a.collapse_w + tok * kHc;
      float acc = __fmul_rn(w[0], v[0]);
      for (int kk = 1; kk < kHc; ++kk) acc = __fadd_rn(acc, __fmul_rn(w[kk], v[kk]));
      a.collapsed[tok * d + c] = detail::round_bf16(acc);
    }
  }
  if (ncl > 0) mbar_wait(&bar, 0);
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
#pragma unroll
    for (int half = 16; half >= 1; half >>= 1) {
      const bool upper = (lane & half) != 0;
#pragma unroll
      for (int i = 0; i < half; ++i) {
        const float keep = upper ? v[i + half] : v[i];
        const float send = upper ? v[i] : v[i + half];
        v[i] = keep + __shfl_xor_sync(detail::kFullMask, send, half);
      }
    }
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
    if (tid == 0) finish_token_serial(a, t0 + rank, m_tok);
  }
  cluster.sync();  // no block leaves while its partials may still be read
}

size_t mhc_cluster_smem(int64_t d, int64_t* chunks_per_block) {
  const int64_t n_chunks = d / kChannels;
  *chunks_per_block = (n_chunks + kClusterBlocks - 1) / kClusterBlocks;
  return static_cast<size_t>((kMix + kMaxTokens) * kHc * *chunks_per_block * kChannels) * sizeof(float);
}

Status check_mhc_args(const MhcFusedArgs& a, const char* who) {
  if (a.hc != kHc) return make_error(std::string(who) + ": hc=" + std::to_string(a.hc) + " (the kernel is built for 4)");
  if (a.d <= 0 || a.d % kChannels != 0 || a.d / kChannels > 0x7FFFFFFF)
    return make_error(std::string(who) + ": d=" + std::to_string(a.d) + " must be a positive multiple of 32");
  if (a.n < 0 || a.sinkhorn_iters < 1)
    return make_error(std::string(who) + ": n=" + std::to_string(a.n) + ", sinkhorn_iters=" + std::to_string(a.sinkhorn_iters));
  if (a.y && (!a.post || !a.comb || !a.X_out))
    return make_error(std::string(who) + ": expand (y given) needs post, comb and X_out");
  if (a.collapse_w && !a.collapsed) return make_error(std::string(who) + ": collapse_w given without collapsed");
  return Status::Ok();
}

}  // namespace

int64_t mhc_workspace_floats(int64_t n, int64_t d) {
  const int64_t tile = n < kMaxTokens ? n : kMaxTokens;
  return tile * kSlot * ((d + kChannels - 1) / kChannels);
}

Status mhc_fused(const MhcFusedArgs& a, const MhcWorkspace& ws, cudaStream_t stream) {
  if (a.hc != kHc) return make_error("cuda::mhc_fused: hc=" + std::to_string(a.hc) + " (the kernel is built for 4)");
  if (a.d <= 0 || a.d % kChannels != 0 || a.d / kChannels > 0x7FFFFFFF)
    return make_error("cuda::mhc_fused: d=" + std::to_string(a.d) + " must be a positive multiple of 32");
  if (a.n < 0 || a.sinkhorn_iters < 1)
    return make_error("cuda::mhc_fused: n=" + std::to_string(a.n) + ", sinkhorn_iters=" + std::to_string(a.sinkhorn_iters));
  if (!a.X || !a.fn || !a.base || !a.scale || !a.mix_out || !ws.partials || !ws.counter)
    return make_error("cuda::mhc_fused: X, fn, base, scale, mix_out and the workspace are required");
  if (a.y && (!a.post || !a.comb || !a.X_out))
    return make_error("cuda::mhc_fused: expand (y given) needs post, comb and X_out");
  if (a.collapse_w && !a.collapsed) return make_error("cuda::mhc_fused: collapse_w given without collapsed");
  const unsigned grid = static_cast<unsigned>(a.d / kChannels);
  for (int64_t t0 = 0; t0 < a.n; t0 += kMaxTokens) {
    MhcKernelArgs k{a, ws.partials, ws.counter};
    const int64_t width = kHc * a.d;
    k.a.n = a.n - t0 < kMaxTokens ? a.n - t0 : kMaxTokens;
    k.a.X = a.X + t0 * width;
    if (a.y) {
      k.a.y = a.y + t0 * a.d;
      k.a.post = a.post + t0 * kHc;
      k.a.comb = a.comb + t0 * kHc * kHc;
      k.a.X_out = a.X_out + t0 * width;
    }
    if (a.collapse_w) {
      k.a.collapse_w = a.collapse_w + t0 * kHc;
      k.a.collapsed = a.collapsed + t0 * a.d;
    }
    k.a.mix_out = a.mix_out + t0 * kMix;
    mhc_fused_kernel<<<grid, kThreads, 0, stream>>>(k);
    CEDAR_RETURN_IF_ERROR(launch_status("mhc_fused_kernel"));
  }
  return Status::Ok();
}

Status mhc_cluster_supported(int64_t d) {
  if (d <= 0 || d % kChannels != 0) return make_error("cuda::mhc_fused_cluster: d=" + std::to_string(d) + " must be a positive multiple of 32");
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
  CEDAR_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(mhc_cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
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

Status mhc_fused_cluster(const MhcFusedArgs& a, cudaStream_t stream, bool programmatic_launch) {
  const char* who = "cuda::mhc_fused_cluster";
  CEDAR_RETURN_IF_ERROR(check_mhc_args(a, who));
  if (!a.X || !a.fn || !a.base || !a.scale || !a.mix_out)
    return make_error(std::string(who) + ": X, fn, base, scale and mix_out are required");
  if (reinterpret_cast<uintptr_t>(a.fn) % 16 != 0) return make_error(std::string(who) + ": fn must be 16-byte aligned");
  if (a.n == 0) return Status::Ok();
  const int64_t tiles = (a.n + kMaxTokens - 1) / kMaxTokens;
  if (tiles * kClusterBlocks > 0x7FFFFFFF) return make_error(std::string(who) + ": n=" + std::to_string(a.n) + " too large");
  int64_t cpb = 0;
  const size_t smem = mhc_cluster_smem(a.d, &cpb);
  // The attributes are per function: setting them again costs nothing and keeps the call self-contained.
  CEDAR_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(mhc_cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
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

const void* mhc_fused_kernel_ptr() { return reinterpret_cast<const void*>(&mhc_fused_kernel); }
const void* mhc_cluster_kernel_ptr() { return reinterpret_cast<const void*>(&mhc_cluster_kernel); }

}  // namespace cedar::cuda
