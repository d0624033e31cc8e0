// `cedar bench --device cuda`: the GPU benchmark (docs/cuda-log.md "Benchmark"). In one run: the peaks
// (device copy bandwidth, cuBLASLt bf16 and fp8 GEMM), the model's memory plan on the device, the
// roofline (bytes per decode token at each batch, FLOPs per prefill token exact vs CED, model/roofline.h)
// and the CUDA model's decode / prefill timings as ratios to those peaks. JSON on stdout or --json FILE,
// a table on stderr. A CPU-only build says so and exits 1.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "cli/args.h"
#include "cli/bench_cuda.h"

#ifdef CEDAR_HAVE_CUDA
#include <chrono>
#include <filesystem>
#include <optional>
#include <set>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/peaks.h"
#include "backend/cuda/stream.h"
#include "cli/bench_cuda_timeline.h"
#include "io/atomic_file.h"
#include "model/default_model.h"
#include "model/roofline.h"
#include "model/weights.h"
#endif

namespace cedar::cli {

#ifndef CEDAR_HAVE_CUDA

int cmd_bench_cuda(const ParsedArgs&) {
  std::fprintf(stderr,
               "cedar bench: --device cuda: this cedar binary was built without CUDA. Configure and build it with "
               "the `cuda` preset (cmake --preset cuda -G Ninja && cmake --build --preset cuda --target cedar) to "
               "benchmark on a GPU.\n");
  return 1;
}

#else

namespace {

using json = nlohmann::ordered_json;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

constexpr int64_t kMaxTimelineSteps = 32;

struct BenchOptions {
  std::filesystem::path model;
  std::vector<int64_t> batches, prefill_lens;
  int64_t context = 4096, gemm_size = 8192, bandwidth_mib = 1024, ced_tail = 0, threads = 0;
  int64_t timeline = 0;  // decode steps recorded as a CUPTI kernel timeline per batch
  bool profile = true, ab = true;
  std::vector<std::string> ab_specs;  // --ab-specs: the decode A/B's rows instead of ab_specs() (+ defaults)
  std::string json_path;
  std::string cuda_options;  // apply_cuda_options spec
};

Result<BenchOptions> parse(const ParsedArgs& a) {
  BenchOptions o;
  if (auto m = a.positional(0)) o.model = *m;
  CEDAR_ASSIGN_OR_RETURN(o.batches, parse_positive_list(a.get("batches"), "batches"));
  CEDAR_ASSIGN_OR_RETURN(o.prefill_lens, parse_positive_list(a.get("prefill-lens"), "prefill-lens"));
  for (const char* name : {"context", "gemm-size", "bandwidth-mib", "ced-tail", "threads", "decode-profile", "ab",
                           "timeline"}) {
    auto v = a.get_int(name);
    if (!v.ok() || *v < 0) return make_error(std::string("--") + name + " expects a non-negative integer");
  }
  o.context = *a.get_int("context");
  o.gemm_size = *a.get_int("gemm-size");
  o.bandwidth_mib = *a.get_int("bandwidth-mib");
  o.ced_tail = *a.get_int("ced-tail");
  o.threads = *a.get_int("threads");
  o.profile = *a.get_int("decode-profile") != 0;
  o.ab = *a.get_int("ab") != 0;
  o.timeline = *a.get_int("timeline");
  // The recorded steps decode past the context into the sequences' 64 spare positions (kv.max_context).
  if (o.timeline > kMaxTimelineSteps)
    return make_error("--timeline expects at most " + std::to_string(kMaxTimelineSteps) + " steps");
  o.cuda_options = a.get("cuda-options");
  cuda::CudaModelOptions check;
  if (Status st = cuda::apply_cuda_options(o.cuda_options, check); !st.ok())
    return make_error("--cuda-options: " + st.error().message);
  // --ab-specs A;B;...: each a --cuda-options spec applied to the defaults (checked here, on a copy of them).
  const std::string ab_list = a.get("ab-specs");
  for (std::string_view rest = ab_list; !rest.empty();) {
    const size_t cut = rest.find(';');
    const std::string spec(rest.substr(0, cut));
    rest = cut == std::string_view::npos ? std::string_view() : rest.substr(cut + 1);
    if (spec.empty()) continue;
    cuda::CudaModelOptions spec_check = check;
    if (Status st = cuda::apply_cuda_options(spec, spec_check); !st.ok())
      return make_error("--ab-specs '" + spec + "': " + st.error().message);
    o.ab_specs.push_back(spec);
  }
  if (!o.ab_specs.empty()) {
    o.ab = true;
    o.ab_specs.insert(o.ab_specs.begin(), "defaults");
  }
  if (o.batches.empty() || o.prefill_lens.empty()) return make_error("--batches and --prefill-lens must not be empty");
  if (o.gemm_size % 16 != 0 || o.gemm_size == 0) return make_error("--gemm-size must be a positive multiple of 16");
  if (o.bandwidth_mib == 0) return make_error("--bandwidth-mib must be positive");
  o.json_path = a.get("json");
  return o;
}

struct Peaks {
  double copy_gbps = 0;
  double bf16_tflops = 0, fp8_tflops = 0;
  json j;
};

Result<Peaks> measure_peaks(const BenchOptions& o) {
  Peaks p;
  CEDAR_ASSIGN_OR_RETURN(const cuda::CopyBandwidth bw,
                         cuda::measure_copy_bandwidth(static_cast<size_t>(o.bandwidth_mib) << 20, 10));
  p.copy_gbps = std::max(bw.memcpy_gbps, bw.kernel_gbps);
  CEDAR_ASSIGN_OR_RETURN(const cuda::GemmPeaks g, cuda::measure_gemm_peaks(o.gemm_size, 20));
  p.bf16_tflops = g.bf16.tflops;
  p.fp8_tflops = g.fp8.tflops;
  auto gemm = [](const cuda::GemmPeak& x) {
    json j = {{"dtype", x.dtype}, {"m", x.m}, {"n", x.n}, {"k", x.k}, {"ms", x.ms_per_gemm}, {"tflops", x.tflops}};
    if (!x.error.empty()) j["error"] = x.error;
    return j;
  };
  p.j = {{"copy_gbps", p.copy_gbps},      {"memcpy_gbps", bw.memcpy_gbps}, {"copy_kernel_gbps", bw.kernel_gbps},
         {"copy_buffer_bytes", bw.bytes}, {"gemm_bf16", gemm(g.bf16)},     {"gemm_fp8", gemm(g.fp8)}};
  std::fprintf(stderr,
               "peaks: copy %.0f GB/s (cudaMemcpy %.0f, kernel %.0f; read+write); cuBLASLt %lld^3 bf16 %.0f TFLOP/s",
               p.copy_gbps, bw.memcpy_gbps, bw.kernel_gbps, static_cast<long long>(o.gemm_size), p.bf16_tflops);
  if (g.fp8.error.empty())
    std::fprintf(stderr, ", fp8 e4m3 %.0f TFLOP/s\n", p.fp8_tflops);
  else
    std::fprintf(stderr, ", fp8: %s\n", g.fp8.error.c_str());
  return p;
}

// A per-stage table (device time by stage, summed over layers) on stderr, and its JSON.
json print_stages(const std::string& title, const std::vector<cuda::StageTime>& stages, double total_us,
                  double copy_gbps) {
  std::fprintf(stderr, "\n%s (total %.0f us):\n", title.c_str(), total_us);
  std::fprintf(stderr, "%-16s %6s %10s %7s %12s %9s %8s\n", "stage", "calls", "us", "%", "weights_MB", "GB/s", "%copy");
  json j = json::array();
  for (const cuda::StageTime& st : stages) {
    const double gb = st.us > 0 ? static_cast<double>(st.weight_bytes) / (st.us * 1e3) : 0;
    std::fprintf(stderr, "%-16s %6lld %10.1f %7.1f %12.1f %9.0f %8.1f\n", st.stage.c_str(),
                 static_cast<long long>(st.calls), st.us, total_us > 0 ? 100 * st.us / total_us : 0,
                 static_cast<double>(st.weight_bytes) / 1e6, gb, 100 * gb / copy_gbps);
    j.push_back(
        {{"stage", st.stage}, {"calls", st.calls}, {"us", st.us}, {"weight_bytes", st.weight_bytes}, {"gbps", gb}});
  }
  return {{"total_us", total_us}, {"stages", j}};
}

// The decode context: one sequence prefilled with `context` tokens (exact), forked for every batch row.
Result<cuda::CudaSequence> prefill_context(cuda::CudaModel& m, int64_t context, int64_t chunk) {
  std::vector<int64_t> ids(static_cast<size_t>(std::max<int64_t>(context, 1)));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7919 + 13) % 128000);
  CEDAR_ASSIGN_OR_RETURN(cuda::CudaSequence s, m.new_sequence({}));
  cuda::CudaStepOutput out;
  for (int64_t done = 0; done < context; done += chunk) {
    const auto n = static_cast<size_t>(std::min(chunk, context - done));
    CEDAR_RETURN_IF_ERROR(
        m.prefill(s, std::span<const int64_t>(ids).subspan(static_cast<size_t>(done), n), LogitRows::None, out));
  }
  return s;
}

