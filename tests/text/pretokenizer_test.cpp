// The DeepSeek pre-tokenizer matchers. Expected pieces are HF tokenizers 0.23.2's
// pre_tokenizer.pre_tokenize_str() on the real tokenizer.json (shown here as raw text, not byte-level).
#include "text/pretokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace cedar::text {
namespace {

std::vector<std::string> pieces(const std::string& text) {
  const PreTokenizer pre({SplitPattern::kNumbers, SplitPattern::kCjk, SplitPattern::kWordsPunct});
  std::vector<Piece> out;
  PreTokenizer::Scratch scratch;
  pre.split(text, 0, text.size(), out, scratch);
  std::vector<std::string> strs;
  for (const Piece& p : out) strs.push_back(text.substr(p.begin, p.end - p.begin));
  return strs;
}

using V = std::vector<std::string>;

TEST(PreTokenizer, MatchesHfOnTrickyCases) {
  EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(pieces("\n\n  x"), (V{"\n\n", " ", " x"}));
  EXPECT_EQ(pieces("Hello, world!\r\n"), (V{"Hello", ",", " world", "!\r\n"}));
  EXPECT_EQ(pieces("x = 12345;\t# ok"), (V{"x", " =", " ", "123", "45", ";", "\t", "#", " ok"}));
  EXPECT_EQ(pieces("  \n"), (V{"  \n"}));
  EXPECT_EQ(pieces(".Hello ...\n\nfoo"), (V{".Hello", " ...\n\n", "foo"}));
  EXPECT_EQ(pieces("日本語テキスト・カタカナ"), (V{"日本語テキスト", "・", "カタカナ"}));
  EXPECT_EQ(pieces("½Ⅻ٣4"), (V{"½Ⅻ٣", "4"}));
  EXPECT_EQ(pieces("\u3000abc"), (V{"\u3000abc"}));
  EXPECT_EQ(pieces("\u200b" "abc \u200b"), (V{"\u200b" "abc", " ", "\u200b"}));
  EXPECT_EQ(pieces("\"quoted\""), (V{"\"quoted", "\""}));
  EXPECT_EQ(pieces("won't"), (V{"won", "'t"}));
  EXPECT_EQ(pieces(" ~~~"), (V{" ~~~"}));
  EXPECT_EQ(pieces("trailing  "), (V{"trailing", "  "}));
  EXPECT_EQ(pieces("tabs\tand\r\ncr"), (V{"tabs", "\tand", "\r\n", "cr"}));
  EXPECT_EQ(pieces("中文123English日本語"), (V{"中文", "123", "English", "日本語"}));
  EXPECT_EQ(pieces(""), V{});
}

TEST(PreTokenizer, RecognisesOnlyTheDeepSeekRegexes) {
  for (SplitPattern p : {SplitPattern::kNumbers, SplitPattern::kCjk, SplitPattern::kWordsPunct}) {
    auto r = split_pattern_from_regex(split_pattern_regex(p));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, p);
  }
  // tokenizer.json may spell CR/LF as escapes instead of literal characters.
  std::string escaped = split_pattern_regex(SplitPattern::kWordsPunct);
  for (size_t i; (i = escaped.find('\r')) != std::string::npos;) escaped.replace(i, 1, "\\r");
  for (size_t i; (i = escaped.find('\n')) != std::string::npos;) escaped.replace(i, 1, "\\n");
  ASSERT_TRUE(split_pattern_from_regex(escaped).ok());
  // GPT-2's regex is a different tokenizer: refused with the pattern in the message.
  auto gpt2 = split_pattern_from_regex("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+");
  ASSERT_FALSE(gpt2.ok());
  EXPECT_NE(gpt2.error().message.find("'s|'t"), std::string::npos);
}

}  // namespace
}  // namespace cedar::text
