// `cedar bench`: serving numbers of the engine on a model (default: the embedded tiny one).
//  * load: closed-loop offered load — C clients each keep one request in flight — for every
//    concurrency × prompt length × output length; TTFT, TPOT and throughput.
//  * prefill: one-sequence prefill time of CED vs exact across prompt lengths, their ratio and the
//    first length from which CED stays > 10% faster (the crossover; CPU time, see cpu_seconds).
// JSON on stdout (or --json FILE); a readable table on stderr.
// --device cuda: the GPU benchmark instead (cmd_bench_cuda.cpp): peaks measured in the same run, the
// roofline of the model, decode / prefill on the CUDA model (docs/cuda.md).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/bench_cuda.h"
#include "cli/commands.h"
#include "cli/generation_setup.h"
#include "engine/engine.h"
#include "io/atomic_file.h"
#include "model/model_stats.h"

namespace cedar::cli {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

CommandSpec bench_spec() {
  CommandSpec spec{
    "bench",
    "Benchmark the engine: offered load at several concurrencies and prompt/output lengths (TTFT, TPOT,\n"
    "throughput) and CED vs exact prefill time across prompt lengths. MODEL defaults to the embedded tiny\n"
    "model. Prints JSON (stdout or --json FILE) and a table on stderr. See docs/engine.md.\n"
    "--device cuda: the GPU benchmark (needs a CUDA build): device copy bandwidth and cuBLAS bf16 / fp8 GEMM\n"
    "peaks measured in the same run, the model's memory plan and roofline (bytes per decode token at each\n"
    "--batches, FLOPs per prefill token exact vs CED at each --prefill-lens), decode / prefill timings as\n"
    "ratios to the peaks. See docs/cuda.md.",
    {},
    {"MODEL"},
    {
        {"concurrency", "comma-separated client counts", true, "1,4,8", "LIST"},
        {"prompt-len", "comma-separated prompt lengths (tokens)", true, "32", "LIST"},
        {"output-len", "comma-separated output lengths (tokens)", true, "8", "LIST"},
        {"requests", "requests per load point (0 = 2 x concurrency)", true, "0", "N"},
        {"mode", "prefill mode of the load runs: ced or exact", true, "ced", "MODE"},
        {"step-tokens", "engine token budget per step", true, "512", "N"},
        {"ced-lens", "comma-separated prompt lengths for CED vs exact prefill (empty: skip)", true,
         "16,32,64,128,256,512", "LIST"},
        {"ced-tail", "CED replayed decoder rows (0 = the model's sliding window)", true, "0", "N"},
        {"repeats", "prefill timings per length and mode (the median is reported)", true, "2", "N"},
        {"threads", "worker threads (0 = all cores)", true, "0", "N"},
        kv_cache_option_spec(),
        {"json", "write the JSON here instead of stdout", true, "", "FILE"},
        {"device", "cpu (the engine on the CPU backend) or cuda (the GPU benchmark)", true, "cpu", "DEVICE"},
        {"batches", "--device cuda: decode batch sizes", true, "1,8,64", "LIST"},
        {"prefill-lens", "--device cuda: prompt lengths of the prefill runs", true, "1024,8192,32768", "LIST"},
        {"context", "--device cuda: cached positions per sequence of the decode runs", true, "4096", "N"},
        {"gemm-size", "--device cuda: M = N = K of the cuBLAS peak GEMMs", true, "8192", "N"},
        {"bandwidth-mib", "--device cuda: buffer of the copy-bandwidth measurement, MiB", true, "1024", "MIB"},
        {"decode-profile", "--device cuda: 1 = per-stage device time of a batch-1 decode step, 0 = skip", true, "1",
         "N"},
        {"cuda-options",
         "--device cuda: kernel-path switches of the CUDA model, NAME=VALUE,... or legacy (every run prints the names "
         "with their values as 'CUDA model options:'; an unknown name is refused with the list)",
         true, "", "SPEC"},
        {"ab",
         "--device cuda: 1 = A/B of each fast kernel path against its old path (decode at batch 1, the "
         "first prefill length), 0 = skip",
         true, "1", "N"},
        {"ab-specs",
         "--device cuda: the decode A/B's rows instead of the built-in list, SPEC;SPEC;... (each a --cuda-options "
         "spec on the defaults; implies --ab 1; the defaults row first; at every batch <= 8)",
         true, "", "SPECS"},
        {"timeline",
         "--device cuda: decode steps recorded as a CUPTI kernel timeline at each batch (0 = off, at most 32; "
         "$CEDAR_CUPTI: the libcupti to load)",
         true, "0", "STEPS"},
    }};
  for (auto& o : prefix_cache_option_specs()) spec.options.push_back(o);
  return spec;
}

// Deterministic pseudo-random ordinary-text token ids (< 128000: no control tokens).
std::vector<int64_t> random_prompt(int64_t n, uint64_t seed, int64_t bos) {
  std::vector<int64_t> ids = {bos};
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
  while (static_cast<int64_t>(ids.size()) < n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ids.push_back(static_cast<int64_t>(x % 128000));
  }
  ids.resize(static_cast<size_t>(n));
  return ids;
}

// Process CPU seconds (all threads): unlike wall time it does not count time spent waiting for a
// core, so it stays meaningful on a shared machine.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

struct LoadPoint {
  int64_t concurrency, prompt_len, output_len, requests;
};

Result<json> run_load(const DeepseekV41Model& model, ThreadPool& pool, const LoadPoint& lp, ForwardMode mode,
                      int64_t step_tokens, const ParsedArgs& args) {
  CEDAR_ASSIGN_OR_RETURN(engine::PrefixCacheOptions prefix, prefix_cache_from_args(args, model));
  // A fresh pool (and prefix cache) per point.
  CEDAR_ASSIGN_OR_RETURN(KvCacheSetup cache, kv_cache_from_args(args, model, swa_history_of(prefix)));
  engine::DeepseekRunner runner(model, &pool, cache.kv);
  engine::CacheBudget& budget = *cache.budget;
  engine::EngineOptions eo;
  eo.mode = mode;
  eo.prefix_cache = prefix;
  eo.step_token_budget = step_tokens;
  eo.max_running = lp.concurrency;
  engine::Engine eng(runner, budget, eo);
  engine::SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  p.max_tokens = lp.output_len;
  int64_t submitted = 0, in_flight = 0;
  std::vector<double> ttft, tpot;
  int64_t out_tokens = 0, prompt_tokens = 0, kv_allocated = 0, kv_tokens = 0;
  const auto t0 = Clock::now();
  const double c0 = cpu_seconds();
  while (submitted < lp.requests || in_flight > 0) {
    while (in_flight < lp.concurrency && submitted < lp.requests) {
      auto id = eng.submit({random_prompt(lp.prompt_len, static_cast<uint64_t>(submitted + 1), model.config().bos_token_id), p, nullptr});
      if (!id.ok()) return id.error();
      ++submitted;
      ++in_flight;
    }
    CEDAR_RETURN_IF_ERROR(eng.step());
    for (const auto& r : eng.take_finished()) {
      --in_flight;
      if (r.finish == engine::FinishReason::kError) return make_error("request failed: " + r.error);
      ttft.push_back(r.stats.ttft_s);
      if (r.stats.output_tokens > 1)
        tpot.push_back((r.stats.total_s - r.stats.ttft_s) / static_cast<double>(r.stats.output_tokens - 1));
      out_tokens += r.stats.output_tokens;
      prompt_tokens += r.stats.prompt_tokens;
      kv_allocated += r.stats.kv_bytes_allocated;
      kv_tokens += r.stats.kv_tokens;
    }
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = cpu_seconds() - c0;
  return json{{"concurrency", lp.concurrency},
              {"prompt_len", lp.prompt_len},
              {"output_len", lp.output_len},
              {"requests", lp.requests},
              {"wall_s", wall},
              {"ttft_mean_s", mean(ttft)},
              {"ttft_p50_s", percentile(ttft, 0.5)},
              {"ttft_p90_s", percentile(ttft, 0.9)},
              {"tpot_mean_s", mean(tpot)},
              {"tpot_p50_s", percentile(tpot, 0.5)},
              {"output_tokens_per_s", static_cast<double>(out_tokens) / wall},
              {"total_tokens_per_s", static_cast<double>(out_tokens + prompt_tokens) / wall},
              {"requests_per_s", static_cast<double>(lp.requests) / wall},
              {"cpu_s", cpu},
              {"output_tokens_per_cpu_s", static_cast<double>(out_tokens) / cpu},
              // Global KV the finished sequences held in the pool (page padding included) per token.
              {"kv_bytes_per_token_measured",
               kv_tokens > 0 ? static_cast<double>(kv_allocated) / static_cast<double>(kv_tokens) : 0.0},
              {"kv_cache_capacity_bytes", cache.budget->capacity_bytes()},
              {"kv_pool_peak_used_bytes", cache.budget->pool()->stats().peak_used_bytes},
              {"preemptions", eng.stats().preemptions},
              {"prefix_cache_hit_tokens", eng.prefix_cache_stats().hit_tokens}};
}

struct PrefillTime {
  double wall_s = 0, cpu_s = 0;  // medians
};

// Median wall and CPU time of a one-shot prefill of `n` tokens (logits of the last row) in `mode`.
Result<PrefillTime> time_prefill(const DeepseekV41Model& model, ThreadPool& pool, int64_t n, ForwardMode mode, int64_t tail,
                            int64_t repeats) {
  const auto ids = random_prompt(n, 1000 + static_cast<uint64_t>(n), model.config().bos_token_id);
  std::vector<double> times, cpu;
  for (int64_t r = 0; r < repeats; ++r) {
    SequenceOptions so;
    so.mode = mode;
    so.prompt_length = n;
    so.ced_tail = tail;
    CEDAR_ASSIGN_OR_RETURN(SequenceState state, model.new_sequence(so));
    ForwardOptions fo;
    fo.pool = &pool;
    const auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    CEDAR_ASSIGN_OR_RETURN(ForwardOutput out, model.forward(ids, state, fo));
    cpu.push_back(cpu_seconds() - c0);
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (out.positions.empty()) return make_error("prefill returned no logits");
  }
  return PrefillTime{percentile(times, 0.5), percentile(cpu, 0.5)};
}

}  // namespace

Result<std::vector<int64_t>> parse_positive_list(const std::string& text, const std::string& name) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t comma = std::min(text.find(',', i), text.size());
    const std::string item = text.substr(i, comma - i);
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v <= 0) throw 0;
      out.push_back(v);
    } catch (...) {
      return make_error("--" + name + ": '" + item + "' is not a positive integer");
    }
    i = comma + 1;
  }
  return out;
}

