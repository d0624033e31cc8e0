// The HTTP server end to end in process: a FakeBackend (scripted completions, known text) behind the
// real httplib server on a free loopback port, queried with httplib's client. References: the fake's
// script text, OpenAI's / DeepSeek's documented field names, HTTP status codes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include "server_test_util.h"
#include "server/wire_response.h"

namespace cedar::server {
namespace {

using text::Json;
using testing::TestServer;

FakeBackendOptions fake(int64_t context, int tick_ms = 0, int64_t cached = 0) {
  FakeBackendOptions o;
  o.context_length = context;
  o.tick = std::chrono::milliseconds(tick_ms);
  o.cached_prompt_tokens = cached;
  return o;
}

const char* kChat = R"({"model":"deepseek-v4.1-flash","messages":[{"role":"user","content":"Hello"}],"seed":7})";

Json post_json(httplib::Client& c, const std::string& path, const std::string& body, int expect_status,
               const httplib::Headers& headers = {}) {
  auto r = c.Post(path.c_str(), headers, body, "application/json");
  EXPECT_TRUE(r) << path;
  if (!r) return Json();
  EXPECT_EQ(r->status, expect_status) << path << " " << body.substr(0, 200) << " -> " << r->body;
  auto j = Json::parse(r->body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r->body;
  return j;
}

// SSE `data:` payloads of a whole stream body (comments skipped); "[DONE]" kept as a string.
std::vector<std::string> sse_events(const std::string& body, int* comments = nullptr) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string ev = body.substr(pos, end - pos);
    if (ev.rfind("data: ", 0) == 0) out.push_back(ev.substr(6));
    else if (ev.rfind(":", 0) == 0 && comments) ++*comments;
    pos = end + 2;
  }
  return out;
}

TEST(HttpServer, HealthModelsMetrics) {
  CEDAR_REQUIRE_TOKENIZER();
  TestServer ts(fake(2048));
  auto c = ts.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  const Json models = Json::parse(m->body);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "deepseek-v4.1-flash");
  EXPECT_EQ(models["data"][0]["context_length"], 2048);
  EXPECT_EQ(models["data"][0]["max_model_len"], 2048);
  post_json(c, "/v1/chat/completions", kChat, 200);
  auto met = c.Get("/metrics");
  ASSERT_TRUE(met);
  for (const char* name : {"cedar_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1",
                           "cedar_time_to_first_token_seconds_bucket", "cedar_time_per_output_token_seconds_count",
                           "cedar_prefix_cache_hit_rate", "cedar_kv_cache_usage", "cedar_generation_tokens_total"})
    EXPECT_NE(met->body.find(name), std::string::npos) << name;
  auto nf = c.Get("/nope");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_TRUE(Json::parse(nf->body).contains("error"));
}

TEST(HttpServer, ChatNonStreamFields) {
  CEDAR_REQUIRE_TOKENIZER();
  TestServer ts(fake(4096, 0, 2));
  auto c = ts.client();
  const Json r = post_json(c, "/v1/chat/completions", kChat, 200);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["model"], "deepseek-v4.1-flash");
  EXPECT_EQ(r["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  const Json& msg = r["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["reasoning_content"], "Thinking about seed 7.");
  const int64_t prompt = r["usage"]["prompt_tokens"].get<int64_t>();
  EXPECT_EQ(msg["content"], "Answer for seed 7: " + std::to_string(prompt) + " prompt tokens.");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  EXPECT_EQ(r["usage"]["prompt_cache_hit_tokens"], 2);
  EXPECT_EQ(r["usage"]["prompt_cache_miss_tokens"], prompt - 2);
  // The tokenize endpoint renders the same prompt.
  const Json t = post_json(c, "/tokenize", kChat, 200);
  EXPECT_EQ(t["count"], prompt);
  // Completion tokens: the script's tokens; reasoning ones end with `</think>`.
  const auto* tok = testing::v41_tokenizer();
  text::TokenizeOptions o;
  o.allow_added_tokens = true;
  const auto all = tok->encode("Thinking about seed 7.</think>" + msg["content"].get<std::string>(), o);
  const auto reasoning = tok->encode("Thinking about seed 7.</think>", o);
  EXPECT_EQ(r["usage"]["completion_tokens"], all->size());
  EXPECT_EQ(r["usage"]["completion_tokens_details"]["reasoning_tokens"], reasoning->size());
}

