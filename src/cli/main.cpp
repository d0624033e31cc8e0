// `cedar` entry point: dispatches to subcommands through one table.
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "cli/commands.h"

namespace {

struct Command {
  std::string_view name;
  std::string_view summary;
  int (*run)(const cedar::cli::Args&);
};

constexpr Command kCommands[] = {
    {"version", "print the cedar version", cedar::cli::cmd_version},
    {"encode", "render a chat request into the model prompt", cedar::cli::cmd_encode},
    {"parse", "parse a model completion into a chat message", cedar::cli::cmd_parse},
    {"pyjson", "re-serialize JSON lines as Python json.dumps (test aid)", cedar::cli::cmd_pyjson},
    {"tensors", "list (or dump) the tensors of a safetensors file or checkpoint", cedar::cli::cmd_tensors},
    {"inspect", "describe a checkpoint or config: layer plan, parameters, KV budget, inventory", cedar::cli::cmd_inspect},
    {"tokenize", "encode text with a tokenizer.json, print token ids", cedar::cli::cmd_tokenize},
    {"engram-map", "build the V4.1 Engram token-normalization map", cedar::cli::cmd_engram_map},
    {"make-tiny", "write a tiny checkpoint in the released format", cedar::cli::cmd_make_tiny},
    {"engram-rows", "print the Engram hash rows of a token sequence (test aid)", cedar::cli::cmd_engram_rows},
    {"forward", "run the CPU forward over token ids; write logits (.npy) and named intermediates", cedar::cli::cmd_forward},
    {"run", "complete a raw text prompt (streams the text; --stats-json for timings)", cedar::cli::cmd_run},
    {"chat", "interactive chat through the prompt encoder and output parser", cedar::cli::cmd_chat},
    {"bench", "serving benchmark: offered load (TTFT, TPOT, throughput) and CED vs exact prefill", cedar::cli::cmd_bench},
    {"doctor", "check this machine for cedar: GPU, FP8 support, HBM bandwidth, model memory plan", cedar::cli::cmd_doctor},
    {"serve", "serve the OpenAI / DeepSeek HTTP API (chat, completions, tokenize, metrics)", cedar::cli::cmd_serve},
};

void print_help() {
  std::printf("cedar — inference engine for DeepSeek-V4.1-Flash and V4-Flash\n\nusage: cedar COMMAND [args]\n\ncommands:\n");
  for (const auto& c : kCommands) std::printf("  %-12s %.*s\n", std::string(c.name).c_str(), static_cast<int>(c.summary.size()), c.summary.data());
  std::printf("\n'cedar COMMAND --help' describes a command.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h" ||
      std::string_view(argv[1]) == "help") {
    print_help();
    return argc < 2 ? 2 : 0;
  }
  const std::string_view name = argv[1];
  cedar::cli::Args args(argv + 2, argv + argc);
  for (const auto& c : kCommands) {
    if (c.name != name) continue;
    try {
      return c.run(args);
    } catch (const std::exception& e) {  // last line of defence: report, never dump core on bad input
      std::fprintf(stderr, "cedar %s: internal error: %s\n", argv[1], e.what());
      return 70;
    }
  }
  std::fprintf(stderr, "cedar: unknown command '%s' (try 'cedar --help')\n", argv[1]);
  return 2;
}
