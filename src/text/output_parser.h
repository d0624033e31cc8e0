// Parsing model output (encoding.md §3): a tolerant streaming parser with deepseek-recipe semantics
// (§3.3-3.6) and the strict reference parser of the official encoder (§3.2).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/chat.h"
#include "text/dialect.h"

namespace cedar::text {

enum class FinishReason { kStop, kLength, kToolCalls };
std::string_view finish_reason_name(FinishReason r);

// Where parsing begins, decided by how the prompt ended.
enum class ParseStart {
  kContent,               // chat mode: prompt ended with `</think>`
  kReasoning,             // thinking mode: prompt ended with `<think>` (leading newlines dropped)
  kReasoningContinuation, // prefix continuation inside reasoning (newlines kept)
  kContentContinuation,   // prefix continuation of the answer (newlines kept)
  kToolCalls,             // forced tool call: prompt ended inside `<｜DSML｜ calls>\n`
};

struct ParserOptions {
  Dialect dialect = Dialect::kV41;  // only for `ns::name` splitting (V4.1-1017); both DSML spellings parse
  ParseStart start = ParseStart::kContent;
  bool parse_tool_calls = true;
  std::vector<std::string> stop;    // stop sequences; match answer content only
  // JSON output mode (response_format json_object), deepseek-recipe's parse_json_output: a fence
  // "```json\n" / "```\n" or a raw `{` / `[` opens the JSON, "\n```" closes it; the answer text
  // around it becomes one space per run, and stop sequences match only inside the JSON.
  bool json_output = false;
};

struct ParseEvent {
  enum class Kind { kReasoning, kContent, kToolCallStart, kToolCallArguments };
  Kind kind;
  size_t tool_index = 0;  // tool events
  std::string text;       // delta text; kToolCallStart: the full tool name
  std::string ns;         // kToolCallStart: namespace (V4.1-1017) or ""
};

struct ParsedToolCall {
  std::string name;
  std::string ns;
  std::string arguments;  // JSON text built as the model wrote it (string values escaped)
};

struct ParsedCompletion {
  std::string reasoning;
  bool has_reasoning = false;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  FinishReason finish = FinishReason::kStop;
  // Assistant message for history (call ids left empty: the server mints them).
  Message to_message() const;
};

// Why generation ended, as the engine knows it.
enum class StopCause { kEos, kLength };

class StreamParser {
 public:
  explicit StreamParser(ParserOptions options);

  // Feeds decoded UTF-8 text (any split); appends events. Error after finish().
  Status feed(std::string_view text, std::vector<ParseEvent>& events);
  // Flushes held text and fixes the finish reason; idempotent.
  Status finish(StopCause cause, std::vector<ParseEvent>& events);
  bool finished() const { return finished_; }
  // True once a stop sequence or the end of the tool block ended the output (later text is ignored).
  bool done() const { return stage_ == Stage::kFinished; }
  const ParsedCompletion& result() const { return result_; }

 private:
  enum class Stage {
    kReasoning, kContent, kJson, kAfterJson,  // kJson/kAfterJson: JSON output mode only
    kToolCalls, kToolName, kArgs, kParamName, kParamType, kParamValue, kFinished,
  };
  struct Marker;
  bool step(std::vector<ParseEvent>& events);  // processes buf_ once; false when it must wait
  bool in_tool_block() const;
  void emit_data(std::string_view data, std::vector<ParseEvent>& events);
  void apply(const Marker& m, std::vector<ParseEvent>& events);
  std::vector<Marker> markers() const;

  ParserOptions opt_;
  Stage stage_;
  bool leading_ = false;   // drop leading newlines of reasoning / content
  bool string_value_ = false;
  size_t params_in_call_ = 0;
  bool stopped_by_sequence_ = false;
  bool in_space_run_ = false;  // JSON mode: a space already stands for the current run of text
  bool finished_ = false;
  std::string buf_;
  std::string name_;
  ParsedCompletion result_;
};

// Convenience: parse a whole completion at once.
ParsedCompletion parse_completion(std::string_view text, const ParserOptions& options, StopCause cause);

// The official strict parser (`parse_message_from_completion_text`): `text` must end with EOS (or be
// cut there), tool blocks need the exact blank line, only the dialect's own DSML spelling is accepted,
// and nothing is trimmed. Errors say what is malformed.
Result<ParsedCompletion> parse_completion_reference(std::string_view text, Dialect dialect, bool thinking);

}  // namespace cedar::text
