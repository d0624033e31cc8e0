// Rendering of `cedar inspect` results as JSON (stable keys for scripts) and as text.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config.h"
#include "model/inventory.h"
#include "model/layer_plan.h"
#include "model/model_stats.h"

namespace cedar::cli {

struct CheckpointSummary {
  int64_t shards = 0;
  int64_t tensors = 0;
  uint64_t tensor_bytes = 0;  // Σ tensor data
  uint64_t file_bytes = 0;    // Σ shard file sizes (headers included)
};

struct InspectResult {
  std::string path;
  ModelConfig config;
  LayerPlan plan;
  ModelStats stats;
  int64_t expected_tensors = 0;   // text tensors enumerated by the inventory
  MemoryPlanOptions memory_options;
  std::vector<MemoryScenario> memory;
  std::optional<CheckpointSummary> checkpoint;  // absent: config-only directory
  std::optional<InventoryReport> inventory;
  size_t max_names = 20;
};

nlohmann::ordered_json inspect_json(const InspectResult& r);
std::string inspect_text(const InspectResult& r);

}  // namespace cedar::cli
