// Malformed safetensors files and checkpoints: every case must be an Error that names the file (and the
// tensor, where there is one). Inputs are built by hand, byte by byte, independent of cedar's writer.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "safetensors_test_util.h"

namespace cedar::io {
namespace {

using testing::fails_with;
using testing::make_file;
using testing::TempDir;
using testing::write_bytes;
using testing::write_text;

constexpr const char* kLabel = "bad.safetensors";

std::vector<uint8_t> length_only(uint64_t len, std::string_view rest) {
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(len >> (8 * i));
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

// An entry {"dtype": D, "shape": S, "data_offsets": O} for tensor `name`.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":" + dtype + ",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

struct BadCase {
  std::string name;
  std::vector<uint8_t> file;
  std::vector<std::string> expected;  // substrings of the error besides the label
};

// gtest prints parameters in test listings; the case name is what identifies one.
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

BadCase json_case(std::string name, const std::string& header, size_t data, std::vector<std::string> expected,
                  bool pad = true) {
  return {std::move(name), make_file(header, data, pad), std::move(expected)};
}

std::vector<BadCase> bad_cases() {
  const std::string w_ok = entry("w", "\"F32\"", "[2]", "[0,8]");
  return {
      {"EmptyFile", {}, {"file is 0 bytes, too short for the 8-byte header length"}},
      {"ShorterThanLengthField", {1, 2, 3, 4, 5}, {"file is 5 bytes"}},
      {"HeaderLongerThanFile", length_only(100, "{}"), {"header length 100 runs past the end of the file (10 bytes)"}},
      {"HeaderOverSizeLimit", length_only(100'000'001, "{}"), {"header length 100000001 exceeds the limit of 100000000"}},
      {"HeaderLengthMaxU64", length_only(~uint64_t{0}, "{}"), {"header length 18446744073709551615 exceeds"}},
      {"EmptyHeader", length_only(0, ""), {"invalid JSON in header"}},
      json_case("TruncatedJsonInEntry", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2]", 0,
                {"invalid JSON in header (in tensor 'w')"}),
      json_case("TrailingCommaInShape", "{" + entry("w", "\"F32\"", "[2,]", "[0,8]") + "}", 8,
                {"invalid JSON in header (in tensor 'w')"}),
      json_case("TrailingGarbage", "{} x", 0, {"invalid JSON in header"}),
      json_case("UnterminatedLongString", "{\"" + std::string(5000, 'n'), 0, {"invalid JSON in header", "…"}),
      {"NulPadding", make_file(std::string("{}\0\0\0\0\0\0", 8), 0, false), {"invalid JSON in header: NUL byte at header offset 2"}},
      {"NulThenGarbage", make_file(std::string("{}\0garbage", 10), 0), {"invalid JSON in header: NUL byte"}},
      json_case("InvalidUtf8InName", "{\"w\xff\":{}}", 0, {"invalid JSON in header"}),
      json_case("NotAnObjectArray", "[1]", 0, {"header is not a JSON object (it is an array)"}),
      json_case("NotAnObjectString", "\"x\"", 0, {"header is not a JSON object (it is a string)"}),
      json_case("NotAnObjectNumber", "7", 0, {"header is not a JSON object (it is 7)"}),
      json_case("EntryIsArray", "{\"w\":[0]}", 0, {"tensor 'w': entry must be a JSON object, got an array"}),
      json_case("EntryIsNumber", "{\"w\":3}", 0, {"tensor 'w': entry must be a JSON object, got 3"}),
      json_case("MissingDtype", "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, {"tensor 'w': missing \"dtype\""}),
      json_case("MissingShape", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8,
                {"tensor 'w': missing \"shape\""}),
      json_case("MissingOffsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8,
                {"tensor 'w': missing \"data_offsets\""}),
      json_case("DtypeNumber", "{" + entry("w", "5", "[2]", "[0,8]") + "}", 8,
                {"tensor 'w': \"dtype\" must be a string, got 5"}),
      json_case("DtypeArray", "{" + entry("w", "[\"F32\"]", "[2]", "[0,8]") + "}", 8,
                {"tensor 'w': \"dtype\" must be a string, got an array"}),
      json_case("UnknownDtype", "{" + entry("w", "\"Q8\"", "[2]", "[0,2]") + "}", 2, {"tensor 'w': unknown dtype 'Q8'"}),
      json_case("DtypeCedarDoesNotKnow", "{" + entry("w", "\"F4\"", "[2]", "[0,1]") + "}", 1,
                {"tensor 'w': unknown dtype 'F4'"}),
      json_case("DtypeWrongCase", "{" + entry("w", "\"f32\"", "[2]", "[0,8]") + "}", 8, {"unknown dtype 'f32'"}),
      json_case("ShapeString", "{" + entry("w", "\"F32\"", "\"2\"", "[0,8]") + "}", 8,
                {"tensor 'w': \"shape\" must be an array of integers, got a string"}),
      json_case("ShapeObject", "{" + entry("w", "\"F32\"", "{}", "[0,8]") + "}", 8,
                {"tensor 'w': \"shape\" must be an array of integers, got an object"}),
      json_case("ShapeNegative", "{" + entry("w", "\"U8\"", "[-2]", "[0,2]") + "}", 2,
                {"tensor 'w': shape[0] must be an integer in [0, 2^63), got -2"}),
      json_case("ShapeFloat", "{" + entry("w", "\"U8\"", "[1,2.0]", "[0,2]") + "}", 2, {"shape[1]", "got 2.0"}),
      json_case("ShapeBool", "{" + entry("w", "\"U8\"", "[true]", "[0,1]") + "}", 1, {"shape[0]", "got a boolean"}),
      json_case("ShapeNested", "{" + entry("w", "\"U8\"", "[[1]]", "[0,1]") + "}", 1,
                {"tensor 'w': shape[0] must be an integer, got an array"}),
      json_case("ShapeDimAbove2To63", "{" + entry("w", "\"U8\"", "[9223372036854775808]", "[0,1]") + "}", 1,
                {"tensor 'w': shape[0]", "got 9223372036854775808"}),
      json_case("ShapeDimAboveU64", "{" + entry("w", "\"U8\"", "[18446744073709551616]", "[0,1]") + "}", 1,
                {"tensor 'w': shape[0]", "got 18446744073709551616"}),
      json_case("ShapeElementCountOverflows", "{" + entry("w", "\"U8\"", "[4294967296,4294967296]", "[0,1]") + "}", 1,
                {"tensor 'w': shape [4294967296, 4294967296] has too many elements"}),
      json_case("ShapeByteCountOverflows", "{" + entry("w", "\"F64\"", "[2305843009213693952]", "[0,8]") + "}", 8,
                {"tensor 'w': shape [2305843009213693952] of F64 overflows 64 bits in bytes"}),
      json_case("OffsetsString", "{" + entry("w", "\"F32\"", "[2]", "\"0\"") + "}", 8,
                {"tensor 'w': \"data_offsets\" must be an array of integers, got a string"}),
      json_case("OffsetsOneEntry", "{" + entry("w", "\"F32\"", "[2]", "[0]") + "}", 8,
                {"tensor 'w': \"data_offsets\" must have exactly 2 entries, got 1"}),
      json_case("OffsetsThreeEntries", "{" + entry("w", "\"F32\"", "[2]", "[0,8,8]") + "}", 8,
                {"tensor 'w': \"data_offsets\" must have exactly 2 entries, got 3"}),
      json_case("OffsetsNegative", "{" + entry("w", "\"F32\"", "[2]", "[-1,7]") + "}", 8,
                {"tensor 'w': data_offsets[0] must be a non-negative integer, got -1"}),
      json_case("OffsetsFloat", "{" + entry("w", "\"F32\"", "[2]", "[0,8.5]") + "}", 8,
                {"tensor 'w': data_offsets[1] must be a non-negative integer, got 8.5"}),
      json_case("OffsetsReversed", "{" + entry("w", "\"F32\"", "[0]", "[8,0]") + "}", 8,
                {"tensor 'w': data_offsets [8, 0] end before they begin"}),
      json_case("SizeMismatch", "{" + entry("w", "\"F32\"", "[2]", "[0,4]") + "}", 4,
                {"tensor 'w': F32 [2] needs 8 bytes but data_offsets [0, 4] span 4"}),
      json_case("OffsetsPastEndOfFile", "{" + w_ok + "}", 5,
                {"tensor 'w': data_offsets [0, 8] run past the end of the data section (5 bytes; is the file truncated?)"}),
      json_case("OffsetsBeyondU64Arithmetic",
                "{" + entry("w", "\"U8\"", "[0]", "[18446744073709551615,18446744073709551615]") + "}", 0,
                {"tensor 'w': data_offsets [18446744073709551615, 18446744073709551615] run past the end"}),
      json_case("Overlap",
                "{" + entry("a", "\"U8\"", "[8]", "[0,8]") + "," + entry("b", "\"U8\"", "[8]", "[4,12]") + "}", 12,
                {"tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]"}),
      json_case("SameOffsets",
                "{" + entry("a", "\"U8\"", "[4]", "[0,4]") + "," + entry("b", "\"U8\"", "[4]", "[0,4]") + "}", 4,
                {"data_offsets [0, 4] overlap tensor '"}),
      json_case("GapBetweenTensors",
                "{" + entry("a", "\"U8\"", "[4]", "[0,4]") + "," + entry("b", "\"U8\"", "[4]", "[6,10]") + "}", 10,
                {"tensor 'b': data_offsets [6, 10] leave a gap of 2 bytes after tensor 'a' (which ends at 4)"}),
      json_case("GapAtStart", "{" + entry("a", "\"U8\"", "[4]", "[2,6]") + "}", 6,
                {"tensor 'a': data_offsets [2, 6] leave a gap of 2 bytes at the start of the data section"}),
      json_case("TrailingDataBytes", "{" + entry("a", "\"U8\"", "[4]", "[0,4]") + "}", 6,
                {"the data section has 2 bytes after the last tensor ('a') that no tensor covers"}),
      json_case("DataWithoutTensors", "{}", 3, {"the data section has 3 bytes after the last tensor"}),
      json_case("DuplicateTensor", "{" + w_ok + "," + w_ok + "}", 8, {"tensor 'w' appears twice in the header"}),
      json_case("DuplicateField", "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                {"tensor 'w': duplicate field \"dtype\""}),
      json_case("DuplicateMetadata", "{\"__metadata__\":{},\"__metadata__\":{}}", 0,
                {"\"__metadata__\" appears twice"}),
      json_case("DuplicateMetadataKey", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0,
                {"\"__metadata__\" has key 'k' twice"}),
      json_case("MetadataArray", "{\"__metadata__\":[]}", 0,
                {"\"__metadata__\" must be an object of strings, got an array"}),
      json_case("MetadataNumber", "{\"__metadata__\":1}", 0, {"\"__metadata__\" must be an object of strings, got 1"}),
      json_case("MetadataValueNumber", "{\"__metadata__\":{\"k\":1}}", 0,
                {"\"__metadata__\" key 'k' must have a string value, got 1"}),
      json_case("MetadataValueObject", "{\"__metadata__\":{\"k\":{}}}", 0,
                {"\"__metadata__\" key 'k' must have a string value, got an object"}),
      json_case("NestedTooDeep",
                "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0],\"x\":" + std::string(100, '[') +
                    std::string(100, ']') + "}}",
                0, {"header JSON nests deeper than 64 levels"}),
  };
}

