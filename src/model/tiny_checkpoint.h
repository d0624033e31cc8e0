// Tiny checkpoints in the released format (../shared/spec/architecture.md §1–§2): a small profile of
// each architecture that is structurally complete (every layer mode, Engram, the candidate pool, the
// draft blocks, every storage format), with deterministic seeded values. Used as cedar's embedded
// default model and as test input; the tensor list comes from expected_weights(), never from here.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/layer_plan.h"

namespace cedar {

struct TinyCheckpointOptions {
  Arch arch = Arch::DeepseekV41;
  std::string profile = "tiny";
  uint64_t seed = 0;
  bool bf16 = false;                 // unquantized variant: no quantization_config, BF16 weights
  std::filesystem::path tokenizer;   // V4 tokenizer.json to start from; empty: find_tokenizer_json()
  int n_shards = 2;                  // perf profile: at least one shard per 4 GiB
  bool tokenizer_files = true;       // false: shards, index and config.json only (tests of tensors)
  int threads = 0;                   // perf profile: generator threads (0 = all cores)
};

// The configuration of a named profile. `bf16` drops the quantization_config (not for "perf").
//   tiny   structurally complete miniature (d 64; the embedded default model)
//   small  the same layers at d 512 (CPU benchmarks)
//   perf   deepseek_v41 only: DeepSeek-V4.1-Flash at full width and depth (40 layers, the released
//          layer plan and formats) with kPerfRoutedExperts routed experts per layer, Engram tables
//          from primes >= kPerfEngramVocabSize and no DSpark blocks — the GPU benchmark model
//          (docs/cuda-log.md "The perf profile"). Per-token weight bytes at batch 1 equal the released model's except for
//          the router rows of the experts left out.
Result<ModelConfig> tiny_model_config(Arch arch, std::string_view profile, bool bf16);

inline constexpr int64_t kPerfRoutedExperts = 16;        // released: 384 (top-6 either way)
inline constexpr int64_t kPerfEngramVocabSize = 160000;  // released: 16 000 000 (prime search start)

// The perf profile's tensors, streamed (values from per-row streams seeded by (seed, name, row), so the
// bytes do not depend on threads or chunking; table-driven, ~1 ns per value). perf_tensors.cpp.
Result<std::vector<io::StreamedTensor>> perf_tensors(const ModelConfig& c, const LayerPlan& plan, uint64_t seed);

// Engram table rows per Engram layer by the released prime rule (§3.9 item 5): for every
// (layer, n-gram order 2..max, head) in that order, the next unused prime >= engram_vocab_size;
// a layer's rows are the sum of its primes.
std::vector<int64_t> engram_table_rows(const ModelConfig& c);

// Every tensor expected_weights(c, plan) lists, filled with deterministic values (seed + hash of the
// tensor name, so one tensor's values do not depend on any other), in the listed order.
Result<io::SafetensorsWriter> tiny_tensors(const ModelConfig& c, const LayerPlan& plan, uint64_t seed);

// Writes the shards, model.safetensors.index.json, config.json, tokenizer.json and
// tokenizer_config.json into `dir` (which must exist). No verification; see make_tiny_checkpoint.
Status write_tiny_checkpoint(const TinyCheckpointOptions& options, const std::filesystem::path& dir);

// Reopens a written checkpoint with io::Checkpoint and checks its inventory against its own
// config.json: an error names every problem.
Status verify_tiny_checkpoint(const std::filesystem::path& dir);

// Writes and verifies a checkpoint in a fresh temporary sibling of `final_path` (same filesystem,
// so renaming it to `final_path` is atomic) and returns the temporary directory. On error nothing is
// left behind.
Result<std::filesystem::path> stage_tiny_checkpoint(const TinyCheckpointOptions& options,
                                                    const std::filesystem::path& final_path);

// `cedar make-tiny`: writes into a temporary sibling directory, verifies it, then renames it to
// `out`. `out` must not exist or be empty unless `force` (then it is replaced).
Status make_tiny_checkpoint(const TinyCheckpointOptions& options, const std::filesystem::path& out, bool force);

}  // namespace cedar
