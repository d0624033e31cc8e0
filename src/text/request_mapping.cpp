#include "text/request_mapping.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>

#include "text/special_tokens.h"

namespace cedar::text {
namespace {

std::string at(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

Error field_error(const std::string& field, const std::string& what) { return make_error(field + ": " + what); }

// Request-level effort aliases per dialect (hosted API docs; RECIPE; 0731 normalization).
struct EffortAlias {
  std::string_view request;
  std::string_view encoder;  // "" = no effort (dialect default)
};
const std::vector<EffortAlias>& effort_aliases(Dialect d) {
  static const std::vector<EffortAlias> v4 = {{"minimal", ""}, {"low", ""}, {"medium", ""}, {"high", "high"},
                                              {"xhigh", "max"}, {"max", "max"}, {"ultra", "max"}};
  // 0731: xhigh -> high as deepseek-recipe maps it (its V4 encoding is the 0731 table).
  static const std::vector<EffortAlias> v4_0731 = {{"minimal", "low"}, {"low", "low"},   {"medium", "high"},
                                                   {"high", "high"},   {"xhigh", "high"}, {"max", "max"},
                                                   {"ultra", "max"}};
  static const std::vector<EffortAlias> v41_pre = {{"minimal", "low"}, {"low", "low"},     {"medium", "high"},
                                                   {"high", "high"},   {"xhigh", "xhigh"}, {"max", "max"},
                                                   {"ultra", "max"}};
  static const std::vector<EffortAlias> v41 = {{"minimal", "low"}, {"low", "low"}, {"medium", "high"}, {"high", "high"},
                                               {"xhigh", "high"},  {"max", "max"}, {"ultra", "max"}};
  switch (d) {
    case Dialect::kV4: return v4;
    case Dialect::kV4_0731: return v4_0731;
    case Dialect::kV41Pre: return v41_pre;
    default: return v41;
  }
}

Result<std::string> get_string(const Json& obj, const std::string& key, const std::string& field, bool required) {
  if (!obj.contains(key) || obj[key].is_null()) {
    if (required) return field_error(field + "." + key, "is required");
    return std::string();
  }
  if (!obj[key].is_string()) return field_error(field + "." + key, "must be a string");
  return obj[key].get<std::string>();
}

// Content: a string, null, or a list of parts. V4.1 keeps lists as blocks (images become
// placeholders); V4 dialects and non-user roles get the text parts joined by "\n\n".
Status map_content(const Json& msg, Message& out, const std::string& field, bool keep_blocks) {
  if (!msg.contains("content") || msg["content"].is_null()) return Status::Ok();
  const Json& c = msg["content"];
  if (c.is_string()) { out.content = c.get<std::string>(); return Status::Ok(); }
  if (!c.is_array()) return field_error(field + ".content", "must be a string, an array of content parts, or null");
  std::vector<Block> blocks;
  std::string joined;
  bool first = true;
  for (size_t i = 0; i < c.size(); ++i) {
    const Json& part = c[i];
    const std::string pf = at(field + ".content", i);
    if (part.is_string()) {  // some clients send bare strings
      Block b;
      b.text = part.get<std::string>();
      blocks.push_back(b);
      joined += (first ? "" : "\n\n") + b.text;
      first = false;
      continue;
    }
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return field_error(pf, "must be an object with a string \"type\"");
    }
    const std::string type = part["type"].get<std::string>();
    Block b;
    if (type == "text" || type == "input_text") {
      auto text = get_string(part, "text", pf, true);
      if (!text.ok()) return text.error();
      b.text = *text;
      joined += (first ? "" : "\n\n") + b.text;
      first = false;
    } else if (type == "image_url" || type == "image" || type == "input_image") {
      if (!keep_blocks) return field_error(pf, "images need a V4.1 dialect and a user, system or tool message");
      b.kind = Block::Kind::kImage;
      Json record = Json::object();
      record["type"] = "image";
      if (part.contains("image_url")) {
        const Json& iu = part["image_url"];
        if (iu.is_string()) record["url"] = iu;
        else if (iu.is_object() && iu.contains("url") && iu["url"].is_string()) record["url"] = iu["url"];
      }
      for (const char* key : {"source", "url", "data"}) if (part.contains(key) && !record.contains(key)) record[key] = part[key];
      bool has_source = false;
      for (const char* key : {"source", "url", "data"}) {
        if (record.contains(key) && !record[key].is_null() && !(record[key].is_string() && record[key].get<std::string>().empty())) has_source = true;
      }
      if (!has_source) return field_error(pf, "image part has no url / source / data");
      b.image = std::move(record);
    } else {
      if (!keep_blocks) return field_error(pf, "unsupported content part type '" + type + "'");
      b.kind = Block::Kind::kOther;
      b.text = type;
    }
    blocks.push_back(std::move(b));
  }
  if (keep_blocks) out.blocks = std::move(blocks);
  else out.content = joined;
  return Status::Ok();
}

// V4.1: a literal image placeholder in client text would become an image slot without an image
// (official `_validate_no_image_sp_tokens`); rejected here so the error names the request field.
Status reject_image_placeholder(const Message& m, const std::string& field) {
  auto has = [](const std::string& s) { return s.find(tok::kImage) != std::string::npos; };
  const std::string what = " contains the image placeholder " + std::string(tok::kImage) + "; send images as image content parts";
  if (m.content && has(*m.content)) return field_error(field + ".content", what.substr(1));
  if (m.blocks) {
    for (size_t i = 0; i < m.blocks->size(); ++i) {
      const Block& b = (*m.blocks)[i];
      if (b.kind == Block::Kind::kText && has(b.text)) return field_error(at(field + ".content", i), what.substr(1));
    }
  }
  if (m.reasoning_content && has(*m.reasoning_content)) return field_error(field + ".reasoning_content", what.substr(1));
  return Status::Ok();
}

Result<ToolCall> map_tool_call(const Json& tc, const std::string& field) {
  if (!tc.is_object()) return field_error(field, "must be an object");
  ToolCall call;
  auto id = get_string(tc, "id", field, false);
  if (!id.ok()) return id.error();
  call.id = *id;
  if (!tc.contains("function") || !tc["function"].is_object()) return field_error(field + ".function", "is required");
  const Json& fn = tc["function"];
  auto name = get_string(fn, "name", field + ".function", true);
  if (!name.ok()) return name.error();
  call.name = *name;
  const std::string af = field + ".function.arguments";
  if (!fn.contains("arguments") || fn["arguments"].is_null()) {
    call.arguments = "{}";
  } else if (fn["arguments"].is_object()) {
    call.arguments = py_json_dumps(fn["arguments"]);
  } else if (fn["arguments"].is_string()) {
    call.arguments = fn["arguments"].get<std::string>();
    Json parsed = Json::parse(call.arguments, nullptr, false);
    if (!parsed.is_discarded() && parsed.is_string()) parsed = Json::parse(parsed.get<std::string>(), nullptr, false);
    if (parsed.is_discarded()) return field_error(af, "is not valid JSON: " + call.arguments.substr(0, 200));
    if (!parsed.is_object()) return field_error(af, "must encode a JSON object, got: " + call.arguments.substr(0, 200));
  } else {
    return field_error(af, "must be a JSON string (or object)");
  }
  if (fn.contains("namespace") && fn["namespace"].is_string()) call.ns = fn["namespace"].get<std::string>();
  return call;
}

// OpenAI's rule, which deepseek-recipe enforces too: the tool calls of an assistant message are
// answered by the tool messages right after it, each call exactly once.
class ToolAnswers {
 public:
  // A non-tool message (or the end) arrives: every pending call must have been answered.
  Status close() {
    answered_.clear();
    if (unanswered_.empty()) return Status::Ok();
    const auto& [id, index] = unanswered_.front();
    return field_error(at(assistant_ + ".tool_calls", index) + ".id",
                       "'" + id + "' has no tool message answering it (each call needs one right after the assistant message)");
  }
  Status open(const std::vector<ToolCall>& calls, const std::string& assistant) {
    assistant_ = assistant;
    for (size_t k = 0; k < calls.size(); ++k) {
      const std::string& id = calls[k].id;
      const std::string field = at(assistant + ".tool_calls", k) + ".id";
      if (id.empty()) return field_error(field, "is required (tool messages answer calls by id)");
      for (const auto& [seen, index] : unanswered_) {
        if (seen == id) return field_error(field, "'" + id + "' is used twice");
      }
      unanswered_.emplace_back(id, k);
    }
    return Status::Ok();
  }
  Status answer(const std::string& id, const std::string& field) {
    for (auto it = unanswered_.begin(); it != unanswered_.end(); ++it) {
      if (it->first == id) {
        unanswered_.erase(it);
        answered_.insert(id);
        return Status::Ok();
      }
    }
    if (answered_.count(id)) return field_error(field, "'" + id + "' is answered twice");
    return field_error(field, "'" + id + "' does not answer a tool call of the assistant message right before");
  }

