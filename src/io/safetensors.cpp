// Checkpoint: opening one safetensors file or a sharded directory, cross-checking the index json
// against the shards, and handing out views of tensor bytes.
#include "io/safetensors.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

namespace cedar::io {
namespace {

using json = nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";
// A 96k-tensor index is about 10 MB; anything far larger is not an index.
constexpr uintmax_t kMaxIndexBytes = 256u << 20;

const char* json_type(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "a number";
    default: return "an unsupported value";
  }
}

// Shard names come from the index file: keep them inside the checkpoint directory.
bool is_safe_relative(const std::string& name) {
  const std::filesystem::path p(name);
  if (name.empty() || p.is_absolute()) return false;
  return std::none_of(p.begin(), p.end(), [](const std::filesystem::path& part) { return part == ".."; });
}

Result<std::string> read_small_file(const std::filesystem::path& path, uintmax_t limit) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return make_error("cannot read " + path.string() + ": " + ec.message());
  if (size > limit)
    return make_error(path.string() + " is " + std::to_string(size) + " bytes, more than the " +
                      std::to_string(limit) + "-byte limit for an index");
  std::ifstream in(path, std::ios::binary);
  std::string text(static_cast<size_t>(size), '\0');
  if (!in || !in.read(text.data(), static_cast<std::streamsize>(size)))
    return make_error("cannot read " + path.string());
  return text;
}

}  // namespace

Result<SafetensorsIndex> parse_safetensors_index(std::string_view text, const std::string& label) {
  // nlohmann's DOM parser and destructor are iterative, so deep nesting cannot overflow the stack.
  // nlohmann's lexer takes a NUL byte for the end of input; JSON never allows a raw NUL.
  if (auto nul = text.find('\0'); nul != std::string_view::npos)
    return make_error(label + ": invalid JSON: NUL byte at offset " + std::to_string(nul));
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (what.size() > 300) what = what.substr(0, 300) + "…";  // "last read" can quote a whole long token
    return make_error(label + ": invalid JSON: " + what);
  }
  if (!j.is_object()) return make_error(label + ": index is not a JSON object (it is " + json_type(j) + ")");
  SafetensorsIndex index;
  if (auto meta = j.find("metadata"); meta != j.end() && !meta->is_null()) {
    if (!meta->is_object()) return make_error(label + ": \"metadata\" must be an object, got " + json_type(*meta));
    if (auto ts = meta->find("total_size"); ts != meta->end()) {
      if (!ts->is_number_unsigned())
        return make_error(label + ": \"metadata.total_size\" must be a non-negative integer, got " + json_type(*ts));
      index.total_size = ts->get<uint64_t>();
    }
  }
  auto map = j.find("weight_map");
  if (map == j.end()) return make_error(label + ": missing \"weight_map\"");
  if (!map->is_object()) return make_error(label + ": \"weight_map\" must be an object, got " + json_type(*map));
  std::map<std::string, std::string, std::less<>> normalized;  // a few shard names, each listed many times
  for (const auto& [name, shard] : map->items()) {
    if (!shard.is_string())
      return make_error(label + ": tensor '" + name + "': shard must be a file name string, got " + json_type(shard));
    const std::string& file = shard.get_ref<const std::string&>();
    auto it = normalized.find(file);
    if (it == normalized.end()) {
      if (!is_safe_relative(file))
        return make_error(label + ": tensor '" + name + "': shard '" + file +
                          "' must be a relative path inside the checkpoint directory");
      // "./a.safetensors" and "a.safetensors" name the same shard.
      it = normalized.emplace(file, std::filesystem::path(file).lexically_normal().string()).first;
    }
    index.weight_map.emplace_hint(index.weight_map.end(), name, it->second);  // items() come sorted by name
  }
  return index;
}

