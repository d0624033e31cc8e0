#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace cedar::engine {

Pcg32::Pcg32(uint64_t seed, uint64_t stream) {
  inc_ = (stream << 1u) | 1u;
  state_ = 0;
  next_u32();
  state_ += seed;
  next_u32();
}

uint32_t Pcg32::next_u32() {
  const uint64_t old = state_;
  state_ = old * 6364136223846793005ULL + inc_;
  const auto xorshifted = static_cast<uint32_t>(((old >> 18u) ^ old) >> 27u);
  const auto rot = static_cast<uint32_t>(old >> 59u);
  return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
}

double Pcg32::next_double() {
  const uint64_t a = next_u32() >> 5;  // 27 bits
  const uint64_t b = next_u32() >> 6;  // 26 bits
  return static_cast<double>(a * 67108864ULL + b) / 9007199254740992.0;
}

Status SamplingParams::validate(int64_t vocab) const {
  auto bad = [](const std::string& field, const std::string& value, const std::string& rule) {
    return make_error("sampling parameter " + field + " = " + value + ": " + rule);
  };
  if (!(temperature >= 0) || !std::isfinite(temperature)) return bad("temperature", std::to_string(temperature), "must be >= 0");
  if (!(top_p > 0 && top_p <= 1)) return bad("top_p", std::to_string(top_p), "must be in (0, 1]");
  if (!(min_p >= 0 && min_p <= 1)) return bad("min_p", std::to_string(min_p), "must be in [0, 1]");
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty))
    return bad("repetition_penalty", std::to_string(repetition_penalty), "must be > 0");
  if (!(presence_penalty >= -2 && presence_penalty <= 2))
    return bad("presence_penalty", std::to_string(presence_penalty), "must be in [-2, 2]");
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2))
    return bad("frequency_penalty", std::to_string(frequency_penalty), "must be in [-2, 2]");
  if (top_logprobs < 0 || top_logprobs > 20) return bad("top_logprobs", std::to_string(top_logprobs), "must be in [0, 20]");
  if (top_logprobs > 0 && !logprobs) return bad("top_logprobs", std::to_string(top_logprobs), "needs logprobs = true");
  if (max_tokens <= 0) return bad("max_tokens", std::to_string(max_tokens), "must be > 0");
  for (const auto& [id, b] : logit_bias) {
    if (id < 0 || id >= vocab) return bad("logit_bias", "{" + std::to_string(id) + ": ...}", "token id out of range [0, " + std::to_string(vocab) + ")");
    if (!std::isfinite(b)) return bad("logit_bias[" + std::to_string(id) + "]", std::to_string(b), "must be finite");
  }
  for (int64_t id : stop_token_ids)
    if (id < 0 || id >= vocab) return bad("stop_token_ids", std::to_string(id), "token id out of range [0, " + std::to_string(vocab) + ")");
  for (const auto& s : stop)
    if (s.empty()) return bad("stop", "\"\"", "stop strings must not be empty");
  return Status::Ok();
}