// Mean time of kSteps decode steps after two warm-up steps (a new graph shape runs directly, then captures).
constexpr int kSteps = 16;
template <typename Tokens>
Result<double> time_steps(cuda::CudaModel& m, std::span<cuda::CudaSequence* const> ptrs, Tokens&& tokens, int first) {
  cuda::CudaStepOutput out;
  for (int i = 0; i < 2; ++i) CEDAR_RETURN_IF_ERROR(m.decode_step(ptrs, tokens(first + i), out));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kSteps; ++i) CEDAR_RETURN_IF_ERROR(m.decode_step(ptrs, tokens(first + 2 + i), out));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kSteps;
}

// A/B of one kernel-path switch: the model's paths with `spec` applied (apply_cuda_options).
struct AbRow {
  std::string spec;
  double step_s = 0;
  std::string error;
};

// The switches an A/B run flips, each alone (or in the combinations listed) against the defaults, then all
// of them together (legacy);
// "defaults" first: the defaults timed the way every A/B row is (a fresh fork, its own graphs).
const std::vector<std::string>& ab_specs() {
  static const std::vector<std::string> specs = {
      "defaults",              "programmatic_launch=0", "router_splitk=0", "mhc_batched=0", "gemv_multi=0",
      "mhc_cluster=1",         "fused_q_rope=0",  "mhc_fused_norm=0", "attn_head_split=0",
      "mhc_split=0",           "mhc_split_norm=0",      "engram_ahead=0",  "wo_a_f16=0",
      "fused_act_quant=0",     "site_act_quant=1",      "site_cluster=0",        "swa_commit_aside=0", "router_ahead=1",
      "fork_pdl=0",            "dispatch_in_router=0",  "router_splitk_beside=0", "router_one_token=0", "shared_splitk=0",
      "router_splitk_beside=0,dispatch_in_router=0,fork_pdl=0", "router_ahead=1,router_splitk_beside=0",
      "fork_pdl_compressor=1", "q_norm_kv_encode=0", "attn_merge_trigger=0", "routed_full_edge=0",
      "attn_stage_wo_a=0",     "site_combine=0",        "warp_items=0",    "scale_exp_add=0",
      "routed_tiles=0",        "mhc_one_token=1",       "routed_w2_prefetch=1", "routed_w2_prefetch=2", "shared_w2_late=1",
      "legacy"};
  return specs;
}

