// Writing a tiny checkpoint directory, atomically, and checking it with cedar's own reader.
#include "model/tiny_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "core/threads.h"
#include "model/inventory.h"
#include "model/weights.h"
#include "model/tokenizer_source.h"

namespace cedar {
namespace {

namespace fs = std::filesystem;

Result<std::string> read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot open " + path.string());
  std::ostringstream os;
  os << in.rdbuf();
  if (!in.good() && !in.eof()) return make_error("cannot read " + path.string());
  return os.str();
}

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) return make_error("cannot write " + path.string());
  return Status::Ok();
}

std::string error_text(const std::error_code& ec) { return ec.message(); }

// The perf profile's ~24 GB: generated and written in parallel, chunk by chunk (perf_tensors).
Status write_perf_shards(const ModelConfig& config, const LayerPlan& plan, const TinyCheckpointOptions& o,
                         const std::string& tag, const fs::path& dir) {
  CEDAR_ASSIGN_OR_RETURN(std::vector<io::StreamedTensor> tensors, perf_tensors(config, plan, o.seed));
  CEDAR_ASSIGN_OR_RETURN(const std::vector<WeightSpec> specs, expected_weights(config, plan));
  uint64_t total = 0;
  for (const WeightSpec& w : specs) total += w.nbytes();
  constexpr uint64_t kShardBytes = uint64_t{4} << 30;
  ThreadPool pool(o.threads);
  io::StreamedWriteOptions wo;
  wo.n_shards = std::max<int>(o.n_shards, static_cast<int>((total + kShardBytes - 1) / kShardBytes));
  wo.metadata = {{"format", "pt"}, {"cedar_tiny", tag}};
  wo.pool = &pool;
  return io::write_streamed_sharded(dir, tensors, wo);
}

}  // namespace

Status write_tiny_checkpoint(const TinyCheckpointOptions& o, const fs::path& dir) {
  CEDAR_ASSIGN_OR_RETURN(const ModelConfig config, tiny_model_config(o.arch, o.profile, o.bf16));
  CEDAR_ASSIGN_OR_RETURN(const LayerPlan plan, build_layer_plan(config));
  const std::string tag = std::string(arch_name(o.arch)) + " profile=" + o.profile + " seed=" + std::to_string(o.seed) +
                          (o.bf16 ? " bf16" : "");
  if (o.profile == "perf") {
    CEDAR_RETURN_IF_ERROR(write_perf_shards(config, plan, o, tag, dir));
  } else {
    CEDAR_ASSIGN_OR_RETURN(io::SafetensorsWriter writer, tiny_tensors(config, plan, o.seed));
    writer.set_metadata("format", "pt");
    writer.set_metadata("cedar_tiny", tag);
    CEDAR_RETURN_IF_ERROR(writer.write_sharded(dir, o.n_shards));
  }
  CEDAR_RETURN_IF_ERROR(write_text(dir / "config.json", to_hf_config_json(config).dump(2) + "\n"));

  if (!o.tokenizer_files) return Status::Ok();

  CEDAR_ASSIGN_OR_RETURN(const fs::path tokenizer_path, find_tokenizer_json(o.tokenizer));
  CEDAR_ASSIGN_OR_RETURN(const std::string v4_text, read_text(tokenizer_path));
  CEDAR_ASSIGN_OR_RETURN(const TokenizerFiles files, tokenizer_files_for(config, v4_text, tokenizer_path.string()));
  CEDAR_RETURN_IF_ERROR(write_text(dir / "tokenizer.json", files.tokenizer_json));
  return write_text(dir / "tokenizer_config.json", files.tokenizer_config_json);
}

Status verify_tiny_checkpoint(const fs::path& dir) {
  CEDAR_ASSIGN_OR_RETURN(const ModelConfig config, load_model_config(dir));
  CEDAR_ASSIGN_OR_RETURN(const LayerPlan plan, build_layer_plan(config));
  CEDAR_ASSIGN_OR_RETURN(const std::vector<WeightSpec> expected, expected_weights(config, plan));
  CEDAR_ASSIGN_OR_RETURN(const io::Checkpoint ckpt, io::Checkpoint::open(dir));
  return check_inventory(expected, ckpt, inventory_options(config, plan));
}

Result<fs::path> stage_tiny_checkpoint(const TinyCheckpointOptions& options, const fs::path& final_path) {
  const fs::path parent = final_path.parent_path().empty() ? fs::path(".") : final_path.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return make_error("cannot create " + parent.string() + ": " + error_text(ec));
  // A sibling of the target, so the final rename stays on one filesystem; random so that concurrent
  // writers (processes or threads) never share one.
  std::random_device random;
  fs::path tmp;
  for (int attempt = 0;; ++attempt) {
    const uint64_t tag = (static_cast<uint64_t>(random()) << 32) ^ random();
    std::string name = final_path.filename().string();
    name.insert(0, 1, '.');
    name += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(tag);
    tmp = parent / name;
    if (fs::create_directory(tmp, ec)) break;
    if (ec || attempt == 8) return make_error("cannot create a temporary directory in " + parent.string() +
                                              (ec ? ": " + error_text(ec) : std::string()));
  }
  Status st = write_tiny_checkpoint(options, tmp);
  if (st.ok()) {
    st = verify_tiny_checkpoint(tmp);
    if (!st.ok()) st = st.error().with_context("make-tiny wrote a checkpoint that cedar rejects");
  }
  if (!st.ok()) {
    fs::remove_all(tmp, ec);
    return st.error();
  }
  return tmp;
}

Status make_tiny_checkpoint(const TinyCheckpointOptions& options, const fs::path& out, bool force) {
  std::error_code ec;
  fs::path target = fs::absolute(out, ec).lexically_normal();
  if (ec) return make_error("bad output path " + out.string() + ": " + error_text(ec));
  if (!target.has_filename()) target = target.parent_path();  // "dir/" names dir
  if (!target.has_filename()) return make_error("bad output path " + out.string());
  const bool exists = fs::exists(fs::symlink_status(target, ec));
  if (exists) {
    if (!fs::is_directory(target, ec)) return make_error(target.string() + " exists and is not a directory");
    if (!fs::is_empty(target, ec) && !force)
      return make_error(target.string() + " is not empty (use --force to replace it)");
  }
  CEDAR_ASSIGN_OR_RETURN(const fs::path tmp, stage_tiny_checkpoint(options, target));
  if (exists) {  // move the old one aside first: rename() only replaces an empty directory
    const fs::path old = tmp.string() + ".old";
    fs::rename(target, old, ec);
    if (ec) {
      fs::remove_all(tmp, ec);
      return make_error("cannot replace " + target.string() + ": " + error_text(ec));
    }
    fs::remove_all(old, ec);
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    const std::string why = error_text(ec);
    fs::remove_all(tmp, ec);
    return make_error("cannot move the checkpoint into " + target.string() + ": " + why);
  }
  return Status::Ok();
}

}  // namespace cedar
