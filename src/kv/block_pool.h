// Paged storage for the global KV cache (../shared/spec/architecture.md §3.12, §4.3, §6 item 16).
//
// BlockPool hands out fixed-size blocks. A cache stream (one KV source's main KV, or its indexer keys)
// stores `entries_per_block` records per block, so streams of different record sizes use different
// block sizes: the pool keeps one size class per distinct block size, each with its own free list, under
// one byte capacity shared by all classes. Blocks are reference counted (retain/release) so sequences
// can share a cached prefix; a block returns to its class's free list when its count drops to zero.
// Freed blocks keep their memory for reuse by their class; when an allocation would exceed the
// capacity, free blocks of other classes give their memory back first. Allocation past the capacity
// fails with an error (never aborts).
//
// A dry-run pool does all the bookkeeping but backs no block with memory (data pointers are null): it
// measures what a workload would allocate (kv_budget.h) without holding it.
//
// BlockTable is one stream's list of blocks: entry j lives in block j / entries_per_block at record
// j % entries_per_block. Copying a table shares its blocks (retain); a writer that wants to change a
// shared block first gets a private copy of it (copy on write), so a copied prefix never changes under
// the sequence it came from.
//
// Thread safety: the pool's methods may be called from several threads (one mutex). A table is used
// by one writer at a time; concurrent reads of a table (data pointers it caches) need no lock.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "core/status.h"

namespace cedar {

using BlockId = int32_t;

struct BlockPoolOptions {
  int64_t capacity_bytes = INT64_MAX;  // bound on the memory of all blocks, in use or free
  bool dry_run = false;                // bookkeeping only, no memory
};

struct BlockPoolStats {
  int64_t capacity_bytes = 0;
  int64_t used_bytes = 0;       // blocks with a reference count > 0
  int64_t free_bytes = 0;       // blocks on free lists (memory kept for reuse)
  int64_t peak_used_bytes = 0;
  int64_t used_blocks = 0;
  int64_t free_blocks = 0;
  int64_t allocations = 0;        // successful allocate() calls
  int64_t failed_allocations = 0;  // allocate() calls refused for lack of capacity
};

class BlockPool {
 public:
  static Result<std::shared_ptr<BlockPool>> create(const BlockPoolOptions& options);

  // The size class of blocks of `block_bytes` (registered on first use). Errors: block_bytes <= 0 or
  // larger than the capacity.
  Result<int32_t> size_class(int64_t block_bytes);
  int64_t class_bytes(int32_t size_class) const;

  // A block of the class with reference count 1; its contents are unspecified.
  Result<BlockId> allocate(int32_t size_class);
  // Reference counting. Errors name the block: unknown id, or a block that is not in use.
  Status retain(BlockId id);
  Status release(BlockId id);
  int32_t ref_count(BlockId id) const;  // 0 for free or unknown blocks
  // Block size in bytes of a block in use. Errors: unknown id, or a block that is not in use.
  Result<int64_t> block_bytes(BlockId id) const;
  // Memory of a block in use (null in a dry run). Stable until the block is freed.
  uint8_t* data(BlockId id);

  BlockPoolStats stats() const;
  bool dry_run() const { return options_.dry_run; }

  explicit BlockPool(const BlockPoolOptions& options) : options_(options) {}  // use create()

 private:
  struct Block {
    int32_t size_class = -1;
    int32_t refs = 0;
    std::unique_ptr<uint8_t[]> memory;  // null in a dry run and for blocks whose memory was reclaimed
  };
  struct SizeClass {
    int64_t bytes = 0;
    std::vector<BlockId> free;  // free blocks that still hold memory (or dry-run accounting)
  };
  bool reclaim_locked(int64_t bytes, int32_t keep_class);
  Status check_in_use_locked(BlockId id, const char* op) const;

  BlockPoolOptions options_;
  mutable std::mutex mu_;
  std::vector<Block> blocks_;
  std::vector<BlockId> spare_ids_;  // ids of blocks without memory, not in use
  std::vector<SizeClass> classes_;
  int64_t reserved_bytes_ = 0;      // used + free bytes (what counts against the capacity)
  BlockPoolStats stats_;
};

class BlockTable {
 public:
  BlockTable() = default;
  // Records of `record_bytes`, `entries_per_block` per block, from `pool` (registers the size class).
  static Result<BlockTable> create(std::shared_ptr<BlockPool> pool, int64_t record_bytes, int64_t entries_per_block);

  BlockTable(const BlockTable& other);  // shares the blocks
  BlockTable& operator=(const BlockTable& other);
  BlockTable(BlockTable&& other) noexcept;
  BlockTable& operator=(BlockTable&& other) noexcept;
  ~BlockTable();

  int64_t record_bytes() const { return record_bytes_; }
  int64_t entries_per_block() const { return entries_per_block_; }
  int64_t block_bytes() const { return record_bytes_ * entries_per_block_; }
  int64_t blocks() const { return static_cast<int64_t>(ids_.size()); }
  int64_t capacity() const { return blocks() * entries_per_block_; }  // entries the blocks can hold
  BlockId block_id(int64_t b) const { return ids_[static_cast<size_t>(b)]; }
  const std::shared_ptr<BlockPool>& pool() const { return pool_; }

  // Makes entries [0, entries) addressable (allocates blocks); a failed allocation leaves the table as
  // it was before the call.
  Status ensure(int64_t entries);
  // Record j for writing: copies a shared block first (copy on write). Precondition j < capacity().
  Result<uint8_t*> writable(int64_t j);
  // Record j for reading. Precondition j < capacity(); null in a dry run.
  const uint8_t* record(int64_t j) const {
    const uint8_t* base = data_[static_cast<size_t>(j / entries_per_block_)];
    return base == nullptr ? nullptr : base + (j % entries_per_block_) * record_bytes_;
  }
  // Shares existing blocks of the pool (a cached prefix): appends `ids` to an empty table and retains
  // each. Errors name the block: unknown, not in use (freed, or from another pool) or of another size
  // than the table's blocks; the table is unchanged then.
  Status adopt(std::span<const BlockId> ids);
  // Drops blocks past the first `entries` entries (truncation to a prefix).
  void shrink(int64_t entries);
  void clear() { shrink(0); }

 private:
  std::shared_ptr<BlockPool> pool_;
  int32_t size_class_ = -1;
  int64_t record_bytes_ = 0, entries_per_block_ = 0;
  std::vector<BlockId> ids_;
  std::vector<uint8_t*> data_;  // cached block memory (stable while held)
};

}  // namespace cedar
