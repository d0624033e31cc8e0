// `cedar pyjson`: re-serializes JSON values the way Python's json.dumps does (testing aid for the
// prompt encoder's JSON layer; see text/py_json.h).
#include <cstdio>
#include <iostream>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "text/py_json.h"

namespace cedar::cli {
namespace {
const CommandSpec kSpec{
    "pyjson",
    "Read one JSON value per stdin line; print json.dumps(value, ensure_ascii=False) per line.",
    {},
    {},
    {
        {"ensure-ascii", "escape non-ASCII as \\uXXXX (json.dumps default)", false, "", ""},
        {"indent", "indent width (json.dumps indent=N)", true, "", "N"},
    },
};
}  // namespace

int cmd_pyjson(const Args& args) {
  auto parsed = parse_args(kSpec, args);
  if (!parsed.ok()) {
    if (parsed.error().message == "help") { std::printf("%s", usage(kSpec).c_str()); return 0; }
    std::fprintf(stderr, "cedar pyjson: %s\n", parsed.error().message.c_str());
    return 2;
  }
  text::PyDumpOptions opt;
  opt.ensure_ascii = parsed->flag("ensure-ascii");
  if (parsed->has("indent")) {
    auto n = parsed->get_int("indent");
    if (!n.ok()) { std::fprintf(stderr, "cedar pyjson: %s\n", n.error().message.c_str()); return 2; }
    opt.indent = static_cast<int>(*n);
  }
  std::string line;
  int status = 0;
  while (std::getline(std::cin, line)) {
    auto v = text::parse_json(line, "input line");
    if (!v.ok()) { std::fprintf(stderr, "cedar pyjson: %s\n", v.error().message.c_str()); status = 1; std::fputs("\n", stdout); continue; }
    // One value per output line: a newline inside (indent mode) is written escaped as \x1e-separated records.
    const std::string out = text::py_json_dumps(*v, opt);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputs(opt.indent ? "\x1e\n" : "\n", stdout);
  }
  return status;
}

}  // namespace cedar::cli
