// A deterministic stand-in model for scheduler tests and benchmarks: the logits after a sequence of
// tokens are a pure function of that whole sequence (a rolling hash), so chunking, batching,
// preemption and recompute are invisible in the output exactly as they must be for the real model.
// It checks the engine's use of it: chunks must continue where the sequence stopped, and it counts
// live sequences so tests can see that everything is released.
#pragma once

#include <memory>

#include "engine/model_runner.h"

namespace cedar::engine {

struct FakeModelOptions {
  int64_t vocab = 64;
  int64_t eos = 1;             // -1: none
  double eos_bias = 0;         // added to the EOS logit (large: short generations)
  CacheFootprint footprint{16.0, 64};
  int64_t fail_at_length = -1; // a chunk reaching this length fails (error-path tests)
};

class FakeModelRunner final : public ModelRunner {
 public:
  explicit FakeModelRunner(FakeModelOptions options = {}) : options_(options) {}
  int64_t vocab_size() const override { return options_.vocab; }
  int64_t eos_token() const override { return options_.eos; }
  CacheFootprint cache_footprint() const override { return options_.footprint; }
  Result<std::unique_ptr<ModelSequence>> create_sequence(const SequenceSpec& spec) override;
  void run_batch(std::span<BatchItem> items) override;

  int64_t live_sequences() const { return *live_; }
  int64_t tokens_processed() const { return tokens_processed_; }
  int64_t batches() const { return batches_; }
  int64_t max_batch_items() const { return max_batch_items_; }

  // The logits a sequence whose history hashes to `hash` produces (tests compute solo references).
  std::vector<float> logits_for(uint64_t hash) const;
  static uint64_t extend_hash(uint64_t hash, int64_t token);

 private:
  FakeModelOptions options_;
  std::shared_ptr<int64_t> live_ = std::make_shared<int64_t>(0);
  int64_t tokens_processed_ = 0, batches_ = 0, max_batch_items_ = 0;
};

}  // namespace cedar::engine
