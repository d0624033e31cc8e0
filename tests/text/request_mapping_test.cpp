// Request mapping rejects invalid Chat Completions requests with an error that names the field
// (issue: unknown role, bad effort per dialect, literal image placeholder, malformed tool arguments,
// contradictory thinking switches). Expected values come from the official encoder's rules
// (encoding.md §2.1, §2.4) and the RTP-RECIPE fixtures (§5 #8), not from cedar.
#include <gtest/gtest.h>

#include "text/request_mapping.h"

namespace cedar::text {
namespace {

Json user(const std::string& text) { return Json::object({{"role", "user"}, {"content", text}}); }

// Maps `body` with `dialect`; returns the error message ("" when it was accepted).
std::string error_of(const Json& body, Dialect dialect = Dialect::kV41) {
  RequestPolicy policy;
  policy.dialect = dialect;
  auto r = map_chat_request(body, policy);
  return r.ok() ? "" : r.error().message;
}

void expect_names(const Json& body, const std::string& field, Dialect dialect = Dialect::kV41) {
  const std::string e = error_of(body, dialect);
  ASSERT_FALSE(e.empty()) << body.dump() << " was accepted";
  EXPECT_EQ(e.rfind(field, 0), 0u) << "error '" << e << "' does not start with the field " << field;
}

TEST(RequestMappingErrors, UnknownRoleNamesTheMessage) {
  Json body = {{"messages", Json::array({user("a"), Json::object({{"role", "robot"}, {"content", "x"}})})}};
  expect_names(body, "messages[1].role");
  EXPECT_NE(error_of(body).find("robot"), std::string::npos);
  body["messages"][1]["role"] = 7;
  expect_names(body, "messages[1].role");
  body["messages"][1].erase("role");
  expect_names(body, "messages[1].role");
}

TEST(RequestMappingErrors, DeveloperRoleCanBeRejected) {
  RequestPolicy policy;
  policy.developer = DeveloperPolicy::kReject;  // the released V4.1 encoder: "Unknown role"
  auto r = map_chat_request({{"messages", Json::array({Json::object({{"role", "developer"}, {"content", "d"}}), user("u")})}}, policy);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.rfind("messages[0].role", 0), 0u) << r.error().message;
}

TEST(RequestMappingErrors, BadEffortValuesPerDialect) {
  auto body = [](Json effort) { return Json{{"reasoning_effort", effort}, {"messages", Json::array({user("q")})}}; };
  // V4.1 (RTP-RECIPE test_effort_recipe_table_and_exact_integer_extension; official invalid efforts).
  for (const Json& bad : {Json(0), Json(101), Json(-1), Json(1.5), Json(1.0), Json(true), Json(false), Json("HIGH"),
                          Json("75"), Json("1"), Json::array(), Json::object()}) {
    expect_names(body(bad), "reasoning_effort", Dialect::kV41);
    expect_names(body(bad), "reasoning_effort", Dialect::kV41_1017);
  }
  for (const Json& good : {Json(1), Json(100), Json(37), Json("low"), Json("medium"), Json("high"), Json("xhigh"),
                           Json("max"), Json("minimal"), Json("none")}) {
    EXPECT_EQ(error_of(body(good), Dialect::kV41), "") << good.dump();
  }
  // V4 / V4-0731 have no numeric budget (encoding.md §2.4).
  for (Dialect d : {Dialect::kV4, Dialect::kV4_0731}) {
    for (const Json& bad : {Json(50), Json(1), Json("bogus"), Json(true)}) expect_names(body(bad), "reasoning_effort", d);
    EXPECT_EQ(error_of(body(Json("max")), d), "");
  }
  // The pre-release V4.1 table has xhigh (= 75) but still rejects 0 / 101.
  EXPECT_EQ(error_of(body(Json("xhigh")), Dialect::kV41Pre), "");
  expect_names(body(Json(101)), "reasoning_effort", Dialect::kV41Pre);
}

TEST(RequestMappingErrors, LiteralImagePlaceholderInText) {
  const std::string ph = "<｜deepseek_image｜>";
  expect_names({{"messages", Json::array({user("look " + ph)})}}, "messages[0].content");
  Json parts = Json::array({Json::object({{"type", "text"}, {"text", "ok"}}),
                            Json::object({{"type", "text"}, {"text", ph}})});
  expect_names({{"messages", Json::array({Json::object({{"role", "user"}, {"content", parts}})})}}, "messages[0].content[1]");
  expect_names({{"messages", Json::array({Json::object({{"role", "system"}, {"content", ph}}), user("u")})}},
               "messages[0].content");
  Json assistant = {{"role", "assistant"}, {"content", "a"}, {"reasoning_content", "r " + ph}};
  expect_names({{"messages", Json::array({user("u"), assistant, user("v")})}}, "messages[1].reasoning_content");
  // The field index is the request's, even when request-level tools insert a system message first.
  Json tools = Json::array({Json::object({{"type", "function"}, {"function", {{"name", "f"}}}})});
  expect_names({{"tools", tools}, {"messages", Json::array({user("u"), user(ph)})}}, "messages[1].content");
  // The image part itself is fine.
  Json img = Json::array({Json::object({{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,AA"}}}})});
  EXPECT_EQ(error_of({{"messages", Json::array({Json::object({{"role", "user"}, {"content", img}})})}}), "");
}

TEST(RequestMappingErrors, MalformedToolArguments) {
  auto body = [](Json arguments) {
    Json call = {{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", arguments}}}};
    return Json{{"messages", Json::array({user("u"),
                                          Json::object({{"role", "assistant"}, {"content", ""}, {"tool_calls", Json::array({call})}}),
                                          Json::object({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "r"}})})}};
  };
  for (const Json& bad : {Json("{not json"), Json("[1, 2]"), Json("\"text\""), Json("42"), Json(42), Json::array()}) {
    expect_names(body(bad), "messages[1].tool_calls[0].function.arguments");
  }
  EXPECT_EQ(error_of(body(Json("{\"a\": 1}"))), "");
  EXPECT_EQ(error_of(body(Json("\"{\\\"a\\\": 1}\""))), "");  // double-encoded: V4.1 parses twice
  Json no_name = body(Json("{}"));
  no_name["messages"][1]["tool_calls"][0]["function"].erase("name");
  expect_names(no_name, "messages[1].tool_calls[0].function.name");
  // A tool result must answer an earlier call (RTP-RECIPE: orphan tool message); each call is answered
  // right after its assistant message, exactly once (OpenAI's rule, deepseek-recipe enforces it).
  expect_names({{"messages", Json::array({Json::object({{"role", "tool"}, {"tool_call_id", "x"}, {"content", "r"}})})}},
               "messages[0].tool_call_id");
  Json unanswered = body(Json("{}"));
  unanswered["messages"][2] = user("next");
  expect_names(unanswered, "messages[1].tool_calls[0].id");
  Json twice = body(Json("{}"));
  twice["messages"].push_back(twice["messages"][2]);
  expect_names(twice, "messages[3].tool_call_id");
  Json no_id = body(Json("{}"));
  no_id["messages"][1]["tool_calls"][0].erase("id");
  expect_names(no_id, "messages[1].tool_calls[0].id");
}

TEST(RequestMappingErrors, ContradictoryThinkingSwitches) {
  Json msgs = Json::array({user("u")});
  expect_names({{"messages", msgs}, {"enable_thinking", true}, {"chat_template_kwargs", {{"enable_thinking", false}}}},
               "chat_template_kwargs.enable_thinking");
  expect_names({{"messages", msgs}, {"chat_template_kwargs", {{"enable_thinking", true}, {"thinking", false}}}},
               "chat_template_kwargs.thinking");
  expect_names({{"messages", msgs}, {"enable_thinking", "yes"}}, "enable_thinking");
  expect_names({{"messages", msgs}, {"thinking", {{"type", "sometimes"}}}}, "thinking.type");
  // Agreeing switches are fine; thinking.type outranks them (RTP-RECIPE test_thinking_priority).
  EXPECT_EQ(error_of({{"messages", msgs}, {"enable_thinking", true}, {"chat_template_kwargs", {{"thinking", true}}}}), "");
  auto on = resolve_thinking({{"enable_thinking", false}, {"thinking", {{"type", "enabled"}}}}, false);
  ASSERT_TRUE(on.ok());
  EXPECT_TRUE(*on);
  // Forcing a tool call while thinking is contradictory too (RTP-RECIPE test_forced_tools_and_thinking_rejection).
  Json tools = Json::array({Json::object({{"type", "function"}, {"function", {{"name", "f"}}}})});
  expect_names({{"messages", msgs}, {"tools", tools}, {"tool_choice", "required"}, {"thinking", {{"type", "enabled"}}}},
               "tool_choice");
}

// RTP-RECIPE test_thinking_priority: (request, server default) -> thinking on/off.
TEST(RequestMapping, ThinkingPrecedenceFixture) {
  struct Case { Json body; bool dflt; bool expected; };
  const Case cases[] = {
      {Json::object(), false, false},
      {Json::object(), true, true},
      {{{"reasoning_effort", "none"}}, true, false},
      {{{"reasoning_effort", "low"}}, false, true},
      {{{"reasoning_effort", 37}}, false, true},
      {{{"reasoning_effort", "none"}, {"thinking", {{"type", "enabled"}}}}, false, true},
      {{{"reasoning_effort", "max"}, {"thinking", {{"type", "disabled"}}}}, true, false},
      {{{"enable_thinking", false}, {"thinking", {{"type", "enabled"}}}}, false, true},
      {{{"enable_thinking", true}, {"reasoning_effort", "none"}}, false, true},
      {{{"thinking_budget", 0}, {"thinking", {{"type", "enabled"}}}}, true, false},
  };
  for (const Case& c : cases) {
    auto r = resolve_thinking(c.body, c.dflt);
    ASSERT_TRUE(r.ok()) << c.body.dump();
    EXPECT_EQ(*r, c.expected) << c.body.dump();
  }
}

}  // namespace
}  // namespace cedar::text
