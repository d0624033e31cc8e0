// The prefix cache on the tiny DeepSeek-V4.1 checkpoint through DeepseekRunner (the model's
// resume_sequence / snapshot_swa / prefix_blocks): a repeated prompt resumes from the cache with logits
// equal to an uncached run bit for bit (exact mode; ced mode with a snapshot), and a random workload with
// shared prefixes, cancellations, evictions and preemptions under a tight PoolCacheBudget keeps the pool
// within the budget, fails nothing, releases everything, and gives every request the policy promises
// bitwise equality for exactly its solo uncached tokens.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "engine/engine.h"
#include "engine/pool_cache_budget.h"
#include "model/deepseek_v41.h"
#include "model/model_stats.h"
#include "test_support/forwarding_runner.h"
#include "test_support/greedy.h"
#include "test_support/tiny_model.h"

namespace cedar::engine {
namespace {

constexpr int64_t kTokensPerBlock = 8;

class PrefixCacheModelTest : public test_support::TinyV41Suite {};

PoolCacheLayout layout_for(const DeepseekV41Model& model, int64_t swa_history) {
  const KvBudget kv = compute_kv_budget(model.config(), model.plan());
  const int64_t window = model.config().sliding_window;
  auto l = pool_cache_layout(model.config(), model.plan(), kv.swa_bytes_per_sequence / window * (window + swa_history),
                             kTokensPerBlock);
  EXPECT_TRUE(l.ok()) << l.error().message;
  return *l;
}

// Checks the pool against the budget after every batch; counts failures.
class CheckingRunner final : public test_support::ForwardingRunner {
 public:
  CheckingRunner(DeepseekRunner& inner, const PoolCacheBudget& budget) : ForwardingRunner(inner), budget_(&budget) {}
  Result<std::unique_ptr<ModelSequence>> create_sequence(const SequenceSpec& spec) override {
    auto s = ForwardingRunner::create_sequence(spec);
    if (!s.ok()) {
      ++failures;
      ADD_FAILURE() << "create_sequence: " << s.error().message;
    }
    return s;
  }
  void run_batch(std::span<BatchItem> items) override {
    ForwardingRunner::run_batch(items);
    EXPECT_LE(budget_->pool()->stats().used_bytes, budget_->global_used_bytes());
    for (const BatchItem& item : items)
      if (!item.status.ok()) {
        ++failures;
        ADD_FAILURE() << item.status.error().message;
      }
  }
  int64_t failures = 0;

 private:
  const PoolCacheBudget* budget_;
};

std::vector<int64_t> random_tokens(std::mt19937_64& rng, int64_t n) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int64_t>(rng() % 128000));
  return ids;
}

