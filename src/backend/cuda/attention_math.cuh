// Device helpers of the attention kernels: bit-exact replicas of the CPU oracle's scalar arithmetic
// (core/numeric.cpp conversions and QDQ recipes, cpu::rms_norm, cpu::RopeTable::apply, exp_f32),
// packed-record addressing (kv_format.h layouts in paged blocks) and small block primitives.
// Every fp32 expression the CPU evaluates is written with __fmul_rn / __fadd_rn / __fdiv_rn so nvcc
// cannot contract it into an FMA (the CPU build has no FMA contraction: -std=c++20, x86-64 baseline).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda::detail {

__device__ __forceinline__ float nan_f() { return __int_as_float(0x7FC00000); }

// ---- scalar formats (core/numeric.cpp) -----------------------------------------------------------

// f32_to_e4m3: RNE, |x| >= 448 and Inf saturate to ±448, NaN → 0x7F/0xFF (cvt.rn.satfinite agrees).
__device__ __forceinline__ uint8_t f32_to_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}
// e4m3_to_f32 (exact; 0x7F/0xFF → NaN).
__device__ __forceinline__ float e4m3_to_f32(uint32_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code & 0xFF), __NV_E4M3);
  return __half2float(__half(h));
}

// f32_to_e2m1: RNE on the magnitude with the CPU's threshold counting (ties at 0.25, 1.25, 2.5, 5.0
// round down, at 0.75, 1.75, 3.5 up); NaN and ±Inf saturate to ±6; the sign bit is kept (−0 → 0x8).
__device__ __forceinline__ uint32_t f32_to_e2m1(float x) {
  const uint32_t sign = (__float_as_uint(x) >> 28) & 0x8u;
  const float a = fabsf(x);
  if (isnan(a)) return sign | 0x7u;
  const uint32_t code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return sign | code;
}
// e2m1 code (low 4 bits) → its value: ±{0, .5, 1, 1.5, 2, 3, 4, 6}.
__device__ __forceinline__ float e2m1_to_f32(uint32_t code) {
  const uint32_t m = code & 7u;
  const uint32_t bits = m >= 2 ? ((126u + (m >> 1)) << 23) | ((m & 1u) << 22) : (m == 1 ? 0x3F000000u : 0u);
  return __uint_as_float(bits | ((code & 8u) << 28));
}

// (float)exp((double)x): sparse_attention.cpp's exp_f32. The double exp differs from the host libm's
// by at most an ulp of double, so the rounded float agrees except when exp(x) lies within ~2^-29
// (relative) of a float rounding boundary.
__device__ __forceinline__ float exp_f32(float x) { return static_cast<float>(exp(static_cast<double>(x))); }

// ---- key records → bf16 (the sparse attention kernels' tile loaders) ------------------------------------

// 8 channels of a key record as loaded → 8 bf16 (exact). fp8 (SWA record): lo, hi are the e4m3 codes of
// channels 0..3 and 4..7, sb their UE8M0 block scale byte; fp4 (main KV record): lo holds the e2m1 codes
// (channel i at bits 4i..4i+3), sb their E4M3 block scale byte; neither (an absent key): zeros.
__device__ __forceinline__ uint4 key_chunk_to_bf16(bool fp8, bool fp4, uint32_t lo, uint32_t hi, uint32_t sb) {
  float v[8];
  if (fp8) {
    const float s = ue8m0_to_float(sb);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __fmul_rn(e4m3_to_f32(lo >> (8 * i)), s);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[4 + i] = __fmul_rn(e4m3_to_f32(hi >> (8 * i)), s);
  } else if (fp4) {
    const float s = e4m3_to_f32(sb);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(e2m1_to_f32(lo >> (4 * i)), s);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.0f;
  }
  uint4 out;
  out.x = pack_bf16x2_rn(v[0], v[1]);
  out.y = pack_bf16x2_rn(v[2], v[3]);
  out.z = pack_bf16x2_rn(v[4], v[5]);
  out.w = pack_bf16x2_rn(v[6], v[7]);
  return out;
}

