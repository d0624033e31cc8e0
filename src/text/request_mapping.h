// OpenAI Chat Completions / DeepSeek API request JSON -> encoder input (encoding.md §2.4, §2.6, §2.8).
// Validates as it maps: every error names the offending field ("messages[2].tool_calls[0]...").
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "text/chat.h"
#include "text/encoder.h"
#include "text/py_json.h"

namespace cedar::text {

enum class DeveloperPolicy {
  kNativeOrSystem,  // dialects with a developer role keep it; others treat it as a system message
  kAsUser,          // render as a user turn (what vLLM does for V4.1)
  kReject,          // 400, as the released V4.1 encoder does
};

struct RequestPolicy {
  Dialect dialect = Dialect::kV41;
  bool default_thinking = true;  // hosted API: thinking on unless disabled
  DeveloperPolicy developer = DeveloperPolicy::kNativeOrSystem;
  size_t max_stop_sequences = 16;
};

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };

struct EncoderRequest {
  std::vector<Message> messages;
  EncodeOptions options;
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string forced_tool;        // kNamed
  std::vector<std::string> stop;  // stop sequences (apply to answer content only)
  bool json_mode = false;         // response_format json_object
  bool prefix_continuation = false;  // last message is an assistant prefix (`prefix: true`)
  // Where the output parser starts: inside the tool-call block for forced calls.
  bool starts_in_tool_calls() const { return tool_choice == ToolChoice::kRequired || tool_choice == ToolChoice::kNamed; }
};

Result<EncoderRequest> map_chat_request(const Json& body, const RequestPolicy& policy);

// Encodes a mapped request: encode_messages plus, for forced tool calls, the opened DSML block.
Result<Prompt> encode_request(const EncoderRequest& request);

// Resolves `thinking` / `enable_thinking` / `chat_template_kwargs` / `reasoning_effort` to on/off
// (RTP-RECIPE precedence; encoding.md §2.4).
Result<bool> resolve_thinking(const Json& body, bool default_thinking);

// Maps a request-level reasoning_effort value (API aliases: minimal/medium/xhigh/ultra, integers)
// to what the dialect's encoder accepts. `what` names the field in errors.
Result<ReasoningEffort> map_reasoning_effort(const Json& value, Dialect dialect);

}  // namespace cedar::text
