// Host side of the FP8 / MXFP4 prefill GEMMs (gemm_kernels.h): argument checks, the launch plan (tile
// height and K splits from a wave model of the GPU), quant_gemm, swiglu_gemm, and the 128-wide FP8
// activation quantization of V4.
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_internal.h"
#include "backend/cuda/gemm_kernels.h"

namespace cedar::cuda {

namespace gemm_detail {
Status splitk_reduce(const float* partials, int splits, int64_t m, int64_t n, float* y, int64_t ldy, bool round,
                     cudaStream_t stream);
const void* gemm_fp8_kernel_ptr();
const void* gemm_mxfp4_kernel_ptr();
Status quant_gemm_blas(const QuantGemmArgs& a, const QuantGemmWorkspace& ws, cudaStream_t stream);  // gemm_blas.cu
Status swiglu_gemm_blas(const SwigluGemmArgs& a, cudaStream_t stream);
}  // namespace gemm_detail

namespace {

using gemm_detail::Epilogue;
using gemm_detail::Problem;

constexpr int kQuantThreads = 256;

// One warp per 128-value block: 4 consecutive values per lane, the UE8M0 scale of the block's amax,
// e4m3 codes stored as f16 bits (cpu::linear's recipe, as quantize_act_fp8 for 32-blocks).
__global__ void __launch_bounds__(kQuantThreads)
    quantize_act_fp8_128_kernel(const float* x, int64_t n_blocks, uint16_t* codes, float* scales) {
  const int64_t blk = (static_cast<int64_t>(blockIdx.x) * kQuantThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (blk >= n_blocks) return;  // whole warps exit together
  const float4 v = *reinterpret_cast<const float4*>(x + blk * 128 + 4 * lane);
  const float m4 = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  const float s = detail::act_block_scale(detail::warp_max(m4));
  const float vs[4] = {v.x, v.y, v.z, v.w};
  uint16_t c[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) c[e] = detail::act_code_f16(vs[e], s);
  *reinterpret_cast<uint2*>(codes + blk * 128 + 4 * lane) =
      make_uint2(c[0] | (static_cast<uint32_t>(c[1]) << 16), c[2] | (static_cast<uint32_t>(c[3]) << 16));
  if (lane == 0) scales[blk] = s;
}

int log2_exact(int64_t v) {
  int s = 0;
  while ((int64_t{1} << s) < v) ++s;
  return (int64_t{1} << s) == v ? s : -1;
}

std::string shape_str(const QuantWeightView& w) { return std::to_string(w.out) + "x" + std::to_string(w.in); }

Status check_weight(const QuantWeightView& w, int64_t act_block, const char* who) {
  const std::string name = std::string("cuda::") + who + ": weight " + shape_str(w);
  if (w.out <= 0 || w.in <= 0 || w.data == nullptr || w.scales == nullptr) return make_error(name + " is empty");
  if (w.in % 32 != 0) return make_error(name + ": in=" + std::to_string(w.in) + " is not a multiple of 32");
  if (w.in / 32 > 0x3FFFFFFF || w.out > 0x3FFFFFFF) return make_error(name + " is too large");
  if (act_block != 32 && act_block != 128)
    return make_error(name + ": act_block=" + std::to_string(act_block) + " (32 or 128)");
  if (w.in % act_block != 0)
    return make_error(name + ": in is not a multiple of the activation block " + std::to_string(act_block));
  if (w.format == QuantWeightFormat::FP8Block) {
    if (w.block_out <= 0 || w.block_out % 32 != 0 || w.block_in <= 0 || w.block_in % act_block != 0 ||
        log2_exact(w.block_in / 32) < 0)
      return make_error(name + ": FP8 block " + std::to_string(w.block_out) + "x" + std::to_string(w.block_in) +
                        " (block_out a multiple of 32, block_in the activation block times a power of two)");
  }
  return Status::Ok();
}

int device_sms() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) {
    cudaGetLastError();  // clear; plan for an H200
    return 132;
  }
  return sms;
}

// Wave model: a 256 × tile_m tile over one K block costs (tile_m / 128) · cost units on an SM of its own;
// `slots` CTAs share an SM; split-K adds the partials' round trip through memory. Good enough to choose
// between tile heights and splits (it ranks, it does not predict).
QuantGemmPlan choose_plan(int64_t out_tiles, int64_t m, int64_t n_kb, int64_t partial_floats_per_split,
                          bool allow_split) {
  struct Option {
    int tile_m, slots;
    double cost;
  };
  // cost: per-MAC penalty of the shorter tiles (A fragments reused by fewer tokens).
  static constexpr Option kOptions[] = {{128, 1, 1.0}, {64, 2, 1.1}, {32, 2, 1.35}};
  const int sms = device_sms();
  constexpr double kUnitUs = 0.6;        // one 128 × 256 × 32 tile step on one SM
  constexpr double kBytesPerUs = 3.0e6;  // partial sums' write + read
  QuantGemmPlan best;
  double best_us = 1e300;
  for (const Option& o : kOptions) {
    const int64_t tiles = (m + o.tile_m - 1) / o.tile_m * out_tiles;
    for (const int s : {1, 2, 3, 4, 6, 8}) {
      if (s > 1 && (!allow_split || n_kb / s < 4)) continue;
      const int64_t ctas = tiles * s;
      const int64_t active = std::min<int64_t>(o.slots, (ctas + sms - 1) / sms);
      const int64_t rounds = (ctas + sms * active - 1) / (sms * active);
      const double step_us = kUnitUs * o.tile_m / 128.0 * o.cost * static_cast<double>(active);
      double us = static_cast<double>(rounds) * step_us * static_cast<double>((n_kb + s - 1) / s);
      if (s > 1) us += static_cast<double>(s + 1) * 4.0 * static_cast<double>(partial_floats_per_split) / kBytesPerUs;
      if (us < best_us * 0.999) {  // ties keep the earlier (taller, unsplit) option
        best_us = us;
        best = QuantGemmPlan{o.tile_m, s};
      }
    }
  }
  return best;
}

}  // namespace

