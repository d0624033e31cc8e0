// CPU reference forward throughput (exact mode) on make-tiny checkpoints written once into a temporary
// directory: profile "tiny" (10 layers at d 64: the 129 280-row head and per-call overheads dominate)
// and profile "small" (the same layers at d 512: the layers dominate). Prefill tokens/s for several
// prompt lengths, decode tokens/s after a prompt, with 1 thread and with all cores.
//
// Roofline counters: decode reads the active weights once per token at batch 1, so
//   weight_GBps = bytes_active_decode × tokens/s and GFLOPps = 2 × params_active_decode × tokens/s
// (model_stats.h; attention over the context is not counted). BM_MemoryCopy measures this machine's
// copy bandwidth in the same run (bytes read + written), the roofline to compare weight_GBps against.
#include <benchmark/benchmark.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_model.h"
#include "model/deepseek_v41.h"
#include "model/layer_plan.h"
#include "model/model_stats.h"
#include "model/weights.h"

namespace {

struct BenchModel {
  std::unique_ptr<cedar::DeepseekV41Model> model;
  double bytes_active_decode = 0;
  double params_active_decode = 0;
};

// One model per profile, built and loaded once per process.
const BenchModel* bench_model(const std::string& profile) {
  static std::map<std::string, std::unique_ptr<BenchModel>> models;
  auto it = models.find(profile);
  if (it != models.end()) return it->second.get();
  auto bm = std::make_unique<BenchModel>();
  bm->model = cedar::bench::load_tiny_profile(profile, "cedar-forward-bench");
  if (bm->model) {
    auto weights = cedar::expected_weights(bm->model->config(), bm->model->plan());
    if (weights.ok()) {
      const cedar::ModelStats stats = cedar::compute_model_stats(bm->model->config(), bm->model->plan(), *weights);
      bm->bytes_active_decode = static_cast<double>(stats.bytes_active_decode);
      bm->params_active_decode = static_cast<double>(stats.params_active_decode);
    }
  }
  return (models[profile] = std::move(bm)).get();
}

using cedar::bench::ids;
using cedar::bench::profile_of;

void set_roofline_counters(benchmark::State& state, const BenchModel& bm, double tokens) {
  using benchmark::Counter;
  state.counters["weight_GBps"] = Counter(tokens * bm.bytes_active_decode / 1e9, Counter::kIsRate);
  state.counters["GFLOPps"] = Counter(tokens * 2.0 * bm.params_active_decode / 1e9, Counter::kIsRate);
}

// range(0): profile (0 tiny, 1 small); range(1): prompt tokens; range(2): threads (0 = all cores).
void BM_Prefill(benchmark::State& state) {
  const BenchModel* bm = bench_model(profile_of(state.range(0)));
  if (!bm->model) return state.SkipWithError("could not build the checkpoint");
  const auto prompt = ids(state.range(1));
  cedar::ThreadPool pool(static_cast<int>(state.range(2)));
  cedar::ForwardOptions fo;
  fo.pool = &pool;
  for (auto _ : state) {
    auto seq = bm->model->new_sequence();
    auto out = bm->model->forward(prompt, *seq, fo);
    if (!out.ok()) return state.SkipWithError(out.error().message.c_str());
    benchmark::DoNotOptimize(out->logits.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(1));
  state.counters["GFLOPps"] = benchmark::Counter(
      static_cast<double>(state.iterations() * state.range(1)) * 2.0 * bm->params_active_decode / 1e9,
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Prefill)
    ->ArgsProduct({{0, 1}, {16, 64, 256}, {1, 0}})
    ->ArgNames({"small", "tokens", "threads"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Decode one token at a time after a prompt of range(1) tokens; the context grows during the run.
void BM_Decode(benchmark::State& state) {
  const BenchModel* bm = bench_model(profile_of(state.range(0)));
  if (!bm->model) return state.SkipWithError("could not build the checkpoint");
  cedar::ThreadPool pool(static_cast<int>(state.range(2)));
  cedar::ForwardOptions fo;
  fo.pool = &pool;
  auto seq = bm->model->new_sequence();
  if (!bm->model->forward(ids(state.range(1)), *seq, fo).ok()) return state.SkipWithError("prefill failed");
  int64_t token = 1;
  for (auto _ : state) {
    const int64_t t[1] = {token};
    auto out = bm->model->forward(t, *seq, fo);
    if (!out.ok()) return state.SkipWithError(out.error().message.c_str());
    token = (token * 31 + 7) % 120000;
    benchmark::DoNotOptimize(out->logits.data());
  }
  state.SetItemsProcessed(state.iterations());
  set_roofline_counters(state, *bm, static_cast<double>(state.iterations()));
  state.counters["context"] = static_cast<double>(seq->length());
}
BENCHMARK(BM_Decode)
    ->ArgsProduct({{0, 1}, {64, 1024}, {1, 0}})
    ->ArgNames({"small", "prompt", "threads"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// This machine's memory bandwidth: memcpy of a 256 MiB buffer (far beyond the caches); bytes = read + write.
void BM_MemoryCopy(benchmark::State& state) {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(2 * bytes));
}
BENCHMARK(BM_MemoryCopy)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
