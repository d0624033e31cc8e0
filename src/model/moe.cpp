#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/numeric.h"

namespace cedar {

MoeParams moe_params_from_config(const ModelConfig& c) {
  MoeParams p;
  p.topk = c.num_experts_per_tok;
  p.route_scale = c.routed_scaling_factor;
  p.swiglu_limit = c.swiglu_limit;
  p.gate_temp = c.gate_temp;
  p.scoring_func = c.scoring_func;
  p.norm_topk_prob = c.norm_topk_prob;
  p.act_block = c.quant.quantized() ? c.quant.weight_block_cols : 32;
  return p;
}
namespace {

std::string shape_of(const cpu::LinearWeight& w) {
  return "[" + std::to_string(w.out) + ", " + std::to_string(w.in) + "]";
}

// Shapes of one SwiGLU expert against the model width d.
Status check_expert(const ExpertWeights& e, int64_t d, const std::string& name) {
  const auto bad = [&](const std::string& what) {
    return make_error(name + ": " + what + " (w1 " + shape_of(e.w1) + ", w3 " + shape_of(e.w3) + ", w2 " +
                      shape_of(e.w2) + ", model width " + std::to_string(d) + ")");
  };
  if (e.w1.data == nullptr || e.w2.data == nullptr || e.w3.data == nullptr) return bad("weight not bound");
  if (e.w1.in != d || e.w3.in != d) return bad("w1/w3 input width is not the model width");
  if (e.w1.out <= 0 || e.w3.out != e.w1.out) return bad("w1 and w3 disagree on the intermediate width");
  if (e.w2.out != d || e.w2.in != e.w1.out) return bad("w2 is not [model width, intermediate width]");
  return Status::Ok();
}

// torch.nn.functional.softplus (beta 1, threshold 20) followed by sqrt, in fp32.
float sqrt_softplus(float v) { return std::sqrt(v > 20.0f ? v : std::log1p(std::exp(v))); }

// Strict total order of the top-k: larger value first, NaN above every number, lower id on ties.
struct SelectionOrder {
  const float* value;
  bool operator()(int64_t a, int64_t b) const {
    const float va = value[a], vb = value[b];
    const bool na = std::isnan(va), nb = std::isnan(vb);
    if (na != nb) return na;
    if (!na && va != vb) return va > vb;
    return a < b;
  }
};

struct ChunkShape {
  int64_t n_experts = 0, d = 0;
};

Result<ChunkShape> check_routing_inputs(std::span<const float> x, int64_t n, const MoeWeights& w,
                                        const MoeParams& p, std::span<const int64_t> token_ids,
                                        std::span<const uint8_t> is_image) {
  ChunkShape s;
  s.n_experts = static_cast<int64_t>(w.experts.size());
  if (s.n_experts <= 0) return make_error("moe: no routed experts bound");
  if (w.gate.empty() || static_cast<int64_t>(w.gate.size()) % s.n_experts != 0)
    return make_error("moe: gate weight has " + std::to_string(w.gate.size()) + " values, not a multiple of " +
                      std::to_string(s.n_experts) + " experts");
  s.d = static_cast<int64_t>(w.gate.size()) / s.n_experts;
  if (n < 0 || static_cast<int64_t>(x.size()) != n * s.d)
    return make_error("moe: input has " + std::to_string(x.size()) + " values, expected " + std::to_string(n) +
                      "×" + std::to_string(s.d));
  if (p.topk < 1 || p.topk > s.n_experts)
    return make_error("moe: topk " + std::to_string(p.topk) + " outside [1, " + std::to_string(s.n_experts) + "]");
  if (p.scoring_func != "sqrtsoftplus")
    return make_error("moe: unsupported scoring_func \"" + p.scoring_func + "\" (only sqrtsoftplus)");
  if (!(p.gate_temp > 0.0) || !std::isfinite(p.gate_temp))
    return make_error("moe: gate_temp " + std::to_string(p.gate_temp) + " is not a positive number");
  if (!is_image.empty() && static_cast<int64_t>(is_image.size()) != n)
    return make_error("moe: is_image has " + std::to_string(is_image.size()) + " flags for " + std::to_string(n) +
                      " tokens");
  if (!w.tid2eid.empty()) {
    const auto entries = static_cast<int64_t>(w.tid2eid.size());
    if (entries % p.topk != 0)
      return make_error("moe: tid2eid has " + std::to_string(entries) + " entries, not [vocab, " +
                        std::to_string(p.topk) + "]");
    if (static_cast<int64_t>(token_ids.size()) != n)
      return make_error("moe: hash routing needs one token id per token (" + std::to_string(token_ids.size()) +
                        " for " + std::to_string(n) + " tokens)");
    const int64_t vocab = entries / p.topk;
    for (int64_t t = 0; t < n; ++t) {
      if (token_ids[t] < 0 || token_ids[t] >= vocab)
        return make_error("moe: token id " + std::to_string(token_ids[t]) + " at position " + std::to_string(t) +
                          " outside the tid2eid vocabulary of " + std::to_string(vocab));
      for (int64_t k = 0; k < p.topk; ++k) {
        const int64_t e = w.tid2eid[token_ids[t] * p.topk + k];
        if (e < 0 || e >= s.n_experts)
          return make_error("moe: tid2eid[" + std::to_string(token_ids[t]) + "][" + std::to_string(k) +
                            "] = " + std::to_string(e) + " is not an expert id < " + std::to_string(s.n_experts));
      }
    }
    return s;
  }
  if (static_cast<int64_t>(w.bias.size()) != s.n_experts)
    return make_error("moe: gate bias has " + std::to_string(w.bias.size()) + " values for " +
                      std::to_string(s.n_experts) + " experts");
  if (!w.bias_vl.empty() && static_cast<int64_t>(w.bias_vl.size()) != s.n_experts)
    return make_error("moe: gate bias_vl has " + std::to_string(w.bias_vl.size()) + " values for " +
                      std::to_string(s.n_experts) + " experts");
  if (w.bias_vl.empty())
    for (int64_t t = 0; t < static_cast<int64_t>(is_image.size()); ++t)
      if (is_image[t])
        return make_error("moe: token " + std::to_string(t) + " is an image token but the gate has no bias_vl");
  return s;
}

}  // namespace

Result<MoeRouting> route_tokens(std::span<const float> x, int64_t n, const MoeWeights& w, const MoeParams& p,
                                std::span<const int64_t> token_ids, std::span<const uint8_t> is_image,
                                ThreadPool* pool) {
  CEDAR_ASSIGN_OR_RETURN(const ChunkShape s, check_routing_inputs(x, n, w, p, token_ids, is_image));
  const int64_t E = s.n_experts, K = p.topk;
  MoeRouting r;
  r.n = n;
  r.topk = K;
  r.n_experts = E;
  r.scores.resize(static_cast<size_t>(n * E));
  r.experts.resize(static_cast<size_t>(n * K));
  r.weights.resize(static_cast<size_t>(n * K));
  if (n == 0) return r;

  // Router GEMM in fp32 (the gate weight holds bf16 values; the reference promotes both sides).
  const cpu::LinearWeight gate{.format = WeightFormat::F32, .out = E, .in = s.d,
                               .data = reinterpret_cast<const uint8_t*>(w.gate.data())};
  CEDAR_RETURN_IF_ERROR(cpu::linear(gate, x, n, r.scores, {.bf16_output = false}, pool));
  const auto temp = static_cast<float>(p.gate_temp);
  for (float& v : r.scores) v = sqrt_softplus(v / temp);

  const bool hashed = !w.tid2eid.empty();
  std::vector<float> biased(static_cast<size_t>(E));
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    const float* st = r.scores.data() + t * E;
    int64_t* sel = r.experts.data() + t * K;
    if (hashed) {
      std::copy_n(w.tid2eid.data() + token_ids[t] * K, K, sel);
    } else {
      const bool image = !is_image.empty() && is_image[t] != 0;
      const std::span<const float> b = image ? w.bias_vl : w.bias;
      for (int64_t e = 0; e < E; ++e) {
        biased[e] = st[e] + b[e];
        order[e] = e;
      }
      std::partial_sort(order.begin(), order.begin() + K, order.end(), SelectionOrder{biased.data()});
      std::copy_n(order.begin(), K, sel);
    }
    float* wt = r.weights.data() + t * K;
    float sum = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      wt[k] = st[sel[k]];
      sum += wt[k];
    }
    for (int64_t k = 0; k < K; ++k) {
      if (p.norm_topk_prob) wt[k] = wt[k] / (sum + 1e-20f);
      wt[k] = wt[k] * static_cast<float>(p.route_scale);
    }
  }
  return r;
}

