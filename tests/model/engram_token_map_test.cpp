// Which Engram token map a deepseek_v41 model gets (model/engram_token_map.h): an explicit file, else the
// model directory's engram_token_map.npy, else the map built into cedar — never a file of the source tree.
// The built-in map is compared with the repo's .npy read here; the other sources are told apart by content.
#include "model/engram_token_map.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_support/repo_engram_map.h"
#include "test_support/tiny_model.h"
#include "text/engram_norm.h"

namespace cedar {
namespace {

namespace fs = std::filesystem;

class EngramTokenMapTest : public ::testing::Test {
 protected:
  EngramTokenMapTest() : scratch_("cedar-engram-token-map"), model_(scratch_.path() / "model") {
    fs::create_directories(model_);
  }
  fs::path write_map(const fs::path& path, const std::vector<int32_t>& map) {
    EXPECT_TRUE(text::save_engram_map_npy(map, path.string()).ok());
    return path;
  }
  test_support::ScratchDir scratch_;
  fs::path model_;
};

TEST_F(EngramTokenMapTest, WithoutAModelFileTheBuiltInMapIsUsed) {
  ASSERT_FALSE(fs::exists(model_ / kModelEngramMapFile));
  auto r = resolve_engram_map(model_, {});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->file.empty()) << r->file;
  EXPECT_EQ(r->source(), "cedar's built-in Engram token map (assets/engram/deepseek_v41_token_map.npy)");
  const std::vector<int32_t> want = test_support::read_repo_engram_map().values;
  ASSERT_EQ(want.size(), 129280u);
  EXPECT_EQ(r->map, want);
}

TEST_F(EngramTokenMapTest, AModelFileComesBeforeTheBuiltInMap) {
  const fs::path local = write_map(model_ / kModelEngramMapFile, {0, 1, 1});
  auto r = resolve_engram_map(model_, {});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->file, local);
  EXPECT_EQ(r->source(), local.string());
  EXPECT_EQ(r->map, (std::vector<int32_t>{0, 1, 1}));
}

TEST_F(EngramTokenMapTest, AnExplicitFileComesFirst) {
  write_map(model_ / kModelEngramMapFile, {0, 1, 1});
  const fs::path explicit_file = write_map(scratch_.path() / "explicit.npy", {0, 0, 1, 2});
  auto r = resolve_engram_map(model_, explicit_file);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->file, explicit_file);
  EXPECT_EQ(r->map, (std::vector<int32_t>{0, 0, 1, 2}));
}

TEST_F(EngramTokenMapTest, ABadExplicitFileIsAnErrorNamingIt) {
  const fs::path missing = scratch_.path() / "no-such-map.npy";
  auto r = resolve_engram_map(model_, missing);  // no fallback to the model's file or the built-in map
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("Engram token map: cannot open '" + missing.string() + "'"), std::string::npos)
      << r.error().message;

  const fs::path garbage = scratch_.path() / "garbage.npy";
  std::ofstream(garbage, std::ios::binary) << "not numpy";
  auto g = resolve_engram_map(model_, garbage);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("'" + garbage.string() + "' is not an int32 .npy vector"), std::string::npos)
      << g.error().message;
}

TEST_F(EngramTokenMapTest, ABadModelFileIsAnErrorNamingIt) {
  const fs::path local = model_ / kModelEngramMapFile;
  std::ofstream(local, std::ios::binary) << "not numpy";
  auto r = resolve_engram_map(model_, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(local.string()), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace cedar
