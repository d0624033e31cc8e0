#include "model/default_model.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

#include "model/tiny_checkpoint.h"

namespace cedar {
namespace {

namespace fs = std::filesystem;

constexpr const char* kMarker = ".cedar-complete";
// Bump when the generator's output changes, so caches written by an older cedar are rebuilt.
constexpr const char* kMarkerText = "cedar make-tiny v1 deepseek_v41 profile=tiny seed=0\n";

bool has_current_marker(const fs::path& dir) {
  std::ifstream in(dir / kMarker, std::ios::binary);
  if (!in) return false;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str() == kMarkerText;
}

}  // namespace

Result<fs::path> cedar_cache_root() {
  if (const char* home = std::getenv("CEDAR_HOME"); home && *home) return fs::path(home);
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "cedar";
  if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "cedar";
  return make_error("cannot place cedar's cache: none of CEDAR_HOME, XDG_CACHE_HOME, HOME is set");
}

Result<fs::path> ensure_default_model() {
  CEDAR_ASSIGN_OR_RETURN(const fs::path root, cedar_cache_root());
  const fs::path dir = root / "models" / "tiny-deepseek_v41-seed0";
  if (has_current_marker(dir)) return dir;

  TinyCheckpointOptions options;  // V4.1, profile tiny, seed 0, quantized
  auto staged = stage_tiny_checkpoint(options, dir);
  if (!staged.ok()) return staged.error().with_context("creating the default model in " + dir.string());
  const fs::path tmp = *staged;
  {
    std::ofstream marker(tmp / kMarker, std::ios::binary);
    marker << kMarkerText;
    marker.close();
    if (!marker) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      return make_error("cannot write " + (tmp / kMarker).string());
    }
  }
  std::error_code ec;
  for (int attempt = 0; attempt < 3; ++attempt) {
    fs::rename(tmp, dir, ec);  // replaces a missing or empty `dir` atomically
    if (!ec) return dir;
    if (has_current_marker(dir)) {  // another process finished first: use theirs
      fs::remove_all(tmp, ec);
      return dir;
    }
    // A stale directory (older generator, or not made by cedar): move it aside, then retry.
    const fs::path stale = tmp.string() + ".stale";
    fs::rename(dir, stale, ec);
    if (!ec) fs::remove_all(stale, ec);
  }
  const std::string why = ec.message();
  fs::remove_all(tmp, ec);
  return make_error("cannot move the default model into " + dir.string() + ": " + why);
}

}  // namespace cedar