 private:
  std::string assistant_;
  std::vector<std::pair<std::string, size_t>> unanswered_;  // id, index in tool_calls
  std::set<std::string> answered_;
};

bool mentions_json(const std::vector<Message>& msgs) {
  auto has = [](const std::string& s) {
    std::string low(s);
    std::transform(low.begin(), low.end(), low.begin(), [](unsigned char c) { return std::tolower(c); });
    return low.find("json") != std::string::npos;
  };
  for (const auto& m : msgs) {
    if (m.content && has(*m.content)) return true;
    if (m.blocks) for (const auto& b : *m.blocks) if (b.kind == Block::Kind::kText && has(b.text)) return true;
  }
  return false;
}

}  // namespace

Result<ReasoningEffort> map_reasoning_effort(const Json& value, Dialect dialect) {
  ReasoningEffort e;
  if (value.is_null()) return e;
  if (value.is_boolean() || value.is_number_float()) {
    return make_error("reasoning_effort: " + value.dump() + " is not valid (use a name or an integer 1..100)");
  }
  if (value.is_number_integer() || value.is_number_unsigned()) {
    const long long n = value.is_number_unsigned() ? static_cast<long long>(std::min<std::uint64_t>(value.get<std::uint64_t>(), 1000))
                                                   : value.get<long long>();
    if (!dialect_spec(dialect).numeric_effort) {
      return make_error("reasoning_effort: integer efforts need a V4.1 dialect (got " + std::to_string(n) + ")");
    }
    if (n < 1 || n > 100) return make_error("reasoning_effort: " + std::to_string(n) + " is outside 1..100");
    e.number = n;
    return e;
  }
  if (!value.is_string()) return make_error("reasoning_effort must be a string or an integer");
  const std::string s = value.get<std::string>();
  for (const auto& alias : effort_aliases(dialect)) {
    if (alias.request != s) continue;
    if (!alias.encoder.empty()) e.name = std::string(alias.encoder);
    return e;
  }
  return make_error("reasoning_effort: unknown value \"" + s + "\" (use minimal, low, medium, high, xhigh, max" +
                    std::string(dialect_spec(dialect).numeric_effort ? " or an integer 1..100)" : ")"));
}

Result<bool> resolve_thinking(const Json& body, bool default_thinking) {
  // thinking_budget: 0 disables whatever else is said.
  if (body.contains("thinking_budget") && body["thinking_budget"].is_number() && body["thinking_budget"].get<double>() == 0) {
    return false;
  }
  if (body.contains("thinking") && !body["thinking"].is_null()) {
    const Json& t = body["thinking"];
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string()) {
      return make_error("thinking: must be {\"type\": \"enabled\"|\"disabled\"}");
    }
    const std::string type = t["type"].get<std::string>();
    if (type == "enabled") return true;
    if (type == "disabled") return false;
    return make_error("thinking.type: must be \"enabled\" or \"disabled\", got \"" + type + "\"");
  }
  // The boolean switches (vLLM / SGLang spellings) have no precedence among themselves: they must agree.
  std::optional<bool> flag;
  std::string flag_field;
  auto take = [&](const Json& v, const std::string& field) -> Status {
    if (v.is_null()) return Status::Ok();
    if (!v.is_boolean()) return field_error(field, "must be a boolean");
    if (flag && *flag != v.get<bool>()) {
      return field_error(field, std::string(v.get<bool>() ? "true" : "false") + " contradicts " + flag_field + " (" +
                                    (*flag ? "true" : "false") + ")");
    }
    flag = v.get<bool>();
    flag_field = field;
    return Status::Ok();
  };
  if (body.contains("enable_thinking")) CEDAR_RETURN_IF_ERROR(take(body["enable_thinking"], "enable_thinking"));
  if (body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object()) {
    const Json& k = body["chat_template_kwargs"];
    for (const char* key : {"enable_thinking", "thinking"}) {
      if (k.contains(key)) CEDAR_RETURN_IF_ERROR(take(k[key], std::string("chat_template_kwargs.") + key));
    }
  }
  if (flag) return *flag;
  if (body.contains("reasoning_effort") && !body["reasoning_effort"].is_null()) {
    const Json& e = body["reasoning_effort"];
    if (e.is_string() && e.get<std::string>() == "none") return false;
    return true;  // any other effort asks for reasoning
  }
  return default_thinking;
}

