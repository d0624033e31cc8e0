// The engine's scheduling on the fake model (no weights): continuous batching, chunked prefill,
// preemption under tiny cache budgets, cancellation, finish reasons and streaming. The reference for
// every request is a solo run written here: the fake model's logits are a pure function of the token
// history, so a request's tokens must equal a plain loop "logits of history → sampler → append"
// however the engine batched, chunked, preempted or recomputed it.
#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine/fake_model.h"
#include "model/tokenizer_source.h"
#include "test_support/fake_engine.h"
#include "test_support/greedy.h"

namespace cedar::engine {
namespace {

struct Spec {
  std::vector<int64_t> prompt;
  SamplingParams params;
};

// Solo reference: sample from the fake logits of the whole history, token by token.
std::vector<int64_t> solo(const FakeModelRunner& model, const Spec& s, uint64_t seed) {
  return test_support::fake_solo_tokens(model, s.prompt, s.params, seed);
}

Spec random_spec(std::mt19937_64& rng, int64_t vocab) {
  Spec s;
  const int64_t n = std::uniform_int_distribution<int64_t>(1, 40)(rng);
  for (int64_t i = 0; i < n; ++i) s.prompt.push_back(std::uniform_int_distribution<int64_t>(2, vocab - 1)(rng));
  s.params.max_tokens = std::uniform_int_distribution<int64_t>(1, 24)(rng);
  if (rng() % 2) {
    s.params.temperature = 0;
  } else {
    s.params.temperature = 0.9;
    s.params.top_k = 20;
    s.params.seed = rng() % 1000;
  }
  return s;
}

TEST(EngineTest, RandomArrivalsCancellationsAndTinyBudgetsMatchSoloRuns) {
  int64_t total_preemptions = 0, total_cancelled = 0;
  for (uint64_t trial = 0; trial < 40; ++trial) {
    std::mt19937_64 rng(trial);
    FakeModelOptions fo;
    fo.eos_bias = 1.5;  // some requests stop on EOS, some run to max_tokens
    FakeModelRunner model(fo);
    // Room for a handful of tokens beyond one long request: preemption is frequent.
    const int64_t capacity = fo.footprint.bytes_for(70 + static_cast<int64_t>(rng() % 80));
    ByteCacheBudget budget(fo.footprint, capacity);
    EngineOptions eo;
    eo.step_token_budget = 1 + static_cast<int64_t>(rng() % 24);
    eo.max_running = 1 + static_cast<int64_t>(rng() % 6);
    Engine engine(model, budget, eo);

    std::map<RequestId, Spec> specs;
    std::set<RequestId> cancelled;
    std::map<RequestId, std::vector<int64_t>> streamed;
    const int n_requests = 12;
    int submitted = 0;
    while (submitted < n_requests || engine.has_work()) {
      if (submitted < n_requests && rng() % 3 == 0) {  // random arrival between steps
        Spec s = random_spec(rng, model.vocab_size());
        GenerationRequest req{s.prompt, s.params, nullptr};
        auto& sink = streamed;
        req.on_event = [&sink](const StreamEvent& ev) {
          if (ev.token) sink[ev.id].push_back(ev.token->token);
        };
        auto id = engine.submit(std::move(req));
        ASSERT_TRUE(id.ok()) << id.error().message;
        specs[*id] = s;
        ++submitted;
      }
      if (!specs.empty() && rng() % 17 == 0) {  // cancel a random (maybe finished) request
        auto it = specs.begin();
        std::advance(it, static_cast<long>(rng() % specs.size()));
        engine.cancel(it->first);
        cancelled.insert(it->first);
      }
      ASSERT_TRUE(engine.step().ok());
      EXPECT_LE(budget.used_bytes(), budget.capacity_bytes());
    }
    std::map<RequestId, RequestResult> results;
    for (auto& r : engine.take_finished()) results[r.id] = std::move(r);
    ASSERT_EQ(results.size(), specs.size()) << "trial " << trial << ": a request was lost";
    for (const auto& [id, spec] : specs) {
      const RequestResult& r = results[id];
      const auto want = solo(model, spec, spec.params.seed.value_or(0));
      EXPECT_EQ(streamed[id], r.tokens) << "trial " << trial << " request " << id;
      if (r.finish == FinishReason::kCancelled) {
        EXPECT_TRUE(cancelled.count(id));
        ASSERT_LE(r.tokens.size(), want.size());
        EXPECT_TRUE(std::equal(r.tokens.begin(), r.tokens.end(), want.begin())) << "trial " << trial << " request " << id;
        ++total_cancelled;
        continue;
      }
      EXPECT_EQ(r.tokens, want) << "trial " << trial << " request " << id;
      const bool eos = !want.empty() && want.back() == model.eos_token();
      EXPECT_EQ(r.finish, eos ? FinishReason::kStop : FinishReason::kLength) << "trial " << trial << " request " << id;
      total_preemptions += r.stats.preemptions;
    }
    EXPECT_EQ(budget.used_bytes(), 0);
    EXPECT_EQ(budget.sequences(), 0);
    EXPECT_EQ(model.live_sequences(), 0);
  }
  EXPECT_GT(total_preemptions, 0) << "the budgets never forced a preemption: the test does not test it";
  EXPECT_GT(total_cancelled, 0);
}

TEST(EngineTest, DecodeTokensComeFirstAndPrefillIsChunkedUnderTheBudget) {
  FakeModelRunner model;
  ByteCacheBudget budget(model.cache_footprint(), 1 << 30);
  EngineOptions eo;
  eo.step_token_budget = 8;
  Engine engine(model, budget, eo);
  const SamplingParams p = test_support::greedy(30);
  ASSERT_TRUE(engine.submit({{5, 6, 7}, p, nullptr}).ok());
  ASSERT_TRUE(engine.step().ok());  // the 3-token prompt
  ASSERT_TRUE(engine.submit({std::vector<int64_t>(50, 9), p, nullptr}).ok());
  // Each step: 1 decode token of the first request + a 7-token chunk of the second prompt.
  for (int i = 0; i < 7; ++i) {
    const int64_t before = model.tokens_processed();
    ASSERT_TRUE(engine.step().ok());
    EXPECT_EQ(model.tokens_processed() - before, 8) << "step " << i;
  }
  EXPECT_EQ(engine.stats().prefill_tokens, 3 + 49);
  ASSERT_TRUE(engine.run_until_idle().ok());
  auto done = engine.take_finished();
  ASSERT_EQ(done.size(), 2u);
  for (const auto& r : done) EXPECT_EQ(r.finish, FinishReason::kLength);
}

TEST(EngineTest, CancelWaitingAndRunningRequests) {
  FakeModelRunner model;
  ByteCacheBudget budget(model.cache_footprint(), 1 << 30);
  EngineOptions eo;
  eo.max_running = 1;
  Engine engine(model, budget, eo);
  const SamplingParams p = test_support::greedy(100);
  std::vector<FinishReason> last_events;
  auto cb = [&](const StreamEvent& ev) {
    if (ev.finish != FinishReason::kNone) last_events.push_back(ev.finish);
  };
  const RequestId a = *engine.submit({{3, 4}, p, cb});
  const RequestId b = *engine.submit({{5, 6}, p, cb});
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(engine.step().ok());
  engine.cancel(b);  // waiting (max_running = 1)
  engine.cancel(a);  // running
  ASSERT_TRUE(engine.step().ok());
  EXPECT_FALSE(engine.has_work());
  auto done = engine.take_finished();
  ASSERT_EQ(done.size(), 2u);
  for (const auto& r : done) EXPECT_EQ(r.finish, FinishReason::kCancelled);
  EXPECT_EQ(last_events, (std::vector<FinishReason>{FinishReason::kCancelled, FinishReason::kCancelled}));
  EXPECT_EQ(budget.used_bytes(), 0);
  EXPECT_EQ(model.live_sequences(), 0);
  engine.cancel(a);  // cancelling a finished request is harmless
  ASSERT_TRUE(engine.step().ok());
}

TEST(EngineTest, RequestsThatCanNeverFitAreRefusedOrFinishWithAnError) {
  FakeModelRunner model;
  const CacheFootprint f = model.cache_footprint();
  ByteCacheBudget budget(f, f.bytes_for(20));
  Engine engine(model, budget, EngineOptions{});
  const SamplingParams p = test_support::greedy(50);
  auto too_long = engine.submit({std::vector<int64_t>(20, 3), p, nullptr});
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.error().message.find("cache"), std::string::npos);
  ASSERT_TRUE(engine.submit({std::vector<int64_t>(10, 3), p, nullptr}).ok());  // grows past 20 tokens
  ASSERT_TRUE(engine.run_until_idle().ok());
  auto done = engine.take_finished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].finish, FinishReason::kError);
  // Feeding tokens up to the 20th (the cache's limit) samples 11 tokens; the next one needs slot 21.
  EXPECT_EQ(done[0].tokens.size(), 11u);
  EXPECT_NE(done[0].error.find("cannot hold"), std::string::npos);
  EXPECT_EQ(budget.used_bytes(), 0);
}

