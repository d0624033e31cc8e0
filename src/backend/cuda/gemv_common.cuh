// Pieces shared by the block-scaled GEMV kernels (gemv.cu: plain FP8 / MXFP4, gemv_packed.cu: the
// repacked MXFP4 layout): tile shape, the f16 HMMA, and the exact e4m3 / e2m1 conversions.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ffn_kernels.h"

namespace cedar::cuda::gemv_detail {

constexpr int kGemvWarps = 8;      // warps per block, splitting K
constexpr int kRowsPerBlock = 16;  // the MMA's M
constexpr int kTokensPerTile = 8;  // the MMA's N
// Consecutive K blocks in flight per warp, and blocks per SM the register budget must allow. The
// kernel is latency-bound (a few bytes per instruction), so bytes in flight per SM decide its speed:
// FP8 (16 bytes per row, thread and K-block pair): 3 blocks of 8 warps × 4 K blocks in flight, 76
// registers without spills (the 8-token instance spills 68 bytes, measured faster than at 2 blocks);
// MXFP4 (4 bytes per K block): 2 blocks × 8 K blocks, 122 registers (ptxas -v; MXFP4 at 3 blocks/SM spills).
template <bool kFp4>
constexpr int kUnroll = kFp4 ? 8 : 4;
template <bool kFp4>
constexpr int kMinBlocksPerSm = kFp4 ? 2 : 3;

constexpr int kMaxGroup = 16;  // matrices per launch (blockIdx.z)

struct GemvOperands {
  const uint8_t* w;
  const uint8_t* w_scales;
  const uint16_t* act;      // [n_tile, in] e4m3 codes as f16 (rows act_stride apart)
  const float* act_scales;  // [n_tile, in/32] (rows scale_stride apart)
  float* y;                 // [n_tile, out] (rows y_stride apart)
  int64_t out = 0;          // rows of this matrix (gemv_quantized_multi); 0: the launch's out
  // Token row strides in elements (GemvGroupItem's, resolved and checked below 2^31 on the host; never 0).
  int32_t act_stride = 0, scale_stride = 0, y_stride = 0;
};

// d += A·B, m16n8k16, f16 × f16 → f32 (native HMMA on sm_80+; products of e4m3 values are exact).
__device__ __forceinline__ void mma_f16(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Word u (0..3) of a 16-byte vector, by a constant u after unrolling.
__device__ __forceinline__ uint32_t word_of(const uint4& v, int u) {
  return u == 0 ? v.x : u == 1 ? v.y : u == 2 ? v.z : v.w;
}

// Two e4m3 bytes (low 16 bits) → f16x2 (low byte → low half), exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xFFFFu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// The high two e4m3 bytes (bits 16..31) → f16x2, exact: cvt reads the register's upper half (SASS
// F2FP ... R.H1), where e4m3x2_to_f16x2(v >> 16) costs a shift first.
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t v) {
  uint32_t r;
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, h; }" : "=r"(r) : "r"(v));
  return r;
}

// 4 packed e2m1 codes (one per byte, low nibble) → 4 e4m3 bytes of value e2m1 · 2^-6.
__device__ __forceinline__ uint32_t e2m1x4_to_e4m3x4(uint32_t v) {
  return ((v & 0x07070707u) << 2) | ((v & 0x08080808u) << 4);
}

// One 32-bit word of 8 e2m1 nibbles (values 0..7 of a thread's K slice, low nibble first) → the two
// e4m3 words of values 0..3 and 4..7 in value order (each e2m1 · 2^-6, exact).
__device__ __forceinline__ void e2m1x8_to_e4m3(uint32_t v, uint32_t& w0, uint32_t& w1) {
  const uint32_t even = e2m1x4_to_e4m3x4(v & 0x0F0F0F0Fu), odd = e2m1x4_to_e4m3x4((v >> 4) & 0x0F0F0F0Fu);
  w0 = __byte_perm(even, odd, 0x5140);  // values 0,1,2,3
  w1 = __byte_perm(even, odd, 0x7362);  // values 4,5,6,7
}

