// The frozen DeepSeek-V4.1 Engram token map (assets/engram/deepseek_v41_token_map.npy, see its README),
// compiled into cedar at build time (cmake/embed_file.cmake via src/CMakeLists.txt). It is the map of every
// deepseek_v41 model that does not bring its own (model/engram_token_map.h), so an installed or relocated
// binary needs no source tree.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace cedar::text {

// What errors and reports call it.
inline constexpr std::string_view kFrozenEngramMapName =
    "cedar's built-in Engram token map (assets/engram/deepseek_v41_token_map.npy)";

// The .npy file's bytes, exactly as built in.
std::span<const uint8_t> frozen_engram_map_npy();

// The map itself: raw token id -> compressed id, one entry per id of the V4.1 tokenizer (129,280).
Result<std::vector<int32_t>> frozen_engram_map();

}  // namespace cedar::text