std::vector<double> log_softmax(std::span<const float> logits) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float v : logits) mx = std::max(mx, static_cast<double>(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lse;
  return out;
}

Sampler::Sampler(const SamplingParams& params, int64_t vocab, uint64_t seed)
    : params_(params), vocab_(vocab), rng_(seed, 0xCEDA5u) {}

Result<Sampler> Sampler::create(const SamplingParams& params, int64_t vocab, uint64_t seed) {
  CEDAR_RETURN_IF_ERROR(params.validate(vocab));
  return Sampler(params, vocab, seed);
}

void Sampler::add_prompt(std::span<const int64_t> tokens) { prompt_tokens_.insert(tokens.begin(), tokens.end()); }

std::vector<double> Sampler::processed_logits(std::span<const float> logits) const {
  std::vector<double> x(logits.begin(), logits.end());
  for (const auto& [id, b] : params_.logit_bias) x[static_cast<size_t>(id)] += b;
  if (params_.repetition_penalty != 1.0) {
    const double r = params_.repetition_penalty;
    auto penalize = [&](int64_t id) {
      double& v = x[static_cast<size_t>(id)];
      v = v > 0 ? v / r : v * r;
    };
    for (int64_t id : prompt_tokens_) penalize(id);
    for (const auto& [id, n] : output_counts_)
      if (!prompt_tokens_.count(id)) penalize(id);
  }
  for (const auto& [id, n] : output_counts_)
    x[static_cast<size_t>(id)] -= params_.frequency_penalty * static_cast<double>(n) + params_.presence_penalty;
  return x;
}

Result<std::vector<double>> Sampler::distribution(std::span<const float> logits) const {
  if (static_cast<int64_t>(logits.size()) != vocab_)
    return make_error("sampler: logit row has " + std::to_string(logits.size()) + " entries, vocab is " + std::to_string(vocab_));
  std::vector<double> x = processed_logits(logits);
  const size_t n = x.size();
  std::vector<double> p(n, 0.0);
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  if (!std::isfinite(x[best])) return make_error("sampler: no finite logit");
  if (params_.temperature == 0) {
    p[best] = 1.0;
    return p;
  }
  const double t = params_.temperature;
  const double mx = x[best];
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    p[i] = std::exp((x[i] - mx) / t);
    sum += p[i];
  }
  for (double& v : p) v /= sum;
  if (params_.min_p > 0) {
    const double floor = params_.min_p * p[best];
    for (double& v : p)
      if (v < floor) v = 0;
  }
  if (params_.top_k > 0 && params_.top_k < static_cast<int64_t>(n)) {
    std::vector<double> vals;
    vals.reserve(n);
    for (size_t i = 0; i < n; ++i)
      if (p[i] > 0) vals.push_back(x[i]);
    if (static_cast<int64_t>(vals.size()) > params_.top_k) {
      std::nth_element(vals.begin(), vals.begin() + (params_.top_k - 1), vals.end(), std::greater<double>());
      const double kth = vals[static_cast<size_t>(params_.top_k - 1)];
      for (size_t i = 0; i < n; ++i)
        if (x[i] < kth) p[i] = 0;
    }
  }
  auto renormalize = [&p] {
    double s = 0;
    for (double v : p) s += v;
    for (double& v : p) v /= s;
  };
  renormalize();
  if (params_.top_p < 1) {
    std::vector<int64_t> order;
    for (size_t i = 0; i < n; ++i)
      if (p[i] > 0) order.push_back(static_cast<int64_t>(i));
    std::sort(order.begin(), order.end(), [&p](int64_t a, int64_t b) {
      return p[static_cast<size_t>(a)] != p[static_cast<size_t>(b)] ? p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)] : a < b;
    });
    double before = 0;
    for (size_t r = 0; r < order.size(); ++r) {
      double& v = p[static_cast<size_t>(order[r])];
      if (r > 0 && before >= params_.top_p) {
        v = 0;
      } else {
        before += v;
      }
    }
    renormalize();
  }
  return p;
}

Result<SampledToken> Sampler::sample(std::span<const float> logits) {
  CEDAR_ASSIGN_OR_RETURN(std::vector<double> p, distribution(logits));
  SampledToken out;
  if (params_.temperature == 0) {
    out.token = std::max_element(p.begin(), p.end()) - p.begin();
  } else {
    const double u = rng_.next_double();
    double total = 0;
    for (double v : p) total += v;
    const double target = u * total;
    double acc = 0;
    int64_t last_nonzero = 0;
    out.token = -1;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i] <= 0) continue;
      last_nonzero = static_cast<int64_t>(i);
      acc += p[i];
      if (target < acc) {
        out.token = static_cast<int64_t>(i);
        break;
      }
    }
    if (out.token < 0) out.token = last_nonzero;  // rounding at the top end
  }
  if (params_.logprobs) {
    const std::vector<double> lp = log_softmax(logits);
    out.logprob = lp[static_cast<size_t>(out.token)];
    if (params_.top_logprobs > 0) {
      std::vector<int64_t> idx(lp.size());
      std::iota(idx.begin(), idx.end(), 0);
      const auto k = static_cast<size_t>(std::min<int64_t>(params_.top_logprobs, static_cast<int64_t>(lp.size())));
      std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(), [&lp](int64_t a, int64_t b) {
        return lp[static_cast<size_t>(a)] != lp[static_cast<size_t>(b)] ? lp[static_cast<size_t>(a)] > lp[static_cast<size_t>(b)] : a < b;
      });
      for (size_t i = 0; i < k; ++i) out.top.push_back({idx[i], lp[static_cast<size_t>(idx[i])]});
    }
  }
  ++output_counts_[out.token];
  return out;
}

}  // namespace cedar::engine