Result<EncoderRequest> map_chat_request(const Json& body, const RequestPolicy& policy) {
  if (!body.is_object()) return make_error("request body must be a JSON object");
  const DialectSpec& spec = dialect_spec(policy.dialect);
  EncoderRequest req;
  req.options.dialect = policy.dialect;
  req.options.header_after_final_assistant = true;

  auto thinking = resolve_thinking(body, policy.default_thinking);
  if (!thinking.ok()) return thinking.error();
  req.options.thinking = *thinking;
  // The hosted API's default effort is "high"; for 0731 that is not the encoder's default ("low").
  if (policy.dialect == Dialect::kV4_0731) req.options.effort.name = "high";
  if (body.contains("reasoning_effort") && !body["reasoning_effort"].is_null()) {
    const Json& e = body["reasoning_effort"];
    if (!(e.is_string() && e.get<std::string>() == "none")) {
      auto effort = map_reasoning_effort(e, policy.dialect);
      if (!effort.ok()) return effort.error();
      req.options.effort = *effort;
    }
  }

  if (!body.contains("messages") || !body["messages"].is_array()) return make_error("messages: must be an array");
  const Json& msgs = body["messages"];
  if (msgs.empty()) return make_error("messages: must not be empty");
  ToolAnswers answers;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string f = at("messages", i);
    const Json& jm = msgs[i];
    if (!jm.is_object()) return field_error(f, "must be an object");
    auto role_s = get_string(jm, "role", f, true);
    if (!role_s.ok()) return role_s.error();
    Message m;
    const std::string& r = *role_s;
    if (r == "system") m.role = Role::kSystem;
    else if (r == "user") m.role = Role::kUser;
    else if (r == "assistant") m.role = Role::kAssistant;
    else if (r == "tool") m.role = Role::kTool;
    else if (r == "latest_reminder") m.role = Role::kLatestReminder;
    else if (r == "developer") {
      if (policy.developer == DeveloperPolicy::kReject) return field_error(f + ".role", "role 'developer' is not accepted");
      if (policy.developer == DeveloperPolicy::kAsUser) m.role = Role::kUser;
      else m.role = spec.developer_role ? Role::kDeveloper : Role::kSystem;
    } else {
      return field_error(f + ".role", "unknown role '" + r + "' (expected system, user, assistant, tool" +
                                          std::string(spec.developer_role ? ", developer" : "") + " or latest_reminder)");
    }
    if (m.role != Role::kTool) CEDAR_RETURN_IF_ERROR(answers.close());
    const bool keep_blocks = spec.image_blocks && (m.role == Role::kUser || m.role == Role::kSystem || m.role == Role::kTool);
    CEDAR_RETURN_IF_ERROR(map_content(jm, m, f, keep_blocks));
    if (spec.image_blocks) CEDAR_RETURN_IF_ERROR(reject_image_placeholder(m, f));
    if (m.role == Role::kDeveloper && m.content && m.content->empty()) return field_error(f + ".content", "must not be empty");

    if (m.role == Role::kAssistant) {
      for (const char* key : {"reasoning_content", "reasoning"}) {
        if (!jm.contains(key) || jm[key].is_null()) continue;
        if (!jm[key].is_string()) return field_error(f + "." + key, "must be a string");
        if (!m.reasoning_content) m.reasoning_content = jm[key].get<std::string>();
      }
      if (jm.contains("tool_calls") && !jm["tool_calls"].is_null()) {
        if (!jm["tool_calls"].is_array()) return field_error(f + ".tool_calls", "must be an array");
        for (size_t k = 0; k < jm["tool_calls"].size(); ++k) {
          auto call = map_tool_call(jm["tool_calls"][k], at(f + ".tool_calls", k));
          if (!call.ok()) return call.error();
          m.tool_calls.push_back(std::move(*call));
        }
        CEDAR_RETURN_IF_ERROR(answers.open(m.tool_calls, f));
      }
      if (spec.image_blocks && m.reasoning_content && m.reasoning_content->find(tok::kImage) != std::string::npos) {
        return field_error(f + (jm.contains("reasoning_content") ? ".reasoning_content" : ".reasoning"),
                           "contains the image placeholder " + std::string(tok::kImage));
      }
      const bool prefix = jm.contains("prefix") && jm["prefix"].is_boolean() && jm["prefix"].get<bool>();
      if (prefix) {
        if (i + 1 != msgs.size()) return field_error(f + ".prefix", "only the last message may be a prefix");
        m.wo_eos = true;
        req.prefix_continuation = true;
      }
      if (!m.content && m.tool_calls.empty() && !prefix) {
        return field_error(f, "an assistant message needs content or tool_calls");
      }
    }
    if (m.role == Role::kTool) {
      auto id = get_string(jm, "tool_call_id", f, true);
      if (!id.ok()) return id.error();
      CEDAR_RETURN_IF_ERROR(answers.answer(*id, f + ".tool_call_id"));
      m.tool_call_id = *id;
      if (!m.content && !m.blocks) m.content = "";
    }
    if (jm.contains("task") && jm["task"].is_string()) m.task = jm["task"].get<std::string>();
    if ((m.role == Role::kUser || m.role == Role::kLatestReminder) && !m.content && !m.blocks) m.content = "";
    req.messages.push_back(std::move(m));
  }
  CEDAR_RETURN_IF_ERROR(answers.close());

  // tool_choice and tools: tools go to the first system message (or a new empty one at index 0).
  Json tools = body.contains("tools") && !body["tools"].is_null() ? body["tools"] : Json::array();
  if (!tools.is_array()) return make_error("tools: must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string()) {
      return field_error(at("tools", i), "must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& tc = body["tool_choice"];
    if (tc.is_string()) {
      const std::string s = tc.get<std::string>();
      if (s == "auto") req.tool_choice = ToolChoice::kAuto;
      else if (s == "none") req.tool_choice = ToolChoice::kNone;
      else if (s == "required") req.tool_choice = ToolChoice::kRequired;
      else return make_error("tool_choice: unknown value \"" + s + "\" (auto, none, required or a function)");
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
               tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      req.tool_choice = ToolChoice::kNamed;
      req.forced_tool = tc["function"]["name"].get<std::string>();
    } else {
      return make_error("tool_choice: must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  }
  if (req.tool_choice == ToolChoice::kNone) tools = Json::array();
  if (req.starts_in_tool_calls()) {
    if (tools.empty()) return make_error("tool_choice: forces a tool call but no tools are given");
    if (req.options.thinking) {
      return make_error("tool_choice: forcing a tool call is not supported in thinking mode (set thinking.type to \"disabled\")");
    }
    if (req.tool_choice == ToolChoice::kNamed) {
      Json only = Json::array();
      for (const auto& t : tools) if (t["function"]["name"] == req.forced_tool) only.push_back(t);
      if (only.empty()) return make_error("tool_choice.function.name: no tool named '" + req.forced_tool + "'");
      tools = only;
    }
  }

  Json response_format;
  if (body.contains("response_format") && !body["response_format"].is_null()) {
    const Json& rf = body["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
      return make_error("response_format: must be {\"type\": \"text\"|\"json_object\"}");
    }
    const std::string type = rf["type"].get<std::string>();
    if (type == "json_object") {
      if (!mentions_json(req.messages)) {
        return make_error("response_format: json_object needs the word 'json' somewhere in the messages");
      }
      response_format = rf;
      req.json_mode = true;
    } else if (type != "text") {
      return make_error("response_format.type: \"" + type + "\" is not supported (text or json_object)");
    }
  }

  if (!tools.empty() || !response_format.is_null()) {
    auto sys = std::find_if(req.messages.begin(), req.messages.end(), [](const Message& m) { return m.role == Role::kSystem; });
    if (sys == req.messages.end()) {
      Message s;
      s.role = Role::kSystem;
      sys = req.messages.insert(req.messages.begin(), s);
    }
    if (!tools.empty()) sys->tools = tools;
    if (!response_format.is_null()) sys->response_format = response_format;
  }

  if (body.contains("stop") && !body["stop"].is_null()) {
    const Json& st = body["stop"];
    if (st.is_string()) {
      req.stop.push_back(st.get<std::string>());
    } else if (st.is_array()) {
      for (size_t i = 0; i < st.size(); ++i) {
        if (!st[i].is_string()) return field_error(at("stop", i), "must be a string");
        req.stop.push_back(st[i].get<std::string>());
      }
    } else {
      return make_error("stop: must be a string or an array of strings");
    }
    if (req.stop.size() > policy.max_stop_sequences) {
      return make_error("stop: at most " + std::to_string(policy.max_stop_sequences) + " sequences");
    }
    for (const auto& s : req.stop) if (s.empty()) return make_error("stop: sequences must not be empty");
  }
  return req;
}

Result<Prompt> encode_request(const EncoderRequest& request) {
  auto prompt = encode_messages(request.messages, request.options);
  if (!prompt.ok()) return prompt.error();
  if (request.starts_in_tool_calls()) {
    const auto& spec = dialect_spec(request.options.dialect);
    prompt->text("\n\n<");
    prompt->control(tok::kDsml);
    prompt->text(std::string(spec.calls_tag) + ">\n");
  }
  return prompt;
}

}  // namespace cedar::text
