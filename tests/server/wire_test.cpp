// Wire-level pieces without HTTP: request field validation, max_tokens clamping, and the chat
// assembler (streamed deltas and the whole response built from the same events must agree; tool
// calls come out by index with minted ids). References are the texts the events carry.
#include <gtest/gtest.h>

#include "server_test_util.h"
#include "server/wire_request.h"
#include "server/wire_response.h"

namespace cedar::server {
namespace {

using text::Json;

Json chat_body(Json extra = Json::object()) {
  Json b = Json::parse(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
  for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
  return b;
}

TEST(WireRequest, ParsesSamplingAndStreamFields) {
  auto job = parse_chat_request(chat_body(Json::parse(
                                    R"({"temperature":0.5,"top_p":0.9,"seed":7,"max_completion_tokens":12,
                                        "max_tokens":99,"stream":true,"stream_options":{"include_usage":true},
                                        "logprobs":true,"top_logprobs":3,"unknown_field":{"x":1}})")),
                                text::RequestPolicy{});
  ASSERT_TRUE(job.ok()) << job.error().message;
  EXPECT_EQ(job->sampling.temperature, 0.5);
  EXPECT_EQ(job->sampling.top_p, 0.9);
  EXPECT_EQ(*job->sampling.seed, 7u);
  EXPECT_EQ(*job->max_tokens, 12);  // max_completion_tokens wins
  EXPECT_TRUE(job->stream.stream);
  EXPECT_TRUE(job->stream.include_usage);
  EXPECT_TRUE(job->sampling.logprobs);
  EXPECT_EQ(job->sampling.top_logprobs, 3);
  EXPECT_EQ(job->parser.start, text::ParseStart::kReasoning);  // thinking is on by default
}

TEST(WireRequest, ThinkingDisabledStartsInContent) {
  auto job = parse_chat_request(chat_body(Json::parse(R"({"thinking":{"type":"disabled"}})")), text::RequestPolicy{});
  ASSERT_TRUE(job.ok()) << job.error().message;
  EXPECT_EQ(job->parser.start, text::ParseStart::kContent);
}

TEST(WireRequest, ErrorsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"temperature":"hot"})", "temperature"},
      {R"({"temperature":3})", "temperature"},
      {R"({"top_p":0})", "top_p"},
      {R"({"max_tokens":0})", "max_tokens"},
      {R"({"max_tokens":1.5})", "max_tokens"},
      {R"({"n":2})", "n"},
      {R"({"stream":"yes"})", "stream"},
      {R"({"stream_options":[]})", "stream_options"},
      {R"({"top_logprobs":5})", "top_logprobs"},
      {R"({"top_logprobs":21,"logprobs":true})", "top_logprobs"},
      {R"({"model":3})", "model"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":"hi"})", "messages"},
  };
  for (const auto& [extra, field] : cases) {
    auto job = parse_chat_request(chat_body(Json::parse(extra)), text::RequestPolicy{});
    ASSERT_FALSE(job.ok()) << extra;
    EXPECT_NE(job.error().message.find(field), std::string::npos) << extra << " -> " << job.error().message;
  }
  EXPECT_FALSE(parse_chat_request(Json::array(), text::RequestPolicy{}).ok());
}

TEST(WireRequest, CompletionPromptForms) {
  auto s = parse_completion_request(Json::parse(R"({"prompt":"abc","stop":["x"],"logprobs":2})"));
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(*s->prompt_text, "abc");
  EXPECT_EQ(s->sampling.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(s->logprobs, 2);
  EXPECT_EQ(*s->max_tokens, 16);
  auto ids = parse_completion_request(Json::parse(R"({"prompt":[1,2,3]})"));
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->prompt_ids, (std::vector<int64_t>{1, 2, 3}));
  for (const char* bad : {R"({})", R"({"prompt":5})", R"({"prompt":[1,"a"]})", R"({"prompt":"a","stop":[""]})",
                          R"({"prompt":"a","stop":7})"})
    EXPECT_FALSE(parse_completion_request(Json::parse(bad)).ok()) << bad;
}

TEST(WireRequest, MaxTokensClampedToContextNotRejected) {
  EXPECT_EQ(*clamp_max_tokens(256000, 100, 4096), 3996);
  EXPECT_EQ(*clamp_max_tokens(10, 100, 4096), 10);
  EXPECT_EQ(*clamp_max_tokens(std::nullopt, 100, 4096), 3996);
  auto overflow = clamp_max_tokens(10, 4096, 4096);
  ASSERT_FALSE(overflow.ok());
  EXPECT_TRUE(is_context_overflow(overflow.error().message));
  EXPECT_NE(overflow.error().message.find("4096"), std::string::npos);
}

TEST(WireResponse, UsageFields) {
  Usage u{100, 20, 64, 5};
  const Json j = u.to_json();
  EXPECT_EQ(j["prompt_tokens"], 100);
  EXPECT_EQ(j["completion_tokens"], 20);
  EXPECT_EQ(j["total_tokens"], 120);
  EXPECT_EQ(j["prompt_tokens_details"]["cached_tokens"], 64);
  EXPECT_EQ(j["prompt_cache_hit_tokens"], 64);
  EXPECT_EQ(j["prompt_cache_miss_tokens"], 36);
  EXPECT_EQ(j["completion_tokens_details"]["reasoning_tokens"], 5);
}

