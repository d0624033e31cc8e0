// FP8 / MXFP4 prefill GEMMs through a bf16 cuBLASLt GEMM (gemm_kernels.h: quant_gemm / swiglu_gemm
// with `blas`, dequant_weight_bf16, act_codes_to_bf16, quantize_act_bf16).
//
// Why it is the same arithmetic: an e4m3 or e2m1 value times a power of two (UE8M0) has at most 4
// significant bits, so it is exactly a bf16 value (bf16 keeps fp32's exponent range; only a product
// below 2^-126 or above 2^127 — scale bytes no checkpoint uses — would round). The weight is
// dequantized once (bf16(W·2^(s−127)), the reference's own formula, e.g. for wo_a) and the FP8
// activation values q_a·s_a likewise; every product (q_a s_a)(q_w s_w) is then exact in fp32, and
// cuBLASLt accumulates them in fp32 (CUBLAS_COMPUTE_32F). The reference computes
// Σ_blocks (Σ q_a q_w)·s_a·s_w: the same exact products, summed in another order — the class of
// difference split-K already has, covered by the GEMM tolerance. Outputs are bf16-rounded as the
// reference's linear() (dense_gemm's rounding pass).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_kernels.h"

namespace cedar::cuda {
namespace {

constexpr int kThreads = 256;

// core/numeric.cpp's f32_to_bf16 bit for bit: RNE, NaN → quiet NaN with its sign, overflow → ±Inf.
__device__ __forceinline__ uint32_t bf16_bits(float v) {
  const uint32_t b = __float_as_uint(v);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return ((b >> 16) & 0x8000u) | 0x7FC0u;
  return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}

// core/numeric.cpp's e4m3_to_f32 bit for bit (NaN for 0x7F / 0xFF, subnormals man·2^-9).
__device__ __forceinline__ float e4m3_value(uint32_t bits) {
  const uint32_t sign = (bits & 0x80u) << 24, exp = (bits >> 3) & 0xFu, man = bits & 0x7u;
  if (exp == 0xFu && man == 0x7u) return __uint_as_float(0x7FC00000u);
  if (exp == 0) return __uint_as_float(sign | __float_as_uint(static_cast<float>(man) * 0x1p-9f));
  return __uint_as_float(sign | ((exp + 120u) << 23) | (man << 20));
}

// e2m1 code (low nibble) → its value {0, .5, 1, 1.5, 2, 3, 4, 6} with sign: the e4m3 byte of
// e2m1·2^-6 (gemv_common.cuh's exact trick) times 64.
__device__ __forceinline__ float e2m1_value(uint32_t code) {
  return e4m3_value(((code & 7u) << 2) | ((code & 8u) << 4)) * 64.0f;
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) { return bf16_bits(lo) | (bf16_bits(hi) << 16); }

// 8 consecutive values per thread: out[r, k..k+7] = bf16(e4m3(w) · 2^(s−127)).
__global__ void __launch_bounds__(kThreads)
    dequant_fp8_kernel(const uint8_t* w, const uint8_t* scales, int64_t out, int64_t in, int64_t block_out,
                       int64_t block_in, uint16_t* dst) {
  const int64_t groups = out * (in / 8), scale_cols = (in + block_in - 1) / block_in;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < groups;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = e / (in / 8), k = (e % (in / 8)) * 8;
    const uint2 b = __ldg(reinterpret_cast<const uint2*>(w + r * in + k));
    const float s = detail::ue8m0_to_float(__ldg(scales + (r / block_out) * scale_cols + k / block_in));
    float v[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[i] = __fmul_rn(e4m3_value((b.x >> (8 * i)) & 0xFFu), s);
      v[4 + i] = __fmul_rn(e4m3_value((b.y >> (8 * i)) & 0xFFu), s);
    }
    *reinterpret_cast<uint4*>(dst + r * in + k) =
        make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
  }
}

// MXFP4: 8 values (4 bytes, low nibble first) per thread, one scale per 32 along K.
__global__ void __launch_bounds__(kThreads)
    dequant_mxfp4_kernel(const uint8_t* w, const uint8_t* scales, int64_t out, int64_t in, uint16_t* dst) {
  const int64_t groups = out * (in / 8);
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < groups;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = e / (in / 8), k = (e % (in / 8)) * 8;
    const uint32_t b = __ldg(reinterpret_cast<const uint32_t*>(w + (r * in + k) / 2));
    const float s = detail::ue8m0_to_float(__ldg(scales + r * (in / 32) + k / 32));
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(e2m1_value((b >> (4 * i)) & 0xFu), s);
    *reinterpret_cast<uint4*>(dst + r * in + k) =
        make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
  }
}

