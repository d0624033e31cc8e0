// Accounting against published figures: 890 B/token (V4.1 tech report abstract; §3.12 derivation),
// ≈ 3.5 KB/token for V4 (§5: 584 B FlashMLA records + 68 B indexer keys), 2.77 MiB of SWA rings per
// sequence (§3.12), 7.89 B / 16.13 B active parameters per prefill / decode token (§3.10, S-profile),
// 763 205 315 794 logical parameters (§2).
#include "model/model_stats.h"

#include <string>

#include <gtest/gtest.h>

namespace cedar {
namespace {

const std::string kConfigs = std::string(CEDAR_TEST_DATA_DIR) + "/configs/";

struct Model {
  ModelConfig config;
  LayerPlan plan;
  ModelStats stats;
};

Model load(const std::string& name) {
  Model m;
  auto c = load_model_config(kConfigs + name);
  EXPECT_TRUE(c.ok()) << c.error().message;
  m.config = *c;
  m.plan = *build_layer_plan(m.config);
  m.stats = compute_model_stats(m.config, m.plan, *expected_weights(m.config, m.plan));
  return m;
}

TEST(ModelStats, V41KvBudgetIs890BytesPerToken) {
  const KvBudget kv = load("deepseek_v41_flash").stats.kv;
  EXPECT_EQ(kv.main_entry_bytes, 288);
  EXPECT_EQ(kv.indexer_entry_bytes, 68);
  EXPECT_EQ(kv.swa_entry_bytes, 528);
  EXPECT_DOUBLE_EQ(kv.main_bytes_per_token, 720.0);
  EXPECT_DOUBLE_EQ(kv.indexer_bytes_per_token, 170.0);
  EXPECT_DOUBLE_EQ(kv.bytes_per_token(), 890.0);
  EXPECT_EQ(kv.swa_layers, 43);
  EXPECT_EQ(kv.swa_bytes_per_sequence, 43 * 128 * 528);  // ≈ 2.77 MiB
}

TEST(ModelStats, V4KvBudgetIsAbout3514BytesPerToken) {
  const KvBudget kv = load("deepseek_v4_flash").stats.kv;
  EXPECT_EQ(kv.main_entry_bytes, 584);
  EXPECT_EQ(kv.indexer_entry_bytes, 68);
  // 21 CSA layers × (584 + 68) / 4 + 20 HCA layers × 584 / 128.
  EXPECT_DOUBLE_EQ(kv.bytes_per_token(), 21 * 652 / 4.0 + 20 * 584 / 128.0);
  EXPECT_NEAR(kv.bytes_per_token(), 3514.0, 1.0);
  EXPECT_EQ(kv.swa_bytes_per_sequence, 44 * 128 * 584);
}

// The published active counts have two decimals (10 M resolution); items below that (norms, the
// boundary layer's mHC and norm) are accounting convention. Tolerance: 10 M.
TEST(ModelStats, V41ActiveParameters) {
  const ModelStats s = load("deepseek_v41_flash").stats;
  EXPECT_NEAR(static_cast<double>(s.params_active_prefill), 7.89e9, 1e7);
  EXPECT_NEAR(static_cast<double>(s.params_active_decode), 16.13e9, 1e7);
  EXPECT_EQ(s.total.params, 763205315794);  // vision from the estimate, exact for the release
  EXPECT_TRUE(s.vision_estimated);
  EXPECT_EQ(s.total.tensors, 96085);
  EXPECT_EQ(s.by_group.at("engram_tables").params, 384006168LL * 256 + 384016682LL * 256);
  EXPECT_NEAR(static_cast<double>(s.by_group.at("draft").params), 14.2e9, 0.05e9);  // "~14.2 B DSpark"
}

TEST(ModelStats, InferenceConfigAccountsTheSame) {
  const ModelStats a = load("deepseek_v41_flash").stats;
  const ModelStats b = load("deepseek_v41_flash_inference").stats;
  EXPECT_EQ(a.params_active_prefill, b.params_active_prefill);
  EXPECT_EQ(a.params_active_decode, b.params_active_decode);
  EXPECT_EQ(a.total.bytes, b.total.bytes);
}

TEST(ModelStats, V4ActiveParameters) {
  // V4-Flash: "284 B total, 13 B active" (model card) — the total excludes the NextN block.
  const ModelStats s = load("deepseek_v4_flash").stats;
  EXPECT_NEAR(static_cast<double>(s.total.params - s.by_group.at("draft").params), 284e9, 1e9);
  EXPECT_NEAR(static_cast<double>(s.params_active_decode), 13e9, 0.5e9);
  EXPECT_LT(s.params_active_prefill, s.params_active_decode);  // no CED: every layer, but no head
}

TEST(ModelStats, PrefillWithoutCedRunsEveryLayer) {
  Model m = load("deepseek_v41_flash");
  m.plan.ced = false;
  m.plan.encoder_layers = m.plan.num_layers();
  const ModelStats s = compute_model_stats(m.config, m.plan, *expected_weights(m.config, m.plan));
  const ModelStats ced = load("deepseek_v41_flash").stats;
  EXPECT_GT(s.params_active_prefill, ced.params_active_prefill);
  EXPECT_EQ(s.params_active_decode, ced.params_active_decode);
}

TEST(ModelStats, MemoryPlanMovesTablesAndExpertsToHost) {
  const ModelStats s = load("deepseek_v41_flash").stats;
  MemoryPlanOptions o;
  const auto plan = plan_memory(s, o);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].host_weight_bytes, 0u);
  EXPECT_EQ(plan[1].host_weight_bytes, s.by_group.at("engram_tables").bytes);
  EXPECT_EQ(plan[2].host_weight_bytes, s.by_group.at("engram_tables").bytes + s.by_group.at("routed_experts").bytes);
  EXPECT_EQ(plan[0].gpu_weight_bytes + s.by_group.at("vision").bytes, s.total.bytes);
  for (const auto& m : plan) EXPECT_TRUE(m.fits) << m.name;
  EXPECT_LT(plan[0].kv_token_capacity, plan[1].kv_token_capacity);
  o.gpus = 1;
  EXPECT_FALSE(plan_memory(s, o)[0].fits);  // 507 GB of text weights on one 140 GiB GPU
  EXPECT_EQ(plan_memory(s, o)[0].kv_token_capacity, 0);
}

}  // namespace
}  // namespace cedar
