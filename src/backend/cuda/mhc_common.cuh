// Device pieces shared by the fused mHC kernels (mhc.cu: decode / streaming / elementwise, mhc_norm.cu
// and mhc_cluster.cu): the channel-local expand and collapse (bit-exact with model/mhc.h), the
// coefficients of one token from its 24 dot products and sum of squares (hc_mix's op order), and the
// RMSNorm of a collapsed row with rms_norm's bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/norm_row.cuh"

namespace cedar::cuda::mhc_detail {

constexpr int kHc = 4;
constexpr int kMix = (2 + kHc) * kHc;  // 24
constexpr int kSlot = kMix + 1;        // 24 dot products + the sum of squares
constexpr int kChannels = 32;          // d % 32 == 0
constexpr int kMaxTokens = 8;          // tokens per decode tile

// MhcFusedArgs with every row stride resolved (0 → packed).
inline MhcFusedArgs resolve_strides(const MhcFusedArgs& a) {
  MhcFusedArgs r = a;
  if (r.post_stride == 0) r.post_stride = kHc;
  if (r.comb_stride == 0) r.comb_stride = kHc * kHc;
  if (r.collapse_w_stride == 0) r.collapse_w_stride = kHc;
  if (r.mix_stride == 0) r.mix_stride = kMix;
  return r;
}

// Entry r of a token's mix row as the streaming / decode kernels stage it: post[4], comb[16],
// collapse_w[4] (kCoef floats); absent inputs (no expand: no y; no collapse weights) are zeros.
constexpr int kCoef = 2 * kHc + kHc * kHc + kHc;
__device__ __forceinline__ float mix_coefficient(const MhcFusedArgs& a, int64_t tok, int r) {
  if (r < kHc) return a.y ? a.post[tok * a.post_stride + r] : 0.0f;
  if (r < kHc + kHc * kHc) return a.y ? a.comb[tok * a.comb_stride + (r - kHc)] : 0.0f;
  return a.collapse_w ? a.collapse_w[tok * a.collapse_w_stride + (r - kHc - kHc * kHc)] : 0.0f;
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// X'_k = bf16(post_k·y + Σ_j comb[j,k]·X_j), the Σ in stream order, no contraction (hc_expand).
// cf: the token's post[4] then comb[16] (e.g. from shared memory).
__device__ __forceinline__ void expand_channel(const float (&x)[kHc], float y, const float* post, const float* comb,
                                               float (&v)[kHc]) {
#pragma unroll
  for (int k = 0; k < kHc; ++k) {
    float mixed = __fmul_rn(comb[k], x[0]);
#pragma unroll
    for (int j = 1; j < kHc; ++j) mixed = __fadd_rn(mixed, __fmul_rn(comb[j * kHc + k], x[j]));
    v[k] = detail::round_bf16(__fadd_rn(__fmul_rn(post[k], y), mixed));
  }
}

// bf16(Σ_k w_k·X_k) in stream order (hc_collapse).
__device__ __forceinline__ float collapse_channel(const float (&v)[kHc], const float* w) {
  float acc = __fmul_rn(w[0], v[0]);
#pragma unroll
  for (int k = 1; k < kHc; ++k) acc = __fadd_rn(acc, __fmul_rn(w[k], v[k]));
  return detail::round_bf16(acc);
}

// __frcp_rn without its out-of-line slow path: MUFU.RCP + one FMA Newton step (the fast path of rcp.rn),
// valid (correctly rounded) for normal |x| well inside the exponent range. __frcp_rn's range check and
// call per reciprocal serialize the 4 independent reciprocals of a Sinkhorn half-step (~0.4 µs per
// iteration measured); here one check covers all 4 and the rare out-of-range case takes __frcp_rn.
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ bool rcp_fast_range(float x) {
  const float ax = fabsf(x);
  return ax > 0x1p-100f && ax < 0x1p100f;
}
__device__ __forceinline__ void reciprocals4(const float (&s)[kHc], float (&r)[kHc]) {
  if (rcp_fast_range(s[0]) && rcp_fast_range(s[1]) && rcp_fast_range(s[2]) && rcp_fast_range(s[3])) {
#pragma unroll
    for (int k = 0; k < kHc; ++k) {
      const float r0 = rcp_approx_ftz(s[k]);
      r[k] = __fmaf_rn(r0, __fmaf_rn(-s[k], r0, 1.0f), r0);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kHc; ++k) r[k] = __frcp_rn(s[k]);
  }
}

using detail::cp_async_wait_all;  // cp_async.cuh

// The streaming kernels' 3xTF32 pieces (mhc.cu, mhc_stream_c64.cu): x = big + small with
// |x − big − small| <= 2^-24·|x|, and D += A·B on m16n8k8 (TF32 in, fp32 accumulate; fragments as in the
// PTX ISA: a = rows g, g+8 × cols t, t+4; b = rows t, t+4 × col g; d = rows g, g+8 × cols 2t, 2t+1).
__device__ __forceinline__ uint32_t tf32_rna(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
  big = tf32_rna(x);
  small = tf32_rna(x - __uint_as_float(big));
}
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One token's kSlot sums over the stream splits, in split order: lane l takes splits l, l + 32, ...,
// then a fixed butterfly (every lane ends with the totals). partials: [split][n][kSlot].
__device__ __forceinline__ void sum_token_splits(const float* partials, int64_t n, int64_t tok, int splits, int lane,
                                                 float (&m)[kSlot]) {
#pragma unroll
  for (int i = 0; i < kSlot; ++i) m[i] = 0.0f;
  for (int s = lane; s < splits; s += 32) {
    const float* row = partials + (static_cast<int64_t>(s) * n + tok) * kSlot;
    float v[kSlot];
#pragma unroll
    for (int i = 0; i < kSlot; ++i) v[i] = __ldcg(row + i);
#pragma unroll
    for (int i = 0; i < kSlot; ++i) m[i] += v[i];
  }
#pragma unroll
  for (int i = 0; i < kSlot; ++i) m[i] = detail::warp_sum(m[i]);
}

// The coefficients of one token by one thread, all in registers (hc_mix's op order, model/mhc.cpp):
// m = dot·rstd, pre = sigmoid(m·s0 + b) + eps, post = 2·sigmoid(m·s1 + b), comb = row softmax + eps,
// then the Sinkhorn (column first and last). The normalizations multiply by a correctly rounded
// reciprocal of (Σ + eps) instead of dividing (<= 1 ulp from the CPU's quotient, contracted by the
// next normalization): 4 reciprocals and 16 multiplications per half-step, the 20 iterations' serial
// chain ~1 µs. out: the mix row (pre[4], post[4], comb[16]).
// kFastRcp: the Sinkhorn's 4 reciprocals of a half-step by reciprocals4 (one range check for all 4; the
// same bits as __frcp_rn, whose fast path is the same MUFU.RCP + FMA step): no call per reciprocal.
template <bool kFastRcp = false>
__device__ __forceinline__ void finish_mix(const float (&m)[kSlot], const MhcFusedArgs& a, float* out) {
  const float width = static_cast<float>(kHc * a.d);
  const float rstd = 1.0f / sqrtf(m[kMix] / width + a.norm_eps);
  const float eps = a.hc_eps;
  const float s0 = a.scale[0], s1 = a.scale[1], s2 = a.scale[2];
#pragma unroll
  for (int k = 0; k < kHc; ++k) {
    out[k] = __fadd_rn(sigmoidf(__fadd_rn(__fmul_rn(__fmul_rn(m[k], rstd), s0), a.base[k])), eps);
    out[kHc + k] = 2.0f * sigmoidf(__fadd_rn(__fmul_rn(__fmul_rn(m[kHc + k], rstd), s1), a.base[kHc + k]));
  }
  float c[kHc][kHc];
#pragma unroll
  for (int j = 0; j < kHc; ++j) {
#pragma unroll
    for (int k = 0; k < kHc; ++k) {
      const int idx = 2 * kHc + j * kHc + k;
      c[j][k] = __fadd_rn(__fmul_rn(__fmul_rn(m[idx], rstd), s2), a.base[idx]);
    }
    const float mx = fmaxf(fmaxf(fmaxf(c[j][0], c[j][1]), c[j][2]), c[j][3]);
#pragma unroll
    for (int k = 0; k < kHc; ++k) c[j][k] = expf(c[j][k] - mx);
    const float sum = __fadd_rn(__fadd_rn(__fadd_rn(c[j][0], c[j][1]), c[j][2]), c[j][3]);
#pragma unroll
    for (int k = 0; k < kHc; ++k) c[j][k] = __fadd_rn(c[j][k] / sum, eps);
  }
#pragma unroll 1
  for (int64_t it = 0; it < a.sinkhorn_iters; ++it) {
    if (it > 0) {  // rows (the first normalization is a column one)
      if constexpr (kFastRcp) {
        float sm[kHc], r[kHc];
#pragma unroll
        for (int j = 0; j < kHc; ++j)
          sm[j] = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[j][0], c[j][1]), c[j][2]), c[j][3]), eps);
        reciprocals4(sm, r);
#pragma unroll
        for (int j = 0; j < kHc; ++j)
#pragma unroll
          for (int k = 0; k < kHc; ++k) c[j][k] = __fmul_rn(c[j][k], r[j]);
      } else {
#pragma unroll
        for (int j = 0; j < kHc; ++j) {
          const float r =
              __frcp_rn(__fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[j][0], c[j][1]), c[j][2]), c[j][3]), eps));