int cmd_bench(const Args& args) {
  const CommandSpec spec = bench_spec();
  auto parsed = parse_args(spec, args);
  if (!parsed.ok()) {
    if (parsed.error().message == "help") {
      std::printf("%s", usage(spec).c_str());
      return 0;
    }
    std::fprintf(stderr, "cedar bench: %s\n%s", parsed.error().message.c_str(), usage(spec).c_str());
    return 2;
  }
  const ParsedArgs& a = *parsed;
  auto usage_error = [](const std::string& m) {
    std::fprintf(stderr, "cedar bench: %s\n", m.c_str());
    return 2;
  };
  const std::string device = a.get("device");
  if (device == "cuda") return cmd_bench_cuda(a);
  if (device != "cpu") return usage_error("--device must be cpu or cuda, got '" + device + "'");
  auto conc = parse_positive_list(a.get("concurrency"), "concurrency");
  auto plens = parse_positive_list(a.get("prompt-len"), "prompt-len");
  auto olens = parse_positive_list(a.get("output-len"), "output-len");
  auto ced_lens = parse_positive_list(a.get("ced-lens"), "ced-lens");
  for (const auto* r : {&conc, &plens, &olens, &ced_lens})
    if (!r->ok()) return usage_error(r->error().message);
  auto mode = parse_forward_mode(a.get("mode"));
  if (!mode.ok()) return usage_error("--mode: " + mode.error().message);
  auto requests = a.get_int("requests");
  auto step_tokens = a.get_int("step-tokens");
  auto tail = a.get_int("ced-tail");
  auto repeats = a.get_int("repeats");
  auto threads = a.get_int("threads");
  for (const auto* r : {&requests, &step_tokens, &tail, &repeats, &threads})
    if (!r->ok() || **r < 0) return usage_error("--requests, --step-tokens, --ced-tail, --repeats and --threads must be integers >= 0");
  if (*step_tokens == 0 || *repeats == 0) return usage_error("--step-tokens and --repeats must be > 0");

  ThreadPool pool(static_cast<int>(*threads));
  auto loaded = load_for_generation(LoadRequest{a.positional(0), &pool, true, "bench"});
  if (!loaded.ok()) {
    std::fprintf(stderr, "cedar bench: %s\n", loaded.error().message.c_str());
    return 1;
  }
  const DeepseekV41Model& model = *loaded->model;
  json result = {{"model", loaded->path.string()},
                 {"threads", pool.size()},
                 {"load_mode", std::string(forward_mode_name(*mode))},
                 {"sliding_window", model.config().sliding_window},
                 {"kv_bytes_per_token_expected", compute_kv_budget(model.config(), model.plan()).bytes_per_token()}};

  json load = json::array();
  std::fprintf(stderr, "%5s %6s %6s %5s %10s %10s %10s %12s\n", "conc", "prompt", "output", "reqs", "ttft_ms",
               "ttft_p90", "tpot_ms", "out_tok/s");
  for (int64_t c : *conc) {
    for (int64_t pl : *plens) {
      for (int64_t ol : *olens) {
        const LoadPoint lp{c, pl, ol, *requests > 0 ? *requests : 2 * c};
        auto r = run_load(model, pool, lp, *mode, *step_tokens, a);
        if (!r.ok()) {
          std::fprintf(stderr, "cedar bench: %s\n", r.error().message.c_str());
          return 1;
        }
        std::fprintf(stderr, "%5lld %6lld %6lld %5lld %10.2f %10.2f %10.2f %12.1f\n", static_cast<long long>(c),
                     static_cast<long long>(pl), static_cast<long long>(ol), static_cast<long long>(lp.requests),
                     1e3 * (*r)["ttft_mean_s"].get<double>(), 1e3 * (*r)["ttft_p90_s"].get<double>(),
                     1e3 * (*r)["tpot_mean_s"].get<double>(), (*r)["output_tokens_per_s"].get<double>());
        load.push_back(*r);
      }
    }
  }
  result["load"] = load;

  json prefill = json::array();
  json crossover = nullptr;
  if (!ced_lens->empty())
    std::fprintf(stderr, "\n%7s %10s %10s %12s %12s %12s\n", "prompt", "exact_ms", "ced_ms", "exact/ced", "exact_cpu_ms",
                 "ced_cpu_ms");
  for (int64_t n : *ced_lens) {
    auto exact = time_prefill(model, pool, n, ForwardMode::Exact, *tail, *repeats);
    auto ced = time_prefill(model, pool, n, ForwardMode::Ced, *tail, *repeats);
    if (!exact.ok() || !ced.ok()) {
      std::fprintf(stderr, "cedar bench: %s\n", (!exact.ok() ? exact.error() : ced.error()).message.c_str());
      return 1;
    }
    // The ratio uses CPU time: wall time on a shared machine includes waiting for a core.
    const double ratio = ced->cpu_s > 0 ? exact->cpu_s / ced->cpu_s : 0.0;
    std::fprintf(stderr, "%7lld %10.2f %10.2f %12.2f %12.2f %12.2f\n", static_cast<long long>(n), 1e3 * exact->wall_s,
                 1e3 * ced->wall_s, ratio, 1e3 * exact->cpu_s, 1e3 * ced->cpu_s);
    prefill.push_back({{"prompt_len", n},
                       {"exact_s", exact->wall_s},
                       {"ced_s", ced->wall_s},
                       {"exact_cpu_s", exact->cpu_s},
                       {"ced_cpu_s", ced->cpu_s},
                       {"exact_over_ced", ratio}});
    // Crossover: the first length from which CED stays more than 10% faster at every longer length.
    if (ratio <= 1.1) {
      crossover = nullptr;
    } else if (crossover.is_null()) {
      crossover = n;
    }
  }
  result["prefill"] = {{"ced_tail", *tail > 0 ? *tail : model.config().sliding_window},
                       {"points", prefill},
                       {"crossover_prompt_len", crossover}};

  const std::string text = result.dump(1) + "\n";
  if (a.has("json")) {
    if (Status st = io::write_file_atomically(
            a.get("json"), std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
        !st.ok()) {
      std::fprintf(stderr, "cedar bench: %s\n", st.error().message.c_str());
      return 1;
    }
  } else {
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  return 0;
}

}  // namespace cedar::cli
