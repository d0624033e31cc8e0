// PrefixIndex (kv/prefix_index.h): hits and misses, hash collisions decided by tokens and parents,
// block boundaries of ratio-1 / ratio-2 streams at odd lengths (block contents checked against the
// positions written into them), LRU eviction under memory pressure with pinned and shared nodes, prefixes
// shared by several live sequences (pool reference counts), exact vs approximate nodes, and the second
// tier through an in-memory PrefixBlockStore (write-through, loads, garbage treated as a miss).
#include "kv/prefix_index.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "kv/kv_layout.h"

namespace cedar {
namespace {

constexpr int64_t kB = 4;  // tokens per block

// Two streams like V4.1's sources: ratio 2 (2 entries of 8 B per block) and ratio 1 (4 entries of 8 B).
struct StreamDef {
  int64_t ratio, record_bytes;
};
const std::vector<StreamDef> kStreams = {{2, 8}, {1, 8}};

// A stand-in for a sequence's global KV: one BlockTable per stream, record j of a ratio-r stream holding
// the position j·r of the token it belongs to and that token (so the test can see which prefix a block
// came from).
struct FakeSequence {
  std::vector<BlockTable> tables;
  std::vector<int64_t> tokens;

  static FakeSequence make(const std::shared_ptr<BlockPool>& pool, std::vector<int64_t> tokens) {
    FakeSequence s;
    s.tokens = std::move(tokens);
    const auto n = static_cast<int64_t>(s.tokens.size());
    for (const StreamDef& d : kStreams) {
      auto epb = kv_entries_per_block(d.ratio, kB);
      EXPECT_TRUE(epb.ok());
      auto t = BlockTable::create(pool, d.record_bytes, *epb);
      EXPECT_TRUE(t.ok()) << t.error().message;
      const int64_t entries = n / d.ratio;
      EXPECT_TRUE(t->ensure(entries).ok());
      for (int64_t j = 0; j < entries; ++j) {
        auto rec = t->writable(j);
        EXPECT_TRUE(rec.ok());
        const int32_t v[2] = {static_cast<int32_t>(j * d.ratio), static_cast<int32_t>(s.tokens[j * d.ratio])};
        std::memcpy(*rec, v, static_cast<size_t>(std::min<int64_t>(d.record_bytes, 8)));
      }
      s.tables.push_back(std::move(*t));
    }
    return s;
  }
  std::vector<std::vector<BlockId>> blocks() const {
    std::vector<std::vector<BlockId>> out;
    for (const BlockTable& t : tables) {
      out.emplace_back();
      for (int64_t b = 0; b < t.blocks(); ++b) out.back().push_back(t.block_id(b));
    }
    return out;
  }
};

struct Fixture {
  std::shared_ptr<BlockPool> pool;
  std::vector<int32_t> classes;
  std::unique_ptr<PrefixIndex> index;

