// `cedar tensors`: lists the tensors of a safetensors file or checkpoint directory (validating every
// header on the way), or dumps one tensor's raw bytes.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace cedar::cli {
namespace {

const CommandSpec kSpec{
    "tensors",
    "List the tensors (name, dtype, shape, bytes, shard) of a safetensors file, an index json, or a\n"
    "checkpoint directory; every header is validated. With --dump, write one tensor's raw bytes instead.",
    {"FILE_OR_DIR"},
    {},
    {
        {"json", "print the listing as JSON", false, "", ""},
        {"dump", "tensor whose raw little-endian bytes to write (any dtype)", true, "", "NAME"},
        {"out", "output file for --dump", true, "", "FILE"},
    }};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int fail(const std::string& message) {
  std::fprintf(stderr, "cedar tensors: %s\n", message.c_str());
  return 1;
}

void print_json(const io::Checkpoint& ckpt, const std::string& path) {
  using json = nlohmann::json;
  json shards = json::array();
  for (const auto& p : ckpt.shard_paths()) shards.push_back(p.filename().string());
  json tensors = json::array();
  for (const io::TensorEntry& t : ckpt.tensors())
    tensors.push_back({{"name", t.name},
                       {"dtype", std::string(dtype_name(t.dtype))},
                       {"shape", t.shape},
                       {"bytes", t.nbytes()},
                       {"shard", ckpt.shard_paths()[t.shard].filename().string()}});
  json out = {{"path", path}, {"shards", shards}, {"total_bytes", ckpt.total_tensor_bytes()}, {"tensors", tensors}};
  std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
}

void print_table(const io::Checkpoint& ckpt, const std::string& path) {
  std::printf("%s: %zu tensors in %zu shard(s), %llu bytes\n", path.c_str(), ckpt.tensors().size(),
              ckpt.shard_paths().size(), static_cast<unsigned long long>(ckpt.total_tensor_bytes()));
  size_t width = 4;
  for (const io::TensorEntry& t : ckpt.tensors()) width = std::max(width, t.name.size());
  std::printf("%-*s  %-7s  %-22s  %14s  %s\n", static_cast<int>(width), "name", "dtype", "shape", "bytes", "shard");
  for (const io::TensorEntry& t : ckpt.tensors()) {
    std::printf("%-*s  %-7s  %-22s  %14llu  %s\n", static_cast<int>(width), t.name.c_str(),
                std::string(dtype_name(t.dtype)).c_str(), shape_text(t.shape).c_str(),
                static_cast<unsigned long long>(t.nbytes()), ckpt.shard_paths()[t.shard].filename().string().c_str());
  }
}

}  // namespace

int cmd_tensors(const Args& args) {
  auto parsed = parse_args(kSpec, args);
  if (!parsed.ok()) {
    if (parsed.error().message == "help") {
      std::printf("%s", usage(kSpec).c_str());
      return 0;
    }
    std::fprintf(stderr, "cedar tensors: %s\n%s", parsed.error().message.c_str(), usage(kSpec).c_str());
    return 2;
  }
  const std::string path = *parsed->positional(0);
  if (parsed->has("dump") != parsed->has("out")) {
    std::fprintf(stderr, "cedar tensors: --dump and --out go together\n");
    return 2;
  }
  auto ckpt = io::Checkpoint::open(path);
  if (!ckpt.ok()) return fail(ckpt.error().message);

  if (parsed->has("dump")) {
    auto view = ckpt->raw_tensor(parsed->get("dump"));
    if (!view.ok()) return fail(view.error().message);
    const std::string out = parsed->get("out");
    if (auto st = io::write_file_atomically(out, view->bytes); !st.ok()) return fail(st.error().message);
    std::printf("wrote %zu bytes of tensor '%s' to %s\n", view->bytes.size(), view->entry->name.c_str(), out.c_str());
    return 0;
  }
  if (parsed->flag("json"))
    print_json(*ckpt, path);
  else
    print_table(*ckpt, path);
  return 0;
}

}  // namespace cedar::cli
