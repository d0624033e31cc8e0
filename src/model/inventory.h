// Checks a checkpoint's tensors against the expected inventory (model/weights.h) and reports every
// difference at once: missing tensors, unexpected tensors, dtype mismatches, shape mismatches, and the
// tensor-count contract (architecture.md §2.2 last paragraph), each group with its count and the
// first names. Works on plain records so it is testable without files; a thin overload reads an
// io::Checkpoint (inventory_checkpoint.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "io/config.h"
#include "model/layer_plan.h"
#include "model/weights.h"

namespace cedar {

namespace io {
class Checkpoint;
}

// One tensor as found in a checkpoint.
struct TensorRecord {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
};

// "How many tensors match this pattern" — `*` matches one dot-free name segment, e.g.
// "layers.*.attn.compressor.wkv.weight". Expected counts are derived from the layer plan.
struct CountContract {
  std::string pattern;
  int64_t expected = 0;
};
std::vector<CountContract> tensor_count_contract(const ModelConfig& c, const LayerPlan& plan);
bool matches_pattern(std::string_view name, std::string_view pattern);

struct InventoryOptions {
  bool accept_vision = false;            // vision.* / aligner.* / image_* are expected (config has vision)
  std::vector<CountContract> contract;   // checked on the actual names
  size_t max_names = 20;                 // names listed per group in the formatted report
};
InventoryOptions inventory_options(const ModelConfig& c, const LayerPlan& plan);

struct InventoryReport {
  struct Mismatch {
    std::string name;
    std::string expected;
    std::string actual;
  };
  struct CountResult {
    std::string pattern;
    int64_t expected = 0;
    int64_t actual = 0;
  };
  std::vector<std::string> missing;      // expected, absent (expected order)
  std::vector<std::string> unexpected;   // present, not expected (name order)
  std::vector<Mismatch> dtype_mismatches;
  std::vector<Mismatch> shape_mismatches;
  std::vector<CountResult> count_mismatches;

  int64_t expected_tensors = 0;
  int64_t actual_tensors = 0;
  int64_t matched_tensors = 0;   // present with the expected dtype and shape
  uint64_t actual_bytes = 0;
  int64_t vision_tensors = 0;    // accepted vision-group tensors
  uint64_t vision_bytes = 0;
  int64_t vision_params = 0;

  bool ok() const;
  // Summary line, then each non-empty group: "missing (3): a, b, c" with at most `max_names` names
  // ("… and 17 more").
  std::string format(size_t max_names = 20) const;
};

InventoryReport compare_inventory(const std::vector<WeightSpec>& expected, const std::vector<TensorRecord>& actual,
                                  const InventoryOptions& options);
// OK, or an Error whose message is the full formatted report.
Status check_inventory(const std::vector<WeightSpec>& expected, const std::vector<TensorRecord>& actual,
                       const InventoryOptions& options);

// The checkpoint's tensors as records (inventory_checkpoint.cpp).
std::vector<TensorRecord> tensor_records(const io::Checkpoint& checkpoint);
Status check_inventory(const std::vector<WeightSpec>& expected, const io::Checkpoint& checkpoint,
                       const InventoryOptions& options);

}  // namespace cedar
