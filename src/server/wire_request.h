// OpenAI / DeepSeek wire requests -> what the server submits (serving.md §4b, encoding.md §2.4).
// The chat messages, tools, thinking and stop fields go through text::map_chat_request; this file adds
// the sampling and streaming fields. Unknown fields are ignored (as vLLM and DeepSeek's API do);
// known fields of the wrong type or out of range are 400s whose message names the field.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "server/backend.h"
#include "text/output_parser.h"
#include "text/request_mapping.h"

namespace cedar::server {

struct StreamSettings {
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage (non-streaming responses always carry usage)
};

struct ChatJob {
  std::string model;  // "" when absent
  text::EncoderRequest encoder;
  BackendSampling sampling;            // max_tokens still unclamped (see clamp_max_tokens)
  std::optional<int64_t> max_tokens;   // as requested (max_completion_tokens wins over max_tokens)
  StreamSettings stream;
  bool logprobs = false;
  int top_logprobs = 0;
  text::ParserOptions parser;          // start state, stop sequences, JSON mode
};

Result<ChatJob> parse_chat_request(const text::Json& body, const text::RequestPolicy& policy);

struct CompletionJob {
  std::string model;
  std::optional<std::string> prompt_text;   // "prompt": a string
  std::vector<int64_t> prompt_ids;          // "prompt": an array of token ids
  BackendSampling sampling;
  std::optional<int64_t> max_tokens;
  StreamSettings stream;
  bool echo = false;
  int logprobs = -1;  // -1: none; else the number of top logprobs (OpenAI legacy `logprobs: int`)
};

Result<CompletionJob> parse_completion_request(const text::Json& body);

// The sampling fields shared by both endpoints (temperature, top_p, top_k, min_p, penalties, seed, n,
// max_tokens / max_completion_tokens, stream, stream_options, stop for completions).
Status parse_sampling(const text::Json& body, BackendSampling& sampling, std::optional<int64_t>& max_tokens,
                      StreamSettings& stream);

// The completion budget for a prompt of `prompt_tokens`: the request's max_tokens clamped to what
// the context leaves (never rejected for being large; serving.md §4b), or all of it when absent.
// Error (context overflow) when the prompt leaves no room.
Result<int64_t> clamp_max_tokens(std::optional<int64_t> requested, int64_t prompt_tokens, int64_t context_length);

// True when the error message of clamp_max_tokens is a context overflow (HTTP 400, code
// context_length_exceeded).
bool is_context_overflow(const std::string& message);

}  // namespace cedar::server
