// The SSD tier (kv/kv_disk_store.h) under the engine's prefix cache, end to end on the fake model
// (engine/fake_model.h), whose resumes fail unless every record of every handed-back block continues the
// request's own token history, so a block that came back from disk with one wrong byte fails the request.
//   * restart persistence: a new pool, index, engine and store on the same directory find the blocks
//     of the previous run; no snapshot survives a restart, and the exact bounded replay (both modes) is
//     bitwise equal to an uncached run; the opt-in window replay (ced) is flagged approximate;
//   * a damaged file between runs: a log line, the prefix before it still hits, the rest recomputes,
//     the output is the uncached one, and the next run hits everything again;
//   * in one engine, blocks evicted from memory come back from disk.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <mutex>

#include "engine/engine.h"
#include "engine/fake_model.h"
#include "engine/pool_cache_budget.h"
#include "kv/kv_disk_store.h"
#include "test_support/fake_engine.h"

namespace cedar::engine {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kB = 8;  // tokens per block

PoolCacheLayout fake_layout() { return test_support::fake_pool_layout(kB); }

KvDiskLayout disk_layout(const PoolCacheLayout& l) {
  KvDiskLayout d;
  d.tokens_per_block = l.tokens_per_block;
  for (const PoolCacheLayout::Stream& s : l.streams)
    d.streams.push_back({s.block_bytes / s.entries_per_block, s.entries_per_block});
  return d;
}

// One server process: pool, budget, model, engine and its SSD tier.
struct Server {
  std::unique_ptr<PoolCacheBudget> budget;
  std::unique_ptr<FakeModelRunner> fake;
  std::unique_ptr<KvDiskStore> store;
  std::unique_ptr<Engine> engine;
  std::vector<std::string> log;
  std::mutex log_mu;

  Server(const fs::path& dir, ForwardMode mode, int64_t window, int64_t capacity = 1 << 20,
         SwaReplay replay = SwaReplay::kExact) {
    auto b = PoolCacheBudget::create(fake_layout(), capacity);
    EXPECT_TRUE(b.ok());
    budget = std::move(*b);
    FakeModelOptions fo;
    fo.pool = budget->pool();
    fo.layout = fake_layout();
    fo.sliding_window = window;
    fake = std::make_unique<FakeModelRunner>(fo);
    KvDiskStoreOptions so;
    so.dir = dir;
    so.budget_bytes = 1 << 24;
    so.model_fingerprint = "fake-model";
    so.layout = disk_layout(fake_layout());
    so.log = [this](const std::string& line) {
      std::lock_guard lock(log_mu);
      log.push_back(line);
    };
    auto s = KvDiskStore::open(so);
    EXPECT_TRUE(s.ok()) << s.error().message;
    if (s.ok()) store = std::move(*s);
    EngineOptions eo;
    eo.mode = mode;
    eo.prefix_cache.store = store.get();
    eo.prefix_cache.swa_replay = replay;
    engine = std::make_unique<Engine>(*fake, *budget, eo);
    EXPECT_NE(engine->prefix_cache(), nullptr) << engine->prefix_cache_status();
  }
  ~Server() {
    engine.reset();  // the index releases its blocks before the pool and the store go
  }
  RequestResult run(const std::vector<int64_t>& prompt, int64_t max_tokens, uint64_t seed) {
    GenerationRequest g;
    g.prompt = prompt;
    g.params.max_tokens = max_tokens;
    g.params.temperature = 0.8;
    g.params.seed = seed;
    g.params.ignore_eos = true;
    auto id = engine->submit(std::move(g));
    EXPECT_TRUE(id.ok()) << id.error().message;
    EXPECT_TRUE(engine->run_until_idle().ok());
    auto done = engine->take_finished();
    EXPECT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].error, "");
    return done[0];
  }
  std::vector<std::string> lines() {
    std::lock_guard lock(log_mu);
    return log;
  }
};

