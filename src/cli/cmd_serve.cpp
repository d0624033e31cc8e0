// `cedar serve`: the OpenAI / DeepSeek wire server (docs/server.md). SIGINT / SIGTERM drain in-flight
// requests and exit 0.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/tokenizer_source.h"
#include "cli/device_runner.h"
#include "cli/generation_setup.h"
#include "server/engine_backend.h"
#include "server/fake_backend.h"
#include "server/http_server.h"

namespace cedar::cli {
namespace {

CommandSpec make_spec() {
  CommandSpec spec{
      "serve",
      "Serve MODEL over HTTP with the OpenAI / DeepSeek API (POST /v1/chat/completions, /v1/completions,\n"
      "/v1/messages (Anthropic), "
      "/tokenize, /detokenize; GET /v1/models, /health, /metrics). MODEL is a checkpoint directory\n"
      "(default: the embedded tiny model). See docs/server.md.",
      {},
      {"MODEL"},
      {
          {"host", "address to listen on", true, "127.0.0.1", "ADDR"},
          {"port", "TCP port (0: any free port, printed on stderr)", true, "8000", "N"},
          {"api-key", "require 'Authorization: Bearer KEY' (default: $CEDAR_API_KEY, else no key)", true, "", "KEY"},
          {"served-model-name", "comma-separated model names to answer to (default: deepseek-v4.1-flash, ...)", true,
           "", "NAMES"},
          {"max-inflight", "generation requests served at once; more get 429", true, "128", "N"},
          {"max-body-bytes", "largest request body accepted (413 above)", true, "16777216", "N"},
          {"keepalive-ms", "SSE ': keep-alive' interval while no token arrives", true, "5000", "MS"},
          {"threads", "model worker threads (0 = all cores)", true, "0", "N"},
          {"kv-bytes", "KV-cache budget of all sequences together, bytes", true, "8589934592", "N"},
          {"max-running", "sequences decoded together", true, "16", "N"},
          context_option_spec(),
          {"mode", "prefill mode: ced (default) or exact", true, "ced", "MODE"},
          device_option_spec(),
          {"fake-backend", "serve a deterministic scripted backend (tests; no model is loaded)", false, "", ""},
          {"fake-tick-ms", "fake backend: milliseconds per generated token", true, "0", "MS"},
          {"context-length", "fake backend: context length to report", true, "4096", "N"},
          {"fake-cached-tokens", "fake backend: prompt tokens to report as prefix-cache hits", true, "0", "N"},
      }};
  for (auto& o : prefix_cache_option_specs()) spec.options.push_back(o);
  for (auto& o : kv_disk_option_specs()) spec.options.push_back(o);
  return spec;
}

Result<std::unique_ptr<text::Tokenizer>> load_v41_tokenizer() {
  CEDAR_ASSIGN_OR_RETURN(auto path, find_tokenizer_json(""));
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot read " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  CEDAR_ASSIGN_OR_RETURN(auto json, tokenizer_json_for(Arch::DeepseekV41, ss.str(), path.string()));
  CEDAR_ASSIGN_OR_RETURN(auto tok, text::Tokenizer::from_json(json, path.string()));
  return std::make_unique<text::Tokenizer>(std::move(tok));
}

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s + ",") {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur.push_back(c);
    }
  }
  return out;
}

}  // namespace

