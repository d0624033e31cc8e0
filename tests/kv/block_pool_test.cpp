// Paged block pool and block tables (kv/block_pool.h): allocation / reference counting / capacity,
// copy-on-write sharing of prefixes, and a random workload (arrivals, appends, forks, truncations,
// frees) checking the capacity bound, content integrity and that everything is returned at the end.
#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "model/attention_state.h"

namespace cedar {
namespace {

std::shared_ptr<BlockPool> make_pool(int64_t capacity, bool dry_run = false) {
  auto p = BlockPool::create({.capacity_bytes = capacity, .dry_run = dry_run});
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.ok() ? *p : nullptr;
}

TEST(BlockPool, AllocateReleaseAndStats) {
  auto pool = make_pool(1000);
  auto cls = pool->size_class(100);
  ASSERT_TRUE(cls.ok());
  EXPECT_EQ(*pool->size_class(100), *cls);  // same size, same class
  std::vector<BlockId> ids;
  for (int i = 0; i < 10; ++i) {
    auto id = pool->allocate(*cls);
    ASSERT_TRUE(id.ok()) << id.error().message;
    ASSERT_NE(pool->data(*id), nullptr);
    ids.push_back(*id);
  }
  EXPECT_EQ(pool->stats().used_bytes, 1000);
  auto full = pool->allocate(*cls);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.error().message.find("full"), std::string::npos) << full.error().message;
  EXPECT_EQ(pool->stats().failed_allocations, 1);
  ASSERT_TRUE(pool->release(ids[3]).ok());
  BlockPoolStats s = pool->stats();
  EXPECT_EQ(s.used_bytes, 900);
  EXPECT_EQ(s.free_bytes, 100);
  EXPECT_EQ(s.peak_used_bytes, 1000);
  auto again = pool->allocate(*cls);  // reuses the freed block
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, ids[3]);
  for (BlockId id : ids) ASSERT_TRUE(pool->release(id).ok());
  EXPECT_EQ(pool->stats().used_bytes, 0);
  EXPECT_EQ(pool->stats().used_blocks, 0);
}

TEST(BlockPool, ReferenceCountsAndMisuseAreErrors) {
  auto pool = make_pool(1 << 20);
  const int32_t cls = *pool->size_class(64);
  const BlockId id = *pool->allocate(cls);
  ASSERT_TRUE(pool->retain(id).ok());
  EXPECT_EQ(pool->ref_count(id), 2);
  ASSERT_TRUE(pool->release(id).ok());
  EXPECT_EQ(pool->stats().used_blocks, 1);
  ASSERT_TRUE(pool->release(id).ok());
  EXPECT_EQ(pool->stats().used_blocks, 0);
  const Status twice = pool->release(id);  // double free
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message.find("not in use"), std::string::npos) << twice.error().message;
  EXPECT_FALSE(pool->retain(id).ok());
  EXPECT_FALSE(pool->release(12345).ok());
  EXPECT_FALSE(pool->allocate(7).ok());            // unknown class
  EXPECT_FALSE(pool->size_class(0).ok());
  EXPECT_FALSE(pool->size_class((1 << 20) + 1).ok());  // larger than the capacity
  EXPECT_FALSE(BlockPool::create({.capacity_bytes = 0}).ok());
}

TEST(BlockPool, FreeBlocksOfOtherClassesGiveMemoryBack) {
  auto pool = make_pool(1000);
  const int32_t a = *pool->size_class(200), b = *pool->size_class(300);
  std::vector<BlockId> as;
  for (int i = 0; i < 5; ++i) as.push_back(*pool->allocate(a));
  EXPECT_FALSE(pool->allocate(b).ok());
  for (BlockId id : as) ASSERT_TRUE(pool->release(id).ok());
  EXPECT_EQ(pool->stats().free_bytes, 1000);  // kept for class a ...
  std::vector<BlockId> bs;
  for (int i = 0; i < 3; ++i) {
    auto id = pool->allocate(b);  // ... until class b needs it
    ASSERT_TRUE(id.ok()) << id.error().message;
    bs.push_back(*id);
  }
  const BlockPoolStats s = pool->stats();
  EXPECT_EQ(s.used_bytes, 900);
  EXPECT_LE(s.used_bytes + s.free_bytes, 1000);
  for (BlockId id : bs) ASSERT_TRUE(pool->release(id).ok());
}

TEST(BlockPool, DryRunCountsWithoutMemory) {
  auto pool = make_pool(INT64_MAX, /*dry_run=*/true);
  auto t = BlockTable::create(pool, 288, 32);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(t->ensure(1'000'000).ok());
  EXPECT_EQ(t->blocks(), 31250);
  EXPECT_EQ(pool->stats().used_bytes, 31250 * 32 * 288);
  EXPECT_EQ(pool->data(t->block_id(0)), nullptr);
  t->clear();
  EXPECT_EQ(pool->stats().used_bytes, 0);
}

