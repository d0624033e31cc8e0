// Safetensors reading and writing: reference vectors from the official crate's own tests, round trips
// through single files and sharded directories, dtype support, and atomic writes.
// Malformed inputs: safetensors_malformed_test.cpp; randomized header mutations: safetensors_fuzz_test.cpp.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "safetensors_test_util.h"

namespace cedar::io {
namespace {

using testing::fails_with;
using testing::make_file;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

std::vector<uint8_t> f32_bytes(std::initializer_list<float> values) {
  std::vector<uint8_t> out(values.size() * 4);
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(seed + 13 * i);
  return out;
}

// From the official crate's test_serialization: {"attn.0": F32 [1, 2, 3] = 0..5}.
const std::vector<uint8_t> kCrateSerialization = {
    64,  0,   0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110, 46,  48,  34,  58,  123, 34,
    100, 116, 121, 112, 101, 34,  58,  34,  70,  51,  50,  34,  44,  34,  115, 104, 97,  112, 101, 34,
    58,  91,  49,  44,  50,  44,  51,  93,  44,  34,  100, 97,  116, 97,  95,  111, 102, 102, 115, 101,
    116, 115, 34,  58,  91,  48,  44,  50,  52,  93,  125, 125, 0,   0,   0,   0,   0,   0,   128, 63,
    0,   0,   0,   64,  0,   0,   64,  64,  0,   0,   128, 64,  0,   0,   160, 64};
// From test_empty: no tensors, and no tensors with metadata {"framework": "pt"}.
const std::vector<uint8_t> kCrateEmpty = {8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32};
const std::vector<uint8_t> kCrateEmptyWithMetadata = {
    40, 0,   0,  0,   0,   0,   0,   0,  123, 34,  95,  95,  109, 101, 116, 97,  100, 97, 116, 97, 95, 95, 34, 58,
    123, 34, 102, 114, 97, 109, 101, 119, 111, 114, 107, 34, 58,  34,  112, 116, 34,  125, 125, 32, 32, 32, 32, 32};

TEST(Safetensors, ParsesTheOfficialCrateVector) {
  auto h = parse_safetensors(kCrateSerialization, "crate.safetensors");
  ASSERT_TRUE(h.ok()) << h.error().message;
  ASSERT_EQ(h->tensors.size(), 1u);
  const TensorEntry& t = h->tensors[0];
  EXPECT_EQ(t.name, "attn.0");
  EXPECT_EQ(t.dtype, DType::F32);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.begin, 0u);
  EXPECT_EQ(t.end, 24u);
  EXPECT_EQ(h->data_offset, 72u);
  EXPECT_EQ(h->data_size, 24u);
  float values[6];
  std::memcpy(values, kCrateSerialization.data() + h->data_offset, sizeof values);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(values[i], static_cast<float>(i));
}

TEST(Safetensors, WriterReproducesTheOfficialCrateVectors) {
  TempDir dir;
  SafetensorsWriter w;
  ASSERT_TRUE(w.add("attn.0", DType::F32, {1, 2, 3}, f32_bytes({0, 1, 2, 3, 4, 5})).ok());
  ASSERT_TRUE(w.write_file(dir / "a.safetensors").ok());
  EXPECT_EQ(read_bytes(dir / "a.safetensors"), kCrateSerialization);

  SafetensorsWriter empty;
  ASSERT_TRUE(empty.write_file(dir / "empty.safetensors").ok());
  EXPECT_EQ(read_bytes(dir / "empty.safetensors"), kCrateEmpty);
  empty.set_metadata("framework", "pt");
  ASSERT_TRUE(empty.write_file(dir / "meta.safetensors").ok());
  EXPECT_EQ(read_bytes(dir / "meta.safetensors"), kCrateEmptyWithMetadata);
}

TEST(Safetensors, WriterOrdersTensorsLikeThePythonPackage) {
  // Header written by safetensors 0.8 (numpy) for these tensors: descending dtype alignment, then name.
  const std::string expected =
      R"({"c":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},)"
      R"("aa":{"dtype":"F16","shape":[2],"data_offsets":[32,36]},"a":{"dtype":"I8","shape":[3],"data_offsets":[36,39]}})";
  TempDir dir;
  SafetensorsWriter w;
  ASSERT_TRUE(w.add("a", DType::I8, {3}, pattern(3, 1)).ok());
  ASSERT_TRUE(w.add("b", DType::F32, {2, 3}, pattern(24, 2)).ok());
  ASSERT_TRUE(w.add("aa", DType::F16, {2}, pattern(4, 3)).ok());
  ASSERT_TRUE(w.add("c", DType::F64, {1}, pattern(8, 4)).ok());
  ASSERT_TRUE(w.write_file(dir / "x.safetensors").ok());
  const auto bytes = read_bytes(dir / "x.safetensors");
  ASSERT_GE(bytes.size(), 8 + expected.size());
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(expected.size()));
  EXPECT_EQ(header, expected);
}

