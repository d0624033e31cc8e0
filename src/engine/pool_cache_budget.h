// CacheBudget with the paged pool's page rounding (architecture.md §3.12, docs/kv.md): a sequence of N
// tokens is charged exactly the blocks its global-KV block tables allocate (every stream of
// global_kv_streams holds floor(N / ratio) entries in blocks of entries_per_block records) plus the fixed
// per-sequence state (SWA rings). The budget owns the shared BlockPool the sequences allocate from; its
// capacity equals the budget's, and since a reservation always covers the blocks a sequence's forward
// allocates, the scheduler preempts before the pool could ever refuse an allocation.
//
// With a prefix index attached (attach_prefix_index), the blocks the index holds are charged once, to the
// index (PrefixIndex::held_bytes), and a sequence's reservation leaves out the blocks it shares with the
// index (share()). A reservation that does not fit first evicts unused index blocks (LRU), and only
// then is refused (the scheduler preempts). Pool bytes in use <= used_bytes() holds throughout.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/status.h"
#include "engine/cache_budget.h"
#include "io/config.h"
#include "kv/block_pool.h"
#include "model/layer_plan.h"

namespace cedar::engine {

struct PoolCacheLayout {
  struct Stream {
    int64_t ratio = 0, entries_per_block = 0, block_bytes = 0;
  };
  std::vector<Stream> streams;     // global-KV streams (packed records)
  int64_t bytes_per_sequence = 0;  // outside the pool: SWA rings and other fixed state
  int64_t tokens_per_block = 64;
  // Bytes the block tables of one sequence of `tokens` tokens allocate in the pool.
  int64_t global_bytes_for(int64_t tokens) const;
};

// The layout of `config`'s plan with packed formats (kv_layout.h), `tokens_per_block` positions a block.
Result<PoolCacheLayout> pool_cache_layout(const ModelConfig& config, const LayerPlan& plan,
                                          int64_t bytes_per_sequence, int64_t tokens_per_block = 64);

class PoolCacheBudget final : public CacheBudget {
 public:
  // A budget of `capacity_bytes` and a (memory-backed) pool of the same capacity.
  static Result<std::unique_ptr<PoolCacheBudget>> create(PoolCacheLayout layout, int64_t capacity_bytes);

  bool reserve(RequestId id, int64_t tokens) override;
  void release(RequestId id) override;
  int64_t bytes_for(int64_t tokens) const override {
    return layout_.global_bytes_for(tokens) + layout_.bytes_per_sequence;
  }
  int64_t used_bytes() const override;
  int64_t capacity_bytes() const override { return capacity_; }
  int64_t sequences() const override { return static_cast<int64_t>(held_.size()); }
  bool attach_prefix_index(PrefixIndex* index) override;
  void share(RequestId id, int64_t bytes) override;
  int64_t index_byte_limit() const override { return capacity_ - used_; }
  int64_t sequence_bytes() const override { return used_; }

  // Global-KV part of used_bytes() (what the pool may hold in use at most), index blocks included.
  int64_t global_used_bytes() const;
  int64_t index_bytes() const;  // held by the attached index (0 without one)
  const std::shared_ptr<BlockPool>& pool() const { return pool_; }
  const PoolCacheLayout& layout() const { return layout_; }

  PoolCacheBudget(PoolCacheLayout layout, int64_t capacity_bytes, std::shared_ptr<BlockPool> pool)
      : layout_(std::move(layout)), capacity_(capacity_bytes), pool_(std::move(pool)) {}  // use create()

 private:
  struct Held {
    int64_t tokens = 0, bytes = 0, global_bytes = 0;
  };
  Held charge(int64_t tokens, int64_t shared) const;

  PoolCacheLayout layout_;
  int64_t capacity_ = 0;
  std::shared_ptr<BlockPool> pool_;
  PrefixIndex* index_ = nullptr;
  int64_t used_ = 0, global_used_ = 0;  // reservations only
  std::map<RequestId, Held> held_;
  std::map<RequestId, int64_t> shared_;  // bytes of each request's blocks the index holds too
};

}  // namespace cedar::engine
