// The SSD tier under the prefix cache on the tiny DeepSeek-V4.1 checkpoint (DeepseekRunner, the real
// resume path): a "server" (pool, budget, runner, engine, KvDiskStore) runs a prompt, a new one on the
// same directory runs it again.
//   * exact mode: no SWA snapshot survives a restart; the exact bounded replay (R = P − 71 on this
//     model) hits the blocks on disk, and the logits equal the first run's bit for bit;
//   * ced mode, P <= window: the SWA replay starts at R = 0, the continuation is the uncached one bit
//     for bit although its global KV came from disk;
//   * ced mode, P past the bound: the exact bounded replay (R = min(P, N − tail) − 50), bit for bit the
//     uncached run; the opt-in window replay (R = P − window, approximate): bit for bit what the same
//     replay gives from in-memory blocks (the SSD tier loses nothing), and within the replay tolerance of
//     the agent-trace test (agent_trace_test.cpp) against the uncached ced run;
//   * a damaged file between runs: a log line, the blocks before it hit, the output is the uncached one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>

#include "engine/engine.h"
#include "engine/pool_cache_budget.h"
#include "io/model_fingerprint.h"
#include "kv/kv_disk_store.h"
#include "model/deepseek_v41.h"
#include "model/model_stats.h"
#include "test_support/forwarding_runner.h"
#include "test_support/greedy.h"
#include "test_support/tiny_model.h"

namespace cedar::engine {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kTokensPerBlock = 8;
// The window replay against the uncached ced run, logits of the first generated token: the per-turn
// bounds of agent_trace_test.cpp (measured there on this model).
constexpr double kMinCosine = 0.85, kMaxRelL2 = 0.55;

// Keeps the logits of every sampled row.
class LogitsRunner final : public test_support::ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  void run_batch(std::span<BatchItem> items) override {
    ForwardingRunner::run_batch(items);
    for (const BatchItem& item : items) {
      EXPECT_TRUE(item.status.ok()) << item.status.error().message;
      if (item.status.ok() && item.want_logits) rows.push_back(item.logits);
    }
  }
  std::vector<std::vector<float>> rows;
};

class DiskCacheModelTest : public test_support::TinyV41Suite {
 protected:
  static void SetUpTestSuite() {
    TinyV41Suite::SetUpTestSuite();
    if (HasFatalFailure()) return;
    auto fp = model_fingerprint(checkpoint());
    ASSERT_TRUE(fp.ok()) << fp.error().message;
    fingerprint_ = new std::string(*fp);
  }
  static void TearDownTestSuite() {
    delete fingerprint_;
    fingerprint_ = nullptr;
    TinyV41Suite::TearDownTestSuite();
  }
  void SetUp() override {
    dir_ = root() / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
  }

  // One server process on dir_.
  struct Server {
    std::unique_ptr<PoolCacheBudget> budget;
    std::unique_ptr<KvDiskStore> store;
    std::unique_ptr<DeepseekRunner> runner;
    std::unique_ptr<LogitsRunner> logits;
    std::unique_ptr<Engine> engine;
    std::vector<std::string> log;
    std::mutex log_mu;
  };
  // store = false: memory only; swa_pool_bytes 0 forces SWA replay.
  std::unique_ptr<Server> start(ForwardMode mode, bool store = true, int64_t swa_pool_bytes = int64_t{1} << 30,
                                SwaReplay replay = SwaReplay::kExact) {
    auto s = std::make_unique<Server>();
    const int64_t window = model_->config().sliding_window;
    const int64_t history = window + kTokensPerBlock;
    const KvBudget kb = compute_kv_budget(model_->config(), model_->plan());
    auto layout = pool_cache_layout(model_->config(), model_->plan(),
                                    kb.swa_bytes_per_sequence / window * (window + history), kTokensPerBlock);
    EXPECT_TRUE(layout.ok());
    auto budget = PoolCacheBudget::create(*layout, int64_t{1} << 26);
    EXPECT_TRUE(budget.ok());
    s->budget = std::move(*budget);
    KvDiskStoreOptions so;
    so.dir = dir_;
    so.budget_bytes = int64_t{1} << 28;
    so.model_fingerprint = *fingerprint_;
    auto dl = kv_disk_layout_for(model_->config(), model_->plan(), kTokensPerBlock);
    EXPECT_TRUE(dl.ok());
    so.layout = *dl;
    so.log = [srv = s.get()](const std::string& line) {
      std::lock_guard lock(srv->log_mu);
      srv->log.push_back(line);
    };
    if (store) {
      auto opened = KvDiskStore::open(so);
      EXPECT_TRUE(opened.ok()) << opened.error().message;
      s->store = std::move(*opened);
    }
    KvCacheOptions kv;
    kv.tokens_per_block = kTokensPerBlock;
    kv.pool = s->budget->pool();
    s->runner = std::make_unique<DeepseekRunner>(*model_, nullptr, kv, *fingerprint_);
    s->logits = std::make_unique<LogitsRunner>(*s->runner);
    EngineOptions eo;
    eo.mode = mode;
    eo.step_token_budget = 64;
    eo.prefix_cache.swa_history = history;
    eo.prefix_cache.store = s->store.get();
    eo.prefix_cache.swa_pool_bytes = swa_pool_bytes;
    eo.prefix_cache.swa_replay = replay;
    s->engine = std::make_unique<Engine>(*s->logits, *s->budget, eo);
    EXPECT_NE(s->engine->prefix_cache(), nullptr) << s->engine->prefix_cache_status();
    return s;
  }
  static RequestResult run(Server& s, const std::vector<int64_t>& prompt) {
    GenerationRequest g;
    g.prompt = prompt;
    g.params = test_support::greedy(2);
    EXPECT_TRUE(g.params.max_tokens > 0);
    EXPECT_TRUE(s.engine->submit(g).ok());
    EXPECT_TRUE(s.engine->run_until_idle().ok());
    auto done = s.engine->take_finished();
    EXPECT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].finish, FinishReason::kLength) << done[0].error;
    return done[0];
  }
  static std::vector<int64_t> prompt(int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int64_t>(rng() % 128000));
    return ids;
  }

  fs::path dir_;
  static inline std::string* fingerprint_ = nullptr;
};