// The uncached output: sample from the fake logits of the whole history.
std::vector<int64_t> solo(const FakeModelRunner& model, const std::vector<int64_t>& prompt, int64_t max_tokens,
                          uint64_t seed) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.temperature = 0.8;
  p.seed = seed;
  p.ignore_eos = true;
  auto sampler = Sampler::create(p, model.vocab_size(), seed);
  EXPECT_TRUE(sampler.ok());
  sampler->add_prompt(prompt);
  uint64_t h = FakeModelRunner::kInitialHash;
  for (int64_t t : prompt) h = FakeModelRunner::extend_hash(h, t);
  std::vector<int64_t> out;
  while (static_cast<int64_t>(out.size()) < max_tokens) {
    const int64_t t = sampler->sample(model.logits_for(h))->token;
    out.push_back(t);
    h = FakeModelRunner::extend_hash(h, t);
  }
  return out;
}

std::vector<int64_t> tokens(int64_t n, int64_t salt) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(2 + (i * 7 + salt * 13) % 60);
  return v;
}

class EngineDiskCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cedar-engine-disk-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

TEST_F(EngineDiskCacheTest, BlocksSurviveARestart) {
  const std::vector<int64_t> prompt = tokens(29, 1);  // 3 full blocks before the last token
  {
    Server first(dir_, ForwardMode::Ced, 4);
    const RequestResult a = first.run(prompt, 4, 1);
    EXPECT_EQ(a.stats.cached_tokens, 0);
    EXPECT_EQ(a.tokens, solo(*first.fake, prompt, 4, 1));
    // Prompt blocks [0, 24) and, at the end, the 33-token sequence's blocks [0, 32).
    EXPECT_EQ(first.store->stats().files, 4);
    EXPECT_EQ(first.engine->prefix_cache_stats().index.store_written_blocks, 4);
  }
  // ced: without a snapshot the SWA state is rebuilt by the exact bounded replay, R = t − 6 − 1 = 17 (the
  // fake model's ced replay rows), over KV from disk: the uncached output.
  {
    Server second(dir_, ForwardMode::Ced, 4);
    EXPECT_EQ(second.store->stats().files, 4);
    const RequestResult b = second.run(prompt, 4, 2);
    EXPECT_EQ(b.stats.cached_tokens, 24);
    EXPECT_EQ(b.stats.replayed_tokens, 7);
    EXPECT_FALSE(b.stats.cache_approximate);
    EXPECT_EQ(b.tokens, solo(*second.fake, prompt, 4, 2));
    const PrefixCacheStats st = second.engine->prefix_cache_stats();
    EXPECT_EQ(st.index.store_loaded_blocks, 3);
    EXPECT_EQ(st.replay_restores, 1);
    EXPECT_EQ(second.fake->resumes(), 1);  // the model accepted every record read back from disk
    EXPECT_EQ(second.store->stats().hits, 3);
    EXPECT_EQ(second.store->stats().corrupt, 0);
  }
  // ced with the opt-in window replay (window 4): R = P − window, flagged approximate.
  {
    Server window(dir_, ForwardMode::Ced, 4, 1 << 20, SwaReplay::kWindow);
    const RequestResult b = window.run(prompt, 4, 2);
    EXPECT_EQ(b.stats.cached_tokens, 24);
    EXPECT_EQ(b.stats.replayed_tokens, 4);
    EXPECT_TRUE(b.stats.cache_approximate);
    EXPECT_EQ(window.engine->prefix_cache_stats().window_replay_restores, 1);
  }
  // ced, window 32: the bounded replay starts at R = 0 (t − 7 < 0): the uncached continuation, too.
  {
    Server third(dir_, ForwardMode::Ced, 32);
    const RequestResult c = third.run(prompt, 5, 3);
    EXPECT_EQ(c.stats.cached_tokens, 24);
    EXPECT_EQ(c.stats.replayed_tokens, 24);
    EXPECT_FALSE(c.stats.cache_approximate);
    EXPECT_EQ(c.tokens, solo(*third.fake, prompt, 5, 3));
    EXPECT_EQ(third.engine->prefix_cache_stats().index.store_loaded_blocks, 3);
  }
  // exact mode: no snapshot survives a restart; the exact bounded replay (R = 24 − 10 − 1) hits from disk.
  {
    Server fourth(dir_, ForwardMode::Exact, 4);
    const RequestResult d = fourth.run(prompt, 5, 4);
    EXPECT_EQ(d.stats.cached_tokens, 24);
    EXPECT_EQ(d.stats.replayed_tokens, 11);
    EXPECT_FALSE(d.stats.cache_approximate);
    EXPECT_EQ(d.tokens, solo(*fourth.fake, prompt, 5, 4));
    EXPECT_EQ(fourth.engine->prefix_cache_stats().index.store_loaded_blocks, 3);
  }
}

