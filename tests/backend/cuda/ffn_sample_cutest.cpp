// Device argmax and sampling against the CPU sampler (engine/sampler.h): same tokens for the same seed
// over several steps (the PCG32 stream advances identically), the same final distribution to ~1e-12.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/ffn_kernels.h"
#include "cuda_test_util.h"
#include "engine/sampler.h"
#include "ffn_test_util.h"

namespace cedar::cuda {
namespace {

using namespace ffn_testing;

std::vector<float> random_logits(int64_t rows, int64_t vocab, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(rows * vocab);
  for (auto& x : v) x = nd(rng);
  return v;
}

TEST(CudaArgmax, TiesToTheLowestIdAndNoFiniteLogit) {
  CEDAR_REQUIRE_GPU();
  const int64_t rows = 5, vocab = 129280;
  auto logits = random_logits(rows, vocab, 1, 3.0f);
  logits[0 * vocab + 7000] = logits[0 * vocab + 90000] = 50.0f;  // tie: the lower id wins
  logits[1 * vocab + 5] = NAN;                                   // a NaN past index 0 is never chosen
  logits[1 * vocab + 6] = 60.0f;
  logits[2 * vocab + 0] = NAN;            // NaN at 0: the CPU's "no finite logit"
  logits[3 * vocab + 4242] = INFINITY;    // the maximum is not finite
  logits[4 * vocab + vocab - 1] = 70.0f;  // the last id
  auto dl = upload(logits);
  auto dt = alloc<int32_t>(rows);
  ASSERT_TRUE(argmax_rows(dl.get(), rows, vocab, dt.get(), nullptr).ok());
  const auto got = download(dt);
  engine::SamplingParams greedy;
  greedy.temperature = 0;
  for (int64_t r = 0; r < rows; ++r) {
    auto s = engine::Sampler::create(greedy, vocab, 1);
    ASSERT_TRUE(s.ok());
    auto tok = s->sample(std::span<const float>(logits.data() + r * vocab, vocab));
    const int64_t want = tok.ok() ? tok->token : -1;
    EXPECT_EQ(got[r], want) << "row " << r;
  }
  EXPECT_EQ(got[0], 7000);
  EXPECT_EQ(got[1], 6);
  EXPECT_EQ(got[2], -1);
  EXPECT_EQ(got[3], -1);
  EXPECT_EQ(got[4], vocab - 1);
}

struct SampleConfig {
  std::string name;
  engine::SamplingParams params;
  int64_t vocab;
  bool with_prompt = false;
};

// Runs `steps` sampling steps of `rows` requests (one seed each) on both sides and compares tokens and
// distributions. Penalties and bias lists on the device are rebuilt from the CPU-side state each step.
void check_sampling(const SampleConfig& cfg, int64_t rows, int steps, uint32_t seed) {
  const int64_t V = cfg.vocab;
  std::vector<engine::Sampler> cpu;
  std::vector<Pcg32State> rng;
  std::vector<std::set<int64_t>> prompt(rows);
  std::vector<std::map<int64_t, int64_t>> outputs(rows);
  std::mt19937 prng(seed);
  for (int64_t r = 0; r < rows; ++r) {
    auto s = engine::Sampler::create(cfg.params, V, 1000 + seed + r);
    ASSERT_TRUE(s.ok()) << s.error().message;
    if (cfg.with_prompt) {
      std::vector<int64_t> toks;
      for (int i = 0; i < 40; ++i) toks.push_back(prng() % V);
      s->add_prompt(toks);
      prompt[r].insert(toks.begin(), toks.end());
    }
    cpu.push_back(std::move(*s));
    rng.push_back(pcg32_seeded(1000 + seed + r, kSamplerRngStream));
  }
  auto drng = upload(rng);
  auto ws = alloc<double>(2 * rows * V);
  auto dtok = alloc<int32_t>(rows);
  int64_t compared = 0;
  double worst_rel = 0;
  for (int step = 0; step < steps; ++step) {
    const auto logits = random_logits(rows, V, seed * 31 + step, 2.5f);
    std::vector<SamplingRowParams> rp(rows);
    std::vector<LogitBiasEntry> bias;
    std::vector<PenaltyEntry> pen;
    for (int64_t r = 0; r < rows; ++r) {
      const auto& p = cfg.params;
      SamplingRowParams& q = rp[r];
      q.temperature = p.temperature;
      q.top_p = p.top_p;
      q.min_p = p.min_p;
      q.repetition_penalty = p.repetition_penalty;
      q.presence_penalty = p.presence_penalty;
      q.frequency_penalty = p.frequency_penalty;
      q.top_k = p.top_k;
      q.bias_begin = static_cast<int32_t>(bias.size());
      for (const auto& [id, b] : p.logit_bias) bias.push_back(LogitBiasEntry{static_cast<int32_t>(id), b});
      q.bias_count = static_cast<int32_t>(bias.size()) - q.bias_begin;
      q.penalty_begin = static_cast<int32_t>(pen.size());
      std::set<int64_t> ids(prompt[r]);
      for (const auto& [id, n] : outputs[r]) ids.insert(id);
      for (int64_t id : ids) {
        const auto it = outputs[r].find(id);
        pen.push_back(PenaltyEntry{static_cast<int32_t>(id),
                                   it == outputs[r].end() ? 0 : static_cast<int32_t>(it->second),
                                   prompt[r].count(id) ? 1 : 0});
      }
      q.penalty_count = static_cast<int32_t>(pen.size()) - q.penalty_begin;
    }
    if (bias.empty()) bias.push_back({});
    if (pen.empty()) pen.push_back({});
    auto dl = upload(logits);
    auto dp = upload(rp);
    auto db = upload(bias);
    auto dpen = upload(pen);
    SampleArgs a{rows, V, dl.get(), dp.get(), db.get(), dpen.get(), drng.get(), ws.get(), dtok.get()};
    const Status s = sample_rows(a, nullptr);
    ASSERT_TRUE(s.ok()) << s.error().message;
    const auto got = download(dtok);
    const auto wsh = download(ws);
    for (int64_t r = 0; r < rows; ++r) {
      const std::span<const float> row(logits.data() + r * V, V);
      auto dist = cpu[r].distribution(row);
      ASSERT_TRUE(dist.ok()) << dist.error().message;
      auto tok = cpu[r].sample(row);
      ASSERT_TRUE(tok.ok()) << tok.error().message;
      EXPECT_EQ(got[r], tok->token) << cfg.name << ": step " << step << " row " << r << " (seed " << 1000 + seed + r
                                    << "): device and CPU sampler disagree";
      ++outputs[r][tok->token];
      if (cfg.params.temperature == 0) continue;  // the device leaves no distribution for greedy rows
      // Distribution: the same double operations, sums in another order (~1e-16 relative each).
      const double* p = wsh.data() + (2 * r + 1) * V;
      for (int64_t i = 0; i < V; ++i) {
        const double w = (*dist)[i], g = p[i];
        if (w == 0 || g == 0) {
          EXPECT_EQ(w == 0, g == 0) << cfg.name << ": token " << i << " masked on one side only (cpu " << w << ", gpu "
                                    << g << ")";
          continue;
        }
        worst_rel = std::max(worst_rel, std::fabs(g - w) / w);
      }
      ++compared;
    }
  }
  std::printf("PARITY %-40s rows=%lld steps=%d tokens equal (asserted), distribution max rel err %.3e\n",
              ("sample " + cfg.name).c_str(), static_cast<long long>(rows), steps, worst_rel);
  EXPECT_LE(worst_rel, 1e-12) << cfg.name;
}

TEST(CudaSampler, SameTokensAndDistributionAsTheCpuSampler) {
  CEDAR_REQUIRE_GPU();
  std::vector<SampleConfig> cfgs;
  auto add = [&](const std::string& name, int64_t vocab, auto&& set, bool prompt = false) {
    SampleConfig c;
    c.name = name;
    c.vocab = vocab;
    c.with_prompt = prompt;
    set(c.params);
    cfgs.push_back(c);
  };
  add("temperature 0.8", 129280, [](engine::SamplingParams& p) { p.temperature = 0.8; });
  add("top_k 50", 129280, [](engine::SamplingParams& p) { p.top_k = 50; });
  add("top_p 0.9 T 0.7", 129280, [](engine::SamplingParams& p) {
    p.temperature = 0.7;
    p.top_p = 0.9;
  });
  add("top_k 200 top_p 0.95 min_p 0.01 T 1.2", 50000, [](engine::SamplingParams& p) {
    p.temperature = 1.2;
    p.top_k = 200;
    p.top_p = 0.95;
    p.min_p = 0.01;
  });
  add("top_p 0.01 (one token)", 3000, [](engine::SamplingParams& p) { p.top_p = 0.01; });
  add(
      "bias + penalties", 20000,
      [](engine::SamplingParams& p) {
        p.temperature = 1.0;
        p.logit_bias = {{17, 5.0}, {18, -100.0}, {19999, 2.5}};
        p.repetition_penalty = 1.3;
        p.presence_penalty = 0.5;
        p.frequency_penalty = 0.2;
      },
      true);
  add(
      "greedy + bias + penalties", 20000,
      [](engine::SamplingParams& p) {
        p.temperature = 0;
        p.logit_bias = {{3, 9.0}};
        p.repetition_penalty = 0.8;
        p.frequency_penalty = 1.0;
      },
      true);
  for (size_t i = 0; i < cfgs.size(); ++i) check_sampling(cfgs[i], 3, 4, 10 + static_cast<uint32_t>(i));
}

// Exact ties at the top-k boundary stay (the CPU keeps every logit >= the k-th value); equal
// probabilities at the top-p boundary are taken in id order.
TEST(CudaSampler, TiesAtTheTopKAndTopPBoundaries) {
  CEDAR_REQUIRE_GPU();
  const int64_t V = 1000;
  std::vector<float> logits(V, -5.0f);
  for (int i : {10, 20, 30, 40, 50}) logits[i] = 2.0f;  // five equal top logits
  logits[60] = 3.0f;
  engine::SamplingParams p;
  p.top_k = 3;    // the 3rd largest is 2.0: all five ties stay
  p.top_p = 0.6;  // crosses inside the tied group: the lower ids first
  for (uint64_t seed = 0; seed < 20; ++seed) {
    auto s = engine::Sampler::create(p, V, seed);
    ASSERT_TRUE(s.ok());
    auto dist = s->distribution(logits);
    ASSERT_TRUE(dist.ok());
    auto tok = s->sample(logits);
    ASSERT_TRUE(tok.ok());
    SamplingRowParams q;
    q.top_k = 3;
    q.top_p = 0.6;
    const std::vector<Pcg32State> rng = {pcg32_seeded(seed, kSamplerRngStream)};
    auto dl = upload(logits);
    auto dp = upload(std::vector<SamplingRowParams>{q});
    auto db = upload(std::vector<LogitBiasEntry>(1));
    auto dpen = upload(std::vector<PenaltyEntry>(1));
    auto drng = upload(rng);
    auto ws = alloc<double>(2 * V);
    auto dtok = alloc<int32_t>(1);
    ASSERT_TRUE(
        sample_rows(SampleArgs{1, V, dl.get(), dp.get(), db.get(), dpen.get(), drng.get(), ws.get(), dtok.get()},
                    nullptr)
            .ok());
    EXPECT_EQ(download(dtok)[0], tok->token) << "seed " << seed;
    const auto wsh = download(ws);
    for (int64_t i = 0; i < V; ++i)
      EXPECT_EQ((*dist)[i] > 0, wsh[V + i] > 0) << "seed " << seed << ": token " << i << " kept on one side only";
  }
}

TEST(CudaSampler, RejectsBadArguments) {
  CEDAR_REQUIRE_GPU();
  Status s = sample_rows(SampleArgs{1, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("vocab=0"), std::string::npos) << s.error().message;
  s = argmax_rows(nullptr, 1, 10, nullptr, nullptr);
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace cedar::cuda
