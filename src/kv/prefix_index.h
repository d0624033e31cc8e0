// The in-memory prefix index of the global-KV cache (issue 6; architecture.md §4.3; docs/prefix_cache.md).
//
// A node stands for one full cache block: positions [k·B, (k+1)·B) of some token sequence, B =
// tokens_per_block. It holds its key (prefix_hash.h: a chained hash naming the whole prefix [0, (k+1)·B)),
// its parent node, its own B tokens, and one BlockPool block per global-KV stream (global_kv_streams
// order), retained by the index for as long as the node exists. A hit shares those blocks by reference
// count: nothing is copied. Tokens are compared on every match (and the parent node must be the matched
// parent), so a hash collision can never hand back another prefix's KV.
//
// `exact`: the node's global KV equals the reference's (it came from a sequence that never went through
// an approximate SWA replay). Exact-only lookups follow exact nodes only; an exact insert upgrades an
// approximate node when nobody else uses its blocks.
//
// Eviction removes least-recently-used leaves that nobody uses: not pinned (a live sequence resumed from
// it, or a lookup in progress) and every block at pool reference count 1 (held only by the index — a
// block a sequence still holds would not free memory). Lookups touch their path deepest-first, so
// ancestors are always more recent than their descendants and the LRU end holds leaves.
//
// Second tier (optional PrefixBlockStore, prefix_block_store.h): newly inserted nodes are written through
// to it; on an in-memory miss the store is consulted, the stored block is verified (key, parent key,
// tokens, stream sizes — anything else is a miss), pool blocks are allocated and the records copied in.
//
// Thread safety: every public method takes the index's mutex (the engine drives it from its step thread;
// servers read stats from others). The callbacks in the options run under that mutex and must not call
// back into the index.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/block_pool.h"
#include "kv/prefix_block_store.h"
#include "kv/prefix_hash.h"

namespace cedar {

using PrefixNodeId = uint64_t;  // unique per node for the index's lifetime (never reused)

struct PrefixIndexOptions {
  int64_t tokens_per_block = 64;
  PrefixKey root;                       // prefix_root(model fingerprint, layout descriptor)
  std::shared_ptr<BlockPool> pool;      // where the nodes' blocks live
  std::vector<int32_t> stream_classes;  // per global-KV stream: the pool size class of its blocks
  PrefixBlockStore* store = nullptr;    // second tier; null: none
  // Bytes the index may hold right now (the cache budget's free room plus what the index holds); consulted
  // before allocating blocks for second-tier loads. Null: only the pool's capacity limits them.
  std::function<int64_t()> byte_limit;
  // Called with the id of every node that leaves the index (eviction, clear): the SWA pool drops
  // snapshots registered there.
  std::function<void(PrefixNodeId)> on_remove;
  // Test seam: the chain function (prefix_chain by default). A degenerate chain forces collisions.
  std::function<PrefixKey(const PrefixKey&, std::span<const int64_t>)> chain;
};

struct PrefixLookupOptions {
  bool exact_only = false;         // follow exact nodes only
  int64_t max_tokens = INT64_MAX;  // match at most this many tokens (rounded down to full blocks)
  bool pin = true;                 // pin the matched nodes (release with unpin)
};

struct PrefixMatch {
  int64_t tokens = 0;                        // P: matched positions, a multiple of tokens_per_block
  std::vector<std::vector<BlockId>> blocks;  // per stream: the P / B blocks of the path
  std::vector<PrefixNodeId> nodes;           // the path, block 0 first (pinned when asked)
  bool exact = true;                         // every node of the path is exact
  int64_t loaded_blocks = 0;                 // nodes of the path that came from the second tier now
};

struct PrefixInsertResult {
  std::vector<PrefixNodeId> nodes;  // the path of the inserted prefix, block 0 first
  int64_t created = 0;              // nodes created with the caller's blocks
  int64_t upgraded = 0;             // approximate nodes that took the caller's (exact) blocks
  // created + upgraded: nodes that now hold the caller's blocks (the caller shares them with the index).
  int64_t adopted() const { return created + upgraded; }
};

struct PrefixIndexStats {
  int64_t lookups = 0;
  int64_t hits = 0;              // lookups that matched at least one block
  int64_t looked_up_tokens = 0;  // Σ tokens offered to lookup (after max_tokens)
  int64_t hit_tokens = 0;        // Σ matched tokens
  int64_t inserted_blocks = 0;   // nodes created (inserts and second-tier loads)
  int64_t evicted_blocks = 0;    // nodes evicted
  int64_t upgraded_blocks = 0;
  int64_t collisions = 0;             // key matched but parent or tokens differed
  int64_t store_loaded_blocks = 0;    // nodes loaded from the second tier
  int64_t store_rejected_blocks = 0;  // stored blocks that failed verification (treated as misses)
  int64_t store_written_blocks = 0;
  int64_t store_write_errors = 0;
  int64_t nodes = 0;
  int64_t bytes = 0;  // pool bytes of the blocks the index holds
};

class PrefixIndex {
 public:
  // Errors: no pool, no streams, a non-positive tokens_per_block, an unknown size class.
  static Result<std::unique_ptr<PrefixIndex>> create(PrefixIndexOptions options);
  ~PrefixIndex();  // releases every block (the pool outlives the index: it holds a shared_ptr)
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  int64_t tokens_per_block() const { return options_.tokens_per_block; }
  int64_t streams() const { return static_cast<int64_t>(options_.stream_classes.size()); }
  int64_t node_bytes() const { return node_bytes_; }  // one block of every stream
  const PrefixKey& root() const { return options_.root; }

