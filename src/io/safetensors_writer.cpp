// SafetensorsWriter: files laid out exactly as the official `safetensors` writer lays them out, written
// atomically, and optionally split into shards with an index json in the Hugging Face layout.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <mutex>
#include <system_error>

#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace cedar::io {
namespace {

using json = nlohmann::json;

// Position in the official crate's Dtype enum, which is ordered by alignment; the writer puts
// tensors in descending order of it so every tensor starts aligned to its element size.
int alignment_rank(DType t) {
  switch (t) {
    case DType::BOOL: return 0;
    case DType::U8: return 1;
    case DType::I8: return 2;
    case DType::F8_E5M2: return 3;
    case DType::F8_E4M3: return 4;
    case DType::F8_E8M0: return 5;
    case DType::I16: return 6;
    case DType::U16: return 7;
    case DType::F16: return 8;
    case DType::BF16: return 9;
    case DType::I32: return 10;
    case DType::U32: return 11;
    case DType::F32: return 12;
    case DType::F64: return 13;
    case DType::I64: return 14;
    case DType::U64: return 15;
  }
  return 0;
}

// Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF), as JSON strings require.
bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else return false;
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// JSON string literal escaped as serde_json escapes it (which nlohmann's dump matches).
std::string quoted(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

std::string shard_file_name(int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", k, n);
  return buf;
}

// Checks a tensor's name and shape and returns its byte size (numel · dtype size).
Result<uint64_t> checked_nbytes(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  if (name.empty()) return make_error("cannot add a tensor with an empty name");
  if (name == "__metadata__") return make_error("cannot add a tensor named '__metadata__' (reserved by the format)");
  if (!is_valid_utf8(name)) return make_error("cannot add tensor '" + name + "': the name is not valid UTF-8");
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) return make_error("cannot add tensor '" + name + "': negative dimension " + std::to_string(d));
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) || numel > uint64_t(INT64_MAX))
      return make_error("cannot add tensor '" + name + "': shape has too many elements");
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, dtype_size(dtype), &nbytes))
    return make_error("cannot add tensor '" + name + "': byte size overflows 64 bits");
  return nbytes;
}

// One tensor of a file being laid out.
struct FileEntry {
  const std::string* name = nullptr;
  DType dtype = DType::F32;
  const std::vector<int64_t>* shape = nullptr;
  uint64_t nbytes = 0;
  size_t index = 0;         // caller's index of the tensor
  uint64_t data_begin = 0;  // set by lay_out_file: offset of the tensor's bytes in the file
};

// Orders `entries` as the official writer does and returns the bytes before the data section (8-byte
// length + header); sets each entry's data_begin (absolute file offset).
Result<std::string> lay_out_file(const std::filesystem::path& path, std::vector<FileEntry>& entries,
                                 const std::map<std::string, std::string>& metadata) {
  for (const auto& [k, v] : metadata)
    if (!is_valid_utf8(k) || !is_valid_utf8(v))
      return make_error("cannot write " + path.string() + ": metadata key '" + k + "' or its value is not valid UTF-8");
  std::stable_sort(entries.begin(), entries.end(), [](const FileEntry& a, const FileEntry& b) {
    const int ra = alignment_rank(a.dtype), rb = alignment_rank(b.dtype);
    return ra != rb ? ra > rb : *a.name < *b.name;
  });

  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) header += quoted(k) + ":" + quoted(v) + ",";
    header.back() = '}';
    header += ",";
  }
  uint64_t offset = 0;
  for (FileEntry& e : entries) {
    header += quoted(*e.name) + ":{\"dtype\":\"" + std::string(dtype_name(e.dtype)) + "\",\"shape\":[";
    for (size_t d = 0; d < e.shape->size(); ++d) {
      if (d) header += ',';
      header += std::to_string((*e.shape)[d]);  // (not "," + string: GCC 12 -Wrestrict false positive)
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + ",";
    e.data_begin = offset;
    offset += e.nbytes;
    header += std::to_string(offset) + "]},";
  }
  if (header.size() > 1) header.pop_back();
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  if (header.size() > kMaxSafetensorsHeaderBytes)
    return make_error("cannot write " + path.string() + ": header of " + std::to_string(header.size()) +
                      " bytes exceeds the format's limit of " + std::to_string(kMaxSafetensorsHeaderBytes));

  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[static_cast<size_t>(i)] = static_cast<char>(uint64_t(header.size()) >> (8 * i));
  for (FileEntry& e : entries) e.data_begin += 8 + header.size();
  return prefix + header;
}

