// Layer plans against architecture.md §1.2 (V4.1 table, typed from the spec) and §5 (V4), plus every
// validation error.
#include "model/layer_plan.h"

#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace cedar {
namespace {

using nlohmann::json;

const std::string kConfigs = std::string(CEDAR_TEST_DATA_DIR) + "/configs/";

json read_json(const std::string& name) {
  std::ifstream in(kConfigs + name + "/config.json");
  return json::parse(in);
}

LayerPlan plan_of(const std::string& name) {
  auto c = load_model_config(kConfigs + name);
  EXPECT_TRUE(c.ok()) << c.error().message;
  auto p = build_layer_plan(*c);
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.ok() ? *p : LayerPlan{};
}

// Plan error for a config json ("" if it builds); the config itself must parse.
std::string plan_error(const json& j) {
  auto c = parse_model_config(j, "cfg.json");
  if (!c.ok()) return "config did not parse: " + c.error().message;
  auto p = build_layer_plan(*c);
  return p.ok() ? std::string() : p.error().message;
}

// Released V4.1 layout, row by row from architecture.md §1.2.
struct Row {
  int first, last;
  AttnMode mode;
  int kv, index;
};
const Row kV41Table[] = {
    {0, 1, AttnMode::SwaOnly, -1, -1},  {2, 2, AttnMode::Full, 2, 2},       {3, 7, AttnMode::Reuse, 2, 2},
    {8, 8, AttnMode::Full, 8, 8},       {9, 13, AttnMode::Reuse, 8, 8},     {14, 14, AttnMode::Full, 14, 14},
    {15, 19, AttnMode::Reuse, 14, 14},  {20, 20, AttnMode::Full, 20, 20},   {21, 23, AttnMode::Reuse, 20, 20},
    {24, 24, AttnMode::Reindex, 20, 24}, {25, 27, AttnMode::Reuse, 20, 24}, {28, 28, AttnMode::Reindex, 20, 28},
    {29, 31, AttnMode::Reuse, 20, 28},  {32, 32, AttnMode::Reindex, 20, 32}, {33, 35, AttnMode::Reuse, 20, 32},
    {36, 36, AttnMode::Reindex, 20, 36}, {37, 39, AttnMode::Reuse, 20, 36},
};

void expect_released_v41(const LayerPlan& p) {
  ASSERT_EQ(p.num_layers(), 40);
  EXPECT_EQ(p.count(AttnMode::SwaOnly), 2);
  EXPECT_EQ(p.count(AttnMode::Full), 4);
  EXPECT_EQ(p.count(AttnMode::Reindex), 4);
  EXPECT_EQ(p.count(AttnMode::Reuse), 30);
  for (const Row& row : kV41Table) {
    for (int l = row.first; l <= row.last; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      const LayerRole& r = p.layers[l];
      EXPECT_EQ(r.layer, l);
      EXPECT_EQ(r.mode, row.mode);
      EXPECT_EQ(r.kv_source, row.kv);
      EXPECT_EQ(r.index_source, row.index);
      EXPECT_EQ(r.compress_ratio, l < 2 ? 0 : l < 20 ? 2 : 1);
      EXPECT_EQ(r.owns_compressor, row.mode == AttnMode::Full);
      EXPECT_EQ(r.owns_indexer_keys, row.mode == AttnMode::Full);
      EXPECT_EQ(r.owns_indexer, row.mode == AttnMode::Full || row.mode == AttnMode::Reindex);
      EXPECT_EQ(r.compressor_has_gate, l == 2 || l == 8 || l == 14);  // layer 20's compressor has no wgate
      EXPECT_EQ(r.is_candidate_source, l == 20);
      EXPECT_EQ(r.uses_candidates, l == 24 || l == 28 || l == 32 || l == 36);
      EXPECT_EQ(r.has_engram, l == 1 || l == 14);
      EXPECT_EQ(r.uses_compress_rope, l >= 2);
      EXPECT_FALSE(r.hash_routed);
      EXPECT_EQ(r.is_encoder, l < 20);
    }
  }
  EXPECT_TRUE(p.ced) << p.ced_unavailable_reason;
  EXPECT_EQ(p.encoder_layers, 20);
  EXPECT_EQ(p.last_kv_source, 20);
  EXPECT_EQ(p.draft_kind, DraftKind::DSpark);
  ASSERT_EQ(p.drafts.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(p.drafts[k].index, k);
    EXPECT_EQ(p.drafts[k].compress_ratio, 0);
    EXPECT_EQ(p.drafts[k].is_first, k == 0);
    EXPECT_EQ(p.drafts[k].is_last, k == 2);
  }
}

TEST(LayerPlan, ReleasedV41MatchesSpecTable) { expect_released_v41(plan_of("deepseek_v41_flash")); }

TEST(LayerPlan, InferenceConfigGivesTheSamePlan) { expect_released_v41(plan_of("deepseek_v41_flash_inference")); }

TEST(LayerPlan, V4FlashEveryCompressedLayerOwnsItsCaches) {
  const LayerPlan p = plan_of("deepseek_v4_flash");
  ASSERT_EQ(p.num_layers(), 43);
  EXPECT_EQ(p.count(AttnMode::SwaOnly), 2);
  EXPECT_EQ(p.count(AttnMode::V4Csa), 21);
  EXPECT_EQ(p.count(AttnMode::V4Hca), 20);
  for (const LayerRole& r : p.layers) {
    SCOPED_TRACE("layer " + std::to_string(r.layer));
    const int64_t expected_ratio = r.layer < 2 ? 0 : (r.layer % 2 == 0 ? 4 : 128);
    EXPECT_EQ(r.compress_ratio, expected_ratio);
    EXPECT_EQ(r.hash_routed, r.layer < 3);
    EXPECT_EQ(r.owns_compressor, expected_ratio > 0);
    EXPECT_EQ(r.compressor_has_gate, expected_ratio > 0);
    EXPECT_EQ(r.owns_indexer, expected_ratio == 4);
    EXPECT_EQ(r.kv_source, expected_ratio > 0 ? r.layer : -1);
    EXPECT_EQ(r.index_source, expected_ratio == 4 ? r.layer : -1);
    EXPECT_FALSE(r.has_engram);
  }
  EXPECT_FALSE(p.ced);
  EXPECT_EQ(p.encoder_layers, 43);
  EXPECT_EQ(p.draft_kind, DraftKind::NextN);
  ASSERT_EQ(p.drafts.size(), 1u);
  EXPECT_TRUE(p.drafts[0].is_first && p.drafts[0].is_last);
}

TEST(LayerPlan, V4Flash0731HasThreeDSparkStages) {
  const LayerPlan p = plan_of("deepseek_v4_flash_0731");
  EXPECT_EQ(p.draft_kind, DraftKind::DSpark);
  ASSERT_EQ(p.drafts.size(), 3u);
  EXPECT_TRUE(p.drafts[0].is_first && !p.drafts[0].is_last);
  EXPECT_TRUE(p.drafts[2].is_last);
}

TEST(LayerPlan, NothingIsHardCoded) {
  // A 12-layer V4.1 variant: two encoder groups, a decoder source at 8 with one Reindex at 10.
  json j = read_json("deepseek_v41_flash");
  json& t = j["text_config"];
  t["num_hidden_layers"] = 12;
  t["num_nextn_predict_layers"] = 1;
  t["compress_ratios"] = {0, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 0};
  t["kv_source_layer_ids"] = {1, 4, 8};
  t["index_source_layer_ids"] = {1, 4, 8, 10};
  t["candidate_source_layer_id"] = 8;
  t["engram_layer_ids"] = {3};
  t["engram_num_embeddings"] = {1000};
  t["dspark_target_layer_ids"] = {11};
  auto c = parse_model_config(j, "small.json");
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto p = build_layer_plan(*c);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->count(AttnMode::Full), 3);
  EXPECT_EQ(p->count(AttnMode::Reindex), 1);
  EXPECT_EQ(p->layers[7].kv_source, 4);
  EXPECT_EQ(p->layers[11].index_source, 10);
  EXPECT_TRUE(p->layers[10].uses_candidates);
  EXPECT_EQ(p->encoder_layers, 8);
  EXPECT_EQ(p->drafts.size(), 1u);
}

