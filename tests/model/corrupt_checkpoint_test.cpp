// Damaged checkpoints: starting from a valid tiny checkpoint, each test breaks one thing (by byte
// surgery or by rewriting a shard with SafetensorsWriter) and requires cedar to refuse it — at open
// or at the inventory check — with a message naming the file and, where there is one, the tensor.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/config.h"
#include "io/safetensors.h"
#include "model/inventory.h"
#include "model/layer_plan.h"
#include "model/tiny_checkpoint.h"
#include "model/weights.h"

namespace cedar {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void write_bytes(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// Opens the checkpoint and checks its inventory; returns the first error (empty: accepted).
std::string load_error(const fs::path& dir) {
  auto config = load_model_config(dir);
  if (!config.ok()) return config.error().message;
  auto plan = build_layer_plan(*config);
  if (!plan.ok()) return plan.error().message;
  auto expected = expected_weights(*config, *plan);
  if (!expected.ok()) return expected.error().message;
  auto ckpt = io::Checkpoint::open(dir);
  if (!ckpt.ok()) return ckpt.error().message;
  const Status st = check_inventory(*expected, *ckpt, inventory_options(*config, *plan));
  return st.ok() ? std::string() : st.error().message;
}

class CorruptCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    base_ = new fs::path(fs::temp_directory_path() / ("cedar-corrupt-base-" + std::to_string(::getpid())));
    fs::remove_all(*base_);
    TinyCheckpointOptions o;  // V4.1, quantized: every storage format is present
    o.tokenizer_files = false;
    const Status st = make_tiny_checkpoint(o, *base_, false);
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*base_, ec);
    delete base_;
    base_ = nullptr;
  }
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cedar-corrupt-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::copy(*base_, dir_, fs::copy_options::recursive);
    ASSERT_EQ(load_error(dir_), "") << "the undamaged copy must load";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  json index() const { return json::parse(read_bytes(dir_ / "model.safetensors.index.json")); }
  void write_index(const json& j) const { write_bytes(dir_ / "model.safetensors.index.json", j.dump(2)); }
  std::string shard_of(const std::string& tensor) const { return index()["weight_map"][tensor]; }

  // Rewrites the shard holding `tensor` through SafetensorsWriter; `edit` may change each entry
  // (name/dtype/shape/bytes) or drop it by clearing the name, and may append new ones.
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  template <typename Edit>
  void rewrite_shard(const std::string& shard, Edit edit) const {
    const std::string file = read_bytes(dir_ / shard);
    std::span<const uint8_t> span(reinterpret_cast<const uint8_t*>(file.data()), file.size());
    auto header = io::parse_safetensors(span, shard);
    ASSERT_TRUE(header.ok()) << header.error().message;
    std::vector<Entry> entries;
    for (const auto& t : header->tensors) {
      const uint8_t* p = span.data() + header->data_offset + t.begin;
      entries.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(p, p + t.nbytes())});
    }
    edit(entries);
    io::SafetensorsWriter w;
    for (auto& e : entries) {
      if (!e.name.empty()) {
        ASSERT_TRUE(w.add(e.name, e.dtype, e.shape, std::move(e.bytes)).ok());
      }
    }
    ASSERT_TRUE(w.write_file(dir_ / shard).ok());
  }

  static fs::path* base_;
  fs::path dir_;
};
fs::path* CorruptCheckpointTest::base_ = nullptr;

#define EXPECT_MENTIONS(message, part) \
  EXPECT_NE((message).find(part), std::string::npos) << "error does not name '" << (part) << "': " << (message)

constexpr const char* kNorm = "layers.3.attn_norm.weight";
constexpr const char* kScale = "layers.2.attn.wq_a.scale";
constexpr const char* kExpert = "layers.2.ffn.experts.0.w1.weight";

TEST_F(CorruptCheckpointTest, TruncatedShard) {
  const std::string shard = shard_of(kNorm);
  std::string bytes = read_bytes(dir_ / shard);
  bytes.resize(bytes.size() - 100);
  write_bytes(dir_ / shard, bytes);
  const std::string err = load_error(dir_);
  ASSERT_NE(err, "");
  EXPECT_MENTIONS(err, shard);
}

TEST_F(CorruptCheckpointTest, FlippedHeaderLengthByte) {
  const std::string shard = shard_of(kNorm);
  std::string bytes = read_bytes(dir_ / shard);
  bytes[0] = static_cast<char>(bytes[0] ^ 0x04);  // header length off by 4
  write_bytes(dir_ / shard, bytes);
  const std::string err = load_error(dir_);
  ASSERT_NE(err, "");
  EXPECT_MENTIONS(err, shard);
}

