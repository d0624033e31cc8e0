#include "cli/generation_setup.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <vector>

#include "engine/context_length.h"
#include "io/model_fingerprint.h"
#include "model/default_model.h"
#include "model/model_stats.h"
#include "model/tokenizer_source.h"

namespace cedar::cli {
namespace fs = std::filesystem;
namespace {

// Reads every safetensors shard once so that the mmap-based load that follows finds the pages in
// memory, drawing a bar of bytes read. The loader itself has no progress hook.
void prefetch_with_progress(const fs::path& dir, const std::string& command) {
  std::vector<fs::path> shards;
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".safetensors") continue;
    shards.push_back(e.path());
    total += e.file_size(ec);
  }
  if (total < (uint64_t{1} << 30) || !::isatty(2)) return;
  std::vector<char> buf(8 << 20);
  uint64_t done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& shard : shards) {
    std::ifstream in(shard, std::ios::binary);
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      done += static_cast<uint64_t>(in.gcount());
      const double frac = static_cast<double>(done) / static_cast<double>(total);
      const int width = 40, filled = static_cast<int>(frac * width);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "\rcedar %s: reading weights [%s%s] %5.1f%% %.1f/%.1f GiB %.0f s", command.c_str(),
                   std::string(static_cast<size_t>(filled), '#').c_str(),
                   std::string(static_cast<size_t>(width - filled), '.').c_str(), 100 * frac,
                   static_cast<double>(done) / (1 << 30), static_cast<double>(total) / (1 << 30), secs);
    }
  }
  std::fprintf(stderr, "\n");
}

}  // namespace