#pragma unroll
          for (int k = 0; k < kHc; ++k) c[j][k] = __fmul_rn(c[j][k], r);
        }
      }
    }
    if constexpr (kFastRcp) {
      float sm[kHc], r[kHc];
#pragma unroll
      for (int k = 0; k < kHc; ++k)
        sm[k] = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[0][k], c[1][k]), c[2][k]), c[3][k]), eps);
      reciprocals4(sm, r);
#pragma unroll
      for (int j = 0; j < kHc; ++j)
#pragma unroll
        for (int k = 0; k < kHc; ++k) c[j][k] = __fmul_rn(c[j][k], r[k]);
    } else {
#pragma unroll
      for (int k = 0; k < kHc; ++k) {
        const float r = __frcp_rn(__fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[0][k], c[1][k]), c[2][k]), c[3][k]), eps));
#pragma unroll
        for (int j = 0; j < kHc; ++j) c[j][k] = __fmul_rn(c[j][k], r);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kHc; ++j)
#pragma unroll
    for (int k = 0; k < kHc; ++k) out[2 * kHc + j * kHc + k] = c[j][k];
}

// The coefficients of one token by one warp (finish_mix's arithmetic, op for op): lane l < 24 maps
// value l (sigmoid for pre / post, the row softmax of comb with the row's max and sum gathered by
// shuffles in the CPU's order), then every lane runs the Sinkhorn on all 16 in registers with
// reciprocals4 (no shuffles or divisions in the 20-iteration chain: ~50 cycles per half-step). m: the
// token's 25 sums (e.g. shared memory, read by every lane). out: the mix row; lanes 0..7 store pre /
// post, lane 0 the comb.
__device__ __forceinline__ void finish_mix_warp(const float* m, const MhcFusedArgs& a, float* out, int lane) {
  const float width = static_cast<float>(kHc * a.d);
  const float rstd = 1.0f / sqrtf(m[kMix] / width + a.norm_eps);
  const float eps = a.hc_eps;
  const int i = lane < kMix ? lane : kMix - 1;
  const float s = a.scale[i < kHc ? 0 : (i < 2 * kHc ? 1 : 2)];
  const float z = __fadd_rn(__fmul_rn(__fmul_rn(m[i], rstd), s), a.base[i]);
  if (lane < kHc)
    out[lane] = __fadd_rn(sigmoidf(z), eps);
  else if (lane < 2 * kHc)
    out[lane] = 2.0f * sigmoidf(z);
  // comb rows: lanes 8 + 4j .. 8 + 4j + 3 (lanes outside 8..23 compute a copy of row 3 and discard it).
  const int row0 = lane >= 2 * kHc && lane < kMix ? (lane & ~3) : kMix - kHc;
  float zr[kHc];
#pragma unroll
  for (int k = 0; k < kHc; ++k) zr[k] = __shfl_sync(detail::kFullMask, z, row0 + k);
  const float mx = fmaxf(fmaxf(fmaxf(zr[0], zr[1]), zr[2]), zr[3]);
  const float e = expf(z - mx);
  float er[kHc];
#pragma unroll
  for (int k = 0; k < kHc; ++k) er[k] = __shfl_sync(detail::kFullMask, e, row0 + k);
  const float sum = __fadd_rn(__fadd_rn(__fadd_rn(er[0], er[1]), er[2]), er[3]);
  const float cv = __fadd_rn(e / sum, eps);
  float c[kHc][kHc];
#pragma unroll
  for (int j = 0; j < kHc; ++j)
#pragma unroll
    for (int k = 0; k < kHc; ++k) c[j][k] = __shfl_sync(detail::kFullMask, cv, 2 * kHc + j * kHc + k);
#pragma unroll 1
  for (int64_t it = 0; it < a.sinkhorn_iters; ++it) {
    float sm[kHc], r[kHc];
    if (it > 0) {  // rows (the first normalization is a column one)
#pragma unroll
      for (int j = 0; j < kHc; ++j)
        sm[j] = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[j][0], c[j][1]), c[j][2]), c[j][3]), eps);
      reciprocals4(sm, r);
