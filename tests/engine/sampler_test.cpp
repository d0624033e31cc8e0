// Sampler options on constructed logits, each against a reference computed here from the definition
// (OpenAI / vLLM semantics, see sampler.h), the PCG32 generator against the published pcg32-demo
// output, and stop-string matching against a brute-force search over every split of the text.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/stop_matcher.h"

namespace cedar::engine {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, -2.0f, 0.5f, 3.0f, 2.0f, -1.0f, 0.0f};

// softmax(x / t) in plain double arithmetic.
std::vector<double> ref_softmax(const std::vector<double>& x, double t) {
  double mx = *std::max_element(x.begin(), x.end());
  std::vector<double> p(x.size());
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += p[i] = std::exp((x[i] - mx) / t);
  for (double& v : p) v /= s;
  return p;
}

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::vector<double> normalized(std::vector<double> p) {
  const double s = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& v : p) v /= s;
  return p;
}

void expect_near_vec(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-12) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "token " << i;
}

Sampler make(const SamplingParams& p, uint64_t seed = 7) {
  auto s = Sampler::create(p, static_cast<int64_t>(kLogits.size()), seed);
  EXPECT_TRUE(s.ok()) << s.error().message;
  return std::move(*s);
}

TEST(Pcg32Test, MatchesPublishedDemoOutput) {
  // pcg32-demo (pcg-c-basic): pcg32_srandom_r(&rng, 42u, 54u), first six pcg32_random_r values.
  Pcg32 rng(42, 54);
  const uint32_t want[] = {0xa15c02b7u, 0x7b47f409u, 0xba1d3330u, 0x83d2f293u, 0xbfa4784bu, 0xcbed606eu};
  for (uint32_t w : want) EXPECT_EQ(rng.next_u32(), w);
}

TEST(SamplerTest, GreedyIsArgmaxWithTiesToLowestId) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s = make(p);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.sample(kLogits)->token, 1);  // ids 1 and 4 tie at 3.0
}

TEST(SamplerTest, LogitBiasMovesTheArgmax) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{4, 0.5}, {1, -0.25}};
  EXPECT_EQ(make(p).sample(kLogits)->token, 4);
  p.temperature = 1;
  auto want = as_double(kLogits);
  want[4] += 0.5;
  want[1] -= 0.25;
  expect_near_vec(*make(p).distribution(kLogits), ref_softmax(want, 1.0));
}

TEST(SamplerTest, TemperatureScalesTheSoftmax) {
  for (double t : {0.3, 1.0, 2.5}) {
    SamplingParams p;
    p.temperature = t;
    expect_near_vec(*make(p).distribution(kLogits), ref_softmax(as_double(kLogits), t));
  }
}

TEST(SamplerTest, TopKKeepsTheKLargestAndTiesAtTheBoundary) {
  SamplingParams p;
  p.temperature = 0.7;
  p.top_k = 3;  // 3.0, 3.0, 2.0
  auto full = ref_softmax(as_double(kLogits), 0.7);
  std::vector<double> want(full.size(), 0.0);
  for (int i : {1, 4, 5}) want[static_cast<size_t>(i)] = full[static_cast<size_t>(i)];
  expect_near_vec(*make(p).distribution(kLogits), normalized(want));
  p.top_k = 1;  // the tie at 3.0 keeps both
  want.assign(full.size(), 0.0);
  want[1] = want[4] = 0.5;
  expect_near_vec(*make(p).distribution(kLogits), want);
}

TEST(SamplerTest, TopPKeepsTheSmallestPrefixReachingP) {
  const auto full = ref_softmax(as_double(kLogits), 1.0);
  std::vector<size_t> order(full.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return full[a] > full[b]; });
  for (double top_p : {0.05, 0.5, 0.8, 0.95, 0.999}) {
    std::vector<double> want(full.size(), 0.0);
    double mass = 0;
    for (size_t r = 0; r < order.size(); ++r) {  // include tokens until the mass reaches top_p
      want[order[r]] = full[order[r]];
      mass += full[order[r]];
      if (mass >= top_p) break;
    }
    SamplingParams p;
    p.top_p = top_p;
    expect_near_vec(*make(p).distribution(kLogits), normalized(want));
  }
}