Status quantize_act_fp8_blocked(const float* x, int64_t n, int64_t in, int64_t act_block, uint16_t* codes,
                                float* scales, cudaStream_t stream) {
  if (act_block == 32) return quantize_act_fp8(x, n, in, codes, scales, stream);
  if (act_block != 128 || n < 0 || in <= 0 || in % 128 != 0)
    return make_error("cuda::quantize_act_fp8_blocked: n=" + std::to_string(n) + ", in=" + std::to_string(in) +
                      ", act_block=" + std::to_string(act_block) + " (block 32 or 128 dividing in)");
  const int64_t n_blocks = n * in / 128;
  if (n_blocks == 0) return Status::Ok();
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(codes) % 8 != 0)
    return make_error("cuda::quantize_act_fp8_blocked: x must be 16-byte and codes 8-byte aligned");
  const int64_t grid = (n_blocks * 32 + kQuantThreads - 1) / kQuantThreads;
  quantize_act_fp8_128_kernel<<<static_cast<unsigned>(grid), kQuantThreads, 0, stream>>>(x, n_blocks, codes, scales);
  return launch_status("quantize_act_fp8_128_kernel");
}

QuantGemmPlan quant_gemm_plan(const QuantWeightView& w, int64_t m, bool with_workspace) {
  return choose_plan((w.out + 255) / 256, m, w.in / 32, m * w.out, with_workspace);
}

int64_t quant_gemm_workspace_floats(const QuantWeightView& w, int64_t m) {
  const QuantGemmPlan plan = quant_gemm_plan(w, m, true);
  return plan.splits > 1 ? plan.splits * m * w.out : 0;
}

