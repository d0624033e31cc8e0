// Measured global-KV bytes per token (kv/kv_layout.h) for the released configs: what the block pool
// allocates for a sequence of N tokens in a dry run, against the published 890 B/token (V4.1 tech
// report abstract; architecture.md §3.12: 3 ratio-2 sources × (288 + 68)/2 + one ratio-1 source ×
// (288 + 68)) and ≈ 3.5 KB/token for V4 (§5: 21 CSA layers × (584 + 68)/4 + 20 HCA layers × 584/128).
// The expected allocations below are block arithmetic written here from those spec numbers (64 tokens
// per block), independent of the code's layout; the measurement is also compared with the formula
// numbers of model_stats (KvBudget) and with a real (non dry-run) pool filled through AttentionState.
#include "kv/kv_layout.h"

#include <gtest/gtest.h>

#include <string>

#include "model/attention_state.h"
#include "model/model_stats.h"

namespace cedar {
namespace {

const std::string kConfigs = std::string(CEDAR_TEST_DATA_DIR) + "/configs/";

struct Released {
  ModelConfig config;
  LayerPlan plan;
};

Released load(const std::string& name) {
  Released r;
  auto c = load_model_config(kConfigs + name);
  EXPECT_TRUE(c.ok()) << c.error().message;
  if (c.ok()) r.config = *c;
  auto p = build_layer_plan(r.config);
  EXPECT_TRUE(p.ok()) << p.error().message;
  if (p.ok()) r.plan = *p;
  return r;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Spec: sources 2, 8, 14 (ratio 2) and 20 (ratio 1), each 288 B main + 68 B index records; a block
// spans 64 tokens (32 ratio-2 entries or 64 ratio-1 entries).
int64_t v41_expected_allocation(int64_t n) {
  return 3 * ceil_div(n / 2, 32) * 32 * (288 + 68) + ceil_div(n, 64) * 64 * (288 + 68);
}

TEST(KvBudget, V41MeasuresExactly890BytesPerTokenAtOneMillionTokens) {
  const Released r = load("deepseek_v41_flash");
  auto m = measure_kv_bytes(r.config, r.plan, 1'000'000);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->allocated_bytes, 890'000'000);
  EXPECT_EQ(m->padding_bytes, 0);
  EXPECT_DOUBLE_EQ(m->bytes_per_token(), 890.0);
  // 3 × 15 625 ratio-2 blocks × 2 streams + 15 625 ratio-1 blocks × 2 streams.
  EXPECT_EQ(m->blocks, 8 * 15'625);
  // The formula of model_stats agrees with the measurement.
  const KvBudget formula = compute_kv_budget(r.config, r.plan);
  EXPECT_DOUBLE_EQ(m->bytes_per_token(), formula.bytes_per_token());
  auto engine = kv_bytes_per_token_measured(r.config, r.plan);
  ASSERT_TRUE(engine.ok());
  EXPECT_DOUBLE_EQ(*engine, 890.0);
  std::printf("V4.1-Flash measured global KV: %.4f B/token at N = 1e6 (padding %.4f B/token)\n",
              m->bytes_per_token(), m->padding_per_token());
}

TEST(KvBudget, V41SmallAndOddLengthsAre890PlusReportedPadding) {
  const Released r = load("deepseek_v41_flash");
  for (int64_t n : {1, 2, 63, 64, 65, 1001, 4096, 12'345, 131'071, 999'999}) {
    SCOPED_TRACE("N = " + std::to_string(n));
    auto m = measure_kv_bytes(r.config, r.plan, n);
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_EQ(m->allocated_bytes, v41_expected_allocation(n));
    // Payload: what the entries themselves take (a trailing odd token is still pending, not stored).
    EXPECT_EQ(m->payload_bytes, 3 * (n / 2) * (288 + 68) + n * (288 + 68));
    EXPECT_EQ(m->allocated_bytes, m->payload_bytes + m->padding_bytes);
    EXPECT_GE(m->padding_bytes, 0);
    // Padding is less than one block per stream: 3 × 2 × 32 + 2 × 64 records' worth at most.
    EXPECT_LT(m->padding_bytes, 3 * 32 * 356 + 64 * 356);
    if (n % 64 == 0) {
      EXPECT_EQ(m->padding_bytes, 0);
    }
    std::printf("N = %7lld: %10lld B allocated = %.3f B/token (payload %.3f + padding %.3f)\n",
                static_cast<long long>(n), static_cast<long long>(m->allocated_bytes), m->bytes_per_token(),
                static_cast<double>(m->payload_bytes) / static_cast<double>(n), m->padding_per_token());
  }
}

TEST(KvBudget, V4MeasuresAbout3514BytesPerToken) {
  const Released r = load("deepseek_v4_flash");
  auto m = measure_kv_bytes(r.config, r.plan, 1 << 20);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->padding_bytes, 0);
  EXPECT_DOUBLE_EQ(m->bytes_per_token(), 21 * (584 + 68) / 4.0 + 20 * 584 / 128.0);  // 3514.25
  EXPECT_DOUBLE_EQ(m->bytes_per_token(), compute_kv_budget(r.config, r.plan).bytes_per_token());
  std::printf("V4-Flash measured global KV: %.4f B/token at N = 2^20\n", m->bytes_per_token());
}

TEST(KvBudget, BlockSpanMustNestWithTheRatios) {
  const Released r = load("deepseek_v41_flash");
  EXPECT_TRUE(measure_kv_bytes(r.config, r.plan, 1000, 128).ok());
  auto bad = measure_kv_bytes(r.config, r.plan, 1000, 63);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("not a multiple of the compress ratio 2"), std::string::npos)
      << bad.error().message;
  EXPECT_FALSE(measure_kv_bytes(r.config, r.plan, 0).ok());
}

// The caches the forward really uses allocate what the dry run measures: AttentionState of the
// released config on a real pool, filled with the entries of N tokens.
TEST(KvBudget, RealCachesAllocateWhatTheDryRunMeasures) {
  const Released r = load("deepseek_v41_flash");
  auto p = attention_params_from_config(r.config);
  ASSERT_TRUE(p.ok()) << p.error().message;
  auto pool = BlockPool::create({});
  ASSERT_TRUE(pool.ok());
  auto st = AttentionState::create(r.plan, *p, {.pool = *pool});
  ASSERT_TRUE(st.ok()) << st.error().message;
  const int64_t n = 1001;
  for (KvSourceState& s : st->sources) {
    std::vector<float> main(static_cast<size_t>(p->head_dim), 0.5f), key(static_cast<size_t>(p->index_head_dim), 0.5f);
    for (int64_t j = 0; j < n / s.ratio; ++j) {
      ASSERT_TRUE(s.kv.append(main, j * s.ratio).ok());
      ASSERT_TRUE(s.index_k.append(key, j * s.ratio).ok());
    }
  }
  auto m = measure_kv_bytes(r.config, r.plan, n);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*pool)->stats().used_bytes, m->allocated_bytes);
  // SWA rings (outside the pool): 40 layers × 128 slots × 528 B.
  int64_t ring_bytes = 0;
  for (const SwaRing& ring : st->rings) ring_bytes += ring.bytes();
  EXPECT_EQ(ring_bytes, 40 * 128 * 528);
  st = Result<AttentionState>(make_error("dropped"));
  EXPECT_EQ((*pool)->stats().used_bytes, 0);
}

}  // namespace
}  // namespace cedar
