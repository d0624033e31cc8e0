// The prefix cache's SSD tier (kv/kv_disk_store.h) against recomputation, and what it persists.
//
// BM_SsdLoad: an N-token prefix of the make-tiny model ("tiny" d 64, "small" d 512), whose real global
// KV (the block tables after a forward over N tokens) was stored block by block in a KvDiskStore:
// get() every block (read + checksum + header checks) and copy its streams into freshly allocated
// pool blocks, as a hit from disk does. cold=1 drops the files from the page cache before every
// iteration (posix_fadvise DONTNEED; the VM's host may still cache them). Counters: bytes_per_second
// (file bytes), recompute_ms (the same prefix recomputed by the CPU forward, exact mode, 1 thread,
// median of 3, measured once in setup) and recompute_x = recompute_ms / load ms.
// BM_SsdLoadV41Flash: the same load path at the released V4.1-Flash block size (57 676-byte files,
// random record bytes), tokens/s and GB/s.
// BM_Recompute: the forward over N tokens itself (threads 1 and all cores).
// BM_ModelFingerprint: model_fingerprint() of the tiny checkpoint and of a sparse 500 GB checkpoint
// (a real safetensors header over a hole), which shows the cost does not grow with the data.
// Before the benchmarks, main() prints the persisted bytes per token of V4.1-Flash and V4-Flash from
// the released configs (tests/data/configs): the pool's records and the file overhead of a block.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_model.h"
#include "core/threads.h"
#include "io/config.h"
#include "io/model_fingerprint.h"
#include "io/safetensors.h"
#include "kv/kv_disk_store.h"
#include "kv/kv_layout.h"
#include "model/deepseek_v41.h"
#include "model/layer_plan.h"
#include "model/tiny_checkpoint.h"

