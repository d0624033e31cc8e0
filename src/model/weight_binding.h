// Binds the tensors of an opened checkpoint to the views the CPU forward reads (../shared/spec/
// architecture.md §2, with the in-memory conversions of §2.3). Which tensors exist, with which dtype and
// shape, comes from expected_weights() (model/weights.h) and the layer plan; this file only maps each
// expected tensor to the field that holds it, and fails on any expected tensor it cannot place, so the
// inventory and the binding cannot drift apart silently.
//
// Conversions (everything else is a borrowed view of the memory-mapped bytes in its stored format):
//   * `attn.wo_a` FP8 blocks → BF16 values, `bf16(e4m3(W) · 2^(s−127))`, held as a BF16 LinearWeight
//     (the reference's convert.py dequantizes it and runs a BF16 einsum; §2.3, §6 item 8).
//   * BF16 norm weights, the router `ffn.gate.weight` and Engram `q_weight` / `k_weight` → fp32 arrays
//     (exact: bf16 ⊂ fp32). F32 tensors (`hc_*`, `attn_sink`, `gate.bias(_vl)`) are viewed as they are
//     (copied only when the file leaves them misaligned for float access).
//   * Held in their stored BF16 form although the reference keeps them fp32: `head.weight` and the
//     ratio-2 compressor `wkv` / `wgate`. cpu::linear multiplies and accumulates BF16 weights in fp32, so
//     with LinearOptions{.bf16_output = false} the result is identical to an fp32 copy at half the memory.
//   * bf16-weight checkpoints (no quantization_config) bind every linear as BF16.
//
// Not bound: DSpark / NextN blocks (`mtp.*`; the CPU forward has no drafter yet) and the vision tower.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/status.h"
#include "core/threads.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/layer_plan.h"

namespace cedar {

// One mHC site: fn [(2+hc)·hc, hc·d], base [(2+hc)·hc], scale [3] (§3.3).
struct HcSiteTensors {
  std::span<const float> fn, base, scale;
};

struct AttentionTensors {
  cpu::LinearWeight wq_a, wq_b, wkv, wo_a /* BF16 values */, wo_b;
  std::span<const float> q_norm, kv_norm, attn_sink;
  // KV sources (role.owns_compressor): compressor; wgate only where role.compressor_has_gate (ratio 2).
  cpu::LinearWeight compressor_wkv, compressor_wgate;
  std::span<const float> compressor_norm;
  // role.owns_indexer_keys
  cpu::LinearWeight indexer_wk;
  std::span<const float> indexer_k_norm;
  // role.owns_indexer
  cpu::LinearWeight indexer_wq_b, indexer_weights_proj;
};

struct ExpertTensors {
  cpu::LinearWeight w1, w2, w3;  // gate, down, up
};

struct MoeTensors {
  std::span<const float> gate;           // [n_experts, d], bf16 values
  std::span<const float> bias, bias_vl;  // [n_experts]
  std::vector<ExpertTensors> experts;
  ExpertTensors shared;
};

struct EngramTensors {
  WeightFormat table_format = WeightFormat::FP8Rows;  // FP8Rows (e4m3 + e8m0 per 32) or BF16
  const uint8_t* table = nullptr;        // [rows, head_dim]
  const uint8_t* table_scale = nullptr;  // [rows, head_dim/32] (FP8Rows only)
  int64_t rows = 0, head_dim = 0;
  cpu::LinearWeight wkv;
  std::span<const float> q_weight, k_weight;  // [hc, d], bf16 values
};

struct LayerTensors {
  std::span<const float> attn_norm, ffn_norm;
  HcSiteTensors hc_attn, hc_ffn;
  AttentionTensors attn;
  MoeTensors ffn;
  std::optional<EngramTensors> engram;  // Engram layers only
};

struct ModelTensors {
  cpu::LinearWeight embed;  // [vocab, d] BF16: rows are read by the embedding lookup
  std::span<const float> final_norm;
  cpu::LinearWeight head;   // [vocab, d]; logits use fp32 output
  std::vector<LayerTensors> layers;
};

// The bound views plus the memory they need: the checkpoint (whose mapped files the views borrow) and
// the converted arrays. Movable; views stay valid across moves.
class BoundWeights {
 public:
  // Binds every expected backbone tensor. Errors name the tensor and what is wrong (missing, dtype,
  // shape, no field for it). `pool` parallelizes the conversions (may be null).
  static Result<BoundWeights> bind(io::Checkpoint checkpoint, const ModelConfig& config, const LayerPlan& plan,
                                   ThreadPool* pool);

  const ModelTensors& tensors() const { return tensors_; }
  const io::Checkpoint& checkpoint() const { return *checkpoint_; }
  // Bytes held by conversions (not counting the memory-mapped checkpoint).
  uint64_t converted_bytes() const;

 private:
  friend class WeightBinder;
  std::unique_ptr<io::Checkpoint> checkpoint_;
  std::vector<std::vector<float>> f32_storage_;
  std::vector<std::vector<uint16_t>> bf16_storage_;
  ModelTensors tensors_;
};

// Dequantizes an FP8 block weight (e4m3 [out, in] + e8m0 scales [ceil(out/bo), ceil(in/bi)]) to
// bf16 bits, `bf16(e4m3(w) · 2^(s−127))` with round-to-nearest-even. Exposed for tests.
std::vector<uint16_t> dequantize_fp8_block_to_bf16(const cpu::LinearWeight& w, ThreadPool* pool);

}  // namespace cedar
