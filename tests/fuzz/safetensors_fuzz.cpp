// libFuzzer target for the safetensors header parser and the index json parser (built by the `fuzz`
// preset; run with scripts/fuzz.sh). Every input goes through both parsers; an accepted header whose
// tensors do not tile the data section exactly is a bug and traps.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto header = cedar::io::parse_safetensors(std::span<const uint8_t>(data, size), "fuzz");
  if (header.ok()) {
    uint64_t pos = 0;
    for (const auto& t : header->tensors) {
      const uint64_t expected = static_cast<uint64_t>(t.numel()) * cedar::dtype_size(t.dtype);
      if (t.begin != pos || t.end < t.begin || t.nbytes() != expected) __builtin_trap();
      pos = t.end;
    }
    if (pos != header->data_size || header->data_offset + header->data_size != size) __builtin_trap();
  }
  auto index = cedar::io::parse_safetensors_index(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (index.ok())
    for (const auto& [name, file] : index->weight_map)
      if (file.empty() || file[0] == '/') __builtin_trap();
  return 0;
}
