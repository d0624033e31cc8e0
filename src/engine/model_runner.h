// What the engine drives: a model that holds per-sequence state and runs one chunk of tokens of one
// sequence at a time. DeepseekRunner adapts the CPU reference model; FakeModelRunner (fake_model.h) is a
// deterministic stand-in for scheduler tests. A batch is a list of chunks of different sequences; the
// CPU runner computes them one after another (each forward parallel over the pool), so a sequence's
// numbers never depend on what else is in the batch.
//
// Prefix caching (docs/prefix_cache.md): a runner that supports it says how (prefix_cache()): the shared
// block pool its sequences allocate global KV from, the pool size class of every global-KV stream, the
// block span, a fingerprint of model + layout. A sequence exports the block ids covering a prefix
// (prefix_blocks) and snapshots of its SWA rings (snapshot); create_sequence resumes a sequence from
// cached blocks (SequenceSpec::resume) at a restart point R, from a snapshot or by SWA bounded replay
// (exact when it replays the runner's exact_*_replay_rows).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/cache_budget.h"
#include "engine/swa_pool.h"
#include "model/deepseek_v41.h"

namespace cedar::engine {

// Resume a sequence from a cached prefix (the model-level ResumeSpec, forward_types.h, at engine level).
struct SequenceResume {
  int64_t cached_tokens = 0;                 // P, a multiple of the block span
  std::vector<std::vector<BlockId>> blocks;  // per global-KV stream: the P / B blocks; the sequence retains them
  int64_t restart = 0;                       // R <= P: the sequence starts at length R; the engine feeds tokens[R..]
  std::shared_ptr<const SequenceSnapshot> snapshot;  // rings at R; null: SWA bounded replay from R
                                                     // (exact when R <= t − exact replay rows, or R == 0)
  std::span<const int64_t> history;          // tokens [0, R)
  bool prefix_exact = true;                  // every cached block is exact (ResumeSpec::prefix_exact)
};

struct SequenceSpec {
  ForwardMode mode = ForwardMode::Ced;
  int64_t prompt_length = 0;  // the original prompt (CED's replay tail is fixed by it)
  int64_t ced_tail = 0;       // replayed decoder rows; 0 = the model's sliding window
  int64_t swa_history = 0;    // extra SWA ring slots, so snapshots restore up to this far back
  const SequenceResume* resume = nullptr;  // null: a new sequence
};

class ModelSequence {
 public:
  virtual ~ModelSequence() = default;
  virtual int64_t length() const = 0;  // tokens processed
  // Cache bytes the sequence's global KV occupies in the packed format (0 when not modelled).
  virtual int64_t kv_bytes_packed() const { return 0; }
  // Global-KV bytes its block tables hold in the pool, page padding included (0 when not modelled).
  virtual int64_t kv_bytes_allocated() const { return 0; }

  // Prefix caching (runners whose prefix_cache() is set).
  // Per global-KV stream, the block ids covering positions [0, tokens) (tokens a multiple of the span).
  virtual Result<std::vector<std::vector<BlockId>>> prefix_blocks(int64_t tokens) const;
  // The SWA rings at length() (exact_layers 0 when nothing in them equals an uncached run).
  virtual Result<std::shared_ptr<const SequenceSnapshot>> snapshot() const;
  // False once the sequence (or the prefix it resumed from) went through an approximate SWA replay.
  virtual bool global_kv_exact() const { return true; }
};

// How a runner supports prefix caching.
struct PrefixCacheSupport {
  std::shared_ptr<BlockPool> pool;      // the pool every sequence's global KV comes from
  std::vector<int32_t> stream_classes;  // per global-KV stream: its pool size class
  int64_t tokens_per_block = 0;         // B
  std::string fingerprint;              // model and cache layout (the index's root key)
  int64_t sliding_window = 0;
  int64_t exact_mode_layers = 0;  // snapshot layers an exact-mode restore needs (every layer)
  int64_t ced_layers = 0;         // snapshot layers a ced-mode restore needs (encoder + boundary)
  // Rows of SWA bounded replay before t (P; ced: min(P, N − tail)) that make a resume without a
  // snapshot bitwise exact (DeepseekV41Model::exact_replay_rows): R <= t − rows, or R == 0.
  int64_t exact_mode_replay_rows = 0;
  int64_t ced_replay_rows = 0;
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
  // nullopt: no prefix caching (create_sequence then rejects a resume).
  virtual std::optional<PrefixCacheSupport> prefix_cache() const { return std::nullopt; }
};

// The DeepSeek-V4.1 CPU reference model. The model and pool must outlive the runner. `kv`: every
// sequence's cache options; kv.pool is the shared block pool its global KV is allocated from
// (PoolCacheBudget::pool(), with the same tokens_per_block as the budget's layout); null: a private
// unbounded pool per sequence (and no prefix caching). `fingerprint` names the model in the prefix
// cache's keys (io/model_fingerprint.h for caches that outlive the process, the SSD tier); empty: the
// config's identity, good for one process.
class DeepseekRunner final : public ModelRunner {
 public:
  DeepseekRunner(const DeepseekV41Model& model, ThreadPool* pool, KvCacheOptions kv = {}, std::string fingerprint = {});
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  int64_t eos_token() const override;
  CacheFootprint cache_footprint() const override { return footprint_; }
  Result<std::unique_ptr<ModelSequence>> create_sequence(const SequenceSpec& spec) override;
  void run_batch(std::span<BatchItem> items) override;
  std::optional<PrefixCacheSupport> prefix_cache() const override { return prefix_; }

 private:
  const DeepseekV41Model* model_;
  ThreadPool* pool_;
  KvCacheOptions kv_;
  std::optional<PrefixCacheSupport> prefix_;
  CacheFootprint footprint_;
  int64_t main_entry_bytes_ = 0, indexer_entry_bytes_ = 0;
};

}  // namespace cedar::engine
