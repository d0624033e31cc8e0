// PoolCacheBudget: its page-rounded accounting equals what the kv layer's dry-run measurement allocates
// (kv/kv_layout.h measure_kv_bytes, an independent path through BlockTable/BlockPool), and under a
// random workload through the Engine on the tiny DeepSeek-V4.1 checkpoint, with the sequences'
// global KV allocated in the budget's shared pool: the pool never holds more than the budget accounts,
// no forward fails (the budget preempts before the pool is full), the pool is empty at the end, and
// every completed request's tokens equal its solo run.
#include "engine/pool_cache_budget.h"

#include <map>
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "kv/kv_layout.h"
#include "model/deepseek_v41.h"
#include "model/model_stats.h"
#include "test_support/forwarding_runner.h"
#include "test_support/greedy.h"
#include "test_support/tiny_model.h"

namespace cedar::engine {
namespace {

TEST(PoolCacheLayoutTest, HandComputedPageRounding) {
  PoolCacheLayout l;
  l.streams = {{2, 4, 400}, {1, 8, 80}};  // ratio 2: 4 entries/block of 100 B; ratio 1: 8 of 10 B
  l.bytes_per_sequence = 7;
  EXPECT_EQ(l.global_bytes_for(0), 0);
  EXPECT_EQ(l.global_bytes_for(1), 80);            // 0 ratio-2 entries, 1 ratio-1 entry
  EXPECT_EQ(l.global_bytes_for(8), 400 + 80);      // 4 and 8 entries: one full block each
  EXPECT_EQ(l.global_bytes_for(9), 400 + 160);     // 4 and 9
  EXPECT_EQ(l.global_bytes_for(10), 800 + 160);    // 5 and 10
}

TEST(PoolCacheBudgetTest, ReservesGrowsAndReleases) {
  PoolCacheLayout l;
  l.streams = {{1, 4, 40}};
  l.bytes_per_sequence = 5;
  auto b = PoolCacheBudget::create(l, 100);
  ASSERT_TRUE(b.ok()) << b.error().message;
  PoolCacheBudget& budget = **b;
  EXPECT_EQ(budget.pool()->stats().capacity_bytes, 100);
  EXPECT_TRUE(budget.reserve(1, 3));  // 40 + 5
  EXPECT_EQ(budget.used_bytes(), 45);
  EXPECT_EQ(budget.global_used_bytes(), 40);
  EXPECT_TRUE(budget.reserve(1, 4));  // same block
  EXPECT_EQ(budget.used_bytes(), 45);
  EXPECT_TRUE(budget.reserve(2, 1));  // 90
  EXPECT_FALSE(budget.reserve(1, 5));  // would need 130
  EXPECT_EQ(budget.used_bytes(), 90);
  budget.release(2);
  EXPECT_TRUE(budget.reserve(1, 5));
  EXPECT_EQ(budget.used_bytes(), 85);
  EXPECT_EQ(budget.sequences(), 1);
  budget.release(1);
  EXPECT_EQ(budget.used_bytes(), 0);
  EXPECT_EQ(budget.global_used_bytes(), 0);
  EXPECT_FALSE(PoolCacheBudget::create(l, 0).ok());
}

class PoolEngineTest : public test_support::TinyV41Suite {};

TEST_F(PoolEngineTest, LayoutMatchesTheKvDryRunMeasurement) {
  for (int64_t tpb : {8, 64}) {
    auto layout = pool_cache_layout(model_->config(), model_->plan(), 0, tpb);
    ASSERT_TRUE(layout.ok()) << layout.error().message;
    for (int64_t n : {1, 2, 7, 8, 9, 31, 64, 65, 200}) {
      auto m = measure_kv_bytes(model_->config(), model_->plan(), n, tpb);
      ASSERT_TRUE(m.ok()) << m.error().message;
      EXPECT_EQ(layout->global_bytes_for(n), m->allocated_bytes) << "tokens " << n << " tokens_per_block " << tpb;
    }
  }
}

// A runner that forwards to DeepseekRunner and checks the pool against the budget around every batch.
class CheckingRunner final : public test_support::ForwardingRunner {
 public:
  CheckingRunner(DeepseekRunner& inner, const PoolCacheBudget& budget) : ForwardingRunner(inner), budget_(&budget) {}
  // Without the prefix cache: the workload checks the budget's accounting alone.
  std::optional<PrefixCacheSupport> prefix_cache() const override { return std::nullopt; }
  void run_batch(std::span<BatchItem> items) override {
    ForwardingRunner::run_batch(items);
    const BlockPoolStats st = budget_->pool()->stats();
    EXPECT_LE(st.used_bytes, budget_->global_used_bytes());
    max_used = std::max(max_used, st.used_bytes);
    for (const BatchItem& item : items) {
      EXPECT_TRUE(item.status.ok()) << item.status.error().message;
      failures += item.status.ok() ? 0 : 1;
    }
  }
  int64_t failures = 0, max_used = 0;

 private:
  const PoolCacheBudget* budget_;
};

std::vector<int64_t> random_prompt(std::mt19937_64& rng, int64_t n) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int64_t>(rng() % 128000));
  return ids;
}

