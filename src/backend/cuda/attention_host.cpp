// Host-side helpers of the attention kernels that must evaluate exactly what the CPU oracle does.
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cuda/attention_kernels.h"

namespace cedar::cuda {

// The same fp32 expressions as cpu::RopeTable::apply (ops.cpp): angle = fp32(pos) · inv_freq[i] and the
// float std::cos / std::sin of it, compiled with the same compiler and flags, so the device rotation
// uses bit-identical (c, s).
std::vector<float> rope_cos_sin_table(const float* inv_freq, int64_t rope_dim, int64_t positions) {
  const int64_t half = rope_dim / 2;
  if (inv_freq == nullptr || half <= 0 || positions <= 0) return {};
  std::vector<float> t(static_cast<size_t>(positions * 2 * half));
  for (int64_t pos = 0; pos < positions; ++pos)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos) * inv_freq[i];
      t[static_cast<size_t>((pos * half + i) * 2)] = std::cos(angle);
      t[static_cast<size_t>((pos * half + i) * 2 + 1)] = std::sin(angle);
    }
  return t;
}

}  // namespace cedar::cuda
