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
// V4 checkpoints also bind `hc_head_*`, the compressors' `ape`, the CSA indexer's own compressor
// (`attn.indexer.compressor.*`) and the hash layers' `ffn.gate.tid2eid` (I64, viewed in place).
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
#include "model/attention.h"
#include "model/engram.h"
#include "model/layer_plan.h"
#include "model/mhc.h"
#include "model/moe.h"

namespace cedar {

// One backbone layer in the modules' own weight structs (model/mhc.h, attention.h, moe.h, engram.h).
struct LayerWeights {
  std::span<const float> attn_norm, ffn_norm;
  HcWeights hc_attn, hc_ffn;
  AttentionWeights attn;  // compressor / indexer fields set only where the layer's role owns them
  MoeWeights ffn;
  std::optional<EngramWeights> engram;  // Engram layers only
  // Storage of the Engram table: FP8Rows (e4m3 + e8m0 per 32), or BF16 in bf16-weight checkpoints
  // (then engram->table_scale is null; engram->table_format says the same).
  WeightFormat engram_table_format = WeightFormat::FP8Rows;
};

struct ModelWeights {
  cpu::LinearWeight embed;  // [vocab, d] BF16: rows are read by the embedding lookup
  std::span<const float> final_norm;
  cpu::LinearWeight head;   // [vocab, d]; logits use fp32 output
  HcHeadWeights hc_head;    // V4 only: the learned final collapse (hc_head_fn / _base / _scale)
  std::vector<LayerWeights> layers;
};

// The bound views plus the memory they need: the checkpoint (whose mapped files the views borrow) and
// the converted arrays. Movable; views stay valid across moves.
class BoundWeights {
 public:
  // Binds every expected backbone tensor. Errors name the tensor and what is wrong (missing, dtype,
  // shape, no field for it). `pool` parallelizes the conversions (may be null).
  static Result<BoundWeights> bind(io::Checkpoint checkpoint, const ModelConfig& config, const LayerPlan& plan,
                                   ThreadPool* pool);

  const ModelWeights& tensors() const { return tensors_; }
  const io::Checkpoint& checkpoint() const { return *checkpoint_; }
  // Bytes held by conversions (not counting the memory-mapped checkpoint).
  uint64_t converted_bytes() const;

 private:
  friend class WeightBinder;
  std::unique_ptr<io::Checkpoint> checkpoint_;
  std::vector<std::vector<float>> f32_storage_;
  std::vector<std::vector<uint16_t>> bf16_storage_;
  std::vector<std::vector<int64_t>> i64_storage_;
  ModelWeights tensors_;
};

// Dequantizes an FP8 block weight (e4m3 [out, in] + e8m0 scales [ceil(out/bo), ceil(in/bi)]) to
// bf16 bits, `bf16(e4m3(w) · 2^(s−127))` with round-to-nearest-even. Exposed for tests.
std::vector<uint16_t> dequantize_fp8_block_to_bf16(const cpu::LinearWeight& w, ThreadPool* pool);

}  // namespace cedar