// FP8 activation codes (f16 bits of e4m3 values) × their block scale → bf16 (exact).
__global__ void __launch_bounds__(kThreads)
    act_bf16_kernel(const uint16_t* codes, const float* scales, int64_t groups, int act_shift, uint16_t* dst) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < groups;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const uint4 c = __ldg(reinterpret_cast<const uint4*>(codes + 8 * e));
    const float s = __ldg(scales + ((8 * e) >> (5 + act_shift)));
    const uint32_t w[4] = {c.x, c.y, c.z, c.w};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float lo = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] & 0xFFFFu)));
      const float hi = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] >> 16)));
      o[i] = pack2(__fmul_rn(lo, s), __fmul_rn(hi, s));
    }
    *reinterpret_cast<uint4*>(dst + 8 * e) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// quantize_act_fp8(_blocked)'s recipe (bit-exact) but writing the dequantized values q·s as bf16.
// Each thread takes 4 consecutive values (one float4); a block of 32 is 8 lanes (max over the aligned
// 8-lane group: 3 shuffles), a block of 128 a whole warp. Grid-stride, 16-byte loads, 8-byte stores.
template <int kGroupLanes>
__global__ void __launch_bounds__(kThreads) quantize_act_bf16_kernel(const float* x, int64_t quads, uint16_t* dst) {
  for (int64_t q0 = static_cast<int64_t>(blockIdx.x) * kThreads; q0 < quads;
       q0 += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t q = q0 + threadIdx.x;
    const bool live = q < quads;  // quads % 8 == 0: whole 8-lane groups are live or not
    const float4 v = live ? __ldg(reinterpret_cast<const float4*>(x) + q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < kGroupLanes; o <<= 1) m = fmaxf(m, __shfl_xor_sync(detail::kFullMask, m, o));
    const float amax = fmaxf(m, 1e-4f);
    const float s = detail::ue8m0_to_float(detail::ue8m0_ceil_pow2(amax * (1.0f / 448.0f)));
    const float vs[4] = {v.x, v.y, v.z, v.w};
    uint32_t b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float qv = fminf(fmaxf(vs[i] / s, -448.0f), 448.0f);
      const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_cvt_float_to_fp8(qv, __NV_SATFINITE, __NV_E4M3), __NV_E4M3);
      b[i] = bf16_bits(__fmul_rn(__half2float(__half(h)), s));
    }
    if (live) reinterpret_cast<uint2*>(dst)[q] = make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
  }
}

// swiglu_gemm's epilogue over fp32 GEMM outputs g, u [m, inter] (gemm_tile.cu kSwiglu, expression for
// expression): bf16(g), bf16(u), clamps, silu with exp in double, routing weight, bf16, then the FP8
// quantization of h per activation block (32 · kPer values, lane-strided as in the tile epilogue).
// One warp per activation block.
template <int kPer>
__global__ void __launch_bounds__(kThreads)
    swiglu_quant_kernel(const float* g, const float* u, const float* row_weights, float limit, int64_t m, int64_t inter,
                        uint16_t* h_codes, float* h_scales) {
  constexpr int64_t kBlock = 32 * kPer;
  const int64_t blk = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (blk >= m * inter / kBlock) return;  // whole warps
  const int64_t row = (blk * kBlock) / inter;
  const float wt = row_weights != nullptr ? row_weights[row] : 1.0f;
  float h[kPer];
  float amax = 0.0f;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int64_t i = blk * kBlock + 32 * q + lane;
    float gv = detail::round_bf16(g[i]), uv = detail::round_bf16(u[i]);
    if (limit > 0.0f) {  // gate from above only, up on both sides; NaN passes
      gv = gv > limit ? limit : gv;
      uv = uv > limit ? limit : (uv < -limit ? -limit : uv);
    }
    const float e = static_cast<float>(exp(-static_cast<double>(gv)));
    float hv = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, e)), uv);
    if (row_weights != nullptr) hv = __fmul_rn(wt, hv);
    h[q] = detail::round_bf16(hv);
    amax = fmaxf(amax, fabsf(h[q]));
  }
  const float s = detail::act_block_scale(detail::warp_max(amax));
#pragma unroll
  for (int q = 0; q < kPer; ++q) h_codes[blk * kBlock + 32 * q + lane] = detail::act_code_f16(h[q], s);
  if (lane == 0) h_scales[blk] = s;
}

unsigned grid_for(int64_t items) {
  return static_cast<unsigned>(std::clamp<int64_t>((items + kThreads - 1) / kThreads, 1, 132 * 16));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

Status check_act(int64_t m, int64_t in, int64_t act_block, const void* a, const void* b, const char* who) {
  if (m < 0 || in <= 0 || in % 32 != 0 || (act_block != 32 && act_block != 128) || in % act_block != 0)
    return make_error(std::string("cuda::") + who + ": m=" + std::to_string(m) + ", in=" + std::to_string(in) +
                      ", act_block=" + std::to_string(act_block));
  if (m > 0 && (a == nullptr || b == nullptr)) return make_error(std::string("cuda::") + who + ": null pointer");
  return Status::Ok();
}

}  // namespace

