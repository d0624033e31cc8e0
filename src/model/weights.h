// The expected tensor inventory of a checkpoint, generated from the config and the layer plan:
// every tensor's name, dtype and shape as released (../shared/spec/architecture.md §2), grouped
// by component for accounting. Per-architecture tables live in one file per architecture
// (deepseek_v41_weights.cpp, deepseek_v4_weights.cpp); this header is the shared contract.
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "io/config.h"
#include "model/layer_plan.h"

namespace cedar {

// Logical storage format of a weight (the on-disk dtype alone does not say it: MXFP4 is I8).
enum class WeightFormat {
  BF16,
  F32,
  FP8Block,  // F8_E4M3 weight + `.scale` (F8_E8M0 for V4.1) per weight block
  MXFP4,     // I8 packed E2M1 pairs + F8_E8M0 `.scale` per 32 along K
  FP8Rows,   // Engram table: F8_E4M3 rows + F8_E8M0 `.scale` per 32 channels
  Scale,     // the `.scale` companion of a quantized weight
  Other,     // e.g. I32/I64 lookup tables (V4 tid2eid)
};
std::string_view weight_format_name(WeightFormat f);

enum class Component {
  Embedding, Head, FinalNorm, Norms, HyperConnections, Attention, Compressor, Indexer,
  Router, RoutedExperts, SharedExpert, Engram, EngramTable, Draft, Vision,
};
std::string_view component_name(Component c);

struct WeightSpec {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;     // on-disk shape (MXFP4: [out, in/2])
  WeightFormat format = WeightFormat::BF16;
  Component component = Component::Attention;
  int64_t layer = -1;             // backbone layer, -1 for global tensors
  int64_t draft_block = -1;       // mtp.{k}, -1 otherwise
  int64_t expert = -1;            // routed expert index, -1 otherwise
  int64_t logical_params = 0;     // parameters represented (MXFP4: 2 per byte; scales: 0)
};

// All tensors a checkpoint of this config must contain, in a stable order.
// `include_vision`: also list the vision tower / aligner (only when the config has vision).
Result<std::vector<WeightSpec>> expected_weights(const ModelConfig& c, const LayerPlan& plan);

}  // namespace cedar