  explicit Fixture(int64_t capacity = 1 << 20, PrefixBlockStore* store = nullptr,
                   std::function<PrefixKey(const PrefixKey&, std::span<const int64_t>)> chain = {}) {
    pool = *BlockPool::create({.capacity_bytes = capacity});
    for (const StreamDef& d : kStreams) classes.push_back(*pool->size_class(d.record_bytes * (kB / d.ratio)));
    PrefixIndexOptions o;
    o.tokens_per_block = kB;
    o.root = prefix_root("test-model", "test-layout");
    o.pool = pool;
    o.stream_classes = classes;
    o.store = store;
    o.chain = std::move(chain);
    auto idx = PrefixIndex::create(std::move(o));
    EXPECT_TRUE(idx.ok()) << idx.error().message;
    index = std::move(*idx);
  }
};

// The position and token stored in record i of block `id` of stream `s`.
std::pair<int32_t, int32_t> record_of(BlockPool& pool, int s, BlockId id, int64_t i) {
  const uint8_t* base = pool.data(id) + i * kStreams[static_cast<size_t>(s)].record_bytes;
  int32_t v[2] = {0, 0};
  std::memcpy(v, base, static_cast<size_t>(std::min<int64_t>(kStreams[static_cast<size_t>(s)].record_bytes, 8)));
  return {v[0], v[1]};
}

std::vector<int64_t> seq(int64_t first, int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

TEST(PrefixIndexTest, HitsTheLongestFullBlockPrefixAndMissesOtherwise) {
  Fixture f;
  const FakeSequence a = FakeSequence::make(f.pool, seq(100, 10));  // 2 full blocks + 2 tokens
  auto ins = f.index->insert(a.tokens, a.blocks(), true);
  ASSERT_TRUE(ins.ok()) << ins.error().message;
  EXPECT_EQ(ins->created, 2);
  EXPECT_EQ(ins->nodes.size(), 2u);
  EXPECT_EQ(f.index->stats().nodes, 2);
  EXPECT_EQ(f.index->held_bytes(), 2 * f.index->node_bytes());
  EXPECT_EQ(f.index->node_bytes(), 16 + 32);

  auto same = f.index->lookup(a.tokens, {.pin = false});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->tokens, 8);
  ASSERT_EQ(same->blocks.size(), 2u);
  for (size_t s = 0; s < 2; ++s)
    for (int k = 0; k < 2; ++k) EXPECT_EQ(same->blocks[s][static_cast<size_t>(k)], a.tables[s].block_id(k));

  std::vector<int64_t> other = a.tokens;
  other[5] = 7;  // differs in block 1
  EXPECT_EQ(f.index->lookup(other, {.pin = false})->tokens, 4);
  other[0] = 7;  // and in block 0
  EXPECT_EQ(f.index->lookup(other, {.pin = false})->tokens, 0);
  EXPECT_EQ(f.index->lookup(seq(100, 7), {.pin = false})->tokens, 4);   // one full block offered
  EXPECT_EQ(f.index->lookup(seq(100, 3), {.pin = false})->tokens, 0);   // none
  EXPECT_EQ(f.index->lookup(seq(100, 20), {.pin = false})->tokens, 8);  // longer than the cached prefix
  EXPECT_EQ(f.index->lookup(a.tokens, {.max_tokens = 7, .pin = false})->tokens, 4);
  EXPECT_EQ(f.index->lookup(a.tokens, {.max_tokens = 0, .pin = false})->tokens, 0);
  const PrefixIndexStats st = f.index->stats();
  EXPECT_EQ(st.lookups, 8);
  EXPECT_EQ(st.hits, 5);
  EXPECT_EQ(st.hit_tokens, 8 + 4 + 4 + 8 + 4);
  EXPECT_EQ(st.looked_up_tokens, 8 + 8 + 8 + 4 + 0 + 20 + 4 + 0);

  // Inserting the same prefix again keeps the existing nodes (and their blocks).
  const FakeSequence b = FakeSequence::make(f.pool, seq(100, 12));
  auto again = f.index->insert(b.tokens, b.blocks(), true);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->created, 1);  // only block 2 is new
  EXPECT_EQ(again->nodes[0], ins->nodes[0]);
  EXPECT_EQ(again->nodes[1], ins->nodes[1]);
  auto m = f.index->lookup(b.tokens, {.pin = false});
  EXPECT_EQ(m->tokens, 12);
  EXPECT_EQ(m->blocks[0][0], a.tables[0].block_id(0));
  EXPECT_EQ(m->blocks[0][2], b.tables[0].block_id(2));
}

TEST(PrefixIndexTest, RejectsMalformedInserts) {
  Fixture f;
  const FakeSequence a = FakeSequence::make(f.pool, seq(1, 8));
  auto blocks = a.blocks();
  EXPECT_FALSE(f.index->insert(a.tokens, {blocks[0]}, true).ok());  // one stream missing
  auto short_blocks = blocks;
  short_blocks[1].pop_back();
  EXPECT_FALSE(f.index->insert(a.tokens, short_blocks, true).ok());
  auto freed = blocks;
  freed[1][0] = 12345;  // not a block in use
  auto r = f.index->insert(a.tokens, freed, true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("not in use"), std::string::npos) << r.error().message;
  EXPECT_EQ(f.index->stats().nodes, 0);  // nothing inserted on error
  PrefixIndexOptions bad;
  EXPECT_FALSE(PrefixIndex::create(bad).ok());
}

// Every key collides (a degenerate chain): the parent node and the tokens alone must decide.
TEST(PrefixIndexTest, CollidingKeysAreResolvedByTokensAndParents) {
  Fixture f(1 << 20, nullptr, [](const PrefixKey&, std::span<const int64_t>) { return PrefixKey{1, 1}; });
  const FakeSequence a = FakeSequence::make(f.pool, {1, 2, 3, 4, 5, 6, 7, 8});
  const FakeSequence b = FakeSequence::make(f.pool, {9, 9, 9, 9, 5, 6, 7, 8});  // same block 1, other parent
  const FakeSequence c = FakeSequence::make(f.pool, {1, 2, 3, 4, 8, 7, 6, 5});  // same block 0, other block 1
  for (const FakeSequence* s : {&a, &b, &c}) {
    auto r = f.index->insert(s->tokens, s->blocks(), true);
    ASSERT_TRUE(r.ok());
  }
  EXPECT_EQ(f.index->stats().nodes, 5);  // a0 (= c0), a1, b0, b1, c1
  for (const FakeSequence* s : {&a, &b, &c}) {
    auto m = f.index->lookup(s->tokens, {.pin = false});
    ASSERT_EQ(m->tokens, 8);
    for (int k = 0; k < 2; ++k)
      for (int i = 0; i < 4; ++i) {
        // The ratio-1 stream's record i of block k belongs to position 4k+i and holds that token.
        auto [pos, tok] = record_of(*f.pool, 1, m->blocks[1][static_cast<size_t>(k)], i);
        EXPECT_EQ(pos, 4 * k + i);
        EXPECT_EQ(tok, s->tokens[static_cast<size_t>(4 * k + i)]);
      }
  }
  EXPECT_EQ(f.index->lookup(std::vector<int64_t>{9, 9, 9, 9, 8, 7, 6, 5}, {.pin = false})->tokens, 4);
  EXPECT_EQ(f.index->lookup(std::vector<int64_t>{5, 6, 7, 8}, {.pin = false})->tokens, 0);  // b1's tokens, no parent
  EXPECT_GT(f.index->stats().collisions, 0);
}

// Ratio-2 and ratio-1 streams: a block covers positions [kB, (k+1)B) of both (B/2 and B records), so no
// ratio-2 group straddles a boundary; odd lengths leave their partial block out of the index.
TEST(PrefixIndexTest, BlocksOfRatio2StreamsEndOnBlockBoundariesAtOddLengths) {
  for (int64_t n : {1, 3, 4, 5, 7, 9, 11, 13}) {
    Fixture f;
    std::vector<int64_t> tokens;
    for (int64_t i = 0; i < n; ++i) tokens.push_back(1000 + 7 * i);
    const FakeSequence s = FakeSequence::make(f.pool, tokens);
    auto r = f.index->insert(s.tokens, s.blocks(), true);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->created, n / kB) << n;
    auto m = f.index->lookup(tokens, {.pin = false});
    ASSERT_EQ(m->tokens, n / kB * kB) << n;
    for (int64_t k = 0; k < n / kB; ++k) {
      for (int64_t i = 0; i < kB / 2; ++i) {  // ratio 2: records at positions kB + 2i
        auto [pos, tok] = record_of(*f.pool, 0, m->blocks[0][static_cast<size_t>(k)], i);
        EXPECT_EQ(pos, k * kB + 2 * i) << n;
        EXPECT_EQ(tok, tokens[static_cast<size_t>(k * kB + 2 * i)]) << n;
      }
      for (int64_t i = 0; i < kB; ++i) {
        auto [pos, tok] = record_of(*f.pool, 1, m->blocks[1][static_cast<size_t>(k)], i);
        EXPECT_EQ(pos, k * kB + i) << n;
      }
    }
    // A prompt one token longer than the cached prefix, odd: the same full blocks.
    tokens.push_back(5);
    EXPECT_EQ(f.index->lookup(tokens, {.pin = false})->tokens, n / kB * kB) << n;
  }
}

