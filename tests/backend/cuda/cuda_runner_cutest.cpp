// The engine on the GPU (backend/cuda/cuda_runner.h): requests scheduled by engine::Engine over a
// CudaRunner generate exactly the tokens of the same prompts run one at a time straight through
// CudaModel (prefill chunks, then decode_step, device argmax) — whatever the batch, the queueing and
// the chunking — in ced and exact mode.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_runner.h"
#include "cuda_test_util.h"
#include "engine/engine.h"
#include "model/model_stats.h"
#include "model/tiny_checkpoint.h"
#include "test_support/tiny_model.h"

namespace cedar::cuda {
namespace {

namespace fs = std::filesystem;

std::vector<int64_t> prompt(int64_t n, uint64_t seed) { return test_support::xorshift_prompt(n, seed, 777); }

constexpr int64_t kChunk = 64;  // prompts longer than this span several prefill calls

// The host model is loaded once and handed to CudaModel (what `cedar serve --device cuda` does).
struct Fixture {
  std::string host_error;  // the host side (no GPU needed)
  std::string error;       // the host side or the GPU load
  fs::path dir;
  std::unique_ptr<ThreadPool> pool;
  std::shared_ptr<const DeepseekV41Model> host;
  std::unique_ptr<CudaModel> model;
};

Fixture& fixture() {
  static Fixture* f = [] {
    auto* x = new Fixture;
    x->dir = fs::temp_directory_path() / ("cedar-cuda-runner-" + std::to_string(::getpid()));
    fs::remove_all(x->dir);
    TinyCheckpointOptions t;
    t.profile = "tiny";
    t.seed = 3;
    t.tokenizer_files = false;
    if (Status st = make_tiny_checkpoint(t, x->dir, false); !st.ok()) {
      x->error = x->host_error = "make-tiny: " + st.error().message;
      return x;
    }
    x->pool = std::make_unique<ThreadPool>(0);
    LoadOptions lo;
    lo.engram_map = testing::engram_map_path();
    lo.pool = x->pool.get();
    auto host = DeepseekV41Model::load(x->dir, lo);
    if (!host.ok()) {
      x->error = x->host_error = "host load: " + host.error().message;
      return x;
    }
    x->host = std::make_shared<const DeepseekV41Model>(std::move(*host));
    if (!testing::gpu_unavailable_reason().empty()) {
      x->error = "no GPU: " + testing::gpu_unavailable_reason();
      return x;
    }
    CudaModelOptions o;
    o.max_batch = 4;
    o.max_chunk = kChunk;
    o.kv.max_sequences = 8;
    o.kv.max_context = 1024;
    o.kv.token_capacity = 8192;
    o.headroom_bytes = uint64_t{1} << 30;
    o.pool = x->pool.get();
    auto m = CudaModel::load(x->host, o);
    if (!m.ok()) {
      x->error = "CUDA load: " + m.error().message;
      return x;
    }
    x->model = std::move(*m);
    return x;
  }();
  return *f;
}

#define CEDAR_REQUIRE_RUNNER_MODEL(var) \
  CEDAR_REQUIRE_GPU();                  \
  Fixture& var = fixture();             \
  ASSERT_TRUE(var.error.empty()) << var.error;

// The greedy continuation of `ids` straight through CudaModel, one sequence at a time.
std::vector<int64_t> direct_greedy(CudaModel& m, ForwardMode mode, const std::vector<int64_t>& ids, int64_t count) {
  SequenceOptions so;
  so.mode = mode;
  so.prompt_length = static_cast<int64_t>(ids.size());
  auto seq = m.new_sequence(so);
  EXPECT_TRUE(seq.ok()) << seq.error().message;
  if (!seq.ok()) return {};
  CudaStepOutput out;
  const int64_t n = static_cast<int64_t>(ids.size());
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    const Status st = m.prefill(*seq, std::span<const int64_t>(ids).subspan(static_cast<size_t>(i), len),
                                i + len == n ? LogitRows::Last : LogitRows::None, out);
    EXPECT_TRUE(st.ok()) << st.error().message;
    if (!st.ok()) return {};
  }
  std::vector<int64_t> tokens{out.argmax.back()};
  CudaSequence* one[] = {&*seq};
  while (static_cast<int64_t>(tokens.size()) < count) {
    const int64_t t = tokens.back();
    const Status st = m.decode_step(one, std::span<const int64_t>(&t, 1), out);
    EXPECT_TRUE(st.ok()) << st.error().message;
    if (!st.ok()) return tokens;
    tokens.push_back(out.argmax[0]);
  }
  return tokens;
}

struct Case {
  ForwardMode mode;
  int64_t max_running;  // engine; below the request count the rest queue
};

class CudaRunnerEngine : public ::testing::TestWithParam<Case> {};

TEST_P(CudaRunnerEngine, MatchesTheModelRunAloneWhateverTheBatch) {
  CEDAR_REQUIRE_RUNNER_MODEL(f);
  const Case c = GetParam();
  constexpr int64_t kTokens = 12;
  const std::vector<std::vector<int64_t>> prompts = {prompt(150, 1), prompt(37, 2), prompt(90, 3), prompt(5, 4)};
  std::vector<std::vector<int64_t>> expected;
  for (const auto& p : prompts) expected.push_back(direct_greedy(*f.model, c.mode, p, kTokens));

  CudaRunner runner(*f.model);
  engine::ByteCacheBudget budget(runner.cache_footprint(), cuda_runner_budget_bytes(*f.model, 0));
  engine::EngineOptions eo;
  eo.mode = c.mode;
  eo.max_running = c.max_running;
  engine::Engine eng(runner, budget, eo);
  std::vector<engine::RequestId> ids;
  for (const auto& p : prompts) {
    engine::GenerationRequest r;
    r.prompt = p;
    r.params.temperature = 0;
    r.params.max_tokens = kTokens;
    r.params.ignore_eos = true;
    auto id = eng.submit(std::move(r));
    ASSERT_TRUE(id.ok()) << id.error().message;
    ids.push_back(*id);
  }
  const Status st = eng.run_until_idle();
  ASSERT_TRUE(st.ok()) << st.error().message;
  const std::vector<engine::RequestResult> done = eng.take_finished();
  ASSERT_EQ(done.size(), prompts.size());
  for (const engine::RequestResult& r : done) {
    const size_t i = static_cast<size_t>(std::find(ids.begin(), ids.end(), r.id) - ids.begin());
    ASSERT_LT(i, prompts.size());
    EXPECT_EQ(r.finish, engine::FinishReason::kLength) << "request " << i << ": " << r.error;
    EXPECT_EQ(r.tokens, expected[i]) << "request " << i << " (prompt of " << prompts[i].size()
                                     << " tokens): the engine's tokens differ from the model run alone";
  }
  // The requests did share decode steps (the batch the runner exists for).
  EXPECT_EQ(eng.stats().max_running_seen, std::min<int64_t>(c.max_running, static_cast<int64_t>(prompts.size())));
  EXPECT_GT(eng.stats().decode_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaRunnerEngine,
                         ::testing::Values(Case{ForwardMode::Ced, 4}, Case{ForwardMode::Exact, 4},
                                           Case{ForwardMode::Ced, 2}),
                         [](const auto& p) {
                           return std::string(p.param.mode == ForwardMode::Ced ? "ced" : "exact") + "_running" +
                                  std::to_string(p.param.max_running);
                         });

TEST(CudaRunner, RefusesWhatItCannotDo) {
  CEDAR_REQUIRE_RUNNER_MODEL(f);
  CudaRunner runner(*f.model);
  EXPECT_FALSE(runner.prefix_cache().has_value());
  engine::SequenceResume resume;
  engine::SequenceSpec spec;
  spec.mode = ForwardMode::Exact;
  spec.resume = &resume;
  auto s = runner.create_sequence(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("not supported"), std::string::npos) << s.error().message;
  // A token outside the vocabulary fails its item, not the process; the sequence is then discarded.
  spec.resume = nullptr;
  auto seq = runner.create_sequence(spec);
  ASSERT_TRUE(seq.ok()) << seq.error().message;
  const int64_t bad[] = {runner.vocab_size() + 5};
  engine::BatchItem item;
  item.sequence = seq->get();
  item.tokens = bad;
  item.want_logits = true;
  runner.run_batch(std::span<engine::BatchItem>(&item, 1));
  ASSERT_FALSE(item.status.ok());
  EXPECT_NE(item.status.error().message.find("vocabulary"), std::string::npos) << item.status.error().message;
  EXPECT_GT(cuda_runner_budget_bytes(*f.model, 0), 0);
  EXPECT_EQ(cuda_runner_budget_bytes(*f.model, 1000), 1000);
}

TEST(CudaRunner, SharesTheHostModelItIsGiven) {
  CEDAR_REQUIRE_RUNNER_MODEL(f);
  // The device model holds the very host model (no second load of the checkpoint) and keeps it alive.
  EXPECT_EQ(&f.model->host_model(), f.host.get());
  EXPECT_GE(f.host.use_count(), 2);
  EXPECT_EQ(&f.model->config(), &f.host->config());
  CudaModelOptions o;
  auto none = CudaModel::load(std::shared_ptr<const DeepseekV41Model>(), o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("no host model"), std::string::npos) << none.error().message;
}

// No GPU needed from here on: the runner's sizing is host arithmetic over the memory plan.
#define CEDAR_REQUIRE_HOST_MODEL(var) \
  Fixture& var = fixture();           \
  ASSERT_TRUE(var.host_error.empty()) << var.host_error;

TEST(CudaRunnerOptions, PoolsFollowTheBudgetWithinOneAndAllFullContexts) {
  CEDAR_REQUIRE_HOST_MODEL(f);
  const ModelConfig& c = f.host->config();
  const double bpt = compute_kv_budget(c, f.host->plan()).bytes_per_token();
  ASSERT_GT(bpt, 0);
  const int64_t context = 4096;
  auto with_budget = [&](int64_t kv_bytes) {
    return cuda_runner_model_options(c, f.host->plan(), {4, kv_bytes, context});
  };
  const CudaModelOptions mid = with_budget(static_cast<int64_t>(bpt * 10000));  // 10000 positions
  EXPECT_EQ(mid.max_batch, 4);
  EXPECT_EQ(mid.kv.max_sequences, 4);
  EXPECT_EQ(mid.kv.max_context, context);
  EXPECT_NEAR(static_cast<double>(mid.kv.token_capacity), 10000.0, 1.0);
  EXPECT_EQ(with_budget(1).kv.token_capacity, context);                  // at least one full context
  EXPECT_EQ(with_budget(int64_t{1} << 40).kv.token_capacity, 4 * context);  // at most every sequence full
  EXPECT_EQ(cuda_runner_model_options(c, f.host->plan(), {500, 0, context}).max_batch, 64);
  EXPECT_EQ(cuda_runner_model_options(c, f.host->plan(), {0, 0, context}).max_batch, 1);
}

TEST(CudaRunnerOptions, ContextBytesPerPositionIsTheSlopeOfThePlan) {
  CEDAR_REQUIRE_HOST_MODEL(f);
  const ModelConfig& c = f.host->config();
  const LayerPlan& plan = f.host->plan();
  auto slope = cuda_context_bytes_per_position(c, plan, 16);
  ASSERT_TRUE(slope.ok()) << slope.error().message;
  // Another pair of contexts, the pool held fixed: the plan grows by the slope per position.
  auto device_bytes = [&](int64_t context) {
    CudaModelOptions o = cuda_runner_model_options(c, plan, {16, 0, context});
    o.kv.token_capacity = 1 << 18;
    auto p = cuda_model_extra_plan(c, plan, o);
    EXPECT_TRUE(p.ok()) << p.error().message;
    return p.ok() ? static_cast<double>(p->device_bytes()) : 0.0;
  };
  const double grown = device_bytes(200000) - device_bytes(3000);
  EXPECT_NEAR(grown / (200000 - 3000), *slope, 0.01 * *slope);
  // At least the indexer's scores of a full prefill chunk (rows × ceil(context / ratio) floats for the
  // lowest ratio of a layer that scores every compressed slot) and the two RoPE tables.
  const CudaModelOptions o = cuda_runner_model_options(c, plan, {16, 0, 1});
  const int64_t rows = std::max(o.max_batch, o.max_chunk);
  int64_t ratio = 0;
  for (const LayerRole& r : plan.layers)
    if (r.owns_indexer && r.compress_ratio > 0 && !r.uses_candidates)
      ratio = ratio == 0 ? r.compress_ratio : std::min(ratio, r.compress_ratio);
  ASSERT_GT(ratio, 0) << "the tiny model has an indexer that scores every slot";
  const double floor_bytes = static_cast<double>(rows) * 4.0 / static_cast<double>(ratio) +
                             2.0 * static_cast<double>(c.qk_rope_head_dim) * 4.0;
  EXPECT_GE(*slope, floor_bytes);
}

}  // namespace
}  // namespace cedar::cuda