// Logits of the last prompt row, with and without the cache, for a prompt re-sent after a first run.
TEST_F(PrefixCacheModelTest, RepeatedPromptLogitsEqualAnUncachedRunBitForBit) {
  std::mt19937_64 rng(3);
  const std::vector<int64_t> prompt = random_tokens(rng, 43);
  for (ForwardMode mode : {ForwardMode::Exact, ForwardMode::Ced}) {
    EngineOptions eo;
    eo.mode = mode;
    eo.step_token_budget = 64;
    const int64_t history = model_->config().sliding_window + kTokensPerBlock;
    auto budget = PoolCacheBudget::create(layout_for(*model_, history), int64_t{1} << 26);
    ASSERT_TRUE(budget.ok());
    KvCacheOptions kv;
    kv.tokens_per_block = kTokensPerBlock;
    kv.pool = (*budget)->pool();
    DeepseekRunner runner(*model_, nullptr, kv);
    Engine engine(runner, **budget, eo);
    ASSERT_NE(engine.prefix_cache(), nullptr) << engine.prefix_cache_status();
    std::vector<std::vector<float>> first_logits;
    for (int run = 0; run < 2; ++run) {
      GenerationRequest g;
      g.prompt = prompt;
      g.params = test_support::greedy(3);
      g.params.logprobs = true;
      g.params.top_logprobs = 5;
      ASSERT_TRUE(engine.submit(g).ok());
      ASSERT_TRUE(engine.run_until_idle().ok());
      auto done = engine.take_finished();
      ASSERT_EQ(done.size(), 1u);
      ASSERT_EQ(done[0].finish, FinishReason::kLength) << done[0].error;
      std::vector<float> lp;
      for (const SampledToken& t : done[0].samples) {
        lp.push_back(static_cast<float>(t.logprob));
        for (const auto& alt : t.top) lp.push_back(static_cast<float>(alt.logprob));
      }
      if (run == 0) {
        EXPECT_EQ(done[0].stats.cached_tokens, 0);
        first_logits.push_back(lp);
      } else {
        EXPECT_EQ(done[0].stats.cached_tokens, 40) << forward_mode_name(mode);
        EXPECT_FALSE(done[0].stats.cache_approximate);
        // Bitwise: the sampled log-probabilities (and top-5) are the same floats.
        EXPECT_EQ(lp, first_logits[0]) << forward_mode_name(mode);
      }
    }
    EXPECT_EQ(engine.prefix_cache_stats().snapshot_restores, 1);
  }
}