TEST(SamplerTest, MinPDropsTokensBelowAFractionOfTheBest) {
  for (double min_p : {0.1, 0.3, 0.9}) {
    const auto full = ref_softmax(as_double(kLogits), 1.5);
    const double best = *std::max_element(full.begin(), full.end());
    std::vector<double> want = full;
    for (double& v : want)
      if (v < min_p * best) v = 0;
    SamplingParams p;
    p.temperature = 1.5;
    p.min_p = min_p;
    expect_near_vec(*make(p).distribution(kLogits), normalized(want));
  }
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p;
  p.repetition_penalty = 1.3;
  Sampler s = make(p);
  s.add_prompt(std::vector<int64_t>{1, 2, 2});  // 3.0 -> 3.0/1.3, -2.0 -> -2.6
  auto want = as_double(kLogits);
  want[1] /= 1.3;
  want[2] *= 1.3;
  expect_near_vec(*s.distribution(kLogits), ref_softmax(want, 1.0));
  // An output token is penalized too, once however often it appears.
  SamplingParams g = p;
  g.temperature = 0;
  Sampler greedy = make(g);
  greedy.add_prompt(std::vector<int64_t>{1});
  const int64_t first = greedy.sample(kLogits)->token;  // 4 (3.0) beats 1 (3.0/1.3)
  EXPECT_EQ(first, 4);
  // Now 1 and 4 are both 3.0/1.3 = 2.31 (> 2.0 of token 5): the tie goes to the lower id.
  EXPECT_EQ(greedy.sample(kLogits)->token, 1);
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesSubtractPerOutputToken) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 0.5;
  p.frequency_penalty = 0.25;
  Sampler s = make(p);
  std::map<int64_t, int> counts;
  for (int step = 0; step < 12; ++step) {
    auto want = as_double(kLogits);
    for (const auto& [id, n] : counts) want[static_cast<size_t>(id)] -= 0.25 * n + 0.5;
    const int64_t ref = std::max_element(want.begin(), want.end()) - want.begin();
    const int64_t got = s.sample(kLogits)->token;
    EXPECT_EQ(got, ref) << "step " << step;
    ++counts[got];
  }
  // Prompt tokens do not count for these penalties.
  SamplingParams q;
  q.presence_penalty = 2;
  Sampler t = make(q);
  t.add_prompt(std::vector<int64_t>{1, 4});
  expect_near_vec(*t.distribution(kLogits), ref_softmax(as_double(kLogits), 1.0));
}

TEST(SamplerTest, DrawsFollowTheDistribution) {
  SamplingParams p;
  p.temperature = 1.2;
  p.top_k = 6;
  p.seed = 123;
  Sampler s = make(p, 123);
  const auto want = *s.distribution(kLogits);
  const int n = 20000;
  std::vector<int> hits(kLogits.size(), 0);
  // Penalties are off, so recording the outputs does not change the distribution.
  for (int i = 0; i < n; ++i) ++hits[static_cast<size_t>(s.sample(kLogits)->token)];
  for (size_t i = 0; i < want.size(); ++i) {
    const double f = static_cast<double>(hits[i]) / n;
    const double sd = std::sqrt(want[i] * (1 - want[i]) / n);
    EXPECT_NEAR(f, want[i], 5 * sd + 1e-9) << "token " << i;
  }
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferent) {
  SamplingParams p;
  p.temperature = 1.0;
  auto run = [&](uint64_t seed) {
    Sampler s = make(p, seed);
    std::vector<int64_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(kLogits)->token);
    return out;
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
}

TEST(SamplerTest, InverseCdfUsesOneUniformFromThePcgStream) {
  // The documented draw: u from PCG32(seed, stream 0xCEDA5), target u·Σp, first id whose running sum exceeds it.
  SamplingParams p;
  p.temperature = 0.8;
  Sampler s = make(p, 99);
  const auto dist = *s.distribution(kLogits);
  Pcg32 rng(99, 0xCEDA5u);
  for (int i = 0; i < 50; ++i) {
    const uint64_t a = rng.next_u32() >> 5, b = rng.next_u32() >> 6;
    const double u = static_cast<double>(a * 67108864ULL + b) / 9007199254740992.0;
    double acc = 0;
    int64_t want = -1;
    for (size_t j = 0; j < dist.size() && want < 0; ++j)
      if ((acc += dist[j]) > u) want = static_cast<int64_t>(j);
    EXPECT_EQ(s.sample(kLogits)->token, want) << "draw " << i;
  }
}

