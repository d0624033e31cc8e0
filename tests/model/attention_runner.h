// Runs every layer's attention of the tiny V4.1 config over a sequence in a given chunk schedule,
// collecting outputs, published top-k and candidate blocks, for the whole-forward tests.
#pragma once

#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "attention_test_util.h"
#include "model/attention.h"

namespace cedar::test {

struct TinyModel {
  ModelConfig cfg;
  LayerPlan plan;
  AttentionParams p;
  WeightStore ws;
  std::vector<AttentionWeights> w;
  int64_t max_tokens = 0;
  std::vector<std::vector<float>> x;  // per layer [max_tokens, dim]: the layer's input at each position

  explicit TinyModel(int64_t tokens, IndexScorePrecision precision = IndexScorePrecision::Reference,
                     bool bf16_probabilities = true)
      : max_tokens(tokens) {
    cfg = tiny_config();
    auto plan_or = build_layer_plan(cfg);
    EXPECT_TRUE(plan_or.ok()) << plan_or.error().message;
    if (plan_or.ok()) plan = *plan_or;
    auto p_or = attention_params_from_config(cfg);
    EXPECT_TRUE(p_or.ok()) << p_or.error().message;
    if (p_or.ok()) p = *p_or;
    p.index_precision = precision;
    p.bf16_probabilities = bf16_probabilities;
    for (const LayerRole& role : plan.layers) {
      w.push_back(random_layer_weights(ws, p, role, static_cast<uint32_t>(role.layer + 1)));
      x.push_back(random_bf16(static_cast<size_t>(tokens * p.dim), 1000u + static_cast<uint32_t>(role.layer), 1.0f));
    }
  }
  int64_t layers() const { return plan.num_layers(); }
  std::span<const float> rows(int64_t layer, int64_t pos0, int64_t n) const {
    return std::span<const float>(x[static_cast<size_t>(layer)]).subspan(static_cast<size_t>(pos0 * p.dim),
                                                                          static_cast<size_t>(n * p.dim));
  }
};

struct RunResult {
  std::vector<std::vector<float>> out;              // per layer [tokens, dim] (NaN where not computed)
  std::map<int64_t, std::vector<int32_t>> topk;     // index source layer → [tokens, index_topk]
  std::vector<int32_t> candidates;                  // [tokens, candidate_topk_blocks]
  AttentionState st;
};

// One call of every layer in [first_layer, last_layer] for the chunk [pos0, pos0+n).
struct ChunkSpec {
  int64_t pos0 = 0, n = 0;
  int64_t first_layer = 0, last_layer = -1;  // -1: the last layer
  int64_t swa_start = 0;
  AttentionPass pass = AttentionPass::Exact;
  std::vector<int64_t> global_only_layers = {};  // run GlobalKvOnly instead of `pass` for these layers
};

inline void run_chunk(const TinyModel& m, const ChunkSpec& c, RunResult& r, AttentionScratch& scratch,
                      ThreadPool* pool) {
  const int64_t last = c.last_layer < 0 ? m.layers() - 1 : c.last_layer;
  const int64_t dim = m.p.dim;
  for (int64_t l = c.first_layer; l <= last; ++l) {
    const LayerRole& role = m.plan.layers[static_cast<size_t>(l)];
    AttentionCall call{.layer = l, .role = &role, .pos0 = c.pos0, .n = c.n, .swa_start = c.swa_start, .pass = c.pass};
    for (int64_t g : c.global_only_layers)
      if (g == l) call.pass = AttentionPass::GlobalKvOnly;
    std::vector<float> out(call.pass == AttentionPass::GlobalKvOnly ? 0 : static_cast<size_t>(c.n * dim));
    const Status s = attention_forward(call, m.rows(l, c.pos0, c.n), m.w[static_cast<size_t>(l)], m.p, r.st, scratch,
                                       out, pool);
    ASSERT_TRUE(s.ok()) << s.error().message;
    if (call.pass == AttentionPass::GlobalKvOnly) continue;
    std::copy(out.begin(), out.end(), r.out[static_cast<size_t>(l)].begin() + c.pos0 * dim);
    if (role.owns_indexer) {
      const auto& tk = scratch.topk_of(l);
      auto& dst = r.topk[l];
      dst.resize(static_cast<size_t>(m.max_tokens * tk.width), -2);
      std::copy(tk.idx.begin(), tk.idx.end(), dst.begin() + c.pos0 * tk.width);
    }
    if (role.is_candidate_source) {
      const auto& cb = scratch.candidates;
      r.candidates.resize(static_cast<size_t>(m.max_tokens * cb.width), -2);
      std::copy(cb.blocks.begin(), cb.blocks.end(), r.candidates.begin() + c.pos0 * cb.width);
    }
  }
}

inline RunResult new_result(const TinyModel& m) {
  RunResult r;
  r.st = AttentionState::create(m.plan, m.p);
  r.out.assign(static_cast<size_t>(m.layers()),
               std::vector<float>(static_cast<size_t>(m.max_tokens * m.p.dim), std::nanf("")));
  return r;
}

// All layers, exact, over consecutive chunks of the given sizes from position 0.
inline RunResult run_schedule(const TinyModel& m, const std::vector<int64_t>& chunks, ThreadPool* pool = nullptr) {
  RunResult r = new_result(m);
  AttentionScratch scratch;  // reused across chunks, as a forward loop would
  int64_t pos = 0;
  for (int64_t n : chunks) {
    run_chunk(m, {.pos0 = pos, .n = n}, r, scratch, pool);
    pos += n;
  }
  return r;
}

inline void expect_same_state(const AttentionState& a, const AttentionState& b) {
  ASSERT_EQ(a.rings.size(), b.rings.size());
  for (size_t l = 0; l < a.rings.size(); ++l)
    for (int64_t s = 0; s < a.rings[l].slots(); ++s) {
      const int64_t pos = a.rings[l].slot_position(s);
      ASSERT_EQ(pos, b.rings[l].slot_position(s)) << "layer " << l << " slot " << s;
      if (pos < 0) continue;
      const std::vector<float> ka = a.rings[l].decoded(pos), kb = b.rings[l].decoded(pos);
      ASSERT_EQ(static_cast<int64_t>(ka.size()), a.rings[l].width());
      for (int64_t c = 0; c < a.rings[l].width(); ++c) ASSERT_EQ(ka[c], kb[c]) << "layer " << l << " pos " << pos;
    }
  ASSERT_EQ(a.sources.size(), b.sources.size());
  for (size_t i = 0; i < a.sources.size(); ++i) {
    const KvSourceState &x = a.sources[i], &y = b.sources[i];
    ASSERT_EQ(x.kv.size(), y.kv.size()) << "source " << x.layer;
    ASSERT_EQ(x.index_k.size(), y.index_k.size());
    for (int64_t j = 0; j < x.kv.size(); ++j) {
      ASSERT_EQ(x.kv.position(j), y.kv.position(j));
      const std::vector<float> ex = x.kv.decoded(j), ey = y.kv.decoded(j);
      for (int64_t c = 0; c < x.kv.width(); ++c) ASSERT_EQ(ex[c], ey[c]) << x.layer << "," << j;
      const std::vector<float> kx = x.index_k.decoded(j), ky = y.index_k.decoded(j);
      for (int64_t c = 0; c < x.index_k.width(); ++c) ASSERT_EQ(kx[c], ky[c]);
    }
    EXPECT_EQ(x.pending, y.pending);
    EXPECT_EQ(x.pending_kv, y.pending_kv);
    EXPECT_EQ(x.pending_gate, y.pending_gate);
  }
}

// Bitwise equality of layer outputs for positions [from, to).
inline void expect_same_outputs(const TinyModel& m, const RunResult& a, const RunResult& b, int64_t from, int64_t to,
                                int64_t first_layer = 0) {
  for (int64_t l = first_layer; l < m.layers(); ++l)
    for (int64_t i = from * m.p.dim; i < to * m.p.dim; ++i)
      ASSERT_EQ(a.out[static_cast<size_t>(l)][static_cast<size_t>(i)], b.out[static_cast<size_t>(l)][static_cast<size_t>(i)])
          << "layer " << l << " position " << i / m.p.dim << " channel " << i % m.p.dim;
}

}  // namespace cedar::test