TEST_F(PrefixCacheModelTest, RandomWorkloadWithSharedPrefixesMatchesSoloRunsWithinThePool) {
  for (ForwardMode mode : {ForwardMode::Exact, ForwardMode::Ced}) {
    std::mt19937_64 rng(mode == ForwardMode::Exact ? 21 : 22);
    std::vector<std::vector<int64_t>> families;
    for (int f = 0; f < 3; ++f) families.push_back(random_tokens(rng, 17 + static_cast<int64_t>(rng() % 20)));
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 10; ++i) {
      GenerationRequest r;
      r.prompt = families[rng() % families.size()];
      const std::vector<int64_t> extra = random_tokens(rng, static_cast<int64_t>(rng() % 14));
      r.prompt.insert(r.prompt.end(), extra.begin(), extra.end());
      r.params = test_support::greedy(2 + static_cast<int64_t>(rng() % 5));
      reqs.push_back(std::move(r));
    }
    EngineOptions eo;
    eo.mode = mode;
    eo.step_token_budget = 7;
    eo.max_running = 4;
    // Solo references: each request alone, no cache, private pools.
    std::vector<std::vector<int64_t>> solo;
    for (const auto& r : reqs) {
      DeepseekRunner runner(*model_, nullptr);
      ByteCacheBudget unlimited(runner.cache_footprint(), int64_t{1} << 40);
      EngineOptions so = eo;
      so.prefix_cache.enabled = false;
      Engine engine(runner, unlimited, so);
      ASSERT_TRUE(engine.submit(r).ok());
      ASSERT_TRUE(engine.run_until_idle().ok());
      solo.push_back(engine.take_finished().at(0).tokens);
    }
    // With snapshots; without (the exact bounded replay); ced also with the opt-in window replay.
    for (int variant = 0; variant < (mode == ForwardMode::Ced ? 3 : 2); ++variant) {
      const bool snapshots = variant == 0, window = variant == 2;
      eo.prefix_cache.swa_pool_bytes = snapshots ? int64_t{1} << 20 : 0;
      eo.prefix_cache.swa_replay = window ? SwaReplay::kWindow : SwaReplay::kExact;
      const int64_t history = model_->config().sliding_window + kTokensPerBlock;
      const PoolCacheLayout layout = layout_for(*model_, history);
      // Two sequences' fixed state and 96 tokens of global KV (a request holds at most 55): the index is
      // squeezed and requests are preempted.
      const int64_t capacity = layout.global_bytes_for(96) + 2 * layout.bytes_per_sequence;
      auto budget = PoolCacheBudget::create(layout, capacity);
      ASSERT_TRUE(budget.ok());
      KvCacheOptions kv;
      kv.tokens_per_block = kTokensPerBlock;
      kv.pool = (*budget)->pool();
      DeepseekRunner inner(*model_, nullptr, kv);
      CheckingRunner runner(inner, **budget);
      Engine engine(runner, **budget, eo);
      ASSERT_NE(engine.prefix_cache(), nullptr) << engine.prefix_cache_status();
      std::vector<RequestId> ids;
      std::set<RequestId> cancelled;
      size_t next = 0;
      for (int steps = 0; next < reqs.size() || engine.has_work(); ++steps) {
        ASSERT_LT(steps, 20000);
        if (next < reqs.size() && (steps % 2 == 0 || !engine.has_work())) {
          auto id = engine.submit(reqs[next++]);
          ASSERT_TRUE(id.ok()) << id.error().message;
          ids.push_back(*id);
          if (next == 5) {
            engine.cancel(*id);
            cancelled.insert(*id);
          }
        }
        ASSERT_TRUE(engine.step().ok());
        EXPECT_LE((*budget)->pool()->stats().used_bytes, (*budget)->global_used_bytes());
      }
      std::map<RequestId, RequestResult> by_id;
      for (auto& r : engine.take_finished()) by_id[r.id] = std::move(r);
      const std::string m =
          std::string(forward_mode_name(mode)) + (snapshots ? " +snapshots" : window ? " window replay" : " replay");
      int64_t compared = 0, compared_hits = 0, approximate = 0;
      for (size_t i = 0; i < ids.size(); ++i) {
        const RequestResult& r = by_id.at(ids[i]);
        if (cancelled.count(ids[i])) continue;
        ASSERT_EQ(r.finish, FinishReason::kLength) << m << " request " << i << ": " << r.error;
        if (r.stats.cache_approximate) {
          EXPECT_TRUE(window) << m << ": only the window replay is approximate";
          ++approximate;
          continue;
        }
        ++compared;
        compared_hits += r.stats.cached_tokens > 0 ? 1 : 0;
        EXPECT_EQ(r.tokens, solo[i]) << m << " request " << i << " cached " << r.stats.cached_tokens;
      }
      const PrefixCacheStats st = engine.prefix_cache_stats();
      std::printf(
          "%s: %lld/%lld requests hit (%lld of %lld prompt tokens), %lld recompute hits, %lld evicted blocks, "
          "%lld preemptions; %lld compared bitwise (%lld of them hits), %lld approximate\n",
          m.c_str(), static_cast<long long>(st.hits), static_cast<long long>(st.lookups),
          static_cast<long long>(st.hit_tokens), static_cast<long long>(st.lookup_tokens),
          static_cast<long long>(st.recompute_hits), static_cast<long long>(st.index.evicted_blocks),
          static_cast<long long>(engine.stats().preemptions), static_cast<long long>(compared),
          static_cast<long long>(compared_hits), static_cast<long long>(approximate));
      EXPECT_EQ(runner.failures, 0) << m;
      EXPECT_GT(engine.stats().preemptions, 0) << m;
      EXPECT_GT(st.index.evicted_blocks, 0) << m;
      if (window) {
        EXPECT_GT(approximate, 0) << m << ": no request replayed";
      } else {
        EXPECT_GT(compared_hits, 0) << m << ": no cached request was checked against its solo run";
      }
      if (!snapshots) {
        EXPECT_GT(st.replay_restores, 0) << m;
      }
      EXPECT_EQ((*budget)->pool()->stats().failed_allocations, 0) << m;
      EXPECT_EQ((*budget)->used_bytes(), (*budget)->index_bytes()) << m;
      EXPECT_EQ((*budget)->pool()->stats().used_bytes, (*budget)->index_bytes()) << m;
    }
  }
}

}  // namespace
}  // namespace cedar::engine
