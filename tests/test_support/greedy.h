// The sampling the engine tests compare runs with: greedy, exactly `max_tokens` tokens (EOS ignored), so
// two runs of one prompt must produce the same tokens.
#pragma once

#include <cstdint>

#include "engine/sampler.h"

namespace cedar::test_support {

inline engine::SamplingParams greedy(int64_t max_tokens) {
  engine::SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

}  // namespace cedar::test_support
