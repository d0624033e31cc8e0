// The inventory check on fake checkpoints (records built by hand from the expected list of a tiny
// config, then damaged in known ways): every kind of difference is found, counted and listed at once.
#include "model/inventory.h"

#include <algorithm>
#include <map>
#include <string>

#include <gtest/gtest.h>

namespace cedar {
namespace {

const std::string kConfigs = std::string(CEDAR_TEST_DATA_DIR) + "/configs/";

struct Model {
  ModelConfig config;
  LayerPlan plan;
  std::vector<WeightSpec> expected;
};

Model load(const std::string& name) {
  Model m;
  auto c = load_model_config(kConfigs + name);
  EXPECT_TRUE(c.ok()) << c.error().message;
  m.config = *c;
  m.plan = *build_layer_plan(m.config);
  m.expected = *expected_weights(m.config, m.plan);
  return m;
}

std::vector<TensorRecord> records_of(const std::vector<WeightSpec>& w) {
  std::vector<TensorRecord> out;
  for (const auto& s : w) out.push_back({s.name, s.dtype, s.shape, s.nbytes()});
  return out;
}

void erase_named(std::vector<TensorRecord>& r, const std::string& name) {
  auto it = std::find_if(r.begin(), r.end(), [&](const TensorRecord& t) { return t.name == name; });
  ASSERT_NE(it, r.end()) << name;
  r.erase(it);
}

TensorRecord& named(std::vector<TensorRecord>& r, const std::string& name) {
  auto it = std::find_if(r.begin(), r.end(), [&](const TensorRecord& t) { return t.name == name; });
  EXPECT_NE(it, r.end()) << name;
  return *it;
}

TEST(Inventory, ExactCheckpointPasses) {
  for (const char* name : {"tiny_v41", "tiny_v4"}) {
    SCOPED_TRACE(name);
    const Model m = load(name);
    const auto records = records_of(m.expected);
    const InventoryReport r = compare_inventory(m.expected, records, inventory_options(m.config, m.plan));
    EXPECT_TRUE(r.ok()) << r.format();
    EXPECT_EQ(r.matched_tensors, static_cast<int64_t>(m.expected.size()));
    EXPECT_TRUE(check_inventory(m.expected, records, inventory_options(m.config, m.plan)).ok());
  }
}

TEST(Inventory, ReportsEveryProblemAtOnce) {
  const Model m = load("tiny_v41");
  auto records = records_of(m.expected);
  erase_named(records, "layers.3.attn.wq_a.weight");
  erase_named(records, "layers.3.attn.wq_a.scale");
  erase_named(records, "mtp.1.confidence_head.proj.weight");
  records.push_back({"layers.3.attn.wq.weight", DType::BF16, {32, 64}, 0});
  records.push_back({"model.embed_tokens.weight", DType::BF16, {512, 64}, 0});
  named(records, "layers.0.ffn.gate.bias").dtype = DType::BF16;
  named(records, "layers.2.attn.compressor.wkv.weight").shape = {32, 64};
  named(records, "layers.4.engram.embed.scale").shape = {101, 2};

  const InventoryReport r = compare_inventory(m.expected, records, inventory_options(m.config, m.plan));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.missing, (std::vector<std::string>{"layers.3.attn.wq_a.weight", "layers.3.attn.wq_a.scale",
                                                 "mtp.1.confidence_head.proj.weight"}));
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"layers.3.attn.wq.weight", "model.embed_tokens.weight"}));
  ASSERT_EQ(r.dtype_mismatches.size(), 1u);
  EXPECT_EQ(r.dtype_mismatches[0].name, "layers.0.ffn.gate.bias");
  EXPECT_EQ(r.dtype_mismatches[0].expected, "F32");
  EXPECT_EQ(r.dtype_mismatches[0].actual, "BF16");
  ASSERT_EQ(r.shape_mismatches.size(), 2u);
  EXPECT_EQ(r.shape_mismatches[0].name, "layers.2.attn.compressor.wkv.weight");
  EXPECT_EQ(r.shape_mismatches[0].expected, "[64, 64]");
  EXPECT_EQ(r.shape_mismatches[0].actual, "[32, 64]");
  EXPECT_EQ(r.shape_mismatches[1].expected, "[101, 1]");
  EXPECT_EQ(r.shape_mismatches[1].actual, "[101, 2]");
  // wq_a contract: 8 expected, 7 found.
  ASSERT_EQ(r.count_mismatches.size(), 1u);
  EXPECT_EQ(r.count_mismatches[0].pattern, "layers.*.attn.wq_a.weight");
  EXPECT_EQ(r.count_mismatches[0].expected, 8);
  EXPECT_EQ(r.count_mismatches[0].actual, 7);

  const Status s = check_inventory(m.expected, records, inventory_options(m.config, m.plan));
  ASSERT_FALSE(s.ok());
  const std::string& e = s.error().message;
  for (const char* needle : {"missing (3):", "unexpected (2):", "dtype mismatches (1):",
                             "layers.0.ffn.gate.bias: expected F32, found BF16", "shape mismatches (2):",
                             "layers.4.engram.embed.scale: expected [101, 1], found [101, 2]",
                             "tensor-count contract violations (1):",
                             "layers.*.attn.wq_a.weight: expected 8, found 7"})
    EXPECT_NE(e.find(needle), std::string::npos) << "no '" << needle << "' in:\n" << e;
}

