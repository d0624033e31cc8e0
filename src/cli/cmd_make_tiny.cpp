// `cedar make-tiny OUT`: writes a tiny checkpoint in the released format and checks it.
#include <cstdio>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/tiny_checkpoint.h"

namespace cedar::cli {
namespace {

CommandSpec make_tiny_spec() {
  return CommandSpec{
      "make-tiny",
      "Write a tiny checkpoint in the released safetensors format (all tensors of the architecture, "
      "small widths, deterministic values), then verify it with cedar's reader and inventory check.",
      {"OUT"},
      {},
      {
          {"arch", "deepseek_v41 or deepseek_v4", true, "deepseek_v41", "ARCH"},
          {"seed", "seed of the values (same seed: identical files)", true, "0", "N"},
          {"profile", "size profile: tiny, or small (layer-dominated widths for benchmarks)", true, "tiny", "NAME"},
          {"bf16", "unquantized variant (BF16 weights, no quantization_config)", false, "", ""},
          {"tokenizer", "DeepSeek V4 tokenizer.json to ship (default: $CEDAR_TOKENIZER, then the "
                        "copy scripts/setup.sh makes)", true, "", "FILE"},
          {"force", "replace OUT if it is not empty", false, "", ""},
      },
  };
}

}  // namespace

int cmd_make_tiny(const Args& args) {
  const CommandSpec spec = make_tiny_spec();
  auto parsed = parse_args(spec, args);
  if (!parsed.ok()) {
    if (parsed.error().message == "help") {
      std::printf("%s", usage(spec).c_str());
      return 0;
    }
    std::fprintf(stderr, "cedar make-tiny: %s\n\n%s", parsed.error().message.c_str(), usage(spec).c_str());
    return 2;
  }
  TinyCheckpointOptions options;
  const std::string arch = parsed->get("arch");
  if (arch == "deepseek_v41") options.arch = Arch::DeepseekV41;
  else if (arch == "deepseek_v4") options.arch = Arch::DeepseekV4;
  else {
    std::fprintf(stderr, "cedar make-tiny: --arch must be deepseek_v41 or deepseek_v4, got '%s'\n", arch.c_str());
    return 2;
  }
  auto seed = parsed->get_int("seed");
  if (!seed.ok() || *seed < 0) {
    std::fprintf(stderr, "cedar make-tiny: --seed expects a non-negative integer, got '%s'\n",
                 parsed->get("seed").c_str());
    return 2;
  }
  options.seed = static_cast<uint64_t>(*seed);
  options.profile = parsed->get("profile");
  options.bf16 = parsed->flag("bf16");
  options.tokenizer = parsed->get("tokenizer");

  const std::string out = *parsed->positional(0);
  if (Status st = make_tiny_checkpoint(options, out, parsed->flag("force")); !st.ok()) {
    std::fprintf(stderr, "cedar make-tiny: %s\n", st.error().message.c_str());
    return 1;
  }
  std::printf("wrote %s tiny checkpoint (seed %llu%s) to %s; inventory check passed\n", arch.c_str(),
              static_cast<unsigned long long>(options.seed), options.bf16 ? ", bf16" : "", out.c_str());
  return 0;
}

}  // namespace cedar::cli
