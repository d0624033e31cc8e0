// The published encoder fixtures in the official encoder's own message format (official_cases.json,
// official_v4/*): official V4 fixtures 3 and 4, official V4 encoder runs, official V4.1 unit-test
// literals. Every expected prompt was produced by DeepSeek's Python encoder (sources in the README).
#include <gtest/gtest.h>

#include "encoding_fixtures.h"
#include "text/encoder.h"
#include "text/request_mapping.h"

namespace cedar::text {
namespace {

using fixtures::load_json;
using fixtures::official_message;
using fixtures::read_data_file;

TEST(OfficialFixtures, EveryCaseIsByteIdentical) {
  const Json cases = load_json("official_cases.json");
  ASSERT_GE(cases.size(), 28u);
  size_t rendered = 0, rejected = 0;
  for (const auto& c : cases) {
    const std::string source = c["source"].get<std::string>();
    const Json messages = c.contains("messages_file") ? load_json(c["messages_file"].get<std::string>()) : c["messages"];
    std::vector<Message> msgs;
    for (const auto& m : messages) msgs.push_back(official_message(m));
    EncodeOptions o;
    o.dialect = *parse_dialect(c["dialect"].get<std::string>());
    o.thinking = c["thinking"].get<bool>();
    o.context_messages = c.value("context_messages", size_t{0});
    bool bad_effort_type = false;
    if (c.contains("reasoning_effort")) {
      const Json& e = c["reasoning_effort"];
      if (e.is_string()) o.effort.name = e.get<std::string>();
      else if (e.is_number_integer()) o.effort.number = e.get<long long>();
      else bad_effort_type = true;  // bool / float: the official `type(x) is int` check rejects them
      if (bad_effort_type) {        // not representable in EncodeOptions; the request mapping must refuse it
        auto mapped = map_reasoning_effort(e, o.dialect);
        EXPECT_FALSE(mapped.ok()) << source;
      }
    }
    if (c.contains("expected_error")) {
      if (!bad_effort_type) {
        auto p = encode_messages(msgs, o);
        ASSERT_FALSE(p.ok()) << source << " was accepted";
        EXPECT_NE(p.error().message.find(c["expected_error"].get<std::string>()), std::string::npos)
            << source << ": " << p.error().message;
      }
      ++rejected;
      continue;
    }
    auto p = encode_messages(msgs, o);
    ASSERT_TRUE(p.ok()) << source << ": " << p.error().message;
    const std::string expected =
        c.contains("expected_file") ? read_data_file(c["expected_file"].get<std::string>()) : c["expected"].get<std::string>();
    EXPECT_EQ(p->str(), expected) << source;
    ++rendered;
  }
  EXPECT_EQ(rendered + rejected, cases.size());
  EXPECT_GE(rejected, 7u);
}

}  // namespace
}  // namespace cedar::text