TEST(PrefixIndexTest, EvictsLeastRecentlyUsedUnusedLeavesNeverPinnedOrSharedOnes) {
  Fixture f;
  const int64_t nb = f.index->node_bytes();
  // Four independent 2-block prefixes, inserted in order p0..p3; the sequences are then dropped, so the
  // index alone holds the blocks.
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::vector<PrefixNodeId>> paths;
  for (int p = 0; p < 4; ++p) {
    prompts.push_back(seq(100 * (p + 1), 8));
    FakeSequence s = FakeSequence::make(f.pool, prompts.back());
    paths.push_back(f.index->insert(s.tokens, s.blocks(), true)->nodes);
  }
  const int64_t used_before = f.pool->stats().used_bytes;
  EXPECT_EQ(used_before, 8 * nb);
  EXPECT_EQ(f.index->evictable_bytes(), 8 * nb);
  // p0 becomes the most recent; p1 is pinned (a live lookup); p2 is shared with a live sequence.
  ASSERT_EQ(f.index->lookup(prompts[0], {.pin = false})->tokens, 8);
  auto pinned = f.index->lookup(prompts[1]);
  ASSERT_EQ(pinned->tokens, 8);
  auto shared = f.index->lookup(prompts[2], {.pin = false});
  for (const auto& stream : shared->blocks) ASSERT_TRUE(f.pool->retain(stream[1]).ok());  // holds block 1 only
  EXPECT_EQ(f.index->evictable_bytes(), 2 * nb + 2 * nb);  // p3 and p0 (p2's nodes are blocked by the share)

  // Memory pressure for one node: p3's leaf goes first (least recent, unused), then its parent.
  EXPECT_EQ(f.index->evict(1), nb);
  EXPECT_FALSE(f.index->contains(paths[3][1]));
  EXPECT_TRUE(f.index->contains(paths[3][0]));
  EXPECT_EQ(f.pool->stats().used_bytes, used_before - nb);  // the index was the last holder
  EXPECT_EQ(f.index->evict(nb), nb);
  EXPECT_FALSE(f.index->contains(paths[3][0]));
  // Everything else that can go: only p0.
  EXPECT_EQ(f.index->evict(INT64_MAX), 2 * nb);
  EXPECT_FALSE(f.index->contains(paths[0][0]));
  for (PrefixNodeId id : paths[1]) EXPECT_TRUE(f.index->contains(id));  // pinned
  for (PrefixNodeId id : paths[2]) EXPECT_TRUE(f.index->contains(id));  // shared leaf, and its parent
  EXPECT_EQ(f.index->evictable_bytes(), 0);
  EXPECT_EQ(f.index->stats().evicted_blocks, 4);

  f.index->unpin(pinned->nodes);
  for (const auto& stream : shared->blocks) ASSERT_TRUE(f.pool->release(stream[1]).ok());
  EXPECT_EQ(f.index->evictable_bytes(), 4 * nb);
  f.index->clear();
  EXPECT_EQ(f.index->stats().nodes, 0);
  EXPECT_EQ(f.pool->stats().used_bytes, 0);
}