TEST(BlockTable, CopiesShareBlocksAndCopyOnWrite) {
  auto pool = make_pool(1 << 20);
  auto a = BlockTable::create(pool, 4, 2);  // two 4-byte records per block
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->ensure(3).ok());
  for (int64_t j = 0; j < 3; ++j) **a->writable(j) = static_cast<uint8_t>(10 + j);
  EXPECT_EQ(pool->stats().used_blocks, 2);
  {
    BlockTable b = *a;  // prefix sharing: no new blocks
    EXPECT_EQ(pool->stats().used_blocks, 2);
    EXPECT_EQ(pool->ref_count(b.block_id(1)), 2);
    ASSERT_TRUE(b.ensure(4).ok());
    **b.writable(3) = 99;  // block 1 is shared: b gets its own copy
    EXPECT_EQ(pool->stats().used_blocks, 3);
    EXPECT_EQ(*b.record(2), 12);  // copied content
    EXPECT_EQ(*a->record(2), 12);
    **b.writable(2) = 77;
    EXPECT_EQ(*a->record(2), 12);  // a unchanged
    EXPECT_EQ(b.block_id(0), a->block_id(0));
  }
  EXPECT_EQ(pool->stats().used_blocks, 2);
  a->shrink(1);
  EXPECT_EQ(pool->stats().used_blocks, 1);
  BlockTable moved = std::move(*a);
  EXPECT_EQ(moved.blocks(), 1);
  moved.clear();
  EXPECT_EQ(pool->stats().used_bytes, 0);
}

TEST(BlockTable, FailedGrowthLeavesTheTableAsItWas) {
  auto pool = make_pool(3 * 64);
  auto t = BlockTable::create(pool, 8, 8);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(t->ensure(8).ok());
  const Status s = t->ensure(100);  // needs 13 blocks, 3 fit
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(t->blocks(), 1);
  EXPECT_EQ(pool->stats().used_blocks, 1);
}

// Random workload over one shared bounded pool: sequences arrive, append entries (raw-f32 records
// holding known values), fork (copy = shared prefix), truncate and finish. After every step the pool
// stays within its capacity and its used bytes equal the distinct blocks all live sequences hold;
// every sequence reads back exactly what was appended to it. At the end the pool holds nothing.
TEST(BlockPool, RandomWorkloadStaysBoundedAndReturnsEverything) {
  constexpr int64_t kWidth = 8, kPerBlock = 4, kCapacity = 48 * kPerBlock * kWidth * 4;  // 48 blocks
  auto pool = make_pool(kCapacity);
  const auto format = KvRecordFormat::raw_f32(kWidth);
  struct Seq {
    KvEntries kv;
    std::vector<float> tag;  // first value of each entry (the rest follow from it)
  };
  std::map<int, Seq> live;
  std::mt19937 rng(2024);
  int next_id = 0, failures = 0;
  auto value = [](float tag, int64_t c) { return tag + static_cast<float>(c) * 0.125f; };
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 2 || live.empty()) {  // arrival
      auto kv = KvEntries::create({.format = format, .entries_per_block = kPerBlock, .pool = pool});
      ASSERT_TRUE(kv.ok()) << kv.error().message;
      live[next_id++] = Seq{std::move(*kv), {}};
      continue;
    }
    auto it = live.begin();
    std::advance(it, static_cast<long>(rng() % live.size()));
    Seq& s = it->second;
    if (op < 6) {  // append a few entries; a full pool refuses (an error, not an abort)
      const int64_t n = 1 + static_cast<int64_t>(rng() % 9);
      for (int64_t i = 0; i < n; ++i) {
        const float tag = static_cast<float>(rng() % 100000);
        std::vector<float> e(kWidth);
        for (int64_t c = 0; c < kWidth; ++c) e[c] = value(tag, c);
        const Status st = s.kv.append(e, s.kv.size());
        if (!st.ok()) {
          ++failures;
          ASSERT_NE(st.error().message.find("full"), std::string::npos) << st.error().message;
          break;
        }
        s.tag.push_back(tag);
      }
    } else if (op < 7) {  // fork: the new sequence shares the prefix
      Seq copy = s;
      const int64_t keep = copy.kv.size() == 0 ? 0 : static_cast<int64_t>(rng() % (copy.kv.size() + 1));
      copy.kv.truncate(keep);
      copy.tag.resize(static_cast<size_t>(keep));
      live[next_id++] = std::move(copy);
    } else if (op < 8) {  // rollback
      const int64_t keep = s.kv.size() == 0 ? 0 : static_cast<int64_t>(rng() % (s.kv.size() + 1));
      s.kv.truncate(keep);
      s.tag.resize(static_cast<size_t>(keep));
    } else {  // finished
      live.erase(it);
    }
    // Invariants.
    const BlockPoolStats st = pool->stats();
    ASSERT_LE(st.used_bytes + st.free_bytes, kCapacity) << "step " << step;
    std::set<BlockId> held;
    for (const auto& [id, q] : live)
      for (int64_t b = 0; b < q.kv.blocks().blocks(); ++b) held.insert(q.kv.blocks().block_id(b));
    ASSERT_EQ(st.used_blocks, static_cast<int64_t>(held.size())) << "step " << step;
    ASSERT_EQ(st.used_bytes, static_cast<int64_t>(held.size()) * kPerBlock * kWidth * 4) << "step " << step;
    if (step % 50 == 0)
      for (const auto& [id, q] : live) {
        ASSERT_EQ(q.kv.size(), static_cast<int64_t>(q.tag.size()));
        for (int64_t j = 0; j < q.kv.size(); ++j) {
          const std::vector<float> e = q.kv.decoded(j);
          for (int64_t c = 0; c < kWidth; ++c)
            ASSERT_EQ(e[c], value(q.tag[static_cast<size_t>(j)], c)) << "seq " << id << " entry " << j;
        }
      }
  }
  EXPECT_GT(failures, 0) << "test too weak: the pool never filled up";
  EXPECT_GT(pool->stats().peak_used_bytes, kCapacity / 2);
  live.clear();
  const BlockPoolStats end = pool->stats();
  EXPECT_EQ(end.used_bytes, 0);
  EXPECT_EQ(end.used_blocks, 0);
}

}  // namespace
}  // namespace cedar