class MalformedHeader : public ::testing::TestWithParam<BadCase> {};

TEST_P(MalformedHeader, IsAnErrorNamingFileAndTensor) {
  const BadCase& c = GetParam();
  auto r = parse_safetensors(c.file, kLabel);
  ASSERT_FALSE(r.ok()) << c.name << " was accepted";
  const std::string& msg = r.error().message;
  EXPECT_LT(msg.size(), 600u) << "error messages stay short";
  EXPECT_EQ(msg.rfind(std::string(kLabel) + ": ", 0), 0u) << msg;
  for (const auto& part : c.expected) EXPECT_NE(msg.find(part), std::string::npos) << "missing \"" << part << "\" in: " << msg;
}

INSTANTIATE_TEST_SUITE_P(Safetensors, MalformedHeader, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& p) { return p.param.name; });

// Inputs the official crate accepts are accepted too.
TEST(Safetensors, AcceptsWhatTheOfficialCrateAccepts) {
  struct Good {
    std::string header;
    size_t data;
    bool pad;
    std::vector<std::string> names_in_data_order;
  };
  const std::vector<Good> cases = {
      {" \n{" + entry("a", "\"U8\"", "[2]", "[0,2]") + "}", 2, true, {"a"}},  // leading whitespace
      {"{" + entry("a", "\"U8\"", "[3]", "[0,3]") + "}", 3, false, {"a"}},   // no padding
      {"{\"a\":{\"dtype\":\"U8\",\"extra\":{\"x\":[1,{\"y\":null}]},\"shape\":[2],\"data_offsets\":[0,2]}}", 2, true,
       {"a"}},                                                                   // unknown fields are ignored
      {"{\"__metadata__\":null," + entry("a", "\"U8\"", "[2]", "[0,2]") + "}", 2, true, {"a"}},
      {"{" + entry("z", "\"U8\"", "[0]", "[0,0]") + "," + entry("y", "\"U8\"", "[0,5]", "[0,0]") + "," +
           entry("x", "\"U8\"", "[1]", "[0,1]") + "}",
       1, true, {"z", "y", "x"}},  // zero-byte tensors may share an offset
      {"{" + entry("b", "\"U8\"", "[1]", "[2,3]") + "," + entry("a", "\"U8\"", "[2]", "[0,2]") + "}", 3, true,
       {"a", "b"}},  // header order need not be data order
      {"{" + entry("s", "\"F32\"", "[]", "[0,4]") + "}", 4, true, {"s"}},  // a scalar
      {"{}", 0, true, {}},
  };
  for (const Good& g : cases) {
    auto r = parse_safetensors(make_file(g.header, g.data, g.pad), kLabel);
    ASSERT_TRUE(r.ok()) << g.header << ": " << r.error().message;
    std::vector<std::string> names;
    for (const auto& t : r->tensors) names.push_back(t.name);
    EXPECT_EQ(names, g.names_in_data_order) << g.header;
  }
}

