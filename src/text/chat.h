// Encoder input: a conversation in the shape of the official encoder's message dicts (OpenAI-like),
// already validated by the request mapping (request_mapping.h) or built directly by callers/tests.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "text/py_json.h"

namespace cedar::text {

enum class Role { kSystem, kDeveloper, kUser, kAssistant, kTool, kLatestReminder };
std::string_view role_name(Role role);

// One element of a list-valued `content` (or of a tool result's list content).
struct Block {
  enum class Kind { kText, kImage, kToolResult, kOther };
  Kind kind = Kind::kText;
  std::string text;         // kText: the text; kOther: the block's `type` (rendered "[Unsupported T]")
  Json image;               // kImage: the image source record ({"type":"image","url":...})
  std::string tool_use_id;  // kToolResult
  // kToolResult content: a string, or (when content_is_list) the list items.
  std::string result_text;
  bool result_is_list = false;
  std::vector<Block> result_items;
  bool is_placeholder = false;  // kText that stands for an image (renders as the image token)
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // the JSON text as the client sent it (re-parsed by the encoder)
  std::string ns;         // V4.1-1017 tool namespace ("" = none)
};

struct Message {
  Role role = Role::kUser;
  std::optional<std::string> content;      // nullopt: JSON null / absent
  std::optional<std::vector<Block>> blocks;  // list-valued content
  std::optional<std::string> reasoning_content;
  std::vector<ToolCall> tool_calls;
  std::string tool_call_id;       // role tool
  Json tools = Json::array();     // OpenAI tool objects {"type":"function","function":{...}}
  Json response_format;           // null: none
  std::optional<std::string> task;
  bool wo_eos = false;            // prefix continuation: no EOS after this assistant message
};

}  // namespace cedar::text