TEST(WireResponse, MintedIdsAreDistinctHex) {
  std::mt19937_64 rng(1);
  const std::string a = mint_id("call_", 24, rng), b = mint_id("call_", 24, rng);
  EXPECT_EQ(a.size(), 29u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef", 5), std::string::npos);
}

// Streams `pieces` (one event each) through a ChatAssembler; returns the chunks and the assembler.
std::vector<Json> run_pieces(ChatAssembler& a, const std::vector<std::string>& pieces, BackendFinish last) {
  std::vector<Json> chunks;
  for (size_t i = 0; i < pieces.size(); ++i) {
    BackendEvent e;
    e.token = BackendToken{static_cast<int64_t>(i + 10), -0.5, {}};
    e.text = pieces[i];
    e.cached_prompt_tokens = 3;
    EXPECT_TRUE(a.on_event(e, chunks).ok());
  }
  BackendEvent fin;
  fin.finish = last;
  fin.cached_prompt_tokens = 3;
  EXPECT_TRUE(a.on_event(fin, chunks).ok());
  return chunks;
}

TEST(ChatAssembler, ReasoningContentToolCallsByIndex) {
  CEDAR_REQUIRE_TOKENIZER();
  text::ParserOptions po;
  po.start = text::ParseStart::kReasoning;
  ChatAssembler a(ResponseMeta{"chatcmpl-x", "m", 1, 9}, po, false, *testing::v41_tokenizer(), 42);
  // The completion split at awkward places (inside markers and values).
  const std::vector<std::string> pieces = {
      "Need ", "the tool.", "</think>", "Let me check.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_",
      "weather\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">Pa", "ris</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n",
      "<｜DSML｜ invoke name=\"now\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>"};
  const auto chunks = run_pieces(a, pieces, BackendFinish::kStop);
  ASSERT_TRUE(a.finished());
  std::string reasoning, content;
  std::map<int, std::string> names, args, ids;
  for (const auto& c : chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    const Json& d = c["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (const auto& tc : d["tool_calls"]) {
        const int idx = tc["index"].get<int>();
        if (tc.contains("id")) ids[idx] = tc["id"].get<std::string>();
        if (tc["function"].contains("name")) names[idx] += tc["function"]["name"].get<std::string>();
        if (tc["function"].contains("arguments")) args[idx] += tc["function"]["arguments"].get<std::string>();
      }
  }
  EXPECT_EQ(reasoning, "Need the tool.");
  EXPECT_EQ(content, "Let me check.");
  EXPECT_EQ(names[0], "get_weather");
  EXPECT_EQ(names[1], "now");
  EXPECT_EQ(Json::parse(args[0]), Json::parse(R"({"city":"Paris"})"));
  EXPECT_EQ(Json::parse(args[1]), Json::object());
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "tool_calls");

  // The whole response agrees with the stream.
  const Json r = a.response();
  const Json& msg = r["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], reasoning);
  EXPECT_EQ(msg["content"], content);
  ASSERT_EQ(msg["tool_calls"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(msg["tool_calls"][i]["id"], ids[i]);
    EXPECT_EQ(msg["tool_calls"][i]["function"]["name"], names[i]);
    EXPECT_EQ(msg["tool_calls"][i]["function"]["arguments"], args[i]);
  }
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(r["usage"]["completion_tokens"], 7);
  EXPECT_EQ(r["usage"]["completion_tokens_details"]["reasoning_tokens"], 3);  // up to and with `</think>`
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
}

TEST(ChatAssembler, LengthAndStopSequence) {
  CEDAR_REQUIRE_TOKENIZER();
  text::ParserOptions po;
  ChatAssembler len(ResponseMeta{"c", "m", 1, 4}, po, false, *testing::v41_tokenizer(), 1);
  run_pieces(len, {"abc"}, BackendFinish::kLength);
  EXPECT_EQ(len.finish_reason(), "length");

  po.stop = {"STOP"};
  ChatAssembler st(ResponseMeta{"c", "m", 1, 4}, po, false, *testing::v41_tokenizer(), 1);
  std::vector<Json> chunks;
  BackendEvent e;
  e.token = BackendToken{5, -1, {}};
  e.text = "hello ST";
  ASSERT_TRUE(st.on_event(e, chunks).ok());
  EXPECT_FALSE(st.finished());
  e.text = "OP and more";
  ASSERT_TRUE(st.on_event(e, chunks).ok());
  EXPECT_TRUE(st.finished());  // the server cancels the backend request here
  EXPECT_EQ(st.response()["choices"][0]["message"]["content"], "hello ");
  EXPECT_EQ(st.finish_reason(), "stop");
}

TEST(ChatAssembler, BackendErrorIsReported) {
  CEDAR_REQUIRE_TOKENIZER();
  ChatAssembler a(ResponseMeta{"c", "m", 1, 4}, text::ParserOptions{}, false, *testing::v41_tokenizer(), 1);
  std::vector<Json> chunks;
  BackendEvent e;
  e.finish = BackendFinish::kError;
  e.error = "cache exhausted";
  auto st = a.on_event(e, chunks);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("cache exhausted"), std::string::npos);
}

}  // namespace
}  // namespace cedar::server
