// A ModelRunner that hands every call to another one: the engine tests derive from it to watch or check
// what passes through (create_sequence, run_batch) and override only that.
#pragma once

#include <memory>
#include <optional>
#include <span>

#include "engine/model_runner.h"

namespace cedar::test_support {

class ForwardingRunner : public engine::ModelRunner {
 public:
  explicit ForwardingRunner(engine::ModelRunner& inner) : inner_(&inner) {}
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t eos_token() const override { return inner_->eos_token(); }
  engine::CacheFootprint cache_footprint() const override { return inner_->cache_footprint(); }
  std::optional<engine::PrefixCacheSupport> prefix_cache() const override { return inner_->prefix_cache(); }
  Result<std::unique_ptr<engine::ModelSequence>> create_sequence(const engine::SequenceSpec& spec) override {
    return inner_->create_sequence(spec);
  }
  void run_batch(std::span<engine::BatchItem> items) override { inner_->run_batch(items); }

 private:
  engine::ModelRunner* inner_;
};

}  // namespace cedar::test_support
