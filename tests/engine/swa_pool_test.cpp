// SwaPool (engine/swa_pool.h): restore points (largest R <= limit inside a snapshot's restorable range,
// on tokens equal to the snapshot's), registration at index nodes, layer requirements, the byte bound
// (LRU), the TTL on an injected clock, and dropping entries with their index nodes.
#include "engine/swa_pool.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace cedar::engine {
namespace {

constexpr int64_t kB = 4;

std::shared_ptr<const SequenceSnapshot> snap(int64_t length, int64_t history, int64_t layers = 2, int64_t bytes = 100) {
  auto s = std::make_shared<SequenceSnapshot>();
  s->length = length;
  s->earliest_restore = std::max<int64_t>(0, length - history);
  s->exact_layers = layers;
  s->bytes = bytes;
  return s;
}

std::vector<int64_t> seq(int64_t n, int64_t first = 10) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

struct Clock {
  double t = 0;
  std::function<double()> fn() {
    return [this] { return t; };
  }
};

TEST(SwaPoolTest, RestoresAtTheLargestPointWithinRangeAndLimit) {
  Clock clock;
  SwaPool pool({.max_bytes = 1000, .ttl_seconds = 10, .now = clock.fn()});
  const std::vector<int64_t> tokens = seq(14);
  // A snapshot at L = 14 with history 6: restores R in [8, 14]. Nodes of blocks 0..2 (boundaries 4, 8, 12).
  const std::vector<PrefixNodeId> path = {101, 102, 103};
  ASSERT_TRUE(pool.put(snap(14, 6), tokens, path, kB));

  // The request follows the snapshot to its end and beyond.
  std::vector<int64_t> longer = seq(20);
  auto r = pool.find(longer, path, kB, /*limit=*/12, /*min_layers=*/2);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->restart, 12);
  EXPECT_EQ(pool.find(longer, path, kB, 13, 2)->restart, 13);   // past the boundary: the entry's tokens decide
  EXPECT_EQ(pool.find(longer, path, kB, 100, 2)->restart, 14);  // never past the snapshot's length
  EXPECT_EQ(pool.find(longer, path, kB, 9, 2)->restart, 9);
  EXPECT_FALSE(pool.find(longer, path, kB, 7, 2).has_value());  // below earliest_restore
  // A request that diverges at position 13: R <= 13.
  std::vector<int64_t> diverging = longer;
  diverging[13] = 0;
  EXPECT_EQ(pool.find(diverging, path, kB, 100, 2)->restart, 13);
  // A request whose index match stops at block 1 (node 102, P = 8; the caller's limit is at most P).
  EXPECT_EQ(pool.find(longer, std::vector<PrefixNodeId>{101, 102}, kB, 8, 2)->restart, 8);
  // Through block 0 only: boundary 4 < earliest 8, the snapshot is not registered there.
  EXPECT_FALSE(pool.find(longer, std::vector<PrefixNodeId>{101}, kB, 100, 2).has_value());
  // Other nodes (another prefix with the same block positions): nothing.
  EXPECT_FALSE(pool.find(longer, std::vector<PrefixNodeId>{201, 202, 203}, kB, 100, 2).has_value());
  // More exact layers than the snapshot has (an exact-mode request and a ced snapshot).
  EXPECT_FALSE(pool.find(longer, path, kB, 100, 3).has_value());
  const SwaPoolStats st = pool.stats();
  EXPECT_EQ(st.entries, 1);
  EXPECT_EQ(st.bytes, 100);
  EXPECT_EQ(st.hits, 6);
  EXPECT_EQ(st.misses, 4);
}

TEST(SwaPoolTest, PicksTheBestOfSeveralSnapshots) {
  Clock clock;
  SwaPool pool({.max_bytes = 1000, .ttl_seconds = 10, .now = clock.fn()});
  const std::vector<int64_t> tokens = seq(30);
  const std::vector<PrefixNodeId> path = {1, 2, 3, 4, 5, 6, 7};
  ASSERT_TRUE(pool.put(snap(10, 8), tokens, path, kB));  // R in [2, 10], boundaries 4, 8
  ASSERT_TRUE(pool.put(snap(26, 8), tokens, path, kB));  // R in [18, 26], boundaries 20, 24
  EXPECT_EQ(pool.find(tokens, path, kB, 28, 2)->restart, 26);
  EXPECT_EQ(pool.find(tokens, path, kB, 17, 2)->restart, 10);  // the later one cannot go that low
  EXPECT_EQ(pool.find(tokens, path, kB, 22, 2)->restart, 22);
  EXPECT_FALSE(pool.find(tokens, path, kB, 1, 2).has_value());
}

