// Every `cedar` subcommand: one function each, in its own cmd_*.cpp file, listed in main.cpp.
#pragma once

#include <string>
#include <vector>

namespace cedar::cli {

using Args = std::vector<std::string>;

int cmd_version(const Args& args);
int cmd_make_tiny(const Args& args);

}  // namespace cedar::cli
