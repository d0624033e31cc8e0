// The engine's prefix cache on the fake model (engine/prefix_cache.h, engine/fake_model.h): the restart
// policy (snapshot restores, the exact bounded replay in both modes, the opt-in window replay, the ced
// tail bound), stats and
// streamed cached-token counts, and a random workload with shared prefixes, evictions, cancellations and
// preemptions under tiny budgets: the pool never holds more than the budget accounts, nothing fails,
// everything is released, and every request the policy promises bitwise equality for (all of them in
// exact mode) produces exactly its solo uncached tokens. The fake model fails any resume whose blocks or
// snapshot do not belong to the request's token history, and perturbs its logits wherever the real model
// would not be bitwise equal, so a policy bug shows up as a failure or a token difference.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "engine/engine.h"
#include "engine/fake_model.h"
#include "engine/pool_cache_budget.h"
#include "test_support/fake_engine.h"

namespace cedar::engine {
namespace {

constexpr int64_t kB = 8;  // tokens per block
constexpr int64_t kWindow = 4;

PoolCacheLayout fake_layout() { return test_support::fake_pool_layout(kB); }

// Checks the pool against the budget around every batch and counts failed items.
class CheckingRunner final : public ModelRunner {
 public:
  CheckingRunner(FakeModelRunner& inner, const PoolCacheBudget& budget) : inner_(&inner), budget_(&budget) {}
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t eos_token() const override { return inner_->eos_token(); }
  CacheFootprint cache_footprint() const override { return inner_->cache_footprint(); }
  std::optional<PrefixCacheSupport> prefix_cache() const override { return inner_->prefix_cache(); }
  Result<std::unique_ptr<ModelSequence>> create_sequence(const SequenceSpec& spec) override {
    auto s = inner_->create_sequence(spec);
    if (!s.ok()) {
      ++failures;
      ADD_FAILURE() << "create_sequence: " << s.error().message;
    }
    return s;
  }
  void run_batch(std::span<BatchItem> items) override {
    inner_->run_batch(items);
    check();
    for (const BatchItem& item : items)
      if (!item.status.ok()) {
        ++failures;
        ADD_FAILURE() << item.status.error().message;
      }
  }
  void check() {
    const BlockPoolStats st = budget_->pool()->stats();
    EXPECT_LE(st.used_bytes, budget_->global_used_bytes());
    EXPECT_LE(budget_->used_bytes(), budget_->capacity_bytes());
    max_used = std::max(max_used, st.used_bytes);
  }
  int64_t failures = 0, max_used = 0;

 private:
  FakeModelRunner* inner_;
  const PoolCacheBudget* budget_;
};

struct Harness {
  std::unique_ptr<PoolCacheBudget> budget;
  std::unique_ptr<FakeModelRunner> fake;
  std::unique_ptr<CheckingRunner> runner;
  std::unique_ptr<Engine> engine;

