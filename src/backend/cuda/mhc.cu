// Fused single-pass mHC kernel (§3.3): expand + collapse + the next site's coefficients (RMS-scaled
// GEMV with fn, sigmoid/softmax, Sinkhorn) in one launch.
//
// Each block owns 32 channels of every stream (128 threads: warp k = stream k, lane = channel), so
// expand and collapse are channel-local. H needs a reduction over all hc·d channels: each block
// writes its partial dot products (24 + the sum of squares, per token) to a workspace slot, and the
// last block to finish (atomic ticket, threadfence-reduction pattern) sums the slots in block order —
// deterministic — and runs the Sinkhorn: one warp per two tokens, lane = entry (j, k) of the 4×4
// matrix, sums gathered in index order to round as the CPU oracle does.
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
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

const void* mhc_fused_kernel_ptr() { return reinterpret_cast<const void*>(&mhc_fused_kernel); }

}  // namespace cedar::cuda
