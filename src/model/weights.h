// The expected tensor inventory of a checkpoint, generated from the config and the layer plan:
// every tensor's name, dtype and shape as released (../shared/spec/architecture.md §2), grouped
// by component for accounting. Per-architecture tables live in one file per architecture
// (deepseek_v41_weights.cpp, deepseek_v4_weights.cpp); this header is the shared contract.
//
// The vision tower is an opaque group: its tensors (`vision.*`, `aligner.*`, `image_start`,
// `image_end`, `image_newline`) are not enumerated — cedar is a text engine and the tower's names
// come from third-party inventories only — but they are recognised (is_vision_tensor), accepted by
// the inventory check when the config has a vision_config, and counted by inspect.
#pragma once

#include <string>
#include <string_view>
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
  FP8Block,  // F8_E4M3 weight + `.scale` (F8_E8M0) per weight block
  MXFP4,     // I8 packed E2M1 pairs + F8_E8M0 `.scale` per 32 along K
  FP8Rows,   // Engram table: F8_E4M3 rows + F8_E8M0 `.scale` per 32 channels
  Scale,     // the `.scale` companion of a quantized weight
  Other,     // e.g. I64 lookup tables (V4 tid2eid)
};
std::string_view weight_format_name(WeightFormat f);

enum class Component {
  Embedding, Head, FinalNorm, Norms, HyperConnections, Attention, Compressor, Indexer,
  IndexerKeys,  // V4.1 indexer.wk / k_norm; V4 indexer.compressor.* (produce the indexer-K cache)
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

  int64_t numel() const;
  uint64_t nbytes() const;        // numel × dtype size
};

// All tensors a checkpoint of this config must contain (vision excluded, see above), in a stable
// order: globals, backbone layers, draft blocks.
Result<std::vector<WeightSpec>> expected_weights(const ModelConfig& c, const LayerPlan& plan);

// Whether a tensor name belongs to the vision tower / aligner / image delimiters.
bool is_vision_tensor(std::string_view name);

// Tensor and parameter counts of the vision group derived from vision_config (0 without one):
// patch embedding (+bias), per block 2 norms + fused qkv (+bias) + out proj (+bias) + SwiGLU w1
// [2·inter, d] + w2, final norm, aligner w1 [D, d·r²] / w2 [D, D] with biases, three [D] delimiters.
// This reproduces the released checkpoint's 266 BF16 vision tensors and 970 536 960 bytes exactly
// (the checkpoint total minus the text tensors); it is an estimate for other configs.
struct VisionEstimate {
  int64_t tensors = 0;
  int64_t params = 0;
};
VisionEstimate estimate_vision(const ModelConfig& c);

}  // namespace cedar