#pragma unroll
      for (int j = 0; j < kHc; ++j)
#pragma unroll
        for (int k = 0; k < kHc; ++k) c[j][k] = __fmul_rn(c[j][k], r[j]);
    }
#pragma unroll
    for (int k = 0; k < kHc; ++k)
      sm[k] = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[0][k], c[1][k]), c[2][k]), c[3][k]), eps);
    reciprocals4(sm, r);
#pragma unroll
    for (int j = 0; j < kHc; ++j)
#pragma unroll
      for (int k = 0; k < kHc; ++k) c[j][k] = __fmul_rn(c[j][k], r[k]);
  }
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < kHc; ++j)
#pragma unroll
      for (int k = 0; k < kHc; ++k) out[2 * kHc + j * kHc + k] = c[j][k];
  }
}

// Reduce-scatter of 32 values per lane over a warp (31 shuffles): afterwards lane i holds the warp's
// sum of value i in v[0], in a fixed order (deterministic). One level per template instance, so
// every index is a compile-time constant (a runtime loop over the levels puts v in local memory).
template <int kHalf>
__device__ __forceinline__ void reduce_scatter_level(float (&v)[32], bool upper) {
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float keep = upper ? v[i + kHalf] : v[i];
    const float send = upper ? v[i] : v[i + kHalf];
    v[i] = keep + __shfl_xor_sync(detail::kFullMask, send, kHalf);
  }
}
__device__ __forceinline__ void warp_reduce_scatter32(float (&v)[32], int lane) {
  reduce_scatter_level<16>(v, (lane & 16) != 0);
  reduce_scatter_level<8>(v, (lane & 8) != 0);
  reduce_scatter_level<4>(v, (lane & 4) != 0);
  reduce_scatter_level<2>(v, (lane & 2) != 0);
  reduce_scatter_level<1>(v, (lane & 1) != 0);
}

