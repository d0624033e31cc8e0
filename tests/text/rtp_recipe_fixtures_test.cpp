// RTP-RECIPE literal fixtures (tests/data/encoding/rtp_recipe_fixtures.json; encoding.md §5 #8): the
// request side through map_chat_request + encode_request, the stream side through StreamParser. Where
// the fixture encodes a deepseek-recipe choice that departs from the official encoder, the case says so
// ("cedar_differs") and the test pins cedar's official behaviour against the fixture's literal.
#include <random>

#include <gtest/gtest.h>

#include "encoding_fixtures.h"
#include "text/output_parser.h"
#include "text/request_mapping.h"

namespace cedar::text {
namespace {

using fixtures::load_json;

const Json& fixtures_json() {
  static const Json j = load_json("rtp_recipe_fixtures.json");
  return j;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
}

TEST(RtpRecipeFixtures, Requests) {
  const Json& cases = fixtures_json()["requests"];
  ASSERT_GE(cases.size(), 20u);
  for (const auto& c : cases) {
    const std::string name = c["name"].get<std::string>();
    RequestPolicy policy;
    policy.default_thinking = c["default_thinking"].get<bool>();
    const Json& e = c["expect"];
    auto req = map_chat_request(c["request"], policy);
    Result<Prompt> prompt = req.ok() ? encode_request(*req) : Result<Prompt>(req.error());
    if (e.contains("error")) {
      ASSERT_FALSE(prompt.ok()) << name << " was accepted";
      EXPECT_EQ(prompt.error().message.rfind(e["error"].get<std::string>(), 0), 0u) << name << ": " << prompt.error().message;
      continue;
    }
    ASSERT_TRUE(prompt.ok()) << name << ": " << prompt.error().message;
    const std::string p = prompt->str();
    std::string expected = e.value("prompt", "");
    std::vector<std::string> contains, not_contains;
    for (const auto& s : e.value("contains", Json::array())) contains.push_back(s.get<std::string>());
    for (const auto& s : e.value("not_contains", Json::array())) not_contains.push_back(s.get<std::string>());
    if (c.contains("cedar_differs")) {  // the fixture's literal, rewritten to the official encoder's output
      const Json& d = c["cedar_differs"];
      if (d.value("not_contains_becomes_contains", false)) {
        contains.insert(contains.end(), not_contains.begin(), not_contains.end());
        not_contains.clear();
      }
      for (const auto& r : d["replace"]) {
        const std::string from = r[0].get<std::string>(), to = r[1].get<std::string>();
        replace_all(expected, from, to);
        for (auto& s : contains) replace_all(s, from, to);
      }
    }
    if (!expected.empty()) {
      EXPECT_EQ(p, expected) << name;
    }
    for (const auto& s : contains) EXPECT_NE(p.find(s), std::string::npos) << name << " lacks " << s;
    for (const auto& s : not_contains) EXPECT_EQ(p.find(s), std::string::npos) << name << " has " << s;
    if (e.contains("endswith")) {
      const std::string end = e["endswith"].get<std::string>();
      EXPECT_TRUE(p.size() >= end.size() && p.compare(p.size() - end.size(), end.size(), end) == 0) << name;
    }
    if (e.contains("images")) {
      std::vector<std::string> urls;
      for (const auto& img : prompt->images) urls.push_back(img.value("url", ""));
      EXPECT_EQ(Json(urls), e["images"]) << name;
    }
    if (e.contains("starts_in_tool_calls")) {
      EXPECT_TRUE(req->starts_in_tool_calls()) << name;
    }
    if (e.contains("json_output")) {
      EXPECT_TRUE(req->json_mode) << name;
    }
  }
}

TEST(RtpRecipeFixtures, EffortTableAndThinkingPriority) {
  const Json& effort = fixtures_json()["effort"];
  for (const auto& pair : effort["aliases"]) {
    if (pair[0].is_null() || pair[0] == "none") {  // no effort given / thinking off: the default budget
      Json body = {{"messages", Json::array({Json::object({{"role", "user"}, {"content", "q"}})})}};
      auto req = map_chat_request(body, {});
      ASSERT_TRUE(req.ok());
      EXPECT_NE(encode_request(*req)->str().find("Reasoning Effort: 75 ("), std::string::npos);
      continue;
    }
    Json body = {{"reasoning_effort", pair[0]}, {"messages", Json::array({Json::object({{"role", "user"}, {"content", "q"}})})}};
    auto req = map_chat_request(body, {});
    ASSERT_TRUE(req.ok()) << pair.dump();
    const std::string want = "Reasoning Effort: " + std::to_string(pair[1].get<int>()) + " (";
    EXPECT_NE(encode_request(*req)->str().find(want), std::string::npos) << pair.dump();
  }
  for (const auto& bad : effort["invalid"]) EXPECT_FALSE(map_reasoning_effort(bad, Dialect::kV41).ok()) << bad.dump();
  for (const auto& row : fixtures_json()["thinking_priority"]) {
    auto on = resolve_thinking(row[0], row[1].get<bool>());
    ASSERT_TRUE(on.ok()) << row.dump();
    EXPECT_EQ(*on, row[2].get<bool>()) << row.dump();
    if (!*on) continue;
    const Json effort_value = row[0].value("reasoning_effort", Json());
    auto effort_of = effort_value == "none" ? Result<ReasoningEffort>(ReasoningEffort{})  // thinking forced on: default
                                            : map_reasoning_effort(effort_value, Dialect::kV41);
    ASSERT_TRUE(effort_of.ok());
    auto prefix = effort_prefix(dialect_spec(Dialect::kV41), *effort_of);
    ASSERT_TRUE(prefix.ok());
    EXPECT_NE(prefix->find("Effort: " + std::to_string(row[3].get<int>()) + " ("), std::string::npos) << row.dump();
  }
}

struct Out {
  std::string content, reasoning, calls;
  bool stopped;
  FinishReason finish;
  bool operator==(const Out&) const = default;
};

Out parse(const std::vector<std::string>& chunks, ParserOptions opt, StopCause cause = StopCause::kEos) {
  StreamParser p(opt);
  std::vector<ParseEvent> ev;
  for (const auto& c : chunks) EXPECT_TRUE(p.feed(c, ev).ok());
  EXPECT_TRUE(p.finish(cause, ev).ok());
  Out o{p.result().content, p.result().reasoning, "", p.done(), p.result().finish};
  for (const auto& c : p.result().tool_calls) o.calls += c.name + "|" + c.arguments + ";";
  return o;
}

std::vector<std::string> chars(const std::string& s) {  // one UTF-8 character per chunk (Python list(str))
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    while (i + n < s.size() && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

TEST(RtpRecipeFixtures, Stream) {
  const Json& st = fixtures_json()["stream"];
  const std::string call = st["CALL"].get<std::string>();
  std::string calls;
  for (const auto& t : st["call_expected"]["tools"]) calls += t[0].get<std::string>() + "|" + t[1].get<std::string>() + ";";
  ParserOptions opt;
  opt.stop = {"STOP"};
  // test_dsml_every_character_boundary_and_random_partitions (UTF-8 character boundaries, as Python).
  const auto cs = chars(call);
  std::vector<std::vector<std::string>> parts = {{call}, cs};
  for (size_t k = 1; k < cs.size(); ++k) {
    std::string a, b;
    for (size_t i = 0; i < cs.size(); ++i) (i < k ? a : b) += cs[i];
    parts.push_back({a, b});
  }
  std::mt19937 rng(20260911);
  for (int t = 0; t < 30; ++t) {
    std::vector<size_t> cut;
    for (size_t i = 1; i < cs.size(); ++i) cut.push_back(i);
    std::shuffle(cut.begin(), cut.end(), rng);
    cut.resize(25);
    std::sort(cut.begin(), cut.end());
    cut.insert(cut.begin(), 0);
    cut.push_back(cs.size());
    std::vector<std::string> chunk;
    for (size_t j = 0; j + 1 < cut.size(); ++j) {
      std::string s;
      for (size_t i = cut[j]; i < cut[j + 1]; ++i) s += cs[i];
      chunk.push_back(s);
    }
    parts.push_back(chunk);
  }
  for (const auto& p : parts) {
    const Out o = parse(p, opt);
    EXPECT_EQ(o.calls, calls);
    EXPECT_EQ(o.content, "");
    EXPECT_EQ(o.finish, FinishReason::kToolCalls);
  }
  // test_forced_tools_begin_inside_calls: the opener is in the prompt; the token limit says length.
  ParserOptions forced = opt;
  forced.start = ParseStart::kToolCalls;
  const std::string opener = "<｜DSML｜ calls>\n";
  const Out f = parse(chars(call.substr(opener.size())), forced, StopCause::kLength);
  EXPECT_EQ(f.calls, calls);
  EXPECT_EQ(f.finish, FinishReason::kLength);
  // test_stop_matches_content_after_reasoning_only: every 2-way split, even with the token limit.
  const auto& sar = st["stop_after_reasoning"];
  const std::string text = sar["text"].get<std::string>();
  ParserOptions thinking = opt;
  thinking.start = ParseStart::kReasoning;
  for (size_t k = 1; k < text.size(); ++k) {
    const Out o = parse({text.substr(0, k), text.substr(k)}, thinking, StopCause::kLength);
    EXPECT_EQ(o.content, sar["content"].get<std::string>()) << k;
    EXPECT_EQ(o.reasoning, sar["reasoning"].get<std::string>()) << k;
    EXPECT_TRUE(o.stopped);
    EXPECT_EQ(o.finish, FinishReason::kStop);
  }
  // test_json_fences_ignore_stops_in_surrounding_text
  ParserOptions json = opt;
  json.json_output = true;
  const auto& jf = st["json_fences"];
  const std::string fenced = jf["text"].get<std::string>();
  const Out one = parse({fenced}, json), many = parse(chars(fenced), json);
  EXPECT_EQ(one, many);
  auto parsed = parse_json(one.content, "content");
  ASSERT_TRUE(parsed.ok()) << one.content;
  EXPECT_EQ(*parsed, jf["json"]);
  EXPECT_FALSE(one.stopped);
  for (const auto& pair : jf["stopped"]) {
    const Out o = parse(chars(pair[0].get<std::string>()), json);
    EXPECT_TRUE(o.stopped);
    std::string c = o.content;
    c.erase(0, c.find_first_not_of(' '));
    c.erase(c.find_last_not_of(' ') + 1);
    EXPECT_EQ(c, pair[1].get<std::string>());
  }
  // test_eof_keeps_unmatched_prefix_without_inventing_tool_json
  for (const auto& t : st["eof_partials"]) {
    const Out o = parse(chars(t.get<std::string>()), opt);
    EXPECT_EQ(o.content, t.get<std::string>());
    EXPECT_EQ(o.finish, FinishReason::kStop);
  }
  const auto& pc = st["eof_partial_call"];
  const Out eos = parse(chars(pc[0].get<std::string>()), {}), len = parse(chars(pc[0].get<std::string>()), {}, StopCause::kLength);
  EXPECT_EQ(eos.calls, "lookup|" + pc[1].get<std::string>() + ";");
  EXPECT_EQ(eos.finish, FinishReason::kToolCalls);  // RTP: "stop"; deepseek-recipe: tool_calls (see the note)
  EXPECT_EQ(len.finish, FinishReason::kLength);
  // test_tools_disabled_and_repeated_think_end
  ParserOptions no_tools;
  no_tools.parse_tool_calls = false;
  EXPECT_EQ(parse(chars(call), no_tools).content, call);
  EXPECT_EQ(parse(chars(st["repeated_think_end"][0].get<std::string>()), no_tools).content, st["repeated_think_end"][1].get<std::string>());
  // test_json_scalar_and_parameter_types
  for (const auto& v : st["json_scalar_values"]) {
    const std::string value = v.get<std::string>();
    const std::string t = "<｜DSML｜ calls><｜DSML｜ invoke name=\"f\"><｜DSML｜ parameter name=\"value\" string=\"false\">" + value +
                          "</｜DSML｜ parameter></｜DSML｜ invoke></｜DSML｜ calls>";
    StreamParser p({});
    std::vector<ParseEvent> ev;
    for (const auto& c : chars(t)) ASSERT_TRUE(p.feed(c, ev).ok());
    ASSERT_TRUE(p.finish(StopCause::kEos, ev).ok());
    ASSERT_EQ(p.result().tool_calls.size(), 1u);
    auto args = parse_json(p.result().tool_calls[0].arguments, "arguments");
    auto val = parse_json(value, "value");
    ASSERT_TRUE(args.ok() && val.ok()) << p.result().tool_calls[0].arguments;
    EXPECT_EQ(*args, Json::object({{"value", *val}}));
  }
  // test_finish_is_idempotent_and_feed_after_finish_fails
  StreamParser p({});
  std::vector<ParseEvent> ev;
  ASSERT_TRUE(p.feed(st["finish_flushes"][0].get<std::string>(), ev).ok());
  const size_t before = ev.size();
  ASSERT_TRUE(p.finish(StopCause::kEos, ev).ok());
  ASSERT_EQ(ev.size(), before + 1);
  EXPECT_EQ(ev.back().text, st["finish_flushes"][1].get<std::string>());
  ASSERT_TRUE(p.finish(StopCause::kEos, ev).ok());
  EXPECT_EQ(ev.size(), before + 1);
  EXPECT_FALSE(p.feed("later", ev).ok());
}

}  // namespace
}  // namespace cedar::text
