// Prompt segments -> ids on the real DeepSeek V4 tokenizer.json. Expected ids: encoding.md §4.5 and the
// hosted-API token counts of deepseek-recipe issue #5 (empty user = 4 prompt tokens, "x" = 5, the text
// "<｜User｜>" = 9), which deepseek-recipe 0.2.0 reproduces.
#include "text/prompt_tokens.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "text/encoder.h"
#include "text/special_tokens.h"

namespace cedar::text {
namespace {

const std::string kPath = std::string(CEDAR_SOURCE_DIR) + "/third_party/downloads/deepseek-v4/tokenizer.json";

using Ids = std::vector<TokenId>;

TEST(PromptTokens, ControlByIdTextByBpe) {
  if (!std::filesystem::exists(kPath)) GTEST_SKIP() << kPath << " missing: run tools/fetch_tokenizer.py";
  static const auto tok = Tokenizer::load(kPath);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  auto ids_of_user = [&](const std::string& text) {
    Message u;
    u.content = text;
    auto p = encode_messages({u}, {});  // V4.1, chat mode: no <｜System｜> needed
    EXPECT_TRUE(p.ok());
    auto ids = prompt_token_ids(*p, *tok);
    EXPECT_TRUE(ids.ok()) << ids.error().message;
    return ids.ok() ? *ids : Ids{};
  };
  EXPECT_EQ(ids_of_user(""), (Ids{0, 128803, 128804, 128822}));
  EXPECT_EQ(ids_of_user("x").size(), 5u);
  EXPECT_EQ(ids_of_user("<｜User｜>"), (Ids{0, 128803, 30, 28217, 6756, 28217, 32, 128804, 128822}));

  // §4.5: "\n\n<｜DSML｜ calls>\n" with ｜DSML｜ as a control token.
  Prompt block;
  block.text("\n\n<");
  block.control(tok::kDsml);
  block.text(" calls>\n");
  EXPECT_EQ(*prompt_token_ids(block, *tok), (Ids{271, 30, 128825, 10699, 1018}));

  // A control token the tokenizer lacks is an error naming it (the V4 file has no <｜System｜>).
  Prompt sys;
  sys.control(tok::kSystem);
  auto bad = prompt_token_ids(sys, *tok);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("<｜System｜>"), std::string::npos);
}

}  // namespace
}  // namespace cedar::text
