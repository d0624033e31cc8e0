#include "text/frozen_engram_map.h"

#include <cstddef>
#include <string>

#include "text/engram_norm.h"

namespace cedar::embedded {
// Defined in the source generated from the asset (build/<preset>/src/generated/deepseek_v41_token_map_npy.cpp).
extern const unsigned char deepseek_v41_token_map_npy[];
extern const std::size_t deepseek_v41_token_map_npy_size;
}  // namespace cedar::embedded

namespace cedar::text {

std::span<const uint8_t> frozen_engram_map_npy() {
  return {embedded::deepseek_v41_token_map_npy, embedded::deepseek_v41_token_map_npy_size};
}

Result<std::vector<int32_t>> frozen_engram_map() {
  const std::span<const uint8_t> bytes = frozen_engram_map_npy();
  return parse_engram_map_npy(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                              std::string(kFrozenEngramMapName));
}

}  // namespace cedar::text
