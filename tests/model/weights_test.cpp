// The expected inventory against independent references:
//   * architecture.md §2.2 (names, shapes, dtypes; the tensor-count contract of the released index),
//   * per-dtype tensor counts and byte totals read from the released checkpoints' safetensors
//     headers by an independent inventory (bojieli/OpenTallas data/inventory/*.json):
//     DeepSeek-V4.1-Flash rev dba1be0a (96 085 tensors, 510 286 023 000 B) and
//     DeepSeek-V4-Flash-0731 rev 7872f01b (72 317 tensors, 166 878 536 440 B),
//   * the published size of the June V4-Flash MTP block (1 575 `mtp.0.*` tensors).
#include "model/weights.h"

#include <fstream>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace cedar {
namespace {

using nlohmann::json;

const std::string kConfigs = std::string(CEDAR_TEST_DATA_DIR) + "/configs/";

struct Loaded {
  ModelConfig config;
  LayerPlan plan;
  std::vector<WeightSpec> weights;
};

Loaded from_config(const ModelConfig& c) {
  Loaded l;
  l.config = c;
  auto p = build_layer_plan(c);
  EXPECT_TRUE(p.ok()) << p.error().message;
  l.plan = *p;
  auto w = expected_weights(c, l.plan);
  EXPECT_TRUE(w.ok()) << w.error().message;
  l.weights = *w;
  return l;
}

Loaded load(const std::string& name) {
  auto c = load_model_config(kConfigs + name);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return from_config(*c);
}

const WeightSpec* find(const std::vector<WeightSpec>& w, const std::string& name) {
  for (const auto& s : w)
    if (s.name == name) return &s;
  return nullptr;
}

int64_t count_suffix(const std::vector<WeightSpec>& w, const std::string& prefix, const std::string& suffix) {
  int64_t n = 0;
  for (const auto& s : w)
    n += s.name.rfind(prefix, 0) == 0 && s.name.size() >= suffix.size() &&
         s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  return n;
}

// `layers.{L}.ffn.experts.{E}.w{1,2,3}.weight` (or mtp.*) count.
int64_t count_expert_weights(const std::vector<WeightSpec>& w, const std::string& prefix) {
  int64_t n = 0;
  for (const auto& s : w) n += s.name.rfind(prefix, 0) == 0 && s.expert >= 0 && s.format != WeightFormat::Scale;
  return n;
}

void expect_spec(const std::vector<WeightSpec>& w, const std::string& name, DType dtype, std::vector<int64_t> shape) {
  const WeightSpec* s = find(w, name);
  ASSERT_NE(s, nullptr) << name;
  EXPECT_EQ(s->dtype, dtype) << name;
  EXPECT_EQ(s->shape, shape) << name;
}

struct DTypeTotals {
  int64_t tensors = 0;
  uint64_t bytes = 0;
};

std::map<DType, DTypeTotals> by_dtype(const std::vector<WeightSpec>& w) {
  std::map<DType, DTypeTotals> out;
  for (const auto& s : w) {
    out[s.dtype].tensors += 1;
    out[s.dtype].bytes += s.nbytes();
  }
  return out;
}

TEST(Weights, V41TensorCountContract) {
  const Loaded l = load("deepseek_v41_flash");
  const auto& w = l.weights;
  EXPECT_EQ(count_suffix(w, "layers.", ".attn.wq_a.weight"), 40);
  EXPECT_EQ(count_suffix(w, "layers.", ".attn.compressor.wkv.weight"), 4);
  EXPECT_EQ(count_suffix(w, "layers.", ".attn.compressor.wgate.weight"), 3);
  EXPECT_EQ(count_suffix(w, "layers.", ".attn.indexer.wq_b.weight"), 8);
  EXPECT_EQ(count_suffix(w, "layers.", ".attn.indexer.wk.weight"), 4);
  EXPECT_EQ(count_suffix(w, "layers.", ".engram.embed.weight"), 2);
  EXPECT_EQ(count_expert_weights(w, "layers."), 40 * 384 * 3);
  EXPECT_EQ(count_expert_weights(w, "mtp."), 3 * 128 * 3);
}

TEST(Weights, V41MatchesReleasedHeaderTotals) {
  const Loaded l = load("deepseek_v41_flash");
  const auto totals = by_dtype(l.weights);
  // Non-BF16 dtypes have no vision tensors: exact per-dtype counts and bytes of the release.
  EXPECT_EQ(totals.at(DType::F32).tensors, 387);
  EXPECT_EQ(totals.at(DType::F32).bytes, 169229128u);
  EXPECT_EQ(totals.at(DType::F8_E4M3).tensors, 357);
  EXPECT_EQ(totals.at(DType::F8_E4M3).bytes, 204015223296u);
  EXPECT_EQ(totals.at(DType::F8_E8M0).tensors, 47589);
  EXPECT_EQ(totals.at(DType::F8_E8M0).bytes, 23563015184u);
  EXPECT_EQ(totals.at(DType::I8).tensors, 47232);
  EXPECT_EQ(totals.at(DType::I8).bytes, 278585671680u);
  // BF16 = text tensors + the (not enumerated) vision group.
  const VisionEstimate v = estimate_vision(l.config);
  EXPECT_EQ(totals.at(DType::BF16).tensors + v.tensors, 520);
  EXPECT_EQ(totals.at(DType::BF16).bytes + static_cast<uint64_t>(v.params) * 2, 3952883712u);
  EXPECT_EQ(static_cast<int64_t>(l.weights.size()) + v.tensors, 96085);
  // Logical parameters (MXFP4 counted per element) incl. vision: 763 205 315 794 (§2).
  int64_t params = v.params;
  for (const auto& s : l.weights) params += s.logical_params;
  EXPECT_EQ(params, 763205315794);
}

TEST(Weights, V41ShapesFromSpec) {
  const auto w = load("deepseek_v41_flash").weights;
  using D = DType;
  expect_spec(w, "embed.weight", D::BF16, {129280, 5120});
  expect_spec(w, "norm.weight", D::BF16, {5120});
  expect_spec(w, "head.weight", D::BF16, {129280, 5120});
  expect_spec(w, "layers.0.hc_attn_fn", D::F32, {24, 20480});
  expect_spec(w, "layers.0.hc_ffn_base", D::F32, {24});
  expect_spec(w, "layers.0.hc_ffn_scale", D::F32, {3});
  expect_spec(w, "layers.0.attn.attn_sink", D::F32, {64});
  expect_spec(w, "layers.0.attn.wq_a.weight", D::F8_E4M3, {1280, 5120});
  expect_spec(w, "layers.0.attn.wq_a.scale", D::F8_E8M0, {40, 160});
  expect_spec(w, "layers.0.attn.wq_b.weight", D::F8_E4M3, {32768, 1280});
  expect_spec(w, "layers.0.attn.wq_b.scale", D::F8_E8M0, {1024, 40});
  expect_spec(w, "layers.7.attn.wkv.scale", D::F8_E8M0, {16, 160});
  expect_spec(w, "layers.0.attn.wo_a.weight", D::F8_E4M3, {8192, 4096});
  expect_spec(w, "layers.0.attn.wo_a.scale", D::F8_E8M0, {256, 128});
  expect_spec(w, "layers.0.attn.wo_b.scale", D::F8_E8M0, {160, 256});
  expect_spec(w, "layers.2.attn.compressor.wkv.weight", D::BF16, {512, 5120});
  expect_spec(w, "layers.2.attn.compressor.wgate.weight", D::BF16, {512, 5120});
  expect_spec(w, "layers.20.attn.compressor.norm.weight", D::BF16, {512});
  EXPECT_EQ(find(w, "layers.20.attn.compressor.wgate.weight"), nullptr);
  expect_spec(w, "layers.20.attn.indexer.wk.weight", D::BF16, {128, 512});
  expect_spec(w, "layers.20.attn.indexer.k_norm.weight", D::BF16, {128});
  EXPECT_EQ(find(w, "layers.24.attn.indexer.wk.weight"), nullptr);
  expect_spec(w, "layers.24.attn.indexer.wq_b.weight", D::F8_E4M3, {4096, 1280});
  expect_spec(w, "layers.24.attn.indexer.wq_b.scale", D::F8_E8M0, {128, 40});
  expect_spec(w, "layers.24.attn.indexer.weights_proj.weight", D::BF16, {32, 5120});
  EXPECT_EQ(find(w, "layers.25.attn.indexer.wq_b.weight"), nullptr);
  expect_spec(w, "layers.0.ffn.gate.weight", D::BF16, {384, 5120});
  expect_spec(w, "layers.0.ffn.gate.bias", D::F32, {384});
  expect_spec(w, "layers.0.ffn.gate.bias_vl", D::F32, {384});
  expect_spec(w, "layers.0.ffn.experts.0.w1.weight", D::I8, {2304, 2560});
  expect_spec(w, "layers.0.ffn.experts.0.w1.scale", D::F8_E8M0, {2304, 160});
  expect_spec(w, "layers.39.ffn.experts.383.w2.weight", D::I8, {5120, 1152});
  expect_spec(w, "layers.39.ffn.experts.383.w2.scale", D::F8_E8M0, {5120, 72});
  expect_spec(w, "layers.0.ffn.shared_experts.w1.scale", D::F8_E8M0, {72, 160});
  expect_spec(w, "layers.0.ffn.shared_experts.w2.weight", D::F8_E4M3, {5120, 2304});
  expect_spec(w, "layers.1.engram.embed.weight", D::F8_E4M3, {384006168, 256});
  expect_spec(w, "layers.14.engram.embed.weight", D::F8_E4M3, {384016682, 256});
  expect_spec(w, "layers.14.engram.embed.scale", D::F8_E8M0, {384016682, 8});
  expect_spec(w, "layers.1.engram.wkv.weight", D::F8_E4M3, {25600, 6144});
  expect_spec(w, "layers.1.engram.wkv.scale", D::F8_E8M0, {800, 192});
  expect_spec(w, "layers.1.engram.q_weight", D::BF16, {4, 5120});
  expect_spec(w, "mtp.0.main_proj.weight", D::F8_E4M3, {5120, 15360});
  expect_spec(w, "mtp.0.main_norm.weight", D::BF16, {5120});
  expect_spec(w, "mtp.1.ffn.gate.weight", D::BF16, {128, 5120});
  expect_spec(w, "mtp.1.ffn.experts.127.w3.weight", D::I8, {2304, 2560});
  expect_spec(w, "mtp.2.norm.weight", D::BF16, {5120});
  expect_spec(w, "mtp.2.markov_head.embed.weight", D::BF16, {129280, 256});
  expect_spec(w, "mtp.2.markov_head.head.weight", D::BF16, {129280, 256});
  expect_spec(w, "mtp.2.confidence_head.proj.weight", D::BF16, {1, 5376});
  EXPECT_EQ(find(w, "mtp.1.main_proj.weight"), nullptr);
  EXPECT_EQ(find(w, "mtp.0.norm.weight"), nullptr);
  EXPECT_EQ(find(w, "hc_head_fn"), nullptr);  // V4.1 has no hc_head
}

TEST(Weights, NamesAreUniqueAndTagged) {
  for (const char* name : {"deepseek_v41_flash", "deepseek_v4_flash", "deepseek_v4_flash_0731"}) {
    SCOPED_TRACE(name);
    const auto w = load(name).weights;
    std::set<std::string> names, all;
    for (const auto& s : w) all.insert(s.name);
    for (const auto& s : w) {
      EXPECT_TRUE(names.insert(s.name).second) << "duplicate " << s.name;
      EXPECT_FALSE(is_vision_tensor(s.name)) << s.name;
      if (s.name.rfind("layers.", 0) == 0) {
        EXPECT_EQ(s.name.rfind("layers." + std::to_string(s.layer) + ".", 0), 0u) << s.name;
      }
      if (s.name.rfind("mtp.", 0) == 0) {
        EXPECT_EQ(s.name.rfind("mtp." + std::to_string(s.draft_block) + ".", 0), 0u) << s.name;
      }
      // Every quantized weight has its `.scale` sibling (§2).
      if (s.format == WeightFormat::FP8Block || s.format == WeightFormat::MXFP4 || s.format == WeightFormat::FP8Rows) {
        const std::string stem = s.name.substr(0, s.name.size() - std::string(".weight").size());
        EXPECT_EQ(all.count(stem + ".scale"), 1u) << s.name;
      }
    }
  }
}

TEST(Weights, V4Flash0731MatchesReleasedHeaderTotals) {
  const Loaded l = load("deepseek_v4_flash_0731");
  EXPECT_EQ(l.weights.size(), 72317u);
  const auto t = by_dtype(l.weights);
  const std::map<DType, std::pair<int64_t, uint64_t>> published = {
      {DType::BF16, {445, 2967134976u}},  {DType::F32, {433, 150966520u}},
      {DType::F8_E4M3, {390, 6304038912u}}, {DType::F8_E8M0, {35718, 9261408000u}},
      {DType::I64, {3, 18616320u}},       {DType::I8, {35328, 148176371712u}},
  };
  for (const auto& [dtype, expected] : published) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    EXPECT_EQ(t.at(dtype).tensors, expected.first);
    EXPECT_EQ(t.at(dtype).bytes, expected.second);
  }
  EXPECT_EQ(t.size(), published.size());
}

