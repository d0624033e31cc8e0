// BF16 GEMV / skinny GEMM on the tensor cores (attention_kernels.h).
//
// Per 32-wide K chunk, thread (g = lane/4, t = lane%4) of a warp loads the 8 consecutive bf16 values
// 8t..8t+7 of weight rows g and g+8 (one 16-byte load each) and of token g's activations, and two
// mma.sync m16n8k16 consume them: the first takes values 8t+{0,1} in k slots 2t, 2t+1 and 8t+{2,3} in
// 2t+8, 2t+9, the second values 8t+{4..7} alike (any permutation of k works when A and B share it; this
// one makes every load contiguous). bf16 × bf16 products are exact in fp32, so the result differs from
// cpu::linear's sequential fp32 sum only in the summation order. A block is 16 rows; its 8 warps split
// K (chunk c goes to warp c % 8), each keeping 16 rows × 8·kTiles tokens of accumulators, and the
// warps' partial sums are added in warp order. With few row tiles K is also split across blocks
// (split-K, same ticket scheme as gemv.cu: deterministic and graph-replayable).
// With w_fp8 (wo_a as stored: FP8 + UE8M0 32×32 scales) the weight is dequantized in registers to the
// reference's bf16 values and the same MMAs run: bit-identical to gemv_bf16 on dequant_weight_bf16's
// output, at half the weight bytes.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16;          // the MMA's M
constexpr int kTokensPerTile = 8;  // the MMA's N
constexpr int kMaxTiles = 8;       // tokens per pass: up to 64
constexpr int kPassTokens = kTokensPerTile * kMaxTiles;
constexpr int kChunk = 32;  // K values per chunk (two k16 MMAs)
constexpr int kMinChunksPerSplit = 16;
constexpr int kBlocksPerSm = 4;  // for the split-K wave estimate (132 SMs on an H200)

struct Bf16Params {
  const uint16_t* w;
  // FP8 weights (gemv_bf16 with w_fp8): e4m3 bytes [out, in] and UE8M0 scales [out/block_out, in/block_in]
  const uint8_t* w8;
  const uint8_t* w8_scales;
  int64_t block_out, block_in, scale_cols, scale_group_stride;
  int block_in_shift;  // log2(block_in)
  bool w8_fast;        // Bf16GemvArgs::w_fp8_fast
  int64_t out, in;
  int64_t w_group_stride;
  const float* x;
  int64_t x_row_stride, x_group_stride;
  float* y;
  int64_t y_row_stride, y_group_stride;
  int n;  // tokens of this pass (1..64)
  bool bf16_output;
  int ksplit;  // gridDim.y
  int chunks_per_split;
  float* split_partials;     // [groups][ksplit][64][out]
  unsigned* split_counters;  // [groups][row tiles]
};

__device__ __forceinline__ void mma_bf16(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values → bf16x2 (low half = first), RNE (exact for bf16-valued inputs).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return static_cast<uint32_t>(__bfloat16_as_ushort(h.x)) | (static_cast<uint32_t>(__bfloat16_as_ushort(h.y)) << 16);
}

template <int kTiles>
constexpr int kUnroll = kTiles >= 4 ? 1 : (kTiles == 2 ? 2 : 4);

// ---- FP8 weights dequantized in registers ---------------------------------------------------------
// The weight's bf16 values are the reference's bf16(e4m3·2^(s−127)) (dequant_weight_bf16, bit for
// bit), so the MMAs below see exactly the operands gemv_bf16 sees on the dequantized weight: the
// same sums in the same order, bit-identical results at half the bytes.
//
// Fast path (a chunk's 8 values of a row share one scale byte s; the check is per thread and chunk):
// cvt e4m3x2 → f16x2 (exact; e4m3 subnormals are f16 normals), take each half's exponent and top 7
// mantissa bits as a bf16 bit pattern (|h| >> 3: the value · 2^-112, sign copied), and one bf16x2
// multiply by 2^(s−15) — exact while every result is a normal bf16, which holds for s in [20, 142]
// (all scales of real weights). Zeros stay ±0. Otherwise (NaN codes 0x7F/0xFF, other scales) the
// scalar formula of dequant_weight_bf16.

