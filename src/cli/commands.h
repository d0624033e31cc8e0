// Every `cedar` subcommand: one function each, in its own cmd_*.cpp file, listed in main.cpp.
#pragma once

#include <string>
#include <vector>

namespace cedar::cli {

using Args = std::vector<std::string>;

int cmd_version(const Args& args);
int cmd_encode(const Args& args);
int cmd_parse(const Args& args);
int cmd_pyjson(const Args& args);
int cmd_tensors(const Args& args);
int cmd_inspect(const Args& args);
int cmd_tokenize(const Args& args);
int cmd_engram_map(const Args& args);
int cmd_make_tiny(const Args& args);
int cmd_engram_rows(const Args& args);
int cmd_forward(const Args& args);
int cmd_run(const Args& args);
int cmd_chat(const Args& args);
int cmd_bench(const Args& args);
int cmd_doctor(const Args& args);
int cmd_serve(const Args& args);

}  // namespace cedar::cli