Status dequant_weight_bf16(const QuantWeightView& w, uint16_t* out, cudaStream_t stream) {
  const std::string shape = std::to_string(w.out) + "x" + std::to_string(w.in);
  if (w.out <= 0 || w.in <= 0 || w.in % 32 != 0 || !w.data || !w.scales || !out)
    return make_error("cuda::dequant_weight_bf16: weight " + shape + " (in % 32 == 0, data, scales and out required)");
  if (!aligned16(out)) return make_error("cuda::dequant_weight_bf16: out must be 16-byte aligned");
  const int64_t groups = w.out * (w.in / 8);
  if (w.format == QuantWeightFormat::MXFP4) {
    if (reinterpret_cast<uintptr_t>(w.data) % 4 != 0)
      return make_error("cuda::dequant_weight_bf16: MXFP4 data must be 4-byte aligned");
    dequant_mxfp4_kernel<<<grid_for(groups), kThreads, 0, stream>>>(w.data, w.scales, w.out, w.in, out);
    return launch_status("dequant_mxfp4_kernel");
  }
  if (w.block_out <= 0 || w.block_in <= 0 || w.block_in % 32 != 0 || reinterpret_cast<uintptr_t>(w.data) % 8 != 0)
    return make_error("cuda::dequant_weight_bf16: FP8 weight " + shape + " block " + std::to_string(w.block_out) + "x" +
                      std::to_string(w.block_in) + " (block_in % 32 == 0, data 8-byte aligned)");
  dequant_fp8_kernel<<<grid_for(groups), kThreads, 0, stream>>>(w.data, w.scales, w.out, w.in, w.block_out, w.block_in,
                                                                out);
  return launch_status("dequant_fp8_kernel");
}

Status act_codes_to_bf16(const uint16_t* codes, const float* scales, int64_t m, int64_t in, int64_t act_block,
                         uint16_t* out, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_act(m, in, act_block, codes, out, "act_codes_to_bf16"));
  if (m == 0) return Status::Ok();
  if (!scales || !aligned16(codes) || !aligned16(out))
    return make_error("cuda::act_codes_to_bf16: scales required; codes and out 16-byte aligned");
  const int64_t groups = m * in / 8;
  act_bf16_kernel<<<grid_for(groups), kThreads, 0, stream>>>(codes, scales, groups, act_block == 128 ? 2 : 0, out);
  return launch_status("act_bf16_kernel");
}

Status quantize_act_bf16(const float* x, int64_t m, int64_t in, int64_t act_block, uint16_t* out, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_act(m, in, act_block, x, out, "quantize_act_bf16"));
  if (m == 0) return Status::Ok();
  if (!aligned16(x) || reinterpret_cast<uintptr_t>(out) % 8 != 0)
    return make_error("cuda::quantize_act_bf16: x must be 16-byte and out 8-byte aligned");
  const int64_t quads = m * in / 4;
  if (act_block == 128)
    quantize_act_bf16_kernel<32><<<grid_for(quads), kThreads, 0, stream>>>(x, quads, out);
  else
    quantize_act_bf16_kernel<8><<<grid_for(quads), kThreads, 0, stream>>>(x, quads, out);
  return launch_status("quantize_act_bf16_kernel");
}

int64_t quant_gemm_blas_elems(const QuantWeightView& w, int64_t m, bool weight_given) {
  return (weight_given ? 0 : w.out * w.in) + std::max<int64_t>(m, 0) * w.in;
}

SwigluBlasSizes swiglu_gemm_blas_sizes(const QuantWeightView& w1, int64_t m, bool weights_given) {
  SwigluBlasSizes s;
  s.bf16_elems = (weights_given ? 0 : 2 * w1.out * w1.in) + std::max<int64_t>(m, 0) * w1.in;
  s.floats = 2 * std::max<int64_t>(m, 0) * w1.out;
  return s;
}