// ---- the input RMSNorm of collapsed rows, rms_norm's bits: norm_row.cuh -----------------------------

using detail::kNormBatch;
using detail::kNormThreads;
using detail::norm_row;

// The critical half of a split decode site in one launch (mhc_norm.cu): expand (if a.y) + collapse +
// normed = rms_norm(collapsed) for a.n <= kMhcNormFuseMaxTokens rows, fn unused. a: strides resolved,
// a.normed and a.collapse_w set; counter: MhcWorkspace::norm_counter (zero; re-armed by the kernel).
Status launch_expand_collapse_norm(const MhcFusedArgs& a, unsigned* counter, cudaStream_t stream);
// The same job as one thread-block cluster, no ticket (mhc_site_cluster.cu, a.site_cluster): when the shape
// fits (site_cluster_fits: n <= kMhcNormFuseMaxTokens, d a multiple of 256, n·max(256, d/8) <= 1024 threads).
bool site_cluster_fits(const MhcFusedArgs& a);
Status launch_site_cluster(const MhcFusedArgs& a, cudaStream_t stream);

// ---- the streaming (prefill) path in 64-channel chunks (mhc_stream_c64.cu, s8-mhcstream) -----------

constexpr int kC64Tokens = 32;    // tokens per tile
constexpr int kC64Channels = 64;  // channels per chunk: 256-byte runs per (token, stream) row
struct Stream64Plan {
  int64_t tiles = 0, splits = 0, chunks_per_split = 0;
};
// d % 64 == 0, X / y / fn 16-byte and X_out / collapsed 8-byte aligned (the caller checks n, the
// 32-bit offsets and the workspace).
bool stream64_supported(const MhcFusedArgs& a);
// Channel splits for about `target` blocks (<= 0: the default, 6 blocks per SM from 128 tiles on, else 4).
Stream64Plan stream64_plan(int64_t n, int64_t d, int64_t target);
// mhc_stream_c64_kernel: partials[split][n][kSlot] for the plan's splits (a: strides resolved).
Status launch_stream64(const MhcFusedArgs& a, const Stream64Plan& plan, float* partials, cudaStream_t stream);
// The splits' partials of every token summed (mhc_stream_finish_kernel's order) and the coefficients by
// one lane per token (finish_mix<true>: the same bits as the serial finish kernel).
Status launch_stream_finish_lanes(const MhcFusedArgs& a, const float* partials, int64_t splits, cudaStream_t stream);

}  // namespace cedar::cuda::mhc_detail
