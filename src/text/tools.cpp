#include "text/tools.h"

namespace cedar::text {
namespace {

std::string tools_prose_head(const DialectSpec& s) {
  const std::string d = "｜DSML｜";
  const std::string calls(s.calls_tag), inv(s.invoke_tag), par(s.parameter_tag);
  return "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
         "writing a \"<" + d + calls + ">\" block like the following:\n\n"
         "<" + d + calls + ">\n"
         "<" + d + inv + " name=\"$TOOL_NAME\">\n"
         "<" + d + par + " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + d + par + ">\n"
         "...\n"
         "</" + d + inv + ">\n"
         "<" + d + inv + " name=\"$TOOL_NAME2\">\n"
         "...\n"
         "</" + d + inv + ">\n"
         "</" + d + calls + ">\n\n"
         "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
         "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
         "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
         "<think>...</think> BEFORE any tool calls or final response.\n\n"
         "Otherwise, output directly after </think> with tool calls or final response.\n\n"
         "### Available Tool Schemas\n\n";
}

constexpr std::string_view kToolsProseTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

}  // namespace

Result<Json> apply_tool_namespace(const Json& tool) {
  const Json& fn = tool["function"];
  const Json* ns = nullptr;
  if (tool.contains("namespace")) ns = &tool["namespace"];
  if (fn.contains("namespace")) {
    if (ns && *ns != fn["namespace"]) return make_error("tool-level and function-level namespace differ");
    ns = &fn["namespace"];
  }
  if (!ns || ns->is_null()) return fn;
  std::string ns_name, ns_desc;
  if (ns->is_string()) {
    ns_name = ns->get<std::string>();
  } else if (ns->is_object() && ns->contains("name") && (*ns)["name"].is_string()) {
    ns_name = (*ns)["name"].get<std::string>();
    if (ns->contains("description") && (*ns)["description"].is_string()) ns_desc = (*ns)["description"].get<std::string>();
  } else {
    return make_error("namespace must be a string or {\"name\": ..., \"description\": ...}");
  }
  if (ns_name.empty() || ns_name.find("::") != std::string::npos) {
    return make_error("namespace name '" + ns_name + "' must be non-empty and must not contain '::'");
  }
  if (!fn.contains("name") || !fn["name"].is_string()) return make_error("function.name must be a string");
  const std::string name = fn["name"].get<std::string>();
  if (name.find("::") != std::string::npos) return make_error("function name '" + name + "' already contains '::'");
  Json out = Json::object();
  for (const auto& [k, v] : fn.items()) {
    if (k == "namespace") continue;
    if (k == "name") {
      out[k] = ns_name + "::" + name;
      if (!ns_desc.empty() && !fn.contains("description")) out["description"] = ns_desc + "\n";
    } else if (k == "description" && !ns_desc.empty() && v.is_string()) {
      out[k] = ns_desc + "\n" + v.get<std::string>();
    } else {
      out[k] = v;
    }
  }
  return out;
}

Result<Prompt> render_tools(const Json& tools, const DialectSpec& spec) {
  if (!tools.is_array()) return make_error("tools must be an array");
  std::string schemas;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    if (!tool.is_object() || !tool.contains("function")) {
      return make_error("tools[" + std::to_string(i) + "] has no \"function\" object");
    }
    Json fn = tool["function"];
    if (spec.namespaces) {
      auto r = apply_tool_namespace(tool);
      if (!r.ok()) return r.error().with_context("tools[" + std::to_string(i) + "]");
      fn = std::move(*r);
    }
    if (i) schemas += "\n";
    schemas += py_json_dumps(fn);
  }
  Prompt p;
  p.template_text(tools_prose_head(spec));
  p.text(schemas);  // user data: never becomes control tokens
  p.template_text(kToolsProseTail);
  return p;
}

Result<std::vector<DsmlParam>> tool_arguments_for_dsml(const std::string& arguments, ArgumentsPolicy policy) {
  Json parsed;
  bool have_object = false;
  auto try_parse = [](const std::string& text, Json& out) {
    out = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    return !out.is_discarded();
  };
  switch (policy) {
    case ArgumentsPolicy::kParseOnceFallbackRaw:
      if (try_parse(arguments, parsed)) {
        if (!parsed.is_object()) return make_error("arguments must be a JSON object, got: " + arguments);
        have_object = true;
      }
      break;
    case ArgumentsPolicy::kParseOnceStrict:
      if (!try_parse(arguments, parsed) || !parsed.is_object()) {
        return make_error("arguments must be a JSON object, got: " + arguments);
      }
      have_object = true;
      break;
    case ArgumentsPolicy::kParseTwiceFallbackRaw: {
      Json cur;
      if (try_parse(arguments, cur)) {
        if (cur.is_string()) {
          Json inner;
          if (try_parse(cur.get<std::string>(), inner)) cur = std::move(inner);
        }
        if (cur.is_object()) { parsed = std::move(cur); have_object = true; }
      }
      break;
    }
  }
  std::vector<DsmlParam> params;
  if (!have_object) {
    params.push_back({"arguments", arguments, true});
    return params;
  }
  for (const auto& [k, v] : parsed.items()) {
    if (v.is_string()) params.push_back({k, v.get<std::string>(), true});
    else params.push_back({k, py_json_dumps(v), false});
  }
  return params;
}

}  // namespace cedar::text
