// Pieces the engine tests over engine::FakeModelRunner share: the paged-cache layout they give the fake
// model, and the solo reference a request's tokens must equal whatever the batch, cache or disk did.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/fake_model.h"
#include "engine/pool_cache_budget.h"
#include "engine/sampler.h"

namespace cedar::test_support {

// Two global-KV streams, ratio 2 (16 B records) and ratio 1 (24 B), 40 B per sequence.
inline engine::PoolCacheLayout fake_pool_layout(int64_t tokens_per_block) {
  engine::PoolCacheLayout l;
  l.tokens_per_block = tokens_per_block;
  l.streams = {{2, 4, 4 * 16}, {1, 8, 8 * 24}};
  l.bytes_per_sequence = 40;
  return l;
}

// Sampling from the fake logits of the whole history, token by token (no batch, no cache).
inline std::vector<int64_t> fake_solo_tokens(const engine::FakeModelRunner& model, const std::vector<int64_t>& prompt,
                                             const engine::SamplingParams& params, uint64_t seed) {
  auto sampler = engine::Sampler::create(params, model.vocab_size(), seed);
  EXPECT_TRUE(sampler.ok()) << sampler.error().message;
  if (!sampler.ok()) return {};
  sampler->add_prompt(prompt);
  uint64_t h = engine::FakeModelRunner::kInitialHash;
  for (int64_t t : prompt) h = engine::FakeModelRunner::extend_hash(h, t);
  std::vector<int64_t> out;
  while (static_cast<int64_t>(out.size()) < params.max_tokens) {
    const int64_t t = sampler->sample(model.logits_for(h))->token;
    out.push_back(t);
    if (t == model.eos_token() && !params.ignore_eos) break;
    h = engine::FakeModelRunner::extend_hash(h, t);
  }
  return out;
}

}  // namespace cedar::test_support
