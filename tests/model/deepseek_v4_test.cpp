// The assembled DeepSeek-V4 CPU forward on cedar's tiny V4 checkpoint (make-tiny --arch deepseek_v4,
// quantized and --bf16): chunked prefill == one-shot and token-by-token decode == one-shot, bit for bit
// (the invariances of HF's V4 tests), across CSA windows (ratio 4, overlapping) and an HCA window
// (ratio 128), thread-count invariance, the dump names, and the error cases (bad ids, ced on V4, a V4.1
// checkpoint given to the V4 model). Numerics against an independent reference (HF transformers'
// DeepseekV4ForCausalLM) are in tests/python/test_v4_hf_parity.py; the V4 compressor, hc_head and
// query norm against NumPy-style scalar references below.
#include "model/deepseek_v4.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/numeric.h"
#include "model/attention_v4.h"
#include "model/compressor.h"
#include "model/mhc.h"
#include "model/tiny_checkpoint.h"
#include "test_support/forward_trace.h"
#include "test_support/tiny_model.h"

namespace cedar {
namespace {

using test_support::bit_differences;
using test_support::expect_bitwise_equal;
using test_support::Trace;

std::vector<int64_t> prompt(int64_t n, uint64_t seed = 1) { return test_support::xorshift_prompt(n, seed, 12345); }

class DeepseekV4Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new test_support::ScratchDir("cedar-v4-forward-test");
    for (bool bf16 : {false, true}) {
      TinyCheckpointOptions o = test_support::tensors_only(Arch::DeepseekV4);
      o.seed = bf16 ? 3 : 0;
      o.bf16 = bf16;
      auto m = test_support::write_and_load<DeepseekV4Model>(o, root_->path() / (bf16 ? "bf16" : "fp8"));
      ASSERT_TRUE(m.ok()) << m.error().message;
      (bf16 ? bf16_ : fp8_) = new DeepseekV4Model(std::move(*m));
    }
  }
  static void TearDownTestSuite() {
    delete fp8_;
    delete bf16_;
    fp8_ = bf16_ = nullptr;
    delete root_;
    root_ = nullptr;
  }

  static Trace run(const DeepseekV4Model& model, const std::vector<int64_t>& ids, int64_t chunk,
                   ThreadPool* pool = nullptr) {
    return test_support::run_trace(model, ids, chunk, {}, pool);
  }

  static inline test_support::ScratchDir* root_ = nullptr;
  static inline DeepseekV4Model* fp8_ = nullptr;
  static inline DeepseekV4Model* bf16_ = nullptr;
};

TEST_F(DeepseekV4Test, PlanHasCsaHcaAndHashLayers) {
  const LayerPlan& plan = fp8_->plan();
  ASSERT_EQ(plan.num_layers(), 5);
  EXPECT_EQ(plan.layers[2].mode, AttnMode::V4Csa);
  EXPECT_EQ(plan.layers[3].mode, AttnMode::V4Hca);
  EXPECT_TRUE(plan.layers[0].hash_routed);
  EXPECT_FALSE(plan.layers[3].hash_routed);
}

TEST_F(DeepseekV4Test, ProducesFiniteDistinctLogits) {
  const auto ids = prompt(9);
  auto state = fp8_->new_sequence();
  ASSERT_TRUE(state.ok());
  ForwardOptions fo;
  fo.logits = LogitRows::All;
  auto out = fp8_->forward(ids, *state, fo);
  ASSERT_TRUE(out.ok()) << out.error().message;
  ASSERT_EQ(out->logits.size(), 9u * 129280u);
  for (float v : out->logits) ASSERT_TRUE(std::isfinite(v));
  EXPECT_NE(std::vector<float>(out->logits.begin(), out->logits.begin() + 129280),
            std::vector<float>(out->logits.begin() + 129280, out->logits.begin() + 2 * 129280));
  EXPECT_EQ(state->length(), 9);
}

