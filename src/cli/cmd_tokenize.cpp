// `cedar tokenize`: encode text with a tokenizer.json and print the ids (or, with --jsonl, run a batch of
// encode/decode requests in one process — what the HF parity tests use).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "text/bpe.h"
#include "text/tokenizer.h"

namespace cedar::cli {

namespace {

using json = nlohmann::json;

const CommandSpec& spec() {
  static const CommandSpec s{
      "tokenize",
      "Encode text with a HF tokenizer.json (byte-level BPE) and print the token ids, one line, space-separated.\n"
      "Added-token strings (e.g. <｜User｜>) are plain text unless --special is given (then every added token's string\n"
      "becomes its id, as HF encode does; the prompt encoder never does this for content).\n"
      "With --jsonl, --file holds one JSON value per line: a string is encoded ({\"ids\": [...], \"text\": "
      "decode(ids)}),\nan array of ids is decoded ({\"text\": ...}); errors give {\"error\": ...}.",
      {},
      {},
      {{"tokenizer", "tokenizer.json to use", true,
        std::string(CEDAR_SOURCE_DIR) + "/third_party/downloads/deepseek-v4/tokenizer.json", "FILE"},
       {"text", "text to encode", true, "", "T"},
       {"file", "read the text (or, with --jsonl, the requests) from this file ('-' = stdin)", true, "", "F"},
       {"json", "print {\"ids\": [...], \"pieces\": [...]} (pieces in byte-level form)", false, "", ""},
       {"special", "match added-token strings in the text (control tokens)", false, "", ""},
       {"skip-special-tokens", "decode without added tokens flagged special (HF skip_special_tokens=True; default keeps all)",
        false, "", ""},
       {"jsonl", "batch mode: one JSON request per line of --file, one JSON result per line", false, "", ""},
       {"pretokenize", "also output the pre-tokenizer pieces (byte-level form) under \"pretokens\"", false, "", ""}},
  };
  return s;
}

Result<std::string> read_input(const std::string& path) {
  std::ostringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error("cannot open '" + path + "'");
  ss << f.rdbuf();
  return ss.str();
}

// Pre-tokenizer pieces in byte-level form (what HF's pre_tokenizer.pre_tokenize_str returns).
json pretokens_json(std::string_view s, const std::vector<text::InputSpan>& segs) {
  json pieces = json::array();
  for (const auto& seg : segs)
    pieces.push_back(seg.id >= 0 ? std::string(s.substr(seg.begin, seg.end - seg.begin))
                                 : text::bytes_to_byte_level(s.substr(seg.begin, seg.end - seg.begin)));
  return pieces;
}

struct RequestOptions {
  text::TokenizeOptions encode;
  text::DecodeOptions decode;
  bool pretokenize = false;
};

json run_request(const text::Tokenizer& tok, const json& req, const RequestOptions& o) {
  if (req.is_array()) {
    std::vector<text::TokenId> ids;
    for (const json& v : req) {
      if (!v.is_number_integer()) return json{{"error", "id list holds a non-integer: " + v.dump()}};
      ids.push_back(v.get<text::TokenId>());
    }
    auto decoded = tok.decode(ids, o.decode);
    if (!decoded) return json{{"error", decoded.error().message}};
    return json{{"text", *decoded}};
  }
  if (!req.is_string()) return json{{"error", "request must be a string or an array of ids"}};
  const std::string& s = req.get_ref<const std::string&>();
  auto ids = tok.encode(s, o.encode);
  if (!ids) return json{{"error", ids.error().message}};
  auto decoded = tok.decode(*ids, o.decode);
  if (!decoded) return json{{"error", decoded.error().message}};
  json out{{"ids", *ids}, {"text", *decoded}};
  if (o.pretokenize) {
    auto segs = tok.pre_tokenize(s, o.encode);
    if (!segs) return json{{"error", segs.error().message}};
    out["pretokens"] = pretokens_json(s, *segs);
  }
  return out;
}

int run_jsonl(const text::Tokenizer& tok, const std::string& input, const RequestOptions& opts) {
  std::string out;
  size_t line_no = 0;
  for (size_t pos = 0; pos < input.size();) {
    size_t nl = input.find('\n', pos);
    if (nl == std::string::npos) nl = input.size();
    const std::string_view line(input.data() + pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (line.empty()) continue;
    json req = json::parse(line, nullptr, /*allow_exceptions=*/false);
    json res = req.is_discarded() ? json{{"error", "line " + std::to_string(line_no) + " is not valid JSON"}}
                                   : run_request(tok, req, opts);
    out += res.dump(-1, ' ', false, json::error_handler_t::replace);
    out += '\n';
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

int cmd_tokenize(const Args& args) {
  auto parsed = parse_args(spec(), args);
  if (!parsed) {
    if (parsed.error().message == "help") {
      std::printf("%s", usage(spec()).c_str());
      return 0;
    }
    std::fprintf(stderr, "cedar tokenize: %s\n%s", parsed.error().message.c_str(), usage(spec()).c_str());
    return 2;
  }
  const ParsedArgs& a = *parsed;
  if (a.has("text") == a.has("file")) {
    std::fprintf(stderr, "cedar tokenize: give exactly one of --text and --file\n");
    return 2;
  }
  if (a.flag("jsonl") && !a.has("file")) {
    std::fprintf(stderr, "cedar tokenize: --jsonl reads its requests from --file\n");
    return 2;
  }
  auto tok = text::Tokenizer::load(a.get("tokenizer"));
  if (!tok) {
    std::fprintf(stderr, "cedar tokenize: %s\n", tok.error().message.c_str());
    return 1;
  }
  std::string input;
  if (a.has("file")) {
    auto r = read_input(a.get("file"));
    if (!r) {
      std::fprintf(stderr, "cedar tokenize: %s\n", r.error().message.c_str());
      return 1;
    }
    input = std::move(r).value();
  } else {
    input = a.get("text");
  }
  text::TokenizeOptions opts;
  opts.allow_added_tokens = a.flag("special");
  if (a.flag("jsonl")) {
    RequestOptions ro;
    ro.encode = opts;
    ro.decode.skip_special_tokens = a.flag("skip-special-tokens");
    ro.pretokenize = a.flag("pretokenize");
    return run_jsonl(*tok, input, ro);
  }

  auto ids = tok->encode(input, opts);
  if (!ids) {
    std::fprintf(stderr, "cedar tokenize: %s\n", ids.error().message.c_str());
    return 1;
  }
  if (a.flag("json") || a.flag("pretokenize")) {
    json out{{"ids", *ids}};
    json pieces = json::array();
    for (text::TokenId id : *ids) pieces.push_back(std::string(tok->id_to_token(id).value_or("")));
    out["pieces"] = pieces;
    if (a.flag("pretokenize")) {
      auto segs = tok->pre_tokenize(input, opts);
      if (segs) out["pretokens"] = pretokens_json(input, *segs);
    }
    std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    return 0;
  }
  std::string line;
  for (size_t i = 0; i < ids->size(); ++i) {
    if (i) line += ' ';
    line += std::to_string((*ids)[i]);
  }
  std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace cedar::cli