TEST(SwaPoolTest, RejectsUnusableSnapshots) {
  SwaPool pool({.max_bytes = 1000, .ttl_seconds = 10, .now = {}});
  const std::vector<int64_t> tokens = seq(14);
  const std::vector<PrefixNodeId> path = {1, 2, 3};
  EXPECT_FALSE(pool.put(snap(14, 6, /*layers=*/0), tokens, path, kB));  // after an approximate replay
  EXPECT_FALSE(pool.put(snap(14, 6, 2, 5000), tokens, path, kB));       // larger than the pool
  EXPECT_FALSE(pool.put(snap(14, 1), tokens, path, kB));                // range [13, 14]: no boundary
  EXPECT_FALSE(pool.put(snap(3, 8), seq(3), {}, kB));                   // shorter than a block
  EXPECT_FALSE(pool.put(nullptr, tokens, path, kB));
  EXPECT_EQ(pool.stats().rejected, 5);
  EXPECT_EQ(pool.stats().entries, 0);
}

TEST(SwaPoolTest, ByteBoundEvictsLeastRecentlyUsed) {
  Clock clock;
  SwaPool pool({.max_bytes = 250, .ttl_seconds = 100, .now = clock.fn()});
  std::vector<std::vector<int64_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(seq(8, 100 * (i + 1)));
  const std::vector<std::vector<PrefixNodeId>> paths = {{11, 12}, {21, 22}, {31, 32}};
  ASSERT_TRUE(pool.put(snap(8, 8), prompts[0], paths[0], kB));
  ASSERT_TRUE(pool.put(snap(8, 8), prompts[1], paths[1], kB));
  ASSERT_TRUE(pool.find(prompts[0], paths[0], kB, 8, 2).has_value());  // 0 is now more recent than 1
  ASSERT_TRUE(pool.put(snap(8, 8), prompts[2], paths[2], kB));         // 300 > 250: 1 goes
  EXPECT_TRUE(pool.find(prompts[0], paths[0], kB, 8, 2).has_value());
  EXPECT_FALSE(pool.find(prompts[1], paths[1], kB, 8, 2).has_value());
  EXPECT_TRUE(pool.find(prompts[2], paths[2], kB, 8, 2).has_value());
  EXPECT_EQ(pool.stats().evicted, 1);
  EXPECT_EQ(pool.stats().bytes, 200);
}

TEST(SwaPoolTest, EntriesExpireAfterTheirTtlAndHitsRenewIt) {
  Clock clock;
  SwaPool pool({.max_bytes = 1000, .ttl_seconds = 10, .now = clock.fn()});
  const std::vector<int64_t> a = seq(8, 1), b = seq(8, 50);
  const std::vector<PrefixNodeId> pa = {1, 2}, pb = {3, 4};
  ASSERT_TRUE(pool.put(snap(8, 8), a, pa, kB));
  ASSERT_TRUE(pool.put(snap(8, 8), b, pb, kB));
  clock.t = 9;
  EXPECT_TRUE(pool.find(a, pa, kB, 8, 2).has_value());  // renews a until 19
  clock.t = 10;                                         // b's TTL is over
  EXPECT_FALSE(pool.find(b, pb, kB, 8, 2).has_value());
  EXPECT_EQ(pool.stats().expired, 1);
  clock.t = 18.5;
  EXPECT_TRUE(pool.find(a, pa, kB, 8, 2).has_value());
  clock.t = 40;
  pool.expire();
  EXPECT_EQ(pool.stats().entries, 0);
  EXPECT_EQ(pool.stats().bytes, 0);
}

TEST(SwaPoolTest, EntriesGoWithTheirLastIndexNode) {
  SwaPool pool({.max_bytes = 1000, .ttl_seconds = 10, .now = {}});
  const std::vector<int64_t> tokens = seq(12);
  const std::vector<PrefixNodeId> path = {1, 2, 3};
  ASSERT_TRUE(pool.put(snap(12, 8), tokens, path, kB));  // registered at boundaries 4, 8, 12 (nodes 1..3)
  pool.drop_node(3);
  EXPECT_EQ(pool.stats().entries, 1);
  EXPECT_EQ(pool.find(tokens, std::vector<PrefixNodeId>{1, 2}, kB, 8, 2)->restart, 8);
  pool.drop_node(2);
  pool.drop_node(1);
  EXPECT_EQ(pool.stats().entries, 0);
  EXPECT_EQ(pool.stats().dropped, 1);
  pool.drop_node(99);  // unknown: ignored
}

}  // namespace
}  // namespace cedar::engine
