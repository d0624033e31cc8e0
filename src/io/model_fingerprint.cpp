// model_fingerprint: SHA-256 over config.json, the index, every shard's header and sampled data windows.
#include "io/model_fingerprint.h"

#include <fstream>
#include <set>
#include <span>

#include "core/checksum.h"
#include "io/safetensors.h"

namespace cedar {
namespace {

namespace fs = std::filesystem;

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";
constexpr int kWindows = 5;
constexpr uint64_t kMaxJsonBytes = 256u << 20;  // config / index files far larger are not ours

void add_u64(Sha256& h, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  h.update(std::span<const uint8_t>(b, 8));
}
void add_field(Sha256& h, std::span<const uint8_t> bytes) {
  add_u64(h, bytes.size());
  h.update(bytes);
}
void add_field(Sha256& h, std::string_view s) {
  add_field(h, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

Result<std::string> read_whole(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return make_error("model fingerprint: cannot read " + path.string() + ": " + ec.message());
  if (size > kMaxJsonBytes)
    return make_error("model fingerprint: " + path.string() + " is " + std::to_string(size) + " bytes, over the " +
                      std::to_string(kMaxJsonBytes) + "-byte limit");
  std::ifstream in(path, std::ios::binary);
  std::string text(static_cast<size_t>(size), '\0');
  if (!in || !in.read(text.data(), static_cast<std::streamsize>(size)))
    return make_error("model fingerprint: cannot read " + path.string());
  return text;
}

Status read_at(std::ifstream& in, const fs::path& path, uint64_t offset, std::vector<uint8_t>& out) {
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  if (!in || !in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size())))
    return make_error("model fingerprint: cannot read " + std::to_string(out.size()) + " bytes at offset " +
                      std::to_string(offset) + " of " + path.string());
  return Status::Ok();
}

// Name, size, header and sampled data windows of one shard.
Status add_shard(Sha256& h, const fs::path& path, const std::string& name) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return make_error("model fingerprint: cannot open shard " + path.string() + ": " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("model fingerprint: cannot open shard " + path.string());
  if (size < 8)
    return make_error("model fingerprint: shard " + path.string() + " is too short for a safetensors header");
  std::vector<uint8_t> len_bytes(8);
  CEDAR_RETURN_IF_ERROR(read_at(in, path, 0, len_bytes));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[static_cast<size_t>(i)];
  if (header_len > io::kMaxSafetensorsHeaderBytes || header_len > size - 8)
    return make_error("model fingerprint: shard " + path.string() + " has a header length of " +
                      std::to_string(header_len) + " bytes, past its end or the safetensors limit");
  std::vector<uint8_t> header(8 + header_len);
  CEDAR_RETURN_IF_ERROR(read_at(in, path, 0, header));
  add_field(h, name);
  add_u64(h, size);
  add_field(h, header);
  const uint64_t data_offset = 8 + header_len;
  std::vector<uint8_t> window;
  for (const FingerprintRange& r : fingerprint_sample_ranges(size - data_offset)) {
    window.resize(r.bytes);
    CEDAR_RETURN_IF_ERROR(read_at(in, path, data_offset + r.offset, window));
    add_u64(h, r.offset);
    add_field(h, window);
  }
  return Status::Ok();
}

}  // namespace

std::vector<FingerprintRange> fingerprint_sample_ranges(uint64_t data_size) {
  if (data_size <= kWindows * kFingerprintWindowBytes) {
    if (data_size == 0) return {};
    return {{0, data_size}};
  }
  std::vector<FingerprintRange> ranges;
  const uint64_t span = data_size - kFingerprintWindowBytes;  // last window ends at the data's end
  for (int i = 0; i < kWindows; ++i) {
    // span·i/4 without overflow for any file size.
    const uint64_t q = span / (kWindows - 1), r = span % (kWindows - 1);
    ranges.push_back({q * i + r * i / (kWindows - 1), kFingerprintWindowBytes});
  }
  return ranges;
}

Result<std::string> model_fingerprint(const fs::path& model_dir) {
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec))
    return make_error("model fingerprint: " + model_dir.string() + " is not a model directory");
  Sha256 h;
  h.update(std::string_view("cedar model fingerprint v1", 27));  // with the terminating NUL
  CEDAR_ASSIGN_OR_RETURN(std::string config, read_whole(model_dir / "config.json"));
  add_field(h, config);

  std::set<std::string> shards;  // sorted: the order does not depend on the index's tensor order
  if (fs::exists(model_dir / kIndexName, ec)) {
    CEDAR_ASSIGN_OR_RETURN(std::string index_text, read_whole(model_dir / kIndexName));
    CEDAR_ASSIGN_OR_RETURN(io::SafetensorsIndex index,
                           io::parse_safetensors_index(index_text, (model_dir / kIndexName).string()));
    for (const auto& [tensor, shard] : index.weight_map) shards.insert(shard);
    if (shards.empty())
      return make_error("model fingerprint: " + (model_dir / kIndexName).string() + " lists no shards");
    add_field(h, index_text);
  } else if (fs::exists(model_dir / kSingleName, ec)) {
    shards.insert(kSingleName);
    add_field(h, std::string_view());
  } else {
    return make_error("model fingerprint: " + model_dir.string() + " has neither " + kIndexName + " nor " +
                      kSingleName);
  }
  add_u64(h, shards.size());
  for (const std::string& shard : shards) CEDAR_RETURN_IF_ERROR(add_shard(h, model_dir / shard, shard));
  return to_hex(h.finish());
}

}  // namespace cedar