TEST(EngineTest, ModelFailureFinishesOnlyThatRequest) {
  FakeModelOptions fo;
  fo.fail_at_length = 30;
  FakeModelRunner model(fo);
  ByteCacheBudget budget(model.cache_footprint(), 1 << 30);
  Engine engine(model, budget, EngineOptions{});
  const SamplingParams p = test_support::greedy(5);
  const RequestId bad = *engine.submit({std::vector<int64_t>(40, 3), p, nullptr});
  const RequestId good = *engine.submit({std::vector<int64_t>(4, 3), p, nullptr});
  ASSERT_TRUE(engine.run_until_idle().ok());
  for (const auto& r : engine.take_finished()) {
    EXPECT_EQ(r.finish, r.id == bad ? FinishReason::kError : FinishReason::kLength) << "request " << r.id;
    EXPECT_TRUE(r.id == bad || r.id == good);
  }
  EXPECT_EQ(model.live_sequences(), 0);
}

TEST(EngineTest, InvalidRequestsAreRejectedAtSubmit) {
  FakeModelRunner model;
  ByteCacheBudget budget(model.cache_footprint(), 1 << 30);
  Engine engine(model, budget, EngineOptions{});
  EXPECT_FALSE(engine.submit({{}, {}, nullptr}).ok());
  EXPECT_FALSE(engine.submit({{3, 64}, {}, nullptr}).ok());  // vocab is 64
  SamplingParams p;
  p.stop = {"x"};
  auto r = engine.submit({{3}, p, nullptr});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("tokenizer"), std::string::npos);
  EXPECT_FALSE(engine.has_work());
}

