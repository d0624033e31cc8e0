// What the CPU model benchmarks share: the make-tiny model of a profile, built once into a temporary
// folder, and a fixed prompt.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "model/deepseek_v41.h"
#include "model/tiny_checkpoint.h"

namespace cedar::bench {

// Benchmark argument 0 → profile "tiny" (d 64), anything else → "small" (d 512).
inline const char* profile_of(int64_t arg) { return arg == 0 ? "tiny" : "small"; }

// A fixed prompt of n real token ids.
inline std::vector<int64_t> ids(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back((i * 7919 + 13) % 120000);
  return v;
}

// Writes the make-tiny checkpoint of `profile` (tensors and config.json) into <temp>/<tag>-<profile>-<pid>,
// runs `on_files` on the folder for what needs the files themselves (false: give up), loads the model and
// removes the folder (the model keeps its files mapped). Null when any step fails.
inline std::unique_ptr<DeepseekV41Model> load_tiny_profile(
    const std::string& profile, const std::string& tag,
    const std::function<bool(const std::filesystem::path&)>& on_files = {}) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / (tag + "-" + profile + "-" + std::to_string(::getpid()));
  TinyCheckpointOptions options;
  options.profile = profile;
  options.tokenizer_files = false;
  std::unique_ptr<DeepseekV41Model> model;
  if (make_tiny_checkpoint(options, dir, true).ok() && (!on_files || on_files(dir))) {
    auto loaded = DeepseekV41Model::load(dir);
    if (loaded.ok()) model = std::make_unique<DeepseekV41Model>(std::move(*loaded));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return model;
}

}  // namespace cedar::bench
