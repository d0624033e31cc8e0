// `cedar encode`: renders a Chat Completions request into the model prompt (encoding.md §2).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "text/prompt_tokens.h"
#include "text/request_mapping.h"

namespace cedar::cli {
namespace {
using text::Json;

const CommandSpec kSpec{
    "encode",
    "Render an OpenAI / DeepSeek Chat Completions request into the DeepSeek prompt.\n"
    "Prints the prompt string; --json prints {\"prompt\", \"segments\", \"images\"} (segments: [\"control\"|\"text\", s]);\n"
    "--jsonl reads one request per line and prints one JSON result (or {\"error\": ...}) per line.\n"
    "--ids --tokenizer FILE: token ids instead (control segments by exact added-token lookup, text by BPE with\n"
    "the added vocabulary off); printed space-separated, or as \"ids\" in the --json / --jsonl results.",
    {},
    {},
    {
        {"request", "request JSON file ('-' = stdin)", true, "-", "FILE"},
        {"dialect", "prompt dialect: v4, v4-0731, v41-pre, v41, v41-1017", true, "v41", "NAME"},
        {"developer", "developer role policy: native (or system), user, reject", true, "native", "POLICY"},
        {"default-thinking", "thinking when the request does not say: on|off", true, "on", "on|off"},
        {"json", "print the result as JSON with segments", false, "", ""},
        {"jsonl", "one request per input line, one JSON result per output line", false, "", ""},
        {"ids", "print token ids instead of text (needs --tokenizer)", false, "", ""},
        {"tokenizer", "tokenizer.json for --ids", true, "", "FILE"},
    },
};

Json result_json(const text::Prompt& p) {
  Json segs = Json::array();
  for (const auto& s : p.segments()) {
    segs.push_back(Json::array({s.kind == text::SegmentKind::kControl ? "control" : "text", s.text}));
  }
  Json out = Json::object();
  out["prompt"] = p.str();
  out["segments"] = std::move(segs);
  out["images"] = Json(p.images);
  return out;
}

Result<text::Prompt> encode_one(const std::string& body_text, const text::RequestPolicy& policy) {
  auto body = text::parse_json(body_text, "request");
  if (!body.ok()) return body.error();
  auto req = text::map_chat_request(*body, policy);
  if (!req.ok()) return req.error();
  return text::encode_request(*req);
}

// The JSON result of one request; with a tokenizer it carries "ids" too.
Json encode_result(const std::string& body_text, const text::RequestPolicy& policy, const text::Tokenizer* tok) {
  auto p = encode_one(body_text, policy);
  if (!p.ok()) return Json::object({{"error", p.error().message}});
  Json out = result_json(*p);
  if (tok) {
    auto ids = text::prompt_token_ids(*p, *tok);
    if (!ids.ok()) return Json::object({{"error", ids.error().message}});
    out["ids"] = *ids;
  }
  return out;
}

}  // namespace

int cmd_encode(const Args& args) {
  auto parsed = parse_args(kSpec, args);
  if (!parsed.ok()) {
    if (parsed.error().message == "help") { std::printf("%s", usage(kSpec).c_str()); return 0; }
    std::fprintf(stderr, "cedar encode: %s\n", parsed.error().message.c_str());
    return 2;
  }
  const auto& a = *parsed;
  if (a.flag("ids") != a.has("tokenizer")) {
    std::fprintf(stderr, "cedar encode: --ids and --tokenizer FILE go together\n");
    return 2;
  }
  std::optional<text::Tokenizer> tokenizer;
  if (a.flag("ids")) {
    auto t = text::Tokenizer::load(a.get("tokenizer"));
    if (!t.ok()) { std::fprintf(stderr, "cedar encode: %s\n", t.error().message.c_str()); return 1; }
    tokenizer.emplace(std::move(t).value());
  }
  const text::Tokenizer* tok = tokenizer ? &*tokenizer : nullptr;
  text::RequestPolicy policy;
  auto dialect = text::parse_dialect(a.get("dialect"));
  if (!dialect.ok()) { std::fprintf(stderr, "cedar encode: --dialect: %s\n", dialect.error().message.c_str()); return 2; }
  policy.dialect = *dialect;
  const std::string dev = a.get("developer");
  if (dev == "native") policy.developer = text::DeveloperPolicy::kNativeOrSystem;
  else if (dev == "user") policy.developer = text::DeveloperPolicy::kAsUser;
  else if (dev == "reject") policy.developer = text::DeveloperPolicy::kReject;
  else { std::fprintf(stderr, "cedar encode: --developer must be native, user or reject\n"); return 2; }
  const std::string dt = a.get("default-thinking");
  if (dt != "on" && dt != "off") { std::fprintf(stderr, "cedar encode: --default-thinking must be on or off\n"); return 2; }
  policy.default_thinking = dt == "on";

  std::string input;
  if (a.get("request") == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    input = ss.str();
  } else {
    std::ifstream f(a.get("request"), std::ios::binary);
    if (!f) { std::fprintf(stderr, "cedar encode: cannot read %s\n", a.get("request").c_str()); return 1; }
    std::ostringstream ss;
    ss << f.rdbuf();
    input = ss.str();
  }

  if (a.flag("jsonl")) {
    std::istringstream lines(input);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty()) continue;
      const Json out = encode_result(line, policy, tok);
      std::fputs((out.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n").c_str(), stdout);
    }
    return 0;
  }
  const Json res = encode_result(input, policy, tok);
  if (res.contains("error")) {
    std::fprintf(stderr, "cedar encode: %s\n", res["error"].get<std::string>().c_str());
    return 1;
  }
  std::string out;
  if (a.flag("json")) {
    out = res.dump(-1, ' ', false, Json::error_handler_t::replace);
  } else if (tok) {
    for (const auto& id : res["ids"]) out += (out.empty() ? "" : " ") + std::to_string(id.get<int>());
  } else {
    out = res["prompt"].get<std::string>();
  }
  out += "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace cedar::cli
