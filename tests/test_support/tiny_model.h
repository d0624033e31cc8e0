// Shared fixtures of the tests that run cedar's tiny checkpoint: a scratch folder, writing and loading a
// tiny checkpoint of either architecture, the suite base that shares one tiny DeepSeek-V4.1 model, and
// the pseudo-random prompts the forward and engine tests feed.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/deepseek_v41.h"
#include "model/tiny_checkpoint.h"

namespace cedar::test_support {

// A folder <temp>/<name>-<pid> (the pid keeps parallel test processes apart), emptied on creation and
// removed with everything in it on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The tiny checkpoint of `arch` with tensors and config.json only (what the forward needs).
TinyCheckpointOptions tensors_only(Arch arch = Arch::DeepseekV41);

// make_tiny_checkpoint(options) into `dir` (which must not exist), then Model::load(dir).
template <class Model>
Result<Model> write_and_load(const TinyCheckpointOptions& options, const std::filesystem::path& dir) {
  CEDAR_RETURN_IF_ERROR(make_tiny_checkpoint(options, dir, false));
  return Model::load(dir);
}

// Base of the test suites that share one tiny DeepSeek-V4.1 model (seed 0, tensors only): SetUpTestSuite
// writes it to checkpoint() in a scratch folder named after the suite and loads it; TearDownTestSuite
// frees it and removes the folder. A suite that sets up more calls these first and last.
class TinyV41Suite : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
  static const std::filesystem::path& root() { return scratch_->path(); }  // the scratch folder
  static std::filesystem::path checkpoint() { return root() / "tiny"; }

  static inline ScratchDir* scratch_ = nullptr;
  static inline DeepseekV41Model* model_ = nullptr;
};

// `n` token ids below 128000 (no special tokens) from a xorshift64 stream that starts at
// seed * 0x9E3779B97F4A7C15 + salt.
std::vector<int64_t> xorshift_prompt(int64_t n, uint64_t seed, uint64_t salt);

}  // namespace cedar::test_support