  // The longest matching full-block prefix of `tokens` (in memory, then the second tier).
  Result<PrefixMatch> lookup(std::span<const int64_t> tokens, const PrefixLookupOptions& options = {});

  // Records the full blocks of `tokens` (floor(size / B) of them). blocks[s] holds at least that many block
  // ids of stream s (a sequence's block table; the index retains the ones it keeps). Existing nodes keep
  // their blocks, except that an exact insert upgrades an unused approximate node. Errors: wrong number
  // of streams or too few blocks (nothing is inserted then).
  Result<PrefixInsertResult> insert(std::span<const int64_t> tokens, const std::vector<std::vector<BlockId>>& blocks,
                                    bool exact);

  void pin(std::span<const PrefixNodeId> nodes);
  void unpin(std::span<const PrefixNodeId> nodes);  // unknown ids are ignored

  // Evicts unused LRU leaves until `bytes` were freed or nothing is evictable; returns the bytes freed.
  int64_t evict(int64_t bytes);
  // Bytes that evict() could free now (unused leaves, repeatedly: a parent becomes a leaf).
  int64_t evictable_bytes() const;
  void clear();  // evicts everything evictable

  int64_t held_bytes() const;
  PrefixIndexStats stats() const;
  bool contains(PrefixNodeId id) const;
  // The B tokens and exactness of a node (tests, the SWA pool's checks).
  bool node_exact(PrefixNodeId id) const;

 private:
  struct Node {
    PrefixNodeId id = 0;
    PrefixKey key;
    Node* parent = nullptr;  // null: the root
    std::vector<int64_t> tokens;
    std::vector<BlockId> blocks;  // per stream
    bool exact = true;
    int64_t children = 0;
    int64_t pins = 0;
    std::list<Node*>::iterator lru;  // position in lru_ (front: most recent)
  };
  explicit PrefixIndex(PrefixIndexOptions options) : options_(std::move(options)) {}

  PrefixKey chain(const PrefixKey& parent, std::span<const int64_t> tokens) const;
  Node* find_locked(const PrefixKey& key, const Node* parent, std::span<const int64_t> tokens);
  Node* load_from_store_locked(const PrefixKey& key, Node* parent, std::span<const int64_t> tokens, bool exact_only);
  Node* add_node_locked(const PrefixKey& key, Node* parent, std::span<const int64_t> tokens,
                        std::vector<BlockId> blocks, bool exact);
  void write_through_locked(const Node& n);
  bool evictable_locked(const Node& n) const;
  void remove_locked(Node* n);
  int64_t evict_locked(int64_t bytes);
  void touch_locked(Node* n);

  PrefixIndexOptions options_;
  int64_t node_bytes_ = 0;
  mutable std::mutex mu_;
  std::unordered_multimap<PrefixKey, std::unique_ptr<Node>, PrefixKeyHash> nodes_;
  std::unordered_map<PrefixNodeId, Node*> by_id_;
  std::list<Node*> lru_;
  PrefixNodeId next_id_ = 1;
  PrefixIndexStats stats_;
};

}  // namespace cedar