// A random workload under a pool capacity: inserts that need room evict LRU leaves first; the pool
// never exceeds its capacity, every block the index reports is in use, and pinned paths survive.
TEST(PrefixIndexTest, RandomWorkloadUnderMemoryPressureKeepsPinnedPathsAndFreesEverything) {
  std::mt19937_64 rng(11);
  const int64_t capacity = 48 * 48;  // 48 nodes
  Fixture f(capacity);
  std::vector<std::pair<std::vector<int64_t>, PrefixMatch>> live;  // pinned lookups
  for (int it = 0; it < 400; ++it) {
    std::vector<int64_t> tokens;
    const int64_t n = 1 + static_cast<int64_t>(rng() % 24);
    const int64_t family = static_cast<int64_t>(rng() % 6);  // shared first blocks within a family
    for (int64_t i = 0; i < n; ++i) tokens.push_back(i < 8 ? family * 10 + i : static_cast<int64_t>(rng() % 5));
    const int op = static_cast<int>(rng() % 4);
    if (op == 0 && live.size() < 4) {
      auto m = f.index->lookup(tokens);
      live.emplace_back(tokens, std::move(*m));
    } else if (op == 1 && !live.empty()) {
      const size_t i = rng() % live.size();
      f.index->unpin(live[i].second.nodes);
      live.erase(live.begin() + static_cast<long>(i));
    } else {
      // Make room the way the cache budget does, then insert a sequence's blocks.
      const int64_t need = (n + kB - 1) / kB * f.index->node_bytes() + 64;
      const BlockPoolStats st = f.pool->stats();
      if (st.used_bytes + need > capacity) f.index->evict(st.used_bytes + need - capacity);
      if (f.pool->stats().used_bytes + need > capacity) continue;
      FakeSequence s = FakeSequence::make(f.pool, tokens);
      ASSERT_TRUE(f.index->insert(s.tokens, s.blocks(), true).ok());
    }
    EXPECT_LE(f.pool->stats().used_bytes, capacity);
    for (const auto& [tokens_of, m] : live)
      for (PrefixNodeId id : m.nodes) ASSERT_TRUE(f.index->contains(id)) << "pinned node evicted";
    // With every sequence gone, the pool holds exactly the index's blocks.
    EXPECT_EQ(f.pool->stats().used_bytes, f.index->held_bytes());
  }
  EXPECT_GT(f.index->stats().evicted_blocks, 0);
  for (auto& [t, m] : live) f.index->unpin(m.nodes);
  f.index->clear();
  EXPECT_EQ(f.pool->stats().used_bytes, 0);
}