TEST_F(EngineDiskCacheTest, ADamagedFileBetweenRunsIsLoggedAndRecomputed) {
  const std::vector<int64_t> prompt = tokens(33, 2);  // 4 full blocks before the last token
  std::vector<fs::path> chain_files;
  {
    Server first(dir_, ForwardMode::Ced, 40);
    first.run(prompt, 2, 1);
    // The files of the prompt's blocks, block 0 first.
    PrefixKey key = prefix_root("fake-model", prefix_layout_descriptor(*first.fake->prefix_cache()));
    for (int64_t k = 0; k < 4; ++k) {
      key = prefix_chain(key, std::span<const int64_t>(prompt).subspan(static_cast<size_t>(k * kB), kB));
      chain_files.push_back(first.store->path_of(key));
      ASSERT_TRUE(fs::exists(chain_files.back())) << k;
    }
  }
  {  // one bit of block 2's records
    std::fstream f(chain_files[2], std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(-20, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x04);
    f.seekp(-20, std::ios::end);
    f.write(&c, 1);
  }
  {
    Server second(dir_, ForwardMode::Ced, 40);
    const RequestResult b = second.run(prompt, 5, 2);
    EXPECT_EQ(b.stats.cached_tokens, 16);  // blocks 0 and 1; block 2 and everything after recompute
    EXPECT_FALSE(b.stats.cache_approximate);
    EXPECT_EQ(b.tokens, solo(*second.fake, prompt, 5, 2));
    EXPECT_EQ(second.store->stats().corrupt, 1);
    const auto lines = second.lines();
    bool logged = false;
    for (const std::string& l : lines)
      logged |= l.find(chain_files[2].string()) != std::string::npos && l.find("checksum") != std::string::npos;
    EXPECT_TRUE(logged) << (lines.empty() ? "no log" : lines.back());
  }
  {  // the recomputed blocks were written through again
    Server third(dir_, ForwardMode::Ced, 40);
    const RequestResult c = third.run(prompt, 5, 3);
    EXPECT_EQ(c.stats.cached_tokens, 32);
    EXPECT_EQ(c.tokens, solo(*third.fake, prompt, 5, 3));
    EXPECT_EQ(third.store->stats().corrupt, 0);
  }
  {  // a truncated file
    std::error_code ec;
    fs::resize_file(chain_files[1], 100, ec);
    ASSERT_FALSE(ec);
    Server fourth(dir_, ForwardMode::Ced, 40);
    const RequestResult d = fourth.run(prompt, 3, 4);
    EXPECT_EQ(d.stats.cached_tokens, 8);
    EXPECT_EQ(d.tokens, solo(*fourth.fake, prompt, 3, 4));
    EXPECT_EQ(fourth.store->stats().corrupt, 1);
  }
}

TEST_F(EngineDiskCacheTest, BlocksEvictedFromMemoryComeBackFromDisk) {
  // A budget that holds about one request's blocks: the second prompt's blocks evict the first's.
  const PoolCacheLayout layout = fake_layout();
  const int64_t capacity = layout.global_bytes_for(48) + layout.bytes_per_sequence;
  Server s(dir_, ForwardMode::Ced, 64, capacity);
  const std::vector<int64_t> a = tokens(41, 3), b = tokens(41, 4);
  s.run(a, 2, 1);
  s.run(b, 2, 2);
  s.run(tokens(41, 5), 2, 3);
  const PrefixCacheStats before = s.engine->prefix_cache_stats();
  ASSERT_GT(before.index.evicted_blocks, 0) << "the budget should have forced evictions";
  const RequestResult again = s.run(a, 4, 4);
  const PrefixCacheStats after = s.engine->prefix_cache_stats();
  EXPECT_GT(after.index.store_loaded_blocks, before.index.store_loaded_blocks);
  EXPECT_GT(again.stats.cached_tokens, 0);
  EXPECT_FALSE(again.stats.cache_approximate);  // window 64: replay from R = 0
  EXPECT_EQ(again.tokens, solo(*s.fake, a, 4, 4));
  EXPECT_EQ(s.store->stats().corrupt, 0);
}

}  // namespace
}  // namespace cedar::engine
