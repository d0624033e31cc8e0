#include "kv/prefix_index.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_set>

namespace cedar {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

bool same_tokens(std::span<const int64_t> a, std::span<const int64_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

Result<std::unique_ptr<PrefixIndex>> PrefixIndex::create(PrefixIndexOptions options) {
  if (options.pool == nullptr) return make_error("prefix index: no block pool");
  if (options.tokens_per_block <= 0)
    return make_error("prefix index: tokens_per_block " + str(options.tokens_per_block) + " must be positive");
  if (options.stream_classes.empty()) return make_error("prefix index: no global-KV streams");
  std::unique_ptr<PrefixIndex> index(new PrefixIndex(std::move(options)));
  for (size_t s = 0; s < index->options_.stream_classes.size(); ++s) {
    const int64_t bytes = index->options_.pool->class_bytes(index->options_.stream_classes[s]);
    if (bytes <= 0)
      return make_error("prefix index: stream " + str(static_cast<int64_t>(s)) + " has unknown pool size class " +
                        str(index->options_.stream_classes[s]));
    index->node_bytes_ += bytes;
  }
  return index;
}

PrefixIndex::~PrefixIndex() {
  for (auto& [key, node] : nodes_)
    for (BlockId id : node->blocks) (void)options_.pool->release(id);  // held by the index: cannot fail
}

PrefixKey PrefixIndex::chain(const PrefixKey& parent, std::span<const int64_t> tokens) const {
  return options_.chain ? options_.chain(parent, tokens) : prefix_chain(parent, tokens);
}

PrefixIndex::Node* PrefixIndex::find_locked(const PrefixKey& key, const Node* parent, std::span<const int64_t> tokens) {
  auto [begin, end] = nodes_.equal_range(key);
  for (auto it = begin; it != end; ++it) {
    Node* n = it->second.get();
    if (n->parent == parent && same_tokens(n->tokens, tokens)) return n;
    ++stats_.collisions;  // same key, another prefix: the tokens (or the parent) decide
  }
  return nullptr;
}

PrefixIndex::Node* PrefixIndex::add_node_locked(const PrefixKey& key, Node* parent, std::span<const int64_t> tokens,
                                                std::vector<BlockId> blocks, bool exact) {
  auto node = std::make_unique<Node>();
  Node* n = node.get();
  n->id = next_id_++;
  n->key = key;
  n->parent = parent;
  n->tokens.assign(tokens.begin(), tokens.end());
  n->blocks = std::move(blocks);
  n->exact = exact;
  if (parent != nullptr) ++parent->children;
  lru_.push_front(n);
  n->lru = lru_.begin();
  by_id_[n->id] = n;
  nodes_.emplace(key, std::move(node));
  ++stats_.inserted_blocks;
  return n;
}

void PrefixIndex::touch_locked(Node* n) { lru_.splice(lru_.begin(), lru_, n->lru); }

void PrefixIndex::write_through_locked(const Node& n) {
  if (options_.store == nullptr) return;
  StoredPrefixBlock b;
  b.key = n.key;
  b.parent = n.parent != nullptr ? n.parent->key : options_.root;
  b.tokens = n.tokens;
  b.exact = n.exact;
  for (size_t s = 0; s < n.blocks.size(); ++s) {
    const uint8_t* data = options_.pool->data(n.blocks[s]);
    if (data == nullptr) return;  // a dry-run pool: nothing to write
    const int64_t bytes = options_.pool->class_bytes(options_.stream_classes[s]);
    b.streams.emplace_back(data, data + bytes);
  }
  if (options_.store->put(b).ok()) {
    ++stats_.store_written_blocks;
  } else {
    ++stats_.store_write_errors;  // the store reports its own details; the cache keeps working in memory
  }
}

PrefixIndex::Node* PrefixIndex::load_from_store_locked(const PrefixKey& key, Node* parent,
                                                       std::span<const int64_t> tokens, bool exact_only) {
  if (options_.store == nullptr) return nullptr;
  std::optional<StoredPrefixBlock> b = options_.store->get(key);
  if (!b) return nullptr;
  const PrefixKey parent_key = parent != nullptr ? parent->key : options_.root;
  bool valid = b->key == key && b->parent == parent_key && same_tokens(b->tokens, tokens) &&
               b->streams.size() == options_.stream_classes.size();
  for (size_t s = 0; valid && s < b->streams.size(); ++s)
    valid = static_cast<int64_t>(b->streams[s].size()) == options_.pool->class_bytes(options_.stream_classes[s]);
  if (!valid) {
    ++stats_.store_rejected_blocks;
    return nullptr;
  }
  if (exact_only && !b->exact) return nullptr;
  if (options_.byte_limit) {
    const int64_t held = static_cast<int64_t>(by_id_.size()) * node_bytes_;
    const int64_t limit = options_.byte_limit();
    if (held + node_bytes_ > limit && evict_locked(held + node_bytes_ - limit) < held + node_bytes_ - limit)
      return nullptr;  // no room in the cache budget
  }
  std::vector<BlockId> blocks;
  for (size_t s = 0; s < b->streams.size(); ++s) {
    Result<BlockId> id = options_.pool->allocate(options_.stream_classes[s]);
    if (!id.ok()) {
      for (BlockId got : blocks) (void)options_.pool->release(got);
      return nullptr;
    }
    if (uint8_t* mem = options_.pool->data(*id)) std::memcpy(mem, b->streams[s].data(), b->streams[s].size());
    blocks.push_back(*id);
  }
  ++stats_.store_loaded_blocks;
  return add_node_locked(key, parent, tokens, std::move(blocks), b->exact);
}

Result<PrefixMatch> PrefixIndex::lookup(std::span<const int64_t> tokens, const PrefixLookupOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t B = options_.tokens_per_block;
  const int64_t usable =
      std::min<int64_t>(static_cast<int64_t>(tokens.size()), std::max<int64_t>(0, options.max_tokens));
  const int64_t limit = usable / B;
  ++stats_.lookups;
  stats_.looked_up_tokens += limit * B;
  PrefixMatch m;
  m.blocks.resize(options_.stream_classes.size());
  std::vector<Node*> path;
  Node* parent = nullptr;
  for (int64_t k = 0; k < limit; ++k) {
    const auto blk = tokens.subspan(static_cast<size_t>(k * B), static_cast<size_t>(B));
    const PrefixKey key = chain(parent != nullptr ? parent->key : options_.root, blk);
    Node* n = find_locked(key, parent, blk);
    if (n == nullptr) {
      n = load_from_store_locked(key, parent, blk, options.exact_only);
      if (n != nullptr) ++m.loaded_blocks;
    }
    if (n == nullptr || (options.exact_only && !n->exact)) break;
    ++n->pins;  // also protects the path from evictions a second-tier load may make
    path.push_back(n);
    parent = n;
  }
  for (auto it = path.rbegin(); it != path.rend(); ++it) touch_locked(*it);  // ancestors most recent
  for (Node* n : path) {
    m.nodes.push_back(n->id);
    for (size_t s = 0; s < n->blocks.size(); ++s) m.blocks[s].push_back(n->blocks[s]);
    m.exact = m.exact && n->exact;
    if (!options.pin) --n->pins;
  }
  m.tokens = static_cast<int64_t>(path.size()) * B;
  if (m.tokens > 0) ++stats_.hits;
  stats_.hit_tokens += m.tokens;
  return m;
}

Result<PrefixInsertResult> PrefixIndex::insert(std::span<const int64_t> tokens,
                                               const std::vector<std::vector<BlockId>>& blocks, bool exact) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t B = options_.tokens_per_block;
  const int64_t K = static_cast<int64_t>(tokens.size()) / B;
  if (blocks.size() != options_.stream_classes.size())
    return make_error("prefix index insert: " + str(static_cast<int64_t>(blocks.size())) + " block lists for " +
                      str(static_cast<int64_t>(options_.stream_classes.size())) + " streams");
  for (size_t s = 0; s < blocks.size(); ++s) {
    if (static_cast<int64_t>(blocks[s].size()) < K)
      return make_error("prefix index insert: stream " + str(static_cast<int64_t>(s)) + " has " +
                        str(static_cast<int64_t>(blocks[s].size())) + " blocks for " + str(K) +
                        " full blocks of tokens");
    for (int64_t k = 0; k < K; ++k)
      if (options_.pool->ref_count(blocks[s][static_cast<size_t>(k)]) <= 0)
        return make_error("prefix index insert: stream " + str(static_cast<int64_t>(s)) + " block " + str(k) +
                          " (pool id " + str(blocks[s][static_cast<size_t>(k)]) + ") is not in use");
  }
  PrefixInsertResult r;
  std::vector<Node*> path;
  Node* parent = nullptr;
  for (int64_t k = 0; k < K; ++k) {
    const auto blk = tokens.subspan(static_cast<size_t>(k * B), static_cast<size_t>(B));
    const PrefixKey key = chain(parent != nullptr ? parent->key : options_.root, blk);
    std::vector<BlockId> mine;
    for (const auto& stream : blocks) mine.push_back(stream[static_cast<size_t>(k)]);
    Node* n = find_locked(key, parent, blk);
    if (n == nullptr) {
      for (BlockId id : mine) (void)options_.pool->retain(id);  // checked in use above
      n = add_node_locked(key, parent, blk, std::move(mine), exact);
      ++r.created;
      write_through_locked(*n);
    } else if (exact && !n->exact && n->blocks != mine) {
      // Upgrade: nobody but the index uses the approximate blocks (not pinned, reference count 1).
      bool unused = n->pins == 0;
      for (BlockId id : n->blocks) unused = unused && options_.pool->ref_count(id) == 1;
      if (unused) {
        for (BlockId id : mine) (void)options_.pool->retain(id);
        for (BlockId id : n->blocks) (void)options_.pool->release(id);
        n->blocks = std::move(mine);
        n->exact = true;
        ++r.upgraded;
        ++stats_.upgraded_blocks;
        write_through_locked(*n);
      }
    }
    path.push_back(n);
    parent = n;
  }
  for (auto it = path.rbegin(); it != path.rend(); ++it) touch_locked(*it);
  for (Node* n : path) r.nodes.push_back(n->id);
  return r;
}

void PrefixIndex::pin(std::span<const PrefixNodeId> ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (PrefixNodeId id : ids)
    if (auto it = by_id_.find(id); it != by_id_.end()) ++it->second->pins;
}

void PrefixIndex::unpin(std::span<const PrefixNodeId> ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (PrefixNodeId id : ids)
    if (auto it = by_id_.find(id); it != by_id_.end() && it->second->pins > 0) --it->second->pins;
}

bool PrefixIndex::evictable_locked(const Node& n) const {
  if (n.children > 0 || n.pins > 0) return false;
  for (BlockId id : n.blocks)
    if (options_.pool->ref_count(id) != 1) return false;  // a sequence still holds it: no memory to gain
  return true;
}

void PrefixIndex::remove_locked(Node* n) {
  const PrefixNodeId id = n->id;
  for (BlockId b : n->blocks) (void)options_.pool->release(b);
  if (n->parent != nullptr) --n->parent->children;
  lru_.erase(n->lru);
  by_id_.erase(id);
  auto [begin, end] = nodes_.equal_range(n->key);
  for (auto it = begin; it != end; ++it)
    if (it->second.get() == n) {
      nodes_.erase(it);
      break;
    }
  ++stats_.evicted_blocks;
  if (options_.on_remove) options_.on_remove(id);
}

int64_t PrefixIndex::evict_locked(int64_t bytes) {
  int64_t freed = 0;
  // From the LRU end towards the front; a parent whose last child goes is met later in the same pass
  // (ancestors are more recent than their descendants).
  auto it = lru_.end();
  while (it != lru_.begin() && freed < bytes) {
    auto cur = std::prev(it);
    if (evictable_locked(**cur)) {
      remove_locked(*cur);  // erases cur; `it` stays valid
      freed += node_bytes_;
    } else {
      it = cur;
    }
  }
  return freed;
}

int64_t PrefixIndex::evict(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return evict_locked(bytes);
}

void PrefixIndex::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  evict_locked(INT64_MAX);
}

int64_t PrefixIndex::evictable_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  // A node is eventually evictable unless it, or a descendant, is pinned or shared.
  std::unordered_set<const Node*> blocked;
  for (const auto& [id, n] : by_id_) {
    bool in_use = n->pins > 0;
    for (BlockId b : n->blocks) in_use = in_use || options_.pool->ref_count(b) != 1;
    if (!in_use) continue;
    for (const Node* p = n; p != nullptr && blocked.insert(p).second; p = p->parent) {
    }
  }
  return static_cast<int64_t>(by_id_.size() - blocked.size()) * node_bytes_;
}

int64_t PrefixIndex::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(by_id_.size()) * node_bytes_;
}

PrefixIndexStats PrefixIndex::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PrefixIndexStats s = stats_;
  s.nodes = static_cast<int64_t>(by_id_.size());
  s.bytes = s.nodes * node_bytes_;
  return s;
}

bool PrefixIndex::contains(PrefixNodeId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_id_.count(id) > 0;
}

bool PrefixIndex::node_exact(PrefixNodeId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  return it != by_id_.end() && it->second->exact;
}

}  // namespace cedar