// --- files and checkpoint directories ---

std::string single_u8(const std::string& name, int n) {
  return "{" + entry(name, "\"U8\"", "[" + std::to_string(n) + "]", "[0," + std::to_string(n) + "]") + "}";
}

TEST(SafetensorsCheckpoint, TruncatedFileNamesThePath) {
  TempDir dir;
  const auto path = dir / "m.safetensors";
  auto bytes = make_file(single_u8("w", 16), 16);
  bytes.resize(bytes.size() - 3);
  write_bytes(path, bytes);
  EXPECT_TRUE(fails_with(Checkpoint::open(path), {path.string() + ": tensor 'w'", "run past the end", "truncated"}));
  write_bytes(path, {1, 2});
  EXPECT_TRUE(fails_with(Checkpoint::open(path), {path.string() + ": file is 2 bytes"}));
}

TEST(SafetensorsCheckpoint, MissingPathsAreErrors) {
  TempDir dir;
  EXPECT_TRUE(fails_with(Checkpoint::open(dir / "nope.safetensors"), {"nope.safetensors", "no such file"}));
  EXPECT_TRUE(fails_with(Checkpoint::open(dir.path()), {dir.path().string(), "neither model.safetensors.index.json"}));
}

// A sharded directory built by hand: shard files a.safetensors (tensors x, y) and b.safetensors (z).
class ShardedDir : public ::testing::Test {
 protected:
  void SetUp() override {
    write_bytes(dir_ / "a.safetensors",
                make_file("{" + entry("x", "\"U8\"", "[2]", "[0,2]") + "," + entry("y", "\"U8\"", "[3]", "[2,5]") + "}", 5));
    write_bytes(dir_ / "b.safetensors", make_file(single_u8("z", 4), 4));
  }
  void write_index(const std::string& text) { write_text(index_path(), text); }
  std::string index_path() const { return (dir_ / "model.safetensors.index.json").string(); }

