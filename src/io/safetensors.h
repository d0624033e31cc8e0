// Reading and writing safetensors checkpoints: one file or a sharded directory with
// `model.safetensors.index.json`. Files are memory-mapped; nothing is copied until asked.
// Every malformed input is an Error naming the file (and tensor, where there is one) — never a crash.
//
// Validation matches the official `safetensors` crate (header ≤ 100 MB, tensors cover the data section
// contiguously, byte sizes match dtype·shape, no arithmetic overflow) and is stricter where the crate is
// lenient: duplicate tensor names in a header are an error (the crate keeps the last one).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"

namespace cedar::io {

// Largest header accepted, as in the official crate (MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
// Deepest JSON nesting accepted in a header or index (a valid header nests 3 levels).
inline constexpr int kMaxSafetensorsJsonDepth = 64;

// The dtypes cedar's kernels read: BF16, F16, F32, F8_E4M3, F8_E8M0, I8 (packed FP4 is stored as I8).
// Other known dtypes are listed by Checkpoint but Checkpoint::tensor() refuses them.
bool supported_for_weights(DType t);
// "BF16, F16, F32, F8_E4M3, F8_E8M0, I8" — for error messages.
std::string_view supported_weight_dtypes();

// A read-only memory map (PROT_READ, MAP_PRIVATE) of a whole file. An empty file maps to an empty span.
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

  int64_t numel() const;  // product of shape (validated not to overflow when parsed)
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;             // in data-offset order (the order of bytes in the file)
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_offset = 0;                     // 8 + header length
  uint64_t data_size = 0;                       // file size − data_offset
};

// Parses and validates a whole safetensors file image: header length, JSON, dtypes, shapes, offsets
// (in range, non-overlapping, contiguous cover of the data section, size == numel·dtype_size).
// `label` (usually the path) prefixes every error.
Result<SafetensorsHeader> parse_safetensors(std::span<const uint8_t> file, const std::string& label);

// The content of `model.safetensors.index.json`.
struct SafetensorsIndex {
  std::map<std::string, std::string> weight_map;  // tensor name → shard file name (relative to the index)
  std::optional<uint64_t> total_size;             // "metadata": {"total_size": …}, informational
};

// Parses an index json. Shard names must be relative paths without ".." components.
Result<SafetensorsIndex> parse_safetensors_index(std::string_view text, const std::string& label);

// A borrowed view of one tensor's bytes inside a mapped shard; valid while its Checkpoint lives.
struct TensorView {
  const TensorEntry* entry = nullptr;
  std::span<const uint8_t> bytes;
};

class Checkpoint {
 public:
  // `path` is a .safetensors file, an index json, a directory with model.safetensors.index.json
  // (sharded), or a directory with a single model.safetensors.
  static Result<Checkpoint> open(const std::filesystem::path& path);

  const std::vector<TensorEntry>& tensors() const { return tensors_; }  // sorted by name
  const TensorEntry* find(std::string_view name) const;
  // The tensor's bytes; an error if it is missing or its dtype is not supported_for_weights().
  Result<TensorView> tensor(std::string_view name) const;
  // The tensor's bytes whatever its dtype (for tools that copy or inspect raw data).
  Result<TensorView> raw_tensor(std::string_view name) const;
  const std::vector<std::filesystem::path>& shard_paths() const { return shard_paths_; }
  uint64_t total_tensor_bytes() const;

 private:
  std::vector<std::filesystem::path> shard_paths_;
  std::vector<std::shared_ptr<MappedFile>> shards_;
  std::vector<uint64_t> data_offsets_;
  std::vector<TensorEntry> tensors_;
};

// Collects tensors in memory and writes them as one file or as N shards plus the index json.
// Files are laid out as the official writer does (tensors sorted by descending dtype alignment, then
// name; header padded with spaces to a multiple of 8; same JSON escaping), so the same tensors give
// byte-identical files — metadata keys are written sorted, where Python uses hash order, so identity
// holds for at most one metadata key.
// Every file is written atomically (temporary file, fsync, rename).
class SafetensorsWriter {
 public:
  // Rejects empty, duplicate or non-UTF-8 names, "__metadata__", negative dims and a byte count that
  // differs from numel·dtype_size.
  Status add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  // Written into the header of every file (keys and values must be UTF-8; checked when writing).
  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

  Status write_file(const std::filesystem::path& path) const;
  // Writes `<dir>/model-0000K-of-0000N.safetensors` (insertion order split into N contiguous groups
  // of similar byte size) and then `<dir>/model.safetensors.index.json` ({"metadata": {"total_size":
  // …}, "weight_map": …}). An existing index is removed first, so an interrupted write never leaves an
  // index describing a mix of old and new shards. 1 ≤ n_shards ≤ max(1, number of tensors).
  Status write_sharded(const std::filesystem::path& dir, int n_shards) const;

 private:
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  Status write_subset(const std::filesystem::path& path, const std::vector<size_t>& indices) const;

  std::vector<Pending> pending_;
  std::set<std::string, std::less<>> names_;  // of pending_, for the duplicate check
  std::map<std::string, std::string> metadata_;
};

// A tensor of a streamed checkpoint: its bytes are produced on demand, so a checkpoint larger than
// memory can be written in parallel. A row is the tensor's last dimension (a 0- or 1-D tensor is one
// row); fill(first_row, rows, out) writes rows [first_row, first_row + rows) into `out` (rows × row
// bytes). It is called concurrently for disjoint row ranges, and must give the same bytes however the
// rows are split into calls.
struct StreamedTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::function<Status(int64_t first_row, int64_t rows, std::span<uint8_t> out)> fill;
};

struct StreamedWriteOptions {
  int n_shards = 1;
  std::map<std::string, std::string> metadata;  // written into every file's header
  ThreadPool* pool = nullptr;                   // null: the caller's thread only
  int64_t chunk_bytes = int64_t{16} << 20;      // bytes per fill call (at least one row)
};

// Writes the tensors as SafetensorsWriter::write_sharded writes the same bytes (same shard split,
// layout, index; byte-identical files), filling and writing chunks of rows in parallel with pwrite
// into each shard's temporary file. Nothing of a tensor is held in memory beyond one chunk per thread.
Status write_streamed_sharded(const std::filesystem::path& dir, const std::vector<StreamedTensor>& tensors,
                              const StreamedWriteOptions& options);

}  // namespace cedar::io