Status expert_forward(const ExpertWeights& e, std::span<const float> x, int64_t m,
                      std::span<const float> row_weights, const MoeParams& p, std::span<float> out,
                      ThreadPool* pool) {
  const int64_t d = e.w1.in, inter = e.w1.out;
  CEDAR_RETURN_IF_ERROR(check_expert(e, d, "expert"));
  if (m < 0 || static_cast<int64_t>(x.size()) != m * d || static_cast<int64_t>(out.size()) != m * d)
    return make_error("expert: input/output sizes " + std::to_string(x.size()) + "/" + std::to_string(out.size()) +
                      " are not " + std::to_string(m) + "×" + std::to_string(d));
  if (!row_weights.empty() && static_cast<int64_t>(row_weights.size()) != m)
    return make_error("expert: " + std::to_string(row_weights.size()) + " routing weights for " +
                      std::to_string(m) + " rows");
  if (m == 0) return Status::Ok();
  const cpu::LinearOptions opt{.bf16_output = true, .act_block = p.act_block};
  std::vector<float> g(static_cast<size_t>(m * inter)), u(g.size());
  CEDAR_RETURN_IF_ERROR(cpu::linear(e.w1, x, m, g, opt, pool));
  CEDAR_RETURN_IF_ERROR(cpu::linear(e.w3, x, m, u, opt, pool));
  const bool clamp = p.swiglu_limit > 0.0;
  const auto limit = static_cast<float>(p.swiglu_limit);
  for (int64_t t = 0; t < m; ++t)
    for (int64_t i = 0; i < inter; ++i) {
      const size_t at = static_cast<size_t>(t * inter + i);
      float gv = g[at], uv = u[at];
      if (clamp) {  // gate from above only, up on both sides (NaN passes through, as torch.clamp)
        gv = gv > limit ? limit : gv;
        uv = uv > limit ? limit : (uv < -limit ? -limit : uv);
      }
      float h = gv / (1.0f + std::exp(-gv)) * uv;  // silu(g)·u in fp32
      if (!row_weights.empty()) h = row_weights[t] * h;
      g[at] = round_to_bf16(h);  // the reference casts back to bf16 before W2
    }
  return cpu::linear(e.w2, g, m, out, opt, pool);
}