TEST(Weights, V4ShapesAndNextnBlock) {
  const auto w = load("deepseek_v4_flash").weights;
  using D = DType;
  expect_spec(w, "hc_head_fn", D::F32, {4, 16384});
  expect_spec(w, "hc_head_base", D::F32, {4});
  expect_spec(w, "hc_head_scale", D::F32, {1});
  expect_spec(w, "layers.0.ffn.gate.tid2eid", D::I64, {129280, 6});
  EXPECT_EQ(find(w, "layers.0.ffn.gate.bias"), nullptr);
  expect_spec(w, "layers.3.ffn.gate.bias", D::F32, {256});
  expect_spec(w, "layers.0.attn.wq_a.weight", D::F8_E4M3, {1024, 4096});
  expect_spec(w, "layers.0.attn.wq_a.scale", D::F8_E8M0, {8, 32});  // 128×128 blocks
  expect_spec(w, "layers.0.attn.wq_b.scale", D::F8_E8M0, {256, 8});
  expect_spec(w, "layers.2.attn.compressor.wkv.weight", D::BF16, {1024, 4096});  // CSA: overlap, coff 2
  expect_spec(w, "layers.2.attn.compressor.ape", D::F32, {4, 1024});
  expect_spec(w, "layers.3.attn.compressor.wgate.weight", D::BF16, {512, 4096});  // HCA
  expect_spec(w, "layers.3.attn.compressor.ape", D::F32, {128, 512});
  expect_spec(w, "layers.2.attn.indexer.wq_b.weight", D::F8_E4M3, {8192, 1024});
  expect_spec(w, "layers.2.attn.indexer.weights_proj.weight", D::BF16, {64, 4096});
  expect_spec(w, "layers.2.attn.indexer.compressor.wkv.weight", D::BF16, {256, 4096});
  expect_spec(w, "layers.2.attn.indexer.compressor.ape", D::F32, {4, 256});
  EXPECT_EQ(find(w, "layers.3.attn.indexer.wq_b.weight"), nullptr);
  expect_spec(w, "layers.4.ffn.experts.255.w1.weight", D::I8, {2048, 2048});
  expect_spec(w, "layers.4.ffn.experts.255.w1.scale", D::F8_E8M0, {2048, 128});
  expect_spec(w, "mtp.0.e_proj.weight", D::F8_E4M3, {4096, 4096});
  expect_spec(w, "mtp.0.e_proj.scale", D::F8_E8M0, {32, 32});
  expect_spec(w, "mtp.0.hnorm.weight", D::BF16, {4096});
  expect_spec(w, "mtp.0.hc_head_fn", D::F32, {4, 16384});
  EXPECT_EQ(count_suffix(w, "mtp.0.", ""), 1575);  // the published NextN block
  EXPECT_EQ(count_suffix(w, "layers.", ".attn.compressor.wkv.weight"), 41);
  EXPECT_EQ(count_suffix(w, "layers.", ".attn.indexer.wq_b.weight"), 21);
}

