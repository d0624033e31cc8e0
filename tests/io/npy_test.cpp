// .npy writer/reader against files written by numpy.save (NumPy 2.4.6; the hex strings below are its
// output for the arrays named in each test) and against malformed inputs.
#include "io/npy.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

namespace cedar::io {
namespace {

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<uint8_t> read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// np.save(np.arange(6, dtype='<f4').reshape(2, 3))
const char kF32_2x3[] =
    "934e554d5059010076007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a2046616c73652c2027736861"
    "7065273a2028322c2033292c207d2020202020202020202020202020202020202020202020202020202020202020202020202020202020"
    "20202020202020202020202020202020200a000000000000803f0000004000004040000080400000a040";
// np.save(np.array([7, -1], dtype='<i8'))
const char kI64_2[] =
    "934e554d5059010076007b276465736372273a20273c6938272c2027666f727472616e5f6f72646572273a2046616c73652c2027736861"
    "7065273a2028322c292c207d20202020202020202020202020202020202020202020202020202020202020202020202020202020202020"
    "20202020202020202020202020202020200a0700000000000000ffffffffffffffff";
// np.save(np.array([5, 6, 7], dtype='<i4'))
const char kI32_3[] =
    "934e554d5059010076007b276465736372273a20273c6934272c2027666f727472616e5f6f72646572273a2046616c73652c2027736861"
    "7065273a2028332c292c207d20202020202020202020202020202020202020202020202020202020202020202020202020202020202020"
    "20202020202020202020202020202020200a050000000600000007000000";

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("cedar_npy_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(NpyTest, WritesExactlyWhatNumpySaves) {
  const std::vector<float> f = {0, 1, 2, 3, 4, 5};
  const std::vector<int64_t> s23 = {2, 3};
  ASSERT_TRUE(write_npy(dir_ / "a.npy", f, s23).ok());
  EXPECT_EQ(read_bytes(dir_ / "a.npy"), from_hex(kF32_2x3));

  const std::vector<int64_t> i = {7, -1};
  const std::vector<int64_t> s2 = {2};
  ASSERT_TRUE(write_npy(dir_ / "b.npy", i, s2).ok());
  EXPECT_EQ(read_bytes(dir_ / "b.npy"), from_hex(kI64_2));

  const std::vector<int32_t> j = {5, 6, 7};
  const std::vector<int64_t> s3 = {3};
  ASSERT_TRUE(write_npy(dir_ / "c.npy", j, s3).ok());
  EXPECT_EQ(read_bytes(dir_ / "c.npy"), from_hex(kI32_3));
}

TEST_F(NpyTest, ReadsNumpyFiles) {
  auto a = parse_npy(from_hex(kF32_2x3), "a");
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*a->as_f32(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  auto b = parse_npy(from_hex(kI64_2), "b");
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(*b->as_i64(), (std::vector<int64_t>{7, -1}));
  auto c = parse_npy(from_hex(kI32_3), "c");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(*c->as_i64(), (std::vector<int64_t>{5, 6, 7}));
  EXPECT_FALSE(c->as_f32().ok());
}

TEST_F(NpyTest, RejectsMalformedFiles) {
  std::vector<uint8_t> good = from_hex(kF32_2x3);
  auto message = [](std::vector<uint8_t> bytes) {
    auto r = parse_npy(bytes, "x.npy");
    return r.ok() ? std::string("ok") : r.error().message;
  };
  std::vector<uint8_t> truncated(good.begin(), good.end() - 1);
  EXPECT_NE(message(truncated).find("payload of 23 bytes for 6 elements"), std::string::npos) << message(truncated);
  std::vector<uint8_t> magic = good;
  magic[1] = 'X';
  EXPECT_NE(message(magic).find("no NumPy magic"), std::string::npos);
  std::vector<uint8_t> f8 = good;
  f8[23] = '8';  // '<f4' -> '<f8'
  EXPECT_NE(message(f8).find("dtype '<f8'"), std::string::npos) << message(f8);
  std::vector<uint8_t> version = good;
  version[6] = 4;
  EXPECT_NE(message(version).find("format version 4"), std::string::npos);
  EXPECT_NE(message({0x93, 'N'}).find("no NumPy magic"), std::string::npos);
}

TEST_F(NpyTest, WriteChecksTheShape) {
  const std::vector<float> f = {1, 2, 3};
  const std::vector<int64_t> shape = {2, 2};
  const Status s = write_npy(dir_ / "bad.npy", f, shape);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("3 values for a shape of 4 elements"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "bad.npy"));
}

TEST_F(NpyTest, RoundTripsZeroSizedAndScalarArrays) {
  const std::vector<int64_t> empty_shape = {0, 7};
  ASSERT_TRUE(write_npy(dir_ / "e.npy", std::span<const float>(), empty_shape).ok());
  auto e = read_npy(dir_ / "e.npy");
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(e->shape, empty_shape);
  EXPECT_EQ(e->numel(), 0);
  const std::vector<float> one = {2.5f};
  ASSERT_TRUE(write_npy(dir_ / "s.npy", one, std::span<const int64_t>()).ok());
  auto s = read_npy(dir_ / "s.npy");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(*s->as_f32(), one);
}

}  // namespace
}  // namespace cedar::io
