#include "server/anthropic.h"

namespace cedar::server {

using text::Json;

namespace {

Error field_error(const std::string& field, const std::string& what) { return make_error(field + ": " + what); }

// A string or a list of {"type":"text","text"} blocks, as text.
Result<std::string> text_of(const Json& v, const std::string& field) {
  if (v.is_null()) return std::string();
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) return field_error(field, "must be a string or an array of content blocks");
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& b = v[i];
    const std::string f = field + "[" + std::to_string(i) + "]";
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) return field_error(f, "must be a content block");
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) return field_error(f + ".text", "must be a string");
      out += b["text"].get<std::string>();
    } else if (type == "tool_addition" || type == "tool_removal") {
      continue;  // deferred-tool bookkeeping: every declared tool is always available here
    } else {
      return field_error(f + ".type", "'" + type + "' is not supported here (text only)");
    }
  }
  return out;
}

}  // namespace

Result<Json> messages_to_chat_request(const Json& body) {
  if (!body.is_object()) return make_error("request body: must be a JSON object");
  Json chat = Json::object();
  for (const char* key : {"model", "temperature", "top_p", "top_k", "stream", "max_tokens", "thinking", "seed"})
    if (body.contains(key)) chat[key] = body[key];
  if (!body.contains("max_tokens")) return make_error("max_tokens: is required");
  if (body.contains("stop_sequences")) chat["stop"] = body["stop_sequences"];
  if (body.contains("output_config") && body["output_config"].is_object() && body["output_config"].contains("effort"))
    chat["reasoning_effort"] = body["output_config"]["effort"];
  if (body.contains("thinking") && body["thinking"].is_object() && body["thinking"].contains("type") &&
      body["thinking"]["type"] == "adaptive")
    chat["thinking"] = Json{{"type", "enabled"}};
  Json messages = Json::array();
  if (body.contains("system")) {
    CEDAR_ASSIGN_OR_RETURN(auto sys, text_of(body["system"], "system"));
    if (!sys.empty()) messages.push_back(Json{{"role", "system"}, {"content", sys}});
  }
  if (!body.contains("messages") || !body["messages"].is_array()) return make_error("messages: must be an array");
  const Json& msgs = body["messages"];
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Json& m = msgs[i];
    const std::string f = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) return field_error(f + ".role", "is required");
    const std::string role = m["role"].get<std::string>();
    const Json content = m.contains("content") ? m["content"] : Json();
    if (role == "system") {
      CEDAR_ASSIGN_OR_RETURN(auto t, text_of(content, f + ".content"));
      messages.push_back(Json{{"role", "system"}, {"content", t}});
    } else if (role == "user") {
      if (content.is_string()) {
        messages.push_back(Json{{"role", "user"}, {"content", content}});
        continue;
      }
      if (!content.is_array()) return field_error(f + ".content", "must be a string or an array of content blocks");
      std::string text;
      bool has_text = false;
      for (size_t k = 0; k < content.size(); ++k) {
        const Json& b = content[k];
        const std::string bf = f + ".content[" + std::to_string(k) + "]";
        if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) return field_error(bf, "must be a content block");
        const std::string type = b["type"].get<std::string>();
        if (type == "tool_result") {
          if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
            return field_error(bf + ".tool_use_id", "must be a string");
          CEDAR_ASSIGN_OR_RETURN(auto out, text_of(b.contains("content") ? b["content"] : Json(""), bf + ".content"));
          messages.push_back(Json{{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", out}});
        } else if (type == "text") {
          if (!b.contains("text") || !b["text"].is_string()) return field_error(bf + ".text", "must be a string");
          text += (has_text ? "\n\n" : "") + b["text"].get<std::string>();
          has_text = true;
        } else {
          return field_error(bf + ".type", "'" + type + "' is not supported (text and tool_result)");
        }
      }
      if (has_text) messages.push_back(Json{{"role", "user"}, {"content", text}});
    } else if (role == "assistant") {
      Json am = Json{{"role", "assistant"}, {"content", ""}};
      if (content.is_string()) {
        am["content"] = content;
      } else if (content.is_array()) {
        std::string text, thinking;
        bool has_thinking = false;
        Json calls = Json::array();
        for (size_t k = 0; k < content.size(); ++k) {
          const Json& b = content[k];
          const std::string bf = f + ".content[" + std::to_string(k) + "]";
          if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) return field_error(bf, "must be a content block");
          const std::string type = b["type"].get<std::string>();
          if (type == "text" && b.contains("text") && b["text"].is_string()) {
            text += b["text"].get<std::string>();
          } else if (type == "thinking" && b.contains("thinking") && b["thinking"].is_string()) {
            thinking += b["thinking"].get<std::string>();
            has_thinking = true;
          } else if (type == "tool_use") {
            if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") || !b["name"].is_string())
              return field_error(bf, "tool_use needs string id and name");
            const Json input = b.contains("input") ? b["input"] : Json::object();
            calls.push_back(Json{{"id", b["id"]}, {"type", "function"},
                                 {"function", Json{{"name", b["name"]}, {"arguments", text::py_json_dumps(input)}}}});
          } else if (type != "redacted_thinking") {
            return field_error(bf + ".type", "'" + type + "' is not supported (text, thinking, tool_use)");
          }
        }
        am["content"] = text;
        if (has_thinking) am["reasoning_content"] = thinking;
        if (!calls.empty()) am["tool_calls"] = calls;
      } else {
        return field_error(f + ".content", "must be a string or an array of content blocks");
      }
      messages.push_back(std::move(am));
    } else {
      return field_error(f + ".role", "unknown role '" + role + "' (user, assistant, system)");
    }
  }
  chat["messages"] = std::move(messages);
  if (body.contains("tools")) {
    if (!body["tools"].is_array()) return make_error("tools: must be an array");
    Json tools = Json::array();
    for (size_t i = 0; i < body["tools"].size(); ++i) {
      const Json& t = body["tools"][i];
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
        return field_error("tools[" + std::to_string(i) + "].name", "must be a string");
      Json fn = Json{{"name", t["name"]}};
      if (t.contains("description")) fn["description"] = t["description"];
      fn["parameters"] = t.contains("input_schema") ? t["input_schema"] : Json{{"type", "object"}};
      tools.push_back(Json{{"type", "function"}, {"function", fn}});
    }
    chat["tools"] = std::move(tools);
  }
  return chat;
}

