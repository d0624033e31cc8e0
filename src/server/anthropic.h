// Anthropic Messages (POST /v1/messages) as DeepSeek's Anthropic-compatible API speaks it — the wire
// the DeepSeek Harness PyPI runtime (0.2.1rc2) uses for its deepseek-official route: top-level
// `thinking: {type}` and `output_config: {effort}`, thinking / text / tool_use blocks, tool_result
// blocks in user turns, and an SSE stream of message_start, content_block_start / _delta / _stop,
// message_delta (stop_reason, usage) and message_stop.
// Requests are translated to the Chat Completions form and go through the same mapping, encoder and
// output parser; responses are translated from the ChatAssembler's deltas, so both APIs agree.
#pragma once

#include <string>
#include <vector>

#include "server/wire_response.h"

namespace cedar::server {

// Anthropic request body -> Chat Completions request body (errors name the Anthropic field).
Result<text::Json> messages_to_chat_request(const text::Json& body);

// end_turn / max_tokens / tool_use / stop_sequence from an OpenAI finish reason.
std::string anthropic_stop_reason(std::string_view openai_finish);

// Anthropic usage: input_tokens excludes prompt-cache reads (cache_read_input_tokens).
text::Json anthropic_usage(const Usage& u);

// Wraps a ChatAssembler; chunks are Anthropic events (each carries its `type`).
class MessagesAssembler {
 public:
  explicit MessagesAssembler(ChatAssembler chat, std::string message_id);
  text::Json first_chunk() const;  // message_start
  Status on_event(const BackendEvent& event, std::vector<text::Json>& events);
  bool finished() const { return chat_.finished(); }
  const Usage& usage() const { return chat_.usage(); }
  text::Json response() const;  // the whole message (non-stream)

  // "event: <type>\ndata: <json>\n\n"
  static std::string sse(const text::Json& event);

 private:
  void translate(const text::Json& chunk, std::vector<text::Json>& out);
  void close_block(std::vector<text::Json>& out);

  ChatAssembler chat_;
  std::string id_;
  std::string model_;
  int block_ = -1;             // index of the open block (-1: none)
  std::string block_type_;     // "thinking", "text", "tool_use"
  int next_block_ = 0;
};

}  // namespace cedar::server