// core/numeric.cpp f32_to_bf16 / e4m3_to_f32, bit for bit (as gemm_blas.cu).
__device__ __forceinline__ uint32_t f32_bf16_bits(float v) {
  const uint32_t b = __float_as_uint(v);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return ((b >> 16) & 0x8000u) | 0x7FC0u;
  return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float e4m3_f32(uint32_t bits) {
  const uint32_t sign = (bits & 0x80u) << 24, exp = (bits >> 3) & 0xFu, man = bits & 0x7u;
  if (exp == 0xFu && man == 0x7u) return __uint_as_float(0x7FC00000u);
  if (exp == 0) return __uint_as_float(sign | __float_as_uint(static_cast<float>(man) * 0x1p-9f));
  return __uint_as_float(sign | ((exp + 120u) << 23) | (man << 20));
}

// Whether a chunk (16 bytes of two rows, scale bytes sl / sh) can take the fast path.
__device__ __forceinline__ bool fp8_fast(uint2 lo, uint2 hi, uint32_t sl, uint32_t sh) {
  const uint32_t nan = __vcmpeq4(lo.x & 0x7F7F7F7Fu, 0x7F7F7F7Fu) | __vcmpeq4(lo.y & 0x7F7F7F7Fu, 0x7F7F7F7Fu) |
                       __vcmpeq4(hi.x & 0x7F7F7F7Fu, 0x7F7F7F7Fu) | __vcmpeq4(hi.y & 0x7F7F7F7Fu, 0x7F7F7F7Fu);
  return nan == 0u && sl - 20u <= 122u && sh - 20u <= 122u;  // s in [20, 142]
}
// Fast path: 4 e4m3 bytes (value order from the low byte) → two bf16x2 words, scale byte s.
__device__ __forceinline__ void fp8x4_to_bf16_fast(uint32_t bytes, uint32_t s, uint32_t& lo, uint32_t& hi) {
  const unsigned short m = static_cast<unsigned short>((s - 15u + 127u) << 7);  // bf16 2^(s−15)
  const __nv_bfloat162 mul = __halves2bfloat162(__ushort_as_bfloat16(m), __ushort_as_bfloat16(m));
  uint32_t w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>((bytes >> (16 * i)) & 0xFFFFu), __NV_E4M3);
    const uint32_t hh = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
    const uint32_t raw = ((hh & 0x7FFF7FFFu) >> 3) | (hh & 0x80008000u);  // each half: value · 2^-112 as bf16
    const __nv_bfloat162 prod = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&raw), mul);
    w[i] = *reinterpret_cast<const uint32_t*>(&prod);
  }
  lo = w[0];
  hi = w[1];
}
// Any bytes and scale: dequant_weight_bf16's scalar formula.
__device__ __forceinline__ void fp8x4_to_bf16_exact(uint32_t bytes, uint32_t s, uint32_t& lo, uint32_t& hi) {
  const float sf = detail::ue8m0_to_float(s);
  uint32_t v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = f32_bf16_bits(__fmul_rn(e4m3_f32((bytes >> (8 * i)) & 0xFFu), sf));
  lo = v[0] | (v[1] << 16);
  hi = v[2] | (v[3] << 16);
}