// ---- the packed layout's words: e2m1 codes placed for f16 (repack_mxfp4) ------------------------
// Byte k (k = 0..3) of a packed word holds value k of the thread's 8-value slice at bits 1..3 (the
// magnitude `eem`) and 7 (sign), and value 4 + k at bits 4..6 and 0. Bits 1..3 and 7 of a byte are
// bits 9..11 and 15 of an f16 whose high byte it is: the f16 e2m1 · 2^-14, exact for normals and
// subnormals alike (0.5 → the f16 subnormal 2^-15). So 8 values become 4 f16x2 in 9 integer ops (the
// e4m3 route took 15: the nibble spread, two byte permutes, two shifts and four cvt).
constexpr uint32_t kF16HighBits = 0x8E8E8E8Eu;  // per byte: the bits an f16 high byte takes

// Host and device: the packed word of 8 e2m1 codes (code v = value v of the slice, 4 bits each).
__host__ __device__ constexpr uint32_t e2m1_f16_word(const uint8_t (&code)[8]) {
  uint32_t w = 0;
  for (int k = 0; k < 4; ++k) {
    const uint32_t a = code[k] & 0xFu, b = code[4 + k] & 0xFu;
    const uint32_t byte = ((a & 7u) << 1) | ((a >> 3) << 7) | ((b & 7u) << 4) | (b >> 3);
    w |= byte << (8 * k);
  }
  return w;
}

// A packed word → f16x2 of values {0,1}, {2,3}, {4,5}, {6,7} (low half = the lower value), each
// e2m1 · 2^-14 exactly.
__device__ __forceinline__ void e2m1_word_to_f16x2(uint32_t w, uint32_t (&f)[4]) {
  const uint32_t a = w & kF16HighBits;                                        // values 0..3 in place
  const uint32_t b = ((w >> 3) & 0x0E0E0E0Eu) | ((w << 7) & 0x80808080u);    // values 4..7 moved there
  f[0] = __byte_perm(a, 0u, 0x1404);  // byte 1 ← byte 0, byte 3 ← byte 1, bytes 0 and 2 zero
  f[1] = __byte_perm(a, 0u, 0x3424);
  f[2] = __byte_perm(b, 0u, 0x1404);
  f[3] = __byte_perm(b, 0u, 0x3424);
}

