// `cedar doctor [DIR]`: can this machine run cedar? CPU and model checks always; with the CUDA
// backend also the GPU: device and compute capability (FP8 tensor cores), driver / runtime, memory,
// measured device copy bandwidth against the 2.0 TB/s checklist line, the kernels this build carries,
// and the model's memory plan (model_stats.h plan_memory) on the GPUs found. Exit code 1 when a
// required check fails.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "io/config.h"
#include "model/default_model.h"
#include "model/layer_plan.h"
#include "model/model_stats.h"
#include "model/weights.h"

#ifdef CEDAR_HAVE_CUDA
#include "backend/cuda/device_info.h"
#include "backend/cuda/kernels.h"
#endif

namespace cedar::cli {
namespace {

const CommandSpec kSpec{
    "doctor",
    "Check this machine for cedar: CPU, the model's memory plan and, in a CUDA build, the GPU\n"
    "(compute capability / FP8 tensor cores, driver and runtime, memory, measured HBM copy bandwidth\n"
    "against --min-bandwidth, the kernels available). Without DIR: cedar's embedded default model.\n"
    "Exit code 1 when a required check fails.",
    {},
    {"DIR"},
    {
        {"json", "print JSON instead of text", false, "", ""},
        {"gpus", "GPUs for the memory plan (default: the GPUs found, else 8)", true, "", "N"},
        {"gpu-mem-gib", "memory per GPU for the memory plan (default: the GPU's, else 140)", true, "", "GIB"},
        {"reserve-gib", "per-GPU memory kept for activations and workspaces, GiB", true, "8", "GIB"},
        {"min-bandwidth", "required device copy bandwidth, GB/s", true, "2000", "GBPS"},
        {"bandwidth-mib", "buffer size of the bandwidth measurement, MiB", true, "1024", "MIB"},
    }};

enum class Outcome { Pass, Fail, Warn, Skip, Info };
const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::Pass: return "pass";
    case Outcome::Fail: return "FAIL";
    case Outcome::Warn: return "warn";
    case Outcome::Skip: return "skip";
    case Outcome::Info: return "info";
  }
  return "?";
}

struct Check {
  std::string name;
  Outcome outcome = Outcome::Info;
  std::string detail;
  nlohmann::ordered_json data = nlohmann::ordered_json::object();
};

struct DoctorOptions {
  std::string model_dir;
  std::optional<long long> gpus;
  std::optional<double> gpu_mem_gib;
  double reserve_gib = 8.0;
  double min_bandwidth_gbps = 2000.0;
  long long bandwidth_mib = 1024;
};

Result<double> parse_number(const ParsedArgs& a, const std::string& name) {
  const std::string v = a.get(name);
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !(d >= 0.0))
    return make_error("--" + name + " expects a non-negative number, got '" + v + "'");
  return d;
}