// Contiguous groups in insertion order: a tensor goes to the next shard once its midpoint would lie
// past k+1 n-ths of the total bytes, while every later shard still gets at least one tensor.
std::vector<std::vector<size_t>> shard_groups(const std::vector<uint64_t>& sizes, size_t n) {
  uint64_t total = 0;
  for (uint64_t b : sizes) total += b;
  const size_t count = sizes.size();
  std::vector<std::vector<size_t>> groups(n);
  size_t shard = 0;
  long double done = 0;
  for (size_t i = 0; i < count; ++i) {
    const auto size = static_cast<long double>(sizes[i]);
    const bool full = done + size / 2 > static_cast<long double>(total) * static_cast<long double>(shard + 1) / n;
    const bool must_move = count - i <= n - shard - 1;
    if (!groups[shard].empty() && shard + 1 < n && (full || must_move)) ++shard;
    groups[shard].push_back(i);
    done += size;
  }
  return groups;
}

// Checks the shard count and prepares the directory (the old index is removed first).
Status prepare_sharded_dir(const std::filesystem::path& dir, size_t count, int n_shards) {
  if (n_shards < 1 || static_cast<size_t>(n_shards) > std::max<size_t>(1, count))
    return make_error("cannot write " + std::to_string(count) + " tensors as " + std::to_string(n_shards) +
                      " shards (need 1 ≤ shards ≤ tensors)");
  if (n_shards > 99999) return make_error("cannot write more than 99999 shards");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error("cannot create directory " + dir.string() + ": " + ec.message());
  const std::filesystem::path index_path = dir / "model.safetensors.index.json";
  std::filesystem::remove(index_path, ec);
  if (ec) return make_error("cannot remove the old " + index_path.string() + ": " + ec.message());
  return Status::Ok();
}

Status write_index(const std::filesystem::path& dir, uint64_t total, const json& weight_map) {
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string text = index.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  return write_file_atomically(dir / "model.safetensors.index.json",
                               std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

}  // namespace

Status SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  CEDAR_ASSIGN_OR_RETURN(const uint64_t nbytes, checked_nbytes(name, dtype, shape));
  if (names_.count(name)) return make_error("cannot add tensor '" + name + "' twice");
  if (bytes.size() != nbytes)
    return make_error("cannot add tensor '" + name + "': " + std::string(dtype_name(dtype)) + " with " +
                      std::to_string(nbytes / dtype_size(dtype)) + " elements needs " + std::to_string(nbytes) +
                      " bytes, got " + std::to_string(bytes.size()));
  names_.insert(name);
  pending_.push_back({std::move(name), dtype, std::move(shape), std::move(bytes)});
  return Status::Ok();
}

Status SafetensorsWriter::write_subset(const std::filesystem::path& path, const std::vector<size_t>& indices) const {
  std::vector<FileEntry> entries;
  for (size_t i : indices) {
    const Pending& p = pending_[i];
    entries.push_back({&p.name, p.dtype, &p.shape, p.bytes.size(), i, 0});
  }
  CEDAR_ASSIGN_OR_RETURN(const std::string head, lay_out_file(path, entries, metadata_));
  CEDAR_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(path));
  CEDAR_RETURN_IF_ERROR(out.append(head));
  for (const FileEntry& e : entries) CEDAR_RETURN_IF_ERROR(out.append(pending_[e.index].bytes));
  return out.commit();
}

Status SafetensorsWriter::write_file(const std::filesystem::path& path) const {
  std::vector<size_t> all(pending_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return write_subset(path, all);
}

Status SafetensorsWriter::write_sharded(const std::filesystem::path& dir, int n_shards) const {
  CEDAR_RETURN_IF_ERROR(prepare_sharded_dir(dir, pending_.size(), n_shards));
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const Pending& p : pending_) {
    sizes.push_back(p.bytes.size());
    total += p.bytes.size();
  }
  const auto groups = shard_groups(sizes, static_cast<size_t>(n_shards));
  json weight_map = json::object();
  for (size_t k = 0; k < groups.size(); ++k) {
    const std::string file = shard_file_name(static_cast<int>(k + 1), n_shards);
    CEDAR_RETURN_IF_ERROR(write_subset(dir / file, groups[k]));
    for (size_t i : groups[k]) weight_map[pending_[i].name] = file;
  }
  return write_index(dir, total, weight_map);
}

