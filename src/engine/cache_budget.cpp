#include "engine/cache_budget.h"

#include <cmath>

namespace cedar::engine {

int64_t CacheFootprint::bytes_for(int64_t tokens) const {
  return static_cast<int64_t>(std::ceil(bytes_per_token * static_cast<double>(tokens))) + bytes_per_sequence;
}

bool ByteCacheBudget::reserve(RequestId id, int64_t tokens) {
  const int64_t want = footprint_.bytes_for(tokens);
  auto it = held_.find(id);
  const int64_t have = it == held_.end() ? 0 : it->second;
  if (want <= have) return true;
  if (used_ + (want - have) > capacity_) return false;
  used_ += want - have;
  held_[id] = want;
  return true;
}

void ByteCacheBudget::release(RequestId id) {
  auto it = held_.find(id);
  if (it == held_.end()) return;
  used_ -= it->second;
  held_.erase(it);
}

}  // namespace cedar::engine