TEST(HttpServer, StreamEqualsNonStreamWithUsageAndDone) {
  CEDAR_REQUIRE_TOKENIZER();
  TestServer ts(FakeBackendOptions{});
  auto c = ts.client();
  const Json whole = post_json(c, "/v1/chat/completions", kChat, 200);
  Json body = Json::parse(kChat);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  const auto events = sse_events(r->body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  const Json first = Json::parse(events[0]);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["reasoning_content"], "");
  std::string reasoning, content, finish;
  Json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const Json ch = Json::parse(events[i]);
    EXPECT_EQ(ch["object"], "chat.completion.chunk");
    if (ch.contains("usage")) {
      usage = ch["usage"];
      EXPECT_TRUE(ch["choices"].empty());
      continue;
    }
    const Json& d = ch["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (!ch["choices"][0]["finish_reason"].is_null()) finish = ch["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(reasoning, whole["choices"][0]["message"]["reasoning_content"]);
  EXPECT_EQ(content, whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(usage["completion_tokens"], whole["usage"]["completion_tokens"]);
  EXPECT_EQ(usage["prompt_tokens"], whole["usage"]["prompt_tokens"]);
  // Without include_usage there is no usage chunk, and the stream still ends with [DONE].
  body.erase("stream_options");
  auto r2 = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r2);
  const auto ev2 = sse_events(r2->body);
  EXPECT_EQ(ev2.back(), "[DONE]");
  for (size_t i = 0; i + 1 < ev2.size(); ++i) EXPECT_FALSE(Json::parse(ev2[i]).contains("usage"));
}

TEST(HttpServer, ToolCallsStreamedByIndexWithIds) {
  CEDAR_REQUIRE_TOKENIZER();
  FakeBackendOptions fo;
  fo.script = [](const BackendRequest&) {
    return std::string(
        "ok</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" "
        "string=\"true\">Paris</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  };
  TestServer ts(fo);
  auto c = ts.client();
  Json body = Json::parse(kChat);
  body["tools"] = Json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":
      {"type":"object","properties":{"city":{"type":"string"}}}}}])");
  const Json whole = post_json(c, "/v1/chat/completions", body.dump(), 200);
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  const Json& tc = whole["choices"][0]["message"]["tool_calls"][0];
  EXPECT_EQ(tc["type"], "function");
  EXPECT_EQ(tc["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(tc["function"]["arguments"].get<std::string>()), Json::parse(R"({"city":"Paris"})"));
  EXPECT_EQ(tc["id"].get<std::string>().rfind("call_", 0), 0u);
  body["stream"] = true;
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  std::string args, id, finish;
  for (const auto& e : sse_events(r->body)) {
    if (e == "[DONE]") continue;
    const Json ch = Json::parse(e);
    const Json& d = ch["choices"][0]["delta"];
    if (d.contains("tool_calls")) {
      EXPECT_EQ(d["tool_calls"][0]["index"], 0);
      if (d["tool_calls"][0].contains("id")) id = d["tool_calls"][0]["id"];
      args += d["tool_calls"][0]["function"]["arguments"].get<std::string>();
    }
    if (!ch["choices"][0]["finish_reason"].is_null()) finish = ch["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(Json::parse(args), Json::parse(R"({"city":"Paris"})"));
  EXPECT_EQ(id.rfind("call_", 0), 0u);
  EXPECT_EQ(finish, "tool_calls");
}

TEST(HttpServer, AuthRequired) {
  CEDAR_REQUIRE_TOKENIZER();
  ServerOptions so;
  so.api_key = "sekret";
  TestServer ts(FakeBackendOptions{}, so);
  auto c = ts.client();
  Json e = post_json(c, "/v1/chat/completions", kChat, 401);
  EXPECT_EQ(e["error"]["code"], "invalid_api_key");
  post_json(c, "/v1/chat/completions", kChat, 401, {{"Authorization", "Bearer wrong"}});
  post_json(c, "/v1/chat/completions", kChat, 200, {{"Authorization", "Bearer sekret"}});
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 401);
  auto h = c.Get("/health");  // health checks need no key
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST(HttpServer, BadRequestsAre4xxWithErrorBodies) {
  CEDAR_REQUIRE_TOKENIZER();
  ServerOptions so;
  so.max_body_bytes = 4096;
  TestServer ts(fake(64), so);
  auto c = ts.client();
  const std::pair<std::string, int> cases[] = {
      {"{not json", 400},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", 400},
      {R"({"messages":[]})", 400},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", 400},
      {R"({"messages":[{"role":"user","content":"x"}],"model":"gpt-9"})", 404},
      {std::string(R"({"messages":[{"role":"user","content":")") + "\xff\xfe" + R"("}]})", 400},
      {std::string(R"({"messages":[{"role":"user","content":")") + std::string(5000, 'a') + R"("}]})", 413},
      {"[1,2]", 400},
      {"", 400},
  };
  for (const auto& [body, status] : cases) {
    const Json e = post_json(c, "/v1/chat/completions", body, status);
    EXPECT_TRUE(e.contains("error") && e["error"].contains("message")) << body.substr(0, 80);
  }
  // Context overflow: a clear 400 that names the limit.
  const std::string long_user = std::string(R"({"messages":[{"role":"user","content":")") +
                                std::string(200, 'z') + " " + std::string(200, 'q') + R"("}]})";
  std::string words;
  for (int i = 0; i < 80; ++i) words += " word" + std::to_string(i);
  const Json ov = post_json(c, "/v1/chat/completions",
                            std::string(R"({"messages":[{"role":"user","content":")") + words + R"("}]})", 400);
  EXPECT_EQ(ov["error"]["code"], "context_length_exceeded");
  EXPECT_NE(ov["error"]["message"].get<std::string>().find("maximum context length is 64"), std::string::npos);
  // An oversized max_tokens is clamped, not rejected.
  const Json ok = post_json(c, "/v1/chat/completions",
                            R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":256000})", 200);
  EXPECT_EQ(ok["choices"][0]["finish_reason"], "stop");
  (void)long_user;
}

TEST(HttpServer, MaxTokensGivesLength) {
  CEDAR_REQUIRE_TOKENIZER();
  TestServer ts(FakeBackendOptions{});
  auto c = ts.client();
  const Json r = post_json(c, "/v1/chat/completions",
                           R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3})", 200);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 3);
}

TEST(HttpServer, KeepAliveCommentsWhileWaiting) {
  CEDAR_REQUIRE_TOKENIZER();
  ServerOptions so;
  so.keepalive_interval = std::chrono::milliseconds(20);
  TestServer ts(fake(4096, 60), so);
  auto c = ts.client();
  auto r = c.Post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true})", "application/json");
  ASSERT_TRUE(r);
  int comments = 0;
  const auto events = sse_events(r->body, &comments);
  EXPECT_GT(comments, 0);
  EXPECT_NE(r->body.find(": keep-alive\n\n"), std::string::npos);
  EXPECT_EQ(events.back(), "[DONE]");
}

