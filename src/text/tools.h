// Tool definitions in the system prompt and tool-call arguments in history (encoding.md §2.2, §2.5).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "text/dialect.h"
#include "text/prompt.h"
#include "text/py_json.h"

namespace cedar::text {

// The "## Tools" section for a list of OpenAI tool objects; each schema line is json.dumps of the
// tool's whole `function` object in the caller's key order. V4.1-1017 applies tool namespaces.
Result<Prompt> render_tools(const Json& tools, const DialectSpec& spec);

// V4.1-1017: the function object as rendered (namespace folded into name/description).
Result<Json> apply_tool_namespace(const Json& tool);

struct DsmlParam {
  std::string key;
  std::string value;  // raw string value, or json.dumps of a non-string value
  bool is_string;
};

// The DSML parameters for one historical call's `arguments` JSON text, per dialect policy.
Result<std::vector<DsmlParam>> tool_arguments_for_dsml(const std::string& arguments, ArgumentsPolicy policy);

}  // namespace cedar::text
