#include "model/engram_token_map.h"

#include <system_error>

#include "text/engram_norm.h"
#include "text/frozen_engram_map.h"

namespace cedar {

std::string ResolvedEngramMap::source() const {
  return file.empty() ? std::string(text::kFrozenEngramMapName) : file.string();
}

Result<ResolvedEngramMap> resolve_engram_map(const std::filesystem::path& model_dir,
                                             const std::filesystem::path& explicit_file) {
  ResolvedEngramMap r;
  r.file = explicit_file;
  if (r.file.empty()) {
    const std::filesystem::path local = model_dir / kModelEngramMapFile;
    std::error_code ec;
    if (std::filesystem::exists(local, ec)) r.file = local;
  }
  auto map = r.file.empty() ? text::frozen_engram_map() : text::load_engram_map_npy(r.file.string());
  if (!map.ok()) return map.error().with_context("Engram token map");
  r.map = std::move(*map);
  return r;
}

}  // namespace cedar
