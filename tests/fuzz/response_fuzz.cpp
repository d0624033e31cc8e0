// libFuzzer target: the response side of the server (server/wire_response.h, server/anthropic.h) on
// arbitrary generated text, any parser options and any split of the text into backend events. A client
// must read the same answer from the stream as from the whole response, in both APIs:
// * Chat Completions: the chunks' reasoning_content, content and tool_calls (names, ids, arguments by
//   index) add up to response()'s message, and the last chunk's finish_reason is its finish_reason;
// * Anthropic Messages: the content blocks the events open and fill (thinking, text, tool_use) are
//   response()'s blocks (a tool_use's streamed partial_json parses to its input where it is an object);
// * every chunk and event serializes for SSE (invalid UTF-8 replaced), nothing throws or crashes.
// Input: byte 0 options (parser start, stop by length, logprobs), byte 1 the split's seed, then the text.
// Needs third_party/downloads/deepseek-v4/tokenizer.json (tools/fetch_tokenizer.py) for logprob entries.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "server/anthropic.h"
#include "server/wire_response.h"
#include "text/tokenizer.h"

namespace {

using cedar::server::BackendEvent;
using cedar::server::BackendFinish;
using cedar::text::Json;
using cedar::fuzz::check;

const cedar::text::Tokenizer* g_tok = nullptr;

std::string str(const Json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

// The text split into events of 1..16 bytes (an LCG seeded by `seed`), a token per event; the last event
// carries the finish.
std::vector<BackendEvent> events_of(std::string_view text, uint8_t seed, BackendFinish finish) {
  std::vector<BackendEvent> out;
  uint32_t s = seed | 0x100u;
  for (size_t at = 0; at < text.size();) {
    s = s * 1103515245u + 12345u;
    const size_t n = std::min<size_t>(1 + ((s >> 16) & 15), text.size() - at);
    BackendEvent e;
    e.token = cedar::server::BackendToken{static_cast<int64_t>((s >> 8) % 1000), -0.5, {}};
    e.text = std::string(text.substr(at, n));
    out.push_back(std::move(e));
    at += n;
  }
  BackendEvent last;
  last.finish = finish;
  out.push_back(std::move(last));
  return out;
}

void check_chat(const std::vector<Json>& chunks, const Json& response) {
  std::string reasoning, content, finish;
  std::vector<std::string> names, ids, args;
  for (const Json& c : chunks) {
    (void)cedar::server::sse_data(c);
    check(c["choices"].size() == 1, "a chunk without one choice");
    const Json& choice = c["choices"][0];
    const Json& d = choice["delta"];
    reasoning += str(d, "reasoning_content");
    content += str(d, "content");
    if (d.contains("tool_calls"))
      for (const Json& tc : d["tool_calls"]) {
        const size_t i = tc["index"].get<size_t>();
        if (tc.contains("id")) {
          check(i == names.size(), "a tool call opens out of order");
          ids.push_back(tc["id"].get<std::string>());
          names.push_back(tc["function"]["name"].get<std::string>());
          args.emplace_back();
        }
        check(i < args.size(), "arguments of a tool call that did not open");
        args[i] += str(tc["function"], "arguments");
      }
    if (!choice["finish_reason"].is_null()) {
      check(finish.empty(), "two chunks carry a finish_reason");
      finish = choice["finish_reason"].get<std::string>();
    }
  }
  const Json& choice = response["choices"][0];
  const Json& msg = choice["message"];
  check(finish == choice["finish_reason"].get<std::string>(), "stream and response finish differently");
  check(reasoning == str(msg, "reasoning_content"), "streamed reasoning differs from the response's");
  check(content == str(msg, "content"), "streamed content differs from the response's");
  const size_t calls = msg.contains("tool_calls") ? msg["tool_calls"].size() : 0;
  check(calls == names.size(), "streamed tool calls differ in number from the response's");
  for (size_t i = 0; i < calls; ++i) {
    const Json& tc = msg["tool_calls"][i];
    check(tc["id"].get<std::string>() == ids[i], "a tool call's id differs between stream and response");
    check(tc["function"]["name"].get<std::string>() == names[i], "a tool call's name differs");
    check(tc["function"]["arguments"].get<std::string>() == args[i], "a tool call's arguments differ");
  }
}

void check_messages(const Json& first, const std::vector<Json>& events, const Json& response) {
  (void)cedar::server::MessagesAssembler::sse(first);
  Json blocks = Json::array();
  std::vector<std::string> partial;  // per block: a tool_use's partial_json
  bool stopped = false;
  for (const Json& e : events) {
    (void)cedar::server::MessagesAssembler::sse(e);
    const std::string type = e["type"].get<std::string>();
    check(!stopped, "an event after message_stop");
    if (type == "content_block_start") {
      check(e["index"].get<size_t>() == blocks.size(), "a content block opens out of order");
      blocks.push_back(e["content_block"]);
      partial.emplace_back();
    } else if (type == "content_block_delta") {
      const size_t i = e["index"].get<size_t>();
      check(i + 1 == blocks.size(), "a delta for a block that is not the open one");
      const Json& d = e["delta"];
      const std::string dt = d["type"].get<std::string>();
      if (dt == "thinking_delta") blocks[i]["thinking"] = str(blocks[i], "thinking") + str(d, "thinking");
      else if (dt == "text_delta") blocks[i]["text"] = str(blocks[i], "text") + str(d, "text");
      else if (dt == "input_json_delta") partial[i] += str(d, "partial_json");
      else check(false, "an unknown delta type");
    } else if (type == "message_stop") {
      stopped = true;
    }
  }
  check(stopped, "the stream never sent message_stop");
  const Json& want = response["content"];
  check(want.size() == blocks.size(), "streamed content blocks differ in number from the response's");
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string type = blocks[i]["type"].get<std::string>();
    check(type == want[i]["type"].get<std::string>(), "a content block's type differs");
    if (type == "thinking") check(str(blocks[i], "thinking") == str(want[i], "thinking"), "thinking differs");
    if (type == "text") check(str(blocks[i], "text") == str(want[i], "text"), "text differs");
    if (type == "tool_use") {
      check(blocks[i]["id"] == want[i]["id"] && blocks[i]["name"] == want[i]["name"], "a tool_use differs");
      const Json input = Json::parse(partial[i], nullptr, false);
      if (!input.is_discarded() && input.is_object()) check(input == want[i]["input"], "a tool_use's input differs");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_tok = &cedar::fuzz::load_tokenizer("/third_party/downloads/deepseek-v4/tokenizer.json");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t o = data[0];
  cedar::text::ParserOptions parser;
  parser.start = cedar::fuzz::parse_start(o);
  parser.json_output = (o & 8) != 0;
  if (o & 16) parser.stop = {"STOP"};
  const BackendFinish finish = (o & 32) ? BackendFinish::kLength : BackendFinish::kStop;
  const bool logprobs = (o & 64) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  const std::vector<BackendEvent> events = events_of(text, data[1], finish);

  cedar::server::ResponseMeta meta{"chatcmpl-fuzz", "deepseek-v4.1-flash", 0, 7};
  cedar::server::ChatAssembler chat(meta, parser, logprobs, *g_tok, 1);
  std::vector<Json> chunks{chat.first_chunk()};
  for (const BackendEvent& e : events) check(chat.on_event(e, chunks).ok(), "a chat event failed");
  check(chat.finished(), "the chat assembler did not finish on the final event");
  check_chat(chunks, chat.response());

  cedar::server::MessagesAssembler messages(cedar::server::ChatAssembler(meta, parser, logprobs, *g_tok, 1), "msg_fuzz");
  std::vector<Json> anthropic;
  for (const BackendEvent& e : events) check(messages.on_event(e, anthropic).ok(), "a messages event failed");
  check_messages(messages.first_chunk(), anthropic, messages.response());
  return 0;
}
