// Safetensors header parsing and checkpoint opening at the scale of the released checkpoint
// (96 085 tensors in 48 shards): reports tensors/s.
//   build/release/bench/safetensors_bench
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace {

namespace fs = std::filesystem;
using cedar::DType;
using cedar::io::Checkpoint;
using cedar::io::SafetensorsWriter;

// Names and dtypes shaped like the real inventory (expert weights and scales dominate); tiny data so the
// benchmark measures header work, not I/O.
SafetensorsWriter make_writer(int n_tensors) {
  SafetensorsWriter w;
  const char* parts[] = {"w1", "w2", "w3"};
  for (int i = 0; i < n_tensors; ++i) {
    const int layer = i / 2304, expert = (i / 6) % 384, part = (i / 2) % 3;
    const bool scale = i % 2 == 1;
    std::string name = "layers." + std::to_string(layer) + ".ffn.experts." + std::to_string(expert) + "." +
                       parts[part] + (scale ? ".scale" : ".weight") + (i >= 2304 * 40 ? "." + std::to_string(i) : "");
    const DType dtype = scale ? DType::F8_E8M0 : DType::I8;
    if (!w.add(std::move(name), dtype, {2, 4}, std::vector<uint8_t>(8, 0x11)).ok()) std::abort();
  }
  return w;
}

// A temporary directory holding one sharded checkpoint and one single-file image, made once.
struct Fixture {
  static constexpr int kTensors = 100'000;
  static constexpr int kShards = 48;

  Fixture() {
    std::string tmpl = (fs::temp_directory_path() / "cedar_st_bench_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) std::abort();
    dir = tmpl;
    SafetensorsWriter w = make_writer(kTensors);
    if (!w.write_sharded(dir / "sharded", kShards).ok() || !w.write_file(dir / "single.safetensors").ok()) std::abort();
    std::ifstream in(dir / "single.safetensors", std::ios::binary);
    single = std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::ifstream shard(dir / "sharded" / "model-00001-of-00048.safetensors", std::ios::binary);
    one_shard = std::vector<uint8_t>(std::istreambuf_iterator<char>(shard), std::istreambuf_iterator<char>());
  }
  ~Fixture() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  fs::path dir;
  std::vector<uint8_t> single;     // all tensors in one file image
  std::vector<uint8_t> one_shard;  // about kTensors / kShards tensors, like one real shard
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void BM_ParseHeader_OneShard(benchmark::State& state) {
  const auto& bytes = fixture().one_shard;
  size_t n = 0;
  for (auto _ : state) {
    auto h = cedar::io::parse_safetensors(bytes, "shard");
    if (!h.ok()) {
      state.SkipWithError(h.error().message.c_str());
      break;
    }
    n = h->tensors.size();
    benchmark::DoNotOptimize(h);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
  state.counters["tensors"] = static_cast<double>(n);
}
BENCHMARK(BM_ParseHeader_OneShard)->Unit(benchmark::kMicrosecond);

void BM_ParseHeader_100kTensors(benchmark::State& state) {
  const auto& bytes = fixture().single;
  for (auto _ : state) {
    auto h = cedar::io::parse_safetensors(bytes, "single");
    if (!h.ok()) {
      state.SkipWithError(h.error().message.c_str());
      break;
    }
    benchmark::DoNotOptimize(h);
  }
  state.SetItemsProcessed(state.iterations() * Fixture::kTensors);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes.size() - 8 * Fixture::kTensors));
}
BENCHMARK(BM_ParseHeader_100kTensors)->Unit(benchmark::kMillisecond);

// mmap of 48 shards + header validation + cross-check against the index json + name sort.
void BM_OpenSharded_100kTensors(benchmark::State& state) {
  const fs::path dir = fixture().dir / "sharded";
  for (auto _ : state) {
    auto ckpt = Checkpoint::open(dir);
    if (!ckpt.ok()) {
      state.SkipWithError(ckpt.error().message.c_str());
      break;
    }
    benchmark::DoNotOptimize(ckpt);
  }
  state.SetItemsProcessed(state.iterations() * Fixture::kTensors);
}
BENCHMARK(BM_OpenSharded_100kTensors)->Unit(benchmark::kMillisecond);

void BM_FindTensor(benchmark::State& state) {
  auto ckpt = Checkpoint::open(fixture().dir / "sharded");
  if (!ckpt.ok()) {
    state.SkipWithError(ckpt.error().message.c_str());
    return;
  }
  const auto& tensors = ckpt->tensors();
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(ckpt->find(tensors[i].name));
    i = (i + 7919) % tensors.size();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_FindTensor);

}  // namespace

BENCHMARK_MAIN();