  TempDir dir_;
};

TEST_F(ShardedDir, OpensWhenIndexAndShardsAgree) {
  write_index(R"({"metadata":{"total_size":11},"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"./b.safetensors"}})");
  auto ckpt = Checkpoint::open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  ASSERT_EQ(ckpt->tensors().size(), 3u);
  EXPECT_EQ(ckpt->find("z")->shard, 1u);
  auto z = ckpt->tensor("z");
  ASSERT_FALSE(z.ok());  // U8 is listed but not a weight dtype
  auto raw = ckpt->raw_tensor("z");
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(std::vector<uint8_t>(raw->bytes.begin(), raw->bytes.end()), (std::vector<uint8_t>{1, 8, 15, 22}));
}

TEST_F(ShardedDir, MissingShardIsNamed) {
  write_index(R"({"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors","q":"c.safetensors"}})");
  EXPECT_TRUE(fails_with(Checkpoint::open(dir_.path()),
                         {index_path(), "shard 'c.safetensors' (holding tensor 'q' and 0 others) cannot be read"}));
}

TEST_F(ShardedDir, IndexTensorMissingFromShard) {
  write_index(R"({"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors","w":"b.safetensors"}})");
  EXPECT_TRUE(fails_with(Checkpoint::open(dir_.path()),
                         {index_path(), "tensor 'w' is mapped to shard 'b.safetensors', which has no such tensor"}));
}

