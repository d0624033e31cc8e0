// Test-only: writes a safetensors checkpoint with SafetensorsWriter from a JSON manifest, so the
// interop pytest can load cedar-written files with the official Python package.
//
//   cedar_safetensors_write MANIFEST.json OUT [SHARDS]
//
// MANIFEST: {"metadata": {"k": "v"}, "tensors": [{"name": …, "dtype": "BF16", "shape": [2, 3],
// "file": "raw bytes, relative to the manifest"}]}. SHARDS absent or 0: OUT is one file; otherwise OUT
// is a directory receiving SHARDS shards plus model.safetensors.index.json.
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "io/safetensors.h"

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "cedar_safetensors_write: %s\n", message.c_str());
  return 1;
}

int run(int argc, char** argv) {
  if (argc < 3 || argc > 4) return fail("usage: cedar_safetensors_write MANIFEST.json OUT [SHARDS]");
  const std::filesystem::path manifest_path = argv[1];
  std::ifstream in(manifest_path);
  if (!in) return fail("cannot read " + manifest_path.string());
  const auto manifest = nlohmann::json::parse(in);
  cedar::io::SafetensorsWriter writer;
  const nlohmann::json metadata = manifest.value("metadata", nlohmann::json::object());
  for (const auto& [key, value] : metadata.items())
    writer.set_metadata(key, value.get<std::string>());
  for (const auto& t : manifest.at("tensors")) {
    const auto dtype = cedar::parse_dtype(t.at("dtype").get<std::string>());
    if (!dtype) return fail("unknown dtype " + t.at("dtype").dump());
    std::ifstream raw(manifest_path.parent_path() / t.at("file").get<std::string>(), std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(raw)), std::istreambuf_iterator<char>());
    auto st = writer.add(t.at("name").get<std::string>(), *dtype, t.at("shape").get<std::vector<int64_t>>(),
                         std::move(bytes));
    if (!st.ok()) return fail(st.error().message);
  }
  const int shards = argc == 4 ? std::stoi(argv[3]) : 0;
  auto st = shards == 0 ? writer.write_file(argv[2]) : writer.write_sharded(argv[2], shards);
  if (!st.ok()) return fail(st.error().message);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // malformed manifest: a test bug, reported plainly
    return fail(e.what());
  }
}
