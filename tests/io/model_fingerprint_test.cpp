// model_fingerprint on make-tiny checkpoints: seeds differ, copies agree, every sampled window and
// config.json are covered, unsampled bytes are not read (the cost bound), and missing / damaged
// inputs are errors that name the file.
#include "io/model_fingerprint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "model/tiny_checkpoint.h"

namespace cedar {
namespace {

namespace fs = std::filesystem;

class ModelFingerprint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(fs::temp_directory_path() / ("cedar-fingerprint-test-" + std::to_string(::getpid())));
    fs::create_directories(*root_);
    for (uint64_t seed : {0, 1}) {
      TinyCheckpointOptions o;
      o.seed = seed;
      o.tokenizer_files = false;
      const fs::path dir = *root_ / ("seed" + std::to_string(seed));
      fs::create_directories(dir);
      const Status s = write_tiny_checkpoint(o, dir);
      ASSERT_TRUE(s.ok()) << s.error().message;
    }
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*root_, ec);
    delete root_;
  }
  static fs::path seed(int s) { return *root_ / ("seed" + std::to_string(s)); }
  // A private copy of seed 0 to damage.
  fs::path copy_of_seed0(const std::string& name) {
    const fs::path dir = *root_ / name;
    fs::remove_all(dir);
    fs::copy(seed(0), dir, fs::copy_options::recursive);
    return dir;
  }
  static std::string fingerprint(const fs::path& dir) {
    auto f = model_fingerprint(dir);
    EXPECT_TRUE(f.ok()) << f.error().message;
    return f.ok() ? *f : std::string();
  }
  static fs::path root() { return *root_; }

 private:
  static fs::path* root_;
};
fs::path* ModelFingerprint::root_ = nullptr;

const char* kShard2 = "model-00002-of-00002.safetensors";

uint64_t data_offset(const fs::path& shard) {
  std::ifstream in(shard, std::ios::binary);
  uint8_t b[8] = {};
  in.read(reinterpret_cast<char*>(b), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return 8 + n;
}

void flip_byte(const fs::path& file, uint64_t offset) {
  std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5A);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  ASSERT_TRUE(f.good()) << file << " " << offset;
}

TEST_F(ModelFingerprint, TwoSeedsWithTheSameShapesDiffer) {
  const std::string a = fingerprint(seed(0)), b = fingerprint(seed(1));
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
  // Same shapes: the config files are identical, so the difference comes from the weights.
  std::ifstream c0(seed(0) / "config.json"), c1(seed(1) / "config.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(c0), {}), std::string(std::istreambuf_iterator<char>(c1), {}));
}

TEST_F(ModelFingerprint, IsStableAndDoesNotDependOnTheDirectory) {
  const std::string a = fingerprint(seed(0));
  EXPECT_EQ(fingerprint(seed(0)), a);
  EXPECT_EQ(fingerprint(copy_of_seed0("copy")), a);
}

TEST_F(ModelFingerprint, EverySampledWindowIsCovered) {
  const fs::path dir = copy_of_seed0("windows");
  const std::string base = fingerprint(dir);
  const fs::path shard = dir / kShard2;
  const uint64_t data = data_offset(shard);
  const auto ranges = fingerprint_sample_ranges(fs::file_size(shard) - data);
  ASSERT_EQ(ranges.size(), 5u) << "the tiny shard should be larger than five windows";
  for (const FingerprintRange& r : ranges) {
    for (uint64_t at : {r.offset, r.offset + r.bytes / 2, r.offset + r.bytes - 1}) {
      flip_byte(shard, data + at);
      EXPECT_NE(fingerprint(dir), base) << "data byte " << at;
      flip_byte(shard, data + at);  // restored
      EXPECT_EQ(fingerprint(dir), base);
    }
  }
  // A header byte (inside the JSON: a space of the padding or a digit) changes it too.
  flip_byte(shard, data - 1);
  EXPECT_NE(fingerprint(dir), base);
}

TEST_F(ModelFingerprint, UnsampledBytesAreNotRead) {
  // The cost bound: only headers and windows are read, so a byte between two windows is not seen.
  const fs::path dir = copy_of_seed0("unsampled");
  const std::string base = fingerprint(dir);
  const fs::path shard = dir / kShard2;
  const uint64_t data = data_offset(shard);
  const auto ranges = fingerprint_sample_ranges(fs::file_size(shard) - data);
  ASSERT_GE(ranges.size(), 2u);
  const uint64_t gap = (ranges[0].offset + ranges[0].bytes + ranges[1].offset) / 2;
  ASSERT_GT(ranges[1].offset, ranges[0].offset + ranges[0].bytes);
  flip_byte(shard, data + gap);
  EXPECT_EQ(fingerprint(dir), base);
}

TEST_F(ModelFingerprint, ConfigJsonAndARewrittenShardChangeIt) {
  const fs::path dir = copy_of_seed0("config");
  const std::string base = fingerprint(dir);
  flip_byte(dir / "config.json", 10);
  EXPECT_NE(fingerprint(dir), base);

  // Seed 1's shard has the same header and size as seed 0's: only the data bytes differ.
  const fs::path dir2 = copy_of_seed0("rewritten");
  fs::copy_file(seed(1) / kShard2, dir2 / kShard2, fs::copy_options::overwrite_existing);
  const std::string rewritten = fingerprint(dir2);
  EXPECT_NE(rewritten, base);
  EXPECT_NE(rewritten, fingerprint(seed(1)));
}

TEST_F(ModelFingerprint, SampleRangesStayInsideTheDataSection) {
  EXPECT_TRUE(fingerprint_sample_ranges(0).empty());
  const auto small = fingerprint_sample_ranges(1000);
  ASSERT_EQ(small.size(), 1u);
  EXPECT_EQ(small[0].offset, 0u);
  EXPECT_EQ(small[0].bytes, 1000u);
  for (uint64_t size : {5 * kFingerprintWindowBytes + 1, uint64_t{500} << 30, ~uint64_t{0} / 2}) {
    const auto r = fingerprint_sample_ranges(size);
    ASSERT_EQ(r.size(), 5u);
    EXPECT_EQ(r.front().offset, 0u);
    EXPECT_EQ(r.back().offset + r.back().bytes, size);
    for (size_t i = 1; i < r.size(); ++i) EXPECT_GE(r[i].offset, r[i - 1].offset + r[i - 1].bytes) << size;
  }
}

TEST_F(ModelFingerprint, MissingOrDamagedInputsAreErrorsNamingTheFile) {
  auto missing = model_fingerprint(root() / "no-such-dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("no-such-dir"), std::string::npos) << missing.error().message;

  const fs::path no_config = copy_of_seed0("no-config");
  fs::remove(no_config / "config.json");
  auto c = model_fingerprint(no_config);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("config.json"), std::string::npos) << c.error().message;

  const fs::path no_shard = copy_of_seed0("no-shard");
  fs::remove(no_shard / kShard2);
  auto s = model_fingerprint(no_shard);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find(kShard2), std::string::npos) << s.error().message;

  const fs::path truncated = copy_of_seed0("truncated");
  fs::resize_file(truncated / kShard2, 100);  // shorter than its header
  auto t = model_fingerprint(truncated);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find(kShard2), std::string::npos) << t.error().message;

  const fs::path no_weights = copy_of_seed0("no-weights");
  fs::remove(no_weights / "model.safetensors.index.json");
  auto w = model_fingerprint(no_weights);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().message.find("model.safetensors"), std::string::npos) << w.error().message;
}

}  // namespace
}  // namespace cedar
