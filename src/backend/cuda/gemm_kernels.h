// Host entry points of the CUDA prefill GEMMs (owner: cuda-gemm). Every pointer argument is DEVICE
// memory unless stated otherwise; every call is asynchronous on `stream`, validates its arguments
// before any launch and returns Status; every kernel is deterministic (no atomics whose order changes
// results) and graph-capturable (no host sync, no allocation). C++17 (included from .cu files).
//
// Three families (docs/cuda-log.md "Prefill GEMMs"):
//   1. quant_gemm / swiglu_gemm — FP8 (e4m3, UE8M0 32×32 or 128×128 blocks) and MXFP4 weights × FP8
//      block-quantized activations on the tensor cores (mma.sync m16n8k16 f16 → f32 over exact f16
//      operands), y = Σ_kblocks (Σ q_a·q_w)·s_a·s_w in fp32 with the blocks added in ascending K order,
//      as cpu::linear does. swiglu_gemm runs W1 and W3 together and fuses the SwiGLU (clamps, routing
//      weight) and the FP8 quantization of its output (the input of W2).
//   2. moe_permute / moe_experts / moe_prefill_combine — the routed experts of a prefill chunk: tokens grouped
//      per expert in token order (device-side counting sort), one grouped launch for all experts' W1/W3
//      (+SwiGLU), one for W2, and the combine back to token order in the CPU's summation order.
//   3. dense_gemm — BF16 / F32 weights through cuBLASLt (fp32 accumulation), the CPU's output rounding.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/status.h"