  Harness(int64_t capacity, EngineOptions eo, FakeModelOptions fo = {}) {
    auto b = PoolCacheBudget::create(fake_layout(), capacity);
    EXPECT_TRUE(b.ok());
    budget = std::move(*b);
    fo.pool = budget->pool();
    fo.layout = fake_layout();
    fo.sliding_window = kWindow;
    fake = std::make_unique<FakeModelRunner>(fo);
    runner = std::make_unique<CheckingRunner>(*fake, *budget);
    engine = std::make_unique<Engine>(*runner, *budget, eo);
  }
};

struct Spec {
  std::vector<int64_t> prompt;
  SamplingParams params;
};

// Solo reference: sample from the fake logits of the whole history (no cache).
std::vector<int64_t> solo(const FakeModelRunner& model, const Spec& s) {
  return test_support::fake_solo_tokens(model, s.prompt, s.params, *s.params.seed);
}

Spec make_spec(std::vector<int64_t> prompt, int64_t max_tokens, uint64_t seed) {
  Spec s;
  s.prompt = std::move(prompt);
  s.params.max_tokens = max_tokens;
  s.params.temperature = 0.8;
  s.params.seed = seed;
  s.params.ignore_eos = true;
  return s;
}

RequestResult run_one(Engine& engine, const Spec& s) {
  GenerationRequest g;
  g.prompt = s.prompt;
  g.params = s.params;
  int64_t streamed_cached = -1;
  g.on_event = [&](const StreamEvent& ev) { streamed_cached = ev.cached_tokens; };
  auto id = engine.submit(std::move(g));
  EXPECT_TRUE(id.ok()) << id.error().message;
  EXPECT_TRUE(engine.run_until_idle().ok());
  auto done = engine.take_finished();
  EXPECT_EQ(done.size(), 1u);
  EXPECT_EQ(streamed_cached, done[0].stats.cached_tokens);
  return done[0];
}

std::vector<int64_t> tokens(int64_t n, int64_t salt) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(2 + (i * 7 + salt * 13) % 60);
  return v;
}

TEST(EnginePrefixCacheTest, RepeatedPromptsResumeFromASnapshotBitForBit) {
  for (ForwardMode mode : {ForwardMode::Exact, ForwardMode::Ced}) {
    EngineOptions eo;
    eo.mode = mode;
    eo.step_token_budget = 16;
    Harness s(1 << 20, eo);
    ASSERT_NE(s.engine->prefix_cache(), nullptr) << s.engine->prefix_cache_status();
    const Spec first = make_spec(tokens(37, 1), 5, 7);
    RequestResult a = run_one(*s.engine, first);
    EXPECT_EQ(a.stats.cached_tokens, 0);
    EXPECT_EQ(a.tokens, solo(*s.fake, first));
    // The same prompt: every full block but the one holding the last token is cached (P <= N − 1).
    RequestResult b = run_one(*s.engine, make_spec(first.prompt, 5, 8));
    EXPECT_EQ(b.stats.cached_tokens, 32);
    EXPECT_FALSE(b.stats.cache_approximate);
    EXPECT_EQ(b.tokens, solo(*s.fake, make_spec(first.prompt, 5, 8)));
    // exact: R = P; ced: R = min(P, N − tail) = 33 − ... = min(32, 37 − 4) = 32.
    EXPECT_EQ(b.stats.replayed_tokens, 0);
    // A continuation of the first request's whole text (prompt + output): the blocks recorded when it
    // finished cover it too.
    std::vector<int64_t> cont = first.prompt;
    cont.insert(cont.end(), a.tokens.begin(), a.tokens.end());
    cont.push_back(3);
    cont.push_back(4);
    const Spec c = make_spec(cont, 4, 9);
    RequestResult rc = run_one(*s.engine, c);
    EXPECT_EQ(rc.stats.cached_tokens, 40);  // the first sequence held 41 tokens: 5 full blocks
    EXPECT_EQ(rc.tokens, solo(*s.fake, c));
    const PrefixCacheStats st = s.engine->prefix_cache_stats();
    EXPECT_EQ(st.lookups, 3);
    EXPECT_EQ(st.hits, 2);
    EXPECT_EQ(st.hit_tokens, 72);
    EXPECT_EQ(st.snapshot_restores, 2);
    EXPECT_EQ(st.lookup_tokens, 37 + 37 + static_cast<int64_t>(cont.size()));
    EXPECT_GT(st.swa.entries, 0);
    EXPECT_GT(st.index.nodes, 0);
    EXPECT_EQ(s.runner->failures, 0);
    EXPECT_EQ(s.fake->resumes(), 2);
    const EngineStats& es = s.engine->stats();
    EXPECT_EQ(es.prefix_hit_tokens, 72);
    EXPECT_DOUBLE_EQ(es.prefix_hit_rate, 72.0 / static_cast<double>(st.lookup_tokens));
    EXPECT_EQ(es.prefix_index_bytes, st.index.bytes);
    EXPECT_EQ(es.swa_pool_bytes, st.swa.bytes);
  }
}

// Without a snapshot both modes resume by the exact bounded replay: R = t − rows − 1 (the fake model's
// exact replay rows: 10 in exact mode, 6 in ced mode), bitwise equal to the uncached run. The window
// replay (SwaReplay::kWindow) is the opt-in approximate path of ced mode; exact mode ignores it.
TEST(EnginePrefixCacheTest, WithoutSnapshotsBothModesReplayExactly) {
  for (SwaReplay replay : {SwaReplay::kExact, SwaReplay::kWindow})
    for (ForwardMode mode : {ForwardMode::Exact, ForwardMode::Ced}) {
      const std::string what = std::string(forward_mode_name(mode)) + ", --swa-replay " +
                               std::string(swa_replay_name(replay));
      EngineOptions eo;
      eo.mode = mode;
      eo.prefix_cache.swa_pool_bytes = 0;  // no snapshots
      eo.prefix_cache.swa_replay = replay;
      Harness s(1 << 20, eo);
      const Spec first = make_spec(tokens(30, 2), 3, 1);
      run_one(*s.engine, first);
      const Spec again = make_spec(first.prompt, 6, 2);
      RequestResult b = run_one(*s.engine, again);
      EXPECT_EQ(b.stats.cached_tokens, 24) << what;  // t = P = 24 (ced: min(24, 30 − 4))
      const PrefixCacheStats st = s.engine->prefix_cache_stats();
      EXPECT_EQ(st.replay_restores, 1) << what;
      if (mode == ForwardMode::Ced && replay == SwaReplay::kWindow) {
        EXPECT_EQ(b.stats.replayed_tokens, kWindow) << what;  // R = P − window
        EXPECT_TRUE(b.stats.cache_approximate) << what;
        EXPECT_EQ(st.window_replay_restores, 1) << what;
        EXPECT_NE(b.tokens, solo(*s.fake, again)) << what << ": the fake model perturbs an approximate resume";
      } else {
        EXPECT_EQ(b.stats.replayed_tokens, (mode == ForwardMode::Exact ? 10 : 6) + 1) << what;
        EXPECT_FALSE(b.stats.cache_approximate) << what;
        EXPECT_EQ(st.window_replay_restores, 0) << what;
        EXPECT_EQ(b.tokens, solo(*s.fake, again)) << what;
      }
      EXPECT_EQ(s.runner->failures, 0) << what;
    }
}

// A short prefix (t <= rows): the bounded replay starts at 0, exact; the stats count the whole prefix
// as replayed.
TEST(EnginePrefixCacheTest, AShortPrefixReplaysFromZero) {
  EngineOptions eo;
  eo.mode = ForwardMode::Exact;
  eo.prefix_cache.swa_pool_bytes = 0;
  Harness s(1 << 20, eo);
  const Spec first = make_spec(tokens(12, 5), 2, 1);  // P = 8 < 10 + 1
  run_one(*s.engine, first);
  RequestResult b = run_one(*s.engine, make_spec(first.prompt, 3, 2));
  EXPECT_EQ(b.stats.cached_tokens, 8);
  EXPECT_EQ(b.stats.replayed_tokens, 8);
  EXPECT_FALSE(b.stats.cache_approximate);
  EXPECT_EQ(b.tokens, solo(*s.fake, make_spec(first.prompt, 3, 2)));
  EXPECT_EQ(s.runner->failures, 0);
}

// After a bounded replay (the snapshot expired: TTL on a fake clock), the sequence's own snapshot
// restores the next identical request at t: the replay's extra row leaves a full window of exact ring
// keys below t (the fake model refuses a restore below R + rows + 1, as the real one's held_from does).
TEST(EnginePrefixCacheTest, ABoundedReplaysSnapshotRestoresTheNextTurnAtT) {
  for (ForwardMode mode : {ForwardMode::Exact, ForwardMode::Ced}) {
    double now = 0;
    EngineOptions eo;
    eo.mode = mode;
    eo.prefix_cache.swa_ttl_seconds = 10;
    eo.prefix_cache.clock = [&now] { return now; };
    Harness s(1 << 20, eo);
    const Spec first = make_spec(tokens(46, 6), 2, 1);  // P = 40 (ced: t = min(40, 42) = 40)
    run_one(*s.engine, first);
    now = 100;  // every snapshot is gone
    RequestResult b = run_one(*s.engine, make_spec(first.prompt, 2, 2));
    EXPECT_EQ(b.stats.cached_tokens, 40);
    EXPECT_EQ(b.stats.replayed_tokens, (mode == ForwardMode::Exact ? 10 : 6) + 1);
    RequestResult c = run_one(*s.engine, make_spec(first.prompt, 2, 3));
    EXPECT_EQ(c.stats.cached_tokens, 40);
    EXPECT_EQ(c.stats.replayed_tokens, 0);  // restored from b's snapshot at R = t = 40
    EXPECT_FALSE(c.stats.cache_approximate);
    EXPECT_EQ(c.tokens, solo(*s.fake, make_spec(first.prompt, 2, 3)));
    const PrefixCacheStats st = s.engine->prefix_cache_stats();
    EXPECT_EQ(st.replay_restores, 1);
    EXPECT_EQ(st.snapshot_restores, 1);
    EXPECT_EQ(s.runner->failures, 0);
  }
}

// ced: a snapshot may only restore up to N − tail (the decoder rings of the tail are rebuilt); a
// re-sent prompt shorter than a block past the cached prefix resumes lower than P.
TEST(EnginePrefixCacheTest, CedRestartsNoLaterThanTheTail) {
  EngineOptions eo;
  eo.mode = ForwardMode::Ced;
  eo.ced_tail = 6;
  Harness s(1 << 20, eo);
  const Spec first = make_spec(tokens(19, 3), 2, 1);  // blocks [0, 16) recorded, snapshot at 19
  run_one(*s.engine, first);
  const Spec again = make_spec(first.prompt, 4, 2);  // P = 16, N − tail = 13
  RequestResult b = run_one(*s.engine, again);
  EXPECT_EQ(b.stats.cached_tokens, 16);
  EXPECT_EQ(b.stats.replayed_tokens, 3);  // R = 13
  EXPECT_FALSE(b.stats.cache_approximate);
  EXPECT_EQ(b.tokens, solo(*s.fake, again));
  EXPECT_EQ(s.runner->failures, 0);
}

TEST(EnginePrefixCacheTest, OffWithoutASharedBlockBudgetOrWhenDisabled) {
  FakeModelOptions fo;
  fo.pool = *BlockPool::create({});
  fo.layout = fake_layout();
  FakeModelRunner fake(fo);
  ByteCacheBudget bytes(fo.footprint, 1 << 20);
  Engine e(fake, bytes, EngineOptions{});
  EXPECT_EQ(e.prefix_cache(), nullptr);
  EXPECT_NE(e.prefix_cache_status().find("PoolCacheBudget"), std::string::npos) << e.prefix_cache_status();
  FakeModelRunner plain;
  auto budget = PoolCacheBudget::create(fake_layout(), 1 << 20);
  ASSERT_TRUE(budget.ok());
  Engine e2(plain, **budget, EngineOptions{});
  EXPECT_EQ(e2.prefix_cache(), nullptr);
  EXPECT_NE(e2.prefix_cache_status().find("does not support"), std::string::npos);
  EngineOptions off;
  off.prefix_cache.enabled = false;
  Harness s(1 << 20, off);
  EXPECT_EQ(s.engine->prefix_cache(), nullptr);
  EXPECT_EQ(s.engine->prefix_cache_status(), "");
  const Spec first = make_spec(tokens(30, 2), 3, 1);
  run_one(*s.engine, first);
  EXPECT_EQ(run_one(*s.engine, first).stats.cached_tokens, 0);
}

// Random arrivals of requests from a few prompt families (shared system prompts, re-sent conversations),
// cancellations and tight budgets.
TEST(EnginePrefixCacheTest, RandomWorkloadStaysWithinTheBudgetAndMatchesSoloRuns) {
  int64_t preemptions = 0, evicted = 0, hits = 0, recompute_hits = 0, exact_checked = 0, approximate = 0;
  for (uint64_t trial = 0; trial < 24; ++trial) {
    std::mt19937_64 rng(trial);
    EngineOptions eo;
    eo.mode = trial % 2 ? ForwardMode::Ced : ForwardMode::Exact;
    eo.step_token_budget = 4 + static_cast<int64_t>(rng() % 20);
    eo.max_running = 1 + static_cast<int64_t>(rng() % 5);
    eo.prefix_cache.swa_pool_bytes = trial % 6 == 5 ? 0 : 2000 + static_cast<int64_t>(rng() % 4000);
    eo.prefix_cache.swa_ttl_seconds = 1e9;
    // Every fourth trial the approximate window replay (ced trials: approximate resumes and blocks).
    if (trial % 4 == 3) eo.prefix_cache.swa_replay = SwaReplay::kWindow;
    const PoolCacheLayout layout = fake_layout();
    // Room for about two long requests: the index is squeezed and requests get preempted.
    const int64_t capacity =
        layout.global_bytes_for(90 + static_cast<int64_t>(rng() % 60)) + 2 * layout.bytes_per_sequence;
    Harness s(capacity, eo);
    ASSERT_NE(s.engine->prefix_cache(), nullptr);

    std::vector<std::vector<int64_t>> families;
    for (int f = 0; f < 3; ++f) families.push_back(tokens(16 + static_cast<int64_t>(rng() % 30), 100 + f));
    std::map<RequestId, Spec> specs;
    std::set<RequestId> cancelled;
    std::vector<RequestResult> results;
    int submitted = 0;
    for (int steps = 0; submitted < 16 || s.engine->has_work(); ++steps) {
      ASSERT_LT(steps, 20000);
      if (submitted < 16 && rng() % 3 == 0) {
        std::vector<int64_t> prompt = families[rng() % families.size()];
        const int64_t extra = static_cast<int64_t>(rng() % 24);
        for (int64_t i = 0; i < extra; ++i) prompt.push_back(2 + static_cast<int64_t>(rng() % 60));
        Spec sp = make_spec(prompt, 1 + static_cast<int64_t>(rng() % 10), rng() % 1000);
        GenerationRequest g;
        g.prompt = sp.prompt;
        g.params = sp.params;
        auto id = s.engine->submit(std::move(g));
        ASSERT_TRUE(id.ok()) << id.error().message;
        specs[*id] = sp;
        ++submitted;
        if (rng() % 8 == 0) {
          s.engine->cancel(*id);
          cancelled.insert(*id);
        }
      }
      ASSERT_TRUE(s.engine->step().ok());
      s.runner->check();
      for (auto& r : s.engine->take_finished()) results.push_back(std::move(r));
    }
    for (const RequestResult& r : results) {
      ASSERT_NE(r.finish, FinishReason::kError) << r.error;
      if (cancelled.count(r.id)) continue;
      const Spec& sp = specs[r.id];
      if (eo.mode == ForwardMode::Exact) {
        EXPECT_FALSE(r.stats.cache_approximate);
      }
      if (r.stats.cache_approximate) {
        ++approximate;
        continue;
      }
      ++exact_checked;
      EXPECT_EQ(r.tokens, solo(*s.fake, sp)) << "trial " << trial << " request " << r.id << " cached "
                                             << r.stats.cached_tokens << " preempted " << r.stats.preemptions;
    }
    EXPECT_EQ(s.runner->failures, 0);
    EXPECT_EQ(s.fake->live_sequences(), 0);
    // Only the index holds blocks now; the budget charges exactly those.
    EXPECT_EQ(s.budget->used_bytes(), s.budget->index_bytes());
    EXPECT_EQ(s.budget->pool()->stats().used_bytes, s.budget->index_bytes());
    EXPECT_EQ(s.budget->pool()->stats().failed_allocations, 0);
    const PrefixCacheStats st = s.engine->prefix_cache_stats();
    preemptions += s.engine->stats().preemptions;
    evicted += st.index.evicted_blocks;
    hits += st.hits;
    recompute_hits += st.recompute_hits;
  }
  std::printf(
      "random workload: %lld hits, %lld recompute hits, %lld evicted blocks, %lld preemptions, "
      "%lld requests compared bitwise, %lld approximate (ced window replay)\n",
      static_cast<long long>(hits), static_cast<long long>(recompute_hits), static_cast<long long>(evicted),
      static_cast<long long>(preemptions), static_cast<long long>(exact_checked), static_cast<long long>(approximate));
  EXPECT_GT(hits, 50);
  EXPECT_GT(evicted, 0);
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(recompute_hits, 0);
  EXPECT_GT(approximate, 0);
}

}  // namespace
}  // namespace cedar::engine
