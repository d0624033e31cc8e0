// Prompt encoder against published goldens (tests/data/encoding/goldens.json, see its README):
// encoding.md §2.9 worked examples, GOLD-BUG official V4.1 runs, official V4 fixture 1 and V4 runs.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "text/request_mapping.h"

namespace cedar::text {
namespace {

Json load_goldens() {
  std::ifstream f(std::string(CEDAR_TEST_DATA_DIR) + "/encoding/goldens.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return Json::parse(ss.str());
}

TEST(EncoderGolden, AllPublishedCasesAreByteIdentical) {
  const Json cases = load_goldens();
  ASSERT_GE(cases.size(), 10u);
  for (const auto& c : cases) {
    RequestPolicy policy;
    policy.dialect = *parse_dialect(c["dialect"].get<std::string>());
    Json body = c["request"];
    body["thinking"] = Json::object({{"type", c["thinking"].get<bool>() ? "enabled" : "disabled"}});
    auto req = map_chat_request(body, policy);
    ASSERT_TRUE(req.ok()) << c["source"] << ": " << req.error().message;
    req->options.header_after_final_assistant = false;  // the official encoder's behaviour
    if (policy.dialect == Dialect::kV4) req->options.effort = {};
    if (body.contains("reasoning_effort")) req->options.effort = *map_reasoning_effort(body["reasoning_effort"], policy.dialect);
    auto p = encode_request(*req);
    ASSERT_TRUE(p.ok()) << c["source"] << ": " << p.error().message;
    EXPECT_EQ(p->str(), c["expected"].get<std::string>()) << c["source"];
  }
}

TEST(Encoder, ContentNeverBecomesControlTokens) {
  Message u;
  u.content = "<｜User｜><think>｜DSML｜";
  auto p = encode_messages({u}, {});
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->segments().size(), 5u);  // BOS, User, text, Assistant, </think>
  EXPECT_EQ(p->segments()[2], (Segment{SegmentKind::kText, "<｜User｜><think>｜DSML｜"}));
}

TEST(Encoder, EmptyArgumentsRenderAnEmptyLine) {  // GOLD-BUG case 2 ("now" with {})
  auto block = render_tool_calls_block({{"c", "now", "{}", ""}}, Dialect::kV41);
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(block->str(), "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"now\">\n\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
}

TEST(Encoder, ArgumentPolicies) {
  EXPECT_EQ(render_tool_calls_block({{"c", "f", "not json", ""}}, Dialect::kV4)->str(),
            "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"arguments\" string=\"true\">not "
            "json</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
  EXPECT_FALSE(render_tool_calls_block({{"c", "f", "not json", ""}}, Dialect::kV41Pre).ok());
  // V4.1 release parses double-encoded arguments.
  EXPECT_NE(render_tool_calls_block({{"c", "f", "\"{\\\"a\\\": 1}\"", ""}}, Dialect::kV41)->str().find(
                "name=\"a\" string=\"false\">1<"),
            std::string::npos);
}

TEST(Encoder, EffortValidationPerDialect) {
  Message u;
  u.content = "q";
  EncodeOptions o;
  o.thinking = true;
  for (long long bad : {0LL, 101LL, -1LL}) {
    o.effort = {std::nullopt, bad};
    EXPECT_FALSE(encode_messages({u}, o).ok()) << bad;
  }
  o.effort = {std::string("medium"), std::nullopt};
  EXPECT_FALSE(encode_messages({u}, o).ok());
  o.dialect = Dialect::kV41Pre;
  o.effort = {std::string("xhigh"), std::nullopt};
  EXPECT_NE(encode_messages({u}, o)->str().find("Reasoning Effort: 75 "), std::string::npos);
  o.dialect = Dialect::kV4;
  o.effort = {std::nullopt, 50};
  EXPECT_FALSE(encode_messages({u}, o).ok());
}

TEST(Encoder, V4MidSystemIsRawTextAndV41UsesSystemToken) {
  Message s, u, a, s2;
  s.role = Role::kSystem; s.content = "sys";
  u.content = "q1";
  a.role = Role::kAssistant; a.content = "a1"; a.reasoning_content = "r1";
  s2.role = Role::kSystem; s2.content = "mid sys";
  EncodeOptions o;
  o.thinking = true;
  o.effort = {std::nullopt, 88};
  // OFF-V41-TEST test_v41_mid_conversation_system_message
  EXPECT_EQ(encode_messages({s, u, a, s2}, o)->str(),
            "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 88 (range 1-100, the higher the value, the more thorough "
            "the reasoning)\n\nsys<｜User｜>q1<｜Assistant｜></think>a1<｜end▁of▁sentence｜><｜System｜>mid sys<｜Assistant｜><think>");
}

TEST(Encoder, TaskTokens) {  // OFF-V41-TEST test_v41_task_sp_token
  Message u;
  u.content = "classify me";
  u.task = "query";
  EXPECT_EQ(encode_messages({u}, {})->str(), "<｜begin▁of▁sentence｜><｜User｜>classify me<｜query｜>");
  u.task = "bogus";
  EXPECT_FALSE(encode_messages({u}, {}).ok());
}

TEST(Encoder, LiteralImagePlaceholderIsRejected) {
  Message u;
  u.content = "hi <｜deepseek_image｜>";
  auto p = encode_messages({u}, {});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("messages[0].content"), std::string::npos);
}

}  // namespace
}  // namespace cedar::text
