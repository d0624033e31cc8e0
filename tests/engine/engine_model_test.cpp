// The engine on cedar's tiny DeepSeek-V4.1 checkpoint: batch invariance (a request's greedy tokens
// alone == in a batch of four == a plain forward/argmax loop written here), seed determinism, CED ==
// exact for a prompt within the replay tail (architecture.md §3.11: replay_start = 0), and exact
// output after preemption and recompute on the real model.
#include <algorithm>
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "model/deepseek_v41.h"
#include "test_support/greedy.h"
#include "test_support/tiny_model.h"

namespace cedar::engine {
namespace {

std::vector<int64_t> prompt(int64_t n, uint64_t seed) { return test_support::xorshift_prompt(n, seed, 99); }

class EngineModelTest : public test_support::TinyV41Suite {
 protected:
  // Runs `requests` through one engine; returns the generated tokens per request, in order.
  static std::vector<RequestResult> generate(const std::vector<GenerationRequest>& requests, EngineOptions eo,
                                             int64_t capacity = int64_t{1} << 40) {
    DeepseekRunner runner(*model_, nullptr);
    ByteCacheBudget budget(runner.cache_footprint(), capacity);
    Engine engine(runner, budget, eo);
    std::vector<RequestId> ids;
    for (const auto& r : requests) {
      auto id = engine.submit(r);
      EXPECT_TRUE(id.ok()) << id.error().message;
      ids.push_back(*id);
    }
    EXPECT_TRUE(engine.run_until_idle().ok());
    std::map<RequestId, RequestResult> by_id;
    for (auto& r : engine.take_finished()) by_id[r.id] = std::move(r);
    std::vector<RequestResult> out;
    for (RequestId id : ids) out.push_back(by_id[id]);
    EXPECT_EQ(budget.used_bytes(), 0);
    last_preemptions_ = engine.stats().preemptions;
    return out;
  }

  static inline int64_t last_preemptions_ = 0;
};

using test_support::greedy;

TEST_F(EngineModelTest, GreedyOutputDoesNotDependOnTheBatch) {
  const auto target = prompt(13, 1);
  // Reference: one sequence, the whole prompt in one forward, then argmax and one token per forward.
  std::vector<int64_t> want;
  {
    auto state = model_->new_sequence(SequenceOptions{ForwardMode::Exact, 13, 0, CedBoundary::ExactSource});
    ASSERT_TRUE(state.ok());
    std::vector<int64_t> chunk = target;
    for (int i = 0; i < 5; ++i) {
      auto out = model_->forward(chunk, *state, ForwardOptions{});
      ASSERT_TRUE(out.ok()) << out.error().message;
      const int64_t t = std::max_element(out->logits.begin(), out->logits.end()) - out->logits.begin();
      want.push_back(t);
      chunk = {t};
    }
  }
  EngineOptions eo;
  eo.mode = ForwardMode::Exact;
  const auto alone = generate({{target, greedy(5), nullptr}}, eo);
  EXPECT_EQ(alone[0].tokens, want);
  eo.step_token_budget = 6;  // the prompts are chunked and mixed with other requests' decode steps
  const auto batch = generate({{prompt(9, 2), greedy(7), nullptr},
                               {target, greedy(5), nullptr},
                               {prompt(17, 3), greedy(3), nullptr},
                               {prompt(4, 4), greedy(6), nullptr}},
                              eo);
  EXPECT_EQ(batch[1].tokens, want);
  for (const auto& r : batch) EXPECT_EQ(r.finish, FinishReason::kLength);
}

TEST_F(EngineModelTest, SameSeedSameTokensAloneOrInABatch) {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.95;
  p.seed = 42;
  p.max_tokens = 5;
  p.ignore_eos = true;
  EngineOptions eo;
  const auto a = generate({{prompt(10, 5), p, nullptr}}, eo);
  const auto b = generate({{prompt(10, 5), p, nullptr}}, eo);
  EXPECT_EQ(a[0].tokens, b[0].tokens);
  eo.step_token_budget = 5;
  SamplingParams other = p;
  other.seed = 7;
  const auto c = generate({{prompt(12, 6), other, nullptr}, {prompt(10, 5), p, nullptr}}, eo);
  EXPECT_EQ(c[1].tokens, a[0].tokens);
}

TEST_F(EngineModelTest, CedEqualsExactForAPromptWithinTheReplayTail) {
  const int64_t window = model_->config().sliding_window;
  const auto ids = prompt(window - 2, 8);
  DeepseekRunner runner(*model_, nullptr);
  std::vector<std::vector<float>> logits;
  for (ForwardMode mode : {ForwardMode::Ced, ForwardMode::Exact}) {
    auto seq = runner.create_sequence(SequenceSpec{mode, static_cast<int64_t>(ids.size()), 0});
    ASSERT_TRUE(seq.ok());
    BatchItem item;
    item.sequence = seq->get();
    item.tokens = ids;
    item.want_logits = true;
    runner.run_batch(std::span<BatchItem>(&item, 1));
    ASSERT_TRUE(item.status.ok()) << item.status.error().message;
    logits.push_back(item.logits);
  }
  EXPECT_EQ(logits[0], logits[1]);
  EngineOptions eo;
  eo.mode = ForwardMode::Ced;
  const auto ced = generate({{ids, greedy(4), nullptr}}, eo);
  eo.mode = ForwardMode::Exact;
  const auto exact = generate({{ids, greedy(4), nullptr}}, eo);
  EXPECT_EQ(ced[0].tokens, exact[0].tokens);
}

TEST_F(EngineModelTest, PreemptedRequestsRecomputeToTheSameTokens) {
  for (ForwardMode mode : {ForwardMode::Exact, ForwardMode::Ced}) {
    EngineOptions eo;
    eo.mode = mode;
    const std::vector<GenerationRequest> reqs = {{prompt(12, 11), greedy(4), nullptr},
                                                 {prompt(10, 12), greedy(4), nullptr},
                                                 {prompt(13, 13), greedy(4), nullptr}};
    std::vector<std::vector<int64_t>> solo;
    for (const auto& r : reqs) solo.push_back(generate({r}, eo)[0].tokens);
    DeepseekRunner runner(*model_, nullptr);
    // Room for two sequences of ~16 tokens, not three: the newest is preempted and recomputed.
    const int64_t capacity = 2 * runner.cache_footprint().bytes_for(16) + runner.cache_footprint().bytes_for(4);
    eo.step_token_budget = 8;
    const auto together = generate(reqs, eo, capacity);
    EXPECT_GT(last_preemptions_, 0) << "capacity did not force a preemption";
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(together[i].tokens, solo[i]) << forward_mode_name(mode) << " request " << i;
  }
}

}  // namespace
}  // namespace cedar::engine
