// FP8 activation quantization and the block-scaled FP8 / MXFP4 GEMV (skinny GEMM, ≤ 8 tokens per tile).
//
// Both weight formats run on the FP8 tensor cores through mma.sync m16n8k32 (e4m3 × e4m3 → f32):
// one MMA is exactly one 32-wide scale block of 16 weight rows × 8 tokens, so its result is the
// block's Σ q_a·q_w and the UE8M0 scales are applied per block in fp32, as the reference does.
//
// MXFP4 path — Hopper has no FP4 MMA (e2m1 MMA is sm_100+), so the weight is dequantized in
// registers to e4m3, which is exact: every e2m1 value is an e4m3 value. With the 3 magnitude bits
// `eem` moved to e4m3 bits 2..4 (`((c & 7) << 2) | ((c & 8) << 4)`, 2 logic ops per 4 values on the
// packed word), the e4m3 value is e2m1 · 2^-6 for normals and subnormals alike, and the 2^6 is folded
// into the block scale. This keeps the weight read at 0.53 bytes/parameter (the roofline of a
// memory-bound GEMV) and the inner loop at ~3 integer ops + 1 MMA per 32 values; the alternatives
// (dequant to bf16 and a bf16 MMA: 2× the conversion work and bf16 activations that lose the FP8
// quantization the reference applies; or a CUDA-core FMA loop: compute-bound at ~1/3 of HBM speed)
// are slower and no more exact. Nibble pairs land in the MMA's K order {0,2,4,6 | 1,3,5,7}; the
// activation bytes are permuted identically (K order inside a block does not change the sum's terms).
#include <cuda_fp8.h>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"

