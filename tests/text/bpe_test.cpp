// BPE merge order and tokenizer.json loading on small synthetic tokenizers. The reference for merge order is
// a naive implementation of HF's rule written here: merge the lowest-ranked adjacent pair, leftmost on ties.
#include "text/bpe.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "text/tokenizer.h"
#include "text/unicode.h"

namespace cedar::text {
namespace {

using json = nlohmann::json;

std::string bl(std::string_view bytes) { return bytes_to_byte_level(bytes); }

// A byte-level tokenizer.json: ids 0..255 are the bytes, then one id per merge result.
json synthetic(const std::vector<std::pair<std::string, std::string>>& merges, bool list_form) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[bl(std::string(1, static_cast<char>(b)))] = b;
  json m = json::array();
  for (const auto& [l, r] : merges) {
    if (!vocab.contains(bl(l + r))) vocab[bl(l + r)] = static_cast<int>(vocab.size());
    if (list_form) m.push_back(json::array({bl(l), bl(r)}));
    else m.push_back(bl(l) + " " + bl(r));
  }
  return json{{"version", "1.0"},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                 {"use_regex", false}}},
              {"post_processor", nullptr},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false},
                         {"vocab", vocab}, {"merges", m}}}};
}

Tokenizer load(const json& j) {
  auto t = Tokenizer::from_json(j.dump(), "synthetic");
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  return std::move(t).value();
}

std::vector<std::string> encode_strings(const Tokenizer& t, const std::string& text) {
  auto ids = t.encode(text);
  EXPECT_TRUE(ids.ok());
  std::vector<std::string> out;
  for (TokenId id : *ids) out.emplace_back(*t.token_bytes(id));
  return out;
}

using V = std::vector<std::string>;

TEST(Bpe, MergesByRankLeftmostFirst) {
  const Tokenizer t = load(synthetic({{"a", "b"}, {"b", "c"}, {"ab", "c"}, {"a", "a"}}, false));
  EXPECT_EQ(encode_strings(t, "abc"), (V{"abc"}));      // (a,b) outranks (b,c)
  EXPECT_EQ(encode_strings(t, "aaa"), (V{"aa", "a"}));  // leftmost of equal ranks
  EXPECT_EQ(encode_strings(t, "bca"), (V{"bc", "a"}));
  EXPECT_EQ(encode_strings(t, "x"), (V{"x"}));
  EXPECT_EQ(encode_strings(t, ""), V{});
}

TEST(Bpe, StringAndListMergeFormsAgree) {
  const std::vector<std::pair<std::string, std::string>> merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {" ", "w"}};
  const Tokenizer a = load(synthetic(merges, false)), b = load(synthetic(merges, true));
  for (const std::string s : {"hello world", "hell", "  w", "héllo"}) EXPECT_EQ(*a.encode(s), *b.encode(s)) << s;
  EXPECT_EQ(encode_strings(a, "hello world"), (V{"hell", "o", " w", "o", "r", "l", "d"}));
}

// Naive reference: lowest-rank-leftmost merging over strings. A pair listed twice takes its later rank (HF
// builds its merge map by inserting in order; checked with tokenizers 0.23.2: merges "a a","b a","a a" turn
// "baa" into ["ba", "a"]).
V reference_bpe(const std::string& text, const std::vector<std::pair<std::string, std::string>>& merges) {
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t r = 0; r < merges.size(); ++r) rank[merges[r]] = r;
  V sym;
  for (char c : text) sym.emplace_back(1, c);
  for (;;) {
    size_t best_rank = SIZE_MAX, best_pos = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = rank.find({sym[i], sym[i + 1]});
      if (it != rank.end() && it->second < best_rank) { best_rank = it->second; best_pos = i; }
    }
    if (best_rank == SIZE_MAX) return sym;
    sym[best_pos] += sym[best_pos + 1];
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best_pos) + 1);
  }
}

// Random merge tables over {a,b,c}; lengths cross the small/heap switch (128 bytes).
TEST(Bpe, SmallAndHeapPathsMatchReference) {
  std::mt19937 rng(3);
  for (int table = 0; table < 20; ++table) {
    std::vector<std::pair<std::string, std::string>> merges;
    V tokens = {"a", "b", "c"};
    for (int i = 0; i < 25; ++i) {
      const std::string l = tokens[rng() % tokens.size()], r = tokens[rng() % tokens.size()];
      if (l.size() + r.size() > 8) continue;
      merges.emplace_back(l, r);
      tokens.push_back(l + r);
    }
    const Tokenizer t = load(synthetic(merges, table % 2 == 0));
    for (int len : {1, 2, 3, 7, 20, 64, 127, 128, 129, 300}) {
      std::string text;
      for (int i = 0; i < len; ++i) text += "abc"[rng() % (table % 3 == 0 ? 1 : 3)];
      ASSERT_EQ(encode_strings(t, text), reference_bpe(text, merges)) << "table " << table << " text " << text;
    }
  }
}