TEST_F(DeepseekV4Test, ChunkedPrefillEqualsOneShot) {
  // 23 tokens: five CSA windows (the overlap state crosses chunk boundaries), the 8-token window slides
  // and the indexer's top-4 selects among up to 5 entries. Chunks cross windows at odd offsets.
  const auto ids = prompt(23);
  for (const DeepseekV4Model* m : {fp8_, bf16_}) {
    const Trace one_shot = run(*m, ids, 0);
    for (int64_t chunk : {3, 4, 5, 11})
      expect_bitwise_equal(one_shot, run(*m, ids, chunk), "chunk " + std::to_string(chunk));
  }
}

TEST_F(DeepseekV4Test, SwaHistorySlotsDoNotChangeTheNumerics) {
  // Rings longer than the window (prefix-cache history) change nothing: the window is what is read.
  const auto ids = prompt(21, 2);
  for (const DeepseekV4Model* m : {fp8_, bf16_}) {
    const Trace plain = run(*m, ids, 0);
    for (int64_t chunk : {1, 4, 0}) {
      auto state = m->new_sequence(SequenceOptions{.swa_history = 6});
      ASSERT_TRUE(state.ok()) << state.error().message;
      Trace t;
      ForwardOptions fo;
      fo.sink = [&t](const TensorRecord& r) {
        if (r.name != "final_norm") return;
        t.hidden.insert(t.hidden.end(), r.data.begin(), r.data.end());
        for (int64_t i = 0; i < r.rows; ++i) t.positions.push_back(r.pos0 + i);
      };
      const int64_t n = static_cast<int64_t>(ids.size()), step = chunk > 0 ? chunk : n;
      for (int64_t p = 0; p < n; p += step) {
        const int64_t len = std::min(step, n - p);
        fo.logits = p + len == n ? LogitRows::Last : LogitRows::None;
        auto out = m->forward(std::span<const int64_t>(ids).subspan(static_cast<size_t>(p), static_cast<size_t>(len)),
                              *state, fo);
        ASSERT_TRUE(out.ok()) << out.error().message;
        if (!out->logits.empty()) t.last_logits = out->logits;
      }
      expect_bitwise_equal(plain, t, "swa_history 6, chunk " + std::to_string(chunk));
      for (const SwaRing& ring : state->attention().rings) EXPECT_EQ(ring.slots(), m->config().sliding_window + 6);
    }
  }
}

TEST_F(DeepseekV4Test, DecodeEqualsOneShot) {
  const auto ids = prompt(14, 7);
  for (const DeepseekV4Model* m : {fp8_, bf16_})
    expect_bitwise_equal(run(*m, ids, 0), run(*m, ids, 1), "token by token");
}

TEST_F(DeepseekV4Test, HcaWindowChunkedEqualsOneShot) {
  // 131 tokens: one complete ratio-128 window (entry visible from position 127 on) plus a tail.
  const auto ids = prompt(131, 5);
  const Trace one_shot = run(*bf16_, ids, 0);
  expect_bitwise_equal(one_shot, run(*bf16_, ids, 50), "chunk 50");
  // Decode the last tokens one by one after a prefill that ends inside the HCA window.
  auto state = bf16_->new_sequence();
  ASSERT_TRUE(state.ok());
  ForwardOptions fo;
  fo.logits = LogitRows::None;
  ASSERT_TRUE(bf16_->forward(std::span<const int64_t>(ids).first(125), *state, fo).ok());
  std::vector<float> last;
  for (size_t i = 125; i < ids.size(); ++i) {
    fo.logits = LogitRows::Last;
    auto out = bf16_->forward(std::span<const int64_t>(ids).subspan(i, 1), *state, fo);
    ASSERT_TRUE(out.ok()) << out.error().message;
    last = out->logits;
  }
  EXPECT_EQ(bit_differences(last, one_shot.last_logits), 0u);
}

TEST_F(DeepseekV4Test, ThreadCountInvariant) {
  const auto ids = prompt(13, 9);
  ThreadPool pool3(3);
  expect_bitwise_equal(run(*fp8_, ids, 0), run(*fp8_, ids, 4, &pool3), "3 threads, chunk 4");
}