Status quant_gemm(const QuantGemmArgs& a, const QuantGemmWorkspace& ws, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_weight(a.w, a.act_block, "quant_gemm"));
  const int64_t ldy = a.ldy == 0 ? a.w.out : a.ldy;
  if (a.m < 0 || a.m > 0x7FFFFFFF) return make_error("cuda::quant_gemm: m=" + std::to_string(a.m));
  if (ldy < a.w.out)
    return make_error("cuda::quant_gemm: ldy=" + std::to_string(ldy) + " < out=" + std::to_string(a.w.out));
  if (a.m == 0) return Status::Ok();
  const bool bf16_acts = a.blas != nullptr && a.act_bf16 != nullptr;
  if ((!bf16_acts && (a.act_codes == nullptr || a.act_scales == nullptr)) || a.y == nullptr)
    return make_error("cuda::quant_gemm: null activation or output pointer (m=" + std::to_string(a.m) + ")");
  if (a.blas != nullptr) return gemm_detail::quant_gemm_blas(a, ws, stream);

  QuantGemmPlan plan = quant_gemm_plan(a.w, a.m, true);
  if (plan.splits > 1 && (ws.partials == nullptr || ws.partial_floats < plan.splits * a.m * a.w.out))
    plan = quant_gemm_plan(a.w, a.m, false);
  if (a.force_tile_m != 0) {
    if (!gemm_detail::valid_tile_m(a.force_tile_m))
      return make_error("cuda::quant_gemm: force_tile_m=" + std::to_string(a.force_tile_m) + " (32, 64 or 128)");
    plan.tile_m = a.force_tile_m;
  }
  if (a.force_splits != 0) {
    if (a.force_splits < 1 || a.force_splits > 64)
      return make_error("cuda::quant_gemm: force_splits=" + std::to_string(a.force_splits) + " (1..64)");
    if (a.force_splits > 1 && (ws.partials == nullptr || ws.partial_floats < a.force_splits * a.m * a.w.out))
      return make_error("cuda::quant_gemm: force_splits=" + std::to_string(a.force_splits) + " needs " +
                        std::to_string(a.force_splits * a.m * a.w.out) + " workspace floats, have " +
                        std::to_string(ws.partial_floats));
    plan.splits = a.force_splits;
  }

  const int64_t n_kb = a.w.in / 32;
  Problem p;
  p.fp4 = a.w.format == QuantWeightFormat::MXFP4;
  p.act = a.act_codes;
  p.act_scales = a.act_scales;
  p.K = a.w.in;
  p.act_shift = a.act_block == 128 ? 2 : 0;
  p.m = a.m;
  p.w[0] = p.w[1] = a.w.data;
  p.ws[0] = p.ws[1] = a.w.scales;
  p.N = a.w.out;
  p.dual = false;
  p.block_out = a.w.block_out;
  p.scale_cols = (a.w.in + a.w.block_in - 1) / a.w.block_in;
  p.kb_shift = p.fp4 ? 0 : log2_exact(a.w.block_in / 32);
  p.kb_per_split = static_cast<int>((n_kb + plan.splits - 1) / plan.splits);
  p.bf16_round = a.bf16_output;
  if (plan.splits > 1) {
    p.epilogue = Epilogue::kPartial;
    p.y = ws.partials;
    p.ldy = a.w.out;
  } else {
    p.epilogue = Epilogue::kF32;
    p.y = a.y;
    p.ldy = ldy;
  }
  const int64_t m_tiles = (a.m + plan.tile_m - 1) / plan.tile_m;
  CEDAR_RETURN_IF_ERROR(gemm_detail::launch(p, plan.tile_m, m_tiles, plan.splits, stream));
  if (plan.splits > 1)
    return gemm_detail::splitk_reduce(ws.partials, plan.splits, a.m, a.w.out, a.y, ldy, a.bf16_output, stream);
  return Status::Ok();
}