// Block (x, y, z): rows [16x, 16x+16) of group z, K chunks of split y; tokens [0, n) of this pass.
// kFp8: the weight is FP8 + UE8M0 scales, dequantized in registers to the same bf16 values.
// kFast (with kFp8): the weight was checked at upload (fp8_weight_fast), no per-chunk check.
template <int kTiles, bool kFp8 = false, bool kFast = false>
__global__ void __launch_bounds__(kWarps * 32) gemv_bf16_kernel(Bf16Params p) {
  constexpr int kTok = kTiles * kTokensPerTile;
  constexpr int kU = kUnroll<kTiles>;
  __shared__ float partial[kWarps][kRows][kTok];
  __shared__ bool is_last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t group = blockIdx.z;
  // Rows past `out` and tokens past `n` read row 0 / token 0 (valid memory); their outputs are never
  // written (an MMA row or column only feeds its own outputs).
  const int64_t r_lo = row0 + g < p.out ? row0 + g : 0;
  const int64_t r_hi = row0 + g + 8 < p.out ? row0 + g + 8 : 0;
  const uint16_t* wg = p.w + group * p.w_group_stride;
  const uint16_t* w_lo = wg + r_lo * p.in + 8 * t;
  const uint16_t* w_hi = wg + r_hi * p.in + 8 * t;
  // FP8: bytes of rows g, g+8 and their scale rows (a chunk's 8 values share one scale: block_in % 32 == 0).
  const uint8_t* w8g = kFp8 ? p.w8 + group * p.w_group_stride : nullptr;
  const uint8_t* w8_lo = kFp8 ? w8g + r_lo * p.in + 8 * t : nullptr;
  const uint8_t* w8_hi = kFp8 ? w8g + r_hi * p.in + 8 * t : nullptr;
  const uint8_t* s8_lo =
      kFp8 ? p.w8_scales + group * p.scale_group_stride + (r_lo / p.block_out) * p.scale_cols : nullptr;
  const uint8_t* s8_hi =
      kFp8 ? p.w8_scales + group * p.scale_group_stride + (r_hi / p.block_out) * p.scale_cols : nullptr;
  const float* x_tile[kTiles];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int tok = i * kTokensPerTile + g;
    x_tile[i] = p.x + static_cast<int64_t>(tok < p.n ? tok : 0) * p.x_row_stride + group * p.x_group_stride + 8 * t;
  }
  const int n_chunks = static_cast<int>((p.in + kChunk - 1) / kChunk);
  const int c_begin = static_cast<int>(blockIdx.y) * p.chunks_per_split;
  const int c_end = min(n_chunks, c_begin + p.chunks_per_split);

  float acc[kTiles][4];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  detail::pdl_launch_dependents();
  if (c_begin + warp < c_end) {  // PDL: this warp's first weight chunk into L2 before waiting
    const int64_t off = static_cast<int64_t>(c_begin + warp) * kChunk;
    if constexpr (kFp8) {
      detail::prefetch_l2(w8_lo + off);
      detail::prefetch_l2(w8_hi + off);
    } else {
      detail::prefetch_l2(w_lo + off);
      detail::prefetch_l2(w_hi + off);
    }
  }
  detail::pdl_wait();

  for (int c0 = c_begin + warp; c0 < c_end; c0 += kWarps * kU) {
    uint4 wl[kU], wh[kU];
    bool ok[kU];
    if constexpr (kFp8) {
      // All loads first (unconditional: a chunk past the range reads the range's first chunk and is
      // zeroed); the conversions then depend on every load of the iteration, so they stay in flight.
      uint2 bl[kU], bh[kU];
      uint32_t sl[kU], sh[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int c = c0 + u * kWarps;
        const int64_t k = static_cast<int64_t>(c) * kChunk + 8 * t;
        ok[u] = c < c_end && k < p.in;
        const int64_t off = static_cast<int64_t>(ok[u] ? c : c_begin) * kChunk;
        // Plain loads: with ld_weight's L2 hint this path (wo_a_f16=0) measured +0.13 ms per step (s14 run 2:
        // A/B wo_a_f16=0 +0.264 ms against s10-s12's +0.12..0.14); decode's default stages wo_a for gemv.cu.
        bl[u] = __ldg(reinterpret_cast<const uint2*>(w8_lo + off));
        bh[u] = __ldg(reinterpret_cast<const uint2*>(w8_hi + off));
        sl[u] = __ldg(s8_lo + ((off + 8 * t) >> p.block_in_shift));
        sh[u] = __ldg(s8_hi + ((off + 8 * t) >> p.block_in_shift));
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (kFast || fp8_fast(bl[u], bh[u], sl[u], sh[u])) {
          fp8x4_to_bf16_fast(bl[u].x, sl[u], wl[u].x, wl[u].y);
          fp8x4_to_bf16_fast(bl[u].y, sl[u], wl[u].z, wl[u].w);
          fp8x4_to_bf16_fast(bh[u].x, sh[u], wh[u].x, wh[u].y);
          fp8x4_to_bf16_fast(bh[u].y, sh[u], wh[u].z, wh[u].w);
        } else {
          fp8x4_to_bf16_exact(bl[u].x, sl[u], wl[u].x, wl[u].y);
          fp8x4_to_bf16_exact(bl[u].y, sl[u], wl[u].z, wl[u].w);
          fp8x4_to_bf16_exact(bh[u].x, sh[u], wh[u].x, wh[u].y);
          fp8x4_to_bf16_exact(bh[u].y, sh[u], wh[u].z, wh[u].w);
        }
        if (!ok[u]) wl[u] = wh[u] = make_uint4(0, 0, 0, 0);
      }
    } else {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int c = c0 + u * kWarps;
        const int64_t k = static_cast<int64_t>(c) * kChunk + 8 * t;
        ok[u] = c < c_end && k < p.in;  // in % 8 == 0: a thread's 8 values are all inside or all outside
        wl[u] = ok[u] ? detail::ld_weight(reinterpret_cast<const uint4*>(w_lo + static_cast<int64_t>(c) * kChunk))
                      : make_uint4(0, 0, 0, 0);
        wh[u] = ok[u] ? detail::ld_weight(reinterpret_cast<const uint4*>(w_hi + static_cast<int64_t>(c) * kChunk))
                      : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + u * kWarps;
      const uint32_t a1[4] = {wl[u].x, wh[u].x, wl[u].y, wh[u].y};
      const uint32_t a2[4] = {wl[u].z, wh[u].z, wl[u].w, wh[u].w};
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
        if (ok[u]) {
          const float* xp = x_tile[i] + static_cast<int64_t>(c) * kChunk;
          x0 = __ldg(reinterpret_cast<const float4*>(xp));
          x1 = __ldg(reinterpret_cast<const float4*>(xp + 4));
        }
        mma_bf16(a1, pack_bf16x2(x0.x, x0.y), pack_bf16x2(x0.z, x0.w), acc[i]);
        mma_bf16(a2, pack_bf16x2(x1.x, x1.y), pack_bf16x2(x1.z, x1.w), acc[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int tok0 = i * kTokensPerTile + 2 * t;
    partial[warp][g][tok0] = acc[i][0];
    partial[warp][g][tok0 + 1] = acc[i][1];
    partial[warp][g + 8][tok0] = acc[i][2];
    partial[warp][g + 8][tok0 + 1] = acc[i][3];
  }
  __syncthreads();

  // Each thread owns outputs (row, tok) = (e / kTok, e % kTok) for e = threadIdx.x + j·256.
  constexpr int kOutputs = kRows * kTok;
  constexpr int kPerThread = (kOutputs + kWarps * 32 - 1) / (kWarps * 32);
  float sum[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int e = threadIdx.x + j * kWarps * 32;
    sum[j] = 0.0f;
    if (e < kOutputs) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum[j] += partial[w][e / kTok][e % kTok];
    }
  }
  auto writer = [&](int e) { return e < kOutputs && (e % kTok) < p.n && row0 + e / kTok < p.out; };
  if (p.ksplit > 1) {
    float* parts = p.split_partials + group * p.ksplit * kPassTokens * p.out;
    unsigned* counters = p.split_counters + group * gridDim.x;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int e = threadIdx.x + j * kWarps * 32;
      if (writer(e))
        parts[(static_cast<int64_t>(blockIdx.y) * kPassTokens + e % kTok) * p.out + row0 + e / kTok] = sum[j];
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(counters + blockIdx.x, 1u) == static_cast<unsigned>(p.ksplit - 1);
    __syncthreads();
    if (!is_last) return;
    __threadfence();
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int e = threadIdx.x + j * kWarps * 32;
      sum[j] = 0.0f;
      if (writer(e))
        for (int z = 0; z < p.ksplit; ++z)
          sum[j] += __ldcg(parts + (static_cast<int64_t>(z) * kPassTokens + e % kTok) * p.out + row0 + e / kTok);
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0;  // re-armed for the next launch / graph replay
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int e = threadIdx.x + j * kWarps * 32;
    if (writer(e)) {
      float* yp = p.y + static_cast<int64_t>(e % kTok) * p.y_row_stride + group * p.y_group_stride + row0 + e / kTok;
      *yp = p.bf16_output ? detail::round_bf16(sum[j]) : sum[j];
    }
  }
}

int64_t row_tiles(int64_t out) { return (out + kRows - 1) / kRows; }

int64_t choose_ksplit(int64_t out, int64_t in, int64_t groups) {
  const int64_t tiles = row_tiles(out) * groups;
  const int64_t wave = int64_t{kBlocksPerSm} * 132;
  const int64_t chunks = (in + kChunk - 1) / kChunk;
  const int64_t most = std::max<int64_t>(1, chunks / kMinChunksPerSplit);
  return std::max<int64_t>(1, std::min(wave / std::max<int64_t>(tiles, 1), most));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <int kTiles>
Status launch(const Bf16Params& p, dim3 grid, cudaStream_t stream, bool pdl) {
  if (p.w8 != nullptr && p.w8_fast)
    return launch_kernel(gemv_bf16_kernel<kTiles, true, true>, grid, dim3(kWarps * 32), 0, stream, pdl,
                         "gemv_bf16_kernel<fp8 weight, checked at upload>", p);
  if (p.w8 != nullptr)
    return launch_kernel(gemv_bf16_kernel<kTiles, true>, grid, dim3(kWarps * 32), 0, stream, pdl,
                         "gemv_bf16_kernel<fp8 weight>", p);
  return launch_kernel(gemv_bf16_kernel<kTiles, false>, grid, dim3(kWarps * 32), 0, stream, pdl, "gemv_bf16_kernel", p);
}

}  // namespace

SplitKSize gemv_bf16_splitk_size(int64_t out, int64_t in, int64_t groups) {
  if (out <= 0 || in <= 0 || groups <= 0) return {};
  const int64_t ksplit = choose_ksplit(out, in, groups);
  if (ksplit <= 1) return {};
  return SplitKSize{groups * ksplit * kPassTokens * out, groups * row_tiles(out)};
}

Status gemv_bf16(const Bf16GemvArgs& a, cudaStream_t stream, const SplitKWorkspace& splitk) {
  const std::string shape = "[" + std::to_string(a.out) + ", " + std::to_string(a.in) + "]";
  auto fail = [&](const std::string& what) { return make_error("cuda::gemv_bf16 " + shape + ": " + what); };
  if (a.out <= 0 || a.in <= 0) return fail("empty weight");
  if (a.in % 8 != 0) return fail("in=" + std::to_string(a.in) + " is not a multiple of 8 (16-byte weight loads)");
  if (a.groups < 1 || a.groups > 65535) return fail("groups=" + std::to_string(a.groups) + " (1..65535)");
  if (a.n < 0) return fail("n=" + std::to_string(a.n));
  if (a.n == 0) return Status::Ok();
  const bool fp8 = a.w_fp8 != nullptr;
  if ((a.w == nullptr) == !fp8 || a.x == nullptr || a.y == nullptr)
    return fail("exactly one of w / w_fp8, and x and y, are required");
  if (row_tiles(a.out) > 0x7FFFFFFF || a.in / kChunk > 0x3FFFFFFF) return fail("too large");
  Bf16Params p{};
  p.w = fp8 ? reinterpret_cast<const uint16_t*>(a.w_fp8) : a.w;  // unused by the FP8 kernel
  if (fp8) {
    if (a.w_scales == nullptr || a.block_out <= 0 || a.block_in < 32 || (a.block_in & (a.block_in - 1)) != 0)
      return fail("FP8 weight needs scales and a power-of-two block_in >= 32 (block " + std::to_string(a.block_out) +
                  "x" + std::to_string(a.block_in) + ")");
    if (reinterpret_cast<uintptr_t>(a.w_fp8) % 8 != 0 || (a.w_group_stride != 0 && a.w_group_stride % 8 != 0))
      return fail("FP8 weight must be 8-byte aligned with a group stride that is a multiple of 8 bytes");
    if (a.groups > 1 && a.scale_group_stride == 0 && a.out % a.block_out != 0)
      return fail("grouped FP8 weight: out % block_out != 0 needs an explicit scale_group_stride");
    p.w8 = a.w_fp8;
    p.w8_scales = a.w_scales;
    p.w8_fast = a.w_fp8_fast;
    p.block_out = a.block_out;
    p.block_in = a.block_in;
    while ((int64_t{1} << p.block_in_shift) < a.block_in) ++p.block_in_shift;
    p.scale_cols = (a.in + a.block_in - 1) / a.block_in;
    p.scale_group_stride =
        a.scale_group_stride != 0 ? a.scale_group_stride : ((a.out + a.block_out - 1) / a.block_out) * p.scale_cols;
  }
  p.out = a.out;
  p.in = a.in;
  p.w_group_stride = a.w_group_stride != 0 ? a.w_group_stride : a.out * a.in;
  p.x = a.x;
  p.x_row_stride = a.x_row_stride != 0 ? a.x_row_stride : a.groups * a.in;
  p.x_group_stride = a.x_group_stride != 0 ? a.x_group_stride : a.in;
  p.y = a.y;
  p.y_row_stride = a.y_row_stride != 0 ? a.y_row_stride : a.groups * a.out;
  p.y_group_stride = a.y_group_stride != 0 ? a.y_group_stride : a.out;
  if (!fp8 && (!aligned16(a.w) || p.w_group_stride % 8 != 0))
    return fail("weight must be 16-byte aligned with a group stride that is a multiple of 8 elements");
  if (!aligned16(a.x) || p.x_row_stride % 4 != 0 || p.x_group_stride % 4 != 0)
    return fail("input must be 16-byte aligned with strides that are multiples of 4 floats");
  p.bf16_output = a.bf16_output;

  int64_t ksplit = choose_ksplit(a.out, a.in, a.groups);
  const SplitKSize need = gemv_bf16_splitk_size(a.out, a.in, a.groups);
  if (ksplit > 1 && (splitk.partials == nullptr || splitk.counters == nullptr ||
                     splitk.partial_floats < need.partial_floats || splitk.counter_count < need.counters))
    ksplit = 1;  // no (or too small a) workspace: one block per row tile
  const int64_t chunks = (a.in + kChunk - 1) / kChunk;
  p.ksplit = static_cast<int>(ksplit);
  p.chunks_per_split = static_cast<int>((chunks + ksplit - 1) / ksplit);
  p.split_partials = splitk.partials;
  p.split_counters = splitk.counters;
  const dim3 grid(static_cast<unsigned>(row_tiles(a.out)), static_cast<unsigned>(ksplit),
                  static_cast<unsigned>(a.groups));
  for (int64_t t0 = 0; t0 < a.n; t0 += kPassTokens) {
    const int64_t nt = std::min<int64_t>(kPassTokens, a.n - t0);
    Bf16Params q = p;
    q.x = a.x + t0 * p.x_row_stride;
    q.y = a.y + t0 * p.y_row_stride;
    q.n = static_cast<int>(nt);
    const int64_t tiles = (nt + kTokensPerTile - 1) / kTokensPerTile;
    // Passes of one call write disjoint rows and share the split-K workspace only in stream order
    // (the wait precedes every workspace access), so each may take PDL.
    const bool pdl = a.programmatic_launch;
    Status s = tiles <= 1   ? launch<1>(q, grid, stream, pdl)
               : tiles <= 2 ? launch<2>(q, grid, stream, pdl)
               : tiles <= 4 ? launch<4>(q, grid, stream, pdl)
                            : launch<8>(q, grid, stream, pdl);
    CEDAR_RETURN_IF_ERROR(s);
  }
  return Status::Ok();
}

// For the catalog's loadability check.
const void* gemv_bf16_kernel_ptr() { return reinterpret_cast<const void*>(&gemv_bf16_kernel<1>); }
const void* gemv_fp8w_kernel_ptr() { return reinterpret_cast<const void*>(&gemv_bf16_kernel<1, true>); }

bool fp8_weight_fast(const uint8_t* codes, int64_t n_codes, const uint8_t* scales, int64_t n_scales) {
  if (codes == nullptr || scales == nullptr || n_codes < 0 || n_scales < 0) return false;
  for (int64_t i = 0; i < n_codes; ++i)
    if ((codes[i] & 0x7Fu) == 0x7Fu) return false;
  for (int64_t i = 0; i < n_scales; ++i)
    if (scales[i] < 20 || scales[i] > 142) return false;
  return true;
}

}  // namespace cedar::cuda
