// Whole attention_forward on a tiny random V4.1 config with every CSA2 mode (SWA only, Full ratio 2,
// Reuse, Full ratio 1 + candidate source, Reindex restricted to the candidate pool): chunked prefill
// and token-by-token decode equal one-shot prefill bit for bit, the visibility rule, the candidate
// restriction, ring wraparound, and the errors for calls that do not fit the state.
#include "model/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "attention_runner.h"

namespace cedar {
namespace {

using test::RunResult;
using test::TinyModel;

constexpr int64_t kTokens = 41;

TEST(AttentionForward, TinyPlanHasEveryMode) {
  TinyModel m(1);
  ASSERT_EQ(m.layers(), 8);
  EXPECT_EQ(m.plan.layers[0].mode, AttnMode::SwaOnly);
  EXPECT_EQ(m.plan.layers[2].mode, AttnMode::Full);
  EXPECT_EQ(m.plan.layers[2].compress_ratio, 2);
  EXPECT_EQ(m.plan.layers[3].mode, AttnMode::Reuse);
  EXPECT_EQ(m.plan.layers[5].mode, AttnMode::Full);
  EXPECT_TRUE(m.plan.layers[5].is_candidate_source);
  EXPECT_EQ(m.plan.layers[6].mode, AttnMode::Reuse);
  EXPECT_EQ(m.plan.layers[7].mode, AttnMode::Reindex);
  EXPECT_TRUE(m.plan.layers[7].uses_candidates);
  EXPECT_EQ(m.p.window, 8);
  EXPECT_EQ(m.p.index_topk, 4);
}

// Both numeric modes: the official reference's (bf16 index scores, bf16 numerators) and the HF port's.
class ChunkedPrefill : public ::testing::TestWithParam<bool> {};

TEST_P(ChunkedPrefill, EqualsOneShotBitwise) {
  const bool reference = GetParam();
  TinyModel m(kTokens, reference ? IndexScorePrecision::Reference : IndexScorePrecision::Fp32, reference);
  const RunResult one = run_schedule(m, {kTokens});
  ThreadPool pool(2);
  for (const std::vector<int64_t>& chunks :
       {std::vector<int64_t>{5, 1, 12, 19, 4}, std::vector<int64_t>{7, 7, 7, 7, 7, 6}, std::vector<int64_t>{16, 25},
        std::vector<int64_t>{1, 2, 3, 35}}) {
    SCOPED_TRACE("first chunk " + std::to_string(chunks[0]) + " of " + std::to_string(chunks.size()));
    const RunResult got = run_schedule(m, chunks, &pool);
    test::expect_same_outputs(m, one, got, 0, kTokens);
    EXPECT_EQ(got.topk, one.topk);
    EXPECT_EQ(got.candidates, one.candidates);
    test::expect_same_state(one.st, got.st);
  }
}

INSTANTIATE_TEST_SUITE_P(NumericModes, ChunkedPrefill, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& param_info) { return param_info.param ? "Reference" : "HfFp32"; });

TEST(AttentionForward, TokenByTokenDecodeEqualsOneShotBitwise) {
  TinyModel m(kTokens);
  const RunResult one = run_schedule(m, {kTokens});
  std::vector<int64_t> decode(kTokens, 1);
  test::expect_same_outputs(m, one, run_schedule(m, decode), 0, kTokens);
  std::vector<int64_t> prefill_then_decode{13};
  prefill_then_decode.resize(kTokens - 12, 1);
  const RunResult got = run_schedule(m, prefill_then_decode);
  test::expect_same_outputs(m, one, got, 0, kTokens);
  EXPECT_EQ(got.topk, one.topk);
  test::expect_same_state(one.st, got.st);
}

TEST(AttentionForward, OutputsAreBf16AndFinite) {
  TinyModel m(kTokens);
  const RunResult r = run_schedule(m, {kTokens});
  for (const auto& layer : r.out)
    for (float v : layer) {
      ASSERT_TRUE(std::isfinite(v));
      ASSERT_EQ(v, round_to_bf16(v));
    }
}

// Entry j is visible to the query at p iff j < (p+1)/ratio; top-k keeps min(index_topk, visible).
TEST(AttentionForward, TopKRespectsVisibility) {
  TinyModel m(kTokens);
  const RunResult r = run_schedule(m, {kTokens});
  for (int64_t layer : {2, 5}) {
    const int64_t ratio = m.plan.layers[static_cast<size_t>(layer)].compress_ratio;
    const auto& tk = r.topk.at(layer);
    for (int64_t p = 0; p < kTokens; ++p) {
      const int64_t visible = (p + 1) / ratio;
      std::vector<int32_t> row(tk.begin() + p * m.p.index_topk, tk.begin() + (p + 1) * m.p.index_topk);
      const auto valid = std::count_if(row.begin(), row.end(), [](int32_t j) { return j >= 0; });
      EXPECT_EQ(valid, std::min(m.p.index_topk, visible)) << "layer " << layer << " p " << p;
      for (int64_t i = 0; i < m.p.index_topk; ++i) {
        if (i < valid) {
          EXPECT_LT(row[i], visible) << "layer " << layer << " p " << p;
          if (i > 0) {
            EXPECT_GT(row[i], row[i - 1]);
          }
        } else {
          EXPECT_EQ(row[i], -1);
        }
      }
    }
  }
}

// Layer 7 (Reindex) picks only entries inside layer 5's kept blocks; layer 5's own top-k is not
// restricted; the newest visible block is always in the pool.
TEST(AttentionForward, ReindexIsRestrictedToTheCandidatePool) {
  TinyModel m(kTokens);
  const RunResult r = run_schedule(m, {kTokens});
  const int64_t bs = m.p.candidate_block_size, width = m.p.candidate_topk_blocks, k = m.p.index_topk;
  bool source_went_outside = false;
  for (int64_t p = 0; p < kTokens; ++p) {
    const int64_t visible = p + 1;  // ratio 1
    std::set<int64_t> pool;
    std::set<int32_t> blocks;
    for (int64_t b = 0; b < width; ++b) {
      const int32_t blk = r.candidates[static_cast<size_t>(p * width + b)];
      if (blk < 0) continue;
      blocks.insert(blk);
      for (int64_t j = blk * bs; j < std::min(visible, (blk + 1) * bs); ++j) pool.insert(j);
    }
    EXPECT_EQ(static_cast<int64_t>(blocks.size()), std::min(width, (visible + bs - 1) / bs)) << p;
    EXPECT_TRUE(blocks.count(static_cast<int32_t>((visible - 1) / bs))) << "newest block not pinned at p " << p;
    int64_t valid = 0;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t j = r.topk.at(7)[static_cast<size_t>(p * k + i)];
      if (j < 0) continue;
      ++valid;
      EXPECT_TRUE(pool.count(j)) << "p " << p << " picked " << j << " outside the pool";
    }
    EXPECT_EQ(valid, std::min<int64_t>(k, static_cast<int64_t>(pool.size()))) << p;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t j = r.topk.at(5)[static_cast<size_t>(p * k + i)];
      if (j >= 0 && !pool.count(j)) source_went_outside = true;
    }
  }
  EXPECT_TRUE(source_went_outside) << "test too weak: layer 5 never selected outside its own pool";
}

