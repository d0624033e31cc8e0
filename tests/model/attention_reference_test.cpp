// attention_forward against a formulation written here from architecture.md §3.4–§3.7: the q / SWA KV
// paths from the reference ops (linear, RMSNorm, RoPE, QDQ — each tested on its own), the window
// chosen by position, one double-precision softmax with sink over window ∪ selected, the inverse
// rotation in double, the grouped wo_a in double, then wo_b. And the indexer's selections against
// scores computed here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "attention_runner.h"
#include "core/numeric.h"

namespace cedar {
namespace {

using test::RunResult;
using test::TinyModel;

constexpr int64_t kTokens = 30;

struct LayerPaths {
  std::vector<float> qr, q, kv;  // [N, q_lora], [N, heads·head_dim], [N, head_dim]
};

LayerPaths own_paths(const TinyModel& m, int64_t layer) {
  const auto& p = m.p;
  const auto& w = m.w[static_cast<size_t>(layer)];
  const cpu::RopeTable& rope = p.rope_for(m.plan.layers[static_cast<size_t>(layer)]);
  const int64_t n = m.max_tokens, hq = p.n_heads * p.head_dim;
  LayerPaths r;
  std::vector<float> qa(static_cast<size_t>(n * p.q_lora)), k(static_cast<size_t>(n * p.head_dim));
  EXPECT_TRUE(cpu::linear(w.wq_a, m.rows(layer, 0, n), n, qa, {}, nullptr).ok());
  r.qr.resize(qa.size());
  cpu::rms_norm(qa, p.q_lora, w.q_norm, p.eps, r.qr);
  r.q.resize(static_cast<size_t>(n * hq));
  EXPECT_TRUE(cpu::linear(w.wq_b, r.qr, n, r.q, {}, nullptr).ok());
  EXPECT_TRUE(cpu::linear(w.wkv, m.rows(layer, 0, n), n, k, {}, nullptr).ok());
  r.kv.resize(k.size());
  cpu::rms_norm(k, p.head_dim, w.kv_norm, p.eps, r.kv);
  for (int64_t t = 0; t < n; ++t) {
    rope.apply(std::span<float>(r.q).subspan(static_cast<size_t>(t * hq), static_cast<size_t>(hq)), p.n_heads,
               p.head_dim, t);
    std::span<float> kv(r.kv.data() + t * p.head_dim, static_cast<size_t>(p.head_dim));
    rope.apply(kv, 1, p.head_dim, t);
    EXPECT_TRUE(qdq_fp8_block32_ue8m0(kv).ok());
  }
  return r;
}

// Expected [N, dim] output of `layer` given the compressed entries and top-k of the run under test.
std::vector<float> expected_output(const TinyModel& m, const RunResult& run, int64_t layer) {
  const auto& p = m.p;
  const LayerRole& role = m.plan.layers[static_cast<size_t>(layer)];
  const auto& w = m.w[static_cast<size_t>(layer)];
  const cpu::RopeTable& rope = p.rope_for(role);
  const LayerPaths paths = own_paths(m, layer);
  const int64_t n = m.max_tokens, hd = p.head_dim, hq = p.n_heads * hd;
  const int64_t in_g = hq / p.o_groups;
  const auto wo_a = test::dequantize(w.wo_a);
  std::vector<float> u(static_cast<size_t>(n * p.o_groups * p.o_lora));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<const float*> keys;
    std::vector<std::vector<float>> entries;  // decoded compressed entries (stable storage for `keys`)
    entries.reserve(static_cast<size_t>(p.index_topk));
    for (int64_t s = std::max<int64_t>(0, t - p.window + 1); s <= t; ++s) keys.push_back(&paths.kv[s * hd]);
    if (role.compress_ratio > 0) {
      const KvSourceState* src = run.st.source(role.kv_source);
      const auto& tk = run.topk.at(role.index_source);
      for (int64_t i = 0; i < p.index_topk; ++i) {
        const int32_t j = tk[static_cast<size_t>(t * p.index_topk + i)];
        if (j < 0) continue;
        EXPECT_LT(j, (t + 1) / role.compress_ratio);
        entries.push_back(src->kv.decoded(j));
        keys.push_back(entries.back().data());
      }
    }
    std::vector<double> o(static_cast<size_t>(hq), 0.0);
    for (int64_t h = 0; h < p.n_heads; ++h) {
      std::vector<double> s(keys.size());
      double mx = -INFINITY;
      for (size_t j = 0; j < keys.size(); ++j) {
        double dot = 0;
        for (int64_t c = 0; c < hd; ++c) dot += double(paths.q[t * hq + h * hd + c]) * keys[j][c];
        s[j] = dot / std::sqrt(double(hd));
        mx = std::max(mx, s[j]);
      }
      double den = std::exp(double(w.attn_sink[h]) - mx);
      for (double v : s) den += std::exp(v - mx);
      for (size_t j = 0; j < keys.size(); ++j)
        for (int64_t c = 0; c < hd; ++c) o[h * hd + c] += std::exp(s[j] - mx) / den * keys[j][c];
      // Conjugate rotation at the query position on the trailing rope_dim channels.
      for (int64_t i = 0; i < p.rope_dim / 2; ++i) {
        const double a = double(static_cast<float>(t) * rope.inv_freq()[i]);
        double& e = o[h * hd + hd - p.rope_dim + 2 * i];
        double& od = o[h * hd + hd - p.rope_dim + 2 * i + 1];
        const double e0 = e, o0 = od;
        e = e0 * std::cos(a) + o0 * std::sin(a);
        od = -e0 * std::sin(a) + o0 * std::cos(a);
      }
    }
    for (int64_t g = 0; g < p.o_groups; ++g)
      for (int64_t r = 0; r < p.o_lora; ++r) {
        double acc = 0;
        for (int64_t c = 0; c < in_g; ++c) acc += wo_a[(g * p.o_lora + r) * in_g + c] * o[g * in_g + c];
        u[static_cast<size_t>((t * p.o_groups + g) * p.o_lora + r)] = round_to_bf16(static_cast<float>(acc));
      }
  }
  std::vector<float> out(static_cast<size_t>(n * p.dim));
  EXPECT_TRUE(cpu::linear(w.wo_b, u, n, out, {}, nullptr).ok());
  return out;
}

class AttentionVsFormulation : public ::testing::TestWithParam<int64_t> {};

TEST_P(AttentionVsFormulation, LayerOutputMatches) {
  const int64_t layer = GetParam();
  TinyModel m(kTokens);
  const RunResult run = run_schedule(m, {11, 1, 18});
  const auto expected = expected_output(m, run, layer);
  const auto& got = run.out[static_cast<size_t>(layer)];
  double err = 0, norm = 0, max_ref = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    err += (got[i] - expected[i]) * double(got[i] - expected[i]);
    norm += double(expected[i]) * expected[i];
    max_ref = std::max(max_ref, std::fabs(double(expected[i])));
  }
  // bf16 roundings (o, inverse rope, wo_a) can flip FP8 activation codes in wo_b: small, rare errors.
  EXPECT_LT(std::sqrt(err / norm), 2e-2) << "layer " << layer;
  for (size_t i = 0; i < expected.size(); ++i)
    ASSERT_NEAR(got[i], expected[i], 0.1 * max_ref) << "layer " << layer << " position " << i / m.p.dim;
}

