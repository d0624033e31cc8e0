// Engram normalization and map. Expected strings are HF tokenizers 0.23.2's normalizer sequence of
// build_compressed_token_map; 99,092 is engram_compressed_vocab_size of DeepSeek-V4.1-Flash.
#include "text/engram_norm.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace cedar::text {
namespace {

TEST(EngramNormalizer, MatchesHfNormalizerSequence) {
  auto norm = EngramNormalizer::create();
  ASSERT_TRUE(norm.ok()) << norm.error().message;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"Ｈｅｌｌｏ", "hello"},              // NFKC
      {"Café", "cafe"},                    // NFD + StripAccents
      {" ", " "},                          // a lone space survives Strip through the sentinel
      {"  ", " "},
      {"\u3000", " "},                     // NFKC turns it into a space first
      {"ΑΣ", "ασ"},                        // per-character lowercase: no final sigma
      {"İstanbul", "istanbul"},
      {"ﬁ", "fi"},
      {"\tA\r\nB ", "a b"},                // [ \t\r\n]+ -> " ", then Strip
      {"㍿", "株式会社"},
      {"\ue000x", " x"},                   // the sentinel is replaced everywhere
      {"①", "1"},
      {"Ǆ", "dz"},
      {"ß", "ß"},
      {"x\u0338", "x"},
      {"\u1CF2", ""},                      // a mark in Unicode 9.0 (Lo today): stripped
      {"\U000111C9", "\U000111C9"},        // not a mark in Unicode 9.0 (Mn today): kept
      {"\u1C89", "\u1C8A"},                // Unicode 16 lowercase pair (Rust std), absent from ICU 72
      {"", ""},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(norm->normalize(in), want) << "input '" << in << "'";
}

TEST(EngramMap, NpyRoundTripAndErrors) {
  const std::string path = ::testing::TempDir() + "/engram_map_test.npy";
  const std::vector<int32_t> map = {0, 1, 1, 2, -5, 2147483647};
  ASSERT_TRUE(save_engram_map_npy(map, path).ok());
  auto back = load_engram_map_npy(path);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, map);
  std::ofstream(path, std::ios::binary) << "not numpy";
  auto bad = load_engram_map_npy(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find(path), std::string::npos);
  std::remove(path.c_str());
  EXPECT_FALSE(load_engram_map_npy(path).ok());
}

TEST(EngramMap, RealTokenizerGivesFrozenMap) {
  const std::string tok_path = std::string(CEDAR_SOURCE_DIR) + "/third_party/downloads/deepseek-v4/tokenizer.json";
  if (!std::filesystem::exists(tok_path))
    GTEST_SKIP() << tok_path << " missing: run tools/fetch_tokenizer.py (scripts/setup.sh does)";
  auto tok = Tokenizer::load(tok_path);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  auto map = build_engram_token_map(*tok);
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->num_classes, kEngramCompressedVocabSizeV41);
  // The V4 file and the derived V4.1 file give the same map (assets/engram/README.md).
  auto frozen = load_engram_map_npy(std::string(CEDAR_SOURCE_DIR) + "/assets/engram/deepseek_v41_token_map.npy");
  ASSERT_TRUE(frozen.ok()) << frozen.error().message;
  EXPECT_EQ(map->compressed, *frozen);
  // Spot checks of the first-seen order: ids 0-2 are distinct special tokens, classes start at 0.
  EXPECT_EQ(map->compressed[0], 0);
  EXPECT_EQ(map->compressed[1], 1);
  EXPECT_EQ(map->compressed[2], 2);
}

}  // namespace
}  // namespace cedar::text
