// `cedar run`: raw completion of a text prompt through the engine (no chat template). The text streams
// to stdout; --stats-json writes timings and the measured KV bytes per token.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/device_runner.h"
#include "cli/generation_setup.h"
#include "engine/engine.h"
#include "io/atomic_file.h"
#include "model/model_stats.h"
#include "server/wire_request.h"

namespace cedar::cli {
namespace {

CommandSpec make_spec() {
  CommandSpec spec{
      "run",
      "Complete a raw text prompt (no chat template) and stream the text to stdout. MODEL is a checkpoint\n"
      "directory (default: the embedded tiny model, created on first use). Prefill runs CED (decoder SWA\n"
      "bounded replay) unless --exact. See docs/engine.md.",
      {},
      {"MODEL"},
      {
          {"prompt", "the prompt text", true, "", "TEXT"},
          {"no-bos", "do not put the begin-of-sentence token before the prompt", false, "", ""},
          {"mode", "prefill mode: ced (default) or exact (every layer on every token)", true, "ced", "MODE"},
          {"exact", "same as --mode exact (reference numerics)", false, "", ""},
          {"threads", "worker threads (0 = all cores)", true, "0", "N"},
          kv_cache_option_spec(),
          context_option_spec(),
          {"stats-json", "write timings, token counts and KV bytes per token here as JSON", true, "", "FILE"},
      }};
  for (auto& o : sampling_option_specs("64")) spec.options.push_back(o);
  for (auto& o : prefix_cache_option_specs()) spec.options.push_back(o);
  for (auto& o : kv_disk_option_specs()) spec.options.push_back(o);
  spec.options.push_back(device_option_spec());
  return spec;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "cedar run: %s\n", message.c_str());
  return 1;
}

}  // namespace

