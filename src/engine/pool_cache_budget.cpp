#include "engine/pool_cache_budget.h"

#include <string>

#include "kv/kv_layout.h"

namespace cedar::engine {

int64_t PoolCacheLayout::global_bytes_for(int64_t tokens) const {
  int64_t bytes = 0;
  for (const Stream& s : streams) {
    const int64_t entries = tokens / s.ratio;
    bytes += (entries + s.entries_per_block - 1) / s.entries_per_block * s.block_bytes;
  }
  return bytes;
}

Result<PoolCacheLayout> pool_cache_layout(const ModelConfig& config, const LayerPlan& plan,
                                          int64_t bytes_per_sequence, int64_t tokens_per_block) {
  const KvDims dims{config.arch, config.head_dim, config.index_head_dim, config.qk_rope_head_dim};
  CEDAR_ASSIGN_OR_RETURN(const KvFormats formats, kv_formats(dims, KvStorage::Packed));
  CEDAR_ASSIGN_OR_RETURN(const std::vector<KvStreamSpec> specs, global_kv_streams(plan, formats, tokens_per_block));
  PoolCacheLayout layout;
  layout.bytes_per_sequence = bytes_per_sequence;
  layout.tokens_per_block = tokens_per_block;
  for (const KvStreamSpec& s : specs)
    layout.streams.push_back({s.ratio, s.entries_per_block, s.entries_per_block * s.format.record_bytes()});
  return layout;
}

Result<std::unique_ptr<PoolCacheBudget>> PoolCacheBudget::create(PoolCacheLayout layout, int64_t capacity_bytes) {
  if (capacity_bytes <= 0)
    return make_error("KV cache capacity " + std::to_string(capacity_bytes) + " bytes must be positive");
  CEDAR_ASSIGN_OR_RETURN(std::shared_ptr<BlockPool> pool, BlockPool::create({.capacity_bytes = capacity_bytes}));
  return std::make_unique<PoolCacheBudget>(std::move(layout), capacity_bytes, std::move(pool));
}

bool PoolCacheBudget::reserve(RequestId id, int64_t tokens) {
  auto it = held_.find(id);
  const Held have = it == held_.end() ? Held{} : it->second;
  if (it != held_.end() && tokens <= have.tokens) return true;
  const int64_t global = layout_.global_bytes_for(tokens);
  const int64_t want = global + layout_.bytes_per_sequence;
  if (used_ + (want - have.bytes) > capacity_) return false;
  used_ += want - have.bytes;
  global_used_ += global - have.global_bytes;
  held_[id] = Held{tokens, want, global};
  return true;
}

void PoolCacheBudget::release(RequestId id) {
  auto it = held_.find(id);
  if (it == held_.end()) return;
  used_ -= it->second.bytes;
  global_used_ -= it->second.global_bytes;
  held_.erase(it);
}

}  // namespace cedar::engine