TEST_F(DeepseekV4Test, SinkNamesEveryIntermediate) {
  const auto ids = prompt(5);
  auto state = fp8_->new_sequence();
  ASSERT_TRUE(state.ok());
  std::map<std::string, std::pair<int64_t, int64_t>> seen;
  ForwardOptions fo;
  fo.sink = [&](const TensorRecord& r) { seen[std::string(r.name)] = {r.rows, r.width}; };
  ASSERT_TRUE(fp8_->forward(ids, *state, fo).ok());
  for (int l = 0; l < 5; ++l)
    for (const char* t : {"attn_in", "attn_out", "ffn_in", "ffn_out", "out"})
      EXPECT_EQ(seen.count("layers." + std::to_string(l) + "." + t), 1u) << l << t;
  EXPECT_EQ(seen["layers.0.out"], std::make_pair(int64_t{5}, int64_t{256}));
  EXPECT_EQ(seen["hc_head"], std::make_pair(int64_t{5}, int64_t{64}));
  EXPECT_EQ(seen["logits"], std::make_pair(int64_t{1}, int64_t{129280}));
}

TEST_F(DeepseekV4Test, RejectsBadTokensCedAndV41Checkpoints) {
  auto state = fp8_->new_sequence();
  ASSERT_TRUE(state.ok());
  const std::vector<int64_t> bad = {5, -1};
  auto out = fp8_->forward(bad, *state, {});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("token -1 at position 1 is outside the vocabulary"), std::string::npos)
      << out.error().message;
  EXPECT_EQ(state->length(), 0);  // rejected before anything ran

  auto ced = fp8_->new_sequence(SequenceOptions{ForwardMode::Ced, 10});
  ASSERT_FALSE(ced.ok());
  EXPECT_NE(ced.error().message.find("ced mode is unavailable for deepseek_v4"), std::string::npos)
      << ced.error().message;

  TinyCheckpointOptions o;
  o.tokenizer_files = false;
  ASSERT_TRUE(make_tiny_checkpoint(o, root_->path() / "v41", false).ok());
  auto wrong = DeepseekV4Model::load(root_->path() / "v41");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("deepseek_v4"), std::string::npos) << wrong.error().message;
}

// compress_chunk_v4 against a direct evaluation of the definition (two-half overlap, ape, softmax).
TEST(V4Compressor, OverlapPoolingMatchesTheDefinition) {
  const int64_t r = 4, hd = 2, dim = 3, n = 9;
  // Identity-like weights: kv row = [x0, x1, x2, x0], gate row = [x1, x2, x0, x2].
  std::vector<float> wkv = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0};
  std::vector<float> wg = {0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1};
  cpu::LinearWeight lkv{WeightFormat::F32, 2 * hd, dim, reinterpret_cast<const uint8_t*>(wkv.data())};
  cpu::LinearWeight lg{WeightFormat::F32, 2 * hd, dim, reinterpret_cast<const uint8_t*>(wg.data())};
  std::vector<float> ape(static_cast<size_t>(r * 2 * hd)), norm(static_cast<size_t>(hd), 1.0f),
      x(static_cast<size_t>(n * dim));
  for (size_t i = 0; i < ape.size(); ++i) ape[i] = 0.125f * static_cast<float>(static_cast<int>(i % 5) - 2);
  for (size_t i = 0; i < x.size(); ++i) x[i] = round_to_bf16(std::sin(0.7f * static_cast<float>(i)));
  auto kv_of = [&](int64_t t, int64_t c) { return x[t * dim + (c == 3 ? 0 : c)]; };
  auto gate_of = [&](int64_t t, int64_t c) {
    const int64_t src[4] = {1, 2, 0, 2};
    return x[t * dim + src[c]] + ape[(t % r) * 2 * hd + c];
  };
  // Reference entries for windows 0 and 1 (window 0 has no previous window).
  std::vector<float> expect;
  for (int64_t j = 0; j < 2; ++j) {
    std::vector<float> pooled(hd);
    for (int64_t c = 0; c < hd; ++c) {
      std::vector<std::pair<double, double>> slots;  // (gate, kv)
      if (j > 0)
        for (int64_t t = 0; t < r; ++t) slots.emplace_back(gate_of((j - 1) * r + t, c), kv_of((j - 1) * r + t, c));
      for (int64_t t = 0; t < r; ++t) slots.emplace_back(gate_of(j * r + t, hd + c), kv_of(j * r + t, hd + c));
      double m = -1e30, sum = 0, acc = 0;
      for (auto& s : slots) m = std::max(m, s.first);
      for (auto& s : slots) sum += std::exp(s.first - m);
      for (auto& s : slots) acc += s.second * std::exp(s.first - m) / sum;
      pooled[c] = round_to_bf16(static_cast<float>(acc));
    }
    const double ms = (pooled[0] * pooled[0] + pooled[1] * pooled[1]) / 2.0;
    for (int64_t c = 0; c < hd; ++c) expect.push_back(static_cast<float>(pooled[c] / std::sqrt(ms + 1e-6)));
  }
  for (int64_t split : {int64_t{9}, int64_t{3}, int64_t{5}}) {
    V4PoolState st;
    std::vector<float> got;
    int64_t groups = 0;
    for (int64_t p = 0; p < n; p += split) {
      const int64_t len = std::min(split, n - p);
      CompressedGroups g;
      ASSERT_TRUE(compress_chunk_v4(
                      {.wkv = &lkv, .wgate = &lg, .ape = ape, .norm = norm}, {.ratio = r, .width = hd}, 1e-6,
                      std::span<const float>(x).subspan(static_cast<size_t>(p * dim), static_cast<size_t>(len * dim)),
                      len, groups, st, g, nullptr)
                      .ok());
      groups += g.count;
      got.insert(got.end(), g.latent.begin(), g.latent.end());
    }
    ASSERT_EQ(groups, 2) << split;
    EXPECT_EQ(st.pending, 1) << split;
    for (size_t i = 0; i < expect.size(); ++i) EXPECT_NEAR(got[i], expect[i], 1e-2 * std::fabs(expect[i])) << i;
  }
}

