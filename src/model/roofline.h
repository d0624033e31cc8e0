// The roofline arithmetic of a forward (docs/cuda-log.md "Roofline"): the bytes a decode step reads from
// memory and the FLOPs a prefill does, per component, derived from the weight inventory and the layer
// plan (no model numbers typed in). A backend's measured time turns these into achieved GB/s and
// TFLOP/s, which `cedar bench --device cuda` reports against the peaks it measures.
//
// Decode (one token for each of `batch` sequences, each with `context` cached positions):
//   * weights read once per step: every backbone weight a text token uses (attention incl.
//     compressor / indexer pieces of the layers that own them, mHC, norms, router weight and bias —
//     not bias_vl, which only image tokens read —, shared expert, Engram wkv / q / k) and the head;
//   * routed experts: the distinct experts the batch touches per layer × one expert's bytes — at
//     batch 1 exactly top-k, at larger batches the expectation under uniform independent routing
//     E·(1 − (1 − k/E)^B) (or a measured count);
//   * per token: the embedding row, the Engram rows, and the KV records the attention reads (SWA
//     window, the top-k compressed entries of every ratio > 0 layer, the indexer keys every index
//     source scores), plus the records it writes.
// Every layer's reads are counted from memory (no reuse through caches): the roofline of an
// implementation that streams each operand once per use.
//
// Prefill FLOPs (2 per multiply-add): the linear layers each row runs (routed experts: top-k of them),
// attention score and value products over the window and the selected compressed entries, indexer
// scores; exact mode runs every layer on every row, CED (§3.10) the encoder and the boundary layer's
// pieces on rows before the replay start and every layer on the tail; the head only on the last row.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "io/config.h"
#include "model/forward_types.h"
#include "model/layer_plan.h"
#include "model/weights.h"

namespace cedar {

struct DecodeTrafficOptions {
  int64_t batch = 1;
  int64_t context = 0;  // positions already cached per sequence; the new token is at `context`
  // wo_a as BF16 values (2 B per parameter, what the reference computes with after convert.py); false:
  // as stored (FP8 + UE8M0 scales), for a kernel that dequantizes in registers.
  bool wo_a_bf16 = true;
  // BF16 norm weights and Engram q / k weights as fp32 (4 B per parameter), as the CUDA backend holds
  // them (its RMSNorm takes fp32 weights); false: as stored.
  bool vectors_f32 = false;
  // Distinct routed experts per layer in one step; unset: the uniform-routing expectation.
  std::optional<double> distinct_experts_per_layer;
};

struct DecodeTraffic {
  int64_t batch = 1;
  // Per step (whole batch).
  uint64_t layer_weight_bytes = 0;  // non-expert backbone weights (see above)
  uint64_t router_bytes = 0;        // of which: router weight + bias over all layers
  uint64_t head_bytes = 0;          // final norm + head
  uint64_t expert_bytes_each = 0;   // one routed expert (w1, w2, w3 with scales)
  double distinct_experts_per_layer = 0;
  double expert_bytes = 0;  // distinct × layers × expert_bytes_each
  // Per token (× batch in the step).
  double lookup_bytes_per_token = 0;    // embedding row + Engram rows
  double kv_read_bytes_per_token = 0;   // SWA window + selected compressed entries + scored indexer keys
  double kv_write_bytes_per_token = 0;  // SWA record per layer + the sources' compressed entries (1/ratio)

  double weight_bytes() const { return static_cast<double>(layer_weight_bytes + head_bytes) + expert_bytes; }
  double step_bytes() const {
    return weight_bytes() +
           static_cast<double>(batch) * (lookup_bytes_per_token + kv_read_bytes_per_token + kv_write_bytes_per_token);
  }
  double bytes_per_token() const { return step_bytes() / static_cast<double>(batch); }
};

DecodeTraffic decode_traffic(const ModelConfig& c, const LayerPlan& plan, const std::vector<WeightSpec>& weights,
                             const DecodeTrafficOptions& options);

// Expected distinct experts hit per layer when `batch` tokens each pick `topk` of `experts` uniformly.
double expected_distinct_experts(int64_t experts, int64_t topk, int64_t batch);

struct PrefillFlopsOptions {
  int64_t prompt = 1;
  ForwardMode mode = ForwardMode::Exact;
  int64_t ced_tail = 0;  // 0: sliding_window
  CedBoundary boundary = CedBoundary::ExactSource;
};

struct PrefillFlops {
  int64_t prompt = 0;
  int64_t replay_start = 0;    // CED: rows before it run the encoder + boundary only
  double linear_flops = 0;     // weights × rows (head: last row)
  double attention_flops = 0;  // SWA + compressed attention + indexer scores
  double total() const { return linear_flops + attention_flops; }
  double per_token() const { return prompt > 0 ? total() / static_cast<double>(prompt) : 0.0; }
};

Result<PrefillFlops> prefill_flops(const ModelConfig& c, const LayerPlan& plan, const std::vector<WeightSpec>& weights,
                                   const PrefillFlopsOptions& options);

}  // namespace cedar
