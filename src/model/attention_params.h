// Shapes and numeric options of V4.1 CSA2 attention (../shared/spec/architecture.md §3.4–§3.7),
// shared by every layer of a model. Built once from the config.
#pragma once

#include <cstdint>

#include "backend/cpu/ops.h"
#include "core/status.h"
#include "io/config.h"
#include "model/layer_plan.h"

namespace cedar {

// How indexer scores I(t) = Σ_h w_h·ReLU(q_h·k_t) are rounded (§3.6 precision note, §6 item 4).
enum class IndexScorePrecision {
  // Official reference: the q·k einsum output, the ReLU, the product with w_h and the head sum are
  // bf16 tensors (fp32 accumulation, one bf16 rounding each); w_h = bf16(bf16(weights_proj·x) · c)
  // with c = fp32(index_head_dim^-0.5 · index_heads^-0.5).
  Reference,
  // HF port: everything fp32; ReLU(q·k)·index_head_dim^-0.5 times bf16(weights_proj·x)·index_heads^-0.5.
  Fp32,
};

struct AttentionParams {
  int64_t dim = 0;          // hidden size d
  int64_t n_heads = 0;      // query heads
  int64_t head_dim = 0;     // head / KV latent width (512)
  int64_t rope_dim = 0;     // trailing RoPE channels of a head, latent and indexer head (64)
  int64_t q_lora = 0;       // q_lora_rank
  int64_t o_groups = 0;
  int64_t o_lora = 0;       // o_lora_rank
  int64_t window = 0;       // sliding_window (SWA keys per query, incl. itself; ring slots per layer)
  int64_t index_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t candidate_block_size = 0;   // compressed positions per candidate block
  int64_t candidate_topk_blocks = 0;  // blocks kept per query by the candidate source
  double eps = 1e-6;                  // rms_norm_eps (every attention RMSNorm)
  int64_t act_block = 32;             // FP8 activation block of FP8 GEMMs (V4.1 32; V4 128)

  cpu::RopeTable main_rope{cpu::RopeConfig{}};      // ratio-0 layers: rope_theta, no YaRN
  cpu::RopeTable compress_rope{cpu::RopeConfig{}};  // ratio>0 layers: compress_rope_theta + YaRN

  IndexScorePrecision index_precision = IndexScorePrecision::Reference;
  // Sparse attention: the reference kernel casts the softmax numerators to bf16 before the
  // probability·value GEMM (its denominator sums the fp32 values). false: fp32 numerators.
  bool bf16_probabilities = true;

  const cpu::RopeTable& rope_for(const LayerRole& role) const {
    return role.compress_ratio > 0 ? compress_rope : main_rope;
  }
  // Checks the shape rules the quantizers and the grouped output need (head_dim % 32, index_head_dim
  // % 32, rope_dim even and <= both, n_heads % o_groups, ...). Errors name the field.
  Status validate() const;
};

// Reads the attention fields of a V4.1 config (validated).
Result<AttentionParams> attention_params_from_config(const ModelConfig& c);

}  // namespace cedar
