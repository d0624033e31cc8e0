// Crash-safe file writing: data goes to a temporary file in the destination's directory, which is
// fsynced and renamed over the destination on commit(). Readers (and a crash at any point) see either
// the previous file or the complete new one, never a partial file under the final name.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>

#include "core/status.h"

namespace cedar::io {

class AtomicFile {
 public:
  // Creates `.<name>.tmp.XXXXXX` next to `path` (the directory must exist).
  static Result<AtomicFile> create(const std::filesystem::path& path);
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // removes the temporary file unless committed

  Status append(std::span<const uint8_t> bytes);
  Status append(std::string_view text);
  // Writes `bytes` at `offset` of the temporary file (pwrite; may extend it). Safe to call from several
  // threads for disjoint ranges, and mixed with append() only before it.
  Status write_at(uint64_t offset, std::span<const uint8_t> bytes);
  // fsync, set mode 0644, rename over the destination, fsync the directory. Once only.
  Status commit();

 private:
  AtomicFile() = default;
  std::filesystem::path path_, tmp_path_;
  int fd_ = -1;
};

// Writes `bytes` to `path` through an AtomicFile.
Status write_file_atomically(const std::filesystem::path& path, std::span<const uint8_t> bytes);

}  // namespace cedar::io
