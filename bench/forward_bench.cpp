// CPU reference forward throughput on cedar's tiny checkpoint (make-tiny, seed 0, written once into a
// temporary directory): prefill tokens/s for several prompt lengths and decode tokens/s after a prompt,
// both exact mode, with 1 thread and with all cores. Items = tokens. The tiny model is dominated by the
// 129 280-row head and per-call overheads, not by the layers; real-model throughput needs the real
// checkpoint (the lead may extend this with weight GB/s).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <vector>

#include "model/deepseek_v41.h"
#include "model/tiny_checkpoint.h"

namespace {

namespace fs = std::filesystem;

// The model, loaded once per process.
const cedar::DeepseekV41Model* tiny_model() {
  static std::unique_ptr<cedar::DeepseekV41Model> model = [] {
    const fs::path dir = fs::temp_directory_path() / ("cedar-forward-bench-" + std::to_string(::getpid()));
    std::unique_ptr<cedar::DeepseekV41Model> m;
    cedar::TinyCheckpointOptions options;
    options.tokenizer_files = false;
    if (cedar::make_tiny_checkpoint(options, dir, true).ok()) {
      auto loaded = cedar::DeepseekV41Model::load(dir);
      if (loaded.ok()) m = std::make_unique<cedar::DeepseekV41Model>(std::move(*loaded));
    }
    std::error_code ec;
    fs::remove_all(dir, ec);  // the model keeps its files mapped
    return m;
  }();
  return model.get();
}

std::vector<int64_t> ids(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back((i * 7919 + 13) % 120000);
  return v;
}

// range(0): prompt tokens; range(1): threads.
void BM_Prefill(benchmark::State& state) {
  const cedar::DeepseekV41Model* model = tiny_model();
  if (!model) return state.SkipWithError("could not build the tiny checkpoint");
  const auto prompt = ids(state.range(0));
  cedar::ThreadPool pool(static_cast<int>(state.range(1)));
  cedar::ForwardOptions fo;
  fo.pool = &pool;
  for (auto _ : state) {
    auto seq = model->new_sequence();
    auto out = model->forward(prompt, *seq, fo);
    if (!out.ok()) return state.SkipWithError(out.error().message.c_str());
    benchmark::DoNotOptimize(out->logits.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Prefill)->ArgsProduct({{16, 64, 256}, {1, 0}})->ArgNames({"tokens", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);

// Decode one token at a time after a prompt of range(0) tokens; the context grows during the run.
void BM_Decode(benchmark::State& state) {
  const cedar::DeepseekV41Model* model = tiny_model();
  if (!model) return state.SkipWithError("could not build the tiny checkpoint");
  cedar::ThreadPool pool(static_cast<int>(state.range(1)));
  cedar::ForwardOptions fo;
  fo.pool = &pool;
  auto seq = model->new_sequence();
  if (!model->forward(ids(state.range(0)), *seq, fo).ok()) return state.SkipWithError("prefill failed");
  int64_t token = 1;
  for (auto _ : state) {
    const int64_t t[1] = {token};
    auto out = model->forward(t, *seq, fo);
    if (!out.ok()) return state.SkipWithError(out.error().message.c_str());
    token = (token * 31 + 7) % 120000;
    benchmark::DoNotOptimize(out->logits.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["context"] = static_cast<double>(seq->length());
}
BENCHMARK(BM_Decode)->ArgsProduct({{64, 1024}, {1, 0}})->ArgNames({"prompt", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