// 0: SWA only (main rope); 2: Full ratio 2; 3: Reuse; 5: Full ratio 1; 6: Reuse; 7: Reindex.
INSTANTIATE_TEST_SUITE_P(Layers, AttentionVsFormulation, ::testing::Values(0, 2, 3, 5, 6, 7));

// Every selected entry scores at least as high as every visible unselected one (in the pool, for the
// Reindex layer), with scores computed here in double from the indexer's definition; the slack covers
// the reference's bf16 rounding of the score terms.
TEST(AttentionIndexer, SelectionsAgreeWithIndependentScores) {
  for (IndexScorePrecision precision : {IndexScorePrecision::Reference, IndexScorePrecision::Fp32}) {
    TinyModel m(kTokens, precision);
    const RunResult run = run_schedule(m, {kTokens});
    const auto& p = m.p;
    const int64_t ih = p.index_heads, id = p.index_head_dim;
    for (int64_t layer : {2, 5, 7}) {
      SCOPED_TRACE("layer " + std::to_string(layer));
      const LayerRole& role = m.plan.layers[static_cast<size_t>(layer)];
      const auto& w = m.w[static_cast<size_t>(layer)];
      const cpu::RopeTable& rope = p.rope_for(role);
      const LayerPaths paths = own_paths(m, layer);
      std::vector<float> qi(static_cast<size_t>(kTokens * ih * id)), wt(static_cast<size_t>(kTokens * ih));
      ASSERT_TRUE(cpu::linear(w.wq_b_i, paths.qr, kTokens, qi, {}, nullptr).ok());
      ASSERT_TRUE(cpu::linear(w.weights_proj, m.rows(layer, 0, kTokens), kTokens, wt, {}, nullptr).ok());
      const KvSourceState* src = run.st.source(role.kv_source);
      int64_t decided = 0;
      for (int64_t t = 0; t < kTokens; ++t) {
        std::span<float> q(qi.data() + t * ih * id, static_cast<size_t>(ih * id));
        rope.apply(q, ih, id, t);
        ASSERT_TRUE(qdq_fp4_block32_ue8m0(q).ok());
        const int64_t visible = (t + 1) / role.compress_ratio;
        std::vector<double> score(static_cast<size_t>(visible));
        double smax = 0;
        for (int64_t j = 0; j < visible; ++j) {
          const std::vector<float> key_j = src->index_k.decoded(j);
          double acc = 0;
          for (int64_t h = 0; h < ih; ++h) {
            double dot = 0;
            for (int64_t c = 0; c < id; ++c) dot += double(q[h * id + c]) * key_j[c];
            acc += std::max(dot, 0.0) * wt[t * ih + h] / std::sqrt(double(id * ih));
          }
          score[j] = acc;
          smax = std::max(smax, std::fabs(acc));
        }
        std::vector<bool> in_pool(static_cast<size_t>(visible), !role.uses_candidates);
        if (role.uses_candidates)
          for (int64_t b = 0; b < p.candidate_topk_blocks; ++b) {
            const int32_t blk = run.candidates[static_cast<size_t>(t * p.candidate_topk_blocks + b)];
            for (int64_t j = blk * p.candidate_block_size; blk >= 0 && j < std::min(visible, (blk + 1) * p.candidate_block_size); ++j)
              in_pool[j] = true;
          }
        std::vector<bool> chosen(static_cast<size_t>(visible), false);
        for (int64_t i = 0; i < p.index_topk; ++i) {
          const int32_t j = run.topk.at(layer)[static_cast<size_t>(t * p.index_topk + i)];
          if (j >= 0) chosen[j] = true;
        }
        double min_chosen = INFINITY, max_other = -INFINITY;
        for (int64_t j = 0; j < visible; ++j) {
          if (chosen[j]) min_chosen = std::min(min_chosen, score[j]);
          else if (in_pool[j]) max_other = std::max(max_other, score[j]);
        }
        if (std::isfinite(min_chosen) && std::isfinite(max_other)) {
          ++decided;
          EXPECT_GE(min_chosen, max_other - 0.02 * smax - 1e-6) << "query " << t;
        }
      }
      EXPECT_GT(decided, 10) << "too few queries had a choice to make";
    }
  }
}

}  // namespace
}  // namespace cedar