Status write_streamed_sharded(const std::filesystem::path& dir, const std::vector<StreamedTensor>& tensors,
                              const StreamedWriteOptions& options) {
  // Validate everything before touching the directory.
  std::set<std::string, std::less<>> names;
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const StreamedTensor& t : tensors) {
    CEDAR_ASSIGN_OR_RETURN(const uint64_t nbytes, checked_nbytes(t.name, t.dtype, t.shape));
    if (!names.insert(t.name).second) return make_error("cannot add tensor '" + t.name + "' twice");
    if (!t.fill) return make_error("cannot write tensor '" + t.name + "': it has no fill function");
    sizes.push_back(nbytes);
    total += nbytes;
  }
  CEDAR_RETURN_IF_ERROR(prepare_sharded_dir(dir, tensors.size(), options.n_shards));
  const auto groups = shard_groups(sizes, static_cast<size_t>(options.n_shards));

  // Lay out every shard, then cut every tensor into jobs of whole rows of about chunk_bytes.
  struct Job {
    size_t shard, tensor;
    int64_t first_row, rows;
    uint64_t file_offset, bytes;
  };
  std::vector<AtomicFile> files;
  std::vector<Job> jobs;
  json weight_map = json::object();
  const uint64_t chunk = static_cast<uint64_t>(std::max<int64_t>(options.chunk_bytes, 1));
  for (size_t k = 0; k < groups.size(); ++k) {
    const std::string file = shard_file_name(static_cast<int>(k + 1), options.n_shards);
    std::vector<FileEntry> entries;
    for (size_t i : groups[k]) entries.push_back({&tensors[i].name, tensors[i].dtype, &tensors[i].shape, sizes[i], i, 0});
    CEDAR_ASSIGN_OR_RETURN(const std::string head, lay_out_file(dir / file, entries, options.metadata));
    CEDAR_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(dir / file));
    CEDAR_RETURN_IF_ERROR(out.append(head));
    files.push_back(std::move(out));
    for (const FileEntry& e : entries) {
      weight_map[*e.name] = file;
      const StreamedTensor& t = tensors[e.index];
      int64_t rows = 1;
      for (size_t d = 0; d + 1 < t.shape.size(); ++d) rows *= t.shape[d];
      if (e.nbytes == 0) continue;
      const uint64_t row_bytes = e.nbytes / static_cast<uint64_t>(rows);
      const auto per_job = static_cast<int64_t>(std::max<uint64_t>(1, chunk / row_bytes));
      for (int64_t r = 0; r < rows; r += per_job) {
        const int64_t n = std::min(per_job, rows - r);
        jobs.push_back({k, e.index, r, n, e.data_begin + static_cast<uint64_t>(r) * row_bytes,
                        static_cast<uint64_t>(n) * row_bytes});
      }
    }
  }

  std::mutex mu;
  Status first_error = Status::Ok();
  auto run = [&](int64_t j0, int64_t j1) {
    std::vector<uint8_t> buf;
    for (int64_t j = j0; j < j1; ++j) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error.ok()) return;
      }
      const Job& job = jobs[static_cast<size_t>(j)];
      buf.resize(job.bytes);
      const StreamedTensor& t = tensors[job.tensor];
      Status st = t.fill(job.first_row, job.rows, std::span<uint8_t>(buf));
      if (st.ok()) st = files[job.shard].write_at(job.file_offset, buf);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = st.error().with_context("tensor " + t.name);
        return;
      }
    }
  };
  if (options.pool) options.pool->parallel_for(static_cast<int64_t>(jobs.size()), run);
  else run(0, static_cast<int64_t>(jobs.size()));
  CEDAR_RETURN_IF_ERROR(first_error);
  for (AtomicFile& f : files) CEDAR_RETURN_IF_ERROR(f.commit());
  return write_index(dir, total, weight_map);
}

}  // namespace cedar::io
