// POST /v1/messages (Anthropic Messages, DeepSeek's compatible variant): request translation and the
// event sequence a Messages client needs (message_start, block start/delta/stop per block,
// message_delta with stop_reason and usage, message_stop). References: Anthropic's documented
// event and block shapes; the fake backend's script text.
#include <gtest/gtest.h>

#include "server/anthropic.h"
#include "server_test_util.h"

namespace cedar::server {
namespace {

using text::Json;
using testing::TestServer;

TEST(Anthropic, RequestTranslation) {
  const Json body = Json::parse(R"({
    "model": "deepseek-v4.1-flash", "max_tokens": 100, "stream": true, "system": "be brief",
    "thinking": {"type": "enabled"}, "output_config": {"effort": "max"}, "stop_sequences": ["END"],
    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
    "messages": [
      {"role": "user", "content": "hi"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": ""},
                                        {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                                   {"type": "text", "text": "go on"}]}]})");
  auto chat = messages_to_chat_request(body);
  ASSERT_TRUE(chat.ok()) << chat.error().message;
  const Json& m = (*chat)["messages"];
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], Json::parse(R"({"role":"system","content":"be brief"})"));
  EXPECT_EQ(m[2]["reasoning_content"], "hmm");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(m[3], Json::parse(R"({"role":"tool","tool_call_id":"t1","content":"ok"})"));
  EXPECT_EQ(m[4], Json::parse(R"({"role":"user","content":"go on"})"));
  EXPECT_EQ((*chat)["reasoning_effort"], "max");
  EXPECT_EQ((*chat)["stop"], Json::parse(R"(["END"])"));
  EXPECT_EQ((*chat)["tools"][0]["function"]["parameters"], Json::parse(R"({"type":"object"})"));
  EXPECT_FALSE(messages_to_chat_request(Json::parse(R"({"messages":[]})")).ok());  // max_tokens missing
  auto bad = messages_to_chat_request(
      Json::parse(R"({"max_tokens":1,"messages":[{"role":"user","content":[{"type":"video"}]}]})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("messages[0].content[0].type"), std::string::npos);
}

TEST(Anthropic, StreamEventsAndWholeMessageAgree) {
  CEDAR_REQUIRE_TOKENIZER();
  FakeBackendOptions fo;
  fo.cached_prompt_tokens = 4;
  fo.script = [](const BackendRequest&) {
    return std::string(
        "why</think>Calling.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" "
        "string=\"false\">1</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  };
  TestServer ts(fo);
  auto c = ts.client();
  Json body = Json::parse(R"({"model":"deepseek-v4.1-flash","max_tokens":200,"thinking":{"type":"enabled"},
      "tools":[{"name":"f","input_schema":{"type":"object","properties":{"a":{"type":"integer"}}}}],
      "messages":[{"role":"user","content":"call f"}]})");
  auto whole = c.Post("/v1/messages", body.dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const Json msg = Json::parse(whole->body);
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["stop_reason"], "tool_use");
  ASSERT_EQ(msg["content"].size(), 3u);
  EXPECT_EQ(msg["content"][0]["type"], "thinking");
  EXPECT_EQ(msg["content"][0]["thinking"], "why");
  EXPECT_EQ(msg["content"][1], Json::parse(R"({"type":"text","text":"Calling."})"));
  EXPECT_EQ(msg["content"][2]["name"], "f");
  EXPECT_EQ(msg["content"][2]["input"], Json::parse(R"({"a":1})"));
  EXPECT_EQ(msg["usage"]["cache_read_input_tokens"], 4);

  body["stream"] = true;
  auto r = c.Post("/v1/messages", body.dump(), "application/json");
  ASSERT_TRUE(r);
  std::vector<std::string> types;
  std::map<int, std::string> text, thinking, json;
  Json final_usage;
  size_t pos = 0;
  while ((pos = r->body.find("event: ", pos)) != std::string::npos) {
    const size_t nl = r->body.find('\n', pos);
    const std::string type = r->body.substr(pos + 7, nl - pos - 7);
    ASSERT_EQ(r->body.compare(nl + 1, 6, "data: "), 0);
    const size_t end = r->body.find("\n\n", nl);
    const Json ev = Json::parse(r->body.substr(nl + 7, end - nl - 7));
    EXPECT_EQ(ev["type"], type);  // the event name matches the payload type
    types.push_back(type);
    if (type == "content_block_delta") {
      const int i = ev["index"];
      const Json& d = ev["delta"];
      if (d["type"] == "text_delta") text[i] += d["text"].get<std::string>();
      if (d["type"] == "thinking_delta") thinking[i] += d["thinking"].get<std::string>();
      if (d["type"] == "input_json_delta") json[i] += d["partial_json"].get<std::string>();
    }
    if (type == "message_delta") {
      EXPECT_EQ(ev["delta"]["stop_reason"], "tool_use");
      final_usage = ev["usage"];
    }
    pos = end;
  }
  ASSERT_FALSE(types.empty());
  EXPECT_EQ(types.front(), "message_start");
  EXPECT_EQ(types.back(), "message_stop");
  EXPECT_EQ(std::count(types.begin(), types.end(), "content_block_start"), 3);
  EXPECT_EQ(std::count(types.begin(), types.end(), "content_block_stop"), 3);
  EXPECT_EQ(thinking[0], "why");
  EXPECT_EQ(text[1], "Calling.");
  EXPECT_EQ(Json::parse(json[2]), Json::parse(R"({"a":1})"));
  EXPECT_EQ(final_usage, msg["usage"]);
  EXPECT_EQ(r->body.find("[DONE]"), std::string::npos);
}

}  // namespace
}  // namespace cedar::server
