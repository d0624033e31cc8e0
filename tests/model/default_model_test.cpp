// The embedded default model: created on first use under the cache root, reused afterwards, rebuilt
// when the directory is not a finished one, and safe when several callers race to create it.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/config.h"
#include "model/default_model.h"

namespace cedar {
namespace {

namespace fs = std::filesystem;

// Points $CEDAR_HOME at a fresh directory for one test and restores the environment afterwards.
class DefaultModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* var : {"CEDAR_HOME", "XDG_CACHE_HOME", "HOME"}) {
      const char* v = std::getenv(var);
      saved_.push_back({var, v ? std::optional<std::string>(v) : std::nullopt});
    }
    home_ = fs::temp_directory_path() / ("cedar-home-" + std::to_string(::getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(home_);
    ::setenv("CEDAR_HOME", home_.c_str(), 1);
  }
  void TearDown() override {
    for (const auto& [var, value] : saved_) {
      if (value) ::setenv(var, value->c_str(), 1);
      else ::unsetenv(var);
    }
    std::error_code ec;
    fs::remove_all(home_, ec);
  }
  fs::path expected_dir() const { return home_ / "models" / "tiny-deepseek_v41-seed0"; }

  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
  fs::path home_;
};

TEST_F(DefaultModelTest, CacheRootFollowsTheEnvironment) {
  auto a = cedar_cache_root();
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, home_);
  ::unsetenv("CEDAR_HOME");
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(*cedar_cache_root(), fs::path("/xdg/cedar"));
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(*cedar_cache_root(), fs::path("/home/someone/.cache/cedar"));
  ::unsetenv("HOME");
  auto none = cedar_cache_root();
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("CEDAR_HOME"), std::string::npos);
}

TEST_F(DefaultModelTest, CreatedOnceThenReused) {
  auto first = ensure_default_model();
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(*first, expected_dir());
  auto config = load_model_config(*first);
  ASSERT_TRUE(config.ok()) << config.error().message;
  EXPECT_EQ(config->arch, Arch::DeepseekV41);
  EXPECT_TRUE(config->quant.quantized());

  const auto stamp = fs::last_write_time(*first / "config.json");
  auto second = ensure_default_model();
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, *first);
  EXPECT_EQ(fs::last_write_time(*second / "config.json"), stamp) << "the cached model was rebuilt";
  for (const auto& e : fs::directory_iterator(expected_dir().parent_path()))
    EXPECT_EQ(e.path(), expected_dir()) << "left behind: " << e.path();
}

TEST_F(DefaultModelTest, UnfinishedDirectoryIsReplaced) {
  // What a crash in the middle of writing by hand would leave: files but no completion marker.
  fs::create_directories(expected_dir());
  std::ofstream(expected_dir() / "config.json") << "{ half written";
  auto dir = ensure_default_model();
  ASSERT_TRUE(dir.ok()) << dir.error().message;
  auto config = load_model_config(*dir);
  EXPECT_TRUE(config.ok()) << config.error().message;
}

TEST_F(DefaultModelTest, ConcurrentCallersAllGetTheFinishedModel) {
  std::vector<std::future<Result<fs::path>>> calls;
  for (int i = 0; i < 2; ++i) calls.push_back(std::async(std::launch::async, [] { return ensure_default_model(); }));
  for (auto& c : calls) {
    auto r = c.get();
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(*r, expected_dir());
  }
  EXPECT_TRUE(load_model_config(expected_dir()).ok());
  for (const auto& e : fs::directory_iterator(expected_dir().parent_path()))
    EXPECT_EQ(e.path(), expected_dir()) << "left behind: " << e.path();
}

}  // namespace
}  // namespace cedar