// ---- QDQ recipes (core/numeric.cpp), for a block whose amax is known finite ----------------------

// FP8 activation / SWA recipe: scale byte of a finite block amax.
__device__ __forceinline__ uint32_t fp8_b32_scale_byte(float amax) {
  return ue8m0_ceil_pow2(__fmul_rn(fmaxf(amax, 1e-4f), 1.0f / 448.0f));
}
__device__ __forceinline__ uint8_t fp8_encode(float v, float s) {
  return f32_to_e4m3(fminf(fmaxf(__fdiv_rn(v, s), -448.0f), 448.0f));
}
// Main (global) KV recipe FP4 / E4M3 per 16: scale byte e4m3(max(amax, 6·2^-9) / 6).
__device__ __forceinline__ uint32_t fp4_b16_scale_byte(float amax) {
  return f32_to_e4m3(__fdiv_rn(fmaxf(amax, 6.0f * 0x1p-9f), 6.0f));
}
// Indexer K/Q recipe FP4 / UE8M0 per 32: scale byte ue8m0_ceil_pow2(max(amax, 6·2^-126) · fp32(1/6)).
__device__ __forceinline__ uint32_t fp4_b32_scale_byte(float amax) {
  return ue8m0_ceil_pow2(__fmul_rn(fmaxf(amax, 6.0f * 0x1p-126f), 1.0f / 6.0f));
}
__device__ __forceinline__ uint32_t fp4_encode(float v, float s) {
  return f32_to_e2m1(fminf(fmaxf(__fdiv_rn(v, s), -6.0f), 6.0f));
}

// ---- RoPE (cpu::RopeTable::apply) -----------------------------------------------------------------

// (e, o) ← (bf16(e·c − o·s), bf16(e·s + o·c)): rope_pair's rotation by an already loaded cos / sin.
__device__ __forceinline__ void rope_rotate(float c, float s, float& e, float& o) {
  const float ne = round_bf16(__fsub_rn(__fmul_rn(e, c), __fmul_rn(o, s)));
  const float no = round_bf16(__fadd_rn(__fmul_rn(e, s), __fmul_rn(o, c)));
  e = ne;
  o = no;
}

// Rotates the pair (e, o) = channels (2i, 2i+1) of the rope range at `pos` with the host table:
// (bf16(e·c − o·s), bf16(e·s + o·c)), s negated for the inverse. Positions outside the table give NaN.
__device__ __forceinline__ void rope_pair(const RopeTableView& t, int64_t pos, int64_t i, bool inverse, float& e,
                                          float& o) {
  float c = nan_f(), s = nan_f();
  if (pos >= 0 && pos < t.positions) {
    const float2 cs = *reinterpret_cast<const float2*>(t.cos_sin + pos * t.rope_dim + 2 * i);
    c = cs.x;
    s = inverse ? -cs.y : cs.y;
  }
  rope_rotate(c, s, e, o);
}

// ---- RMSNorm (cpu::rms_norm), bit-exact ------------------------------------------------------------

