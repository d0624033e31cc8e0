// cedar's embedded default model: a tiny V4.1 checkpoint (seed 0) that cedar writes on first use, so
// every command that needs a model works on a fresh machine without downloads.
#pragma once

#include <filesystem>

#include "core/status.h"

namespace cedar {

// The cache root: $CEDAR_HOME, else $XDG_CACHE_HOME/cedar, else $HOME/.cache/cedar.
Result<std::filesystem::path> cedar_cache_root();

// `<cache root>/models/tiny-deepseek_v41-seed0`, created with make-tiny if it is missing or was
// written by a different generator version. Safe under concurrency: the checkpoint is built and
// verified in a temporary sibling directory whose completion marker is written last, then renamed
// into place; a directory without the current marker is never returned.
Result<std::filesystem::path> ensure_default_model();

}  // namespace cedar
