// The repo's frozen Engram token map (assets/engram/deepseek_v41_token_map.npy), read from the source tree
// and decoded here without cedar's parser (NumPy format 1.0: a uint16 header length at bytes 8-9, then
// little-endian int32 values): what the tests compare the map built into cedar with.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace cedar::test_support {

struct RepoEngramMap {
  std::vector<uint8_t> bytes;   // the whole file
  std::vector<int32_t> values;  // its payload
};

inline RepoEngramMap read_repo_engram_map() {
  const std::string path = std::string(CEDAR_SOURCE_DIR) + "/assets/engram/deepseek_v41_token_map.npy";
  RepoEngramMap m;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  m.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  EXPECT_GE(m.bytes.size(), 10u) << path;
  if (m.bytes.size() < 10) return m;
  const size_t payload = 10 + (size_t{m.bytes[8]} | (size_t{m.bytes[9]} << 8));
  EXPECT_EQ((m.bytes.size() - payload) % 4, 0u) << path;
  m.values.resize((m.bytes.size() - payload) / 4);
  for (size_t i = 0; i < m.values.size(); ++i) {
    const uint8_t* p = m.bytes.data() + payload + 4 * i;
    m.values[i] =
        static_cast<int32_t>(uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
  }
  return m;
}

}  // namespace cedar::test_support
