// `cedar inspect DIR`: what a checkpoint (or a directory holding only config.json) is and needs —
// layer plan, parameters and bytes by format and component, active parameters, KV budget, a memory
// plan, and for a full checkpoint the inventory check. Rules: docs/inspect.md.
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/inspect_report.h"
#include "io/safetensors.h"
#include "model/default_model.h"
#include "model/weights.h"

namespace cedar::cli {
namespace {

const CommandSpec kSpec{
    "inspect",
    "Describe a DeepSeek-V4.1 / V4 checkpoint directory (or a directory with only config.json):\n"
    "layer plan, parameters and bytes, active parameters per token, KV-cache budget, memory plan.\n"
    "With safetensors present, also checks every tensor name, dtype and shape against the config.\n"
    "Without DIR: cedar's embedded default model (a tiny V4.1 checkpoint, created on first use).",
    {},
    {"DIR"},
    {
        {"json", "print JSON instead of text", false, "", ""},
        {"gpus", "GPUs for the memory plan", true, "8", "N"},
        {"gpu-mem-gib", "memory per GPU in GiB", true, "140", "GIB"},
        {"reserve-gib", "per-GPU memory kept for activations and workspaces, GiB", true, "8", "GIB"},
        {"max-names", "tensor names listed per inventory problem group", true, "20", "N"},
    }};

Result<double> parse_positive_double(const ParsedArgs& a, const std::string& name) {
  const std::string v = a.get(name);
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !(d > 0.0))
    return make_error("--" + name + " expects a positive number, got '" + v + "'");
  return d;
}

bool has_safetensors(const std::filesystem::path& dir) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(dir / "model.safetensors.index.json", ec)) return true;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") return true;
  return false;
}

Result<InspectResult> run_inspect(const ParsedArgs& a) {
  InspectResult r;
  if (auto dir = a.positional(0)) {
    r.path = *dir;
  } else {
    CEDAR_ASSIGN_OR_RETURN(const std::filesystem::path model, ensure_default_model());
    r.path = model.string();
  }
  CEDAR_ASSIGN_OR_RETURN(const long long gpus, a.get_int("gpus"));
  CEDAR_ASSIGN_OR_RETURN(const long long max_names, a.get_int("max-names"));
  if (gpus < 1) return make_error("--gpus expects a positive integer, got " + std::to_string(gpus));
  if (max_names < 0) return make_error("--max-names expects a non-negative integer");
  r.memory_options.gpus = gpus;
  r.max_names = static_cast<size_t>(max_names);
  CEDAR_ASSIGN_OR_RETURN(r.memory_options.gpu_mem_gib, parse_positive_double(a, "gpu-mem-gib"));
  CEDAR_ASSIGN_OR_RETURN(r.memory_options.reserve_gib, parse_positive_double(a, "reserve-gib"));

  const std::filesystem::path dir = r.path;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return make_error(r.path + ": not a directory");
  CEDAR_ASSIGN_OR_RETURN(r.config, load_model_config(dir));
  CEDAR_ASSIGN_OR_RETURN(r.plan, build_layer_plan(r.config));
  CEDAR_ASSIGN_OR_RETURN(const std::vector<WeightSpec> expected, expected_weights(r.config, r.plan));
  r.expected_tensors = static_cast<int64_t>(expected.size());

  std::optional<ParamBytes> vision;
  if (has_safetensors(dir)) {
    CEDAR_ASSIGN_OR_RETURN(const io::Checkpoint ck, io::Checkpoint::open(dir));
    const std::vector<TensorRecord> records = tensor_records(ck);
    InventoryOptions options = inventory_options(r.config, r.plan);
    options.max_names = r.max_names;
    r.inventory = compare_inventory(expected, records, options);
    CheckpointSummary sum;
    sum.shards = static_cast<int64_t>(ck.shard_paths().size());
    sum.tensors = static_cast<int64_t>(records.size());
    for (const auto& t : records) sum.tensor_bytes += t.nbytes;
    for (const auto& p : ck.shard_paths()) sum.file_bytes += std::filesystem::file_size(p, ec);
    r.checkpoint = sum;
    if (r.config.has_vision) {
      vision = ParamBytes{};
      vision->add(r.inventory->vision_tensors, r.inventory->vision_params, r.inventory->vision_bytes);
    }
  }
  r.stats = compute_model_stats(r.config, r.plan, expected, vision);
  r.memory = plan_memory(r.stats, r.memory_options);
  return r;
}

}  // namespace

int cmd_inspect(const Args& args) {
  auto parsed = parse_args(kSpec, args);
  if (!parsed.ok()) {
    if (parsed.error().message == "help") {
      std::printf("%s", usage(kSpec).c_str());
      return 0;
    }
    std::fprintf(stderr, "cedar inspect: %s\n%s", parsed.error().message.c_str(), usage(kSpec).c_str());
    return 2;
  }
  auto result = run_inspect(*parsed);
  if (!result.ok()) {
    std::fprintf(stderr, "cedar inspect: %s\n", result.error().message.c_str());
    return 1;
  }
  const InspectResult& r = *result;
  if (parsed->flag("json")) std::printf("%s\n", inspect_json(r).dump(2).c_str());
  else std::printf("%s", inspect_text(r).c_str());
  if (r.inventory && !r.inventory->ok()) {
    if (parsed->flag("json")) std::fprintf(stderr, "cedar inspect: %s\n", r.inventory->format(r.max_names).c_str());
    return 1;
  }
  return 0;
}

}  // namespace cedar::cli