namespace cedar::cuda {

// ---- FP8 activation quantization with a block of 32 (V4.1) or 128 (V4) -------------------------
// As quantize_act_fp8 (bit-exact with cpu::linear's recipe), for act_block ∈ {32, 128}; scales are
// [n, in / act_block]. act_block 32 forwards to quantize_act_fp8.
Status quantize_act_fp8_blocked(const float* x, int64_t n, int64_t in, int64_t act_block, uint16_t* codes,
                                float* scales, cudaStream_t stream);

class BlasContext;  // below

// ---- block-scaled GEMM (prefill linear) -------------------------------------------------------
struct QuantGemmArgs {
  QuantWeightView w;                    // FP8Block (block_out % 32 == 0) or MXFP4, [out, in], in % 32 == 0
  const uint16_t* act_codes = nullptr;  // [m, w.in] quantize_act_fp8(_blocked) codes (f16 values of e4m3)
  const float* act_scales = nullptr;    // [m, w.in / act_block]
  int64_t m = 0;                        // tokens (any m >= 0)
  int64_t act_block = 32;               // 32 (V4.1) or 128 (V4); FP8: w.block_in % act_block == 0
  float* y = nullptr;                   // [m, ldy] fp32; columns [0, out) written
  int64_t ldy = 0;                      // 0: w.out
  bool bf16_output = true;              // round y to bf16 (what the reference's linear() returns)
  // 0: automatic (quant_gemm_plan). Tests and benchmarks pin a tile height (32/64/128) or a split
  // count; a split needs the workspace (without it the override is an error).
  int force_tile_m = 0, force_splits = 0;
  // cuBLASLt path ("FP8 / MXFP4 through bf16 cuBLASLt" below): with `blas` the weight (or w_bf16, the
  // weight already dequantized by dequant_weight_bf16) and the activation values are taken as exact
  // bf16 and multiplied by one cuBLASLt GEMM with fp32 accumulation; needs QuantGemmWorkspace::bf16.
  // force_tile_m / force_splits do not apply.
  BlasContext* blas = nullptr;
  const uint16_t* w_bf16 = nullptr;    // [out, in] bf16 bits, or null (dequantized into the workspace)
  const uint16_t* act_bf16 = nullptr;  // [m, in] quantize_act_bf16 output; then act_codes/scales are unused
};

// Split-K scratch for shapes whose tiles fill the GPU badly (e.g. wkv 512×5120 at 1k tokens). The
// partial sums of the K ranges are added in split order by a second kernel (deterministic). Without it
// (or when too small) the GEMM runs unsplit; unsplit, the K blocks are added in ascending order per
// output as cpu::linear does, so most outputs equal the CPU's bit for bit.
struct QuantGemmWorkspace {
  float* partials = nullptr;
  int64_t partial_floats = 0;
  uint16_t* bf16 = nullptr;  // cuBLASLt path: quant_gemm_blas_elems() elements, 16-byte aligned
  int64_t bf16_elems = 0;
};
// Floats of scratch quant_gemm would use for this shape (0: never split).
int64_t quant_gemm_workspace_floats(const QuantWeightView& w, int64_t m);

Status quant_gemm(const QuantGemmArgs& a, const QuantGemmWorkspace& ws, cudaStream_t stream);

// The launch quant_gemm picks for a shape (tests, benchmarks): tokens per tile and K splits.
struct QuantGemmPlan {
  int tile_m = 128;  // 128, 64 or 32 tokens per CTA (256 output rows per CTA always)
  int splits = 1;
};
QuantGemmPlan quant_gemm_plan(const QuantWeightView& w, int64_t m, bool with_workspace);

// ---- SwiGLU expert pair: W1 and W3 in one launch, fused SwiGLU and FP8 quantization ----------------
// h = bf16(w_t · silu(min(g, L)) · clamp(u, −L, L)), g = bf16(W1 x), u = bf16(W3 x) (clamps only for
// L > 0; w_t = row_weights[t] or 1), exp in double precision rounded to float (≈ glibc's correctly
// rounded expf: the CPU's std::exp); then h is quantized per token in blocks of act_block exactly as
// quantize_act_fp8_blocked would, ready for W2. The shared expert in prefill: swiglu_gemm then
// quant_gemm(W2).
struct SwigluGemmArgs {
  QuantWeightView w1, w3;               // gate and up, both [inter, d], same format and blocks
  const uint16_t* act_codes = nullptr;  // [m, d]
  const float* act_scales = nullptr;    // [m, d / act_block]
  int64_t m = 0;
  int64_t act_block = 32;              // of x and of h; inter % act_block == 0
  const float* row_weights = nullptr;  // [m] routing weights, or null (shared expert)
  float swiglu_limit = 0.0f;           // <= 0: no clamps
  uint16_t* h_codes = nullptr;         // [m, inter]
  float* h_scales = nullptr;           // [m, inter / act_block]
  int force_tile_m = 0;                // 0: automatic
  // cuBLASLt path: W1 and W3 as two exact-bf16 GEMMs (weights dequantized into bf16_scratch unless
  // both *_bf16 are given) into fp32 g / u (gu_scratch), then the same SwiGLU + FP8 quantization as
  // the tile kernel's epilogue. Sizes: swiglu_gemm_blas_sizes().
  BlasContext* blas = nullptr;
  const uint16_t* w1_bf16 = nullptr;
  const uint16_t* w3_bf16 = nullptr;
  uint16_t* bf16_scratch = nullptr;  // 16-byte aligned
  int64_t bf16_scratch_elems = 0;
  float* gu_scratch = nullptr;
  int64_t gu_scratch_floats = 0;
};
Status swiglu_gemm(const SwigluGemmArgs& a, cudaStream_t stream);

// ---- FP8 / MXFP4 through bf16 cuBLASLt (prefill) ----------------------------------------------
// e4m3·2^k and e2m1·2^k (UE8M0 scales) are exactly bf16 values, and so are the FP8-quantized
// activations q_a·s_a, so a bf16 GEMM with fp32 accumulation over the dequantized operands forms the
// reference's exact products and differs from Σ_blocks (Σ q_a q_w)·s_a·s_w only in the fp32 summation
// order (as split-K does; the quant_gemm tolerance covers it). The dense linears of a prefill chunk
// run at cuBLAS's bf16 rate; the weight can be dequantized per call (scratch) or once and kept.
// dequant_weight_bf16: out[r, k] = bf16(W[r, k]·2^(s−127)) — the reference's own dequantization
// (core/numeric f32_to_bf16 of e4m3_to_f32·ue8m0_to_f32, bit for bit; e.g. wo_a, §2.3).
Status dequant_weight_bf16(const QuantWeightView& w, uint16_t* out, cudaStream_t stream);
// bf16(code·scale) of quantize_act_fp8(_blocked)'s output (exact). codes / out 16-byte aligned.
Status act_codes_to_bf16(const uint16_t* codes, const float* scales, int64_t m, int64_t in, int64_t act_block,
                         uint16_t* out, cudaStream_t stream);
// quantize_act_fp8_blocked's recipe written as the dequantized bf16 values (the GEMM's B operand).
Status quantize_act_bf16(const float* x, int64_t m, int64_t in, int64_t act_block, uint16_t* out, cudaStream_t stream);
// Scratch of quant_gemm's cuBLASLt path: the dequantized weight (unless given) + the activations
// (unless act_bf16 is given: pass m = 0).
int64_t quant_gemm_blas_elems(const QuantWeightView& w, int64_t m, bool weight_given);
struct SwigluBlasSizes {
  int64_t bf16_elems = 0, floats = 0;
};
SwigluBlasSizes swiglu_gemm_blas_sizes(const QuantWeightView& w1, int64_t m, bool weights_given);

// ---- routed experts (prefill MoE) ---------------------------------------------------------------
// The router's top-k on the device: expert ids [n, topk] (int32) and routing weights [n, topk].
struct MoeRouteView {
  const int32_t* expert_ids = nullptr;
  const float* weights = nullptr;
  int64_t n = 0, topk = 0, n_experts = 0;  // n_experts <= kMoePrefillMaxExperts
};
constexpr int64_t kMoePrefillMaxExperts = 1024;

// Tokens grouped per expert: row r of the permuted space (rows of expert e are
// [row_offsets[e], row_offsets[e+1])) is slot (row_token[r], ·) of the routing, rows of one expert in
// ascending (token, slot) order — the CPU's grouping. slot_row[t·topk + k] is the row of slot k of
// token t (−1 for an expert id outside [0, n_experts), which is dropped). tile_offsets[e] counts the
// tile_rows-row tiles of the experts before e (the grouped GEMMs' schedule).
struct MoePermutation {
  int32_t* chunk_hist = nullptr;    // scratch [moe_permutation_sizes().chunk_hist]
  int32_t* row_offsets = nullptr;   // [n_experts + 1]
  int32_t* tile_offsets = nullptr;  // [n_experts + 1]
  int32_t* row_token = nullptr;     // [n·topk]
  float* row_weight = nullptr;      // [n·topk]
  int32_t* slot_row = nullptr;      // [n·topk]
};
struct MoePermutationSizes {
  int64_t chunk_hist = 0, offsets = 0, rows = 0;  // element counts of the buffers above
};
MoePermutationSizes moe_permutation_sizes(int64_t n, int64_t topk, int64_t n_experts);
// Tokens per tile of the grouped GEMMs for this routing shape (32, 64 or 128: small tiles when each
// expert gets few rows, e.g. 1k tokens × top-6 over 384 experts ≈ 16 rows per expert).
int moe_tile_rows(int64_t n, int64_t topk, int64_t n_experts);
Status moe_permute(const MoeRouteView& route, int tile_rows, const MoePermutation& perm, cudaStream_t stream);

// Per-expert weights: DEVICE arrays of n_experts device pointers each (experts may live anywhere).
struct MoeExpertTable {
  QuantWeightFormat format = QuantWeightFormat::MXFP4;
  int64_t d = 0, inter = 0;               // w1/w3 [inter, d], w2 [d, inter]
  int64_t block_out = 32, block_in = 32;  // FP8Block experts only
  const uint8_t* const* w1_data = nullptr;
  const uint8_t* const* w1_scales = nullptr;
  const uint8_t* const* w3_data = nullptr;
  const uint8_t* const* w3_scales = nullptr;
  const uint8_t* const* w2_data = nullptr;
  const uint8_t* const* w2_scales = nullptr;
};
struct MoeExpertArgs {
  MoeExpertTable experts;
  MoeRouteView route;   // n, topk, n_experts (ids/weights are read by moe_permute only)
  MoePermutation perm;  // filled by moe_permute(route, tile_rows)
  int tile_rows = 128;
  const uint16_t* x_codes = nullptr;  // [n, d] the normed input, quantized per token
  const float* x_scales = nullptr;    // [n, d / act_block]
  int64_t act_block = 32;
  float swiglu_limit = 0.0f;
  uint16_t* h_codes = nullptr;  // scratch [n·topk, inter]
  float* h_scales = nullptr;    // scratch [n·topk, inter / act_block]
  uint16_t* y_rows = nullptr;   // [n·topk, d] bf16 bits: expert outputs in permuted row order
};
// W1/W3 + SwiGLU (routing weight before W2) and W2 of every expert over its rows: two launches.
Status moe_experts(const MoeExpertArgs& a, cudaStream_t stream);

// y[t] = bf16( Σ_{slots of t, ascending expert id, then slot} y_rows[slot_row] + shared[t] ) in fp32,
// the CPU's order (model/moe.cpp), so the combine adds nothing of its own to the rounding.
struct MoePrefillCombineArgs {
  const int32_t* expert_ids = nullptr;            // [n, topk] (the routing moe_permute saw)
  const int32_t* slot_row = nullptr;              // [n, topk]
  const uint16_t* y_rows = nullptr;               // [n·topk, d] bf16 bits
  const float* shared = nullptr;                  // [n, d] shared-expert output (bf16 values), or null
  int64_t n = 0, topk = 0, d = 0, n_experts = 0;  // d % 8 == 0
  float* y = nullptr;                             // [n, d]
};
Status moe_prefill_combine(const MoePrefillCombineArgs& a, cudaStream_t stream);

// ---- BF16 / F32 weights through cuBLASLt ------------------------------------------------------
// cuBLASLt is loaded at run time (dlopen of libcublasLt.so.13): binaries start on machines without it,
// and BlasContext::create names what is missing. One context per thread of use (not thread-safe): it
// owns the handle, a workspace and the chosen algorithm per shape (the same shape always runs the same
// algorithm, so results are reproducible run to run on one GPU).
class BlasContext {
 public:
  static Result<std::unique_ptr<BlasContext>> create(size_t workspace_bytes = size_t{32} << 20);
  ~BlasContext();
  BlasContext(const BlasContext&) = delete;
  BlasContext& operator=(const BlasContext&) = delete;
  std::string version() const;  // e.g. "cuBLASLt 130100"

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit BlasContext(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

enum class DenseWeightType { BF16, F32 };
// y[b][t, :out] = x[b][t, :in] · W[b]ᵀ for batch items b (wo_a: 8 groups of one [o_groups·o_lora, in_g]
// weight applied to 8 column slices of o). fp32 accumulation of exact products (BF16: bf16 × bf16-exact x;
// F32: fp32 FMAs, no TF32); only the summation order differs from cpu::linear.
struct DenseGemmArgs {
  DenseWeightType type = DenseWeightType::BF16;
  const void* w = nullptr;  // [out, in] row-major: bf16 bits or floats
  int64_t out = 0, in = 0;
  const float* x = nullptr;  // [n, ldx] fp32 holding bf16 values (BF16: converted to bf16 exactly)
  int64_t n = 0, ldx = 0;    // ldx 0: in
  float* y = nullptr;        // [n, ldy]
  int64_t ldy = 0;           // 0: out
  bool bf16_output = true;   // round y to bf16 (cpu::linear's bf16_output)
  int64_t batch = 1;
  int64_t w_stride = 0, x_stride = 0, y_stride = 0;  // elements between batch items
  // BF16 only: x already as bf16 bits (same layout as x; x is then ignored, no workspace needed).
  const uint16_t* x_bf16 = nullptr;
};
// bf16 elements of scratch dense_gemm needs for x (0 for F32 weights or a given x_bf16).
int64_t dense_gemm_workspace_elems(const DenseGemmArgs& a);
Status dense_gemm(BlasContext& ctx, const DenseGemmArgs& a, uint16_t* x_bf16_workspace, int64_t workspace_elems,
                  cudaStream_t stream);

// Kernel catalog entries of this file family (for the lead to wire into kernel_catalog()).
std::vector<KernelInfo> gemm_kernel_catalog();
Status check_gemm_kernels_loadable();

}  // namespace cedar::cuda
