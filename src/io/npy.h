// NumPy .npy files, format version 1.0 (numpy/lib/format.py): the 6-byte magic "\x93NUMPY", version 1.0,
// a little-endian uint16 header length, an ASCII Python-dict header
// `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }` padded with spaces and ended by '\n' so
// that the data starts at a multiple of 64 bytes, then the C-order little-endian payload.
// Used for logits and tensor dumps (`cedar forward`); the reader exists for tests and tools.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace cedar::io {

enum class NpyDType { F32, I32, I64 };

struct NpyArray {
  NpyDType dtype = NpyDType::F32;
  std::vector<int64_t> shape;   // empty = scalar (one element)
  std::vector<uint8_t> data;    // little-endian, C order

  int64_t numel() const;
  // Typed copies of the payload (an error when the dtype differs).
  Result<std::vector<float>> as_f32() const;
  Result<std::vector<int64_t>> as_i64() const;  // I32 and I64 arrays
};

// The header text (dict + padding + '\n') for a C-order array.
std::string npy_header(NpyDType dtype, std::span<const int64_t> shape);

// Writes atomically (temporary file + rename). `values.size()` must equal the product of `shape`.
Status write_npy(const std::filesystem::path& path, std::span<const float> values, std::span<const int64_t> shape);
Status write_npy(const std::filesystem::path& path, std::span<const int32_t> values, std::span<const int64_t> shape);
Status write_npy(const std::filesystem::path& path, std::span<const int64_t> values, std::span<const int64_t> shape);

// Parses a whole .npy image (versions 1.0–3.0; '<f4', '<i4', '<i8'; C order only). `label` prefixes errors.
Result<NpyArray> parse_npy(std::span<const uint8_t> bytes, const std::string& label);
Result<NpyArray> read_npy(const std::filesystem::path& path);

}  // namespace cedar::io
