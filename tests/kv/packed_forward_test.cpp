// The forward with packed KV caches (§3.12 records in pool blocks, decoded on read) equals the forward
// with fp32-stored caches bit for bit: the same QDQ recipes run on write, and decode gives back
// exactly their values. Checked per attention layer on the tiny attention stack (also against the
// raw-f32 containers whose values the writers quantize), and on the logits of the assembled tiny
// model; a shared pool that is too small makes the forward fail with an error.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "../model/attention_runner.h"
#include "model/deepseek_v41.h"
#include "model/tiny_checkpoint.h"

namespace cedar {
namespace {

using test::RunResult;
using test::TinyModel;

RunResult run_with(const TinyModel& m, AttentionState st, const std::vector<int64_t>& chunks) {
  RunResult r = test::new_result(m);
  r.st = std::move(st);
  AttentionScratch scratch;
  int64_t pos = 0;
  for (int64_t n : chunks) {
    test::run_chunk(m, {.pos0 = pos, .n = n}, r, scratch, nullptr);
    pos += n;
  }
  return r;
}

// Containers that store values as given: the forward quantizes before writing.
AttentionState raw_state(const TinyModel& m) {
  AttentionState st;
  st.source_slot.assign(static_cast<size_t>(m.layers()), -1);
  for (const LayerRole& role : m.plan.layers) {
    st.rings.emplace_back(m.p.window, m.p.head_dim);
    if (!role.owns_compressor) continue;
    KvSourceState s;
    s.layer = role.layer;
    s.ratio = role.compress_ratio;
    s.kv = KvEntries(m.p.head_dim);
    s.index_k = KvEntries(m.p.index_head_dim);
    st.source_slot[static_cast<size_t>(role.layer)] = static_cast<int64_t>(st.sources.size());
    st.sources.push_back(std::move(s));
  }
  return st;
}

TEST(PackedKv, AttentionStackIsBitIdenticalToFp32Caches) {
  TinyModel m(30);
  auto packed = AttentionState::create(m.plan, m.p, {.storage = KvStorage::Packed});
  auto f32 = AttentionState::create(m.plan, m.p, {.storage = KvStorage::F32});
  ASSERT_TRUE(packed.ok() && f32.ok());
  ASSERT_EQ(packed->sources.at(0).kv.format().recipe, KvRecipe::Fp4Block16E4m3);
  ASSERT_EQ(packed->sources.at(0).kv.format().storage, KvStorage::Packed);
  ASSERT_EQ(packed->rings.at(0).format().recipe, KvRecipe::Fp8Block32Ue8m0);
  const std::vector<int64_t> chunks = {11, 1, 18};
  const RunResult a = run_with(m, std::move(*packed), chunks);
  const RunResult b = run_with(m, std::move(*f32), chunks);
  const RunResult c = run_with(m, raw_state(m), chunks);
  for (const RunResult* other : {&b, &c}) {
    test::expect_same_state(a.st, other->st);
    test::expect_same_outputs(m, a, *other, 0, 30);
    EXPECT_EQ(a.topk, other->topk);
    EXPECT_EQ(a.candidates, other->candidates);
  }
  // The packed rings really hold records of 528·(head_dim/512) bytes per slot.
  EXPECT_EQ(a.st.rings[0].bytes(), m.p.window * (m.p.head_dim + m.p.head_dim / 32));
}

class PackedKvModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                      ("cedar-packed-kv-test-" + std::to_string(::getpid())));
    std::filesystem::remove_all(*root_);
    TinyCheckpointOptions o;
    o.seed = 1;
    o.tokenizer_files = false;
    ASSERT_TRUE(make_tiny_checkpoint(o, *root_ / "tiny", false).ok());
    auto m = DeepseekV41Model::load(*root_ / "tiny");
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = new DeepseekV41Model(std::move(*m));
  }
  static void TearDownTestSuite() {
    delete model_;
    std::error_code ec;
    std::filesystem::remove_all(*root_, ec);
    delete root_;
  }
  static Result<ForwardOutput> run(const std::vector<int64_t>& ids, const KvCacheOptions& kv, int64_t chunk) {
    SequenceOptions so;
    so.kv = kv;
    CEDAR_ASSIGN_OR_RETURN(SequenceState st, model_->new_sequence(so));
    ForwardOutput last;
    for (size_t p = 0; p < ids.size(); p += static_cast<size_t>(chunk)) {
      const size_t len = std::min(static_cast<size_t>(chunk), ids.size() - p);
      ForwardOptions fo;
      fo.logits = LogitRows::Last;
      CEDAR_ASSIGN_OR_RETURN(last, model_->forward(std::span<const int64_t>(ids).subspan(p, len), st, fo));
    }
    return last;
  }
  static std::filesystem::path* root_;
  static DeepseekV41Model* model_;
};
std::filesystem::path* PackedKvModel::root_ = nullptr;
DeepseekV41Model* PackedKvModel::model_ = nullptr;

std::vector<int64_t> ids(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back((i * 7919 + 13) % 128000);
  return v;
}

TEST_F(PackedKvModel, LogitsWithPackedCachesEqualFp32CachesBitForBit) {
  const auto prompt = ids(21);
  auto pool = BlockPool::create({});
  ASSERT_TRUE(pool.ok());
  auto packed = run(prompt, {.storage = KvStorage::Packed, .pool = *pool}, 5);
  auto f32 = run(prompt, {.storage = KvStorage::F32}, 5);
  ASSERT_TRUE(packed.ok()) << packed.error().message;
  ASSERT_TRUE(f32.ok()) << f32.error().message;
  ASSERT_EQ(packed->logits.size(), f32->logits.size());
  ASSERT_FALSE(packed->logits.empty());
  EXPECT_EQ(std::memcmp(packed->logits.data(), f32->logits.data(), packed->logits.size() * sizeof(float)), 0);
  // The sequence is gone: its blocks went back to the shared pool.
  EXPECT_EQ((*pool)->stats().used_bytes, 0);
  EXPECT_GT((*pool)->stats().peak_used_bytes, 0);
}

TEST_F(PackedKvModel, FullPoolIsAnErrorNotACrash) {
  auto pool = BlockPool::create({.capacity_bytes = 4096});
  ASSERT_TRUE(pool.ok());
  auto out = run(ids(200), {.pool = *pool}, 200);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("KV block pool is full"), std::string::npos) << out.error().message;
  EXPECT_EQ((*pool)->stats().used_bytes, 0);
}

}  // namespace
}  // namespace cedar