// One mutation of the released V4.1 config per validation rule.
struct BadCase {
  const char* what;
  void (*mutate)(json& t);
  const char* message;
};

const BadCase kBadV41[] = {
    {"kv id out of range", [](json& t) { t["kv_source_layer_ids"] = {2, 8, 14, 40}; },
     "kv_source_layer_ids: layer id 40 is out of range [0, 40)"},
    {"kv ids unsorted", [](json& t) { t["kv_source_layer_ids"] = {8, 2, 14, 20}; },
     "kv_source_layer_ids: ids must be strictly increasing, got [8, 2, 14, 20]"},
    {"kv source with ratio 0", [](json& t) { t["kv_source_layer_ids"] = {1, 2, 8, 14, 20}; },
     "kv_source_layer_ids: layer 1 has compress ratio 0"},
    {"index source with ratio 0", [](json& t) { t["index_source_layer_ids"] = {0, 2, 8, 14, 20, 24, 28, 32, 36}; },
     "index_source_layer_ids: layer 0 has compress ratio 0"},
    {"compressed layer without kv source", [](json& t) { t["kv_source_layer_ids"] = {8, 14, 20}; },
     "kv_source_layer_ids: layer 2 has compress ratio 2 but no KV source at or before it in [8, 14, 20]"},
    {"ratio differs from its kv source", [](json& t) { t["compress_ratios"][5] = 1; },
     "compress_ratios: layer 5 (ratio 1) reads KV source layer 2 (ratio 2)"},
    {"index source scores another kv source", [](json& t) { t["index_source_layer_ids"] = {2, 14, 20, 24, 28, 32, 36}; },
     "index_source_layer_ids: layer 8 reads KV source 8 but top-k from index source 2, which scores KV source 2"},
    {"candidate source not an index source", [](json& t) { t["candidate_source_layer_id"] = 21; },
     "candidate_source_layer_id: layer 21 is not an index source"},
    {"engram count mismatch", [](json& t) { t["engram_num_embeddings"] = {384006168}; },
     "engram_num_embeddings: has 1 entries for 2 Engram layers [1, 14]"},
    {"engram id out of range", [](json& t) { t["engram_layer_ids"] = {1, 44}; },
     "engram_layer_ids: layer id 44 is out of range [0, 40)"},
    {"compress_ratios length", [](json& t) { t["compress_ratios"].erase(t["compress_ratios"].size() - 1); },
     "compress_ratios: has 42 entries; expected num_hidden_layers (40) or num_hidden_layers + 3 draft blocks (43)"},
    {"draft block ratio", [](json& t) { t["compress_ratios"][41] = 2; },
     "compress_ratios: entry 41 (draft block 1) must be 0"},
    {"unsupported ratio", [](json& t) {
       t["compress_ratios"][3] = 4;
     },
     "compress_ratios: layer 3 has ratio 4; deepseek_v41 layers use 0 (window only), 1 or 2"},
    {"dspark target out of range", [](json& t) { t["dspark_target_layer_ids"] = {37, 38, 40}; },
     "dspark_target_layer_ids: layer id 40 is out of range [0, 40)"},
    {"dspark targets unsorted", [](json& t) { t["dspark_target_layer_ids"] = {39, 38, 37}; },
     "dspark_target_layer_ids: ids must be strictly increasing"},
};

