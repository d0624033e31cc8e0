// Throughput of the CPU QDQ recipes (src/core/numeric.h), the oracle the CUDA kernels are checked
// against. Each iteration restores the bf16-exact input (a memcpy, included in the time) and quantizes
// it in place, writing codes and scales as the KV cache stores them. Reported: values/s ("items") and
// bytes/s over the bytes touched per value: 4 read + 4 written (fp32) + stored code and scale bytes.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/numeric.h"

namespace {

using QdqFn = cedar::Status (*)(std::span<float>, std::span<uint8_t>, std::span<uint8_t>);

std::vector<float> make_input(size_t n) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const float magnitude = std::ldexp(1.0f, static_cast<int>(i / 512 % 16) - 8);  // varies per KV entry
    x[i] = cedar::round_to_bf16(normal(rng) * magnitude);
  }
  return x;
}

void run_qdq(benchmark::State& state, QdqFn qdq, size_t block, bool packed4) {
  const auto n = static_cast<size_t>(state.range(0));
  const std::vector<float> input = make_input(n);
  std::vector<float> x(n);
  std::vector<uint8_t> codes(packed4 ? n / 2 : n), scales(n / block);
  for (auto _ : state) {
    std::copy(input.begin(), input.end(), x.begin());
    if (!qdq(x, codes, scales).ok()) {
      state.SkipWithError("qdq rejected the buffer sizes");
      break;
    }
    benchmark::DoNotOptimize(x.data());
    benchmark::DoNotOptimize(codes.data());
    benchmark::ClobberMemory();
  }
  const auto iters = static_cast<int64_t>(state.iterations());
  state.SetItemsProcessed(iters * static_cast<int64_t>(n));
  state.SetBytesProcessed(iters * static_cast<int64_t>(8 * n + codes.size() + scales.size()));
}

void BM_QdqFp8Block32Ue8m0(benchmark::State& state) { run_qdq(state, cedar::qdq_fp8_block32_ue8m0, 32, false); }
void BM_QdqFp4Block16E4m3(benchmark::State& state) { run_qdq(state, cedar::qdq_fp4_block16_e4m3, 16, true); }
void BM_QdqFp4Block32Ue8m0(benchmark::State& state) { run_qdq(state, cedar::qdq_fp4_block32_ue8m0, 32, true); }

// 512 = one KV entry; 1 Mi values = 2048 entries (a prefill chunk).
BENCHMARK(BM_QdqFp8Block32Ue8m0)->Arg(512)->Arg(1 << 20);
BENCHMARK(BM_QdqFp4Block16E4m3)->Arg(512)->Arg(1 << 20);
BENCHMARK(BM_QdqFp4Block32Ue8m0)->Arg(512)->Arg(1 << 20);

}  // namespace

BENCHMARK_MAIN();