// `spec` applied to `defaults` — never to the model's current paths, which an earlier A/B row may have
// switched (the rows would then accumulate every switch before them).
Result<cuda::CudaKernelPaths> paths_with(const cuda::CudaModel& m, const cuda::CudaKernelPaths& defaults,
                                         const std::string& spec) {
  cuda::CudaModelOptions o = m.options();
  o.paths = defaults;
  CEDAR_RETURN_IF_ERROR(cuda::apply_cuda_options(spec, o));
  return o.paths;
}

// Whether an A/B row of the list turns the tile routed GEMV off: the load then uploads the packed experts too
// (CudaModelOptions::packed_experts), so that the row compares the tiles with the balanced packed kernel.
bool ab_rows_need_packed_experts(const cuda::CudaModelOptions& loaded, const std::vector<std::string>& specs) {
  for (const std::string& spec : specs.empty() ? ab_specs() : specs) {
    cuda::CudaModelOptions o = loaded;
    if (spec != "defaults" && cuda::apply_cuda_options(spec, o).ok() && !o.paths.routed_tiles) return true;
  }
  return false;
}

struct DecodeTiming {
  double step_s = 0;
  double distinct_experts = 0;          // measured: distinct routed experts per layer in the last step
  std::vector<cuda::StageTime> stages;  // batch 1 only (--profile)
  double profiled_step_us = 0;
  double serial_step_s = 0;  // the same steps without the concurrent branches (batch <= 8)
  std::vector<AbRow> ab;     // (--ab) each kernel-path switch against the defaults
};

