// Shared by `cedar run`, `cedar chat` and `cedar bench`: find and load a model (the embedded default
// when none is named) with a progress bar for large checkpoints, and its tokenizer.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "cli/args.h"
#include "cli/device_runner.h"
#include "core/threads.h"
#include "engine/engine.h"
#include "engine/pool_cache_budget.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "io/config.h"
#include "kv/kv_disk_store.h"
#include "model/layer_plan.h"
#include "model/deepseek_v41.h"
#include "text/tokenizer.h"

namespace cedar::cli {

struct LoadedModel {
  std::filesystem::path path;
  // Shared with the GPU model under --device cuda (CudaModel::load of a host model): one host copy.
  std::shared_ptr<const DeepseekV41Model> model;
  std::unique_ptr<text::Tokenizer> tokenizer;
  double load_seconds = 0;
};

struct LoadRequest {
  std::optional<std::string> model;  // none: the embedded default (created on first use)
  ThreadPool* pool = nullptr;
  bool progress = true;              // progress bar on stderr (TTY only, checkpoints >= 1 GiB)
  std::string command;               // for messages
};

// The tokenizer comes from MODEL/tokenizer.json, else cedar's V4.1 tokenizer source.
Result<LoadedModel> load_for_generation(const LoadRequest& request);

// A model's path (the embedded default when none is named, created on first use), config and layer plan,
// without its weights: what options that depend on the model (--context) are checked against in a
// second, before the load.
struct ModelHead {
  std::filesystem::path path;
  ModelConfig config;
  LayerPlan plan;
};
Result<ModelHead> read_model_head(const std::optional<std::string>& model);

// --context N: positions one sequence may reach (prompt + output). Default: max_position_embeddings with
// --device cpu; with --device cuda (whose memory plan is sized for it at load) the longest context the KV
// budget affords (engine/context_length.h, docs/server.md "Context length").
OptionSpec context_option_spec();
struct ContextRequest {
  const ParsedArgs* args = nullptr;
  const ModelHead* head = nullptr;
  bool cuda = false;
  int64_t kv_budget_bytes = 0;  // --kv-bytes (serve) or --kv-cache-mb (run, chat)
  int64_t max_running = 16;     // cuda: the decode batch the device plan is sized for
};
// The context of `request` (engine::serving_context_length); errors (bad option values) start "--context".
Result<int64_t> context_from_args(const ContextRequest& request);

// The sampling options every generating command accepts (--temperature, --top-p, --seed, ...), and
// their values as SamplingParams (validated later against the vocabulary).
std::vector<OptionSpec> sampling_option_specs(const std::string& default_max_tokens);
Result<engine::SamplingParams> sampling_from_args(const ParsedArgs& args);

// --mode ced|exact, or --exact.
Result<ForwardMode> mode_from_args(const ParsedArgs& args);

// --kv-cache-mb N: the KV cache capacity in MiB (paged global KV + per-sequence SWA state). The engine
// preempts (and later recomputes) requests when it is full.
OptionSpec kv_cache_option_spec();
// The budget (with its shared block pool) and the cache options the model runner gives its sequences.
// `swa_history`: extra SWA ring slots per sequence (the prefix cache's), charged per sequence.
struct KvCacheSetup {
  std::unique_ptr<engine::PoolCacheBudget> budget;
  KvCacheOptions kv;  // kv.pool = budget->pool()
};
Result<KvCacheSetup> kv_cache_from_args(const ParsedArgs& args, const DeepseekV41Model& model, int64_t swa_history = 0);
// --kv-cache-mb in bytes (validated).
Result<int64_t> kv_cache_bytes_from_args(const ParsedArgs& args);
Result<KvCacheSetup> kv_cache_setup(const DeepseekV41Model& model, int64_t capacity_bytes, int64_t swa_history);

// Prefix cache options (docs/prefix_cache.md): --no-prefix-cache, --swa-pool-mb N, --swa-ttl-s S,
// --swa-history N, --swa-replay exact|window. The SSD tier's --kv-cache-dir DIR / --kv-cache-dir-gb N
// (engineer "disk") plug in here as PrefixCacheOptions::store.
std::vector<OptionSpec> prefix_cache_option_specs();
// Options with swa_history resolved (sliding_window + tokens_per_block unless given; 0 when off).
Result<engine::PrefixCacheOptions> prefix_cache_from_args(const ParsedArgs& args, const DeepseekV41Model& model);
// The swa_history sequences get with these options (0 when the cache is off).
int64_t swa_history_of(const engine::PrefixCacheOptions& options);

// --kv-cache-dir DIR: the SSD tier of the prefix cache (kv/kv_disk_store.h), one file per 64-token
// block of global KV, kept across restarts; --kv-cache-dir-gb N: its size budget in GiB (fractions
// allowed, default 64), least recently used blocks are deleted past it.
std::vector<OptionSpec> kv_disk_option_specs();
// The store for `model` (loaded from `model_path`: its fingerprint keys the files, so blocks of another
// model are never used) with the layout of its packed global-KV streams at `tokens_per_block`
// (KvCacheSetup::kv.tokens_per_block); null without --kv-cache-dir. `log` receives the store's
// messages (null: stderr).
Result<std::unique_ptr<KvDiskStore>> kv_disk_store_from_args(const ParsedArgs& args, const DeepseekV41Model& model,
                                                             const std::filesystem::path& model_path,
                                                             int64_t tokens_per_block,
                                                             std::function<void(const std::string&)> log = nullptr);

// The engine `cedar run` and `cedar chat` generate with, over a loaded model, and what it refers to:
// the KV cache budget, the SSD tier (null without --kv-cache-dir) and the runner.
// With --device cuda: `gpu` holds the device model and runner, `gpu_budget` the engine's budget over its
// pool, and cache / disk / runner stay empty (no prefix cache on the GPU yet).
struct GenerationEngine {
  int64_t context_length = 0;  // positions one sequence may reach (prompt + output)
  KvCacheSetup cache;
  std::unique_ptr<KvDiskStore> disk;
  DeviceRunner gpu;
  std::unique_ptr<engine::CacheBudget> gpu_budget;
  std::unique_ptr<engine::DeepseekRunner> runner;
  std::unique_ptr<engine::Engine> engine;
};
struct GenerationEngineRequest {
  const ParsedArgs* args = nullptr;
  const LoadedModel* loaded = nullptr;
  ThreadPool* pool = nullptr;
  ForwardMode mode = ForwardMode::Ced;
  int64_t context_length = 0;  // context_from_args
  std::string command;         // for messages
};
// Builds it from the prefix cache, KV cache and SSD tier options. Null after printing
// "cedar <command>: <why>" to stderr; `exit_code` is then 2 for a bad option, 1 when the SSD tier fails.
// Warns (and goes on) when the SSD tier is given but the prefix cache is off.
std::unique_ptr<GenerationEngine> generation_engine_from_args(const GenerationEngineRequest& request, int& exit_code);

}  // namespace cedar::cli
