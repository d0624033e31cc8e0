// Helpers shared by the safetensors tests: raw file images built by hand (so tests do not depend on
// cedar's writer), a self-deleting temporary directory, and error-text assertions.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace cedar::io::testing {

// 8-byte little-endian length + header (space-padded to a multiple of 8 when `pad`) + data.
inline std::vector<uint8_t> make_file(std::string_view header, const std::vector<uint8_t>& data, bool pad = true) {
  std::string h(header);
  if (pad) h.append((8 - h.size() % 8) % 8, ' ');
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(uint64_t(h.size()) >> (8 * i));
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

inline std::vector<uint8_t> make_file(std::string_view header, size_t data_bytes, bool pad = true) {
  std::vector<uint8_t> data(data_bytes);
  for (size_t i = 0; i < data_bytes; ++i) data[i] = static_cast<uint8_t>(i * 7 + 1);
  return make_file(header, data, pad);
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

inline void write_text(const std::filesystem::path& path, std::string_view text) {
  write_bytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cedar_st_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// Asserts that `r` failed with a message containing every one of `parts`.
template <typename R>
::testing::AssertionResult fails_with(const R& r, std::initializer_list<std::string_view> parts) {
  if (r.ok()) return ::testing::AssertionFailure() << "expected an error, got success";
  const std::string& msg = r.error().message;
  for (std::string_view p : parts)
    if (msg.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "error message lacks \"" << p << "\": " << msg;
  return ::testing::AssertionSuccess() << msg;
}

}  // namespace cedar::io::testing
