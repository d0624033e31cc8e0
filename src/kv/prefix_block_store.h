// A second tier under the in-memory prefix index (issue 6): somewhere prefix-cache blocks can be written
// through to and found again later — after they were evicted from memory, or after a restart. The SSD tier
// (kv_disk_store.h) implements it; the prefix index (prefix_index.h) calls it.
//
// A block is self-describing: its key (prefix_hash.h), its parent's key and its own tokens, so a reader
// can check that a stored block continues exactly the prefix it has matched so far, plus the records of
// every global-KV stream (global_kv_streams order, kv_layout.h) for the block's positions.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/status.h"
#include "kv/prefix_hash.h"

namespace cedar {

struct StoredPrefixBlock {
  PrefixKey key, parent;
  std::vector<int64_t> tokens;                // the block's tokens_per_block token ids
  bool exact = true;                          // global KV equal to the reference's (no approximate replay)
  std::vector<std::vector<uint8_t>> streams;  // per stream: entries_per_block × record_bytes bytes
};

class PrefixBlockStore {
 public:
  virtual ~PrefixBlockStore() = default;
  // Stores the block (replacing an older copy under the same key). An error leaves the store usable.
  virtual Status put(const StoredPrefixBlock& block) = 0;
  // The block stored under `key`; nullopt when absent or unusable (a damaged copy is reported and
  // dropped by the store — the caller recomputes).
  virtual std::optional<StoredPrefixBlock> get(const PrefixKey& key) = 0;
  virtual bool contains(const PrefixKey& key) const = 0;
};

}  // namespace cedar
