// Mixture-of-experts FFN of one layer (architecture.md §3.8; V4 hash routing §5): the router, the
// SwiGLU experts and the shared expert, with the official reference's numerics. CPU oracle for the
// CUDA kernels: simple loops, deterministic, and a token's output never depends on the other tokens of
// the chunk (bitwise).
//
// Numerics per token (x: bf16 values held in fp32):
//   logits = fp32(x)·fp32(W_gate)ᵀ / gate_temp          (fp32 GEMM, cpu::linear with an F32 weight)
//   s      = sqrt(softplus(logits))                     (fp32; softplus(v) = v for v > 20, as torch)
//   select = top-k of s + b, b = bias_vl for image tokens else bias (selection only); or, on V4 hash
//            layers, select = tid2eid[token] (no bias)
//   w_i    = s[select_i] / (Σ_i s[select_i] + 1e-20) · route_scale   (sum in selection order, fp32)
//   expert(x, w) = bf16( W2 · bf16( w · silu(min(g, L)) · clamp(u, −L, L) ) ),
//            g = bf16(W1 x), u = bf16(W3 x) (GEMMs with the reference FP8 activation quantization for
//            FP8/MXFP4 weights); clamps only if L = swiglu_limit > 0
//   y      = bf16( Σ_{routed, ascending expert id} expert(x, w) + expert_shared(x, 1) ), fp32 sum
//
// Top-k order (the reference's torch.topk leaves ties implementation-defined): descending biased
// score, and on exactly equal scores the lower expert id first; NaN ranks above every number (torch's
// convention for `largest`). The routing weights are listed in that order. Expert outputs are summed
// in ascending expert id as the reference's dispatch loop does on one rank (an expert listed twice by a
// V4 tid2eid row contributes twice, in slot order); a multi-rank reference all-reduces partial sums.
// norm_topk_prob renormalises for every k (the reference does; the HF port skips k = 1). The routing
// weight multiplies before W2 and the shared expert is clamped too (reference; HF's V4 port differs).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/status.h"
#include "core/threads.h"
#include "io/config.h"

namespace cedar {

struct ExpertWeights {
  cpu::LinearWeight w1, w2, w3;  // gate [inter, d], down [d, inter], up [inter, d]
};

struct MoeWeights {
  std::span<const float> gate;              // [n_experts, d] (bf16 values, used in fp32)
  std::span<const float> bias, bias_vl;     // [n_experts] f32; bias_vl empty when the model has none
  std::vector<ExpertWeights> experts;       // n_experts routed experts (MXFP4, or BF16 in bf16 checkpoints)
  ExpertWeights shared;                     // the one shared expert (FP8Block or BF16), weight 1
  std::span<const int64_t> tid2eid;         // V4 hash-routed layers: [vocab, topk]; else empty
};

struct MoeParams {
  int64_t topk = 0;
  double route_scale = 1.0;
  double swiglu_limit = 0.0;                // <= 0: no clamps
  double gate_temp = 1.0;
  std::string scoring_func = "sqrtsoftplus";  // the only function V4/V4.1 use (others are rejected)
  bool norm_topk_prob = true;
  int64_t act_block = 32;                   // FP8 activation block of FP8/MXFP4 GEMMs (V4.1 32, V4 128)
};
// The backbone MoE parameters of a config (both architectures).
MoeParams moe_params_from_config(const ModelConfig& c);

// Routing decision for a chunk of n tokens.
struct MoeRouting {
  int64_t n = 0, topk = 0, n_experts = 0;
  std::vector<float> scores;     // [n, n_experts] unbiased sqrt(softplus(logits)), fp32
  std::vector<int64_t> experts;  // [n, topk] selected expert ids (top-k order above; hash: tid2eid order)
  std::vector<float> weights;    // [n, topk] routing weights, same order
};

// x: [n, d] normed input (bf16 values). token_ids ([n]) are needed only for hash routing; is_image
// ([n] or empty) selects bias_vl for image tokens (an error if the layer has no bias_vl).
Result<MoeRouting> route_tokens(std::span<const float> x, int64_t n, const MoeWeights& w, const MoeParams& p,
                                std::span<const int64_t> token_ids, std::span<const uint8_t> is_image,
                                ThreadPool* pool);

// One SwiGLU expert on m token rows: out[m, d] = bf16(W2 · bf16(w_t · silu(min(g, L)) · clamp(u, ±L))).
// row_weights: [m] routing weights, or empty for the shared expert (no multiplication).
Status expert_forward(const ExpertWeights& e, std::span<const float> x, int64_t m,
                      std::span<const float> row_weights, const MoeParams& p, std::span<float> out,
                      ThreadPool* pool);

// y: [n, d] bf16 output = Σ routed + shared. Only experts that received tokens run (tokens grouped per
// expert). Errors name the offending weight, shape or token.
Status moe_forward(std::span<const float> x, int64_t n, const MoeWeights& w, const MoeParams& p,
                   std::span<const int64_t> token_ids, std::span<const uint8_t> is_image, std::span<float> y,
                   ThreadPool* pool);

}  // namespace cedar