// Runs `reqs` through one engine whose sequences allocate from a PoolCacheBudget's pool, checks the
// pool against the budget, and compares completed requests with their solo tokens.
void run_workload(const std::vector<GenerationRequest>& reqs, const std::vector<std::vector<int64_t>>& solo,
                  const EngineOptions& eo, const PoolCacheLayout& layout, int64_t capacity, int64_t tokens_per_block,
                  const std::string& m, const DeepseekV41Model& model) {
  auto budget = PoolCacheBudget::create(layout, capacity);
  ASSERT_TRUE(budget.ok()) << budget.error().message;
  KvCacheOptions kv;
  kv.tokens_per_block = tokens_per_block;
  kv.pool = (*budget)->pool();
  DeepseekRunner inner(model, nullptr, kv);
  CheckingRunner runner(inner, **budget);
  Engine engine(runner, **budget, eo);
  std::vector<RequestId> ids;
  for (const auto& r : reqs) {
    auto id = engine.submit(r);
    ASSERT_TRUE(id.ok()) << id.error().message;
    ids.push_back(*id);
  }
  const RequestId cancelled = ids[2];
  for (int steps = 0; engine.has_work(); ++steps) {
    if (steps == 4) engine.cancel(cancelled);
    ASSERT_TRUE(engine.step().ok());
    EXPECT_LE((*budget)->pool()->stats().used_bytes, (*budget)->global_used_bytes());
    ASSERT_LT(steps, 10000);
  }
  std::map<RequestId, RequestResult> by_id;
  for (auto& r : engine.take_finished()) by_id[r.id] = std::move(r);
  EXPECT_EQ(runner.failures, 0) << m;
  EXPECT_GT(engine.stats().preemptions, 0) << m << ": the capacity did not force a preemption";
  std::printf("%s: %lld preemptions, pool peak %lld bytes, budget capacity %lld bytes\n", m.c_str(),
              static_cast<long long>(engine.stats().preemptions), static_cast<long long>(runner.max_used),
              static_cast<long long>(capacity));
  EXPECT_GT(runner.max_used, 0) << m << ": nothing was allocated in the shared pool";
  const BlockPoolStats st = (*budget)->pool()->stats();
  EXPECT_EQ(st.used_bytes, 0) << m;
  EXPECT_EQ(st.failed_allocations, 0) << m;
  EXPECT_LE(st.peak_used_bytes, capacity) << m;
  EXPECT_EQ((*budget)->used_bytes(), 0) << m;
  for (size_t i = 0; i < ids.size(); ++i) {
    const RequestResult& r = by_id[ids[i]];
    if (ids[i] == cancelled) {
      EXPECT_EQ(r.finish, FinishReason::kCancelled) << m;
      continue;
    }
    EXPECT_EQ(r.finish, FinishReason::kLength) << m << " request " << i << ": " << r.error;
    EXPECT_EQ(r.tokens, solo[i]) << m << " request " << i;
    // The sequence's allocation is exactly the layout's page-rounded figure for its tokens.
    EXPECT_EQ(r.stats.kv_bytes_allocated, layout.global_bytes_for(r.stats.kv_tokens)) << m << " request " << i;
  }
}

TEST_F(PoolEngineTest, RandomWorkloadStaysWithinThePoolAndRecomputesExactly) {
  constexpr int64_t kTokensPerBlock = 8;
  for (ForwardMode mode : {ForwardMode::Exact, ForwardMode::Ced}) {
    std::mt19937_64 rng(mode == ForwardMode::Exact ? 5 : 6);
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 8; ++i) {
      GenerationRequest r;
      r.prompt = random_prompt(rng, 6 + static_cast<int64_t>(rng() % 24));
      r.params = test_support::greedy(2 + static_cast<int64_t>(rng() % 6));
      reqs.push_back(std::move(r));
    }
    EngineOptions eo;
    eo.mode = mode;
    eo.step_token_budget = 7;
    // Solo references: each request alone, private unbounded pools.
    std::vector<std::vector<int64_t>> solo;
    for (const auto& r : reqs) {
      DeepseekRunner runner(*model_, nullptr);
      ByteCacheBudget unlimited(runner.cache_footprint(), int64_t{1} << 40);
      Engine engine(runner, unlimited, eo);
      ASSERT_TRUE(engine.submit(r).ok());
      ASSERT_TRUE(engine.run_until_idle().ok());
      auto done = engine.take_finished();
      ASSERT_EQ(done.size(), 1u);
      solo.push_back(done[0].tokens);
    }

    const int64_t swa = compute_kv_budget(model_->config(), model_->plan()).swa_bytes_per_sequence;
    // With the fixed SWA state charged, and with global KV only: then the pool's capacity (equal to the
    // budget's) is what binds, and the budget must preempt before the pool would refuse a block.
    for (int64_t fixed : {swa, int64_t{0}}) {
      auto layout = pool_cache_layout(model_->config(), model_->plan(), fixed, kTokensPerBlock);
      ASSERT_TRUE(layout.ok()) << layout.error().message;
      // Room for two sequences' fixed state and 40 tokens of global KV in all (a request holds at most
      // 36): forces preemption.
      const int64_t capacity = layout->global_bytes_for(40) + 2 * layout->bytes_per_sequence;
      const std::string m = std::string(forward_mode_name(mode)) + (fixed > 0 ? " +swa" : " global-only");
      run_workload(reqs, solo, eo, *layout, capacity, kTokensPerBlock, m, *model_);
    }
  }
}

}  // namespace
}  // namespace cedar::engine
