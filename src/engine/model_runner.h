// What the engine drives: a model that holds per-sequence state and runs one chunk of tokens of one
// sequence at a time. DeepseekRunner adapts the CPU reference model; FakeModelRunner (fake_model.h) is a
// deterministic stand-in for scheduler tests. A batch is a list of chunks of different sequences; the
// CPU runner computes them one after another (each forward parallel over the pool), so a sequence's
// numbers never depend on what else is in the batch.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "engine/cache_budget.h"
#include "model/deepseek_v41.h"

namespace cedar::engine {

struct SequenceSpec {
  ForwardMode mode = ForwardMode::Ced;
  int64_t prompt_length = 0;  // the original prompt (CED's replay tail is fixed by it)
  int64_t ced_tail = 0;       // replayed decoder rows; 0 = the model's sliding window
};

class ModelSequence {
 public:
  virtual ~ModelSequence() = default;
  virtual int64_t length() const = 0;  // tokens processed
  // Cache bytes the sequence's global KV occupies in the packed format (0 when not modelled).
  virtual int64_t kv_bytes_packed() const { return 0; }
  // Global-KV bytes its block tables hold in the pool, page padding included (0 when not modelled).
  virtual int64_t kv_bytes_allocated() const { return 0; }
};

struct BatchItem {
  ModelSequence* sequence = nullptr;
  std::span<const int64_t> tokens;  // the chunk, at positions [length, length + n)
  bool want_logits = false;         // logits of the chunk's last row
  // Results:
  std::vector<float> logits;  // [vocab] when want_logits
  Status status;
  double seconds = 0;  // wall time of this item
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t eos_token() const = 0;  // -1: none
  virtual CacheFootprint cache_footprint() const = 0;
  virtual Result<std::unique_ptr<ModelSequence>> create_sequence(const SequenceSpec& spec) = 0;
  // Runs every item; per-item failures land in item.status (the sequence must then be discarded).
  virtual void run_batch(std::span<BatchItem> items) = 0;
};

// The DeepSeek-V4.1 CPU reference model. The model and pool must outlive the runner. `kv`: every
// sequence's cache options; kv.pool is the shared block pool its global KV is allocated from
// (PoolCacheBudget::pool(), with the same tokens_per_block as the budget's layout); null: a private
// unbounded pool per sequence.
class DeepseekRunner final : public ModelRunner {
 public:
  DeepseekRunner(const DeepseekV41Model& model, ThreadPool* pool, KvCacheOptions kv = {});
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  int64_t eos_token() const override;
  CacheFootprint cache_footprint() const override { return footprint_; }
  Result<std::unique_ptr<ModelSequence>> create_sequence(const SequenceSpec& spec) override;
  void run_batch(std::span<BatchItem> items) override;

 private:
  const DeepseekV41Model* model_;
  ThreadPool* pool_;
  KvCacheOptions kv_;
  CacheFootprint footprint_;
  int64_t main_entry_bytes_ = 0, indexer_entry_bytes_ = 0;
};

}  // namespace cedar::engine