TEST(AttentionForward, RingHoldsTheLastWindowPositionsAfterWraparound) {
  TinyModel m(20);
  const RunResult r = run_schedule(m, {5, 6, 9});
  for (const SwaRing& ring : r.st.rings) {
    ASSERT_EQ(ring.slots(), 8);
    for (int64_t s = 0; s < 8; ++s) EXPECT_EQ(ring.slot_position(s), 12 + (s + 4) % 8) << s;  // 12..19
  }
  // A chunk longer than the window writes only its last `window` positions.
  const RunResult one = run_schedule(m, {20});
  test::expect_same_state(one.st, r.st);
  // Decode across the wrap point keeps slot = pos % window.
  const RunResult dec = run_schedule(m, std::vector<int64_t>(20, 1));
  test::expect_same_state(one.st, dec.st);
}

TEST(AttentionForward, SourcesCacheOneEntryPerCompleteGroup) {
  TinyModel m(kTokens);
  const RunResult r = run_schedule(m, {kTokens});
  const KvSourceState* s2 = r.st.source(2);
  const KvSourceState* s5 = r.st.source(5);
  ASSERT_NE(s2, nullptr);
  ASSERT_NE(s5, nullptr);
  EXPECT_EQ(r.st.source(3), nullptr);
  EXPECT_EQ(s2->kv.size(), kTokens / 2);
  EXPECT_EQ(s2->index_k.size(), kTokens / 2);
  EXPECT_EQ(s2->pending, 1);
  EXPECT_EQ(s5->kv.size(), kTokens);
  for (int64_t j = 0; j < s2->kv.size(); ++j) EXPECT_EQ(s2->kv.position(j), 2 * j);
}