namespace cedar::cuda {
namespace {

constexpr int kQuantThreads = 256;
constexpr int kGemvWarps = 8;       // warps per block, splitting K
constexpr int kRowsPerBlock = 16;   // the MMA's M
constexpr int kTokensPerTile = 8;   // the MMA's N
constexpr int kUnroll = 4;          // K blocks in flight per warp

// One warp per 32-value block: warp max of |x|, UE8M0 scale, e4m3 codes (cvt.rn.satfinite).
__global__ void __launch_bounds__(kQuantThreads) quantize_act_fp8_kernel(const float* x, int64_t n_blocks,
                                                                         uint8_t* codes, float* scales) {
  const int64_t blk = (static_cast<int64_t>(blockIdx.x) * kQuantThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (blk >= n_blocks) return;  // whole warps exit together
  const float v = x[blk * 32 + lane];
  const float amax = fmaxf(detail::warp_max(fabsf(v)), 1e-4f);
  const float s = detail::ue8m0_to_float(detail::ue8m0_ceil_pow2(amax * (1.0f / 448.0f)));
  const float q = fminf(fmaxf(v / s, -448.0f), 448.0f);
  codes[blk * 32 + lane] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
  if (lane == 0) scales[blk] = s;
}

struct GemvParams {
  const uint8_t* w;
  const uint8_t* w_scales;
  int64_t out, in;
  int64_t block_out, block_in, scale_cols;  // FP8Block scale grid
  const uint8_t* act;                       // [n_tile, in] e4m3 codes
  const float* act_scales;                  // [n_tile, in/32]
  int n;                                    // tokens in this tile (1..8)
  float* y;                                 // [n_tile, out]
  bool bf16_output;
};

__device__ __forceinline__ void mma_e4m3(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f), "f"(0.0f), "f"(0.0f), "f"(0.0f));
}

// 4 packed e2m1 codes (one per byte, low nibble) → 4 e4m3 bytes of value e2m1 · 2^-6.
__device__ __forceinline__ uint32_t e2m1x4_to_e4m3x4(uint32_t v) {
  return ((v & 0x07070707u) << 2) | ((v & 0x08080808u) << 4);
}

// Block: 16 weight rows; its 8 warps split the K blocks, each accumulating a 16×8 tile in the MMA's
// accumulator layout (thread (g = lane/4, t = lane%4) holds rows g, g+8 × tokens 2t, 2t+1).
template <bool kFp4>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_quantized_kernel(GemvParams p) {
  __shared__ float partial[kGemvWarps][kRowsPerBlock][kTokensPerTile];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t r_lo = row0 + g, r_hi = row0 + g + 8;
  const bool lo_ok = r_lo < p.out, hi_ok = r_hi < p.out;
  const int64_t n_kb = p.in / 32;
  const int64_t w_stride = kFp4 ? p.in / 2 : p.in;
  const uint8_t* w_lo = p.w + (lo_ok ? r_lo : 0) * w_stride;
  const uint8_t* w_hi = p.w + (hi_ok ? r_hi : 0) * w_stride;
  const bool tok_ok = g < p.n;  // B operand: token g
  const uint8_t* a_row = p.act + (tok_ok ? g : 0) * p.in;
  const int tok0 = 2 * t, tok1 = 2 * t + 1;  // accumulator tokens
  const float* as0 = p.act_scales + (tok0 < p.n ? tok0 : 0) * n_kb;
  const float* as1 = p.act_scales + (tok1 < p.n ? tok1 : 0) * n_kb;

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t kb0 = warp; kb0 < n_kb; kb0 += kGemvWarps * kUnroll) {
    uint32_t wa[kUnroll][4], bb[kUnroll][2];
    float sw_lo[kUnroll], sw_hi[kUnroll], sa0[kUnroll], sa1[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t kb = kb0 + static_cast<int64_t>(u) * kGemvWarps;
      const bool k_ok = kb < n_kb;
      uint2 act = make_uint2(0, 0);
      if (k_ok && tok_ok) act = __ldg(reinterpret_cast<const uint2*>(a_row + kb * 32 + t * 8));
      if constexpr (kFp4) {
        // 16 bytes per row-block; thread t holds values 8t..8t+7 (one 32-bit word).
        const uint32_t lo = (k_ok && lo_ok) ? __ldg(reinterpret_cast<const uint32_t*>(w_lo + kb * 16 + t * 4)) : 0u;
        const uint32_t hi = (k_ok && hi_ok) ? __ldg(reinterpret_cast<const uint32_t*>(w_hi + kb * 16 + t * 4)) : 0u;
        wa[u][0] = e2m1x4_to_e4m3x4(lo & 0x0F0F0F0Fu);         // values 8t+{0,2,4,6}, row g
        wa[u][1] = e2m1x4_to_e4m3x4(hi & 0x0F0F0F0Fu);         // row g+8
        wa[u][2] = e2m1x4_to_e4m3x4((lo >> 4) & 0x0F0F0F0Fu);  // values 8t+{1,3,5,7}
        wa[u][3] = e2m1x4_to_e4m3x4((hi >> 4) & 0x0F0F0F0Fu);
        bb[u][0] = __byte_perm(act.x, act.y, 0x6420);
        bb[u][1] = __byte_perm(act.x, act.y, 0x7531);
        const int64_t kbc = k_ok ? kb : 0;
        // 2^6 undoes the e2m1 → e4m3 exponent shift.
        sw_lo[u] = lo_ok ? 64.0f * detail::ue8m0_to_float(__ldg(p.w_scales + r_lo * n_kb + kbc)) : 0.0f;
        sw_hi[u] = hi_ok ? 64.0f * detail::ue8m0_to_float(__ldg(p.w_scales + r_hi * n_kb + kbc)) : 0.0f;
      } else {
        // 32 bytes per row-block; thread t holds values 8t..8t+7: MMA k t*4+i ← 8t+i, 16+t*4+i ← 8t+4+i.
        uint2 lo = make_uint2(0, 0), hi = make_uint2(0, 0);
        if (k_ok && lo_ok) lo = __ldg(reinterpret_cast<const uint2*>(w_lo + kb * 32 + t * 8));
        if (k_ok && hi_ok) hi = __ldg(reinterpret_cast<const uint2*>(w_hi + kb * 32 + t * 8));
        wa[u][0] = lo.x;
        wa[u][1] = hi.x;
        wa[u][2] = lo.y;
        wa[u][3] = hi.y;
        bb[u][0] = act.x;
        bb[u][1] = act.y;
        const int64_t col = (k_ok ? kb : 0) * 32 / p.block_in;
        sw_lo[u] = lo_ok ? detail::ue8m0_to_float(__ldg(p.w_scales + (r_lo / p.block_out) * p.scale_cols + col)) : 0.0f;
        sw_hi[u] = hi_ok ? detail::ue8m0_to_float(__ldg(p.w_scales + (r_hi / p.block_out) * p.scale_cols + col)) : 0.0f;
      }
      sa0[u] = (k_ok && tok0 < p.n) ? __ldg(as0 + kb) : 0.0f;
      sa1[u] = (k_ok && tok1 < p.n) ? __ldg(as1 + kb) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float d[4];
      mma_e4m3(wa[u], bb[u][0], bb[u][1], d);
      // Scales are powers of two: (Σ q_a q_w)·(s_w·s_a) rounds like the reference's (Σ)·s_a·s_w.
      // Out-of-range blocks/rows/tokens have scale 0 (never NaN: their codes are zero too).
      acc[0] += d[0] * (sw_lo[u] * sa0[u]);
      acc[1] += d[1] * (sw_lo[u] * sa1[u]);
      acc[2] += d[2] * (sw_hi[u] * sa0[u]);
      acc[3] += d[3] * (sw_hi[u] * sa1[u]);
    }
  }
  partial[warp][g][tok0] = acc[0];
  partial[warp][g][tok1] = acc[1];
  partial[warp][g + 8][tok0] = acc[2];
  partial[warp][g + 8][tok1] = acc[3];
  __syncthreads();
  if (threadIdx.x < kRowsPerBlock * kTokensPerTile) {
    const int row = threadIdx.x / kTokensPerTile, tok = threadIdx.x % kTokensPerTile;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kGemvWarps; ++w) sum += partial[w][row][tok];
    if (tok < p.n && row0 + row < p.out)
      p.y[tok * p.out + row0 + row] = p.bf16_output ? detail::round_bf16(sum) : sum;
  }
}

