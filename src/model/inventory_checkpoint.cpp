// The io::Checkpoint overloads of the inventory check, kept apart from the record-based core so the
// core is testable without files.
#include "io/safetensors.h"
#include "model/inventory.h"

namespace cedar {

std::vector<TensorRecord> tensor_records(const io::Checkpoint& checkpoint) {
  std::vector<TensorRecord> out;
  out.reserve(checkpoint.tensors().size());
  for (const io::TensorEntry& t : checkpoint.tensors()) out.push_back({t.name, t.dtype, t.shape, t.nbytes()});
  return out;
}

Status check_inventory(const std::vector<WeightSpec>& expected, const io::Checkpoint& checkpoint,
                       const InventoryOptions& options) {
  return check_inventory(expected, tensor_records(checkpoint), options);
}

}  // namespace cedar