TEST(HttpServer, ClientDisconnectCancelsGeneration) {
  CEDAR_REQUIRE_TOKENIZER();
  FakeBackendOptions fo;
  fo.tick = std::chrono::milliseconds(20);
  fo.script = [](const BackendRequest&) { return std::string(2000, 'a') + " b"; };
  TestServer ts(fo);
  auto c = ts.client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = R"({"messages":[{"role":"user","content":"hi"}],"stream":true,"thinking":{"type":"disabled"}})";
  req.set_header("Content-Type", "application/json");
  int received = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++received < 3; };
  httplib::Response res;
  httplib::Error err;
  c.send(req, res, err);  // the receiver aborts: the client closes the connection
  EXPECT_GE(received, 3);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((ts.backend->live_requests() > 0 || ts.server->inflight() > 0) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(ts.backend->live_requests(), 0);
  EXPECT_EQ(ts.backend->cancelled_requests(), 1);
  EXPECT_EQ(ts.server->inflight(), 0);
}

TEST(HttpServer, OverloadGets429WithRetryAfter) {
  CEDAR_REQUIRE_TOKENIZER();
  ServerOptions so;
  so.max_inflight = 1;
  FakeBackendOptions fo;
  fo.tick = std::chrono::milliseconds(20);
  TestServer ts(fo, so);
  std::atomic<bool> first_done{false};
  std::thread first([&] {
    auto c = ts.client();
    post_json(c, "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":20})", 200);
    first_done = true;
  });
  while (ts.server->inflight() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto c = ts.client();
  auto r = c.Post("/v1/chat/completions", kChat, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_FALSE(first_done.load());
  first.join();
}

TEST(HttpServer, StopSequenceEndsAndCancels) {
  CEDAR_REQUIRE_TOKENIZER();
  TestServer ts(FakeBackendOptions{});
  auto c = ts.client();
  const Json r = post_json(c, "/v1/chat/completions",
                           R"({"messages":[{"role":"user","content":"hi"}],"seed":3,"stop":[" for"]})", 200);
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Answer");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
}

TEST(HttpServer, CompletionsTokenizeDetokenize) {
  CEDAR_REQUIRE_TOKENIZER();
  FakeBackendOptions fo;
  fo.script = [](const BackendRequest&) { return std::string("one two three"); };
  TestServer ts(fo);
  auto c = ts.client();
  const Json r = post_json(c, "/v1/completions", R"({"prompt":"count:","max_tokens":50,"logprobs":2,"echo":true})", 200);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], "count:one two three");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  const auto* tok = testing::v41_tokenizer();
  const auto ids = tok->encode("one two three");
  ASSERT_EQ(r["choices"][0]["logprobs"]["tokens"].size(), ids->size());
  for (size_t i = 0; i < ids->size(); ++i)
    EXPECT_DOUBLE_EQ(r["choices"][0]["logprobs"]["token_logprobs"][i].get<double>(), fake_logprob(i, (*ids)[i]));
  const Json st = post_json(c, "/v1/completions", R"({"prompt":"x","stop":" two"})", 200);
  EXPECT_EQ(st["choices"][0]["text"], "one");
  // tokenize / detokenize against the tokenizer itself.
  const Json t = post_json(c, "/tokenize", R"({"prompt":"Hello world","add_special_tokens":false})", 200);
  const auto ref = tok->encode("Hello world");
  EXPECT_EQ(t["tokens"], Json(std::vector<int64_t>(ref->begin(), ref->end())));
  const Json d = post_json(c, "/detokenize", Json{{"tokens", t["tokens"]}}.dump(), 200);
  EXPECT_EQ(d["prompt"], "Hello world");
  post_json(c, "/detokenize", R"({"tokens":[-1]})", 400);
  post_json(c, "/detokenize", R"({"tokens":"x"})", 400);
}