int cmd_serve(const Args& args) {
  const CommandSpec spec = make_spec();
  auto parsed = parse_args(spec, args);
  if (!parsed.ok()) {
    if (parsed.error().message == "help") return std::printf("%s", usage(spec).c_str()), 0;
    std::fprintf(stderr, "cedar serve: %s\n%s", parsed.error().message.c_str(), usage(spec).c_str());
    return 2;
  }
  const ParsedArgs& a = *parsed;
  server::ServerOptions opt;
  opt.host = a.get("host");
  auto port = a.get_int("port");
  auto inflight = a.get_int("max-inflight");
  auto body = a.get_int("max-body-bytes");
  auto keepalive = a.get_int("keepalive-ms");
  auto tick = a.get_int("fake-tick-ms");
  auto ctx = a.get_int("context-length");
  auto cached = a.get_int("fake-cached-tokens");
  auto threads = a.get_int("threads");
  auto kv_bytes = a.get_int("kv-bytes");
  auto max_running = a.get_int("max-running");
  for (auto* r : {&port, &inflight, &body, &keepalive, &tick, &ctx, &cached, &threads, &kv_bytes, &max_running})
    if (!r->ok() || **r < 0) return std::fprintf(stderr, "cedar serve: numeric options must be integers >= 0\n"), 2;
  if (*port > 65535) return std::fprintf(stderr, "cedar serve: --port must be <= 65535\n"), 2;
  opt.port = static_cast<int>(*port);
  opt.max_inflight = std::max<int64_t>(1, *inflight);
  opt.http_threads = static_cast<int>(std::max<int64_t>(64, *inflight + 64));
  opt.max_body_bytes = static_cast<size_t>(*body);
  opt.keepalive_interval = std::chrono::milliseconds(std::max<int64_t>(1, *keepalive));
  opt.api_key = a.get("api-key");
  if (opt.api_key.empty())
    if (const char* env = std::getenv("CEDAR_API_KEY")) opt.api_key = env;
  opt.served_model_names = split_names(a.get("served-model-name"));

  // Signals go to one waiting thread (blocked everywhere else, before any thread starts).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::unique_ptr<text::Tokenizer> tokenizer;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<LoadedModel> model;
  DeviceRunner gpu;  // --device cuda: the device model and its runner (declared before the backend)
  std::unique_ptr<engine::DeepseekRunner> runner;
  std::unique_ptr<KvCacheSetup> kv_cache;
  std::unique_ptr<KvDiskStore> kv_disk;  // outlives the backend's engine, which writes through to it
  std::unique_ptr<server::GenerationBackend> backend;
  if (a.flag("fake-backend")) {
    if (a.has("kv-cache-dir")) return std::fprintf(stderr, "cedar serve: --kv-cache-dir needs a model backend\n"), 2;
    if (a.has("context"))
      return std::fprintf(stderr, "cedar serve: --context needs a model backend (fake: --context-length)\n"), 2;
    auto tok = load_v41_tokenizer();
    if (!tok.ok()) return std::fprintf(stderr, "cedar serve: %s\n", tok.error().message.c_str()), 1;
    tokenizer = std::move(*tok);
    server::FakeBackendOptions fo;
    fo.tokenizer = tokenizer.get();
    fo.context_length = *ctx;
    fo.tick = std::chrono::milliseconds(*tick);
    fo.cached_prompt_tokens = *cached;
    backend = std::make_unique<server::FakeBackend>(fo);
  } else {
    auto mode = parse_forward_mode(a.get("mode"));
    if (!mode.ok()) return std::fprintf(stderr, "cedar serve: --mode: %s\n", mode.error().message.c_str()), 2;
    auto cuda = cuda_device_requested(a);
    if (!cuda.ok()) return std::fprintf(stderr, "cedar serve: %s\n", cuda.error().message.c_str()), 2;
    server::EngineBackendOptions eo;
    eo.max_running = std::max<int64_t>(1, *max_running);
    eo.mode = *mode;
    // --context is checked against the model's config before its weights load.
    auto head = read_model_head(a.positional(0));
    if (!head.ok()) return std::fprintf(stderr, "cedar serve: %s\n", head.error().message.c_str()), 1;
    auto context = context_from_args({&a, &*head, *cuda, std::max<int64_t>(1, *kv_bytes), eo.max_running});
    if (!context.ok()) return std::fprintf(stderr, "cedar serve: %s\n", context.error().message.c_str()), 2;
    if (*cuda)  // the device plan is sized for it: say so before the (long) load
      std::fprintf(stderr, "cedar serve: --device cuda: context %lld positions per sequence (%s)\n",
                   static_cast<long long>(*context), a.has("context") ? "--context" : "what --kv-bytes affords");
    pool = std::make_unique<ThreadPool>(static_cast<int>(*threads));
    auto loaded = load_for_generation(LoadRequest{head->path.string(), pool.get(), true, "serve"});
    if (!loaded.ok()) return std::fprintf(stderr, "cedar serve: %s\n", loaded.error().message.c_str()), 1;
    model = std::make_unique<LoadedModel>(std::move(*loaded));
    eo.context_length = *context;  // longer prompts get 400 context_length_exceeded
    eo.bos_token = model->model->config().bos_token_id;
    if (*cuda) {
      // The GPU model shares the host model loaded above (one read of the checkpoint).
      auto g = cuda_runner(
          CudaRunnerRequest{model->model, eo.max_running, std::max<int64_t>(1, *kv_bytes), *context, pool.get()});
      if (!g.ok()) return std::fprintf(stderr, "cedar serve: --device cuda: %s\n", g.error().message.c_str()), 1;
      gpu = std::move(*g);
      std::fprintf(stderr, "cedar serve: %s\n", gpu.summary.c_str());
      eo.kv_capacity_bytes = gpu.kv_capacity_bytes;  // a ByteCacheBudget over the device pool
      eo.prefix_cache.enabled = false;
      eo.max_running = gpu.max_running;
      eo.context_length = std::min(eo.context_length, gpu.context_length);
      backend = std::make_unique<server::EngineBackend>(*gpu.runner, *model->tokenizer, eo);
    } else {
      auto prefix = prefix_cache_from_args(a, *model->model);
      if (!prefix.ok()) return std::fprintf(stderr, "cedar serve: %s\n", prefix.error().message.c_str()), 2;
      // One paged pool for every sequence's global KV, so cached prefixes are shared by reference.
      auto setup = kv_cache_setup(*model->model, std::max<int64_t>(1, *kv_bytes), swa_history_of(*prefix));
      if (!setup.ok()) return std::fprintf(stderr, "cedar serve: --kv-bytes: %s\n", setup.error().message.c_str()), 2;
      kv_cache = std::make_unique<KvCacheSetup>(std::move(*setup));
      auto disk = kv_disk_store_from_args(a, *model->model, model->path, kv_cache->kv.tokens_per_block);
      if (!disk.ok()) return std::fprintf(stderr, "cedar serve: %s\n", disk.error().message.c_str()), 2;
      kv_disk = std::move(*disk);
      prefix->store = kv_disk.get();
      eo.kv_capacity_bytes = *kv_bytes;
      eo.budget = kv_cache->budget.get();
      eo.prefix_cache = *prefix;
      eo.kv_disk = kv_disk.get();
      runner = std::make_unique<engine::DeepseekRunner>(*model->model, pool.get(), kv_cache->kv,
                                                        kv_disk ? kv_disk->options().model_fingerprint : "");
      backend = std::make_unique<server::EngineBackend>(*runner, *model->tokenizer, eo);
    }
  }

  server::Server srv(*backend, opt);
  auto bound = srv.bind();
  if (!bound.ok()) return std::fprintf(stderr, "cedar serve: %s\n", bound.error().message.c_str()), 1;
  std::fprintf(stderr, "cedar serve: listening on http://%s:%d (model names: %s)\n", opt.host.c_str(), *bound,
               opt.served_model_names.empty() ? server::default_served_model_names().front().c_str()
                                              : opt.served_model_names.front().c_str());
  std::fflush(stderr);
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "cedar serve: signal %d, draining %lld in-flight request(s)\n", sig,
                 static_cast<long long>(srv.inflight()));
    srv.stop();
  });
  auto served = srv.serve();
  // serve() returned without a signal (listen failure): wake the waiter so it can be joined.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  backend->shutdown();
  if (!served.ok()) return std::fprintf(stderr, "cedar serve: %s\n", served.error().message.c_str()), 1;
  std::fprintf(stderr, "cedar serve: stopped\n");
  return 0;
}

}  // namespace cedar::cli
