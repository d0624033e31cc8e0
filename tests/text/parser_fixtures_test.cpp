// Published parser fixtures (tests/data/encoding, sources in its README):
// * fastllm test/toolcall/cases/deepseek_v4_dsml.jsonl (encoding.md §5 #10): 18 V4 DSML cases, fed
//   whole and in chunks of 1, 2, 5 and 13 bytes, no markup may leak into content or arguments.
//   Six cases expect fastllm's own policy where cedar follows deepseek-recipe (DeepSeek's parser,
//   encoding.md §3.3); for those the test pins the recipe outcome (also checked against the live
//   recipe in tests/python/test_parser_oracle.py).
// * deepseek-recipe's own streaming test (§5 #6): deepseek-ai/deepseek-recipe
//   deepseek-recipe/tests/stream_tool_calls.rs @ac74541f, transcribed below.
#include <gtest/gtest.h>

#include "encoding_fixtures.h"
#include "text/output_parser.h"

namespace cedar::text {
namespace {

using fixtures::load_json;
using fixtures::read_data_file;

struct Parsed {
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  FinishReason finish = FinishReason::kStop;
  bool stopped = false;
  bool operator==(const Parsed&) const = default;
};

// Parses `text` fed in `chunk`-byte pieces (0 = whole); checks that the deltas add up to the result.
Parsed parse_chunks(const std::string& text, const ParserOptions& opt, size_t chunk, StopCause cause = StopCause::kEos) {
  StreamParser p(opt);
  std::vector<ParseEvent> ev;
  if (chunk == 0) chunk = text.size() + 1;
  for (size_t i = 0; i < text.size(); i += chunk) EXPECT_TRUE(p.feed(text.substr(i, chunk), ev).ok());
  EXPECT_TRUE(p.finish(cause, ev).ok());
  Parsed out{p.result().reasoning, p.result().content, {}, p.result().finish, p.done()};
  for (const auto& c : p.result().tool_calls) out.calls.emplace_back(c.name, c.arguments);
  std::string reasoning, content;
  std::vector<std::string> args(out.calls.size());
  for (const auto& e : ev) {
    if (e.kind == ParseEvent::Kind::kReasoning) reasoning += e.text;
    if (e.kind == ParseEvent::Kind::kContent) content += e.text;
    if (e.kind == ParseEvent::Kind::kToolCallArguments) args.at(e.tool_index) += e.text;
  }
  // Append-only deltas that add up to the result: nothing shown to a client was ever retracted.
  EXPECT_EQ(reasoning, out.reasoning);
  EXPECT_EQ(content, out.content);
  for (size_t i = 0; i < args.size(); ++i) EXPECT_EQ(args[i], out.calls[i].second);
  return out;
}

// Where cedar (= deepseek-recipe) and fastllm's fixture disagree, and why (encoding.md §3.3).
struct Deviation {
  std::string_view id;
  std::string_view why;
  bool tools_called;
  std::string_view content;  // cedar's content
  std::string_view calls;    // cedar's calls as JSON [{"name", "arguments"}], "" = the fixture's
};
const Deviation kDeviations[] = {
    {"dsv4_single_tool_with_prefix_content", "newlines right before the DSML block are dropped (recipe)", true, "我来查一下。", ""},
    {"dsv4_stream_split_boundary_case", "newlines right before the DSML block are dropped (recipe)", true, "边界测试", ""},
    {"dsv4_alternate_dsml_tag", "`<\\DSML\\...>` is no DeepSeek spelling: plain text", false, "", ""},
    {"dsv4_wrong_block_name_should_not_parse", "the opener's tag name is not checked (recipe)", true, "",
     R"([{"name": "get_weather", "arguments": {"city": "北京"}}])"},
    {"dsv4_malformed_unclosed_outer_block", "an unclosed block still yields its complete invokes (recipe)", true, "",
     R"([{"name": "get_weather", "arguments": {"city": "北京"}}])"},
    {"dsv4_malformed_unclosed_invoke", "`</｜DSML｜` ends the invoke whatever follows (recipe)", true, "",
     R"([{"name": "get_weather", "arguments": {"city": "北京"}}])"},
};

TEST(FastllmDsmlFixtures, AllCasesEverySplitNoLeak) {
  const std::string jsonl = read_data_file("fastllm/deepseek_v4_dsml.jsonl");
  size_t n = 0, agreed = 0;
  for (size_t pos = 0, nl; (nl = jsonl.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    auto c = parse_json(jsonl.substr(pos, nl - pos), "fastllm case");
    ASSERT_TRUE(c.ok());
    ++n;
    const std::string id = (*c)["id"].get<std::string>();
    const std::string raw = (*c)["raw_output"].get<std::string>();
    const Json& exp = (*c)["expected"];
    ParserOptions opt;
    opt.dialect = Dialect::kV4;
    const Parsed whole = parse_chunks(raw, opt, 0);
    for (size_t chunk : {1, 2, 5, 13}) EXPECT_EQ(parse_chunks(raw, opt, chunk), whole) << id << " chunk " << chunk;

    const Deviation* dev = nullptr;
    for (const auto& d : kDeviations) if (d.id == id) dev = &d;
    const bool tools_called = dev ? dev->tools_called : exp["tools_called"].get<bool>();
    const std::string content = dev ? (dev->tools_called ? std::string(dev->content) : raw)
                                    : (exp["content"].is_null() ? "" : exp["content"].get<std::string>());
    EXPECT_EQ(whole.content, content) << id << (dev ? std::string(" — ") + std::string(dev->why) : "");
    EXPECT_EQ(whole.calls.empty(), !tools_called) << id;
    EXPECT_EQ(whole.finish, tools_called ? FinishReason::kToolCalls : FinishReason::kStop) << id;
    if (tools_called) {
      const Json calls = dev && !dev->calls.empty() ? *parse_json(dev->calls, "deviation") : exp["tool_calls"];
      ASSERT_EQ(whole.calls.size(), calls.size()) << id;
      for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(whole.calls[i].first, calls[i]["name"].get<std::string>()) << id;
        auto args = parse_json(whole.calls[i].second, "arguments");
        ASSERT_TRUE(args.ok()) << id << ": " << whole.calls[i].second;
        EXPECT_EQ(*args, calls[i]["arguments"]) << id;
      }
      // No markup in what a client sees (the DSML-like text of one case is a legitimate value).
      EXPECT_EQ(whole.content.find("DSML"), std::string::npos) << id;
      if (id != "dsv4_value_contains_dsml_like_text") {
        for (const auto& call : whole.calls) EXPECT_EQ(call.second.find("DSML"), std::string::npos) << id;
      }
    }
    if (!dev) ++agreed;
  }
  EXPECT_EQ(n, 18u);
  EXPECT_EQ(agreed, 12u);
}

// quoted_tool_parameter_names_survive_chunk_boundaries: keys with spaces, an empty key, a key that looks
// like the type attribute; whole, every 2-way split at character boundaries, one character per chunk;
// V4 and V4.1 tag families; finish_reason tool_calls.
TEST(RecipeStreamToolCalls, QuotedParameterNamesSurviveChunkBoundaries) {
  const auto expected = parse_json(R"({"shipping address": "Paris\n日本", " string= mode ": {"enabled": true}, "count": 2, "": "empty key"})",
                                   "expected");
  ASSERT_TRUE(expected.ok());
  for (auto [block, prefix] : {std::pair{"tool_calls", ""}, std::pair{" calls", " "}}) {
    const std::string b(block), pre(prefix);
    const std::string output = "<｜DSML｜" + b + ">\n<｜DSML｜" + pre + "invoke name=\"submit\">\n<｜DSML｜" + pre +
                               "parameter name=\"shipping address\" string=\"true\">Paris\n日本</｜DSML｜" + pre + "parameter>\n<｜DSML｜" +
                               pre + "parameter name=\" string= mode \" string=\"false\">{\"enabled\":true}</｜DSML｜" + pre +
                               "parameter>\n<｜DSML｜" + pre + "parameter name=\"count\" string=\"false\">2</｜DSML｜" + pre +
                               "parameter>\n<｜DSML｜" + pre + "parameter name=\"\" string=\"true\">empty key</｜DSML｜" + pre +
                               "parameter>\n</｜DSML｜" + pre + "invoke>\n</｜DSML｜" + b + ">";
    auto check = [&](const Parsed& r, const std::string& where) {
      EXPECT_EQ(r.finish, FinishReason::kToolCalls) << where;
      ASSERT_EQ(r.calls.size(), 1u) << where;
      EXPECT_EQ(r.calls[0].first, "submit") << where;
      auto args = parse_json(r.calls[0].second, "arguments");
      ASSERT_TRUE(args.ok()) << where << ": " << r.calls[0].second;
      EXPECT_EQ(*args, *expected) << where;
    };
    ParserOptions opt;
    check(parse_chunks(output, opt, 0), b + " whole");
    for (size_t k = 1; k < output.size(); ++k) {
      if ((static_cast<unsigned char>(output[k]) & 0xC0) == 0x80) continue;  // character boundaries, as the Rust test
      StreamParser p(opt);
      std::vector<ParseEvent> ev;
      ASSERT_TRUE(p.feed(output.substr(0, k), ev).ok());
      ASSERT_TRUE(p.feed(output.substr(k), ev).ok());
      ASSERT_TRUE(p.finish(StopCause::kEos, ev).ok());
      Parsed r{p.result().reasoning, p.result().content, {}, p.result().finish, p.done()};
      for (const auto& c : p.result().tool_calls) r.calls.emplace_back(c.name, c.arguments);
      check(r, b + " split " + std::to_string(k));
    }
    check(parse_chunks(output, opt, 1), b + " bytes");
  }
}

}  // namespace
}  // namespace cedar::text