Result<DoctorOptions> parse_options(const ParsedArgs& a) {
  DoctorOptions o;
  if (auto dir = a.positional(0)) o.model_dir = *dir;
  if (a.has("gpus")) {
    CEDAR_ASSIGN_OR_RETURN(o.gpus, a.get_int("gpus"));
    if (*o.gpus < 1) return make_error("--gpus expects a positive integer");
  }
  if (a.has("gpu-mem-gib")) {
    CEDAR_ASSIGN_OR_RETURN(o.gpu_mem_gib, parse_number(a, "gpu-mem-gib"));
    if (!(*o.gpu_mem_gib > 0)) return make_error("--gpu-mem-gib expects a positive number");
  }
  CEDAR_ASSIGN_OR_RETURN(o.reserve_gib, parse_number(a, "reserve-gib"));
  CEDAR_ASSIGN_OR_RETURN(o.min_bandwidth_gbps, parse_number(a, "min-bandwidth"));
  CEDAR_ASSIGN_OR_RETURN(o.bandwidth_mib, a.get_int("bandwidth-mib"));
  if (o.bandwidth_mib < 1) return make_error("--bandwidth-mib expects a positive integer");
  return o;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// GPUs found (count, memory per GPU in GiB) for the memory plan; zero count when none.
struct GpuSummary {
  int count = 0;
  double mem_gib = 0;
};

#ifdef CEDAR_HAVE_CUDA
std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

GpuSummary gpu_checks(const DoctorOptions& o, std::vector<Check>& checks) {
  GpuSummary gpus;
  Check build{"cuda build", Outcome::Pass, "CUDA backend compiled in"};
  checks.push_back(build);
  auto rt = cuda::query_runtime();
  if (!rt.ok() || rt->devices.empty()) {
    checks.push_back({"cuda device", Outcome::Fail, rt.ok() ? "no CUDA device visible" : rt.error().message});
    return gpus;
  }
  Check drv{"driver / runtime", Outcome::Pass,
            "driver " + version_string(rt->driver_version) + ", runtime " + version_string(rt->runtime_version)};
  drv.data = {{"driver", rt->driver_version}, {"runtime", rt->runtime_version}};
  if (rt->driver_version < rt->runtime_version) {
    drv.outcome = Outcome::Fail;
    drv.detail += " (the driver is older than the runtime)";
  }
  checks.push_back(drv);
  const cuda::DeviceInfo& d0 = rt->devices[0];
  gpus.count = static_cast<int>(rt->devices.size());
  gpus.mem_gib = static_cast<double>(d0.total_memory_bytes) / kGiB;
  Check dev{"cuda device", Outcome::Pass,
            std::to_string(gpus.count) + " × " + d0.name + ", compute capability " + std::to_string(d0.cc_major) +
                "." + std::to_string(d0.cc_minor) + ", " + std::to_string(d0.multiprocessors) + " SMs"};
  dev.data = {{"count", gpus.count}, {"name", d0.name}, {"cc", std::to_string(d0.cc_major) + "." + std::to_string(d0.cc_minor)},
              {"sms", d0.multiprocessors}};
  checks.push_back(dev);
  const bool fp8 = d0.cc_major > 9 || (d0.cc_major == 9 && d0.cc_minor >= 0);
  checks.push_back({"fp8 tensor cores", fp8 ? Outcome::Pass : Outcome::Fail,
                    fp8 ? "yes (compute capability >= 9.0)" : "no: compute capability < 9.0 (cedar's kernels need sm_90a)"});
  if (auto mem = cuda::device_memory(0); mem.ok()) {
    Check m{"gpu memory", Outcome::Info,
            fmt("%.1f GiB total, ", static_cast<double>(mem->total_bytes) / kGiB) +
                fmt("%.1f GiB free (device 0)", static_cast<double>(mem->free_bytes) / kGiB)};
    m.data = {{"total_bytes", mem->total_bytes}, {"free_bytes", mem->free_bytes}};
    checks.push_back(m);
  } else {
    checks.push_back({"gpu memory", Outcome::Fail, mem.error().message});
  }
  const Status loadable = cuda::check_kernels_loadable();
  Check k{"kernels", loadable.ok() ? Outcome::Pass : Outcome::Fail, ""};
  nlohmann::ordered_json names = nlohmann::ordered_json::array();
  for (const auto& info : cuda::kernel_catalog()) {
    k.detail += (k.detail.empty() ? "" : ", ") + info.name;
    names.push_back({{"name", info.name}, {"what", info.what}});
  }
  if (!loadable.ok()) k.detail = "not loadable on this device: " + loadable.error().message;
  k.data = {{"available", names}};
  checks.push_back(k);
  auto bw = cuda::measure_copy_bandwidth(static_cast<size_t>(o.bandwidth_mib) << 20, 10);
  if (!bw.ok()) {
    checks.push_back({"hbm bandwidth", Outcome::Fail, bw.error().message});
  } else {
    const double best = std::max(bw->memcpy_gbps, bw->kernel_gbps);
    Check b{"hbm bandwidth", best >= o.min_bandwidth_gbps ? Outcome::Pass : Outcome::Fail,
            fmt("device copy %.0f GB/s (cudaMemcpy D2D ", best) + fmt("%.0f, ", bw->memcpy_gbps) +
                fmt("copy kernel %.0f; read+write bytes) vs ", bw->kernel_gbps) +
                fmt("required %.0f GB/s", o.min_bandwidth_gbps)};
    b.data = {{"memcpy_gbps", bw->memcpy_gbps}, {"kernel_gbps", bw->kernel_gbps},
              {"required_gbps", o.min_bandwidth_gbps}, {"buffer_bytes", bw->bytes}};
    checks.push_back(b);
  }
  return gpus;
}
#else
GpuSummary gpu_checks(const DoctorOptions&, std::vector<Check>& checks) {
  checks.push_back({"cuda build", Outcome::Skip,
                    "built without CUDA: GPU checks skipped (configure with the `cuda` preset to enable them)"});
  return {};
}
#endif

void model_checks(const DoctorOptions& o, const GpuSummary& gpus, std::vector<Check>& checks) {
  std::filesystem::path dir = o.model_dir;
  if (dir.empty()) {
    auto model = ensure_default_model();
    if (!model.ok()) {
      checks.push_back({"model", Outcome::Fail, model.error().message});
      return;
    }
    dir = *model;
  }
  auto config = load_model_config(dir);
  if (!config.ok()) {
    checks.push_back({"model", Outcome::Fail, config.error().message});
    return;
  }
  auto plan = build_layer_plan(*config);
  if (!plan.ok()) {
    checks.push_back({"model", Outcome::Fail, plan.error().message});
    return;
  }
  auto weights = expected_weights(*config, *plan);
  if (!weights.ok()) {
    checks.push_back({"model", Outcome::Fail, weights.error().message});
    return;
  }
  const ModelStats stats = compute_model_stats(*config, *plan, *weights);
  Check model{"model", Outcome::Pass,
              dir.string() + ": " + std::string(arch_name(config->arch)) + ", " +
                  std::to_string(config->num_hidden_layers) + " layers, " +
                  fmt("%.2f GB of text weights", static_cast<double>(stats.total.bytes) / 1e9)};
  model.data = {{"path", dir.string()}, {"arch", arch_name(config->arch)}, {"weight_bytes", stats.total.bytes}};
  checks.push_back(model);

  MemoryPlanOptions mp;
  mp.gpus = o.gpus ? *o.gpus : (gpus.count > 0 ? gpus.count : 8);
  mp.gpu_mem_gib = o.gpu_mem_gib ? *o.gpu_mem_gib : (gpus.count > 0 ? gpus.mem_gib : 140.0);
  mp.reserve_gib = o.reserve_gib;
  const std::vector<MemoryScenario> scenarios = plan_memory(stats, mp);
  Check plan_check{"memory plan", Outcome::Fail, ""};
  nlohmann::ordered_json js = nlohmann::ordered_json::array();
  std::string first_fit;
  for (const auto& s : scenarios) {
    if (s.fits && first_fit.empty()) first_fit = s.name;
    js.push_back({{"name", s.name}, {"fits", s.fits}, {"per_gpu_weight_bytes", s.per_gpu_weight_bytes},
                  {"per_gpu_free_bytes", s.per_gpu_free_bytes}, {"kv_token_capacity", s.kv_token_capacity}});
  }
  const std::string where = std::to_string(mp.gpus) + fmt(" GPU(s) × %.1f GiB", mp.gpu_mem_gib) +
                            fmt(" (reserve %.1f GiB)", mp.reserve_gib);
  if (!first_fit.empty()) {
    plan_check.outcome = Outcome::Pass;
    plan_check.detail = "fits on " + where + " as '" + first_fit + "'";
  } else {
    plan_check.detail = "does not fit on " + where + " in any placement";
  }
  plan_check.data = {{"gpus", mp.gpus}, {"gpu_mem_gib", mp.gpu_mem_gib}, {"reserve_gib", mp.reserve_gib},
                     {"scenarios", js}};
  checks.push_back(plan_check);
}

}  // namespace