Status moe_forward(std::span<const float> x, int64_t n, const MoeWeights& w, const MoeParams& p,
                   std::span<const int64_t> token_ids, std::span<const uint8_t> is_image, std::span<float> y,
                   ThreadPool* pool) {
  CEDAR_ASSIGN_OR_RETURN(const ChunkShape s, check_routing_inputs(x, n, w, p, token_ids, is_image));
  const int64_t d = s.d, K = p.topk;
  if (static_cast<int64_t>(y.size()) != n * d)
    return make_error("moe: output has " + std::to_string(y.size()) + " values, expected " + std::to_string(n) +
                      "×" + std::to_string(d));
  for (int64_t e = 0; e < s.n_experts; ++e)
    CEDAR_RETURN_IF_ERROR(check_expert(w.experts[e], d, "moe: routed expert " + std::to_string(e)));
  CEDAR_RETURN_IF_ERROR(check_expert(w.shared, d, "moe: shared expert"));
  if (n == 0) return Status::Ok();

  CEDAR_ASSIGN_OR_RETURN(const MoeRouting r, route_tokens(x, n, w, p, token_ids, is_image, pool));

  // Group (token, slot) pairs per expert, in token then slot order.
  std::vector<std::vector<std::pair<int64_t, float>>> rows(static_cast<size_t>(s.n_experts));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < K; ++k)
      rows[r.experts[t * K + k]].emplace_back(t, r.weights[t * K + k]);

  // Experts in ascending id, each adding its bf16 outputs into the fp32 sum: per token this is the
  // reference's order (routed experts by id, then the shared expert).
  std::vector<float> acc(static_cast<size_t>(n * d), 0.0f);
  std::vector<float> xe, we, ye;
  for (int64_t e = 0; e < s.n_experts; ++e) {
    const auto& list = rows[e];
    if (list.empty()) continue;
    const auto m = static_cast<int64_t>(list.size());
    xe.resize(static_cast<size_t>(m * d));
    we.resize(static_cast<size_t>(m));
    ye.resize(static_cast<size_t>(m * d));
    for (int64_t i = 0; i < m; ++i) {
      std::copy_n(x.data() + list[i].first * d, d, xe.data() + i * d);
      we[i] = list[i].second;
    }
    if (Status st = expert_forward(w.experts[e], xe, m, we, p, ye, pool); !st.ok())
      return st.error().with_context("moe: routed expert " + std::to_string(e));
    for (int64_t i = 0; i < m; ++i) {
      float* dst = acc.data() + list[i].first * d;
      const float* src = ye.data() + i * d;
      for (int64_t c = 0; c < d; ++c) dst[c] += src[c];
    }
  }
  std::vector<float> shared(static_cast<size_t>(n * d));
  if (Status st = expert_forward(w.shared, x, n, {}, p, shared, pool); !st.ok())
    return st.error().with_context("moe: shared expert");
  for (size_t i = 0; i < acc.size(); ++i) y[i] = round_to_bf16(acc[i] + shared[i]);
  return Status::Ok();
}

}  // namespace cedar
