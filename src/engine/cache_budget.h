// How the scheduler accounts KV-cache memory. It never touches cache storage itself: before a
// sequence grows it asks for room here, and it gives the room back when the sequence finishes, is
// cancelled or is preempted. ByteCacheBudget counts bytes with the model's per-token and
// per-sequence footprint; a paged pool (src/kv) implements the same interface with page rounding.
#pragma once

#include <cstdint>
#include <map>

namespace cedar {
class PrefixIndex;
}

namespace cedar::engine {

using RequestId = uint64_t;

// Cache bytes of one sequence of n tokens: ceil(bytes_per_token · n) + bytes_per_sequence.
struct CacheFootprint {
  double bytes_per_token = 0;      // global (compressed) KV + indexer keys, packed
  int64_t bytes_per_sequence = 0;  // sliding-window rings and other fixed per-sequence state
  int64_t bytes_for(int64_t tokens) const;
};

class CacheBudget {
 public:
  virtual ~CacheBudget() = default;
  // Grows (or creates) the reservation of `id` so it holds `tokens` tokens. Returns false and changes
  // nothing when the capacity does not allow it. Never shrinks a reservation.
  virtual bool reserve(RequestId id, int64_t tokens) = 0;
  // Frees everything `id` holds (no-op when it holds nothing).
  virtual void release(RequestId id) = 0;
  // Bytes one sequence of `tokens` tokens needs on its own (the scheduler rejects what never fits).
  virtual int64_t bytes_for(int64_t tokens) const = 0;
  virtual int64_t used_bytes() const = 0;
  virtual int64_t capacity_bytes() const = 0;
  virtual int64_t sequences() const = 0;  // reservations held

  // Prefix caching (docs/prefix_cache.md). A budget that accounts the blocks a PrefixIndex holds (once,
  // however many sequences share them) and evicts its unused blocks before refusing a reservation says
  // so by accepting the index; the others refuse and the engine runs without a prefix cache.
  virtual bool attach_prefix_index(PrefixIndex* /*index*/) { return false; }
  // `bytes` more of the blocks of `id`'s sequence are held by the index too (a resume from cached blocks,
  // or blocks the index adopted from it): they leave the reservation's charge.
  virtual void share(RequestId /*id*/, int64_t /*bytes*/) {}
  // Bytes the index may hold now: the capacity less what the reservations hold.
  virtual int64_t index_byte_limit() const { return 0; }
  // The part of used_bytes() that sequences hold (used_bytes() less cached prefixes nobody may need).
  virtual int64_t sequence_bytes() const { return used_bytes(); }
};

class ByteCacheBudget final : public CacheBudget {
 public:
  ByteCacheBudget(CacheFootprint footprint, int64_t capacity_bytes)
      : footprint_(footprint), capacity_(capacity_bytes) {}
  bool reserve(RequestId id, int64_t tokens) override;
  void release(RequestId id) override;
  int64_t bytes_for(int64_t tokens) const override { return footprint_.bytes_for(tokens); }
  int64_t used_bytes() const override { return used_; }
  int64_t capacity_bytes() const override { return capacity_; }
  int64_t sequences() const override { return static_cast<int64_t>(held_.size()); }

 private:
  CacheFootprint footprint_;
  int64_t capacity_ = 0;
  int64_t used_ = 0;
  std::map<RequestId, int64_t> held_;  // bytes per sequence
};

}  // namespace cedar::engine