TEST_F(DiskCacheModelTest, ExactModeHitsFromDiskAfterARestart) {
  const int64_t bound = model_->exact_replay_rows(ForwardMode::Exact);
  ASSERT_EQ(bound, 70);
  const std::vector<int64_t> p = prompt(90, 1);  // P = 88
  std::vector<std::vector<float>> reference;
  {
    auto first = start(ForwardMode::Exact);
    run(*first, p);
    reference = first->logits->rows;
    EXPECT_EQ(first->store->stats().files, 11);  // blocks [0, 88) of the prompt; 91 tokens at the end: the same
  }
  auto second = start(ForwardMode::Exact);
  const RequestResult r = run(*second, p);
  EXPECT_EQ(r.stats.cached_tokens, 88);
  EXPECT_EQ(r.stats.replayed_tokens, bound + 1);  // no snapshot survives a restart: R = P − bound − 1
  EXPECT_FALSE(r.stats.cache_approximate);
  const PrefixCacheStats st = second->engine->prefix_cache_stats();
  EXPECT_EQ(st.index.store_loaded_blocks, 11);
  EXPECT_EQ(st.replay_restores, 1);
  EXPECT_EQ(second->logits->rows, reference);  // bit for bit
}

TEST_F(DiskCacheModelTest, CedReplayFromZeroIsBitwiseEqualWithKvFromDisk) {
  const int64_t window = model_->config().sliding_window;
  ASSERT_LE(kTokensPerBlock, window);
  const std::vector<int64_t> p = prompt(kTokensPerBlock + 4, 2);  // one full block: P = 8 <= window
  std::vector<std::vector<float>> reference;
  {
    auto first = start(ForwardMode::Ced);
    const RequestResult a = run(*first, p);
    EXPECT_EQ(a.stats.cached_tokens, 0);
    reference = first->logits->rows;
  }
  auto second = start(ForwardMode::Ced);
  const RequestResult b = run(*second, p);
  EXPECT_EQ(b.stats.cached_tokens, kTokensPerBlock);
  EXPECT_EQ(b.stats.replayed_tokens, kTokensPerBlock);  // R = max(0, P − window) = 0
  EXPECT_FALSE(b.stats.cache_approximate);
  EXPECT_EQ(second->engine->prefix_cache_stats().index.store_loaded_blocks, 1);
  EXPECT_EQ(second->logits->rows, reference);
}

TEST_F(DiskCacheModelTest, CedExactReplayAfterARestartIsBitwiseEqual) {
  const int64_t bound = model_->exact_replay_rows(ForwardMode::Ced);
  ASSERT_EQ(bound, 49);
  const std::vector<int64_t> p = prompt(90, 5);  // P = 88, N − tail = 82: R = 82 − 50
  std::vector<std::vector<float>> reference;
  {
    auto first = start(ForwardMode::Ced);
    run(*first, p);
    reference = first->logits->rows;
  }
  auto second = start(ForwardMode::Ced);
  const RequestResult b = run(*second, p);
  EXPECT_EQ(b.stats.cached_tokens, 88);
  EXPECT_EQ(b.stats.replayed_tokens, 88 - (82 - bound - 1));
  EXPECT_FALSE(b.stats.cache_approximate);
  EXPECT_EQ(second->engine->prefix_cache_stats().index.store_loaded_blocks, 11);
  EXPECT_EQ(second->logits->rows, reference);  // bit for bit
}

