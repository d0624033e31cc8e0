// Element types as named by safetensors, with storage sizes. Packed FP4 is stored as I8/U8 bytes on
// disk (two E2M1 codes per byte); the logical format is a property of the tensor's role, not its dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace cedar {

enum class DType : uint8_t {
  BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64,
  F8_E4M3, F8_E5M2, F8_E8M0,
};

// Size in bytes of one element.
size_t dtype_size(DType t);
// Canonical safetensors name ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string; nullopt for names cedar does not know.
std::optional<DType> parse_dtype(std::string_view name);

}  // namespace cedar
