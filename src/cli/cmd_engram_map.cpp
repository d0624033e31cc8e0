// `cedar engram-map`: build the V4.1 Engram token-normalization map from a tokenizer.json, write it as .npy,
// and/or check it against the frozen copy.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "text/engram_norm.h"
#include "text/tokenizer.h"

namespace cedar::cli {

namespace {

const CommandSpec& spec() {
  static const CommandSpec s{
      "engram-map",
      "Build the Engram raw-id -> compressed-id map (architecture.md §3.9 item 1) from a tokenizer.json.\n"
      "Prints the number of compressed ids; --out writes the map (int32 .npy), --check compares it with a frozen "
      "one.\nWith --normalize-file, instead prints the Engram normalization of each JSON string line of the file.",
      {},
      {},
      {{"tokenizer", "tokenizer.json to build from", true,
        std::string(CEDAR_SOURCE_DIR) + "/third_party/downloads/deepseek-v41-derived/tokenizer.json", "FILE"},
       {"out", "write the map here (.npy, little-endian int32)", true, "", "FILE"},
       {"check", "fail unless the built map equals this frozen .npy map", true, "", "FILE"},
       {"expect", "fail unless the map has this many compressed ids (V4.1: 99092)", true, "", "N"},
       {"normalize-file", "print {\"key\": normalize(s)} for each JSON string line of this file", true, "", "FILE"}},
  };
  return s;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "cedar engram-map: %s\n", message.c_str());
  return 1;
}

int normalize_lines(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return fail("cannot open '" + path + "'");
  auto norm = text::EngramNormalizer::create();
  if (!norm) return fail(norm.error().message);
  std::string line, out;
  size_t line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_string()) return fail(path + ":" + std::to_string(line_no) + ": not a JSON string");
    const std::string& s = j.get_ref<const std::string&>();
    if (text::find_invalid_utf8(s) != std::string_view::npos) return fail(path + ":" + std::to_string(line_no) + ": invalid UTF-8");
    out += nlohmann::json{{"key", norm->normalize(s)}}.dump() + "\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

int cmd_engram_map(const Args& args) {
  auto parsed = parse_args(spec(), args);
  if (!parsed) {
    if (parsed.error().message == "help") {
      std::printf("%s", usage(spec()).c_str());
      return 0;
    }
    std::fprintf(stderr, "cedar engram-map: %s\n%s", parsed.error().message.c_str(), usage(spec()).c_str());
    return 2;
  }
  const ParsedArgs& a = *parsed;
  if (a.has("normalize-file")) return normalize_lines(a.get("normalize-file"));

  auto tok = text::Tokenizer::load(a.get("tokenizer"));
  if (!tok) return fail(tok.error().message);
  auto map = text::build_engram_token_map(*tok);
  if (!map) return fail(map.error().message);
  std::printf("%d compressed ids for %zu token ids (%s)\n", map->num_classes, map->compressed.size(),
              a.get("tokenizer").c_str());
  if (a.has("expect")) {
    auto want = a.get_int("expect");
    if (!want) return fail(want.error().message);
    if (*want != map->num_classes)
      return fail("expected " + std::to_string(*want) + " compressed ids, built " + std::to_string(map->num_classes));
  }
  if (a.has("out")) {
    if (auto st = text::save_engram_map_npy(map->compressed, a.get("out")); !st) return fail(st.error().message);
    std::printf("wrote %s\n", a.get("out").c_str());
  }
  if (a.has("check")) {
    auto frozen = text::load_engram_map_npy(a.get("check"));
    if (!frozen) return fail(frozen.error().message);
    if (frozen->size() != map->compressed.size())
      return fail("frozen map has " + std::to_string(frozen->size()) + " entries, built " + std::to_string(map->compressed.size()));
    for (size_t i = 0; i < frozen->size(); ++i)
      if ((*frozen)[i] != map->compressed[i])
        return fail("id " + std::to_string(i) + ": frozen " + std::to_string((*frozen)[i]) + ", built " +
                    std::to_string(map->compressed[i]));
    std::printf("matches %s\n", a.get("check").c_str());
  }
  return 0;
}

}  // namespace cedar::cli
