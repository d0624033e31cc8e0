// Indexer scoring and the hierarchical top-k on hand-built scores (architecture.md §3.6).
#include "model/indexer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/numeric.h"

namespace cedar {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<int32_t> topk(const std::vector<float>& scores, int64_t k, const std::vector<int32_t>& ids = {},
                          int64_t width = -1) {
  std::vector<int32_t> out(static_cast<size_t>(width < 0 ? k : width), 99);
  select_topk(scores, ids, k, out);
  return out;
}

std::vector<int32_t> blocks(const std::vector<float>& scores, int64_t block_size, int64_t topk_blocks) {
  std::vector<int32_t> out(static_cast<size_t>(topk_blocks), 99);
  select_candidate_blocks(scores, block_size, topk_blocks, out);
  return out;
}

using V = std::vector<int32_t>;

TEST(IndexerTopK, HighestScoresSortedAscending) {
  EXPECT_EQ(topk({1, 5, 3, 5, 2}, 3), (V{1, 2, 3}));
  EXPECT_EQ(topk({0.5f, -1, 7, 0.25f}, 1), (V{2}));
}

TEST(IndexerTopK, TiesPreferTheOlderEntry) {
  EXPECT_EQ(topk({2, 2, 2, 2}, 2), (V{0, 1}));
  // ReLU makes exact zeros common: the zero tie goes to the lower ids.
  EXPECT_EQ(topk({0, 0, 1, 0}, 2), (V{0, 2}));
  EXPECT_EQ(topk({0, 3, 0, 0, 3}, 3), (V{0, 1, 4}));
}

TEST(IndexerTopK, FewerVisibleThanKPadsWithMinusOne) {
  EXPECT_EQ(topk({4, 1}, 4), (V{0, 1, -1, -1}));
  EXPECT_EQ(topk({}, 3), (V{-1, -1, -1}));
  std::vector<int32_t> out(4);
  EXPECT_EQ(select_topk(std::vector<float>{4, 1}, {}, 4, out), 2);
}

TEST(IndexerTopK, MinusInfinityIsNeverSelected) {
  EXPECT_EQ(topk({-kInf, 1, -kInf}, 3), (V{1, -1, -1}));
  EXPECT_EQ(topk({-kInf, -kInf}, 2), (V{-1, -1}));
  // +inf is a score like any other.
  EXPECT_EQ(topk({kInf, 0, 1}, 1), (V{0}));
}

TEST(IndexerTopK, ExplicitIdsRestrictToACandidatePool) {
  // Reindex layers score only their pool; ids name the entries.
  EXPECT_EQ(topk({0.5f, -kInf, 3, 1}, 2, {4, 5, 10, 11}), (V{10, 11}));
  EXPECT_EQ(topk({0.5f, 0.5f}, 4, {6, 7}), (V{6, 7, -1, -1}));
}

TEST(IndexerCandidates, BlockMaxWithNewestBlockPinned) {
  // V = 7, blocks of 2: [0.1 0.2 | 5 0 | 0.3 0.3 | 0.05]: block scores 0.2, 5, 0.3, newest pinned.
  EXPECT_EQ(blocks({0.1f, 0.2f, 5, 0, 0.3f, 0.3f, 0.05f}, 2, 2), (V{1, 3}));
  EXPECT_EQ(blocks({0.1f, 0.2f, 5, 0, 0.3f, 0.3f, 0.05f}, 2, 3), (V{1, 2, 3}));
  // The newest block is kept even when it scores lowest and the pool holds a single block.
  EXPECT_EQ(blocks({9, 9, 9, 9, -3}, 2, 1), (V{2}));
}

TEST(IndexerCandidates, UnreachableBlocksAreDropped) {
  EXPECT_EQ(blocks({-kInf, -kInf, -kInf, -kInf, 1}, 2, 3), (V{2, -1, -1}));
  EXPECT_EQ(blocks({}, 2, 2), (V{-1, -1}));
}

TEST(IndexerCandidates, MoreBlocksAllowedThanExistKeepsAll) {
  EXPECT_EQ(blocks({1, 2, 3}, 8, 4), (V{0, -1, -1, -1}));
  EXPECT_EQ(blocks({1, 2, 3, 4, 5}, 2, 4), (V{0, 1, 2, -1}));
}

TEST(IndexerCandidates, TiesPreferTheOlderBlock) {
  EXPECT_EQ(blocks({1, 1, 1, 1, 1, 1, 0}, 2, 3), (V{0, 1, 3}));
}

// Reference precision: bf16(Σ_h bf16(ReLU(bf16(q_h·k)) · w_h)). Inputs on a coarse grid keep the
// fp32 dot products exact, so the expected value follows from the rounding rule alone.
TEST(IndexerScore, ReferenceRoundsEinsumReluProductAndSumToBf16) {
  const int64_t heads = 3, hd = 32;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> d(-7, 7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> q(heads * hd), k(hd), w(heads);
    for (auto& v : q) v = d(rng) * 0.125f;
    for (auto& v : k) v = d(rng) * 0.0625f;
    for (auto& v : w) v = round_to_bf16(std::uniform_real_distribution<float>(0.01f, 1.0f)(rng));
    double expected = 0;
    for (int64_t h = 0; h < heads; ++h) {
      double dot = 0;
      for (int64_t c = 0; c < hd; ++c) dot += double(q[h * hd + c]) * k[c];
      const float relu = std::max(round_to_bf16(static_cast<float>(dot)), 0.0f);
      expected += round_to_bf16(relu * w[h]);
    }
    const float got = index_score(q.data(), w.data(), k.data(), heads, hd, IndexScorePrecision::Reference, 0.0f);
    ASSERT_EQ(got, round_to_bf16(static_cast<float>(expected))) << trial;
  }
}

TEST(IndexerScore, Fp32MatchesDoubleFormula) {
  const int64_t heads = 4, hd = 128;
  std::mt19937 rng(4);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> q(heads * hd), k(hd), w(heads);
  for (auto& v : q) v = d(rng);
  for (auto& v : k) v = d(rng);
  for (auto& v : w) v = d(rng);
  const float scale = static_cast<float>(1.0 / std::sqrt(128.0));
  double expected = 0;
  for (int64_t h = 0; h < heads; ++h) {
    double dot = 0;
    for (int64_t c = 0; c < hd; ++c) dot += double(q[h * hd + c]) * k[c];
    expected += std::max(dot, 0.0) * scale * w[h];
  }
  EXPECT_NEAR(index_score(q.data(), w.data(), k.data(), heads, hd, IndexScorePrecision::Fp32, scale), expected,
              1e-4 * (1 + std::fabs(expected)));
}

}  // namespace
}  // namespace cedar
