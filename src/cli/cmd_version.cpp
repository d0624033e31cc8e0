#include <cstdio>

#include "cli/commands.h"

namespace cedar::cli {

int cmd_version(const Args& /*args*/) {
#ifdef CEDAR_HAVE_CUDA
  std::printf("cedar 0.1.0 (CUDA backend built in)\n");
#else
  std::printf("cedar 0.1.0 (CPU only)\n");
#endif
  return 0;
}

}  // namespace cedar::cli
