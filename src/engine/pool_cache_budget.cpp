#include "engine/pool_cache_budget.h"

#include <algorithm>
#include <string>

#include "kv/kv_layout.h"
#include "kv/prefix_index.h"

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

PoolCacheBudget::Held PoolCacheBudget::charge(int64_t tokens, int64_t shared) const {
  // Shared blocks are full blocks inside the sequence's tables, so they never exceed its global bytes.
  const int64_t global = std::max<int64_t>(0, layout_.global_bytes_for(tokens) - shared);
  return Held{tokens, global + layout_.bytes_per_sequence, global};
}

int64_t PoolCacheBudget::index_bytes() const { return index_ != nullptr ? index_->held_bytes() : 0; }
int64_t PoolCacheBudget::used_bytes() const { return used_ + index_bytes(); }
int64_t PoolCacheBudget::global_used_bytes() const { return global_used_ + index_bytes(); }

bool PoolCacheBudget::attach_prefix_index(PrefixIndex* index) {
  index_ = index;
  return true;
}

bool PoolCacheBudget::reserve(RequestId id, int64_t tokens) {
  auto it = held_.find(id);
  const Held have = it == held_.end() ? Held{} : it->second;
  if (it != held_.end() && tokens <= have.tokens) return true;
  auto sh = shared_.find(id);
  const Held want = charge(tokens, sh == shared_.end() ? 0 : sh->second);
  const int64_t delta = want.bytes - have.bytes;
  int64_t over = used_bytes() + delta - capacity_;
  if (over > 0 && index_ != nullptr) {
    index_->evict(over);  // unused cached prefixes go before any request is refused
    over = used_bytes() + delta - capacity_;
  }
  if (over > 0) return false;
  used_ += delta;
  global_used_ += want.global_bytes - have.global_bytes;
  held_[id] = want;
  return true;
}

void PoolCacheBudget::share(RequestId id, int64_t bytes) {
  if (bytes <= 0) return;
  const int64_t shared = (shared_[id] += bytes);
  auto it = held_.find(id);
  if (it == held_.end()) return;
  const Held now = charge(it->second.tokens, shared);
  used_ += now.bytes - it->second.bytes;
  global_used_ += now.global_bytes - it->second.global_bytes;
  it->second = now;
}

void PoolCacheBudget::release(RequestId id) {
  shared_.erase(id);
  auto it = held_.find(id);
  if (it == held_.end()) return;
  used_ -= it->second.bytes;
  global_used_ -= it->second.global_bytes;
  held_.erase(it);
}

}  // namespace cedar::engine