std::string anthropic_stop_reason(std::string_view f) {
  if (f == "length") return "max_tokens";
  if (f == "tool_calls") return "tool_use";
  return "end_turn";
}

Json anthropic_usage(const Usage& u) {
  Json j = Json::object();
  j["input_tokens"] = u.prompt_tokens - u.cached_tokens;
  j["output_tokens"] = u.completion_tokens;
  j["cache_read_input_tokens"] = u.cached_tokens;
  j["cache_creation_input_tokens"] = 0;
  return j;
}

MessagesAssembler::MessagesAssembler(ChatAssembler chat, std::string message_id)
    : chat_(std::move(chat)), id_(std::move(message_id)) {
  model_ = chat_.first_chunk()["model"].get<std::string>();
}

std::string MessagesAssembler::sse(const Json& event) {
  return "event: " + event["type"].get<std::string>() + "\n" + sse_data(event);
}

Json MessagesAssembler::first_chunk() const {
  Json msg = Json::object();
  msg["id"] = id_;
  msg["type"] = "message";
  msg["role"] = "assistant";
  msg["model"] = model_;
  msg["content"] = Json::array();
  msg["stop_reason"] = nullptr;
  msg["stop_sequence"] = nullptr;
  msg["usage"] = anthropic_usage(chat_.usage());
  return Json{{"type", "message_start"}, {"message", msg}};
}

void MessagesAssembler::close_block(std::vector<Json>& out) {
  if (block_ < 0) return;
  out.push_back(Json{{"type", "content_block_stop"}, {"index", block_}});
  block_ = -1;
  block_type_.clear();
}