TEST(V4QueryNorm, MatchesBf16Arithmetic) {
  std::vector<float> q = {1.5f, -2.0f, 0.25f, 3.0f};
  v4_query_norm(q, 4, 1e-6);
  const float ms = round_to_bf16((2.25f + 4.0f + 0.0625f + 9.0f) / 4.0f);
  const float r = round_to_bf16(1.0f / std::sqrt(round_to_bf16(ms + 1e-6f)));
  EXPECT_EQ(q[1], round_to_bf16(-2.0f * r));
  EXPECT_NEAR(q[3], 3.0f / std::sqrt(15.3125f / 4.0f), 1e-2);
}

// hc_head_collapse against a double-precision evaluation of the V4 reference's ParallelHead.hc_head.
TEST(V4HcHead, MatchesTheDefinition) {
  const int64_t hc = 4, d = 8;
  std::vector<float> X(static_cast<size_t>(hc * d)), fn(static_cast<size_t>(hc * hc * d)), base(hc), scale = {0.7f};
  for (size_t i = 0; i < X.size(); ++i)
    X[i] = round_to_bf16(std::cos(0.37f * static_cast<float>(i)) * (1.0f + (i / d)));
  for (size_t i = 0; i < fn.size(); ++i) fn[i] = 0.05f * std::sin(1.3f * static_cast<float>(i));
  for (int64_t k = 0; k < hc; ++k) base[k] = 0.25f * static_cast<float>(k) - 0.4f;
  const HcParams p{hc, d, 20, 1e-6, 1e-6};
  const HcHeadWeights w{fn, base, scale};
  ASSERT_TRUE(check_hc_head_weights(w, p).ok());
  std::vector<float> out(static_cast<size_t>(d));
  hc_head_collapse(X, w, p, out);
  double ss = 0;
  for (float v : X) ss += static_cast<double>(v) * v;
  const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(X.size()) + 1e-6);
  for (int64_t c = 0; c < d; ++c) {
    double y = 0;
    for (int64_t k = 0; k < hc; ++k) {
      double m = 0;
      for (size_t i = 0; i < X.size(); ++i) m += static_cast<double>(fn[k * hc * d + i]) * X[i];
      const double pre = 1.0 / (1.0 + std::exp(-(m * rstd * 0.7 + base[k]))) + 1e-6;
      y += pre * X[k * d + c];
    }
    EXPECT_NEAR(out[c], y, 4e-3 * std::fabs(y) + 1e-6) << c;
  }
  EXPECT_FALSE(check_hc_head_weights({fn, base, {}}, p).ok());
}

}  // namespace
}  // namespace cedar