int cmd_doctor(const Args& args) {
  auto parsed = parse_args(kSpec, args);
  if (!parsed.ok()) {
    if (parsed.error().message == "help") {
      std::printf("%s", usage(kSpec).c_str());
      return 0;
    }
    std::fprintf(stderr, "cedar doctor: %s\n%s", parsed.error().message.c_str(), usage(kSpec).c_str());
    return 2;
  }
  auto options = parse_options(*parsed);
  if (!options.ok()) {
    std::fprintf(stderr, "cedar doctor: %s\n", options.error().message.c_str());
    return 2;
  }
  std::vector<Check> checks;
  const unsigned cores = std::thread::hardware_concurrency();
  checks.push_back({"cpu", Outcome::Info, std::to_string(cores) + " hardware threads"});
  const GpuSummary gpus = gpu_checks(*options, checks);
  model_checks(*options, gpus, checks);

  bool ok = true;
  for (const auto& c : checks) ok = ok && c.outcome != Outcome::Fail;
  if (parsed->flag("json")) {
    nlohmann::ordered_json j;
    j["ok"] = ok;
    j["checks"] = nlohmann::ordered_json::array();
    for (const auto& c : checks)
      j["checks"].push_back({{"name", c.name}, {"outcome", outcome_name(c.outcome)}, {"detail", c.detail}, {"data", c.data}});
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    for (const auto& c : checks) std::printf("[%-4s] %-18s %s\n", outcome_name(c.outcome), c.name.c_str(), c.detail.c_str());
    std::printf("%s\n", ok ? "doctor: all required checks passed" : "doctor: a required check FAILED");
  }
  return ok ? 0 : 1;
}

}  // namespace cedar::cli
