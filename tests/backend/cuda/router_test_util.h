// The router tests' case (ffn_moe_cutest.cpp, perf_router_cutest.cpp): random activations, gate,
// biases and image flags with the CPU oracle's MoeWeights view, their device copies wired into
// RouterArgs (optionally with the split-K workspace), and the CPU's fp32 logits and Σ|x·w| bounds.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/ffn_kernels.h"
#include "ffn_test_util.h"
#include "model/moe.h"

namespace cedar::cuda::ffn_testing {

struct RouterCase {
  int64_t n = 0, d = 0, E = 0, K = 0;
  std::vector<float> x, gate, bias, bias_vl;
  std::vector<uint8_t> image;
  MoeParams p;
};

inline RouterCase make_router_case(int64_t n, int64_t d, int64_t E, int64_t K, uint32_t seed) {
  RouterCase c;
  c.n = n;
  c.d = d;
  c.E = E;
  c.K = K;
  c.x = random_acts(n * d, seed, 1.0f, -3, 2);
  c.gate = random_bf16(E * d, seed + 1, 0.03f);
  std::mt19937 rng(seed + 2);
  std::normal_distribution<float> nd(0.0f, 0.2f);
  c.bias.resize(E);
  c.bias_vl.resize(E);
  for (auto& b : c.bias) b = nd(rng);
  for (auto& b : c.bias_vl) b = nd(rng);
  c.image.assign(n, 0);
  if (n > 1) c.image[1] = 1;
  c.p.topk = K;
  c.p.route_scale = 1.5;
  return c;
}

// The CPU's view of the case (no expert weights: routing only); `experts` holds the empty experts.
inline MoeWeights router_weights(const RouterCase& c, std::vector<ExpertWeights>& experts) {
  experts.assign(c.E, ExpertWeights{});
  MoeWeights w;
  w.gate = c.gate;
  w.bias = c.bias;
  w.bias_vl = c.bias_vl;
  w.experts = experts;
  return w;
}

// Device state of one case; `with_splitk` adds the split-K workspace (counters zeroed once).
struct RouterDevice {
  DeviceBuffer<float> x, bias, bias_vl, logits, scores, weights, part;
  DeviceBuffer<uint16_t> gate;
  DeviceBuffer<uint8_t> image;
  DeviceBuffer<int32_t> experts;
  DeviceBuffer<unsigned> counters;
  RouterArgs args;
};

inline RouterDevice upload_router(const RouterCase& c, bool with_splitk = false) {
  RouterDevice dv;
  dv.x = upload(c.x);
  dv.gate = upload(bf16_bits(c.gate));
  dv.bias = upload(c.bias);
  dv.bias_vl = upload(c.bias_vl);
  dv.image = upload(c.image);
  dv.logits = alloc<float>(c.n * c.E);
  dv.scores = alloc<float>(c.n * c.E);
  dv.experts = alloc<int32_t>(c.n * c.K);
  dv.weights = alloc<float>(c.n * c.K);
  RouterArgs& a = dv.args;
  a.n = c.n;
  a.d = c.d;
  a.n_experts = c.E;
  a.topk = c.K;
  a.x = dv.x.get();
  a.gate = dv.gate.get();
  a.bias = dv.bias.get();
  a.bias_vl = dv.bias_vl.get();
  a.is_image = dv.image.get();
  a.route_scale = static_cast<float>(c.p.route_scale);
  a.logits = dv.logits.get();
  a.scores = dv.scores.get();
  a.experts = dv.experts.get();
  a.weights = dv.weights.get();
  if (with_splitk) {
    const SplitKSize need = router_workspace_size(c.E, c.d);
    dv.part = alloc<float>(need.partial_floats);
    dv.counters = alloc<unsigned>(need.counters);
    EXPECT_TRUE(dv.counters.zero().ok());
    a.splitk = SplitKWorkspace{dv.part.get(), dv.counters.get(), need.partial_floats, need.counters};
  }
  return dv;
}

// The CPU's fp32 logits x·gateᵀ [n, E] (route_tokens' GEMM).
inline std::vector<float> router_cpu_logits(const RouterCase& c) {
  std::vector<float> out(c.n * c.E);
  const cpu::LinearWeight w{
      .format = WeightFormat::F32, .out = c.E, .in = c.d, .data = reinterpret_cast<const uint8_t*>(c.gate.data())};
  EXPECT_TRUE(cpu::linear(w, c.x, c.n, out, {.bf16_output = false}, nullptr).ok());
  return out;
}

// Σ|x·w| per logit [n, E]: the scale of every summation-order bound on the logits.
inline std::vector<float> router_abs_dot(const RouterCase& c) {
  std::vector<float> ax(c.x.size()), ag(c.gate.size()), out(c.n * c.E);
  std::transform(c.x.begin(), c.x.end(), ax.begin(), [](float v) { return std::fabs(v); });
  std::transform(c.gate.begin(), c.gate.end(), ag.begin(), [](float v) { return std::fabs(v); });
  const cpu::LinearWeight w{
      .format = WeightFormat::F32, .out = c.E, .in = c.d, .data = reinterpret_cast<const uint8_t*>(ag.data())};
  EXPECT_TRUE(cpu::linear(w, ax, c.n, out, {.bf16_output = false}, nullptr).ok());
  return out;
}

}  // namespace cedar::cuda::ffn_testing
