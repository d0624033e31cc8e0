#include "engine/swa_pool.h"

#include <algorithm>
#include <chrono>

namespace cedar::engine {

SwaPool::SwaPool(SwaPoolOptions options) : options_(std::move(options)) {}

double SwaPool::now() const {
  if (options_.now) return options_.now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void SwaPool::erase_locked(EntryList::iterator it) {
  for (PrefixNodeId id : it->nodes) {
    auto reg = by_node_.find(id);
    if (reg == by_node_.end()) continue;
    std::erase(reg->second, it);
    if (reg->second.empty()) by_node_.erase(reg);
  }
  bytes_ -= it->snapshot->bytes;
  entries_.erase(it);
}

void SwaPool::expire_locked(double t) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (it->expires <= t) {
      erase_locked(it);
      ++stats_.expired;
    }
    it = next;
  }
}

bool SwaPool::put(std::shared_ptr<const SequenceSnapshot> snapshot, std::span<const int64_t> tokens,
                  std::span<const PrefixNodeId> path, int64_t tokens_per_block) {
  std::lock_guard<std::mutex> lock(mu_);
  const double t = now();
  expire_locked(t);
  const int64_t B = tokens_per_block;
  if (snapshot == nullptr || snapshot->exact_layers <= 0 || B <= 0 || snapshot->bytes > options_.max_bytes ||
      static_cast<int64_t>(tokens.size()) < snapshot->length || options_.ttl_seconds <= 0) {
    ++stats_.rejected;
    return false;
  }
  Entry e;
  // Boundaries (k+1)·B in [earliest_restore, length], of nodes the path has.
  for (int64_t k = 0; k < static_cast<int64_t>(path.size()); ++k) {
    const int64_t boundary = (k + 1) * B;
    if (boundary < snapshot->earliest_restore || boundary > snapshot->length) continue;
    if (e.nodes.empty()) e.anchor = boundary;
    e.nodes.push_back(path[static_cast<size_t>(k)]);
  }
  if (e.nodes.empty()) {
    ++stats_.rejected;
    return false;
  }
  e.tail.assign(tokens.begin() + e.anchor, tokens.begin() + snapshot->length);
  e.expires = t + options_.ttl_seconds;
  e.snapshot = std::move(snapshot);
  while (bytes_ + e.snapshot->bytes > options_.max_bytes && !entries_.empty()) {
    erase_locked(std::prev(entries_.end()));
    ++stats_.evicted;
  }
  bytes_ += e.snapshot->bytes;
  entries_.push_front(std::move(e));
  for (PrefixNodeId id : entries_.front().nodes) by_node_[id].push_back(entries_.begin());
  ++stats_.inserted;
  return true;
}

std::optional<SwaRestore> SwaPool::find(std::span<const int64_t> tokens, std::span<const PrefixNodeId> path,
                                        int64_t tokens_per_block, int64_t limit, int64_t min_layers) {
  std::lock_guard<std::mutex> lock(mu_);
  const double t = now();
  expire_locked(t);
  const int64_t B = tokens_per_block;
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::optional<EntryList::iterator> best;
  int64_t best_r = 0;
  for (int64_t k = static_cast<int64_t>(path.size()) - 1; k >= 0; --k) {
    auto reg = by_node_.find(path[static_cast<size_t>(k)]);
    if (reg == by_node_.end()) continue;
    const int64_t boundary = (k + 1) * B;  // the request's tokens [0, boundary) equal the snapshot's
    for (EntryList::iterator it : reg->second) {
      const SequenceSnapshot& s = *it->snapshot;
      if (s.exact_layers < min_layers) continue;
      // How far past the boundary the request still follows the snapshot's tokens.
      int64_t match = boundary;
      while (match < s.length && match < n &&
             tokens[static_cast<size_t>(match)] == it->tail[static_cast<size_t>(match - it->anchor)])
        ++match;
      const int64_t r = std::min(limit, match);
      if (r > best_r && r >= s.earliest_restore) {
        best_r = r;
        best = it;
      }
    }
  }
  if (!best) {
    ++stats_.misses;
    return std::nullopt;
  }
  ++stats_.hits;
  (*best)->expires = t + options_.ttl_seconds;  // an active session keeps its snapshots
  entries_.splice(entries_.begin(), entries_, *best);
  return SwaRestore{(*best)->snapshot, best_r};
}

void SwaPool::drop_node(PrefixNodeId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto reg = by_node_.find(id);
  if (reg == by_node_.end()) return;
  const std::vector<EntryList::iterator> its = std::move(reg->second);
  by_node_.erase(reg);
  for (EntryList::iterator it : its) {
    std::erase(it->nodes, id);
    if (it->nodes.empty()) {
      erase_locked(it);
      ++stats_.dropped;
    }
  }
}

void SwaPool::expire() {
  std::lock_guard<std::mutex> lock(mu_);
  expire_locked(now());
}

void SwaPool::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!entries_.empty()) erase_locked(entries_.begin());
}

SwaPoolStats SwaPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SwaPoolStats s = stats_;
  s.entries = static_cast<int64_t>(entries_.size());
  s.bytes = bytes_;
  return s;
}

}  // namespace cedar::engine
