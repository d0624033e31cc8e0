// Token sampling with OpenAI / vLLM semantics (../shared/spec/serving.md): greedy, temperature, top-k,
// top-p, min-p, repetition / presence / frequency penalties, logit bias, seeded randomness and logprobs.
//
// Order of processing (vLLM's): logit bias → repetition penalty (prompt + output tokens, HF rule:
// positive logits divided, negative multiplied) → frequency / presence penalties (output tokens,
// subtracted) → [temperature 0: argmax, ties to the lowest id] → temperature → softmax → min-p (keep
// p ≥ min_p · p_max) → top-k (keep logits ≥ the k-th largest, so ties at the boundary stay) → top-p
// (in descending order of probability, ties to the lower id, keep a token while the mass before it is
// < top_p; the first token always stays) → renormalize → inverse-CDF draw in id order with one
// uniform from the request's PCG32 stream.
//
// Logprobs are the model's raw log-softmax (vLLM's default `raw_logprobs`), not the processed ones.
// Everything is deterministic and platform-independent: no std distributions, double accumulation in
// a fixed order, and one RNG draw per sampled token (so a preempted and recomputed request continues
// the same stream).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/status.h"

namespace cedar::engine {

// PCG32 (O'Neill's pcg32_srandom_r / pcg32_random_r, XSH-RR 64/32).
class Pcg32 {
 public:
  Pcg32(uint64_t seed, uint64_t stream);
  uint32_t next_u32();
  double next_double();  // uniform in [0, 1), 53 random bits from two draws

 private:
  uint64_t state_ = 0, inc_ = 0;
};

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // <= 0: off
  double top_p = 1.0;        // (0, 1]
  double min_p = 0.0;        // [0, 1]
  double repetition_penalty = 1.0;  // > 0; 1 = off
  double presence_penalty = 0.0;    // [-2, 2]
  double frequency_penalty = 0.0;   // [-2, 2]
  std::map<int64_t, double> logit_bias;  // token id -> added to the logit
  std::optional<uint64_t> seed;          // none: the engine draws one
  bool logprobs = false;
  int top_logprobs = 0;                  // [0, 20]; needs logprobs
  std::vector<std::string> stop;         // stop strings (text before the match is returned)
  std::vector<int64_t> stop_token_ids;   // generation ends on these (not part of the text)
  bool ignore_eos = false;               // do not stop on the model's EOS id
  int64_t max_tokens = 16;               // > 0

  // Errors name the offending field and value.
  Status validate(int64_t vocab) const;
};

struct TokenLogprob {
  int64_t token = 0;
  double logprob = 0;
};

struct SampledToken {
  int64_t token = 0;
  double logprob = 0;               // raw log-softmax of the chosen token (when logprobs)
  std::vector<TokenLogprob> top;    // top_logprobs best by raw logprob, ties to the lower id
};

// The per-request sampler: parameters, RNG stream and token counts for the penalties.
class Sampler {
 public:
  // `seed`: the effective seed (params.seed or one the engine chose).
  static Result<Sampler> create(const SamplingParams& params, int64_t vocab, uint64_t seed);

  // Tokens the repetition penalty counts in addition to the output (the prompt).
  void add_prompt(std::span<const int64_t> tokens);

  // The final distribution over the vocabulary after every processing step (zeros where masked).
  // Pure: does not touch the RNG or the counts.
  Result<std::vector<double>> distribution(std::span<const float> logits) const;

  // Samples one token (one RNG draw unless greedy) and records it as output for the penalties.
  Result<SampledToken> sample(std::span<const float> logits);

  const SamplingParams& params() const { return params_; }

 private:
  Sampler(const SamplingParams& params, int64_t vocab, uint64_t seed);
  std::vector<double> processed_logits(std::span<const float> logits) const;

  SamplingParams params_;
  int64_t vocab_ = 0;
  Pcg32 rng_;
  std::unordered_set<int64_t> prompt_tokens_;
  std::unordered_map<int64_t, int64_t> output_counts_;
};

// Raw log-softmax of one logit row (double accumulation).
std::vector<double> log_softmax(std::span<const float> logits);

}  // namespace cedar::engine