TEST(Weights, Bf16CheckpointHasNoScales) {
  json j;
  std::ifstream(kConfigs + "deepseek_v41_flash/config.json") >> j;
  j.erase("quantization_config");
  auto c = parse_model_config(j, "bf16.json");
  ASSERT_TRUE(c.ok()) << c.error().message;
  const auto w = from_config(*c).weights;
  for (const auto& s : w) {
    EXPECT_EQ(s.name.find(".scale"), std::string::npos) << s.name;
    EXPECT_TRUE(s.dtype == DType::BF16 || s.dtype == DType::F32) << s.name;
  }
  expect_spec(w, "layers.0.ffn.experts.0.w1.weight", DType::BF16, {2304, 5120});
  expect_spec(w, "layers.1.engram.embed.weight", DType::BF16, {384006168, 256});
  expect_spec(w, "layers.0.attn.wq_b.weight", DType::BF16, {32768, 1280});
}

TEST(Weights, VisionGroupNames) {
  EXPECT_TRUE(is_vision_tensor("vision.blocks.0.attn.wqkv.weight"));
  EXPECT_TRUE(is_vision_tensor("aligner.w1.bias"));
  EXPECT_TRUE(is_vision_tensor("image_newline"));
  EXPECT_FALSE(is_vision_tensor("visionary.weight"));
  EXPECT_FALSE(is_vision_tensor("layers.0.ffn.gate.bias_vl"));
}

TEST(Weights, PlanFromAnotherConfigIsRejected) {
  const Loaded v4 = load("deepseek_v4_flash");
  const Loaded v41 = load("deepseek_v41_flash");
  auto w = expected_weights(v41.config, v4.plan);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().message.find("layer plan does not belong to this config"), std::string::npos);
}

}  // namespace
}  // namespace cedar
