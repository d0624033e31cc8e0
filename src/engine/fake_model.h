// A deterministic stand-in model for scheduler tests and benchmarks: the logits after a sequence of
// tokens are a pure function of that whole sequence (a rolling hash), so chunking, batching,
// preemption and recompute are invisible in the output exactly as they must be for the real model.
// It checks the engine's use of it: chunks must continue where the sequence stopped, and it counts
// live sequences so tests can see that everything is released.
//
// Prefix caching (FakeModelOptions::pool set): sequences keep a stand-in global KV in real pool blocks
// (the streams of `layout`; record j of a ratio-r stream holds the history hash at position (j+1)·r and
// an "approximate" bit), export them, snapshot their recent hashes, and resume from both. A resume
// verifies what the engine hands it — blocks whose records do not continue the history, or a snapshot
// of another history, fail the batch item — and behaves like the real model where the result is not
// bitwise equal to an uncached run: after an SWA replay shorter than the exact replay rows (R > 0 and
// R > t − rows, t = P; ced: min(P, N − tail)), from approximate blocks, or (ced mode) from a snapshot at
// R > N − tail, its logits come from a perturbed hash (outputs differ from the solo run), and its blocks
// are marked approximate. Exact mode refuses a short replay, as the model does. After an exact replay
// its snapshots restore from R + rows + 1 on, as the model's do (earlier ring keys are not exact).
#pragma once

#include <memory>

#include "engine/model_runner.h"
#include "engine/pool_cache_budget.h"

namespace cedar::engine {

struct FakeModelOptions {
  int64_t vocab = 64;
  int64_t eos = 1;      // -1: none
  double eos_bias = 0;  // added to the EOS logit (large: short generations)
  CacheFootprint footprint{16.0, 64};
  int64_t fail_at_length = -1;  // a chunk reaching this length fails (error-path tests)
  // Prefix caching: the pool the sequences allocate from and its streams (records >= 16 bytes).
  std::shared_ptr<BlockPool> pool;
  PoolCacheLayout layout;
  int64_t sliding_window = 4;
  // Replay rows that make a resume without a snapshot exact (the model's exact_replay_rows).
  int64_t exact_mode_replay_rows = 10;
  int64_t ced_replay_rows = 6;
};

class FakeModelRunner final : public ModelRunner {
 public:
  explicit FakeModelRunner(FakeModelOptions options = {}) : options_(std::move(options)) {}
  int64_t vocab_size() const override { return options_.vocab; }
  int64_t eos_token() const override { return options_.eos; }
  CacheFootprint cache_footprint() const override { return options_.footprint; }
  Result<std::unique_ptr<ModelSequence>> create_sequence(const SequenceSpec& spec) override;
  void run_batch(std::span<BatchItem> items) override;
  std::optional<PrefixCacheSupport> prefix_cache() const override;

  int64_t live_sequences() const { return *live_; }
  int64_t tokens_processed() const { return tokens_processed_; }
  int64_t batches() const { return batches_; }
  int64_t max_batch_items() const { return max_batch_items_; }
  int64_t resumes() const { return resumes_; }

  // The logits a sequence whose history hashes to `hash` produces (tests compute solo references).
  std::vector<float> logits_for(uint64_t hash) const;
  static uint64_t extend_hash(uint64_t hash, int64_t token);
  static constexpr uint64_t kInitialHash = 0x12345;

 private:
  FakeModelOptions options_;
  std::shared_ptr<int64_t> live_ = std::make_shared<int64_t>(0);
  int64_t tokens_processed_ = 0, batches_ = 0, max_batch_items_ = 0, resumes_ = 0;
};

}  // namespace cedar::engine