// Mean time of 16 decode steps of `batch` forks of `base` (after two warm-up steps: the first runs
// directly, the second captures the step's graph). Every row decodes its own token stream, so the rows
// route to different experts as independent sequences do.
Result<DecodeTiming> time_decode(cuda::CudaModel& m, const cuda::CudaSequence& base, int64_t batch, bool profile,
                                 bool ab, const std::vector<std::string>& specs) {
  std::vector<cuda::CudaSequence> seqs;
  std::vector<cuda::CudaSequence*> ptrs;
  for (int64_t b = 0; b < batch; ++b) {
    CEDAR_ASSIGN_OR_RETURN(cuda::CudaSequence s, m.fork_sequence(base));
    seqs.push_back(std::move(s));
  }
  for (auto& s : seqs) ptrs.push_back(&s);
  cuda::CudaStepOutput out;
  auto tokens = [&](int step) {
    std::vector<int64_t> t(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) t[static_cast<size_t>(b)] = (1000 + 7919 * b + 104729 * step) % 128000;
    return t;
  };
  DecodeTiming t;
  CEDAR_ASSIGN_OR_RETURN(t.step_s, time_steps(m, ptrs, tokens, 0));
  if (batch <= cuda::kGemvMaxRows) {  // A/B: the same step with every chain on one stream
    const bool concurrent = m.options().concurrent_branches;  // --cuda-options may have set it off: restored below
    m.use_concurrent_branches(false);
    Status st = m.decode_step(ptrs, tokens(2 + kSteps), out);        // new graph shape: runs directly
    if (st.ok()) st = m.decode_step(ptrs, tokens(3 + kSteps), out);  // captures
    const auto s0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kSteps && st.ok(); ++i) st = m.decode_step(ptrs, tokens(4 + kSteps + i), out);
    t.serial_step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count() / kSteps;
    m.use_concurrent_branches(concurrent);
    CEDAR_RETURN_IF_ERROR(st);
  }
  // A/B: every fast kernel path against its old one (the graphs are re-captured). The built-in list at batch 1;
  // explicit --ab-specs rows (few) at every batch the GEMV paths serve.
  if (ab && (batch == 1 || (!specs.empty() && batch <= cuda::kGemvMaxRows))) {
    const cuda::CudaKernelPaths defaults = m.options().paths;
    int first = 200;
    for (const std::string& spec : specs.empty() ? ab_specs() : specs) {
      AbRow row{spec, 0, ""};
      auto p = spec == "defaults" ? Result<cuda::CudaKernelPaths>(defaults) : paths_with(m, defaults, spec);
      // Fresh forks per switch: a failing variant poisons only its own sequences.
      std::vector<cuda::CudaSequence> forks;
      std::vector<cuda::CudaSequence*> fork_ptrs;
      Status st = p.ok() ? Status{} : Status(p.error());
      for (int64_t b = 0; b < batch && st.ok(); ++b) {
        auto fork = m.fork_sequence(base);
        if (fork.ok())
          forks.push_back(std::move(*fork));
        else
          st = fork.error();
      }
      if (st.ok()) {
        for (auto& f : forks) fork_ptrs.push_back(&f);
        m.set_paths(*p);
        auto s = time_steps(m, fork_ptrs, tokens, first);
        if (s.ok())
          row.step_s = *s;
        else
          row.error = s.error().message;
      } else {
        row.error = st.error().message;
      }
      first += 2 + kSteps;
      t.ab.push_back(row);
    }
    m.set_paths(defaults);
  }
  CEDAR_ASSIGN_OR_RETURN(const cuda::CudaSelections sel, m.last_selections(batch));
  double sum = 0;
  for (const auto& e : sel.experts) sum += static_cast<double>(std::set<int32_t>(e.begin(), e.end()).size());
  t.distinct_experts = sel.experts.empty() ? 0 : sum / static_cast<double>(sel.experts.size());
  if (profile) {
    auto st = m.profile_decode_step(ptrs, tokens(100), out, &t.profiled_step_us);
    if (!st.ok()) return st.error().with_context("profile");
    t.stages = std::move(*st);
  }
  return t;
}