int cmd_run(const Args& args) {
  const CommandSpec spec = make_spec();
  auto parsed = parse_args(spec, args);
  if (!parsed.ok()) {
    if (parsed.error().message == "help") {
      std::printf("%s", usage(spec).c_str());
      return 0;
    }
    std::fprintf(stderr, "cedar run: %s\n%s", parsed.error().message.c_str(), usage(spec).c_str());
    return 2;
  }
  const ParsedArgs& a = *parsed;
  if (!a.has("prompt")) {
    std::fprintf(stderr, "cedar run: --prompt is required\n%s", usage(spec).c_str());
    return 2;
  }
  auto params = sampling_from_args(a);
  auto mode = mode_from_args(a);
  auto threads = a.get_int("threads");
  if (!params.ok()) return std::fprintf(stderr, "cedar run: %s\n", params.error().message.c_str()), 2;
  if (!mode.ok()) return std::fprintf(stderr, "cedar run: --mode: %s\n", mode.error().message.c_str()), 2;
  if (!threads.ok() || *threads < 0) return std::fprintf(stderr, "cedar run: --threads must be >= 0\n"), 2;

  auto cuda = cuda_device_requested(a);
  if (!cuda.ok()) return std::fprintf(stderr, "cedar run: %s\n", cuda.error().message.c_str()), 2;
  auto kv_bytes = kv_cache_bytes_from_args(a);
  if (!kv_bytes.ok()) return std::fprintf(stderr, "cedar run: %s\n", kv_bytes.error().message.c_str()), 2;
  // --context is checked against the model's config before its weights load.
  auto head = read_model_head(a.positional(0));
  if (!head.ok()) return fail(head.error().message);
  auto context = context_from_args({&a, &*head, *cuda, *kv_bytes, engine::EngineOptions{}.max_running});
  if (!context.ok()) return std::fprintf(stderr, "cedar run: %s\n", context.error().message.c_str()), 2;

  ThreadPool pool(static_cast<int>(*threads));
  auto loaded = load_for_generation(LoadRequest{head->path.string(), &pool, true, "run"});
  if (!loaded.ok()) return fail(loaded.error().message);
  const DeepseekV41Model& model = *loaded->model;

  auto ids = loaded->tokenizer->encode(a.get("prompt"));
  if (!ids.ok()) return fail("--prompt: " + ids.error().message);
  std::vector<int64_t> prompt;
  if (!a.flag("no-bos")) prompt.push_back(model.config().bos_token_id);
  prompt.insert(prompt.end(), ids->begin(), ids->end());

  int exit_code = 0;
  auto gen = generation_engine_from_args({&a, &*loaded, &pool, *mode, *context, "run"}, exit_code);
  if (!gen) return exit_code;
  engine::Engine& eng = *gen->engine;
  // As the server does: the output stops where the context ends; a prompt that fills it is refused.
  auto max_tokens =
      server::clamp_max_tokens(params->max_tokens, static_cast<int64_t>(prompt.size()), gen->context_length);
  if (!max_tokens.ok()) return fail("--prompt: " + max_tokens.error().message);
  engine::GenerationRequest req;
  req.prompt = prompt;
  req.params = *params;
  req.params.max_tokens = *max_tokens;
  req.on_event = [](const engine::StreamEvent& ev) {
    std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
    std::fflush(stdout);
  };
  auto id = eng.submit(std::move(req));
  if (!id.ok()) return fail(id.error().message);
  if (Status st = eng.run_until_idle(); !st.ok()) return fail(st.error().message);
  std::printf("\n");
  auto done = eng.take_finished();
  if (done.size() != 1) return fail("internal: the request did not finish");
  const engine::RequestResult& r = done[0];
  if (r.finish == engine::FinishReason::kError) return fail(r.error);

  if (a.has("stats-json")) {
    const engine::EngineStats& es = eng.stats();
    const KvBudget kv = compute_kv_budget(model.config(), model.plan());
    // --device cuda: the engine's budget over the device pool (no block pool on the host).
    const engine::CacheBudget& budget = gen->cache.budget ? *gen->cache.budget : *gen->gpu_budget;
    auto per_token = [&](int64_t bytes) {
      return r.stats.kv_tokens > 0 ? static_cast<double>(bytes) / static_cast<double>(r.stats.kv_tokens) : 0.0;
    };
    nlohmann::json j = {
        {"model", loaded->path.string()},
        {"mode", std::string(forward_mode_name(*mode))},
        {"threads", pool.size()},
        {"load_s", loaded->load_seconds},
        {"prompt_tokens", r.stats.prompt_tokens},
        {"output_tokens", r.stats.output_tokens},
        {"finish_reason", std::string(engine::finish_reason_name(r.finish))},
        {"ttft_s", r.stats.ttft_s},
        {"total_s", r.stats.total_s},
        {"prefill_tokens_per_s", es.prefill_seconds > 0 ? static_cast<double>(es.prefill_tokens) / es.prefill_seconds : 0.0},
        {"decode_tokens_per_s", es.decode_seconds > 0 ? static_cast<double>(es.decode_tokens) / es.decode_seconds : 0.0},
        // Allocated in the paged pool (page padding of each stream's last block included) and the
        // stored records alone, next to the §3.12 figure.
        {"kv_bytes_per_token_measured", per_token(r.stats.kv_bytes_allocated)},
        {"kv_bytes_per_token_payload", per_token(r.stats.kv_bytes_packed)},
        {"kv_bytes_per_token_expected", kv.bytes_per_token()},
        {"kv_bytes_allocated", r.stats.kv_bytes_allocated},
        {"kv_padding_bytes", r.stats.kv_bytes_allocated - r.stats.kv_bytes_packed},
        {"kv_tokens", r.stats.kv_tokens},
        {"kv_cache_capacity_bytes", budget.capacity_bytes()},
        {"kv_pool_peak_used_bytes", gen->cache.budget ? gen->cache.budget->pool()->stats().peak_used_bytes : 0},
        {"context_length", gen->context_length},
        {"device", gen->gpu.runner ? "cuda" : "cpu"},
        {"preemptions", es.preemptions},
        {"cached_tokens", r.stats.cached_tokens},
        {"replayed_tokens", r.stats.replayed_tokens},
        {"cache_approximate", r.stats.cache_approximate},
        {"prefix_cache", eng.prefix_cache() != nullptr ? "on" : eng.prefix_cache_status().empty() ? "off" : eng.prefix_cache_status()},
        {"swa_bytes_per_sequence", kv.swa_bytes_per_sequence},
        {"token_ids", r.tokens},
        {"text", r.text},
    };
    if (gen->disk) {
      const KvDiskStoreStats ds = gen->disk->stats();
      j["kv_disk"] = {{"files", ds.files},          {"bytes", ds.bytes},     {"budget_bytes", ds.budget_bytes},
                      {"puts", ds.puts},            {"puts_skipped", ds.puts_skipped},            {"gets", ds.gets},       {"hits", ds.hits},
                      {"misses", ds.misses},        {"corrupt", ds.corrupt}, {"evictions", ds.evictions},
                      {"bytes_read", ds.bytes_read}, {"bytes_written", ds.bytes_written}};
    }
    const std::string text = j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (Status st = io::write_file_atomically(
            a.get("stats-json"), std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
        !st.ok())
      return fail(st.error().message);
  }
  return 0;
}

}  // namespace cedar::cli