TEST(EngineTest, StopStringsAndStopIdsCutTheDetokenizedText) {
  auto path = find_tokenizer_json({});
  ASSERT_TRUE(path.ok()) << path.error().message;
  auto tok = text::Tokenizer::load(path->string());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  // Ids 3..66 of the DeepSeek vocabulary are single-byte tokens: the fake model speaks in characters.
  FakeModelOptions fo;
  fo.vocab = 67;
  FakeModelRunner model(fo);
  ByteCacheBudget budget(model.cache_footprint(), 1 << 30);
  EngineOptions eo;
  eo.tokenizer = &*tok;
  Spec s;
  s.prompt = {10, 11, 12};
  s.params.temperature = 0;
  s.params.ignore_eos = true;
  s.params.max_tokens = 40;
  const auto ids = solo(model, s, 0);
  std::vector<text::TokenId> tids(ids.begin(), ids.end());
  const std::string full = *tok->decode(tids);
  ASSERT_GE(full.size(), 12u);
  {  // Stop string: a 2-byte piece from the middle of the reference text.
    Engine engine(model, budget, eo);
    Spec t = s;
    const std::string stop = full.substr(8, 2);
    t.params.stop = {stop};
    std::string streamed;
    ASSERT_TRUE(engine.submit({t.prompt, t.params, [&](const StreamEvent& ev) { streamed += ev.text; }}).ok());
    ASSERT_TRUE(engine.run_until_idle().ok());
    auto r = engine.take_finished().at(0);
    EXPECT_EQ(r.finish, FinishReason::kStop);
    EXPECT_EQ(r.text, full.substr(0, full.find(stop)));
    EXPECT_EQ(streamed, r.text);
  }
  {  // Stop id: the 6th generated token stops generation and is not in the text.
    Engine engine(model, budget, eo);
    Spec t = s;
    t.params.stop_token_ids = {ids[5]};
    const size_t first = static_cast<size_t>(std::find(ids.begin(), ids.end(), ids[5]) - ids.begin());
    ASSERT_TRUE(engine.submit({t.prompt, t.params, nullptr}).ok());
    ASSERT_TRUE(engine.run_until_idle().ok());
    auto r = engine.take_finished().at(0);
    EXPECT_EQ(r.finish, FinishReason::kStop);
    EXPECT_EQ(r.tokens, std::vector<int64_t>(ids.begin(), ids.begin() + static_cast<long>(first) + 1));
    std::vector<text::TokenId> head(ids.begin(), ids.begin() + static_cast<long>(first));
    EXPECT_EQ(r.text, *tok->decode(head));
  }
}