TEST_F(CorruptCheckpointTest, FlippedByteInATensorsOffsets) {
  const std::string shard = shard_of(kNorm);
  std::string bytes = read_bytes(dir_ / shard);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  const std::string header = bytes.substr(8, header_len);
  const size_t at = header.find(std::string("\"") + kNorm + "\"");
  ASSERT_NE(at, std::string::npos);
  const size_t offsets = header.find("data_offsets", at);
  const size_t close = header.find(']', offsets);
  ASSERT_NE(close, std::string::npos);
  char& last_digit = bytes[8 + close - 1];  // last digit of the end offset
  ASSERT_TRUE(last_digit >= '0' && last_digit <= '9');
  last_digit = static_cast<char>(last_digit ^ 0x01);  // a one-bit flip: still a digit, off by one
  write_bytes(dir_ / shard, bytes);
  const std::string err = load_error(dir_);
  ASSERT_NE(err, "");
  EXPECT_MENTIONS(err, shard);
  EXPECT_MENTIONS(err, kNorm);
}

TEST_F(CorruptCheckpointTest, TensorRemovedFromItsShardButStillIndexed) {
  const std::string shard = shard_of(kNorm);
  rewrite_shard(shard, [](std::vector<Entry>& es) {
    for (auto& e : es)
      if (e.name == kNorm) e.name.clear();
  });
  const std::string err = load_error(dir_);
  ASSERT_NE(err, "");
  EXPECT_MENTIONS(err, kNorm);
  EXPECT_MENTIONS(err, shard);
}

TEST_F(CorruptCheckpointTest, TensorRemovedFromShardAndIndex) {
  rewrite_shard(shard_of(kNorm), [](std::vector<Entry>& es) {
    for (auto& e : es)
      if (e.name == kNorm) e.name.clear();
  });
  json j = index();
  j["weight_map"].erase(kNorm);
  write_index(j);
  const std::string err = load_error(dir_);
  ASSERT_NE(err, "");
  EXPECT_MENTIONS(err, "missing");
  EXPECT_MENTIONS(err, kNorm);
}

TEST_F(CorruptCheckpointTest, WrongDtype) {
  rewrite_shard(shard_of(kScale), [](std::vector<Entry>& es) {
    for (auto& e : es)
      if (e.name == kScale) e.dtype = DType::U8;  // same bytes, UE8M0 relabelled as U8
  });
  const std::string err = load_error(dir_);
  ASSERT_NE(err, "");
  EXPECT_MENTIONS(err, kScale);
  EXPECT_MENTIONS(err, "F8_E8M0");
  EXPECT_MENTIONS(err, "U8");
}

TEST_F(CorruptCheckpointTest, WrongShape) {
  rewrite_shard(shard_of(kExpert), [](std::vector<Entry>& es) {
    for (auto& e : es)
      if (e.name == kExpert) e.shape = {e.shape[0] * 2, e.shape[1] / 2};  // same byte count
  });
  const std::string err = load_error(dir_);
  ASSERT_NE(err, "");
  EXPECT_MENTIONS(err, kExpert);
  EXPECT_MENTIONS(err, "[64, 16]");
}

TEST_F(CorruptCheckpointTest, MissingShardFile) {
  const std::string shard = shard_of(kNorm);
  fs::remove(dir_ / shard);
  const std::string err = load_error(dir_);
  ASSERT_NE(err, "");
  EXPECT_MENTIONS(err, shard);
}

TEST_F(CorruptCheckpointTest, IndexPointsAtTheWrongShard) {
  json j = index();
  const std::string right = j["weight_map"][kNorm];
  std::string wrong;
  for (const auto& [name, shard] : j["weight_map"].items())
    if (shard != right) wrong = shard;
  ASSERT_NE(wrong, "") << "the tiny checkpoint must have at least two shards";
  j["weight_map"][kNorm] = wrong;
  write_index(j);
  const std::string err = load_error(dir_);
  ASSERT_NE(err, "");
  EXPECT_MENTIONS(err, kNorm);
  EXPECT_MENTIONS(err, wrong);
}

TEST_F(CorruptCheckpointTest, ExtraUnexpectedTensor) {
  const std::string extra = "layers.0.attn.bogus.weight";
  const std::string shard = shard_of(kNorm);
  rewrite_shard(shard, [&](std::vector<Entry>& es) {
    es.push_back({extra, DType::BF16, {4}, std::vector<uint8_t>(8, 0)});
  });
  json j = index();
  j["weight_map"][extra] = shard;
  write_index(j);
  const std::string err = load_error(dir_);
  ASSERT_NE(err, "");
  EXPECT_MENTIONS(err, "unexpected");
  EXPECT_MENTIONS(err, extra);
}

}  // namespace
}  // namespace cedar
