// Throughput of the CPU reference MoE FFN (src/model/moe.h) — the oracle, not a fast path. Routed
// experts MXFP4, shared expert FP8 (32×32 blocks), activation block 32, as in V4.1. Reported: tokens/s
// ("items") and bytes/s of expert weights read (codes + scales of every expert that received a token,
// plus the shared expert; each weight is read once per forward).
//   tiny:  d 256,  inter 128, 16 experts, top-4
//   small: d 1024, inter 512, 64 experts, top-6
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "core/numeric.h"
#include "model/moe.h"

namespace {

struct Stored {
  std::vector<uint8_t> data, scale;
  cedar::cpu::LinearWeight view;
  int64_t bytes() const { return static_cast<int64_t>(data.size() + scale.size()); }
};

Stored mxfp4(int64_t out, int64_t in, std::mt19937& rng) {
  Stored s{std::vector<uint8_t>(static_cast<size_t>(out * in / 2)),
           std::vector<uint8_t>(static_cast<size_t>(out * in / 32)), {}};
  for (auto& b : s.data) b = static_cast<uint8_t>(rng());
  for (auto& b : s.scale) b = static_cast<uint8_t>(122 + rng() % 3);
  s.view = {.format = cedar::WeightFormat::MXFP4, .out = out, .in = in, .data = s.data.data(), .scale = s.scale.data()};
  return s;
}

Stored fp8(int64_t out, int64_t in, std::mt19937& rng) {
  Stored s{std::vector<uint8_t>(static_cast<size_t>(out * in)),
           std::vector<uint8_t>(static_cast<size_t>(((out + 31) / 32) * ((in + 31) / 32))), {}};
  std::normal_distribution<float> dist(0.0f, 8.0f);
  for (auto& b : s.data) b = cedar::f32_to_e4m3(dist(rng));
  for (auto& b : s.scale) b = static_cast<uint8_t>(120 + rng() % 3);
  s.view = {.format = cedar::WeightFormat::FP8Block, .out = out, .in = in, .data = s.data.data(),
            .scale = s.scale.data()};
  return s;
}

struct Layer {
  std::vector<float> gate, bias;
  std::vector<Stored> weights;  // 3 per routed expert (w1, w2, w3), then the shared expert's 3
  cedar::MoeWeights view;
  cedar::MoeParams params;
  int64_t expert_bytes = 0, shared_bytes = 0;
};

Layer make_layer(int64_t d, int64_t inter, int64_t n_experts, int64_t topk) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  Layer L;
  for (int64_t i = 0; i < n_experts * d; ++i) L.gate.push_back(cedar::round_to_bf16(normal(rng)));
  for (int64_t i = 0; i < n_experts; ++i) L.bias.push_back(normal(rng));
  L.weights.reserve(static_cast<size_t>(3 * n_experts + 3));
  for (int64_t e = 0; e < n_experts; ++e) {
    L.weights.push_back(mxfp4(inter, d, rng));
    L.weights.push_back(mxfp4(d, inter, rng));
    L.weights.push_back(mxfp4(inter, d, rng));
  }
  L.weights.push_back(fp8(inter, d, rng));
  L.weights.push_back(fp8(d, inter, rng));
  L.weights.push_back(fp8(inter, d, rng));
  L.view.gate = L.gate;
  L.view.bias = L.bias;
  for (int64_t e = 0; e < n_experts; ++e)
    L.view.experts.push_back({L.weights[3 * e].view, L.weights[3 * e + 1].view, L.weights[3 * e + 2].view});
  const size_t s = static_cast<size_t>(3 * n_experts);
  L.view.shared = {L.weights[s].view, L.weights[s + 1].view, L.weights[s + 2].view};
  L.expert_bytes = L.weights[0].bytes() + L.weights[1].bytes() + L.weights[2].bytes();
  L.shared_bytes = L.weights[s].bytes() + L.weights[s + 1].bytes() + L.weights[s + 2].bytes();
  L.params = {.topk = topk, .route_scale = 1.5, .swiglu_limit = 10.0};
  return L;
}

void run_moe(benchmark::State& state, int64_t d, int64_t inter, int64_t n_experts, int64_t topk) {
  const int64_t n = state.range(0);
  const Layer L = make_layer(d, inter, n_experts, topk);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * d)), y(x.size());
  for (auto& v : x) v = cedar::round_to_bf16(normal(rng));
  auto routing = cedar::route_tokens(x, n, L.view, L.params, {}, {}, nullptr);
  if (!routing.ok()) {
    state.SkipWithError(routing.error().message.c_str());
    return;
  }
  const std::set<int64_t> used(routing->experts.begin(), routing->experts.end());
  const int64_t bytes = static_cast<int64_t>(used.size()) * L.expert_bytes + L.shared_bytes;
  cedar::ThreadPool pool(static_cast<int>(state.range(1)));
  for (auto _ : state) {
    const cedar::Status st = cedar::moe_forward(x, n, L.view, L.params, {}, {}, y, &pool);
    if (!st.ok()) {
      state.SkipWithError(st.error().message.c_str());
      break;
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const auto iters = static_cast<int64_t>(state.iterations());
  state.SetItemsProcessed(iters * n);
  state.SetBytesProcessed(iters * bytes);
  state.counters["experts_run"] = static_cast<double>(used.size());
}

void BM_MoeTiny(benchmark::State& state) { run_moe(state, 256, 128, 16, 4); }
void BM_MoeSmall(benchmark::State& state) { run_moe(state, 1024, 512, 64, 6); }

// Args: tokens per chunk, threads. Wall-clock rates (the pool's workers are not in the CPU time).
BENCHMARK(BM_MoeTiny)->ArgNames({"tokens", "threads"})->Args({1, 1})->Args({32, 1})->Args({32, 2})->UseRealTime();
BENCHMARK(BM_MoeSmall)
    ->ArgNames({"tokens", "threads"})
    ->UseRealTime()
    ->Args({1, 1})
    ->Args({1, 2})
    ->Args({32, 2})
    ->Unit(benchmark::kMillisecond);

}  // namespace
BENCHMARK_MAIN();