TEST(ByteCacheBudgetTest, ReservationsGrowRefuseAndRelease) {
  const CacheFootprint f{2.5, 100};
  EXPECT_EQ(f.bytes_for(3), 108);  // ceil(7.5) + 100
  ByteCacheBudget b(f, 300);
  EXPECT_TRUE(b.reserve(1, 10));   // 125
  EXPECT_TRUE(b.reserve(1, 4));    // never shrinks
  EXPECT_EQ(b.used_bytes(), 125);
  EXPECT_FALSE(b.reserve(2, 72));  // 280 more: refused, nothing changes
  EXPECT_EQ(b.used_bytes(), 125);
  EXPECT_EQ(b.sequences(), 1);
  EXPECT_TRUE(b.reserve(2, 30));   // 175: exactly the capacity
  EXPECT_EQ(b.used_bytes(), 300);
  EXPECT_FALSE(b.reserve(2, 31));
  b.release(1);
  b.release(1);  // releasing twice is harmless
  EXPECT_EQ(b.used_bytes(), 175);
  b.release(2);
  EXPECT_EQ(b.used_bytes(), 0);
  EXPECT_EQ(b.sequences(), 0);
}

TEST(EngineTest, SubmitAndCancelFromAnotherThreadWhileStepping) {
  FakeModelRunner model;
  ByteCacheBudget budget(model.cache_footprint(), 1 << 30);
  EngineOptions eo;
  eo.step_token_budget = 16;
  Engine engine(model, budget, eo);
  const SamplingParams p = test_support::greedy(20);
  std::atomic<bool> submitted_all{false};
  std::thread client([&] {
    for (int i = 0; i < 30; ++i) {
      auto id = engine.submit({std::vector<int64_t>(static_cast<size_t>(1 + i % 7), 2 + i % 50), p, nullptr});
      ASSERT_TRUE(id.ok());
      if (i % 3 == 0) engine.cancel(*id);
      std::this_thread::yield();
    }
    submitted_all = true;
  });
  size_t finished = 0;
  while (!submitted_all || engine.has_work()) {
    ASSERT_TRUE(engine.step().ok());
    finished += engine.take_finished().size();
  }
  client.join();
  EXPECT_EQ(finished, 30u);
  EXPECT_EQ(budget.used_bytes(), 0);
  EXPECT_EQ(model.live_sequences(), 0);
}

}  // namespace
}  // namespace cedar::engine