namespace {

namespace fs = std::filesystem;
using namespace cedar;

constexpr int64_t kTokensPerBlock = 64;

struct BenchModel {
  std::unique_ptr<DeepseekV41Model> model;
  std::string fingerprint;
};

const BenchModel* bench_model(const std::string& profile) {
  static std::map<std::string, std::unique_ptr<BenchModel>> models;
  auto it = models.find(profile);
  if (it != models.end()) return it->second.get();
  auto bm = std::make_unique<BenchModel>();
  bm->model = bench::load_tiny_profile(profile, "cedar-prefix-bench", [&](const fs::path& dir) {
    auto fp = model_fingerprint(dir);
    if (fp.ok()) bm->fingerprint = *fp;
    return fp.ok();
  });
  return (models[profile] = std::move(bm)).get();
}

using bench::ids;
using bench::profile_of;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Result<KvDiskLayout> packed_layout(const ModelConfig& config, const LayerPlan& plan, int64_t tokens_per_block,
                                   std::vector<KvStreamSpec>* specs_out = nullptr) {
  const KvDims dims{config.arch, config.head_dim, config.index_head_dim, config.qk_rope_head_dim};
  CEDAR_ASSIGN_OR_RETURN(const KvFormats formats, kv_formats(dims, KvStorage::Packed));
  CEDAR_ASSIGN_OR_RETURN(std::vector<KvStreamSpec> specs, global_kv_streams(plan, formats, tokens_per_block));
  if (specs_out) *specs_out = specs;
  return kv_disk_layout(specs, tokens_per_block);
}

// An N-token prefix stored on disk, ready to be loaded.
struct StoredPrefix {
  std::string error;
  fs::path dir;
  std::unique_ptr<KvDiskStore> store;
  std::vector<PrefixKey> keys;
  KvDiskLayout layout;
  double recompute_ms = 0;
  ~StoredPrefix() {
    store.reset();
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

std::unique_ptr<StoredPrefix> store_prefix(const BenchModel& bm, int64_t n) {
  auto out = std::make_unique<StoredPrefix>();
  const DeepseekV41Model& model = *bm.model;
  std::vector<KvStreamSpec> specs;
  auto layout = packed_layout(model.config(), model.plan(), kTokensPerBlock, &specs);
  if (!layout.ok()) {
    out->error = layout.error().message;
    return out;
  }
  out->layout = *layout;
  const std::vector<int64_t> tokens = ids(n);
  std::vector<double> times;
  std::optional<SequenceState> seq;
  for (int rep = 0; rep < 3; ++rep) {
    auto s = model.new_sequence();
    const auto t0 = std::chrono::steady_clock::now();
    auto f = s.ok() ? model.forward(tokens, *s, ForwardOptions{}) : Result<ForwardOutput>(s.error());
    times.push_back(ms_since(t0));
    if (!f.ok()) {
      out->error = f.error().message;
      return out;
    }
    seq = std::move(*s);
  }
  std::sort(times.begin(), times.end());
  out->recompute_ms = times[1];

  out->dir = fs::temp_directory_path() / ("cedar-prefix-bench-store-" + std::to_string(::getpid()) + "-" +
                                          std::to_string(n) + "-" + std::to_string(model.config().hidden_size));
  fs::remove_all(out->dir);
  KvDiskStoreOptions o;
  o.dir = out->dir;
  o.budget_bytes = int64_t{1} << 40;
  o.model_fingerprint = bm.fingerprint;
  o.layout = out->layout;
  o.log = [](const std::string&) {};
  auto store = KvDiskStore::open(o);
  if (!store.ok()) {
    out->error = store.error().message;
    return out;
  }
  out->store = std::move(*store);
  const AttentionState& att = seq->attention();
  PrefixKey parent = prefix_root(bm.fingerprint, "bench");
  for (int64_t k = 0; k < n / kTokensPerBlock; ++k) {
    StoredPrefixBlock b;
    b.parent = parent;
    b.tokens.assign(tokens.begin() + k * kTokensPerBlock, tokens.begin() + (k + 1) * kTokensPerBlock);
    b.key = prefix_chain(parent, b.tokens);
    for (const KvStreamSpec& s : specs) {
      const KvSourceState& src = att.sources[static_cast<size_t>(att.source_slot[static_cast<size_t>(s.layer)])];
      const BlockTable& table = (s.kind == KvStreamKind::MainKv ? src.kv : src.index_k).blocks();
      const uint8_t* base = table.record(k * s.entries_per_block);
      b.streams.emplace_back(base, base + s.entries_per_block * s.format.record_bytes());
    }
    if (Status st = out->store->put(b); !st.ok()) {
      out->error = st.error().message;
      return out;
    }
    out->keys.push_back(b.key);
    parent = b.key;
  }
  return out;
}

void drop_from_page_cache(const KvDiskStore& store, const std::vector<PrefixKey>& keys) {
  for (const PrefixKey& k : keys) {
    const int fd = ::open(store.path_of(k).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// range(0): profile (0 tiny, 1 small); range(1): tokens; range(2): cold (1) or page cache (0).
void BM_SsdLoad(benchmark::State& state) {
  const BenchModel* bm = bench_model(profile_of(state.range(0)));
  if (!bm->model) return state.SkipWithError("could not build the checkpoint");
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<StoredPrefix>> prefixes;
  auto& prefix = prefixes[{state.range(0), state.range(1)}];
  if (!prefix) prefix = store_prefix(*bm, state.range(1));
  if (!prefix->error.empty()) return state.SkipWithError(prefix->error.c_str());
  const bool cold = state.range(2) != 0;
  auto pool = BlockPool::create({});
  std::vector<int32_t> classes;
  for (const KvDiskStreamLayout& s : prefix->layout.streams) classes.push_back(*(*pool)->size_class(s.block_bytes()));
  std::vector<BlockId> held;
  double load_ms = 0;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      drop_from_page_cache(*prefix->store, prefix->keys);
      state.ResumeTiming();
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (const PrefixKey& key : prefix->keys) {
      auto block = prefix->store->get(key);
      if (!block) return state.SkipWithError("a stored block did not load");
      for (size_t s = 0; s < block->streams.size(); ++s) {
        auto id = (*pool)->allocate(classes[s]);
        if (!id.ok()) return state.SkipWithError(id.error().message.c_str());
        std::memcpy((*pool)->data(*id), block->streams[s].data(), block->streams[s].size());
        held.push_back(*id);
      }
    }
    load_ms += ms_since(t0);
    state.PauseTiming();
    for (BlockId id : held) (void)(*pool)->release(id);
    held.clear();
    state.ResumeTiming();
  }
  const int64_t bytes = prefix->store->file_layout().file_bytes * static_cast<int64_t>(prefix->keys.size());
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["blocks"] = static_cast<double>(prefix->keys.size());
  state.counters["file_bytes"] = static_cast<double>(prefix->store->file_layout().file_bytes);
  state.counters["recompute_ms"] = prefix->recompute_ms;
  state.counters["recompute_x"] = prefix->recompute_ms / (load_ms / static_cast<double>(state.iterations()));
}
BENCHMARK(BM_SsdLoad)
    ->ArgsProduct({{0}, {64, 256, 1024, 4096}, {0, 1}})
    ->ArgsProduct({{1}, {64, 256, 1024}, {0, 1}})
    ->ArgNames({"small", "tokens", "cold"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The same load path at the block size of the released V4.1-Flash layout (8 streams, 57 676-byte files),
// with random record bytes (the model is too large to run here): range(0) tokens, range(1) cold.
void BM_SsdLoadV41Flash(benchmark::State& state) {
  static std::map<int64_t, std::unique_ptr<StoredPrefix>> prefixes;
  auto& prefix = prefixes[state.range(0)];
  if (!prefix) {
    prefix = std::make_unique<StoredPrefix>();
    auto config = load_model_config(std::string(CEDAR_SOURCE_DIR) + "/tests/data/configs/deepseek_v41_flash");
    auto plan = config.ok() ? build_layer_plan(*config) : Result<LayerPlan>(config.error());
    auto layout = plan.ok() ? kv_disk_layout_for(*config, *plan, kTokensPerBlock) : Result<KvDiskLayout>(plan.error());
    if (!layout.ok()) return state.SkipWithError(layout.error().message.c_str());
    prefix->layout = *layout;
    prefix->dir = fs::temp_directory_path() /
                  ("cedar-prefix-bench-v41-" + std::to_string(::getpid()) + "-" + std::to_string(state.range(0)));
    fs::remove_all(prefix->dir);
    KvDiskStoreOptions o;
    o.dir = prefix->dir;
    o.budget_bytes = int64_t{1} << 40;
    o.model_fingerprint = std::string(64, 'a');
    o.layout = prefix->layout;
    o.log = [](const std::string&) {};
    auto store = KvDiskStore::open(o);
    if (!store.ok()) return state.SkipWithError(store.error().message.c_str());
    prefix->store = std::move(*store);
    std::mt19937_64 rng(5);
    PrefixKey parent = prefix_root(o.model_fingerprint, "bench");
    for (int64_t k = 0; k < state.range(0) / kTokensPerBlock; ++k) {
      StoredPrefixBlock b;
      b.parent = parent;
      for (int64_t i = 0; i < kTokensPerBlock; ++i) b.tokens.push_back(static_cast<int64_t>(rng() % 129280));
      b.key = prefix_chain(parent, b.tokens);
      for (const KvDiskStreamLayout& s : prefix->layout.streams) {
        std::vector<uint8_t> bytes(static_cast<size_t>(s.block_bytes()));
        for (auto& x : bytes) x = static_cast<uint8_t>(rng());
        b.streams.push_back(std::move(bytes));
      }
      if (Status st = prefix->store->put(b); !st.ok()) return state.SkipWithError(st.error().message.c_str());
      prefix->keys.push_back(b.key);
      parent = b.key;
    }
  }
  const bool cold = state.range(1) != 0;
  auto pool = BlockPool::create({});
  std::vector<int32_t> classes;
  for (const KvDiskStreamLayout& s : prefix->layout.streams) classes.push_back(*(*pool)->size_class(s.block_bytes()));
  std::vector<BlockId> held;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      drop_from_page_cache(*prefix->store, prefix->keys);
      state.ResumeTiming();
    }
    for (const PrefixKey& key : prefix->keys) {
      auto block = prefix->store->get(key);
      if (!block) return state.SkipWithError("a stored block did not load");
      for (size_t s = 0; s < block->streams.size(); ++s) {
        auto id = (*pool)->allocate(classes[s]);
        if (!id.ok()) return state.SkipWithError(id.error().message.c_str());
        std::memcpy((*pool)->data(*id), block->streams[s].data(), block->streams[s].size());
        held.push_back(*id);
      }
    }
    state.PauseTiming();
    for (BlockId id : held) (void)(*pool)->release(id);
    held.clear();
    state.ResumeTiming();
  }
  const int64_t bytes = prefix->store->file_layout().file_bytes * static_cast<int64_t>(prefix->keys.size());
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetItemsProcessed(state.iterations() * state.range(0));  // tokens per second
}
BENCHMARK(BM_SsdLoadV41Flash)
    ->ArgsProduct({{4096, 65536}, {0, 1}})
    ->ArgNames({"tokens", "cold"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// range(0): profile; range(1): tokens; range(2): threads (0 = all cores).
void BM_Recompute(benchmark::State& state) {
  const BenchModel* bm = bench_model(profile_of(state.range(0)));
  if (!bm->model) return state.SkipWithError("could not build the checkpoint");
  const auto prompt = ids(state.range(1));
  ThreadPool pool(static_cast<int>(state.range(2)));
  ForwardOptions fo;
  fo.pool = &pool;
  for (auto _ : state) {
    auto seq = bm->model->new_sequence();
    auto out = bm->model->forward(prompt, *seq, fo);
    if (!out.ok()) return state.SkipWithError(out.error().message.c_str());
    benchmark::DoNotOptimize(out->logits.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(1));
}
BENCHMARK(BM_Recompute)
    ->ArgsProduct({{0}, {64, 256, 1024, 4096}, {1, 0}})
    ->ArgsProduct({{1}, {64, 256, 1024}, {1, 0}})
    ->ArgNames({"small", "tokens", "threads"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Checkpoint directories written once per process and deleted at exit.
struct ScratchDirs {
  std::vector<fs::path> dirs;
  ~ScratchDirs() {
    std::error_code ec;
    for (const fs::path& d : dirs) fs::remove_all(d, ec);
  }
};
ScratchDirs scratch;

// One 500 GB shard: a valid safetensors header (one U8 tensor covering the data) followed by a hole
// (a sparse file: no disk space used, reads of the hole return zeros without I/O).
fs::path sparse_checkpoint() {
  const fs::path dir = fs::temp_directory_path() / ("cedar-prefix-bench-sparse-" + std::to_string(::getpid()));
  if (fs::exists(dir / "config.json")) return dir;
  scratch.dirs.push_back(dir);
  fs::create_directories(dir);
  const uint64_t data = uint64_t{500} << 30;
  std::string header = "{\"weight\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(data) + "],\"data_offsets\":[0," +
                       std::to_string(data) + "]}}";
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  bytes += header;
  const fs::path shard = dir / "model.safetensors";
  if (FILE* f = std::fopen(shard.c_str(), "wb")) {
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  std::error_code ec;
  fs::resize_file(shard, bytes.size() + data, ec);
  if (FILE* c = std::fopen((dir / "config.json").c_str(), "wb")) {
    std::fputs("{\"model_type\": \"sparse-bench\"}\n", c);
    std::fclose(c);
  }
  return dir;
}

fs::path tiny_checkpoint() {
  const fs::path dir = fs::temp_directory_path() / ("cedar-prefix-bench-fp-" + std::to_string(::getpid()));
  if (fs::exists(dir / "config.json")) return dir;
  scratch.dirs.push_back(dir);
  TinyCheckpointOptions options;
  options.tokenizer_files = false;
  if (!make_tiny_checkpoint(options, dir, true).ok()) return {};
  return dir;
}

void BM_ModelFingerprint(benchmark::State& state) {
  const fs::path dir = state.range(0) == 0 ? tiny_checkpoint() : sparse_checkpoint();
  if (dir.empty()) return state.SkipWithError("make-tiny failed");
  std::error_code ec;
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) total += e.file_size(ec);
  for (auto _ : state) {
    auto fp = model_fingerprint(dir);
    if (!fp.ok()) return state.SkipWithError(fp.error().message.c_str());
    benchmark::DoNotOptimize(fp->data());
  }
  state.counters["checkpoint_GB"] = static_cast<double>(total) / 1e9;
  state.SetLabel(state.range(0) == 0 ? "make-tiny" : "sparse 500 GB shard");
}
BENCHMARK(BM_ModelFingerprint)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Persisted bytes per token of a released config: the block file (header + records + checksum) per
// cache-block span, and the same rounded up to 4 KiB filesystem blocks.
void print_persisted_bytes() {
  struct Row {
    const char* config;
    int64_t tokens_per_block;
  };
  const std::string base = std::string(CEDAR_SOURCE_DIR) + "/tests/data/configs/";
  const std::string fingerprint(64, '0');  // model_fingerprint() is 64 hex digits
  std::printf("persisted global KV per token (packed records, %zu-byte fingerprint)\n", fingerprint.size());
  std::printf(
      "| config | tokens/block | streams | records B/block | file B/block | B/token records | B/token file |"
      " B/token on 4 KiB fs blocks | B/token bf16 containers |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const Row r : {Row{"deepseek_v41_flash", 64}, Row{"deepseek_v41_flash", 128}, Row{"deepseek_v4_flash", 128},
                      Row{"deepseek_v4_flash_0731", 128}}) {
    auto config = load_model_config(base + r.config);
    if (!config.ok()) {
      std::printf("| %s | %s |\n", r.config, config.error().message.c_str());
      continue;
    }
    auto plan = build_layer_plan(*config);
    std::vector<KvStreamSpec> specs;
    auto layout =
        plan.ok() ? packed_layout(*config, *plan, r.tokens_per_block, &specs) : Result<KvDiskLayout>(plan.error());
    if (!layout.ok()) {
      std::printf("| %s | %lld | %s |\n", r.config, static_cast<long long>(r.tokens_per_block),
                  layout.error().message.c_str());
      continue;
    }
    const KvDiskFileLayout fl = kv_disk_file_layout(*layout, fingerprint);
    const double t = static_cast<double>(r.tokens_per_block);
    const int64_t on_fs = (fl.file_bytes + 4095) / 4096 * 4096;
    // The reference implementation keeps dequantized bf16 values in its caches (2 bytes per value).
    int64_t bf16 = 0;
    for (const KvStreamSpec& s : specs) bf16 += s.entries_per_block * s.format.width * 2;
    std::printf("| %s | %lld | %zu | %lld | %lld | %.2f | %.2f | %.2f | %.2f |\n", r.config,
                static_cast<long long>(r.tokens_per_block), specs.size(), static_cast<long long>(fl.record_bytes),
                static_cast<long long>(fl.file_bytes), static_cast<double>(fl.record_bytes) / t,
                static_cast<double>(fl.file_bytes) / t, static_cast<double>(on_fs) / t, static_cast<double>(bf16) / t);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  print_persisted_bytes();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
