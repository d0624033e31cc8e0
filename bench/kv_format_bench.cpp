// KV record codecs (kv/kv_format.h): encode (QDQ + pack) and decode of one entry, per format; and
// block-table growth of the pool (allocation cost per block).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_format.h"

namespace {

using namespace cedar;

KvRecordFormat format_of(int64_t recipe) {
  switch (recipe) {
    case 0: return *KvRecordFormat::make(KvRecipe::Fp4Block16E4m3, KvStorage::Packed, 512);
    case 1: return *KvRecordFormat::make(KvRecipe::Fp4Block32Ue8m0, KvStorage::Packed, 128);
    case 2: return *KvRecordFormat::make(KvRecipe::Fp8Block32Ue8m0, KvStorage::Packed, 512);
    default: return *KvRecordFormat::make(KvRecipe::V4Fp8Bf16Rope, KvStorage::Packed, 512, 64);
  }
}

std::vector<float> random_values(int64_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

void BM_Encode(benchmark::State& state) {
  const KvRecordFormat f = format_of(state.range(0));
  const std::vector<float> raw = random_values(f.width);
  std::vector<float> v(raw.size());
  std::vector<uint8_t> rec(static_cast<size_t>(f.record_bytes()));
  for (auto _ : state) {
    v = raw;
    benchmark::DoNotOptimize(f.encode(v, rec).ok());
  }
  state.SetLabel(f.name());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Encode)->DenseRange(0, 3);

void BM_Decode(benchmark::State& state) {
  const KvRecordFormat f = format_of(state.range(0));
  std::vector<float> v = random_values(f.width), out(v.size());
  std::vector<uint8_t> rec(static_cast<size_t>(f.record_bytes()));
  if (!f.encode(v, rec).ok()) state.SkipWithError("encode failed");
  for (auto _ : state) {
    f.decode(rec, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(f.name());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Decode)->DenseRange(0, 3);

void BM_BlockTableGrowth(benchmark::State& state) {
  auto pool = *BlockPool::create({.dry_run = true});
  for (auto _ : state) {
    auto t = *BlockTable::create(pool, 288, 32);
    if (!t.ensure(32 * 1024).ok()) state.SkipWithError("ensure failed");
    benchmark::DoNotOptimize(t.blocks());
  }
  state.SetItemsProcessed(state.iterations() * 1024);  // blocks
}
BENCHMARK(BM_BlockTableGrowth);

}  // namespace
BENCHMARK_MAIN();