TEST_F(ShardedDir, ShardTensorMissingFromIndex) {
  write_index(R"({"weight_map":{"x":"a.safetensors","z":"b.safetensors"}})");
  EXPECT_TRUE(fails_with(Checkpoint::open(dir_.path()),
                         {(dir_ / "a.safetensors").string() + ": tensor 'y' is not listed in " + index_path()}));
}

TEST_F(ShardedDir, TensorMappedToTheWrongShard) {
  write_index(R"({"weight_map":{"x":"a.safetensors","y":"b.safetensors","z":"b.safetensors"}})");
  EXPECT_TRUE(fails_with(Checkpoint::open(dir_.path()),
                         {index_path(), "tensor 'y' is mapped to shard 'b.safetensors' but is stored in 'a.safetensors'"}));
}

TEST_F(ShardedDir, DuplicateTensorAcrossShards) {
  write_bytes(dir_ / "c.safetensors", make_file(single_u8("x", 1), 1));
  write_index(R"({"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"c.safetensors"}})");
  EXPECT_TRUE(fails_with(Checkpoint::open(dir_.path()),
                         {"tensor 'x' appears in both", (dir_ / "a.safetensors").string(),
                          (dir_ / "c.safetensors").string()}));
}

TEST_F(ShardedDir, MalformedShardNamesShardAndTensor) {
  write_bytes(dir_ / "b.safetensors", make_file(single_u8("z", 4), 2));
  write_index(R"({"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"}})");
  EXPECT_TRUE(fails_with(Checkpoint::open(dir_.path()), {(dir_ / "b.safetensors").string() + ": tensor 'z'"}));
}

TEST_F(ShardedDir, MalformedIndexJson) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"weight_map\":", "invalid JSON"},
      {std::string("{\"weight_map\":{}}\0{", 19), "invalid JSON: NUL byte at offset 17"},
      {"[]", "index is not a JSON object (it is an array)"},
      {"{}", "missing \"weight_map\""},
      {"{\"weight_map\":[]}", "\"weight_map\" must be an object, got an array"},
      {"{\"weight_map\":{\"x\":1}}", "tensor 'x': shard must be a file name string, got a number"},
      {"{\"weight_map\":{\"x\":\"/etc/passwd\"}}", "tensor 'x': shard '/etc/passwd' must be a relative path"},
      {"{\"weight_map\":{\"x\":\"../a.safetensors\"}}", "tensor 'x': shard '../a.safetensors' must be a relative path"},
      {"{\"weight_map\":{\"x\":\"\"}}", "tensor 'x': shard '' must be a relative path"},
      {"{\"metadata\":{\"total_size\":-1},\"weight_map\":{}}", "\"metadata.total_size\" must be a non-negative integer"},
      {"{\"metadata\":[],\"weight_map\":{}}", "\"metadata\" must be an object"},
  };
  for (const auto& [text, expected] : cases) {
    write_index(text);
    EXPECT_TRUE(fails_with(Checkpoint::open(dir_.path()), {index_path() + ": " + expected})) << text;
  }
}

}  // namespace
}  // namespace cedar::io
