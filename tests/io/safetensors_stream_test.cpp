// write_streamed_sharded: the files are byte-identical to SafetensorsWriter's for the same tensors
// (the in-memory writer is checked against the official crate's vectors in safetensors_test.cpp), for
// any shard count, chunk size and thread count; errors of a fill function or of the tensor list are
// reported by name and leave no index behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/threads.h"
#include "io/safetensors.h"
#include "safetensors_test_util.h"

namespace cedar::io {
namespace {

using testing::fails_with;
using testing::read_bytes;
using testing::TempDir;

struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// Byte i of a tensor: depends on the tensor and the byte offset only.
uint8_t byte_of(size_t tensor, uint64_t i) { return static_cast<uint8_t>((i * 131 + tensor * 17 + (i >> 8)) & 0xFF); }

uint64_t nbytes(const Tensor& t) {
  uint64_t n = dtype_size(t.dtype);
  for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
  return n;
}

const std::vector<Tensor> kTensors = {
    {"layers.0.w", DType::F8_E4M3, {37, 64}}, {"layers.0.w_scale", DType::F8_E8M0, {2, 2}},
    {"embed.weight", DType::BF16, {300, 48}}, {"norm.weight", DType::BF16, {48}},
    {"hc_fn", DType::F32, {24, 96}},          {"scalar", DType::F32, {}},
    {"experts.w", DType::I8, {5, 7, 33}},     {"empty", DType::F32, {0, 5}},
};

std::vector<StreamedTensor> streamed(const std::vector<Tensor>& ts) {
  std::vector<StreamedTensor> out;
  for (size_t k = 0; k < ts.size(); ++k) {
    const Tensor& t = ts[k];
    const uint64_t row_bytes =
        t.shape.empty() ? nbytes(t) : dtype_size(t.dtype) * static_cast<uint64_t>(t.shape.back());
    out.push_back({t.name, t.dtype, t.shape, [k, row_bytes](int64_t first, int64_t rows, std::span<uint8_t> dst) {
                     if (dst.size() != static_cast<size_t>(rows) * row_bytes)
                       return Status(make_error("fill: wrong buffer size"));
                     for (size_t i = 0; i < dst.size(); ++i)
                       dst[i] = byte_of(k, static_cast<uint64_t>(first) * row_bytes + i);
                     return Status::Ok();
                   }});
  }
  return out;
}

SafetensorsWriter in_memory(const std::vector<Tensor>& ts) {
  SafetensorsWriter w;
  for (size_t k = 0; k < ts.size(); ++k) {
    std::vector<uint8_t> bytes(nbytes(ts[k]));
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = byte_of(k, i);
    EXPECT_TRUE(w.add(ts[k].name, ts[k].dtype, ts[k].shape, bytes).ok());
  }
  w.set_metadata("format", "pt");
  return w;
}

TEST(SafetensorsStream, FilesEqualTheInMemoryWriters) {
  for (int shards : {1, 2, 3, 8}) {
    for (int64_t chunk : {int64_t{1}, int64_t{100}, int64_t{1} << 20}) {
      for (int threads : {1, 3}) {
        TempDir a, b;
        ASSERT_TRUE(in_memory(kTensors).write_sharded(a.path(), shards).ok());
        ThreadPool pool(threads);
        StreamedWriteOptions o;
        o.n_shards = shards;
        o.metadata = {{"format", "pt"}};
        o.pool = &pool;
        o.chunk_bytes = chunk;
        Status st = write_streamed_sharded(b.path(), streamed(kTensors), o);
        ASSERT_TRUE(st.ok()) << st.error().message;
        std::vector<std::string> names;
        for (const auto& e : std::filesystem::directory_iterator(a.path())) names.push_back(e.path().filename());
        ASSERT_EQ(names.size(), static_cast<size_t>(shards) + 1);
        for (const std::string& n : names)
          EXPECT_EQ(read_bytes(a / n), read_bytes(b / n))
              << n << " differs (shards " << shards << ", chunk " << chunk << ", threads " << threads << ")";
        auto ckpt = Checkpoint::open(b.path());
        ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
        EXPECT_EQ(ckpt->tensors().size(), kTensors.size());
      }
    }
  }
}

TEST(SafetensorsStream, FillErrorNamesTheTensorAndLeavesNoIndex) {
  TempDir dir;
  auto ts = streamed(kTensors);
  ts[2].fill = [](int64_t, int64_t, std::span<uint8_t>) { return Status(make_error("generator broke")); };
  ThreadPool pool(2);
  StreamedWriteOptions o;
  o.n_shards = 2;
  o.pool = &pool;
  const Status st = write_streamed_sharded(dir.path(), ts, o);
  EXPECT_TRUE(fails_with(st, {"embed.weight", "generator broke"}));
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / "model-00001-of-00002.safetensors"));
}

TEST(SafetensorsStream, RejectsBadTensorLists) {
  TempDir dir;
  StreamedWriteOptions o;
  auto dup = streamed(kTensors);
  dup[1].name = dup[0].name;
  EXPECT_TRUE(fails_with(write_streamed_sharded(dir.path(), dup, o), {"layers.0.w", "twice"}));
  auto no_fill = streamed(kTensors);
  no_fill[3].fill = nullptr;
  EXPECT_TRUE(fails_with(write_streamed_sharded(dir.path(), no_fill, o), {"norm.weight", "no fill function"}));
  o.n_shards = 100;
  EXPECT_TRUE(fails_with(write_streamed_sharded(dir.path(), streamed(kTensors), o), {"shards"}));
}

}  // namespace
}  // namespace cedar::io
