// The five prompt dialects (encoding.md §0.1) and everything that differs between them, in one table.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace cedar::text {

enum class Dialect { kV4, kV4_0731, kV41Pre, kV41, kV41_1017 };

// How non-object / unparsable tool-call arguments in history are rendered.
enum class ArgumentsPolicy {
  kParseOnceFallbackRaw,   // V4: json.loads once; failure -> {"arguments": raw}; non-object -> error
  kParseOnceStrict,        // V4.1 pre-release: json.loads must give an object
  kParseTwiceFallbackRaw,  // V4.1 release: up to two json.loads (double-encoded); else {"arguments": raw}
};

struct EffortLevel {
  std::string_view name;
  int budget;                  // numeric dialects
  std::string_view paragraph;  // paragraph dialects ("" = nothing rendered)
};

struct DialectSpec {
  Dialect dialect;
  std::string_view name;            // CLI / config name
  std::string_view calls_tag;       // DSML block tag: "tool_calls" (V4) or " calls" (V4.1)
  std::string_view invoke_tag;      // "invoke" / " invoke"
  std::string_view parameter_tag;   // "parameter" / " parameter"
  bool system_token;                // V4.1: <｜System｜> before system/effort text; later systems are user-like
  bool developer_role;              // accepts `developer` (rendered as a user turn with tools)
  bool numeric_effort;              // "Reasoning Effort: N (range 1-100, ...)" vs fixed paragraphs
  std::vector<EffortLevel> efforts; // accepted names
  std::string_view default_effort;  // used when the request gives none
  bool image_blocks;                // list content with image blocks (V4.1)
  bool namespaces;                  // tool namespaces `ns::name` (V4.1-1017)
  ArgumentsPolicy arguments_policy;
};

const DialectSpec& dialect_spec(Dialect dialect);
Result<Dialect> parse_dialect(std::string_view name);  // "v4", "v4-0731", "v41-pre", "v41", "v41-1017"
std::string dialect_names();                           // for help / error texts

// Requested reasoning effort as given (name or integer), before dialect validation.
struct ReasoningEffort {
  std::optional<std::string> name;
  std::optional<long long> number;
  bool given() const { return name || number; }
};

// The effort text to place at the start of a thinking prompt ("" for none); errors name the value
// and the accepted ones.
Result<std::string> effort_prefix(const DialectSpec& spec, const ReasoningEffort& effort);

}  // namespace cedar::text