TEST(LayerPlanErrors, EveryV41Rule) {
  for (const BadCase& b : kBadV41) {
    SCOPED_TRACE(b.what);
    json j = read_json("deepseek_v41_flash");
    b.mutate(j["text_config"]);
    const std::string e = plan_error(j);
    EXPECT_NE(e.find(b.message), std::string::npos) << "got: " << e;
    EXPECT_EQ(e.rfind("cfg.json: ", 0), 0u) << "error does not name the file: " << e;
  }
}

TEST(LayerPlanErrors, InferenceSpellingInMessages) {
  json j = read_json("deepseek_v41_flash_inference");
  j["kv_source_layers"] = {8, 14, 20};
  EXPECT_NE(plan_error(j).find("kv_source_layers: layer 2 has compress ratio 2 but no KV source"), std::string::npos)
      << plan_error(j);
}

TEST(LayerPlanErrors, SeveralProblemsTogether) {
  json j = read_json("deepseek_v41_flash");
  j["text_config"]["candidate_source_layer_id"] = 21;
  j["text_config"]["engram_num_embeddings"] = {1};
  const std::string e = plan_error(j);
  EXPECT_NE(e.find("2 problems"), std::string::npos) << e;
}

TEST(LayerPlanErrors, V4Rules) {
  json j = read_json("deepseek_v4_flash");
  j["compress_ratios"][2] = 2;
  EXPECT_NE(plan_error(j).find("compress_ratios: layer 2 has ratio 2; deepseek_v4 layers use 0, 4 (CSA) or 128 (HCA)"),
            std::string::npos)
      << plan_error(j);
  j = read_json("deepseek_v4_flash");
  j["num_hash_layers"] = 50;
  EXPECT_NE(plan_error(j).find("num_hash_layers: 50 exceeds num_hidden_layers 43"), std::string::npos);
  j = read_json("deepseek_v4_flash_0731");
  j["dspark_target_layer_ids"] = {40, 41, 43};
  EXPECT_NE(plan_error(j).find("dspark_target_layer_ids: layer id 43 is out of range [0, 43)"), std::string::npos);
  j = read_json("deepseek_v4_flash");
  j["compress_ratios"][43] = 4;
  EXPECT_NE(plan_error(j).find("entry 43 (draft block 0) must be 0"), std::string::npos) << plan_error(j);
}

TEST(LayerPlan, CedUnavailableWhenEngramFollowsTheLastKvSource) {
  json j = read_json("deepseek_v41_flash");
  j["text_config"]["engram_layer_ids"] = {1, 30};
  auto c = parse_model_config(j, "t");
  auto p = build_layer_plan(*c);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_FALSE(p->ced);
  EXPECT_EQ(p->encoder_layers, 40);
  EXPECT_EQ(p->ced_unavailable_reason, "Engram layer 30 follows the last KV source 20");
}

TEST(LayerPlan, CedUnavailableWhenADSparkTargetIsInTheEncoder) {
  json j = read_json("deepseek_v41_flash");
  j["text_config"]["dspark_target_layer_ids"] = {19, 38, 39};
  auto p = build_layer_plan(*parse_model_config(j, "t"));
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_FALSE(p->ced);
  EXPECT_EQ(p->ced_unavailable_reason, "DSpark target layer 19 is not after the last KV source 20");
}

}  // namespace
}  // namespace cedar
