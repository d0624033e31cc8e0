// SWA bounded replay (architecture.md §3.11): keys before swa_start are invisible in the window,
// compressed attention is not truncated. Decoder replay (last KV source runs GlobalKvOnly over the
// head, the decoder layers only the tail) and encoder replay (SwaReplay over cached positions)
// reproduce the exact run wherever the truncated window covers the same keys.
#include <gtest/gtest.h>

#include <algorithm>

#include "attention_runner.h"

namespace cedar {
namespace {

using test::ChunkSpec;
using test::RunResult;
using test::TinyModel;

constexpr int64_t kTokens = 41;

// Layers 0–4 = encoder, 5 = last KV source (candidate source), 6–7 = decoder, as in the tiny plan.
TEST(AttentionReplay, DecoderBoundedReplayMatchesExactOnceTheWindowIsInsideTheTail) {
  TinyModel m(kTokens);
  ASSERT_EQ(m.plan.last_kv_source, 5);
  const int64_t s = 24, w = m.p.window, prompt = kTokens - 1;
  const RunResult exact = run_schedule(m, {prompt, 1});

  RunResult r = test::new_result(m);
  AttentionScratch scratch;
  // Prompt: encoder on every token, layer 5 only writes global KV for the head, decoder on the tail.
  run_chunk(m, {.pos0 = 0, .n = prompt, .last_layer = 4}, r, scratch, nullptr);
  run_chunk(m, {.pos0 = 0, .n = s, .first_layer = 5, .last_layer = 5, .global_only_layers = {5}}, r, scratch, nullptr);
  run_chunk(m, {.pos0 = s, .n = prompt - s, .first_layer = 5, .swa_start = s}, r, scratch, nullptr);
  // Decode keeps the truncation (the rings never held positions before s).
  run_chunk(m, {.pos0 = prompt, .n = 1, .last_layer = 4}, r, scratch, nullptr);
  run_chunk(m, {.pos0 = prompt, .n = 1, .first_layer = 5, .swa_start = s}, r, scratch, nullptr);

  test::expect_same_state(exact.st, r.st);  // global caches and (last-window) rings agree
  // The encoder ran exactly; decoder outputs agree where [p−W+1, p] ⊂ [s, p] ...
  for (int64_t layer = 0; layer < 5; ++layer)
    for (int64_t i = 0; i < kTokens * m.p.dim; ++i)
      ASSERT_EQ(exact.out[static_cast<size_t>(layer)][i], r.out[static_cast<size_t>(layer)][i]) << layer << "," << i;
  for (int64_t layer = 5; layer < m.layers(); ++layer) {
    const auto& a = exact.out[static_cast<size_t>(layer)];
    const auto& b = r.out[static_cast<size_t>(layer)];
    for (int64_t i = (s + w - 1) * m.p.dim; i < kTokens * m.p.dim; ++i) ASSERT_EQ(a[i], b[i]) << layer << "," << i;
    // ... and differ where the truncation removed keys.
    bool differs = false;
    for (int64_t i = s * m.p.dim; i < (s + w - 1) * m.p.dim; ++i) differs |= a[i] != b[i];
    EXPECT_TRUE(differs) << "layer " << layer;
  }
}

TEST(AttentionReplay, EncoderReplayRegeneratesRingsWithoutTouchingGlobalCaches) {
  TinyModel m(kTokens);
  const int64_t prefix = 24, w = m.p.window;  // cached prefix (even: ratio-2 groups complete)
  const RunResult exact = run_schedule(m, {prefix, kTokens - prefix});

  // Prefix-cache hit: global caches survive, SWA rings were lost.
  const RunResult cached = run_schedule(m, {prefix});
  RunResult r = test::new_result(m);
  r.st.sources = cached.st.sources;
  AttentionScratch scratch;
  run_chunk(m, {.pos0 = prefix - w, .n = w, .swa_start = prefix - w, .pass = AttentionPass::SwaReplay}, r, scratch,
            nullptr);
  for (size_t i = 0; i < r.st.sources.size(); ++i) {
    EXPECT_EQ(r.st.sources[i].kv.size(), cached.st.sources[i].kv.size());
    EXPECT_EQ(r.st.sources[i].index_k.size(), cached.st.sources[i].index_k.size());
  }
  run_chunk(m, {.pos0 = prefix, .n = kTokens - prefix, .swa_start = prefix - w}, r, scratch, nullptr);

  test::expect_same_state(exact.st, r.st);
  // Suffix windows lie inside [prefix − W, p]: identical to the exact run; so is the last replayed row.
  test::expect_same_outputs(m, exact, r, prefix - 1, kTokens);
  // Replayed queries select from the cached entries exactly as the exact run did.
  for (const auto& [layer, idx] : exact.topk) {
    const size_t from = static_cast<size_t>((prefix - w) * m.p.index_topk);
    EXPECT_TRUE(std::equal(idx.begin() + from, idx.end(), r.topk.at(layer).begin() + from)) << "layer " << layer;
  }
}

TEST(AttentionReplay, TruncationHidesKeysThatTheRingStillHolds) {
  TinyModel m(20);
  const int64_t s = 10;
  // State with every earlier key present vs. a fresh state: with swa_start = s they agree.
  RunResult full = test::new_result(m), fresh = test::new_result(m);
  AttentionScratch sa, sb;
  run_chunk(m, {.pos0 = 0, .n = s, .last_layer = 1}, full, sa, nullptr);
  run_chunk(m, {.pos0 = s, .n = 10, .last_layer = 1, .swa_start = s}, full, sa, nullptr);
  run_chunk(m, {.pos0 = s, .n = 10, .last_layer = 1, .swa_start = s}, fresh, sb, nullptr);
  for (int64_t layer = 0; layer < 2; ++layer)
    for (int64_t i = s * m.p.dim; i < 20 * m.p.dim; ++i)
      ASSERT_EQ(full.out[static_cast<size_t>(layer)][i], fresh.out[static_cast<size_t>(layer)][i]);
  // Without truncation the same state gives a different (exact) first tail row.
  RunResult exact = test::run_schedule(m, {20});
  bool differs = false;
  for (int64_t i = s * m.p.dim; i < (s + 1) * m.p.dim; ++i) differs |= exact.out[0][i] != full.out[0][i];
  EXPECT_TRUE(differs);
}

}  // namespace
}  // namespace cedar