void MessagesAssembler::translate(const Json& chunk, std::vector<Json>& out) {
  if (!chunk.contains("choices") || chunk["choices"].empty()) return;
  const Json& choice = chunk["choices"][0];
  const Json& d = choice["delta"];
  auto open = [&](const std::string& type, Json block) {
    if (block_type_ == type && type != "tool_use") return;
    close_block(out);
    block_ = next_block_++;
    block_type_ = type;
    out.push_back(Json{{"type", "content_block_start"}, {"index", block_}, {"content_block", std::move(block)}});
  };
  if (d.contains("reasoning_content") && !d["reasoning_content"].get<std::string>().empty()) {
    open("thinking", Json{{"type", "thinking"}, {"thinking", ""}});
    out.push_back(Json{{"type", "content_block_delta"}, {"index", block_},
                       {"delta", Json{{"type", "thinking_delta"}, {"thinking", d["reasoning_content"]}}}});
  }
  if (d.contains("content") && d["content"].is_string() && !d["content"].get<std::string>().empty()) {
    open("text", Json{{"type", "text"}, {"text", ""}});
    out.push_back(Json{{"type", "content_block_delta"}, {"index", block_},
                       {"delta", Json{{"type", "text_delta"}, {"text", d["content"]}}}});
  }
  if (d.contains("tool_calls")) {
    for (const auto& tc : d["tool_calls"]) {
      if (tc.contains("id")) {
        open("tool_use", Json{{"type", "tool_use"}, {"id", tc["id"]}, {"name", tc["function"]["name"]},
                              {"input", Json::object()}});
      }
      const std::string args = tc["function"].value("arguments", std::string());
      if (!args.empty() && block_type_ == "tool_use")
        out.push_back(Json{{"type", "content_block_delta"}, {"index", block_},
                           {"delta", Json{{"type", "input_json_delta"}, {"partial_json", args}}}});
    }
  }
  if (!choice["finish_reason"].is_null()) {
    close_block(out);
    Json delta = Json{{"stop_reason", anthropic_stop_reason(choice["finish_reason"].get<std::string>())},
                      {"stop_sequence", nullptr}};
    out.push_back(Json{{"type", "message_delta"}, {"delta", delta}, {"usage", anthropic_usage(chat_.usage())}});
    out.push_back(Json{{"type", "message_stop"}});
  }
}

Status MessagesAssembler::on_event(const BackendEvent& event, std::vector<Json>& events) {
  std::vector<Json> chunks;
  CEDAR_RETURN_IF_ERROR(chat_.on_event(event, chunks));
  for (const auto& c : chunks) translate(c, events);
  return Status::Ok();
}

Json MessagesAssembler::response() const {
  const Json r = chat_.response();
  const Json& msg = r["choices"][0]["message"];
  Json content = Json::array();
  if (msg.contains("reasoning_content") && !msg["reasoning_content"].get<std::string>().empty())
    content.push_back(Json{{"type", "thinking"}, {"thinking", msg["reasoning_content"]}, {"signature", ""}});
  if (msg["content"].is_string() && !msg["content"].get<std::string>().empty())
    content.push_back(Json{{"type", "text"}, {"text", msg["content"]}});
  if (msg.contains("tool_calls")) {
    for (const auto& tc : msg["tool_calls"]) {
      Json input = Json::parse(tc["function"]["arguments"].get<std::string>(), nullptr, false);
      if (input.is_discarded() || !input.is_object()) input = Json::object();
      content.push_back(Json{{"type", "tool_use"}, {"id", tc["id"]}, {"name", tc["function"]["name"]}, {"input", input}});
    }
  }
  Json out = Json::object();
  out["id"] = id_;
  out["type"] = "message";
  out["role"] = "assistant";
  out["model"] = model_;
  out["content"] = std::move(content);
  out["stop_reason"] = anthropic_stop_reason(r["choices"][0]["finish_reason"].get<std::string>());
  out["stop_sequence"] = nullptr;
  out["usage"] = anthropic_usage(chat_.usage());
  return out;
}

}  // namespace cedar::server
