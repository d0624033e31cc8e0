// The Engram token map built into cedar (text/frozen_engram_map.h) against the repo's .npy file, read and
// decoded here without cedar's parser: the same bytes, and the values NumPy's int32 layout gives.
#include "text/frozen_engram_map.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "test_support/repo_engram_map.h"
#include "text/engram_norm.h"

namespace cedar::text {
namespace {

TEST(FrozenEngramMap, BytesEqualTheRepoAsset) {
  const std::vector<uint8_t> repo = test_support::read_repo_engram_map().bytes;
  ASSERT_EQ(repo.size(), 517248u);
  const std::span<const uint8_t> built_in = frozen_engram_map_npy();
  ASSERT_EQ(built_in.size(), repo.size());
  EXPECT_TRUE(std::equal(built_in.begin(), built_in.end(), repo.begin()));
}

TEST(FrozenEngramMap, ValuesAreTheAssetsInt32Payload) {
  const std::vector<int32_t> want = test_support::read_repo_engram_map().values;
  auto map = frozen_engram_map();
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(*map, want);
  // The README's facts: one entry per id of the V4.1 tokenizer, engram_compressed_vocab_size classes.
  EXPECT_EQ(map->size(), 129280u);
  EXPECT_EQ(std::set<int32_t>(map->begin(), map->end()).size(), static_cast<size_t>(kEngramCompressedVocabSizeV41));
}

TEST(FrozenEngramMap, ParseErrorsNameTheLabel) {
  auto bad = parse_engram_map_npy("not numpy", "LABEL.npy");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("'LABEL.npy' is not an int32 .npy vector"), std::string::npos)
      << bad.error().message;
  // A shape whose byte count overflows size_t is rejected, not allocated.
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (4611686018427387905,), }";
  header.append(63 - (10 + header.size()) % 64, ' ');
  header.push_back('\n');
  std::string forged = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header + "1234";
  auto overflow = parse_engram_map_npy(forged, "forged.npy");
  ASSERT_FALSE(overflow.ok());
  EXPECT_NE(overflow.error().message.find("payload size"), std::string::npos) << overflow.error().message;
  // A header that ends inside the shape is an error, not an out-of-range read.
  const std::string cut = "{'descr': '<i4', 'fortran_order': False, 'shape': (";
  auto truncated =
      parse_engram_map_npy(std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(cut.size()) + '\0' + cut, "cut.npy");
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.error().message.find("not one-dimensional"), std::string::npos) << truncated.error().message;
}

}  // namespace
}  // namespace cedar::text
