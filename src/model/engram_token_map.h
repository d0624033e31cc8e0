// The Engram token map a deepseek_v41 model hashes with (architecture.md §3.9 item 1: raw token id ->
// compressed id), taken from the first of
//   1. an explicit file (LoadOptions::engram_map, `cedar forward --engram-map`); an error if it is bad,
//   2. <model dir>/engram_token_map.npy, when the checkpoint ships one,
//   3. the frozen map built into cedar (text/frozen_engram_map.h).
// Nothing here looks at the source tree cedar was built from (this file is compiled without
// CEDAR_SOURCE_DIR), so an installed or relocated binary resolves every model the same way.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace cedar {

// The file name a checkpoint directory may hold its own map under.
inline constexpr std::string_view kModelEngramMapFile = "engram_token_map.npy";

struct ResolvedEngramMap {
  std::vector<int32_t> map;    // raw id -> compressed id
  std::filesystem::path file;  // the file it was read from; empty: the built-in map
  // `file`, or the built-in map's name: what errors and reports name.
  std::string source() const;
};

// An error names the file that could not be read or parsed (prefixed "Engram token map: ").
Result<ResolvedEngramMap> resolve_engram_map(const std::filesystem::path& model_dir,
                                             const std::filesystem::path& explicit_file);

}  // namespace cedar