Result<LoadedModel> load_for_generation(const LoadRequest& request) {
  LoadedModel out;
  if (request.model) {
    out.path = *request.model;
  } else {
    CEDAR_ASSIGN_OR_RETURN(out.path, ensure_default_model());
  }
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path dir = fs::is_directory(out.path) ? out.path : out.path.parent_path();
  if (request.progress) prefetch_with_progress(dir, request.command);
  auto model = DeepseekV41Model::load(out.path, LoadOptions{{}, request.pool});
  if (!model.ok()) return model.error().with_context("loading " + out.path.string());
  out.model = std::make_shared<const DeepseekV41Model>(std::move(*model));
  fs::path tok_path = dir / "tokenizer.json";
  if (!fs::exists(tok_path)) {
    CEDAR_ASSIGN_OR_RETURN(tok_path, find_tokenizer_json({}));
  }
  auto tok = text::Tokenizer::load(tok_path.string());
  if (!tok.ok()) return tok.error().with_context("loading the tokenizer " + tok_path.string());
  out.tokenizer = std::make_unique<text::Tokenizer>(std::move(*tok));
  out.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

Result<ModelHead> read_model_head(const std::optional<std::string>& model) {
  ModelHead head;
  if (model) {
    head.path = *model;
  } else {
    CEDAR_ASSIGN_OR_RETURN(head.path, ensure_default_model());
  }
  std::error_code ec;
  if (!fs::exists(head.path, ec)) return make_error(head.path.string() + ": no such model directory or file");
  const fs::path dir = fs::is_directory(head.path) ? head.path : head.path.parent_path();
  auto config = load_model_config(dir);
  if (!config.ok()) return config.error().with_context("loading " + head.path.string());
  head.config = std::move(*config);
  auto plan = build_layer_plan(head.config);
  if (!plan.ok()) return plan.error().with_context("loading " + head.path.string());
  head.plan = std::move(*plan);
  return head;
}

OptionSpec context_option_spec() {
  return {"context",
          "positions one sequence may reach, prompt + output (default: the model's max_position_embeddings; "
          "--device cuda: the longest the KV budget affords)",
          true, "", "N"};
}

Result<int64_t> context_from_args(const ContextRequest& r) {
  const ParsedArgs& a = *r.args;
  std::optional<int64_t> requested;
  if (a.has("context")) {
    auto n = a.get_int("context");
    if (!n.ok() || *n < 1)
      return make_error("--context must be a positive number of positions, got '" + a.get("context") + "'");
    requested = *n;
  }
  const ModelConfig& c = r.head->config;
  const KvBudget kv = compute_kv_budget(c, r.head->plan);
  engine::ContextLimits l;
  l.max_position_embeddings = c.max_position_embeddings;
  l.sliding_window = c.sliding_window;
  l.kv_bytes_per_token = kv.bytes_per_token();
  l.kv_bytes_per_sequence = kv.swa_bytes_per_sequence;
  l.kv_budget_bytes = r.kv_budget_bytes;
  l.tokens_per_block = KvCacheOptions{}.tokens_per_block;
  if (r.cuda) {
    l.sized_up_front = true;
    CEDAR_ASSIGN_OR_RETURN(l.device_bytes_per_position,
                           cuda_context_bytes_per_position(c, r.head->plan, r.max_running));
  }
  auto n = engine::serving_context_length(l, requested);
  if (!n.ok()) return make_error("--context: " + n.error().message);
  return *n;
}

std::vector<OptionSpec> sampling_option_specs(const std::string& default_max_tokens) {
  return {
      {"max-tokens", "tokens to generate at most", true, default_max_tokens, "N"},
      {"temperature", "sampling temperature (0 = greedy)", true, "0", "T"},
      {"top-p", "nucleus sampling mass", true, "1", "P"},
      {"top-k", "keep the K most likely tokens (0 = off)", true, "0", "K"},
      {"min-p", "drop tokens below P times the best probability", true, "0", "P"},
      {"repetition-penalty", "penalty on prompt and output tokens (1 = off)", true, "1", "R"},
      {"presence-penalty", "subtracted once from every output token's logit", true, "0", "X"},
      {"frequency-penalty", "subtracted per occurrence in the output", true, "0", "X"},
      {"seed", "sampling seed (same seed, same output)", true, "", "S"},
      {"stop", "stop string (generation ends before it)", true, "", "TEXT"},
      {"ignore-eos", "keep generating after the end-of-sentence token", false, "", ""},
  };
}

namespace {
Result<double> get_double(const ParsedArgs& a, const std::string& name) {
  const std::string v = a.get(name);
  try {
    size_t used = 0;
    const double d = std::stod(v, &used);
    if (used == v.size()) return d;
  } catch (...) {
  }
  return make_error("--" + name + ": '" + v + "' is not a number");
}
}  // namespace

Result<engine::SamplingParams> sampling_from_args(const ParsedArgs& a) {
  engine::SamplingParams p;
  CEDAR_ASSIGN_OR_RETURN(p.temperature, get_double(a, "temperature"));
  CEDAR_ASSIGN_OR_RETURN(p.top_p, get_double(a, "top-p"));
  CEDAR_ASSIGN_OR_RETURN(p.min_p, get_double(a, "min-p"));
  CEDAR_ASSIGN_OR_RETURN(p.repetition_penalty, get_double(a, "repetition-penalty"));
  CEDAR_ASSIGN_OR_RETURN(p.presence_penalty, get_double(a, "presence-penalty"));
  CEDAR_ASSIGN_OR_RETURN(p.frequency_penalty, get_double(a, "frequency-penalty"));
  CEDAR_ASSIGN_OR_RETURN(long long top_k, a.get_int("top-k"));
  CEDAR_ASSIGN_OR_RETURN(long long max_tokens, a.get_int("max-tokens"));
  p.top_k = top_k;
  p.max_tokens = max_tokens;
  if (a.has("seed")) {
    CEDAR_ASSIGN_OR_RETURN(long long seed, a.get_int("seed"));
    p.seed = static_cast<uint64_t>(seed);
  }
  if (a.has("stop")) p.stop.push_back(a.get("stop"));
  p.ignore_eos = a.flag("ignore-eos");
  return p;
}

Result<ForwardMode> mode_from_args(const ParsedArgs& a) {
  if (a.flag("exact")) return ForwardMode::Exact;
  return parse_forward_mode(a.get("mode"));
}

OptionSpec kv_cache_option_spec() {
  return {"kv-cache-mb", "KV cache capacity in MiB (requests are preempted and recomputed when full)", true, "8192",
          "N"};
}

Result<KvCacheSetup> kv_cache_setup(const DeepseekV41Model& model, int64_t capacity_bytes, int64_t swa_history) {
  KvCacheSetup setup;
  const KvBudget kv = compute_kv_budget(model.config(), model.plan());
  // SWA rings of window + swa_history slots (compute_kv_budget charges window slots).
  const int64_t window = model.config().sliding_window;
  const int64_t ring_bytes = window > 0 ? kv.swa_bytes_per_sequence / window * (window + swa_history) : 0;
  CEDAR_ASSIGN_OR_RETURN(engine::PoolCacheLayout layout,
                         engine::pool_cache_layout(model.config(), model.plan(), ring_bytes, setup.kv.tokens_per_block));
  CEDAR_ASSIGN_OR_RETURN(setup.budget, engine::PoolCacheBudget::create(std::move(layout), capacity_bytes));
  setup.kv.pool = setup.budget->pool();
  return setup;
}

std::vector<OptionSpec> kv_disk_option_specs() {
  return {
      {"kv-cache-dir", "directory of the on-disk prefix cache (global KV blocks, kept across restarts)", true, "",
       "DIR"},
      {"kv-cache-dir-gb", "size budget of --kv-cache-dir in GiB (least recently used blocks are deleted)", true, "64",
       "N"},
  };
}

Result<std::unique_ptr<KvDiskStore>> kv_disk_store_from_args(const ParsedArgs& a, const DeepseekV41Model& model,
                                                             const fs::path& model_path, int64_t tokens_per_block,
                                                             std::function<void(const std::string&)> log) {
  if (!a.has("kv-cache-dir")) {
    if (a.has("kv-cache-dir-gb")) return make_error("--kv-cache-dir-gb needs --kv-cache-dir");
    return std::unique_ptr<KvDiskStore>();
  }
  if (a.get("kv-cache-dir").empty()) return make_error("--kv-cache-dir: empty directory name");
  if (a.flag("no-prefix-cache")) return make_error("--kv-cache-dir is a tier of the prefix cache: drop --no-prefix-cache");
  CEDAR_ASSIGN_OR_RETURN(const double gib, get_double(a, "kv-cache-dir-gb"));
  if (!(gib > 0) || gib > 1e6)
    return make_error("--kv-cache-dir-gb must be a positive number of GiB, got '" + a.get("kv-cache-dir-gb") + "'");
  const int64_t budget = static_cast<int64_t>(gib * static_cast<double>(int64_t{1} << 30));
  const fs::path dir = fs::is_directory(model_path) ? model_path : model_path.parent_path();
  KvDiskStoreOptions o;
  o.dir = a.get("kv-cache-dir");
  o.budget_bytes = budget;
  o.log = std::move(log);
  CEDAR_ASSIGN_OR_RETURN(o.model_fingerprint, model_fingerprint(dir));
  CEDAR_ASSIGN_OR_RETURN(o.layout, kv_disk_layout_for(model.config(), model.plan(), tokens_per_block));
  auto store = KvDiskStore::open(o);
  if (!store.ok()) return store.error().with_context("--kv-cache-dir");
  return std::move(*store);
}

Result<int64_t> kv_cache_bytes_from_args(const ParsedArgs& a) {
  auto mb = a.get_int("kv-cache-mb");
  if (!mb.ok() || *mb <= 0 || *mb > (int64_t{1} << 30))
    return make_error("--kv-cache-mb must be a positive number of MiB, got '" + a.get("kv-cache-mb") + "'");
  return static_cast<int64_t>(*mb) << 20;
}

Result<KvCacheSetup> kv_cache_from_args(const ParsedArgs& a, const DeepseekV41Model& model, int64_t swa_history) {
  CEDAR_ASSIGN_OR_RETURN(const int64_t bytes, kv_cache_bytes_from_args(a));
  return kv_cache_setup(model, bytes, swa_history);
}

std::vector<OptionSpec> prefix_cache_option_specs() {
  return {
      {"no-prefix-cache", "do not reuse the global KV of earlier requests' prefixes", false, "", ""},
      {"swa-pool-mb", "host memory for SWA snapshots of cached prefixes, MiB (0: hits replay: --swa-replay)", true,
       "1024", "N"},
      {"swa-ttl-s", "seconds an SWA snapshot stays after its last use", true, "600", "S"},
      {"swa-history", "extra SWA ring slots per sequence (default: sliding window + 64)", true, "", "N"},
      {"swa-replay",
       "hits without an SWA snapshot: 'exact' replays the rows that make the result bitwise exact (ced: "
       "(encoder + boundary layers) x (window - 1)), 'window' (ced mode) only the last window, approximate",
       true, "exact", "exact|window"},
  };
}

Result<engine::PrefixCacheOptions> prefix_cache_from_args(const ParsedArgs& a, const DeepseekV41Model& model) {
  engine::PrefixCacheOptions o;
  o.enabled = !a.flag("no-prefix-cache");
  auto mb = a.get_int("swa-pool-mb");
  if (!mb.ok() || *mb < 0 || *mb > (int64_t{1} << 30))
    return make_error("--swa-pool-mb must be a number of MiB >= 0, got '" + a.get("swa-pool-mb") + "'");
  o.swa_pool_bytes = *mb << 20;
  CEDAR_ASSIGN_OR_RETURN(o.swa_ttl_seconds, get_double(a, "swa-ttl-s"));
  auto replay = engine::parse_swa_replay(a.get("swa-replay"));
  if (!replay.ok()) return make_error("--swa-replay: " + replay.error().message);
  o.swa_replay = *replay;
  if (!(o.swa_ttl_seconds >= 0)) return make_error("--swa-ttl-s must be >= 0");
  if (a.has("swa-history")) {
    auto h = a.get_int("swa-history");
    if (!h.ok() || *h < 0) return make_error("--swa-history must be >= 0, got '" + a.get("swa-history") + "'");
    o.swa_history = *h;
  } else {
    o.swa_history = model.config().sliding_window + KvCacheOptions{}.tokens_per_block;
  }
  // o.store (the SSD tier) comes from kv_disk_store_from_args: it needs the model's directory.
  return o;
}

int64_t swa_history_of(const engine::PrefixCacheOptions& o) { return o.enabled ? std::max<int64_t>(0, o.swa_history) : 0; }

std::unique_ptr<GenerationEngine> generation_engine_from_args(const GenerationEngineRequest& request, int& exit_code) {
  const ParsedArgs& a = *request.args;
  const LoadedModel& loaded = *request.loaded;
  const DeepseekV41Model& model = *loaded.model;
  const char* cmd = request.command.c_str();
  auto fail = [&](int code, const std::string& message) -> std::unique_ptr<GenerationEngine> {
    std::fprintf(stderr, "cedar %s: %s\n", cmd, message.c_str());
    exit_code = code;
    return nullptr;
  };
  auto cuda = cuda_device_requested(a);
  if (!cuda.ok()) return fail(2, cuda.error().message);
  if (*cuda) {
    auto kv_bytes = kv_cache_bytes_from_args(a);
    if (!kv_bytes.ok()) return fail(2, kv_bytes.error().message);
    auto gpu = cuda_runner(CudaRunnerRequest{loaded.model, engine::EngineOptions{}.max_running, *kv_bytes,
                                             request.context_length, request.pool});
    if (!gpu.ok()) return fail(1, "--device cuda: " + gpu.error().message);
    auto g = std::make_unique<GenerationEngine>();
    g->gpu = std::move(*gpu);
    g->context_length = g->gpu.context_length;
    g->gpu_budget =
        std::make_unique<engine::ByteCacheBudget>(g->gpu.runner->cache_footprint(), g->gpu.kv_capacity_bytes);
    engine::EngineOptions eo;
    eo.mode = request.mode;
    eo.tokenizer = loaded.tokenizer.get();
    eo.max_running = g->gpu.max_running;
    eo.prefix_cache.enabled = false;
    g->engine = std::make_unique<engine::Engine>(*g->gpu.runner, *g->gpu_budget, eo);
    return g;
  }
  auto prefix = prefix_cache_from_args(a, model);
  if (!prefix.ok()) return fail(2, prefix.error().message);
  auto cache = kv_cache_from_args(a, model, swa_history_of(*prefix));
  if (!cache.ok()) return fail(2, cache.error().message);
  auto disk = kv_disk_store_from_args(a, model, loaded.path, cache->kv.tokens_per_block);
  if (!disk.ok()) return fail(1, disk.error().message);
  auto g = std::make_unique<GenerationEngine>();
  g->context_length = request.context_length;
  g->cache = std::move(*cache);
  g->disk = std::move(*disk);
  // With an SSD tier, the index keys are rooted in the fingerprint its files carry.
  g->runner = std::make_unique<engine::DeepseekRunner>(model, request.pool, g->cache.kv,
                                                       g->disk ? g->disk->options().model_fingerprint : "");
  engine::EngineOptions eo;
  eo.mode = request.mode;
  eo.tokenizer = loaded.tokenizer.get();
  eo.prefix_cache = *prefix;
  eo.prefix_cache.store = g->disk.get();
  g->engine = std::make_unique<engine::Engine>(*g->runner, *g->cache.budget, eo);
  if (g->disk && g->engine->prefix_cache() == nullptr)
    std::fprintf(stderr, "cedar %s: --kv-cache-dir is not used: %s\n", cmd, g->engine->prefix_cache_status().c_str());
  return g;
}

}  // namespace cedar::cli