// 1 / sqrt(mean(x²) + eps) with the CPU's sequential fp32 sum of squares (one thread: the order is
// the result). x in shared or global memory.
__device__ __forceinline__ float rms_rstd_sequential(const float* x, int64_t dim, float eps) {
  float ss = 0.0f;
  for (int64_t c = 0; c < dim; ++c) ss = __fadd_rn(ss, __fmul_rn(x[c], x[c]));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(dim)), eps)));
}
// The same sequential sum over a 16-byte aligned shared-memory row, read 32 values ahead (eight float4
// loads, then their 32 products and adds in channel order): the dependent chain is the adds alone
// (~4 cycles each) instead of a shared-memory round trip every few channels. Bit-identical to
// rms_rstd_sequential (same operations in the same order); any dim (a scalar tail).
__device__ __forceinline__ float rms_rstd_sequential_smem(const float* xs, int64_t dim, float eps) {
  const float4* v = reinterpret_cast<const float4*>(xs);
  const int n4 = static_cast<int>(dim / 4);
  float ss = 0.0f;
  int i = 0;
  for (; i + 8 <= n4; i += 8) {
    float4 b[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) b[k] = v[i + k];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      ss = __fadd_rn(ss, __fmul_rn(b[k].x, b[k].x));
      ss = __fadd_rn(ss, __fmul_rn(b[k].y, b[k].y));
      ss = __fadd_rn(ss, __fmul_rn(b[k].z, b[k].z));
      ss = __fadd_rn(ss, __fmul_rn(b[k].w, b[k].w));
    }
  }
  for (int64_t c = 4 * static_cast<int64_t>(i); c < dim; ++c) ss = __fadd_rn(ss, __fmul_rn(xs[c], xs[c]));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(dim)), eps)));
}
// One normalized value: bf16(w · (x · r)) (w null: bf16(x · r)).
__device__ __forceinline__ float rms_apply(float x, float r, const float* w, int64_t c) {
  const float v = __fmul_rn(x, r);
  return round_bf16(w ? __fmul_rn(w[c], v) : v);
}
// rms_apply's value with the weight already loaded (its callers read the weights ahead; rms_apply keeps its load
// inside, where the compressor's code is tuned around it).
__device__ __forceinline__ float rms_scale(float x, float r, bool weighted, float w) {
  const float v = __fmul_rn(x, r);
  return round_bf16(weighted ? __fmul_rn(w, v) : v);
}

// ---- paged records ------------------------------------------------------------------------------------

__device__ __forceinline__ uint8_t* record_ptr(const PagedRecords& s, int64_t j) {
  const int64_t b = j / s.entries_per_block;
  return s.pool + static_cast<int64_t>(s.block_table[b]) * s.block_bytes + (j % s.entries_per_block) * s.record_bytes;
}

// ---- sparse attention kernel inputs ---------------------------------------------------------------------

// What the sparse attention kernels (sparse_attention.cu, sparse_attention_decode.cu) read of a call's
// SparseAttnArgs; each kernel's parameter struct adds its plan (key ranges, workspace) to it.
struct SparseAttnInputs {
  const float* q;
  const float* sink;
  float scale;
  bool bf16_p;
  int64_t heads, window;
  const AttnToken* tokens;
  const uint8_t* chunk_records;
  const SwaRingDesc* rings;
  const int32_t* topk;
  int64_t topk_width;  // 0 without top-k
  const KvSourceSeq* kv_seqs;
  RopeTableView rope;
  float* out;
};
inline SparseAttnInputs sparse_attn_inputs(const SparseAttnArgs& a) {
  const int64_t topk_width = a.topk != nullptr ? a.topk_width : 0;
  return SparseAttnInputs{a.q,     a.sink,   a.scale,    a.bf16_probabilities,
                          a.heads, a.window, a.tokens,   a.chunk_records,
                          a.rings, a.topk,   topk_width, a.kv_seqs,
                          a.rope,  a.out};
}

// ---- reductions over the 16 lanes of a half warp (all 32 lanes must call) ----------------------------

__device__ __forceinline__ float half_warp_max(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
__device__ __forceinline__ bool half_warp_all(bool b) {
  const unsigned ballot = __ballot_sync(kFullMask, b);
  const unsigned half = (threadIdx.x & 16) ? (ballot >> 16) : (ballot & 0xFFFFu);
  return half == 0xFFFFu;
}
__device__ __forceinline__ bool quarter_warp_all(bool b) {  // lanes of one group of 8
  const unsigned ballot = __ballot_sync(kFullMask, b);
  return ((ballot >> (threadIdx.x & 24)) & 0xFFu) == 0xFFu;
}
__device__ __forceinline__ float quarter_warp_max(float v) {
  for (int o = 4; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

}  // namespace cedar::cuda::detail