TEST(SamplerTest, LogprobsAreTheRawLogSoftmaxWithSortedTopList) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{0, 10.0}};  // processing changes the choice, not the reported logprobs
  p.logprobs = true;
  p.top_logprobs = 3;
  auto tok = *make(p).sample(kLogits);
  const auto x = as_double(kLogits);
  double s = 0;
  for (double v : x) s += std::exp(v);
  const double lse = std::log(s);
  EXPECT_EQ(tok.token, 0);
  EXPECT_NEAR(tok.logprob, x[0] - lse, 1e-12);
  ASSERT_EQ(tok.top.size(), 3u);
  const int64_t want_ids[] = {1, 4, 5};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(tok.top[i].token, want_ids[i]);
    EXPECT_NEAR(tok.top[i].logprob, x[static_cast<size_t>(want_ids[i])] - lse, 1e-12);
  }
}

TEST(SamplerTest, InvalidParametersAreRejectedByName) {
  auto err = [](SamplingParams p) {
    Status st = p.validate(8);
    return st.ok() ? std::string() : st.error().message;
  };
  SamplingParams p;
  EXPECT_EQ(err(p), "");
  p.temperature = -1;
  EXPECT_NE(err(p).find("temperature"), std::string::npos);
  p = {};
  p.top_p = 0;
  EXPECT_NE(err(p).find("top_p"), std::string::npos);
  p = {};
  p.top_logprobs = 21;
  p.logprobs = true;
  EXPECT_NE(err(p).find("top_logprobs"), std::string::npos);
  p = {};
  p.logit_bias = {{8, 1.0}};
  EXPECT_NE(err(p).find("logit_bias"), std::string::npos);
  p = {};
  p.max_tokens = 0;
  EXPECT_NE(err(p).find("max_tokens"), std::string::npos);
  p = {};
  p.stop = {""};
  EXPECT_NE(err(p).find("stop"), std::string::npos);
}

// Brute force: the text before the earliest occurrence of any stop string (or all of it).
std::string ref_stop(const std::string& text, const std::vector<std::string>& stops, bool& matched) {
  size_t best = std::string::npos;
  for (const auto& s : stops) best = std::min(best, text.find(s));
  matched = best != std::string::npos;
  return matched ? text.substr(0, best) : text;
}

TEST(StopMatcherTest, EverySplitOfTheTextGivesTheReferenceCut) {
  const std::vector<std::vector<std::string>> stop_sets = {{"END"}, {"ab", "bca"}, {"\n\n", "xyz"}, {"aaa"}};
  const std::vector<std::string> texts = {"hello END world", "xxbcab", "one\ntwo\n\nthree", "aaxaaaa", "no stop here",
                                          "EN", "abc"};
  for (const auto& stops : stop_sets) {
    for (const auto& text : texts) {
      bool want_matched = false;
      const std::string want = ref_stop(text, stops, want_matched);
      // All two-cut splits of the text (covers stops spanning pushes).
      for (size_t i = 0; i <= text.size(); ++i) {
        for (size_t j = i; j <= text.size(); ++j) {
          StopMatcher m(stops);
          std::string got = m.push(text.substr(0, i));
          // Nothing that could begin a stop is released early.
          got += m.push(text.substr(i, j - i));
          got += m.push(text.substr(j));
          got += m.flush();
          EXPECT_EQ(got, want) << "text '" << text << "' split " << i << "," << j;
          EXPECT_EQ(m.matched(), want_matched);
        }
      }
      // Released text is always a prefix of the answer, one byte at a time.
      StopMatcher m(stops);
      std::string so_far;
      for (char c : text) {
        so_far += m.push(std::string(1, c));
        EXPECT_EQ(want.compare(0, so_far.size(), so_far), 0);
      }
    }
  }
}

}  // namespace
}  // namespace cedar::engine
