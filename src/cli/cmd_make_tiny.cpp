// `cedar make-tiny OUT`: writes a tiny checkpoint in the released format and checks it.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/roofline.h"
#include "model/tiny_checkpoint.h"
#include "model/weights.h"

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
          {"profile", "size profile: tiny, small (layer-dominated widths for CPU benchmarks), or perf "
                      "(deepseek_v41 at full width and depth with 16 experts per layer, ~24 GB: the GPU benchmark "
                      "model, docs/cuda.md)", true, "tiny", "NAME"},
          {"bf16", "unquantized variant (BF16 weights, no quantization_config)", false, "", ""},
          {"tokenizer", "DeepSeek V4 tokenizer.json to ship (default: $CEDAR_TOKENIZER, then the "
                        "copy scripts/setup.sh makes)", true, "", "FILE"},
          {"no-tokenizer", "write the shards, index and config.json only (no tokenizer files: enough for "
                           "loading the weights, e.g. the GPU benchmark)", false, "", ""},
          {"force", "replace OUT if it is not empty", false, "", ""},
          {"threads", "generator threads of the perf profile (0 = all cores)", true, "0", "N"},
      },
  };
}

// Per-token weight bytes of the perf model next to the released model's (what the GPU roofline divides).
void print_perf_summary(const TinyCheckpointOptions& o) {
  auto config = tiny_model_config(o.arch, o.profile, o.bf16);
  if (!config.ok()) return;
  auto plan = build_layer_plan(*config);
  if (!plan.ok()) return;
  auto weights = expected_weights(*config, *plan);
  if (!weights.ok()) return;
  const DecodeTraffic perf = decode_traffic(*config, *plan, *weights, {});
  std::printf("per-token weight bytes at batch 1: %.3f GB (layers %.3f + %g experts x %zu layers x %.2f MB + head %.3f)\n",
              perf.weight_bytes() / 1e9, static_cast<double>(perf.layer_weight_bytes) / 1e9,
              perf.distinct_experts_per_layer, plan->layers.size(), static_cast<double>(perf.expert_bytes_each) / 1e6,
              static_cast<double>(perf.head_bytes) / 1e9);
  ModelConfig released = *config;
  released.n_routed_experts = 384;
  if (auto rp = build_layer_plan(released); rp.ok()) {
    if (auto rw = expected_weights(released, *rp); rw.ok()) {
      const DecodeTraffic real = decode_traffic(released, *rp, *rw, {});
      std::printf("released model (384 experts): %.3f GB; difference %.1f MB = the router rows of the %lld experts "
                  "left out\n",
                  real.weight_bytes() / 1e9, (real.weight_bytes() - perf.weight_bytes()) / 1e6,
                  static_cast<long long>(384 - config->n_routed_experts));
    }
  }
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
  options.tokenizer_files = !parsed->flag("no-tokenizer");
  auto threads = parsed->get_int("threads");
  if (!threads.ok() || *threads < 0) {
    std::fprintf(stderr, "cedar make-tiny: --threads expects a non-negative integer, got '%s'\n",
                 parsed->get("threads").c_str());
    return 2;
  }
  options.threads = static_cast<int>(*threads);

  const std::string out = *parsed->positional(0);
  const auto t0 = std::chrono::steady_clock::now();
  if (Status st = make_tiny_checkpoint(options, out, parsed->flag("force")); !st.ok()) {
    std::fprintf(stderr, "cedar make-tiny: %s\n", st.error().message.c_str());
    return 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(out, ec))
    if (entry.is_regular_file(ec)) bytes += entry.file_size(ec);
  std::printf("wrote %s %s checkpoint (seed %llu%s) to %s: %.2f GB in %.1f s (%.2f GB/s); inventory check passed\n",
              arch.c_str(), options.profile.c_str(), static_cast<unsigned long long>(options.seed),
              options.bf16 ? ", bf16" : "", out.c_str(), static_cast<double>(bytes) / 1e9, seconds,
              seconds > 0 ? static_cast<double>(bytes) / 1e9 / seconds : 0.0);
  if (options.profile == "perf") print_perf_summary(options);
  return 0;
}

}  // namespace cedar::cli
