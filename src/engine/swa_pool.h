// The host-memory pool of sliding-window snapshots of the prefix cache (issue 6; architecture.md §3.11;
// docs/prefix_cache.md).
//
// The global KV of a cached prefix lives in the prefix index (kv/prefix_index.h); a sequence resumed
// from it also needs its SWA rings at the restart point R. A snapshot taken at length L from a sequence
// with ring slots = window + swa_history can restore any R in [L − swa_history, L] (earliest_restore);
// the rings at R depend on the tokens [0, R), so a request may use it only if its tokens [0, R) equal the
// snapshot's. The pool registers each snapshot with the index nodes whose boundaries (k+1)·B fall in its
// restorable range: a request whose index match passes through such a node shares the tokens up to that
// boundary, and the snapshot's own tokens past it (kept in the entry) decide how much further it reaches.
//
// Bounded by bytes (LRU) and by age (TTL from the last put or hit, on an injectable clock). Entries die with
// the last index node they are registered at (drop_node). Without a snapshot a hit costs an approximate
// SWA bounded replay in ced mode, or a recompute in exact mode (engine policy, prefix_cache.h).
//
// Thread safety: one mutex around every public method.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/prefix_index.h"

namespace cedar::engine {

// A sequence's SWA state at some length in the model runner's own representation (DeepseekRunner: the
// model's SwaSnapshot; FakeModelRunner: its hash state). Only the runner that made it reads the contents.
struct SequenceSnapshot {
  virtual ~SequenceSnapshot() = default;
  int64_t length = 0;            // L
  int64_t earliest_restore = 0;  // smallest restart point it restores
  int64_t exact_layers = 0;      // layers whose rings equal an uncached run of the same mode; 0: unusable
  int64_t bytes = 0;             // host memory it holds
};

struct SwaPoolOptions {
  int64_t max_bytes = int64_t{1} << 30;
  double ttl_seconds = 600;
  std::function<double()> now;  // seconds on a monotonic clock; null: std::chrono::steady_clock
};

struct SwaRestore {
  std::shared_ptr<const SequenceSnapshot> snapshot;
  int64_t restart = 0;  // R
};

struct SwaPoolStats {
  int64_t entries = 0, bytes = 0;
  int64_t inserted = 0;
  int64_t rejected = 0;  // unusable (no exact layers, no boundary in range) or larger than the pool
  int64_t hits = 0, misses = 0;
  int64_t expired = 0;  // TTL
  int64_t evicted = 0;  // byte bound
  int64_t dropped = 0;  // their last index node went
};

class SwaPool {
 public:
  explicit SwaPool(SwaPoolOptions options);

  // Keeps `snapshot`, taken from a sequence whose tokens start with `tokens` (at least snapshot->length of
  // them); path[k] is the index node of block k of those tokens (PrefixInsertResult::nodes). Returns false
  // when it was not kept (unusable, too large, no node in its restorable range).
  bool put(std::shared_ptr<const SequenceSnapshot> snapshot, std::span<const int64_t> tokens,
           std::span<const PrefixNodeId> path, int64_t tokens_per_block);

  // The best restore point for a request whose tokens are `tokens` and whose index match is `path`: the
  // largest R <= limit restorable by a live snapshot of at least `min_layers` exact layers whose tokens
  // [0, R) equal the request's. nullopt: none (R = 0 never counts).
  std::optional<SwaRestore> find(std::span<const int64_t> tokens, std::span<const PrefixNodeId> path,
                                 int64_t tokens_per_block, int64_t limit, int64_t min_layers);

  void drop_node(PrefixNodeId id);  // the index removed the node
  void expire();                    // drops entries past their TTL (put and find do it too)
  void clear();
  SwaPoolStats stats() const;

 private:
  struct Entry {
    std::shared_ptr<const SequenceSnapshot> snapshot;
    int64_t anchor = 0;               // first registered boundary
    std::vector<int64_t> tail;        // the sequence's tokens [anchor, length)
    std::vector<PrefixNodeId> nodes;  // where it is registered
    double expires = 0;
  };
  using EntryList = std::list<Entry>;
  double now() const;
  void erase_locked(EntryList::iterator it);
  void expire_locked(double t);

  SwaPoolOptions options_;
  mutable std::mutex mu_;
  EntryList entries_;  // front: most recently used
  std::unordered_map<PrefixNodeId, std::vector<EntryList::iterator>> by_node_;
  int64_t bytes_ = 0;
  SwaPoolStats stats_;
};

}  // namespace cedar::engine