class AttentionErrors : public ::testing::Test {
 protected:
  TinyModel m{16};
  AttentionState st = AttentionState::create(m.plan, m.p);
  AttentionScratch scratch;
  std::vector<float> out = std::vector<float>(static_cast<size_t>(16 * m.p.dim));

  std::string call(int64_t layer, int64_t pos0, int64_t n, int64_t swa_start = 0,
                   AttentionPass pass = AttentionPass::Exact) {
    AttentionCall c{.layer = layer, .role = &m.plan.layers[static_cast<size_t>(layer)], .pos0 = pos0, .n = n,
                    .swa_start = swa_start, .pass = pass};
    const Status s = attention_forward(c, m.rows(layer, pos0, n), m.w[static_cast<size_t>(layer)], m.p, st, scratch,
                                       std::span<float>(out).subspan(0, static_cast<size_t>(n * m.p.dim)), nullptr);
    return s.ok() ? "" : s.error().message;
  }
};

TEST_F(AttentionErrors, MissingWindowKeysNeedTruncation) {
  const std::string e = call(0, 6, 4);
  EXPECT_NE(e.find("layer 0"), std::string::npos) << e;
  EXPECT_NE(e.find("position 0 is not in the ring"), std::string::npos) << e;
  EXPECT_EQ(call(0, 6, 4, /*swa_start=*/6), "");
}

TEST_F(AttentionErrors, CompressorChunksMustBeContiguous) {
  ASSERT_EQ(call(2, 0, 4), "");
  const std::string e = call(2, 6, 2, 6);
  EXPECT_NE(e.find("has consumed 4 positions"), std::string::npos) << e;
}

TEST_F(AttentionErrors, ReuseNeedsItsSourcesInTheSameChunk) {
  ASSERT_EQ(call(2, 0, 4), "");
  std::string e = call(3, 4, 2, 4);  // source cache ends at position 4
  EXPECT_NE(e.find("compressed entries"), std::string::npos) << e;
  e = call(3, 0, 2);  // cache is there, but layer 2 did not publish top-k for [0, 2)
  EXPECT_NE(e.find("index source layer 2 did not run"), std::string::npos) << e;
  ASSERT_EQ(call(5, 0, 3), "");
  ASSERT_EQ(call(5, 3, 1), "");
  e = call(7, 0, 3);  // candidate pool of layer 5 is for [3, 4)
  EXPECT_NE(e.find("candidate"), std::string::npos) << e;
}

TEST_F(AttentionErrors, BadCallsAreRejected) {
  EXPECT_NE(call(0, 2, 2, 3), "");                               // swa_start > pos0
  EXPECT_NE(call(0, 0, 2, 0, AttentionPass::GlobalKvOnly), "");  // not a KV source
  AttentionWeights w = m.w[0];
  w.wq_b.in += 1;
  AttentionCall c{.layer = 0, .role = &m.plan.layers[0], .pos0 = 0, .n = 1};
  const Status s = attention_forward(c, m.rows(0, 0, 1), w, m.p, st, scratch,
                                     std::span<float>(out).subspan(0, static_cast<size_t>(m.p.dim)), nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("wq_b"), std::string::npos) << s.error().message;
  EXPECT_EQ(st.rings[0].slot_position(0), -1) << "a rejected call must not change the state";
}

}  // namespace
}  // namespace cedar
