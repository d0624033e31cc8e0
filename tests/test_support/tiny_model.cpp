#include "test_support/tiny_model.h"

#include <unistd.h>

#include <system_error>
#include <utility>

namespace cedar::test_support {

namespace fs = std::filesystem;

ScratchDir::ScratchDir(const std::string& name)
    : path_(fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
  fs::remove_all(path_);
  fs::create_directories(path_);
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

TinyCheckpointOptions tensors_only(Arch arch) {
  TinyCheckpointOptions o;
  o.arch = arch;
  o.tokenizer_files = false;
  return o;
}

void TinyV41Suite::SetUpTestSuite() {
  scratch_ = new ScratchDir(std::string("cedar-") + ::testing::UnitTest::GetInstance()->current_test_suite()->name());
  auto m = write_and_load<DeepseekV41Model>(tensors_only(), checkpoint());
  ASSERT_TRUE(m.ok()) << m.error().message;
  model_ = new DeepseekV41Model(std::move(*m));
}

void TinyV41Suite::TearDownTestSuite() {
  delete model_;
  model_ = nullptr;
  delete scratch_;
  scratch_ = nullptr;
}

std::vector<int64_t> xorshift_prompt(int64_t n, uint64_t seed, uint64_t salt) {
  std::vector<int64_t> ids;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + salt;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ids.push_back(static_cast<int64_t>(x % 128000));
  }
  return ids;
}

}  // namespace cedar::test_support
