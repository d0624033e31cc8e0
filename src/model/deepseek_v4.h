// The DeepSeek-V4(-Flash) model on the CPU reference backend (../shared/spec/architecture.md §5 and
// the V4 notes of §1–§3; official V4 inference/model.py): load and the exact forward over a chunk of
// one sequence. Same public shape as DeepseekV41Model (forward_types.h); the math lives in the shared
// modules (mhc, attention_v4 + compressor/indexer, moe).
//
// Differences from the V4.1 layer loop (deepseek_v41.h):
//   * mHC is same-site: each site's input is collapsed with the `pre` of its own mix (no shift);
//   * after the last layer the streams are collapsed by the learned `hc_head_*` (mhc.h), then the final
//     RMSNorm and the fp32 head;
//   * attention is V4's (attention_v4.h): CSA / HCA compressors with `ape`, the CSA indexer's own
//     compressor, FP8 (block 64) nope-channel KV, per-head q norm;
//   * the first num_hash_layers MoE layers route by token id (tid2eid); FP8 GEMMs quantize activations
//     in blocks of the weight block width (128);
//   * no Engram and no CED: exact mode only (new_sequence with ced is an error).
// Dump names are those of TensorRecord plus "hc_head" (the collapsed streams before the final norm) and,
// on CSA layers, "layers.{L}.topk" [index_topk] (the indexer's compressed-entry ids as floats,
// ascending, −1 padded).
#pragma once

#include <filesystem>
#include <span>

#include "core/status.h"
#include "io/config.h"
#include "model/attention.h"
#include "model/forward_types.h"
#include "model/layer_plan.h"
#include "model/mhc.h"
#include "model/moe.h"
#include "model/weight_binding.h"

namespace cedar {

class DeepseekV4Model {
 public:
  // `path`: a checkpoint directory with config.json (model_type deepseek_v4). options.engram_map is
  // ignored (V4 has no Engram).
  static Result<DeepseekV4Model> load(const std::filesystem::path& path, const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const LayerPlan& plan() const { return plan_; }
  const BoundWeights& weights() const { return weights_; }

  // Exact mode only.
  Result<SequenceState> new_sequence(const SequenceOptions& options = {}) const;

  // Processes `tokens` at positions [state.length(), state.length() + n) and advances the state.
  // Token ids must be in [0, vocab). After an error the state must be discarded.
  Result<ForwardOutput> forward(std::span<const int64_t> tokens, SequenceState& state,
                                const ForwardOptions& options) const;

 private:
  ModelConfig config_;
  LayerPlan plan_;
  BoundWeights weights_;
  HcParams hc_;
  AttentionParams attn_;
  MoeParams moe_;
};

}  // namespace cedar
