#include <cstdio>

#include "cli/commands.h"

namespace cedar::cli {
int cmd_parse(const Args& /*args*/) {
  std::fprintf(stderr, "cedar parse: not implemented yet\n");
  return 2;
}
}  // namespace cedar::cli
