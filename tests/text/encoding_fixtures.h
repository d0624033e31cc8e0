// Test helpers for the published encoding fixtures in tests/data/encoding (see its README).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "text/chat.h"
#include "text/dialect.h"
#include "text/py_json.h"

namespace cedar::text::fixtures {

inline std::string read_data_file(const std::string& relative) {
  std::ifstream f(std::string(CEDAR_TEST_DATA_DIR) + "/encoding/" + relative, std::ios::binary);
  EXPECT_TRUE(f.good()) << "missing fixture " << relative;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline Json load_json(const std::string& relative) {
  auto j = parse_json(read_data_file(relative), relative);  // keeps int/float and key order
  EXPECT_TRUE(j.ok()) << relative << ": " << j.error().message;
  return j.ok() ? *j : Json();
}

// One message dict in the official encoder's own input format (encode_messages(messages, ...):
// tools / response_format on the message, ids optional) -> cedar's encoder input. String content only.
inline Message official_message(const Json& m) {
  Message out;
  const std::string role = m.at("role").get<std::string>();
  if (role == "system") out.role = Role::kSystem;
  else if (role == "developer") out.role = Role::kDeveloper;
  else if (role == "user") out.role = Role::kUser;
  else if (role == "assistant") out.role = Role::kAssistant;
  else if (role == "tool") out.role = Role::kTool;
  else if (role == "latest_reminder") out.role = Role::kLatestReminder;
  else ADD_FAILURE() << "unknown role " << role;
  if (m.contains("content") && m["content"].is_string()) out.content = m["content"].get<std::string>();
  if (m.contains("reasoning_content") && m["reasoning_content"].is_string()) {
    out.reasoning_content = m["reasoning_content"].get<std::string>();
  }
  if (m.contains("tool_calls")) {
    for (const auto& c : m["tool_calls"]) {
      ToolCall call;
      call.id = c.value("id", "");
      call.name = c.at("function").at("name").get<std::string>();
      call.arguments = c.at("function").at("arguments").get<std::string>();
      out.tool_calls.push_back(call);
    }
  }
  out.tool_call_id = m.value("tool_call_id", "");
  if (m.contains("tools")) out.tools = m["tools"];
  if (m.contains("response_format")) out.response_format = m["response_format"];
  if (m.contains("task")) out.task = m["task"].get<std::string>();
  return out;
}

}  // namespace cedar::text::fixtures