// One K block (32 values) of a thread's 4 packed rows (g, g + 8, g + 16, g + 24; w[i] the packed word of
// row i, b[i] its scale byte) against one activation fragment: 4 MMAs, accumulated into acc[row tile]
// [fragment] — the packed GEMVs' arithmetic (gemv_packed.cu per group, gemv_tiles.cu per K block from
// shared memory), one function so that both give the same bits.
// kOne: the unit has one token (every decode step at batch 1): the accumulator columns of token 1 are
// never stored, so their scale math is skipped (the MMA computes them regardless).
// kExpAdd (GemvItemsOptions::scale_exp_add): the scale product s_w·(2^14·s_a) of two powers of two as one
// integer add on the exponent field, (b << 23) + bits(s_a) − (113 << 23), instead of the e8m0 decode, its
// zero-scale guard and an FMUL: the same bits wherever the float product is a normal float — every weight
// scale byte b in 9..127 (the caller proves it) and s_a in [2^-22, 2^113] (act_block_scale's range below
// block maxima of 448·2^113 ≈ 4.6e36; beyond, the float path gives inf and this one a finite value).
// s18 run 5: w1/w3 at batch 1 30.72 → 29.91 µs, w2 18.05 → 17.94; batch 8 178.3 → 173.6, 109.2 → 106.0.
template <bool kOne, bool kExpAdd>
__device__ __forceinline__ void packed_block_math(const uint32_t (&w)[4], const uint32_t (&b)[4], const uint4& act,
                                                  float sa0_raw, float sa1_raw, float (&acc)[2][4]) {
  // 2^14 undoes the f16 placement's e2m1 · 2^-14: an exact power-of-two rescaling of the plain
  // kernel's e4m3 route (e2m1 · 2^-6, its 2^6 on the weight scale) — the same products and MMA sums
  // scaled by 2^-8, and (Σ·2^-8)·(s_w·2^14·s_a) is the plain (Σ)·(2^6·s_w·s_a): the same result bits.
  // Taken on the activation scale, once per block and token instead of per row tile.
  const float sa0 = 16384.0f * sa0_raw, sa1 = 16384.0f * sa1_raw;
  const uint32_t c0 = __float_as_uint(sa0_raw) - (113u << 23);
  const uint32_t c1 = __float_as_uint(sa1_raw) - (113u << 23);
#pragma unroll
  for (int rt = 0; rt < 2; ++rt) {
    uint32_t lo[4], hi[4];  // f16x2 of values {0,1}, {2,3}, {4,5}, {6,7} of rows g(+16) and g+8(+16)
    e2m1_word_to_f16x2(w[2 * rt], lo);
    e2m1_word_to_f16x2(w[2 * rt + 1], hi);
    const uint32_t b_lo = b[2 * rt], b_hi = b[2 * rt + 1];
    float s_lo0, s_hi0, s_lo1, s_hi1;  // weight scale × activation scale (× 2^14) per row half and token
    if constexpr (kExpAdd) {
      s_lo0 = __uint_as_float((b_lo << 23) + c0);
      s_hi0 = __uint_as_float((b_hi << 23) + c0);
      s_lo1 = __uint_as_float((b_lo << 23) + c1);
      s_hi1 = __uint_as_float((b_hi << 23) + c1);
    } else {
      const float sw_lo = detail::ue8m0_scale(b_lo), sw_hi = detail::ue8m0_scale(b_hi);
      s_lo0 = sw_lo * sa0;
      s_hi0 = sw_hi * sa0;
      s_lo1 = sw_lo * sa1;
      s_hi1 = sw_hi * sa1;
    }
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint32_t a1[4] = {lo[0], hi[0], lo[1], hi[1]};
    mma_f16(a1, act.x, act.y, d);
    const uint32_t a2[4] = {lo[2], hi[2], lo[3], hi[3]};
    mma_f16(a2, act.z, act.w, d);
    acc[rt][0] += d[0] * s_lo0;
    acc[rt][2] += d[2] * s_hi0;
    if (!kOne) {
      acc[rt][1] += d[1] * s_lo1;
      acc[rt][3] += d[3] * s_hi1;
    }
  }
}

// Multiprocessors of the current device (132 on an H200; 132 if the query fails): sizes persistent grids.
inline int device_sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0)
    return 132;
  return sms;
}

// L2 bytes of the current device (50 MiB if the query fails).
inline int64_t device_l2_bytes() {
  int dev = 0, bytes = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, dev) != cudaSuccess ||
      bytes <= 0)
    return int64_t{50} << 20;
  return bytes;
}

// gemv_quantized_items for the packed MXFP4 layout (gemv_packed.cu); options.packed_warps 0: 4 warps.
Status gemv_mxfp4_packed_items(const QuantWeightView& shape, const DeviceGemvItem* items, const int32_t* count,
                               int64_t capacity, bool bf16_output, cudaStream_t stream, bool balanced,
                               const GemvItemsOptions& options);

// gemv_quantized_items for the MXFP4 tile layout (gemv_tiles.cu).
Status gemv_mxfp4_tiles_items(const QuantWeightView& shape, const DeviceGemvItem* items, const int32_t* count,
                              int64_t capacity, bool bf16_output, cudaStream_t stream, const GemvItemsOptions& options);

}  // namespace cedar::cuda::gemv_detail
