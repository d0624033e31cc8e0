// `cedar parse`: parses a model completion (the text after the generation header) into the chat
// message a server would return (encoding.md §3).
#include <cstdio>
#include <iostream>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "text/output_parser.h"
#include "text/special_tokens.h"

namespace cedar::cli {
namespace {
using text::Json;

const CommandSpec kSpec{
    "parse",
    "Parse a completion read from stdin into an assistant message (JSON). A trailing end-of-sentence token\n"
    "means the model stopped; without it the output counts as cut by max_tokens.",
    {},
    {},
    {
        {"dialect", "prompt dialect: v4, v4-0731, v41-pre, v41, v41-1017", true, "v41", "NAME"},
        {"thinking", "the prompt ended with <think> (output starts in reasoning)", false, "", ""},
        {"forced-tool", "the prompt ended inside an opened tool-call block", false, "", ""},
        {"stop", "a stop sequence (answer content only)", true, "", "TEXT"},
        {"json-output", "JSON output mode (response_format json_object): keep the JSON, text around it -> spaces", false, "", ""},
        {"reference", "use the official strict parser instead of the streaming one", false, "", ""},
    },
};
}  // namespace

int cmd_parse(const Args& args) {
  auto parsed = parse_args(kSpec, args);
  if (!parsed.ok()) {
    if (parsed.error().message == "help") { std::printf("%s", usage(kSpec).c_str()); return 0; }
    std::fprintf(stderr, "cedar parse: %s\n", parsed.error().message.c_str());
    return 2;
  }
  const auto& a = *parsed;
  auto dialect = text::parse_dialect(a.get("dialect"));
  if (!dialect.ok()) { std::fprintf(stderr, "cedar parse: --dialect: %s\n", dialect.error().message.c_str()); return 2; }
  std::ostringstream ss;
  ss << std::cin.rdbuf();
  std::string completion = ss.str();

  text::ParsedCompletion result;
  if (a.flag("reference")) {
    auto r = text::parse_completion_reference(completion, *dialect, a.flag("thinking"));
    if (!r.ok()) { std::fprintf(stderr, "cedar parse: %s\n", r.error().message.c_str()); return 1; }
    result = *r;
  } else {
    text::StopCause cause = text::StopCause::kLength;
    const std::string_view eos = text::tok::kEos;
    if (completion.size() >= eos.size() && completion.compare(completion.size() - eos.size(), eos.size(), eos) == 0) {
      completion.resize(completion.size() - eos.size());
      cause = text::StopCause::kEos;
    }
    text::ParserOptions opt;
    opt.dialect = *dialect;
    opt.start = a.flag("forced-tool") ? text::ParseStart::kToolCalls
                : a.flag("thinking")  ? text::ParseStart::kReasoning
                                      : text::ParseStart::kContent;
    if (a.has("stop")) opt.stop.push_back(a.get("stop"));
    opt.json_output = a.flag("json-output");
    result = text::parse_completion(completion, opt, cause);
  }
  Json msg = Json::object();
  msg["role"] = "assistant";
  msg["content"] = result.content;
  if (result.has_reasoning) msg["reasoning_content"] = result.reasoning;
  Json calls = Json::array();
  for (const auto& c : result.tool_calls) {
    Json fn = Json::object({{"name", c.name}, {"arguments", c.arguments}});
    if (!c.ns.empty()) fn["namespace"] = c.ns;
    calls.push_back(Json::object({{"type", "function"}, {"function", fn}}));
  }
  msg["tool_calls"] = calls;
  msg["finish_reason"] = std::string(text::finish_reason_name(result.finish));
  const std::string out = msg.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace cedar::cli
