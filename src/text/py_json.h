// JSON text exactly as Python's `json.dumps` writes it. The DeepSeek prompt embeds JSON (tool schemas,
// non-string tool arguments, response_format) produced by `json.dumps(x, ensure_ascii=False)`, so a
// single differing byte changes the prompt the model was trained on (encoding.md §2.7). nlohmann's
// own dump differs (no spaces after separators, different float text), hence this writer.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace cedar::text {

// Insertion-ordered JSON: Python dicts keep key order, and so must we (no sorting, ever).
using Json = nlohmann::ordered_json;

struct PyDumpOptions {
  bool ensure_ascii = false;                  // Python's default is true; the encoder uses false
  std::optional<int> indent;                  // None: one line
  std::optional<std::string> item_separator;  // default ", " (one line) or "," (indented), as Python
  std::string key_separator = ": ";
};

// json.dumps(value, ensure_ascii=..., indent=..., separators=...).
std::string py_json_dumps(const Json& value, const PyDumpOptions& options = {});

// Appends the quoted, escaped form of a UTF-8 string (Python's encode_basestring[_ascii]).
void py_json_append_string(std::string& out, std::string_view utf8, bool ensure_ascii = false);

// repr(float): shortest round-trip digits, exponent form when the decimal exponent is < -4 or >= 16
// ("1e-05", "1e+16"), otherwise fixed with at least one fractional digit ("100.0", "-0.0").
// json.dumps writes NaN / Infinity / -Infinity for non-finite values.
std::string py_float_repr(double value);

// Parses JSON text keeping key order and the int/float distinction. Never throws; `what` names the
// input in the error ("request body", "tool_calls[0].function.arguments").
Result<Json> parse_json(std::string_view text, std::string_view what);

}  // namespace cedar::text