TEST(HttpServer, ChatLogprobs) {
  CEDAR_REQUIRE_TOKENIZER();
  FakeBackendOptions fo;
  fo.script = [](const BackendRequest&) { return std::string("Just the answer, ok?"); };
  TestServer ts(fo);
  auto c = ts.client();
  const Json r = post_json(c, "/v1/chat/completions",
                           R"({"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":2,
                               "thinking":{"type":"disabled"},"seed":1})", 200);
  const Json& lp = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), r["usage"]["completion_tokens"].get<size_t>());
  std::string joined;
  for (size_t i = 0; i < lp.size(); ++i) {
    EXPECT_EQ(lp[i]["top_logprobs"].size(), 2u);
    EXPECT_TRUE(lp[i].contains("bytes"));
    for (int b : lp[i]["bytes"]) joined.push_back(static_cast<char>(b));
  }
  // The token bytes spell the completion.
  EXPECT_EQ(joined, "Just the answer, ok?");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Just the answer, ok?");
}

TEST(HttpServer, GracefulStopDrainsInflight) {
  CEDAR_REQUIRE_TOKENIZER();
  FakeBackendOptions fo;
  fo.tick = std::chrono::milliseconds(10);
  auto ts = std::make_unique<TestServer>(fo);
  Json result;
  std::thread t([&] {
    auto c = ts->client();
    result = post_json(c, "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":10})", 200);
  });
  while (ts->server->inflight() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ts->server->stop();  // waits for the in-flight request
  t.join();
  EXPECT_EQ(result["choices"][0]["finish_reason"], "length");
  ts.reset();
}

}  // namespace
}  // namespace cedar::server