TEST(TokenizerLoad, RejectsWhatItDoesNotImplement) {
  auto expect_error = [](const json& j, const std::string& needle) {
    auto t = Tokenizer::from_json(j.dump(), "bad.json");
    ASSERT_FALSE(t.ok()) << needle;
    EXPECT_NE(t.error().message.find(needle), std::string::npos) << t.error().message;
    EXPECT_NE(t.error().message.find("bad.json"), std::string::npos) << t.error().message;
  };
  const json good = synthetic({{"a", "b"}}, false);
  json j = good;
  j["model"]["merges"].push_back(bl("q") + " " + bl("zz"));
  expect_error(j, "not in the vocab");
  j = good;
  j["model"]["merges"].push_back("a b c");
  expect_error(j, "two space-separated");
  j = good;
  j["normalizer"] = {{"type", "NFC"}};
  expect_error(j, "normalizer");
  j = good;
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({
      {{"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+"}}}, {"behavior", "Isolated"}, {"invert", false}},
      good["pre_tokenizer"]})}};
  expect_error(j, "unsupported Split regex '\\p{L}+'");
  j = good;
  j["model"]["byte_fallback"] = true;
  expect_error(j, "byte_fallback");
  j = good;
  j["model"]["continuing_subword_prefix"] = "##";
  expect_error(j, "subword affixes");
  j = good;
  j["model"]["end_of_word_suffix"] = "";  // empty affixes are what HF writes for "none": accepted
  j["model"]["continuing_subword_prefix"] = "";
  EXPECT_TRUE(Tokenizer::from_json(j.dump(), "ok.json").ok());
  j = good;
  j["model"]["vocab"].erase(bl("\n"));
  expect_error(j, "byte 10");
  j = good;
  j["added_tokens"].push_back({{"id", 300}, {"content", "<x>"}, {"lstrip", true}});
  expect_error(j, "lstrip");
  j = good;
  j["model"]["vocab"] = "oops";  // wrong JSON type: an error, not an exception
  expect_error(j, "vocab");
  // tests/fuzz/tokenizer_load_fuzz.cpp's findings: a Sequence without its list read a missing key (an
  // assertion, undefined behaviour without one); one id far past the entries made a 3 KB file allocate 64 GB.
  j = good;
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizer", json::array()}};
  expect_error(j, "without a pretokenizers list");
  j = good;
  j["model"]["vocab"][bl("ab")] = 2147483600;
  expect_error(j, "token ids run to 2147483600");
  auto t = Tokenizer::from_json("{not json", "bad.json");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("not valid JSON"), std::string::npos);
  EXPECT_FALSE(Tokenizer::load("/nonexistent/tokenizer.json").ok());
}

TEST(TokenizerLoad, AddedTokensSplitLeftmostLongestRawBeforeNormalized) {
  json j = synthetic({}, false);
  j["added_tokens"] = json::array({
      {{"id", 256}, {"content", "<a>"}, {"special", true}, {"normalized", false}},
      {{"id", 257}, {"content", "<a>b"}, {"special", false}, {"normalized", false}},
      {{"id", 258}, {"content", ">b<"}, {"special", false}, {"normalized", true}},
      {{"id", 259}, {"content", "x<a"}, {"special", false}, {"normalized", true}},
      {{"id", 97}, {"content", "a"}, {"special", true}, {"normalized", false}},  // already in the vocab
  });
  const Tokenizer t = load(j);
  TokenizeOptions on;
  on.allow_added_tokens = true;
  // Expected ids: HF tokenizers 0.23.2 on the same JSON.
  EXPECT_EQ(*t.encode("<a>b<a>", on), (std::vector<TokenId>{257, 256}));  // longest at the leftmost start
  // "x<a" (normalized) starts first, but the non-normalized "<a>" pass runs before it.
  EXPECT_EQ(*t.encode("x<a>", on), (std::vector<TokenId>{'x', 256}));
  EXPECT_EQ(*t.encode("x<a", on), (std::vector<TokenId>{'x', '<', 97}));  // raw "a" beats normalized "x<a"
  EXPECT_EQ(*t.encode(">b<", on), (std::vector<TokenId>{258}));
  EXPECT_EQ(*t.encode("y>b<a", on), (std::vector<TokenId>{'y', 258, 97}));
  EXPECT_EQ(*t.encode("<a>b<a>"), (std::vector<TokenId>{'<', 'a', '>', 'b', '<', 'a', '>'}));  // off by default
  EXPECT_EQ(*t.decode(std::vector<TokenId>{257, 'c'}), "<a>bc");
  EXPECT_EQ(t.token_to_id("<a>b"), 257);
  EXPECT_EQ(t.added_token(256)->special, true);
  EXPECT_EQ(t.added_token(5), nullptr);
  EXPECT_EQ(t.vocab_size(), 260);

  json gap = j;
  gap["added_tokens"][1]["id"] = 300;  // HF would renumber it to 257: refused
  auto bad = Tokenizer::from_json(gap.dump(), "gap.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("would give it 257"), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace cedar::text