TEST(PrefixIndexTest, ConcurrentSequencesShareAPrefixByReferenceCount) {
  Fixture f;
  const std::vector<int64_t> system = seq(50, 8);
  {
    FakeSequence first = FakeSequence::make(f.pool, system);
    ASSERT_TRUE(f.index->insert(first.tokens, first.blocks(), true).ok());
    for (const BlockTable& t : first.tables) EXPECT_EQ(f.pool->ref_count(t.block_id(0)), 2);  // sequence + index
  }
  auto m = f.index->lookup(system, {.pin = false});
  ASSERT_EQ(m->tokens, 8);
  const BlockId b0 = m->blocks[1][0];
  EXPECT_EQ(f.pool->ref_count(b0), 1);  // the index alone
  // Three live sequences resume from it (each retains the blocks, as a resumed block table does).
  std::vector<PrefixMatch> users;
  for (int i = 0; i < 3; ++i) {
    auto u = f.index->lookup(system);
    for (const auto& stream : u->blocks)
      for (BlockId id : stream) ASSERT_TRUE(f.pool->retain(id).ok());
    users.push_back(std::move(*u));
  }
  EXPECT_EQ(f.pool->ref_count(b0), 4);
  EXPECT_EQ(f.index->evict(INT64_MAX), 0);  // in use
  const int64_t used = f.pool->stats().used_bytes;
  EXPECT_EQ(used, 2 * f.index->node_bytes());  // one copy, however many users
  for (auto& u : users) {
    for (const auto& stream : u.blocks)
      for (BlockId id : stream) ASSERT_TRUE(f.pool->release(id).ok());
    f.index->unpin(u.nodes);
  }
  EXPECT_EQ(f.pool->ref_count(b0), 1);
  EXPECT_EQ(f.index->evict(INT64_MAX), 2 * f.index->node_bytes());
  EXPECT_EQ(f.pool->stats().used_bytes, 0);

  // The same from several threads at once: lookups, pins and inserts of overlapping prompts.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        std::vector<int64_t> tokens = system;
        tokens.push_back(t);
        tokens.push_back(i % 3);
        tokens.push_back(1);
        tokens.push_back(2);
        auto got = f.index->lookup(tokens);
        ASSERT_TRUE(got.ok());
        FakeSequence s = FakeSequence::make(f.pool, tokens);
        ASSERT_TRUE(f.index->insert(s.tokens, s.blocks(), true).ok());
        f.index->unpin(got->nodes);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(f.index->stats().nodes, 2 + 4 * 3);  // the two system blocks, one per (thread, i % 3)
  EXPECT_EQ(f.pool->stats().used_bytes, f.index->held_bytes());
}