struct Sample {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Every dtype cedar knows, including a scalar and zero-element tensors.
std::vector<Sample> all_dtype_samples() {
  std::vector<Sample> out;
  const DType all[] = {DType::BOOL, DType::U8,  DType::I8,  DType::I16,     DType::U16,     DType::F16,
                       DType::BF16, DType::I32, DType::U32, DType::F32,     DType::I64,     DType::U64,
                       DType::F64,  DType::F8_E4M3, DType::F8_E5M2, DType::F8_E8M0};
  uint8_t seed = 1;
  for (DType t : all) {
    const std::vector<int64_t> shape = {3, 2};
    out.push_back({"w." + std::string(dtype_name(t)), t, shape, pattern(6 * dtype_size(t), seed++)});
  }
  out.push_back({"scalar", DType::F32, {}, f32_bytes({2.5f})});
  out.push_back({"empty.rows", DType::BF16, {0, 4}, {}});
  out.push_back({"empty.cols", DType::F32, {4, 0}, {}});
  return out;
}

void expect_checkpoint_holds(const Checkpoint& ckpt, const std::vector<Sample>& samples) {
  ASSERT_EQ(ckpt.tensors().size(), samples.size());
  for (size_t i = 1; i < ckpt.tensors().size(); ++i) EXPECT_LT(ckpt.tensors()[i - 1].name, ckpt.tensors()[i].name);
  for (const Sample& s : samples) {
    auto view = ckpt.raw_tensor(s.name);
    ASSERT_TRUE(view.ok()) << view.error().message;
    EXPECT_EQ(view->entry->dtype, s.dtype) << s.name;
    EXPECT_EQ(view->entry->shape, s.shape) << s.name;
    EXPECT_EQ(std::vector<uint8_t>(view->bytes.begin(), view->bytes.end()), s.bytes) << s.name;
    EXPECT_EQ(ckpt.find(s.name), view->entry);
  }
}

TEST(Safetensors, SingleFileRoundTrip) {
  TempDir dir;
  const auto samples = all_dtype_samples();
  SafetensorsWriter w;
  for (const Sample& s : samples) ASSERT_TRUE(w.add(s.name, s.dtype, s.shape, s.bytes).ok());
  w.set_metadata("format", "pt");
  w.set_metadata("note", "ünïcode \"quoted\"\n");
  ASSERT_TRUE(w.write_file(dir / "model.safetensors").ok());

  for (const auto& path : {dir.path() / "model.safetensors", dir.path()}) {  // the file, and its directory
    auto ckpt = Checkpoint::open(path);
    ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
    expect_checkpoint_holds(*ckpt, samples);
    ASSERT_EQ(ckpt->shard_paths().size(), 1u);
    EXPECT_EQ(ckpt->shard_paths()[0], dir.path() / "model.safetensors");
  }
  const auto bytes = read_bytes(dir / "model.safetensors");
  auto header = parse_safetensors(bytes, "model.safetensors");
  ASSERT_TRUE(header.ok()) << header.error().message;
  EXPECT_EQ(header->metadata.at("format"), "pt");
  EXPECT_EQ(header->metadata.at("note"), "ünïcode \"quoted\"\n");
  EXPECT_EQ(header->data_offset % 8, 0u);
  for (const TensorEntry& t : header->tensors) EXPECT_EQ((header->data_offset + t.begin) % dtype_size(t.dtype), 0u);
}

TEST(Safetensors, ShardedRoundTrip) {
  TempDir dir;
  const auto samples = all_dtype_samples();
  SafetensorsWriter w;
  for (const Sample& s : samples) ASSERT_TRUE(w.add(s.name, s.dtype, s.shape, s.bytes).ok());
  w.set_metadata("format", "pt");
  ASSERT_TRUE(w.write_sharded(dir.path(), 3).ok());

  for (const auto& path : {dir.path(), dir.path() / "model.safetensors.index.json"}) {
    auto ckpt = Checkpoint::open(path);
    ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
    expect_checkpoint_holds(*ckpt, samples);
    ASSERT_EQ(ckpt->shard_paths().size(), 3u);
    EXPECT_EQ(ckpt->shard_paths()[0].filename(), "model-00001-of-00003.safetensors");
    EXPECT_EQ(ckpt->shard_paths()[2].filename(), "model-00003-of-00003.safetensors");
    uint64_t total = 0;
    for (const Sample& s : samples) total += s.bytes.size();
    EXPECT_EQ(ckpt->total_tensor_bytes(), total);
  }

  // The index, read as plain JSON: total_size and one entry per tensor naming the shard that holds it.
  auto index = nlohmann::json::parse(testing::read_bytes(dir / "model.safetensors.index.json"));
  uint64_t total = 0;
  for (const Sample& s : samples) total += s.bytes.size();
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  ASSERT_EQ(index["weight_map"].size(), samples.size());
  for (int k = 1; k <= 3; ++k) {
    const std::string file = "model-0000" + std::to_string(k) + "-of-00003.safetensors";
    auto header = parse_safetensors(read_bytes(dir / file), file);
    ASSERT_TRUE(header.ok()) << header.error().message;
    EXPECT_FALSE(header->tensors.empty()) << file;
    EXPECT_EQ(header->metadata.at("format"), "pt");
    for (const TensorEntry& t : header->tensors) EXPECT_EQ(index["weight_map"][t.name], file) << t.name;
  }
}

TEST(Safetensors, ShardsSplitInsertionOrderBySize) {
  TempDir dir;
  SafetensorsWriter w;
  // 4 tensors of 100 bytes then 4 of 1 byte: two shards split after the second big one.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(w.add("big." + std::to_string(i), DType::U8, {100}, pattern(100, 1)).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(w.add("small." + std::to_string(i), DType::U8, {1}, pattern(1, 2)).ok());
  ASSERT_TRUE(w.write_sharded(dir.path(), 2).ok());
  auto ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  EXPECT_EQ(ckpt->find("big.1")->shard, 0u);
  EXPECT_EQ(ckpt->find("big.2")->shard, 1u);
  EXPECT_EQ(ckpt->find("small.3")->shard, 1u);

  // As many shards as tensors: one each.
  TempDir dir8;
  ASSERT_TRUE(w.write_sharded(dir8.path(), 8).ok());
  auto ckpt8 = Checkpoint::open(dir8.path());
  ASSERT_TRUE(ckpt8.ok()) << ckpt8.error().message;
  EXPECT_EQ(ckpt8->shard_paths().size(), 8u);
  EXPECT_EQ(ckpt8->find("small.3")->shard, 7u);

  EXPECT_TRUE(fails_with(w.write_sharded(dir.path(), 9), {"8 tensors", "9 shards"}));
  EXPECT_TRUE(fails_with(w.write_sharded(dir.path(), 0), {"0 shards"}));
}

TEST(Safetensors, TensorRefusesUnsupportedDtypesButRawTensorReadsThem) {
  TempDir dir;
  SafetensorsWriter w;
  const auto samples = all_dtype_samples();
  for (const Sample& s : samples) ASSERT_TRUE(w.add(s.name, s.dtype, s.shape, s.bytes).ok());
  const auto path = dir / "m.safetensors";
  ASSERT_TRUE(w.write_file(path).ok());
  auto ckpt = Checkpoint::open(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  for (const Sample& s : samples) {
    const bool supported = s.dtype == DType::BF16 || s.dtype == DType::F16 || s.dtype == DType::F32 ||
                           s.dtype == DType::F8_E4M3 || s.dtype == DType::F8_E8M0 || s.dtype == DType::I8;
    EXPECT_EQ(supported_for_weights(s.dtype), supported) << s.name;
    auto view = ckpt->tensor(s.name);
    if (supported) {
      ASSERT_TRUE(view.ok()) << view.error().message;
      EXPECT_EQ(view->bytes.size(), s.bytes.size());
    } else {
      EXPECT_TRUE(fails_with(view, {"unsupported dtype " + std::string(dtype_name(s.dtype)), "'" + s.name + "'",
                                    path.string(), "BF16, F16, F32, F8_E4M3, F8_E8M0, I8"}));
    }
    EXPECT_TRUE(ckpt->raw_tensor(s.name).ok());
  }
  EXPECT_TRUE(fails_with(ckpt->tensor("nope"), {"tensor 'nope' not found", path.string()}));
  EXPECT_EQ(ckpt->find("nope"), nullptr);
}

TEST(Safetensors, WriterAddRejectsBadTensors) {
  SafetensorsWriter w;
  ASSERT_TRUE(w.add("x", DType::F32, {2}, pattern(8, 0)).ok());
  EXPECT_TRUE(fails_with(w.add("x", DType::F32, {2}, pattern(8, 0)), {"'x'", "twice"}));
  EXPECT_TRUE(fails_with(w.add("", DType::F32, {2}, pattern(8, 0)), {"empty name"}));
  EXPECT_TRUE(fails_with(w.add("__metadata__", DType::F32, {2}, pattern(8, 0)), {"reserved"}));
  EXPECT_TRUE(fails_with(w.add("bad\xff", DType::U8, {1}, pattern(1, 0)), {"UTF-8"}));
  EXPECT_TRUE(fails_with(w.add("neg", DType::U8, {2, -1}, {}), {"'neg'", "negative dimension -1"}));
  EXPECT_TRUE(fails_with(w.add("size", DType::BF16, {3}, pattern(5, 0)), {"'size'", "needs 6 bytes, got 5"}));
  EXPECT_TRUE(fails_with(w.add("huge", DType::U8, {int64_t{1} << 32, int64_t{1} << 32}, {}), {"'huge'", "too many"}));
}

TEST(Safetensors, WriterRejectsNonUtf8Metadata) {
  TempDir dir;
  SafetensorsWriter w;
  w.set_metadata("k", "\xc3");
  EXPECT_TRUE(fails_with(w.write_file(dir / "m.safetensors"), {"metadata key 'k'", "UTF-8"}));
  EXPECT_FALSE(std::filesystem::exists(dir / "m.safetensors"));
}

TEST(AtomicFile, UncommittedWriteLeavesTheOldFileAndNoTemporary) {
  TempDir dir;
  const auto path = dir / "f.bin";
  write_bytes(path, {1, 2, 3});
  {
    auto f = AtomicFile::create(path);
    ASSERT_TRUE(f.ok()) << f.error().message;
    ASSERT_TRUE(f->append(std::string_view("partial")).ok());
    // destroyed without commit(): as if the process died mid-write
  }
  EXPECT_EQ(read_bytes(path), (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);

  ASSERT_TRUE(write_file_atomically(path, std::vector<uint8_t>{9, 8}).ok());
  EXPECT_EQ(read_bytes(path), (std::vector<uint8_t>{9, 8}));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
  EXPECT_TRUE(fails_with(write_file_atomically(dir / "missing/f.bin", std::vector<uint8_t>{1}), {"missing/f.bin"}));
}

TEST(Safetensors, FailedShardedWriteLeavesNoIndex) {
  TempDir dir;
  SafetensorsWriter w;
  ASSERT_TRUE(w.add("a", DType::U8, {1}, pattern(1, 0)).ok());
  ASSERT_TRUE(w.add("b", DType::U8, {1}, pattern(1, 0)).ok());
  ASSERT_TRUE(w.write_sharded(dir.path(), 2).ok());
  ASSERT_TRUE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  // A directory where the second shard must go makes its rename fail.
  SafetensorsWriter w3;
  for (const char* n : {"a", "b", "c"}) ASSERT_TRUE(w3.add(n, DType::U8, {1}, pattern(1, 0)).ok());
  std::filesystem::create_directories(dir / "model-00002-of-00003.safetensors" / "blocker");
  EXPECT_TRUE(fails_with(w3.write_sharded(dir.path(), 3), {"model-00002-of-00003.safetensors"}));
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

}  // namespace
}  // namespace cedar::io
