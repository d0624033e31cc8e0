// `cedar bench --device cuda` (cmd_bench_cuda.cpp): called by cmd_bench with its parsed options.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/args.h"
#include "core/status.h"

namespace cedar::cli {

// Exit code: 0 ok, 1 failure (also: this binary was built without CUDA), 2 usage error.
int cmd_bench_cuda(const ParsedArgs& args);

// Comma-separated positive integers ("1,8,64"); shared with cmd_bench.cpp's lists.
Result<std::vector<int64_t>> parse_positive_list(const std::string& text, const std::string& option);

}  // namespace cedar::cli