// Wall time of a whole prefill of `n` tokens in `mode` (chunks of the model's max_chunk).
Result<double> time_prefill(cuda::CudaModel& m, int64_t n, ForwardMode mode, int64_t tail, int64_t max_chunk) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 104729 + 7) % 128000);
  SequenceOptions so;
  so.mode = mode;
  so.prompt_length = n;
  so.ced_tail = tail;
  CEDAR_ASSIGN_OR_RETURN(cuda::CudaSequence s, m.new_sequence(so));
  cuda::CudaStepOutput out;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t done = 0; done < n; done += max_chunk) {
    const int64_t len = std::min(max_chunk, n - done);
    CEDAR_RETURN_IF_ERROR(
        m.prefill(s, std::span<const int64_t>(ids).subspan(static_cast<size_t>(done), static_cast<size_t>(len)),
                  done + len == n ? LogitRows::Last : LogitRows::None, out));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(const BenchOptions& o) {
  auto rt = cuda::query_runtime();
  if (!rt.ok() || rt->devices.empty()) {
    std::fprintf(stderr, "cedar bench: --device cuda: %s\n",
                 rt.ok() ? "no CUDA device visible" : rt.error().message.c_str());
    return 1;
  }
  const cuda::DeviceInfo& dev = rt->devices[0];
  json result = {{"device",
                  {{"name", dev.name},
                   {"cc", std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor)},
                   {"sms", dev.multiprocessors},
                   {"memory_bytes", dev.total_memory_bytes}}}};
  std::fprintf(stderr, "device: %s, compute capability %d.%d, %d SMs, %.1f GiB\n", dev.name.c_str(), dev.cc_major,
               dev.cc_minor, dev.multiprocessors, static_cast<double>(dev.total_memory_bytes) / (1 << 30));
  auto peaks = measure_peaks(o);
  if (!peaks.ok()) {
    std::fprintf(stderr, "cedar bench: peaks: %s\n", peaks.error().message.c_str());
    return 1;
  }
  result["peaks"] = peaks->j;

  std::filesystem::path path = o.model;
  if (path.empty()) {
    auto def = ensure_default_model();
    if (!def.ok()) {
      std::fprintf(stderr, "cedar bench: %s\n", def.error().message.c_str());
      return 1;
    }
    path = *def;
  }
  auto config = load_model_config(path);
  if (!config.ok()) {
    std::fprintf(stderr, "cedar bench: %s\n", config.error().message.c_str());
    return 1;
  }
  auto plan = build_layer_plan(*config);
  auto specs = plan.ok() ? expected_weights(*config, *plan) : Result<std::vector<WeightSpec> >(plan.error());
  if (!specs.ok()) {
    std::fprintf(stderr, "cedar bench: %s\n", specs.error().message.c_str());
    return 1;
  }
  result["model"] = {{"path", path.string()},
                     {"layers", config->num_hidden_layers},
                     {"routed_experts", config->n_routed_experts},
                     {"experts_per_token", config->num_experts_per_tok}};

  // The CUDA model: its memory plan, then timings (phase 1: the loop stops at the first pending kernel).
  const int64_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const int64_t max_prompt = *std::max_element(o.prefill_lens.begin(), o.prefill_lens.end());
  cuda::CudaModelOptions mo;
  (void)cuda::apply_cuda_options(o.cuda_options, mo);  // checked in parse()
  if (o.ab && ab_rows_need_packed_experts(mo, o.ab_specs)) mo.packed_experts = true;
  std::fprintf(stderr, "CUDA model options: %s\n", cuda::describe_cuda_options(mo).c_str());
  result["cuda_options"] = cuda::describe_cuda_options(mo);
  mo.max_batch = max_batch;
  mo.max_chunk = std::min<int64_t>(max_prompt, 2048);
  // The decode context, its forks, one prefill sequence, and the A/B rows' own forks next to the batch's
  // (A/B batches: 1 for the built-in list, up to kGemvMaxRows for --ab-specs rows).
  const int64_t ab_batch = o.ab_specs.empty() ? 1 : std::min<int64_t>(max_batch, cuda::kGemvMaxRows);
  const int64_t forks = std::max<int64_t>(max_batch, o.ab ? 2 * ab_batch : 1);
  mo.kv.max_sequences = forks + 2;
  mo.kv.max_context = std::max(o.context + 64, max_prompt);
  mo.kv.token_capacity = (forks + 1) * (o.context + 64) + max_prompt;
  ThreadPool pool(static_cast<int>(o.threads));
  mo.pool = &pool;
  std::unique_ptr<cuda::CudaModel> model;
  std::string model_error;
  const auto t_load = std::chrono::steady_clock::now();
  if (auto m = cuda::CudaModel::load(path, mo); m.ok()) {
    model = std::move(*m);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    std::fprintf(stderr, "model: %s loaded and uploaded in %.1f s; device memory plan:\n%s", path.string().c_str(),
                 secs, model->memory_plan().table().c_str());
    json entries = json::array();
    for (const auto& e : model->memory_plan().entries)
      entries.push_back({{"component", e.component},
                         {"bytes", e.bytes},
                         {"where", e.in_host ? "host" : "hbm"},
                         {"read_per_step", e.read_per_step}});
    result["memory_plan"] = {
        {"entries", entries}, {"device_bytes", model->memory_plan().device_bytes()}, {"load_s", secs}};
  } else {
    model_error = m.error().message;
    std::fprintf(stderr, "model: %s\n", model_error.c_str());
    result["model"]["error"] = model_error;
  }

  // Decode: bytes per token from the weights read (roofline.h) as stored — FP8 wo_a, BF16 norms — the least
  // any exact engine must read (cedar reads wo_a as stored; it keeps the norm vectors in fp32, a little more).
  std::fprintf(stderr,
               "\ndecode at context %lld (bytes per step, as stored: weights once + per token lookups and KV):\n",
               static_cast<long long>(o.context));
  std::fprintf(stderr, "%6s %12s %9s %11s %12s %11s %11s %10s %8s\n", "batch", "weights_GB", "experts", "kv_MB/tok",
               "GB/token", "ideal_ms", "tpot_ms", "GB/s", "%copy");
  json decode = json::array();
  std::optional<cuda::CudaSequence> base;
  std::string base_error;
  if (model) {
    const auto tb = std::chrono::steady_clock::now();
    auto b = prefill_context(*model, o.context, mo.max_chunk);
    if (b.ok()) {
      base.emplace(std::move(*b));
      std::fprintf(stderr, "  (context prefill of %lld tokens: %.2f s; every batch row is a fork of it)\n",
                   static_cast<long long>(o.context),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - tb).count());
    } else {
      base_error = b.error().message;
    }
  }
  json profiles = json::object();
  for (int64_t b : o.batches) {
    DecodeTrafficOptions to;
    to.batch = b;
    to.context = o.context;
    to.wo_a_bf16 = false;
    DecodeTraffic t = decode_traffic(*config, *plan, *specs, to);
    std::string tpot = "-", gbps = "-", pct = "-";
    json row;
    DecodeTiming timing;
    std::string error = base ? "" : (model ? base_error : model_error);
    if (base) {
      auto r = time_decode(*model, *base, b, o.profile, o.ab, o.ab_specs);
      if (r.ok()) {
        timing = std::move(*r);
        // Achieved bandwidth over the bytes this step really reads: the measured distinct experts.
        to.distinct_experts_per_layer = timing.distinct_experts;
        t = decode_traffic(*config, *plan, *specs, to);
      } else {
        error = r.error().message;
      }
    }
    const double ideal = t.step_bytes() / (peaks->copy_gbps * 1e9);
    row = {{"batch", b},
           {"context", o.context},
           {"step_bytes", t.step_bytes()},
           {"bytes_per_token", t.bytes_per_token()},
           {"weight_bytes", t.weight_bytes()},
           {"expert_bytes", t.expert_bytes},
           {"distinct_experts_per_layer", t.distinct_experts_per_layer},
           {"kv_read_bytes_per_token", t.kv_read_bytes_per_token},
           {"ideal_step_s", ideal}};
    if (error.empty() && timing.step_s > 0) {
      const double secs = timing.step_s;
      row["step_s"] = secs;
      row["tokens_per_s"] = static_cast<double>(b) / secs;
      row["achieved_gbps"] = t.step_bytes() / secs / 1e9;
      row["ratio_to_copy_peak"] = t.step_bytes() / secs / 1e9 / peaks->copy_gbps;
      if (timing.serial_step_s > 0) row["serial_step_s"] = timing.serial_step_s;
      tpot = fmt("%.3f", 1e3 * secs);
      gbps = fmt("%.0f", t.step_bytes() / secs / 1e9);
      pct = fmt("%.1f", 100 * t.step_bytes() / secs / 1e9 / peaks->copy_gbps);
    } else if (!error.empty()) {
      row["error"] = error;
    }
    std::fprintf(stderr, "%6lld %12.3f %9.2f %11.3f %12.4f %11.3f %11s %10s %8s", static_cast<long long>(b),
                 t.weight_bytes() / 1e9, t.distinct_experts_per_layer, t.kv_read_bytes_per_token / 1e6,
                 t.bytes_per_token() / 1e9, 1e3 * ideal, tpot.c_str(), gbps.c_str(), pct.c_str());
    if (timing.serial_step_s > 0) std::fprintf(stderr, "   (one stream: %.3f ms)", 1e3 * timing.serial_step_s);
    std::fprintf(stderr, "\n");
    if (!timing.ab.empty()) {
      json ab = json::array();
      int width = 0;  // the longest spec (combinations are long)
      for (const AbRow& a : timing.ab) width = std::max(width, static_cast<int>(a.spec.size()));
      // Deltas against the "defaults" row, timed the way every row is: the batch's first measurement above ran
      // 0.03-0.06 ms slower than that row in each of s32's H100 runs (a warm-up), which biased every delta.
      double base_s = timing.step_s;
      for (const AbRow& a : timing.ab)
        if (a.spec == "defaults" && a.error.empty()) base_s = a.step_s;
      for (const AbRow& a : timing.ab) {
        if (!a.error.empty()) {
          std::fprintf(stderr, "         A/B %-*s error: %s\n", width, a.spec.c_str(), a.error.c_str());
          ab.push_back({{"options", a.spec}, {"error", a.error}});
          continue;
        }
        std::fprintf(stderr, "         A/B %-*s tpot %8.3f ms (%+.3f ms vs the defaults row)\n", width, a.spec.c_str(),
                     1e3 * a.step_s, 1e3 * (a.step_s - base_s));
        ab.push_back({{"options", a.spec}, {"step_s", a.step_s}});
      }
      row["ab"] = ab;
    }
    decode.push_back(row);
    if (!timing.stages.empty()) {
      // Where the step goes: device time per stage (events inside the step's graph, one stream).
      profiles[std::to_string(b)] = print_stages("  decode step at batch " + std::to_string(b) +
                                                     " by stage (device time; events inside the step's graph, "
                                                     "chains on one stream; unprofiled TPOT " +
                                                     fmt("%.0f", 1e6 * timing.step_s) + " us)",
                                                 timing.stages, timing.profiled_step_us, peaks->copy_gbps);
      std::fprintf(stderr, "\n");
    }
  }
  if (!profiles.empty()) result["decode_profiles"] = profiles;
  result["decode"] = decode;
  if (base && o.timeline > 0) {
    // The real, concurrent step: CUPTI's kernel records of graph replays (docs/cuda-log.md "Kernel timeline").
    json timelines = json::array();
    for (size_t i = 0; i < o.batches.size(); ++i) {
      DecodeTimelineOptions to;
      to.batch = o.batches[i];
      to.steps = o.timeline;
      to.untraced_step_s = decode[i].contains("step_s") ? decode[i]["step_s"].get<double>() : 0;
      timelines.push_back(bench_decode_timeline(*model, *base, to));
    }
    result["decode_timeline"] = timelines;
  }
  for (const auto& row : decode)
    if (row.contains("error")) {
      std::fprintf(stderr, "decode: %s\n", row["error"].get<std::string>().c_str());
      break;
    }

  // Prefill: FLOPs per prompt token, exact vs CED, against the GEMM peaks.
  std::fprintf(stderr, "\nprefill (FLOPs: linear layers + attention; ideal at the fp8 / bf16 GEMM peak):\n");
  std::fprintf(stderr, "%7s %6s %13s %12s %12s %10s %9s %8s\n", "prompt", "mode", "GFLOP/token", "ideal_fp8_s",
               "ideal_bf16_s", "time_s", "TFLOP/s", "%fp8");
  json prefill = json::array();
  for (int64_t n : o.prefill_lens) {
    double exact_flops = 0, ced_flops = 0, exact_s = 0, ced_s = 0;
    for (ForwardMode mode : {ForwardMode::Exact, ForwardMode::Ced}) {
      PrefillFlopsOptions po;
      po.prompt = n;
      po.mode = mode;
      po.ced_tail = o.ced_tail;
      auto f = prefill_flops(*config, *plan, *specs, po);
      if (!f.ok()) {
        prefill.push_back({{"prompt", n}, {"mode", forward_mode_name(mode)}, {"error", f.error().message}});
        continue;
      }
      (mode == ForwardMode::Exact ? exact_flops : ced_flops) = f->total();
      json row = {{"prompt", n},
                  {"mode", forward_mode_name(mode)},
                  {"replay_start", f->replay_start},
                  {"flops", f->total()},
                  {"linear_flops", f->linear_flops},
                  {"attention_flops", f->attention_flops},
                  {"flops_per_token", f->per_token()},
                  {"ideal_s_fp8", f->total() / (peaks->fp8_tflops * 1e12)},
                  {"ideal_s_bf16", f->total() / (peaks->bf16_tflops * 1e12)}};
      std::string time = "-", tflops = "-", pct = "-";
      if (model) {
        auto secs = time_prefill(*model, n, mode, o.ced_tail, mo.max_chunk);
        if (secs.ok()) {
          row["time_s"] = *secs;
          row["tokens_per_s"] = static_cast<double>(n) / *secs;
          (mode == ForwardMode::Exact ? exact_s : ced_s) = *secs;
          row["achieved_tflops"] = f->total() / *secs / 1e12;
          row["ratio_to_fp8_peak"] = f->total() / *secs / 1e12 / peaks->fp8_tflops;
          time = fmt("%.3f", *secs);
          tflops = fmt("%.1f", f->total() / *secs / 1e12);
          pct = fmt("%.1f", 100 * f->total() / *secs / 1e12 / peaks->fp8_tflops);
        } else {
          row["error"] = secs.error().message;
        }
      }
      std::fprintf(stderr, "%7lld %6s %13.3f %12.4f %12.4f %10s %9s %8s\n", static_cast<long long>(n),
                   std::string(forward_mode_name(mode)).c_str(), f->per_token() / 1e9,
                   f->total() / (peaks->fp8_tflops * 1e12), f->total() / (peaks->bf16_tflops * 1e12), time.c_str(),
                   tflops.c_str(), pct.c_str());
      prefill.push_back(row);
    }
    if (ced_flops > 0) {
      std::fprintf(stderr, "%7lld   exact/ced speedup: ideal (FLOPs) %.2fx", static_cast<long long>(n),
                   exact_flops / ced_flops);
      if (exact_s > 0 && ced_s > 0) {
        std::fprintf(stderr, ", measured %.2fx (%.0f vs %.0f tokens/s)", exact_s / ced_s, n / exact_s, n / ced_s);
        prefill.push_back(
            {{"prompt", n}, {"ced_speedup", exact_s / ced_s}, {"ideal_ced_speedup", exact_flops / ced_flops}});
      }
      std::fprintf(stderr, "\n");
    }
  }
  result["prefill"] = prefill;
  if (model && o.ab) {
    // A/B: the exact prefill of the first length with each prefill-relevant switch at its old path.
    const int64_t n = o.prefill_lens.front();
    const cuda::CudaKernelPaths defaults = model->options().paths;
    json ab = json::array();
    std::fprintf(stderr, "\nprefill A/B (exact, %lld tokens):\n", static_cast<long long>(n));
    for (const std::string& spec :
         {std::string("defaults"), std::string("blas_min_rows=1000000000"), std::string("mhc_batched=0"),
          std::string("router_splitk=0"), std::string("legacy")}) {
      auto p = spec == "defaults" ? Result<cuda::CudaKernelPaths>(defaults) : paths_with(*model, defaults, spec);
      Result<double> secs = p.ok() ? Result<double>(0.0) : Result<double>(p.error());
      if (p.ok()) {
        model->set_paths(*p);
        secs = time_prefill(*model, n, ForwardMode::Exact, o.ced_tail, mo.max_chunk);
      }
      if (secs.ok()) {
        std::fprintf(stderr, "  %-26s %8.3f s  %8.0f tokens/s\n", spec.c_str(), *secs, n / *secs);
        ab.push_back({{"options", spec}, {"prompt", n}, {"time_s", *secs}});
      } else {
        std::fprintf(stderr, "  %-26s error: %s\n", spec.c_str(), secs.error().message.c_str());
        ab.push_back({{"options", spec}, {"prompt", n}, {"error", secs.error().message}});
      }
    }
    model->set_paths(defaults);
    result["prefill_ab"] = ab;
  }
  if (model && o.profile) {
    // Where a prefill chunk goes: one exact chunk of max_chunk rows after 3 chunks of context (the 8k
    // prompt's last chunk at the default 2048), direct launches with an event after every stage.
    const int64_t chunk = mo.max_chunk, before = std::min<int64_t>(3 * chunk, mo.kv.max_context - chunk);
    std::vector<int64_t> ids(static_cast<size_t>(before + chunk));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 104729 + 7) % 128000);
    SequenceOptions so;
    auto s = model->new_sequence(so);
    Status st = s.ok() ? Status::Ok() : Status(s.error());
    cuda::CudaStepOutput out;
    for (int64_t done = 0; st.ok() && done < before; done += chunk)
      st = model->prefill(*s,
                          std::span<const int64_t>(ids).subspan(static_cast<size_t>(done), static_cast<size_t>(chunk)),
                          LogitRows::None, out);
    double total_us = 0;
    auto stages = st.ok() ? model->profile_prefill(
                                *s, std::span<const int64_t>(ids).subspan(static_cast<size_t>(before)), &total_us)
                          : Result<std::vector<cuda::StageTime> >(st.error());
    if (stages.ok()) {
      PrefillFlopsOptions po;
      po.prompt = before + chunk;
      auto f_all = prefill_flops(*config, *plan, *specs, po);
      po.prompt = before;
      auto f_before = prefill_flops(*config, *plan, *specs, po);
      const double flops = f_all.ok() && f_before.ok() ? f_all->total() - f_before->total() : 0;
      result["prefill_profile"] =
          print_stages("prefill chunk of " + std::to_string(chunk) + " rows at " + std::to_string(before) +
                           " cached positions, exact, by stage (device time; " + fmt("%.1f", flops / (total_us * 1e6)) +
                           " TFLOP/s over the chunk)",
                       *stages, total_us, peaks->copy_gbps);
    } else {
      std::fprintf(stderr, "prefill profile: %s\n", stages.error().message.c_str());
    }
  }
  if (model && !prefill.empty() && prefill[0].contains("error"))
    std::fprintf(stderr, "prefill: %s\n", prefill[0]["error"].get<std::string>().c_str());

  const std::string text = result.dump(1) + "\n";
  if (!o.json_path.empty()) {
    if (Status st = io::write_file_atomically(
            o.json_path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
        !st.ok()) {
      std::fprintf(stderr, "cedar bench: %s\n", st.error().message.c_str());
      return 1;
    }
  } else {
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  return model ? 0 : 1;
}

}  // namespace

int cmd_bench_cuda(const ParsedArgs& a) {
  auto o = parse(a);
  if (!o.ok()) {
    std::fprintf(stderr, "cedar bench: %s\n", o.error().message.c_str());
    return 2;
  }
  return run(*o);
}

#endif

}  // namespace cedar::cli