TEST_F(DiskCacheModelTest, CedWindowReplayAfterARestartIsWithinTheTolerance) {
  const std::vector<int64_t> p = prompt(43, 3);
  std::vector<std::vector<float>> reference;
  {
    auto first = start(ForwardMode::Ced);
    run(*first, p);
    reference = first->logits->rows;
  }
  auto second = start(ForwardMode::Ced, true, int64_t{1} << 30, SwaReplay::kWindow);
  const RequestResult b = run(*second, p);
  const int64_t window = model_->config().sliding_window;
  EXPECT_EQ(b.stats.cached_tokens, 40);
  EXPECT_EQ(b.stats.replayed_tokens, window);  // R = P − window
  EXPECT_TRUE(b.stats.cache_approximate);
  EXPECT_EQ(second->engine->prefix_cache_stats().index.store_loaded_blocks, 5);
  ASSERT_FALSE(second->logits->rows.empty());
  ASSERT_FALSE(reference.empty());
  const std::vector<float>& a = second->logits->rows[0];
  const std::vector<float>& ref = reference[0];
  ASSERT_EQ(a.size(), ref.size());
  double dot = 0, na = 0, nr = 0, diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    dot += static_cast<double>(a[i]) * ref[i];
    na += static_cast<double>(a[i]) * a[i];
    nr += static_cast<double>(ref[i]) * ref[i];
    diff += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
  }
  const double cosine = dot / std::sqrt(na * nr), rel_l2 = std::sqrt(diff / nr);
  std::printf("ced window replay after a restart (KV from disk): cosine %.6f, rel-L2 %.4f\n", cosine, rel_l2);
  EXPECT_GE(cosine, kMinCosine);
  EXPECT_LE(rel_l2, kMaxRelL2);

  // The same replay from blocks held in memory (no snapshots): identical logits.
  auto memory = start(ForwardMode::Ced, /*store=*/false, /*swa_pool_bytes=*/0, SwaReplay::kWindow);
  run(*memory, p);
  EXPECT_EQ(memory->logits->rows, reference);  // the first run is the uncached one
  memory->logits->rows.clear();
  const RequestResult m = run(*memory, p);
  EXPECT_EQ(m.stats.cached_tokens, 40);
  EXPECT_EQ(m.stats.replayed_tokens, window);
  EXPECT_EQ(memory->logits->rows, second->logits->rows);
}

TEST_F(DiskCacheModelTest, ADamagedFileMeansALogLineAndARecompute) {
  const std::vector<int64_t> p = prompt(3 * kTokensPerBlock + 2, 4);
  std::vector<std::vector<float>> reference;
  fs::path damaged;
  {
    auto first = start(ForwardMode::Ced);
    run(*first, p);
    reference = first->logits->rows;
    // Block 1's file: the chain from the index's root (the runner's fingerprint and layout).
    const PrefixCacheSupport support = *first->runner->prefix_cache();
    PrefixKey key = prefix_root(support.fingerprint, prefix_layout_descriptor(support));
    for (int64_t k = 0; k < 2; ++k)
      key = prefix_chain(
          key, std::span<const int64_t>(p).subspan(static_cast<size_t>(k * kTokensPerBlock), kTokensPerBlock));
    damaged = first->store->path_of(key);
    ASSERT_TRUE(fs::exists(damaged));
  }
  {
    const auto at = static_cast<std::streamoff>(fs::file_size(damaged) - 10);  // inside the records
    std::fstream f(damaged, std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(at);
    f.write(&c, 1);
    ASSERT_TRUE(f.good());
  }
  auto second = start(ForwardMode::Ced);
  const RequestResult b = run(*second, p);
  EXPECT_EQ(b.stats.cached_tokens, kTokensPerBlock);  // block 0 only; R = 0 (window 8)
  EXPECT_FALSE(b.stats.cache_approximate);
  EXPECT_EQ(second->logits->rows, reference);
  EXPECT_EQ(second->store->stats().corrupt, 1);
  EXPECT_TRUE(fs::exists(damaged));  // the recomputed block was written through again
  bool logged = false;
  {
    std::lock_guard lock(second->log_mu);
    for (const std::string& l : second->log) logged |= l.find(damaged.string()) != std::string::npos;
  }
  EXPECT_TRUE(logged);
}

}  // namespace
}  // namespace cedar::engine
