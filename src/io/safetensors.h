// Reading and writing safetensors checkpoints: one file or a sharded directory with
// `model.safetensors.index.json`. Files are memory-mapped; nothing is copied until asked.
// Every malformed input is an Error naming the file (and tensor, where there is one) — never a crash.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace cedar::io {

// A read-only memory map of a whole file.
class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::filesystem::path path_;
};

struct TensorEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the file's data section
  uint32_t shard = 0;           // index into Checkpoint::shard_paths()

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;            // in header order
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_offset = 0;                     // 8 + header length
};

// Parses and validates a whole safetensors file image: header length, JSON, dtypes, shapes, offsets
// (in range, non-overlapping, contiguous cover of the data section, size == numel·dtype_size).
// `label` (usually the path) prefixes every error.
Result<SafetensorsHeader> parse_safetensors(std::span<const uint8_t> file, const std::string& label);

// A borrowed view of one tensor's bytes inside a mapped shard.
struct TensorView {
  const TensorEntry* entry = nullptr;
  std::span<const uint8_t> bytes;
};

class Checkpoint {
 public:
  // `path` is a .safetensors file, a directory with model.safetensors.index.json (sharded), or a
  // directory with a single model.safetensors.
  static Result<Checkpoint> open(const std::filesystem::path& path);

  const std::vector<TensorEntry>& tensors() const { return tensors_; }  // sorted by name
  const TensorEntry* find(std::string_view name) const;
  Result<TensorView> tensor(std::string_view name) const;
  const std::vector<std::filesystem::path>& shard_paths() const { return shard_paths_; }
  uint64_t total_tensor_bytes() const;

 private:
  std::vector<std::filesystem::path> shard_paths_;
  std::vector<std::shared_ptr<MappedFile>> shards_;
  std::vector<uint64_t> data_offsets_;
  std::vector<TensorEntry> tensors_;
};

// Collects tensors in memory and writes them as one file or as N shards plus the index json.
class SafetensorsWriter {
 public:
  Status add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

  Status write_file(const std::filesystem::path& path) const;
  // Writes `<dir>/model-0000K-of-0000N.safetensors` (tensors distributed in insertion order by size)
  // and `<dir>/model.safetensors.index.json` ({"metadata": {"total_size": …}, "weight_map": …}).
  Status write_sharded(const std::filesystem::path& dir, int n_shards) const;

 private:
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Pending> pending_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace cedar::io
