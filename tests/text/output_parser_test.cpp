#include <random>

#include <gtest/gtest.h>

#include "text/encoder.h"
#include "text/output_parser.h"
#include "text/replay.h"

namespace cedar::text {
namespace {

const std::string kToolOutput =
    "Need the tool.</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter "
    "name=\"city\" string=\"true\">Par\"is\n中文</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"days\" "
    "string=\"false\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"now\">\n\n</｜DSML｜ "
    "invoke>\n</｜DSML｜ calls>";

struct Outcome {
  std::string reasoning, content, calls;
  FinishReason finish;
  bool operator==(const Outcome&) const = default;
};

Outcome run(const std::vector<std::string>& chunks, ParserOptions opt, StopCause cause = StopCause::kEos) {
  StreamParser p(opt);
  std::vector<ParseEvent> ev;
  for (const auto& c : chunks) EXPECT_TRUE(p.feed(c, ev).ok());
  EXPECT_TRUE(p.finish(cause, ev).ok());
  Outcome o{p.result().reasoning, p.result().content, "", p.result().finish};
  for (const auto& c : p.result().tool_calls) o.calls += c.name + "|" + c.arguments + ";";
  // Deltas add up to the result.
  std::string r, content, args;
  for (const auto& e : ev) {
    if (e.kind == ParseEvent::Kind::kReasoning) r += e.text;
    if (e.kind == ParseEvent::Kind::kContent) content += e.text;
    if (e.kind == ParseEvent::Kind::kToolCallArguments) args += e.text;
  }
  EXPECT_EQ(r, o.reasoning);
  EXPECT_EQ(content, o.content);
  return o;
}

void expect_split_invariant(const std::string& text, ParserOptions opt, StopCause cause = StopCause::kEos) {
  const Outcome whole = run({text}, opt, cause);
  for (size_t i = 0; i <= text.size(); ++i) ASSERT_EQ(run({text.substr(0, i), text.substr(i)}, opt, cause), whole) << i;
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  ASSERT_EQ(run(bytes, opt, cause), whole);
  std::mt19937 rng(7);
  for (int t = 0; t < 30; ++t) {
    std::vector<std::string> parts;
    for (size_t i = 0; i < text.size();) {
      const size_t n = 1 + rng() % 9;
      parts.push_back(text.substr(i, n));
      i += n;
    }
    ASSERT_EQ(run(parts, opt, cause), whole);
  }
}

TEST(StreamParser, ToolCallsInEverySplit) {
  ParserOptions opt;
  opt.start = ParseStart::kReasoning;
  const Outcome o = run({kToolOutput}, opt);
  EXPECT_EQ(o.reasoning, "Need the tool.");
  EXPECT_EQ(o.content, "");
  EXPECT_EQ(o.calls, "get_weather|{\"city\": \"Par\\\"is\\n中文\", \"days\": 2};now|{};");
  EXPECT_EQ(o.finish, FinishReason::kToolCalls);
  expect_split_invariant(kToolOutput, opt);
}

// A client must never see a fragment of `</｜DSML｜ parameter>` (or any markup) as argument text: partial
// markers are held back while streaming, and a cut inside one (token limit) drops it instead of flushing.
TEST(StreamParser, ArgumentDeltasNeverCarryMarkupFragments) {
  ParserOptions opt;
  opt.start = ParseStart::kReasoning;
  auto check = [](const std::vector<ParseEvent>& ev, const std::string& where) {
    for (const auto& e : ev) {
      if (e.kind != ParseEvent::Kind::kToolCallArguments) continue;
      // The values hold no '<' and no U+FF5C, so any such byte is markup (U+FF5C starts EF BD).
      EXPECT_EQ(e.text.find('<'), std::string::npos) << where << ": " << e.text;
      EXPECT_EQ(e.text.find("\xEF\xBD"), std::string::npos) << where << ": " << e.text;
    }
  };
  for (size_t i = 0; i <= kToolOutput.size(); ++i) {
    StreamParser p(opt);
    std::vector<ParseEvent> ev;
    ASSERT_TRUE(p.feed(kToolOutput.substr(0, i), ev).ok());
    check(ev, "prefix " + std::to_string(i));
    ASSERT_TRUE(p.feed(kToolOutput.substr(i), ev).ok());
    check(ev, "split " + std::to_string(i));
    // Cut here by the token limit instead.
    StreamParser cut(opt);
    std::vector<ParseEvent> cev;
    ASSERT_TRUE(cut.feed(kToolOutput.substr(0, i), cev).ok());
    ASSERT_TRUE(cut.finish(StopCause::kLength, cev).ok());
    check(cev, "cut " + std::to_string(i));
    for (const auto& c : cut.result().tool_calls) EXPECT_EQ(c.arguments.find('<'), std::string::npos) << i;
  }
  std::vector<ParseEvent> ev;
  StreamParser bytes(opt);
  for (char c : kToolOutput) ASSERT_TRUE(bytes.feed(std::string(1, c), ev).ok());
  check(ev, "bytes");
}

TEST(StreamParser, V4SpellingAndBlockInsideReasoning) {
  ParserOptions opt;
  opt.start = ParseStart::kReasoning;
  const std::string text = "think\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a b\" "
                           "string=\"true\">x</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const Outcome o = run({text}, opt);
  EXPECT_EQ(o.reasoning, "think");
  EXPECT_EQ(o.calls, "f|{\"a b\": \"x\"};");
  expect_split_invariant(text, opt);
}

TEST(StreamParser, StopsMatchAnswerOnlyAndStrayThinkEndIsDropped) {
  ParserOptions opt;
  opt.start = ParseStart::kReasoning;
  opt.stop = {"STOP"};
  const std::string text = "\n\nreason STOP stays\n</think>\nanswer STOP hidden";
  const Outcome o = run({text}, opt);
  EXPECT_EQ(o.reasoning, "reason STOP stays");
  EXPECT_EQ(o.content, "answer ");
  EXPECT_EQ(o.finish, FinishReason::kStop);
  expect_split_invariant(text, opt);
  ParserOptions chat;
  EXPECT_EQ(run({"a</think>b</think>c"}, chat).content, "abc");
}

// The match that ends first wins, whatever the split (tests/fuzz/output_parser_fuzz.cpp found the whole
// text and its pieces disagreeing when a stop sequence began with the markup): a stop longer than the
// `<｜DSML｜` it starts with loses to it; one that ends with the marker, or inside it, wins. The outcomes are
// deepseek-recipe's (tests/python/test_parser_oracle.py, test_stop_sequences_overlapping_markup_match_recipe).
TEST(StreamParser, TheMatchThatEndsFirstWinsBetweenStopsAndMarkup) {
  const std::string block =
      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const std::string text = "ab" + block;
  struct Case {
    std::string stop, content, calls;
    FinishReason finish;
  };
  const Case cases[] = {
      {"<｜DSML｜tool_calls>", "ab", "f|{};", FinishReason::kToolCalls},  // longer, same start: the marker
      {"b<｜DSML｜t", "ab", "f|{};", FinishReason::kToolCalls},           // ends after the marker
      {"b<｜DSML｜", "a", "", FinishReason::kStop},                       // ends with it, starts first
      {"<｜DSML｜", "ab", "", FinishReason::kStop},                        // the marker itself: stops first
      {"<｜DS", "ab", "", FinishReason::kStop},                            // ends inside it
  };
  for (const Case& c : cases) {
    ParserOptions opt;
    opt.stop = {c.stop};
    const Outcome o = run({text}, opt);
    EXPECT_EQ(o.content, c.content) << c.stop;
    EXPECT_EQ(o.calls, c.calls) << c.stop;
    EXPECT_EQ(o.finish, c.finish) << c.stop;
    expect_split_invariant(text, opt);
  }
  // Newlines before a possible `<｜DSML｜` are held even while a stop string's partial match holds the text
  // from a later newline (the fuzzer's second finding: a split after "S\n\n\n" let one newline through).
  ParserOptions nl;
  nl.stop = {"\n\nkept"};
  const std::string nl_text = "S\n\n\n" + block;
  const Outcome nl_out = run({nl_text}, nl);
  EXPECT_EQ(nl_out.content, "S");
  EXPECT_EQ(nl_out.calls, "f|{};");
  expect_split_invariant(nl_text, nl);
  // A stray `</think>` in the answer is dropped before a stop that runs past it can match.
  ParserOptions chat;
  chat.stop = {"x</think>y"};
  EXPECT_EQ(run({"x</think>yz"}, chat).content, "xyz");
  expect_split_invariant("x</think>yz", chat);
}

TEST(StreamParser, TruncationFlushesHeldPartialsVerbatim) {
  ParserOptions chat;
  for (std::string t : {"hello <", "hello </thi", "hello\n"}) {
    const Outcome o = run({t}, chat, StopCause::kLength);
    EXPECT_EQ(o.content, t);
    EXPECT_EQ(o.finish, FinishReason::kLength);
  }
  ParserOptions s = chat;
  s.stop = {"STOP"};
  EXPECT_EQ(run({"hello ST"}, s, StopCause::kLength).content, "hello ST");
  const std::string cut = "x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">unfinished";
  const Outcome o = run({cut}, chat, StopCause::kLength);
  EXPECT_EQ(o.calls, "f|{\"a\": \"unfinished;");
  EXPECT_EQ(o.finish, FinishReason::kLength);
  expect_split_invariant(cut, chat, StopCause::kLength);
}

TEST(StreamParser, FinishIsIdempotentAndFeedAfterFinishFails) {
  StreamParser p({});
  std::vector<ParseEvent> ev;
  ASSERT_TRUE(p.feed("hi", ev).ok());
  ASSERT_TRUE(p.finish(StopCause::kEos, ev).ok());
  ASSERT_TRUE(p.finish(StopCause::kEos, ev).ok());
  EXPECT_FALSE(p.feed("more", ev).ok());
}

// OFF-V41-TEST test_v41_parses_spaced_dsml_roundtrip: parse, re-encode with context -> same bytes.
TEST(ReferenceParser, RoundTripReproducesTheCompletion) {
  const std::string out =
      "  reason  </think>summary\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"lookup\">\n<｜DSML｜ parameter name=\"query\" "
      "string=\"true\">value</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"limit\" string=\"false\">2</｜DSML｜ "
      "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>";
  auto parsed = parse_completion_reference(out, Dialect::kV41, true);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->reasoning, "  reason  ");
  EXPECT_EQ(parsed->tool_calls[0].arguments, "{\"query\": \"value\", \"limit\": 2}");
  Message u;
  u.content = "question";
  EncodeOptions o;
  o.thinking = true;
  o.context_messages = 1;
  auto again = encode_messages({u, parsed->to_message()}, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->str(), out);
  // test_v41_parse_rejects_unspaced_v4_dsml
  std::string v4 = out;
  for (auto [a, b] : {std::pair{"｜DSML｜ calls", "｜DSML｜tool_calls"}, {"｜DSML｜ invoke", "｜DSML｜invoke"},
                      {"｜DSML｜ parameter", "｜DSML｜parameter"}}) {
    for (size_t p; (p = v4.find(a)) != std::string::npos;) v4.replace(p, std::string(a).size(), b);
  }
  EXPECT_FALSE(parse_completion_reference(v4, Dialect::kV41, true).ok());
}

TEST(Replay, ReplaysGeneratedBytesWhenTheClientReserializesArguments) {
  // The model wrote "2.50" and a param order the client will not keep.
  const std::string gen = "r</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"x\" "
                          "string=\"false\">2.50</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  ParserOptions po;
  po.start = ParseStart::kReasoning;
  ParsedCompletion pc = parse_completion(gen, po, StopCause::kEos);
  Message served = pc.to_message();
  served.tool_calls[0].id = "call_1";
  ReplayMemory memory;
  memory.remember(served, segment_generated_text(gen), true);

  Message u, back, tool;
  u.content = "q";
  back = served;
  back.tool_calls[0].arguments = "{\"x\":2.5}";  // client's JSON.stringify
  tool.role = Role::kTool;
  tool.tool_call_id = "call_1";
  tool.content = "ok";
  EncodeOptions o;
  o.thinking = true;
  o.drop_thinking = false;
  const std::string plain = encode_messages({u, back, tool}, o)->str();
  EXPECT_EQ(plain.find("2.50"), std::string::npos);
  o.replay = &memory;
  const std::string replayed = encode_messages({u, back, tool}, o)->str();
  EXPECT_NE(replayed.find("<｜Assistant｜><think>" + gen + "<｜end▁of▁sentence｜>"), std::string::npos);
  back.tool_calls[0].arguments = "{\"x\": 3}";  // changed meaning: no replay
  EXPECT_EQ(encode_messages({u, back, tool}, o)->str().find("2.50"), std::string::npos);
}

}  // namespace
}  // namespace cedar::text