TEST(PrefixIndexTest, ExactLookupsFollowExactNodesAndExactInsertsUpgrade) {
  Fixture f;
  const std::vector<int64_t> tokens = seq(7, 12);
  FakeSequence approx = FakeSequence::make(f.pool, tokens);
  ASSERT_TRUE(f.index->insert(approx.tokens, approx.blocks(), false).ok());
  auto any = f.index->lookup(tokens, {.pin = false});
  EXPECT_EQ(any->tokens, 12);
  EXPECT_FALSE(any->exact);
  EXPECT_EQ(f.index->lookup(tokens, {.exact_only = true, .pin = false})->tokens, 0);

  // An exact sequence of the first 8 tokens: the approximate nodes are still held by `approx` (its
  // blocks have reference count 2), so no upgrade yet.
  FakeSequence exact = FakeSequence::make(f.pool, seq(7, 8));
  auto r = f.index->insert(exact.tokens, exact.blocks(), true);
  EXPECT_EQ(r->upgraded, 0);
  approx = FakeSequence{};                // the approximate sequence ends
  auto pinned = f.index->lookup(tokens);  // and a lookup pins the path: still no upgrade
  EXPECT_EQ(f.index->insert(exact.tokens, exact.blocks(), true)->upgraded, 0);
  f.index->unpin(pinned->nodes);
  r = f.index->insert(exact.tokens, exact.blocks(), true);
  EXPECT_EQ(r->upgraded, 2);
  EXPECT_EQ(r->adopted(), 2);
  auto m = f.index->lookup(tokens, {.exact_only = true, .pin = false});
  EXPECT_EQ(m->tokens, 8);  // the third node stays approximate
  EXPECT_TRUE(m->exact);
  EXPECT_EQ(m->blocks[0][1], exact.tables[0].block_id(1));
  EXPECT_EQ(f.index->lookup(tokens, {.pin = false})->tokens, 12);
  // The replaced approximate blocks went back to the pool: 3 nodes + exact's own partial-free tables.
  EXPECT_EQ(f.pool->stats().used_bytes, f.index->held_bytes());
  // An approximate insert never downgrades an exact node.
  FakeSequence approx2 = FakeSequence::make(f.pool, seq(7, 8));
  ASSERT_TRUE(f.index->insert(approx2.tokens, approx2.blocks(), false).ok());
  EXPECT_TRUE(f.index->node_exact(m->nodes[0]));
  EXPECT_EQ(f.index->stats().upgraded_blocks, 2);
}

// An in-memory second tier. `corrupt` rewrites what get() returns.
class MemoryStore final : public PrefixBlockStore {
 public:
  Status put(const StoredPrefixBlock& b) override {
    blocks_[b.key] = b;
    ++puts;
    return Status::Ok();
  }
  std::optional<StoredPrefixBlock> get(const PrefixKey& key) override {
    ++gets;
    auto it = blocks_.find(key);
    if (it == blocks_.end()) return std::nullopt;
    StoredPrefixBlock b = it->second;
    if (corrupt) corrupt(b);
    return b;
  }
  bool contains(const PrefixKey& key) const override { return blocks_.count(key) > 0; }
  std::function<void(StoredPrefixBlock&)> corrupt;
  int64_t puts = 0, gets = 0;

 private:
  std::map<PrefixKey, StoredPrefixBlock> blocks_;
};

TEST(PrefixIndexTest, SecondTierIsWrittenThroughAndLoadedOnAMemoryMiss) {
  MemoryStore store;
  const std::vector<int64_t> tokens = seq(300, 9);
  {
    Fixture writer(1 << 20, &store);
    FakeSequence s = FakeSequence::make(writer.pool, tokens);
    ASSERT_TRUE(writer.index->insert(s.tokens, s.blocks(), true).ok());
    EXPECT_EQ(store.puts, 2);
    EXPECT_EQ(writer.index->stats().store_written_blocks, 2);
  }
  // A fresh index over a fresh pool (a restart): the blocks come back from the store.
  Fixture reader(1 << 20, &store);
  auto m = reader.index->lookup(tokens, {.pin = false});
  ASSERT_EQ(m->tokens, 8);
  EXPECT_EQ(m->loaded_blocks, 2);
  EXPECT_EQ(reader.index->stats().store_loaded_blocks, 2);
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 4; ++i) {
      auto [pos, tok] = record_of(*reader.pool, 1, m->blocks[1][static_cast<size_t>(k)], i);
      EXPECT_EQ(pos, 4 * k + i);
      EXPECT_EQ(tok, tokens[static_cast<size_t>(4 * k + i)]);
    }
  for (int i = 0; i < 2; ++i) EXPECT_EQ(record_of(*reader.pool, 0, m->blocks[0][1], i).first, 4 + 2 * i);
  // Now in memory: no further store reads for this prefix.
  const int64_t gets = store.gets;
  EXPECT_EQ(reader.index->lookup(tokens, {.pin = false})->tokens, 8);
  EXPECT_EQ(store.gets, gets);
  EXPECT_EQ(reader.pool->stats().used_bytes, reader.index->held_bytes());
  // A prefix the store does not have: a miss, no crash.
  EXPECT_EQ(reader.index->lookup(seq(1, 8), {.pin = false})->tokens, 0);
}