TEST(Inventory, LongGroupsAreTruncatedWithACount) {
  const Model m = load("tiny_v41");
  std::vector<TensorRecord> none;
  InventoryOptions o = inventory_options(m.config, m.plan);
  const InventoryReport r = compare_inventory(m.expected, none, o);
  EXPECT_EQ(r.missing.size(), m.expected.size());
  const std::string text = r.format(5);
  EXPECT_NE(text.find("missing (" + std::to_string(m.expected.size()) + "):"), std::string::npos) << text;
  EXPECT_NE(text.find("... and " + std::to_string(m.expected.size() - 5) + " more"), std::string::npos) << text;
}

TEST(Inventory, ReadingV41AsV4FailsTheCountContract) {
  // §2.2: reading compress_ratios the V4 way finds one compressor per compressed layer, not per source.
  const Model v41 = load("tiny_v41");
  const auto records = records_of(v41.expected);
  std::vector<CountContract> v4_style = {{"layers.*.attn.compressor.wkv.weight", 6}};
  InventoryOptions o;
  o.contract = v4_style;
  const InventoryReport r = compare_inventory(v41.expected, records, o);
  ASSERT_EQ(r.count_mismatches.size(), 1u);
  EXPECT_EQ(r.count_mismatches[0].expected, 6);
  EXPECT_EQ(r.count_mismatches[0].actual, 2);
}

TEST(Inventory, ContractIsDerivedFromThePlan) {
  const Model m = load("tiny_v41");
  std::map<std::string, int64_t> got;
  for (const auto& c : tensor_count_contract(m.config, m.plan)) got[c.pattern] = c.expected;
  EXPECT_EQ(got["layers.*.attn.wq_a.weight"], 8);
  EXPECT_EQ(got["layers.*.attn.compressor.wkv.weight"], 2);
  EXPECT_EQ(got["layers.*.attn.compressor.wgate.weight"], 1);
  EXPECT_EQ(got["layers.*.attn.indexer.wq_b.weight"], 3);
  EXPECT_EQ(got["layers.*.attn.indexer.wk.weight"], 2);
  EXPECT_EQ(got["layers.*.engram.embed.weight"], 2);
  EXPECT_EQ(got["layers.*.ffn.experts.*.*.weight"], 8 * 8 * 3);
  EXPECT_EQ(got["mtp.*.ffn.experts.*.*.weight"], 2 * 4 * 3);
  const Model v4 = load("tiny_v4");
  got.clear();
  for (const auto& c : tensor_count_contract(v4.config, v4.plan)) got[c.pattern] = c.expected;
  EXPECT_EQ(got["layers.*.attn.compressor.wkv.weight"], 4);
  EXPECT_EQ(got["layers.*.attn.indexer.compressor.wkv.weight"], 2);
  EXPECT_EQ(got["layers.*.ffn.gate.tid2eid"], 2);
}

TEST(Inventory, PatternMatching) {
  EXPECT_TRUE(matches_pattern("layers.12.attn.wq_a.weight", "layers.*.attn.wq_a.weight"));
  EXPECT_FALSE(matches_pattern("layers.12.attn.wq_a.scale", "layers.*.attn.wq_a.weight"));
  EXPECT_FALSE(matches_pattern("layers..attn.wq_a.weight", "layers.*.attn.wq_a.weight"));
  EXPECT_FALSE(matches_pattern("layers.1.attn.indexer.wq_a.weight", "layers.*.attn.wq_a.weight"));
  EXPECT_TRUE(matches_pattern("mtp.0.ffn.experts.7.w2.weight", "mtp.*.ffn.experts.*.*.weight"));
  EXPECT_FALSE(matches_pattern("mtp.0.ffn.experts.7.w2.scale", "mtp.*.ffn.experts.*.*.weight"));
  EXPECT_FALSE(matches_pattern("layers.0.attn.wq_a.weight.extra", "layers.*.attn.wq_a.weight"));
}

TEST(Inventory, VisionGroupAcceptedOnlyWithAVisionConfig) {
  const Model m = load("tiny_v41");
  auto records = records_of(m.expected);
  records.push_back({"vision.blocks.0.attn.wqkv.weight", DType::BF16, {96, 32}, 0});
  records.push_back({"aligner.w1.bias", DType::BF16, {64}, 0});
  records.push_back({"image_newline", DType::BF16, {64}, 0});

  InventoryOptions o = inventory_options(m.config, m.plan);
  ASSERT_FALSE(o.accept_vision);
  InventoryReport r = compare_inventory(m.expected, records, o);
  EXPECT_EQ(r.unexpected.size(), 3u);

  o.accept_vision = true;
  r = compare_inventory(m.expected, records, o);
  EXPECT_TRUE(r.ok()) << r.format();
  EXPECT_EQ(r.vision_tensors, 3);
  EXPECT_EQ(r.vision_params, 96 * 32 + 64 + 64);
  EXPECT_EQ(r.vision_bytes, static_cast<uint64_t>((96 * 32 + 64 + 64) * 2));
}

}  // namespace
}  // namespace cedar
