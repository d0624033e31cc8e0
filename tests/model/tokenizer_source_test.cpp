// The tokenizer files of a tiny checkpoint: V4 is DeepSeek's file unchanged; V4.1 changes exactly the
// two added-token contents encoding.md §1 documents, and nothing else.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/tokenizer_source.h"

namespace cedar {
namespace {

using nlohmann::json;

const std::string kSystem = "<\xEF\xBD\x9CSystem\xEF\xBD\x9C>";
const std::string kImage = "<\xEF\xBD\x9C" "deepseek_image\xEF\xBD\x9C>";

std::string real_tokenizer_text() {
  auto path = find_tokenizer_json({});
  EXPECT_TRUE(path.ok()) << path.error().message;
  if (!path.ok()) return {};
  std::ifstream in(*path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string content_of(const json& j, int64_t id) {
  for (const auto& t : j["added_tokens"])
    if (t["id"] == id) return t["content"];
  return {};
}

TEST(TokenizerSource, V4IsUnchanged) {
  const std::string v4 = real_tokenizer_text();
  ASSERT_FALSE(v4.empty());
  auto out = tokenizer_json_for(Arch::DeepseekV4, v4, "tokenizer.json");
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, v4);
}

TEST(TokenizerSource, V41ChangesOnlyTheTwoDocumentedContents) {
  const std::string v4 = real_tokenizer_text();
  ASSERT_FALSE(v4.empty());
  auto out = tokenizer_json_for(Arch::DeepseekV41, v4, "tokenizer.json");
  ASSERT_TRUE(out.ok()) << out.error().message;
  const json a = json::parse(v4), b = json::parse(*out);
  EXPECT_EQ(content_of(b, 128799), kSystem);
  EXPECT_EQ(content_of(b, 129264), kImage);
  json patched = a;
  for (auto& t : patched["added_tokens"]) {
    if (t["id"] == 128799) t["content"] = kSystem;
    if (t["id"] == 129264) t["content"] = kImage;
  }
  EXPECT_EQ(patched, b);
  // Textually: outside the two replaced strings, the bytes are the V4 file's.
  size_t prefix = 0;
  while (prefix < v4.size() && v4[prefix] == (*out)[prefix]) ++prefix;
  EXPECT_GT(prefix, 1000u);  // the added tokens come after the header fields
  size_t suffix = 0;
  while (suffix < v4.size() && v4[v4.size() - 1 - suffix] == (*out)[out->size() - 1 - suffix]) ++suffix;
  EXPECT_GT(suffix, v4.size() / 2);  // the vocab and merges (most of the file) are untouched
}

TEST(TokenizerSource, V41EditIsIdempotent) {
  const std::string v4 = real_tokenizer_text();
  auto once = tokenizer_json_for(Arch::DeepseekV41, v4, "tokenizer.json");
  ASSERT_TRUE(once.ok());
  auto twice = tokenizer_json_for(Arch::DeepseekV41, *once, "tokenizer.json");
  ASSERT_TRUE(twice.ok()) << twice.error().message;
  EXPECT_EQ(*once, *twice);
}

TEST(TokenizerSource, ErrorsNameTheProblem) {
  auto not_json = tokenizer_json_for(Arch::DeepseekV41, "{", "bad.json");
  ASSERT_FALSE(not_json.ok());
  EXPECT_NE(not_json.error().message.find("bad.json"), std::string::npos);

  const std::string no_token = R"({"added_tokens": [{"id": 128799, "content": "x"}]})";
  auto missing = tokenizer_json_for(Arch::DeepseekV41, no_token, "t.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("129264"), std::string::npos) << missing.error().message;

  // The new content already used by another id: editing would create a duplicate.
  const std::string dup = R"({"added_tokens": [{"id": 128799, "content": "x"}, {"id": 129264, "content": "y"},
                              {"id": 5, "content": ")" + kSystem + R"("}]})";
  auto duplicate = tokenizer_json_for(Arch::DeepseekV41, dup, "t.json");
  ASSERT_FALSE(duplicate.ok());
  EXPECT_NE(duplicate.error().message.find("already added token 5"), std::string::npos) << duplicate.error().message;

  // The old content appears elsewhere in the file: an in-place edit would be ambiguous.
  const std::string twice = R"({"added_tokens": [{"id": 128799, "content": "x"}, {"id": 129264, "content": "y"}],
                                "model": {"vocab": {"x": 7}}})";
  auto ambiguous = tokenizer_json_for(Arch::DeepseekV41, twice, "t.json");
  ASSERT_FALSE(ambiguous.ok());
  EXPECT_NE(ambiguous.error().message.find("exactly once"), std::string::npos) << ambiguous.error().message;
}

TEST(TokenizerSource, ExplicitPathAndEnvironment) {
  auto missing = find_tokenizer_json("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("/nonexistent/tokenizer.json"), std::string::npos);

  const char* old = std::getenv("CEDAR_TOKENIZER");
  const std::string saved = old ? old : "";
  ::setenv("CEDAR_TOKENIZER", "/nonexistent/env.json", 1);
  auto env = find_tokenizer_json({});
  if (old) ::setenv("CEDAR_TOKENIZER", saved.c_str(), 1);
  else ::unsetenv("CEDAR_TOKENIZER");
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.error().message.find("CEDAR_TOKENIZER"), std::string::npos);
}

}  // namespace
}  // namespace cedar