namespace {

struct ShardSource {
  std::filesystem::path path;
  std::string file;        // the name the index gives it
  std::string listed_for;  // a tensor the index maps to this shard (for messages); empty when no index
  size_t n_listed = 0;
};

// Opens and parses every shard, appending its tensors (tagged with the shard number) to `tensors`.
Status load_shards(const std::vector<ShardSource>& sources, const std::string& index_label,
                   std::vector<std::shared_ptr<MappedFile>>& shards, std::vector<uint64_t>& data_offsets,
                   std::vector<TensorEntry>& tensors) {
  for (size_t s = 0; s < sources.size(); ++s) {
    const ShardSource& src = sources[s];
    auto file = MappedFile::open(src.path);
    if (!file.ok()) {
      if (src.listed_for.empty()) return file.error();
      return make_error(index_label + ": shard '" + src.path.filename().string() + "' (holding tensor '" +
                        src.listed_for + "' and " + std::to_string(src.n_listed - 1) +
                        " others) cannot be read: " + file.error().message);
    }
    CEDAR_ASSIGN_OR_RETURN(SafetensorsHeader header, parse_safetensors((*file)->bytes(), src.path.string()));
    for (TensorEntry& t : header.tensors) {
      t.shard = static_cast<uint32_t>(s);
      tensors.push_back(std::move(t));
    }
    shards.push_back(std::move(file).value());
    data_offsets.push_back(header.data_offset);
  }
  return Status::Ok();
}

// Every tensor in the shards must be in the index under its own shard, and every index entry must
// exist in the shard it names. `tensors` is sorted by name and free of duplicates.
Status check_against_index(const SafetensorsIndex& index, const std::string& index_label,
                           const std::vector<TensorEntry>& tensors, const std::vector<ShardSource>& shards) {
  auto t = tensors.begin();
  auto m = index.weight_map.begin();
  while (t != tensors.end() || m != index.weight_map.end()) {
    if (m == index.weight_map.end() || (t != tensors.end() && t->name < m->first))
      return make_error(shards[t->shard].path.string() + ": tensor '" + t->name + "' is not listed in " + index_label);
    if (t == tensors.end() || m->first < t->name)
      return make_error(index_label + ": tensor '" + m->first + "' is mapped to shard '" + m->second +
                        "', which has no such tensor");
    if (m->second != shards[t->shard].file)
      return make_error(index_label + ": tensor '" + m->first + "' is mapped to shard '" + m->second +
                        "' but is stored in '" + shards[t->shard].file + "'");
    ++t;
    ++m;
  }
  return Status::Ok();
}

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status))
    return make_error("cannot open checkpoint " + path.string() + ": no such file or directory");

  std::filesystem::path index_path;
  std::vector<ShardSource> sources;
  if (std::filesystem::is_directory(status)) {
    if (std::filesystem::exists(path / kIndexName, ec)) {
      index_path = path / kIndexName;
    } else if (std::filesystem::exists(path / kSingleName, ec)) {
      sources.push_back({path / kSingleName, kSingleName, {}, 0});
    } else {
      return make_error("cannot open checkpoint " + path.string() + ": the directory has neither " + kIndexName +
                        " nor " + kSingleName);
    }
  } else if (path.filename().string().ends_with(".index.json")) {
    index_path = path;
  } else {
    sources.push_back({path, path.filename().string(), {}, 0});
  }

  Checkpoint ckpt;
  SafetensorsIndex index;
  const std::string index_label = index_path.string();
  if (!index_path.empty()) {
    CEDAR_ASSIGN_OR_RETURN(std::string text, read_small_file(index_path, kMaxIndexBytes));
    CEDAR_ASSIGN_OR_RETURN(index, parse_safetensors_index(text, index_label));
    std::map<std::string, ShardSource> by_file;  // sorted by file name, so shard order is stable
    for (const auto& [name, file] : index.weight_map) {
      ShardSource& src = by_file[file];
      if (src.n_listed++ == 0) {
        src.path = index_path.parent_path() / file;
        src.file = file;
        src.listed_for = name;
      }
    }
    for (auto& [file, src] : by_file) sources.push_back(std::move(src));
  }
  for (const ShardSource& src : sources) ckpt.shard_paths_.push_back(src.path);
  CEDAR_RETURN_IF_ERROR(load_shards(sources, index_label, ckpt.shards_, ckpt.data_offsets_, ckpt.tensors_));

  std::sort(ckpt.tensors_.begin(), ckpt.tensors_.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  for (size_t i = 1; i < ckpt.tensors_.size(); ++i) {
    const TensorEntry& a = ckpt.tensors_[i - 1];
    const TensorEntry& b = ckpt.tensors_[i];
    if (a.name == b.name)
      return make_error("tensor '" + a.name + "' appears in both " + ckpt.shard_paths_[a.shard].string() + " and " +
                        ckpt.shard_paths_[b.shard].string());
  }
  if (!index_path.empty())
    CEDAR_RETURN_IF_ERROR(check_against_index(index, index_label, ckpt.tensors_, sources));
  return ckpt;
}

const TensorEntry* Checkpoint::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorEntry& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

Result<TensorView> Checkpoint::raw_tensor(std::string_view name) const {
  const TensorEntry* t = find(name);
  if (!t) {
    std::string where = shard_paths_.size() == 1 ? shard_paths_[0].string()
                                                  : "the checkpoint (" + std::to_string(shard_paths_.size()) + " shards)";
    return make_error("tensor '" + std::string(name) + "' not found in " + where);
  }
  // Offsets were validated against the file size when the shard was parsed.
  return TensorView{t, shards_[t->shard]->bytes().subspan(data_offsets_[t->shard] + t->begin, t->nbytes())};
}

Result<TensorView> Checkpoint::tensor(std::string_view name) const {
  CEDAR_ASSIGN_OR_RETURN(TensorView view, raw_tensor(name));
  if (!supported_for_weights(view.entry->dtype))
    return make_error("unsupported dtype " + std::string(dtype_name(view.entry->dtype)) + " for tensor '" +
                      view.entry->name + "' in file " + shard_paths_[view.entry->shard].string() + " (cedar reads " +
                      std::string(supported_weight_dtypes()) + ")");
  return view;
}

uint64_t Checkpoint::total_tensor_bytes() const {
  uint64_t total = 0;
  for (const TensorEntry& t : tensors_) total += t.nbytes();
  return total;
}

}  // namespace cedar::io
