// `cedar forward`: the CPU forward over a list of token ids; writes the logits as a float32 .npy
// [positions, vocab] and, on request, named intermediate tensors (one .npy per tensor).
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "model/deepseek_v4.h"
#include "model/deepseek_v41.h"
#include "model/default_model.h"

namespace cedar::cli {
namespace {

const CommandSpec kSpec{
    "forward",
    "Run the CPU reference forward (DeepSeek-V4.1 or V4, from config.json) over token ids. MODEL is a checkpoint directory (default: the\n"
    "embedded tiny model). Logits are written as float32 .npy [positions, vocab]; a JSON summary (positions,\n"
    "shape, mode) goes to stdout. See docs/forward.md.",
    {},
    {"MODEL"},
    {
        {"ids", "comma-separated token ids", true, "", "IDS"},
        {"mode", "prefill mode: exact (every layer on every token) or ced (decoder SWA bounded replay)", true,
         "exact", "MODE"},
        {"ced-tail", "ced: decoder rows replayed at the end of the prompt (0 = sliding_window)", true, "0", "N"},
        {"ced-boundary", "ced: last KV source layer runs exact-source (ATOM) or global-kv-only (vLLM) on the head",
         true, "exact-source", "KIND"},
        {"chunk", "prefill chunk size in tokens (0 = all ids in one call; 1 = token by token)", true, "0", "N"},
        {"positions", "logit rows: all (every computed position) or last", true, "all", "all|last"},
        {"logits-out", "write the logits here (.npy float32 [positions, vocab])", true, "", "FILE"},
        {"dump-tensors", "save intermediates whose name matches REGEX (ECMAScript, search) as DIR/NAME.npy "
                         "[rows, width] plus DIR/index.json (positions per tensor)",
         true, "", "REGEX DIR"},
        {"threads", "worker threads (0 = all cores)", true, "0", "N"},
        {"engram-map",
         "Engram token map .npy (default: MODEL/engram_token_map.npy, else the frozen map built into cedar)", true, "",
         "FILE"},
    }};

int usage_error(const std::string& message) {
  std::fprintf(stderr, "cedar forward: %s\n%s", message.c_str(), usage(kSpec).c_str());
  return 2;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "cedar forward: %s\n", message.c_str());
  return 1;
}

Result<std::vector<int64_t>> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  size_t i = 0;
  while (i <= text.size()) {
    const size_t comma = std::min(text.find(',', i), text.size());
    const std::string item = text.substr(i, comma - i);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (item.empty() || used != item.size()) return make_error("--ids: '" + item + "' is not an integer");
    ids.push_back(v);
    i = comma + 1;
  }
  return ids;
}

// Collects the named tensors of every forward call, in call order.
struct DumpCollector {
  std::regex pattern;
  struct Tensor {
    int64_t width = 0;
    std::vector<float> data;
    std::vector<int64_t> positions;
  };
  std::map<std::string, Tensor> tensors;
  std::string error;

  void operator()(const TensorRecord& r) {
    const std::string name(r.name);
    if (!std::regex_search(name, pattern)) return;
    Tensor& t = tensors[name];
    if (t.width != 0 && t.width != r.width) {
      error = "tensor '" + name + "' changed width";
      return;
    }
    t.width = r.width;
    t.data.insert(t.data.end(), r.data.begin(), r.data.end());
    for (int64_t p = 0; p < r.rows; ++p) t.positions.push_back(r.pos0 + p);
  }

  Status write(const std::filesystem::path& dir) const {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return make_error("cannot create '" + dir.string() + "': " + ec.message());
    nlohmann::json index = nlohmann::json::object();
    for (const auto& [name, t] : tensors) {
      const std::vector<int64_t> shape = {static_cast<int64_t>(t.positions.size()), t.width};
      CEDAR_RETURN_IF_ERROR(io::write_npy(dir / (name + ".npy"), t.data, shape));
      index[name] = {{"shape", shape}, {"positions", t.positions}};
    }
    const std::string text = index.dump(1) + "\n";
    return io::write_file_atomically(dir / "index.json",
                                     std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  }
};

// Pulls `--dump-tensors REGEX DIR` (two values) out of the argument list.
Result<std::vector<std::string>> take_dump_args(const Args& args, std::string& regex, std::string& dir) {
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] != "--dump-tensors") {
      rest.push_back(args[i]);
      continue;
    }
    if (i + 2 >= args.size()) return make_error("--dump-tensors needs REGEX and DIR");
    regex = args[i + 1];
    dir = args[i + 2];
    i += 2;
  }
  return rest;
}

Result<std::filesystem::path> model_path(const ParsedArgs& a) {
  if (auto p = a.positional(0)) return std::filesystem::path(*p);
  return ensure_default_model();
}

// Everything cmd_forward parsed, for the architecture-independent run below.
struct ForwardRun {
  const ParsedArgs& a;
  const std::vector<int64_t>& ids;
  ForwardMode mode;
  int64_t chunk, tail;
  std::string positions, boundary;
  DumpCollector& dump;
  const std::string& dump_dir;
  ThreadPool& pool;
  std::filesystem::path path;
};

