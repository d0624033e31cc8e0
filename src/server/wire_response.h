// Backend events -> OpenAI / DeepSeek wire responses (serving.md §4b). One assembler per request:
// it runs the output parser over the streamed text and builds both the SSE chunks (stream) and the
// whole response (non-stream) from the same events, so both modes agree byte for byte on content.
//   * reasoning goes to `reasoning_content`, the answer to `content`, DSML tool calls to `tool_calls`
//     (streamed by index; ids minted here, "call_" + 24 hex digits);
//   * finish_reason is one of stop / tool_calls / length;
//   * usage carries prompt_tokens_details.cached_tokens, prompt_cache_hit_tokens /
//     prompt_cache_miss_tokens and completion_tokens_details.reasoning_tokens.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "server/backend.h"
#include "text/output_parser.h"
#include "text/py_json.h"

namespace cedar::server {

struct ResponseMeta {
  std::string id;        // "chatcmpl-..." / "cmpl-..."
  std::string model;
  int64_t created = 0;   // unix seconds
  int64_t prompt_tokens = 0;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t reasoning_tokens = 0;
  text::Json to_json() const;
};

// A random id of `hex_digits` lowercase hex digits after `prefix`.
std::string mint_id(std::string_view prefix, size_t hex_digits, std::mt19937_64& rng);

// Chat Completions (POST /v1/chat/completions).
class ChatAssembler {
 public:
  ChatAssembler(ResponseMeta meta, text::ParserOptions parser, bool logprobs, const text::Tokenizer& tokenizer,
                uint64_t id_seed);

  // The opening chunk (role, empty content / reasoning_content).
  text::Json first_chunk() const;
  // Processes one backend event; appends the chunks it produces (stream mode callers send them).
  // Errors: parser failure, or a backend error event.
  Status on_event(const BackendEvent& event, std::vector<text::Json>& chunks);
  // True once the output is complete (backend finished or the parser saw a stop sequence / the end
  // of the tool block, after which the backend request should be cancelled).
  bool finished() const { return finished_; }
  bool parser_done() const { return parser_.done(); }
  // Whole response (non-stream) and the usage-only chunk (stream_options.include_usage).
  text::Json response() const;
  text::Json usage_chunk() const;
  const Usage& usage() const { return usage_; }
  std::string_view finish_reason() const;

 private:
  Status finish(text::StopCause cause, std::vector<text::ParseEvent>& events);
  text::Json chunk(text::Json delta, const text::Json& logprobs, const text::Json& finish) const;
  text::Json logprob_entry(const BackendToken& token) const;

  ResponseMeta meta_;
  text::StreamParser parser_;
  bool logprobs_;
  const text::Tokenizer* tokenizer_;
  std::mt19937_64 rng_;
  bool thinking_start_;
  bool in_reasoning_;
  bool finished_ = false;
  Usage usage_;
  std::vector<std::string> call_ids_;
  text::Json logprob_content_ = text::Json::array();
};

// Legacy Completions (POST /v1/completions): raw text, stop strings applied by the backend.
class CompletionAssembler {
 public:
  CompletionAssembler(ResponseMeta meta, int logprobs, const text::Tokenizer& tokenizer, std::string echo_prefix);
  Status on_event(const BackendEvent& event, std::vector<text::Json>& chunks);
  bool finished() const { return finished_; }
  text::Json response() const;
  text::Json usage_chunk() const;
  const Usage& usage() const { return usage_; }

 private:
  text::Json chunk(const std::string& text, const text::Json& logprobs, const text::Json& finish) const;

  ResponseMeta meta_;
  int logprobs_;
  const text::Tokenizer* tokenizer_;
  std::string text_;
  std::string finish_reason_;
  bool finished_ = false;
  Usage usage_;
  text::Json lp_tokens_ = text::Json::array(), lp_values_ = text::Json::array(), lp_top_ = text::Json::array(),
             lp_offsets_ = text::Json::array();
};

// OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
text::Json error_body(const std::string& message, const std::string& type, const std::string& code = "");

// One SSE event: "data: <json>\n\n" (compact JSON, invalid UTF-8 replaced).
std::string sse_data(const text::Json& j);

}  // namespace cedar::server