namespace gemm_detail {

// quant_gemm with a.blas (arguments already checked by quant_gemm).
Status quant_gemm_blas(const QuantGemmArgs& a, const QuantGemmWorkspace& ws, cudaStream_t stream) {
  const int64_t need = quant_gemm_blas_elems(a.w, a.act_bf16 != nullptr ? 0 : a.m, a.w_bf16 != nullptr);
  if (need > 0 && (ws.bf16 == nullptr || ws.bf16_elems < need || !aligned16(ws.bf16)))
    return make_error("cuda::quant_gemm (blas): bf16 scratch of " + std::to_string(ws.bf16_elems) + " elements, need " +
                      std::to_string(need) + " (16-byte aligned)");
  uint16_t* scratch = ws.bf16;
  const uint16_t* wb = a.w_bf16;
  if (wb == nullptr) {
    CEDAR_RETURN_IF_ERROR(dequant_weight_bf16(a.w, scratch, stream));
    wb = scratch;
    scratch += a.w.out * a.w.in;
  }
  const uint16_t* xb = a.act_bf16;
  if (xb == nullptr) {
    CEDAR_RETURN_IF_ERROR(act_codes_to_bf16(a.act_codes, a.act_scales, a.m, a.w.in, a.act_block, scratch, stream));
    xb = scratch;
  }
  DenseGemmArgs g;
  g.type = DenseWeightType::BF16;
  g.w = wb;
  g.out = a.w.out;
  g.in = a.w.in;
  g.n = a.m;
  g.x_bf16 = xb;
  g.y = a.y;
  g.ldy = a.ldy;
  g.bf16_output = a.bf16_output;
  return dense_gemm(*a.blas, g, nullptr, 0, stream);
}

// swiglu_gemm with a.blas: W1 and W3 as two bf16 GEMMs into fp32 g / u, then the tile epilogue's
// SwiGLU + FP8 quantization as its own kernel.
Status swiglu_gemm_blas(const SwigluGemmArgs& a, cudaStream_t stream) {
  const bool given = a.w1_bf16 != nullptr && a.w3_bf16 != nullptr;
  const SwigluBlasSizes need = swiglu_gemm_blas_sizes(a.w1, a.m, given);
  if (a.bf16_scratch == nullptr || a.bf16_scratch_elems < need.bf16_elems || !aligned16(a.bf16_scratch) ||
      a.gu_scratch == nullptr || a.gu_scratch_floats < need.floats)
    return make_error("cuda::swiglu_gemm (blas): scratch of " + std::to_string(a.bf16_scratch_elems) + " bf16 / " +
                      std::to_string(a.gu_scratch_floats) + " floats, need " + std::to_string(need.bf16_elems) + " / " +
                      std::to_string(need.floats) + " (bf16 16-byte aligned)");
  const int64_t inter = a.w1.out, d = a.w1.in;
  uint16_t* scratch = a.bf16_scratch;
  const uint16_t* w1b = a.w1_bf16;
  const uint16_t* w3b = a.w3_bf16;
  if (!given) {
    CEDAR_RETURN_IF_ERROR(dequant_weight_bf16(a.w1, scratch, stream));
    CEDAR_RETURN_IF_ERROR(dequant_weight_bf16(a.w3, scratch + inter * d, stream));
    w1b = scratch;
    w3b = scratch + inter * d;
    scratch += 2 * inter * d;
  }
  CEDAR_RETURN_IF_ERROR(act_codes_to_bf16(a.act_codes, a.act_scales, a.m, d, a.act_block, scratch, stream));
  float* g = a.gu_scratch;
  float* u = a.gu_scratch + a.m * inter;
  DenseGemmArgs gm;
  gm.type = DenseWeightType::BF16;
  gm.out = inter;
  gm.in = d;
  gm.n = a.m;
  gm.x_bf16 = scratch;
  gm.bf16_output = false;  // the epilogue rounds g and u (as the tile kernel's)
  gm.w = w1b;
  gm.y = g;
  CEDAR_RETURN_IF_ERROR(dense_gemm(*a.blas, gm, nullptr, 0, stream));
  gm.w = w3b;
  gm.y = u;
  CEDAR_RETURN_IF_ERROR(dense_gemm(*a.blas, gm, nullptr, 0, stream));
  const int64_t n_blocks = a.m * inter / a.act_block;
  const auto grid = static_cast<unsigned>((n_blocks * 32 + kThreads - 1) / kThreads);
  if (a.act_block == 128)
    swiglu_quant_kernel<4>
        <<<grid, kThreads, 0, stream>>>(g, u, a.row_weights, a.swiglu_limit, a.m, inter, a.h_codes, a.h_scales);
  else
    swiglu_quant_kernel<1>
        <<<grid, kThreads, 0, stream>>>(g, u, a.row_weights, a.swiglu_limit, a.m, inter, a.h_codes, a.h_scales);
  return launch_status("swiglu_quant_kernel");
}

}  // namespace gemm_detail

const void* dequant_fp8_kernel_ptr() { return reinterpret_cast<const void*>(&dequant_fp8_kernel); }
const void* dequant_mxfp4_kernel_ptr() { return reinterpret_cast<const void*>(&dequant_mxfp4_kernel); }

}  // namespace cedar::cuda