template <typename Model>
int run_forward(const Model& model, const ForwardRun& r) {
  SequenceOptions so;
  so.mode = r.mode;
  so.prompt_length = static_cast<int64_t>(r.ids.size());
  so.ced_tail = r.tail;
  so.ced_boundary = r.boundary == "exact-source" ? CedBoundary::ExactSource : CedBoundary::GlobalKvOnly;
  auto state = model.new_sequence(so);
  if (!state.ok()) return fail(state.error().message);

  ForwardOptions fo;
  fo.pool = &r.pool;
  if (!r.dump_dir.empty()) fo.sink = [&r](const TensorRecord& t) { r.dump(t); };
  const int64_t n = static_cast<int64_t>(r.ids.size());
  const int64_t step = r.chunk > 0 ? r.chunk : std::max<int64_t>(n, 1);
  ForwardOutput all;
  all.vocab = model.config().vocab_size;
  for (int64_t p = 0; p < n; p += step) {
    const int64_t len = std::min(step, n - p);
    fo.logits = r.positions == "all" ? LogitRows::All : (p + len == n ? LogitRows::Last : LogitRows::None);
    auto out = model.forward(std::span<const int64_t>(r.ids).subspan(static_cast<size_t>(p), static_cast<size_t>(len)),
                               *state, fo);
    if (!out.ok()) return fail(out.error().message);
    all.positions.insert(all.positions.end(), out->positions.begin(), out->positions.end());
    all.logits.insert(all.logits.end(), out->logits.begin(), out->logits.end());
  }
  if (!r.dump.error.empty()) return fail(r.dump.error);

  const std::vector<int64_t> shape = {static_cast<int64_t>(all.positions.size()), all.vocab};
  if (r.a.has("logits-out")) {
    if (Status st = io::write_npy(r.a.get("logits-out"), all.logits, shape); !st.ok()) return fail(st.error().message);
  }
  if (!r.dump_dir.empty()) {
    if (Status st = r.dump.write(r.dump_dir); !st.ok()) return fail(st.error().message);
  }
  nlohmann::json summary = {{"model", r.path.string()},
                            {"mode", std::string(forward_mode_name(r.mode))},
                            {"tokens", n},
                            {"replay_start", state->replay_start()},
                            {"positions", all.positions},
                            {"shape", shape}};
  if (!all.positions.empty()) {  // argmax of the last row, a quick sanity check for humans
    const auto last = std::span<const float>(all.logits).last(static_cast<size_t>(all.vocab));
    summary["last_argmax"] = std::max_element(last.begin(), last.end()) - last.begin();
  }
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

}  // namespace

int cmd_forward(const Args& raw_args) {
  std::string dump_regex, dump_dir;
  auto args = take_dump_args(raw_args, dump_regex, dump_dir);
  if (!args.ok()) return usage_error(args.error().message);
  auto parsed = parse_args(kSpec, *args);
  if (!parsed.ok()) {
    if (parsed.error().message == "help") {
      std::printf("%s", usage(kSpec).c_str());
      return 0;
    }
    return usage_error(parsed.error().message);
  }
  const ParsedArgs& a = *parsed;
  if (!a.has("ids")) return usage_error("--ids is required");
  auto ids = parse_ids(a.get("ids"));
  if (!ids.ok()) return usage_error(ids.error().message);
  auto mode = parse_forward_mode(a.get("mode"));
  if (!mode.ok()) return usage_error(mode.error().message);
  const std::string positions = a.get("positions");
  if (positions != "all" && positions != "last") return usage_error("--positions must be all or last");
  const std::string boundary = a.get("ced-boundary");
  if (boundary != "exact-source" && boundary != "global-kv-only")
    return usage_error("--ced-boundary must be exact-source or global-kv-only");
  auto chunk = a.get_int("chunk");
  auto threads = a.get_int("threads");
  auto tail = a.get_int("ced-tail");
  for (const auto* r : {&chunk, &threads, &tail}) {
    if (!r->ok()) return usage_error(r->error().message);
    if (**r < 0) return usage_error("--chunk, --threads and --ced-tail must be >= 0");
  }
  DumpCollector dump;
  if (!dump_dir.empty()) {
    try {
      dump.pattern = std::regex(dump_regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return usage_error("--dump-tensors: invalid regex '" + dump_regex + "': " + e.what());
    }
  }

  auto path = model_path(a);
  if (!path.ok()) return fail(path.error().message);
  std::error_code ec;
  if (!std::filesystem::exists(*path, ec)) return fail(path->string() + ": no such model directory or file");
  const std::filesystem::path dir = std::filesystem::is_directory(*path) ? *path : path->parent_path();
  auto config = load_model_config(dir);
  if (!config.ok()) return fail(config.error().message);
  ThreadPool pool(static_cast<int>(*threads));
  const LoadOptions lo{a.get("engram-map"), &pool};
  ForwardRun run{a, *ids, *mode, *chunk, *tail, positions, boundary, dump, dump_dir, pool, *path};
  if (config->arch == Arch::DeepseekV4) {
    auto model = DeepseekV4Model::load(*path, lo);
    if (!model.ok()) return fail(model.error().message);
    return run_forward(*model, run);
  }
  auto model = DeepseekV41Model::load(*path, lo);
  if (!model.ok()) return fail(model.error().message);
  return run_forward(*model, run);
}

}  // namespace cedar::cli