Status check_weight(const QuantWeightView& w) {
  if (w.out <= 0 || w.in <= 0 || w.data == nullptr || w.scales == nullptr)
    return make_error("cuda::gemv_quantized: empty weight (out=" + std::to_string(w.out) + ", in=" +
                      std::to_string(w.in) + ")");
  if (w.in % 32 != 0)
    return make_error("cuda::gemv_quantized: in=" + std::to_string(w.in) + " is not a multiple of 32");
  if (w.format == QuantWeightFormat::FP8Block && (w.block_out <= 0 || w.block_in <= 0 || w.block_in % 32 != 0))
    return make_error("cuda::gemv_quantized: FP8 weight block " + std::to_string(w.block_out) + "×" +
                      std::to_string(w.block_in) + " (block_in must be a multiple of 32)");
  if ((w.out + kRowsPerBlock - 1) / kRowsPerBlock > 0x7FFFFFFF)
    return make_error("cuda::gemv_quantized: out=" + std::to_string(w.out) + " is too large");
  return Status::Ok();
}

}  // namespace

Status quantize_act_fp8(const float* x, int64_t n, int64_t in, uint8_t* codes, float* scales, cudaStream_t stream) {
  if (n < 0 || in <= 0 || in % 32 != 0)
    return make_error("cuda::quantize_act_fp8: n=" + std::to_string(n) + ", in=" + std::to_string(in) +
                      " (in must be a positive multiple of 32)");
  const int64_t n_blocks = n * in / 32;
  if (n_blocks == 0) return Status::Ok();
  const int64_t grid = (n_blocks * 32 + kQuantThreads - 1) / kQuantThreads;
  quantize_act_fp8_kernel<<<static_cast<unsigned>(grid), kQuantThreads, 0, stream>>>(x, n_blocks, codes, scales);
  return launch_status("quantize_act_fp8_kernel");
}

Status gemv_quantized(const QuantWeightView& w, const uint8_t* act_codes, const float* act_scales, int64_t n,
                      float* y, bool bf16_output, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_weight(w));
  if (n < 0) return make_error("cuda::gemv_quantized: n=" + std::to_string(n));
  const unsigned grid = static_cast<unsigned>((w.out + kRowsPerBlock - 1) / kRowsPerBlock);
  for (int64_t t0 = 0; t0 < n; t0 += kTokensPerTile) {
    GemvParams p{};
    p.w = w.data;
    p.w_scales = w.scales;
    p.out = w.out;
    p.in = w.in;
    p.block_out = w.block_out;
    p.block_in = w.block_in;
    p.scale_cols = (w.in + w.block_in - 1) / w.block_in;
    p.act = act_codes + t0 * w.in;
    p.act_scales = act_scales + t0 * (w.in / 32);
    p.n = static_cast<int>(n - t0 < kTokensPerTile ? n - t0 : kTokensPerTile);
    p.y = y + t0 * w.out;
    p.bf16_output = bf16_output;
    if (w.format == QuantWeightFormat::MXFP4) {
      gemv_quantized_kernel<true><<<grid, kGemvWarps * 32, 0, stream>>>(p);
      CEDAR_RETURN_IF_ERROR(launch_status("gemv_quantized_kernel<MXFP4>"));
    } else {
      gemv_quantized_kernel<false><<<grid, kGemvWarps * 32, 0, stream>>>(p);
      CEDAR_RETURN_IF_ERROR(launch_status("gemv_quantized_kernel<FP8Block>"));
    }
  }
  return Status::Ok();
}

Status linear_quantized(const QuantWeightView& w, const float* x, int64_t n, const ActWorkspace& ws, float* y,
                        bool bf16_output, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_weight(w));
  if (n * w.in > ws.capacity_values)
    return make_error("cuda::linear_quantized: workspace holds " + std::to_string(ws.capacity_values) +
                      " activation values, need " + std::to_string(n * w.in));
  CEDAR_RETURN_IF_ERROR(quantize_act_fp8(x, n, w.in, ws.codes, ws.scales, stream));
  return gemv_quantized(w, ws.codes, ws.scales, n, y, bf16_output, stream);
}

// Exposed to catalog.cu for the loadability check.
const void* quantize_act_fp8_kernel_ptr() { return reinterpret_cast<const void*>(&quantize_act_fp8_kernel); }
const void* gemv_fp8_kernel_ptr() { return reinterpret_cast<const void*>(&gemv_quantized_kernel<false>); }
const void* gemv_mxfp4_kernel_ptr() { return reinterpret_cast<const void*>(&gemv_quantized_kernel<true>); }

}  // namespace cedar::cuda