TEST(PrefixIndexTest, GarbageFromTheSecondTierIsAMiss) {
  MemoryStore store;
  const std::vector<int64_t> tokens = seq(300, 8);
  {
    Fixture writer(1 << 20, &store);
    FakeSequence s = FakeSequence::make(writer.pool, tokens);
    ASSERT_TRUE(writer.index->insert(s.tokens, s.blocks(), false).ok());  // approximate blocks
  }
  const std::vector<std::pair<const char*, std::function<void(StoredPrefixBlock&)>>> damages = {
      {"wrong key", [](StoredPrefixBlock& b) { b.key.lo ^= 1; }},
      {"wrong parent", [](StoredPrefixBlock& b) { b.parent.hi ^= 1; }},
      {"wrong tokens", [](StoredPrefixBlock& b) { b.tokens[2] += 1; }},
      {"too few tokens", [](StoredPrefixBlock& b) { b.tokens.pop_back(); }},
      {"missing stream", [](StoredPrefixBlock& b) { b.streams.pop_back(); }},
      {"truncated stream", [](StoredPrefixBlock& b) { b.streams[1].resize(3); }},
      {"oversized stream", [](StoredPrefixBlock& b) { b.streams[0].resize(1000); }},
  };
  for (const auto& [name, damage] : damages) {
    store.corrupt = damage;
    Fixture reader(1 << 20, &store);
    auto m = reader.index->lookup(tokens, {.pin = false});
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->tokens, 0) << name;
    EXPECT_EQ(reader.index->stats().store_rejected_blocks, 1) << name;
    EXPECT_EQ(reader.pool->stats().used_bytes, 0) << name;
  }
  store.corrupt = nullptr;
  Fixture reader(1 << 20, &store);
  EXPECT_EQ(reader.index->lookup(tokens, {.exact_only = true, .pin = false})->tokens, 0);  // approximate
  auto m = reader.index->lookup(tokens, {.pin = false});
  EXPECT_EQ(m->tokens, 8);
  EXPECT_FALSE(m->exact);
}

TEST(PrefixIndexTest, SecondTierLoadsRespectTheByteLimit) {
  MemoryStore store;
  const std::vector<int64_t> tokens = seq(300, 16);
  {
    Fixture writer(1 << 20, &store);
    FakeSequence s = FakeSequence::make(writer.pool, tokens);
    ASSERT_TRUE(writer.index->insert(s.tokens, s.blocks(), true).ok());
  }
  auto pool = *BlockPool::create({.capacity_bytes = 1 << 20});
  PrefixIndexOptions o;
  o.tokens_per_block = kB;
  o.root = prefix_root("test-model", "test-layout");
  o.pool = pool;
  for (const StreamDef& d : kStreams) o.stream_classes.push_back(*pool->size_class(d.record_bytes * (kB / d.ratio)));
  o.store = &store;
  o.byte_limit = [] { return int64_t{2 * 48}; };  // room for two nodes
  auto created = PrefixIndex::create(std::move(o));
  ASSERT_TRUE(created.ok());
  std::unique_ptr<PrefixIndex> index = std::move(*created);
  auto m = index->lookup(tokens, {.pin = true});
  EXPECT_EQ(m->tokens, 8);  // the path pins itself, so the third load finds no room
  EXPECT_EQ(index->held_bytes(), 96);
  index->unpin(m->nodes);
}

}  // namespace
}  // namespace cedar