Status swiglu_gemm(const SwigluGemmArgs& a, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_weight(a.w1, a.act_block, "swiglu_gemm (w1)"));
  CEDAR_RETURN_IF_ERROR(check_weight(a.w3, a.act_block, "swiglu_gemm (w3)"));
  if (a.w1.format != a.w3.format || a.w1.out != a.w3.out || a.w1.in != a.w3.in ||
      (a.w1.format == QuantWeightFormat::FP8Block &&
       (a.w1.block_out != a.w3.block_out || a.w1.block_in != a.w3.block_in)))
    return make_error("cuda::swiglu_gemm: w1 " + shape_str(a.w1) + " and w3 " + shape_str(a.w3) +
                      " differ in shape, format or blocks");
  if (a.w1.out % a.act_block != 0)
    return make_error("cuda::swiglu_gemm: inter=" + std::to_string(a.w1.out) +
                      " is not a multiple of the activation block " + std::to_string(a.act_block));
  if (a.m < 0 || a.m > 0x7FFFFFFF) return make_error("cuda::swiglu_gemm: m=" + std::to_string(a.m));
  if (a.m == 0) return Status::Ok();
  if (a.act_codes == nullptr || a.act_scales == nullptr || a.h_codes == nullptr || a.h_scales == nullptr)
    return make_error("cuda::swiglu_gemm: null activation or output pointer (m=" + std::to_string(a.m) + ")");
  if (a.blas != nullptr) return gemm_detail::swiglu_gemm_blas(a, stream);
  QuantGemmPlan plan = choose_plan((a.w1.out + 127) / 128, a.m, a.w1.in / 32, 0, false);
  if (a.force_tile_m != 0) {
    if (!gemm_detail::valid_tile_m(a.force_tile_m))
      return make_error("cuda::swiglu_gemm: force_tile_m=" + std::to_string(a.force_tile_m) + " (32, 64 or 128)");
    plan.tile_m = a.force_tile_m;
  }
  Problem p;
  p.fp4 = a.w1.format == QuantWeightFormat::MXFP4;
  p.act = a.act_codes;
  p.act_scales = a.act_scales;
  p.K = a.w1.in;
  p.act_shift = a.act_block == 128 ? 2 : 0;
  p.m = a.m;
  p.w[0] = a.w1.data;
  p.w[1] = a.w3.data;
  p.ws[0] = a.w1.scales;
  p.ws[1] = a.w3.scales;
  p.N = a.w1.out;
  p.dual = true;
  p.block_out = a.w1.block_out;
  p.scale_cols = (a.w1.in + a.w1.block_in - 1) / a.w1.block_in;
  p.kb_shift = p.fp4 ? 0 : log2_exact(a.w1.block_in / 32);
  p.kb_per_split = static_cast<int>(a.w1.in / 32);
  p.epilogue = Epilogue::kSwiglu;
  p.row_weights = a.row_weights;
  p.swiglu_limit = a.swiglu_limit;
  p.h_codes = a.h_codes;
  p.h_scales = a.h_scales;
  p.h_act_shift = p.act_shift;
  return gemm_detail::launch(p, plan.tile_m, (a.m + plan.tile_m - 1) / plan.tile_m, 1, stream);
}

const void* dequant_fp8_kernel_ptr();    // gemm_blas.cu
const void* dequant_mxfp4_kernel_ptr();  // gemm_blas.cu

std::vector<KernelInfo> gemm_kernel_catalog() {
  return {{"gemm_fp8_block", "FP8 block-scaled prefill GEMM, 256x128 tiles, exact f16 HMMA, per-32-K fp32 scaling"},
          {"gemm_mxfp4", "MXFP4 prefill / grouped expert GEMM (e2m1 -> e4m3 exact), fused SwiGLU + FP8 quant"},
          {"dequant_fp8_bf16", "FP8 block-scaled weight -> exact bf16 (cuBLASLt prefill path, wo_a)"},
          {"dequant_mxfp4_bf16", "MXFP4 weight -> exact bf16 (cuBLASLt prefill path)"}};
}

Status check_gemm_kernels_loadable() {
  const std::pair<const char*, const void*> kernels[] = {{"gemm_fp8_block", gemm_detail::gemm_fp8_kernel_ptr()},
                                                         {"gemm_mxfp4", gemm_detail::gemm_mxfp4_kernel_ptr()},
                                                         {"dequant_fp8_bf16", dequant_fp8_kernel_ptr()},
                                                         {"dequant_mxfp4_bf16", dequant_mxfp4_kernel_ptr()}};
  for (const auto& [name, ptr] : kernels) {
    cudaFuncAttributes attr{};
    if (cudaError_t err = cudaFuncGetAttributes(&attr, ptr); err != cudaSuccess)
      return cuda_status(err, (std::string("cudaFuncGetAttributes(") + name + ")").c_str());
  }
  return Status::Ok();
}

}  // namespace cedar::cuda
