// Parameter / byte accounting, active parameters per token, KV-cache budget and a memory plan, all
// derived from the expected weight inventory and the layer plan (rules in docs/inspect.md). Used by
// `cedar inspect`.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/config.h"
#include "model/layer_plan.h"
#include "model/weights.h"

namespace cedar {

struct ParamBytes {
  int64_t tensors = 0;
  int64_t params = 0;   // logical parameters (MXFP4: 2 per byte; scales: 0)
  uint64_t bytes = 0;   // storage bytes of the tensors (weights + scales)
  void add(int64_t t, int64_t p, uint64_t b) {
    tensors += t;
    params += p;
    bytes += b;
  }
};

// Packed per-entry sizes and the resulting per-token / per-sequence cache bytes (architecture.md
// §3.12; V4 from the FlashMLA record, §5/§6 item 7).
struct KvBudget {
  int64_t main_entry_bytes = 0;     // one global-KV entry (V4.1: 288 = E2M1 codes + E4M3/16; V4: 584)
  int64_t indexer_entry_bytes = 0;  // one indexer-K entry (68 = E2M1 codes + UE8M0/32)
  int64_t swa_entry_bytes = 0;      // one sliding-window entry (V4.1: 528 = e4m3 + UE8M0/32; V4: 584)
  double main_bytes_per_token = 0;     // Σ over cache-owning layers of main_entry / ratio
  double indexer_bytes_per_token = 0;  // Σ over indexer-key owners of indexer_entry / ratio
  int64_t swa_layers = 0;              // backbone layers + draft blocks
  int64_t swa_bytes_per_sequence = 0;  // swa_layers × window × swa_entry_bytes
  double bytes_per_token() const { return main_bytes_per_token + indexer_bytes_per_token; }
};
KvBudget compute_kv_budget(const ModelConfig& c, const LayerPlan& plan);

struct ModelStats {
  std::map<std::string, ParamBytes> by_format;     // weight_format_name
  std::map<std::string, ParamBytes> by_component;  // component_name (draft blocks under "draft")
  // Coarse groups: embedding, head, attention, dense, routed_experts, engram, engram_tables, draft, vision.
  std::map<std::string, ParamBytes> by_group;
  ParamBytes total;                // includes the vision group
  bool vision_estimated = false;   // vision numbers from vision_config, not from a checkpoint
  int64_t params_active_prefill = 0;  // per prompt token (CED encoder + boundary when the plan allows it)
  int64_t params_active_decode = 0;   // per generated token, backbone + head
  int64_t params_active_draft = 0;    // per drafted token through all draft blocks
  // Weight bytes (with scales) a decode token reads at batch 1: the active parameters' storage.
  uint64_t bytes_active_decode = 0;
  KvBudget kv;
};

// `vision_actual`: the vision group as found in a checkpoint; without it the group is estimated from
// vision_config (estimate_vision).
ModelStats compute_model_stats(const ModelConfig& c, const LayerPlan& plan, const std::vector<WeightSpec>& weights,
                               const std::optional<ParamBytes>& vision_actual = std::nullopt);

struct MemoryPlanOptions {
  int64_t gpus = 8;
  double gpu_mem_gib = 140.0;  // H200: 141 GB = 131 GiB nominal; the driver reports ~140 GiB usable
  double reserve_gib = 8.0;    // per GPU, for activations, workspaces, CUDA context
};

struct MemoryScenario {
  std::string name;             // "all-in-hbm", "engram-tables-in-host", "experts-and-engram-in-host"
  uint64_t gpu_weight_bytes = 0;   // all GPUs together
  uint64_t host_weight_bytes = 0;
  uint64_t per_gpu_weight_bytes = 0;  // assuming an even split (TP/EP)
  int64_t per_gpu_free_bytes = 0;     // capacity − reserve − weights (negative: does not fit)
  bool fits = false;
  int64_t kv_token_capacity = 0;      // global-KV tokens in the free HBM of all GPUs (0 if it does not fit)
};
// Vision weights are never placed (a text engine does not load them).
std::vector<MemoryScenario> plan_memory(const ModelStats& stats, const MemoryPlanOptions& options);

}  // namespace cedar
