// Config parsing against the released values (architecture.md §1.1, the published config.json /
// inference/config.json files copied into tests/data/configs) and every error path.
#include "io/config.h"

#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

namespace cedar {
namespace {

using nlohmann::json;

const std::string kConfigs = std::string(CEDAR_TEST_DATA_DIR) + "/configs/";

json read_json(const std::string& name) {
  std::ifstream in(kConfigs + name + "/config.json");
  return json::parse(in);
}

ModelConfig load(const std::string& name) {
  auto c = load_model_config(kConfigs + name);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return c.ok() ? *c : ModelConfig{};
}

// Error message of parsing `j`, or "" when it parses.
std::string parse_error(const json& j) {
  auto c = parse_model_config(j, "test.json");
  return c.ok() ? std::string() : c.error().message;
}

TEST(Config, ReleasedV41CompositeHasSpecValues) {
  const ModelConfig c = load("deepseek_v41_flash");
  EXPECT_EQ(c.arch, Arch::DeepseekV41);
  EXPECT_EQ(c.source_format, "hf-composite");
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.num_hidden_layers, 40);
  EXPECT_EQ(c.num_nextn_predict_layers, 3);
  EXPECT_EQ(c.num_draft_blocks(), 3);
  EXPECT_EQ(c.draft_kind, DraftKind::DSpark);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.q_lora_rank, 1280);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.sliding_window, 128);
  std::vector<int64_t> ratios = {0, 0};
  ratios.insert(ratios.end(), 18, 2);
  ratios.insert(ratios.end(), 20, 1);
  ratios.insert(ratios.end(), 3, 0);
  EXPECT_EQ(c.compress_ratios, ratios);
  EXPECT_EQ(c.kv_source_layer_ids, (std::vector<int64_t>{2, 8, 14, 20}));
  EXPECT_EQ(c.index_source_layer_ids, (std::vector<int64_t>{2, 8, 14, 20, 24, 28, 32, 36}));
  EXPECT_EQ(c.candidate_source_layer_id, 20);
  EXPECT_EQ(c.candidate_topk_blocks, 2048);
  EXPECT_EQ(c.candidate_block_size, 8);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_EQ(c.rope_scaling.factor, 16.0);
  EXPECT_EQ(c.rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(c.rope_scaling.beta_slow, 1.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 65536);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_EQ(c.rms_norm_eps, 1e-20);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.moe_intermediate_size, 2304);
  EXPECT_EQ(c.scoring_func, "sqrtsoftplus");
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_EQ(c.swiglu_limit, 10.0);
  EXPECT_EQ(c.gate_temp, 1.0);  // absent in the release → 1.0
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_EQ(c.hc_eps, 1e-6);
  EXPECT_EQ(c.num_hash_layers, 0);
  EXPECT_EQ(c.engram_layer_ids, (std::vector<int64_t>{1, 14}));
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(c.engram_max_ngram_size, 4);
  EXPECT_EQ(c.engram_vocab_size, 16000000);
  EXPECT_EQ(c.engram_n_heads, 8);
  EXPECT_EQ(c.engram_head_dim, 256);
  EXPECT_EQ(c.engram_pad_id, 2);
  EXPECT_EQ(c.engram_compressed_vocab_size, 99092);
  EXPECT_EQ(c.dspark_block_size, 5);
  EXPECT_EQ(c.dspark_noise_token_id, 128799);
  EXPECT_EQ(c.dspark_target_layer_ids, (std::vector<int64_t>{37, 38, 39}));
  EXPECT_EQ(c.dspark_markov_rank, 256);
  EXPECT_EQ(c.draft_n_routed_experts(), 128);
  EXPECT_EQ(c.draft_num_experts_per_tok(), 3);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.pad_token_id, 2);
  EXPECT_EQ(c.image_token_id, 129264);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.quant.quant_method, "fp8");
  EXPECT_EQ(c.quant.activation_scheme, "dynamic");
  EXPECT_EQ(c.quant.weight_block_rows, 32);
  EXPECT_EQ(c.quant.weight_block_cols, 32);
  EXPECT_EQ(c.quant.scale_fmt, "ue8m0");
  EXPECT_EQ(c.quant.expert_dtype, "fp4");
  EXPECT_TRUE(c.quant.fp4_experts());
  ASSERT_TRUE(c.has_vision);
  EXPECT_EQ(c.vision.num_hidden_layers, 32);
  EXPECT_EQ(c.vision.hidden_size, 1024);
  EXPECT_EQ(c.vision.num_attention_heads, 16);
  EXPECT_EQ(c.vision.intermediate_size, 2816);
  EXPECT_EQ(c.vision.patch_size, 14);
  EXPECT_EQ(c.vision.downsample_ratio, 3);
  EXPECT_EQ(c.vision.max_image_tokens, 1024);
  EXPECT_EQ(c.vision.min_pixels, 295936);
}

TEST(Config, InferenceConfigMatchesHfConfig) {
  ModelConfig hf = load("deepseek_v41_flash");
  ModelConfig inf = load("deepseek_v41_flash_inference");
  EXPECT_EQ(inf.source_format, "inference");
  hf.source = inf.source = "";
  hf.source_format = inf.source_format = "";
  EXPECT_EQ(to_hf_config_json(hf).dump(1), to_hf_config_json(inf).dump(1));
  EXPECT_TRUE(hf == inf);
}

TEST(Config, V4FlashFlat) {
  const ModelConfig c = load("deepseek_v4_flash");
  EXPECT_EQ(c.arch, Arch::DeepseekV4);
  EXPECT_EQ(c.source_format, "hf-flat");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_hidden_layers, 43);
  EXPECT_EQ(c.q_lora_rank, 1024);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.num_hash_layers, 3);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.compress_ratios.size(), 44u);
  EXPECT_EQ(c.num_draft_blocks(), 1);
  EXPECT_EQ(c.draft_kind, DraftKind::NextN);
  EXPECT_EQ(c.rope_scaling.type, "yarn");  // spelled `type` in V4
  EXPECT_EQ(c.rope_scaling.factor, 16.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 65536);
  EXPECT_EQ(c.quant.weight_block_rows, 128);
  EXPECT_EQ(c.quant.fmt, "e4m3");
  EXPECT_EQ(c.quant.scale_fmt, "ue8m0");
  EXPECT_EQ(c.quant.expert_dtype, "fp4");  // top-level key in V4
  EXPECT_FALSE(c.has_vision);
}

TEST(Config, V4Flash0731HasThreeDSparkStagesDespiteNextn1) {
  const ModelConfig c = load("deepseek_v4_flash_0731");
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.compress_ratios.size(), 46u);
  EXPECT_EQ(c.num_draft_blocks(), 3);  // architecture.md §6 item 12
  EXPECT_EQ(c.draft_kind, DraftKind::DSpark);
  EXPECT_EQ(c.dspark_target_layer_ids, (std::vector<int64_t>{40, 41, 42}));
  EXPECT_EQ(c.draft_n_routed_experts(), 256);  // no dspark_n_routed_experts: the backbone's
  EXPECT_EQ(c.draft_num_experts_per_tok(), 6);
}

TEST(Config, EngramPadIdBothSpellings) {
  json j = read_json("deepseek_v41_flash");
  j["text_config"]["engram_pad_token_id"] = 7;
  EXPECT_EQ(parse_model_config(j, "t")->engram_pad_id, 7);
  j["text_config"].erase("engram_pad_token_id");
  j["text_config"]["engram_pad_id"] = 9;
  EXPECT_EQ(parse_model_config(j, "t")->engram_pad_id, 9);
  json inf = read_json("deepseek_v41_flash_inference");
  inf["engram_pad_id"] = 5;
  EXPECT_EQ(parse_model_config(inf, "t")->engram_pad_id, 5);
}

TEST(Config, RopeScalingTypeAndRopeTypeKeys) {
  json j = read_json("deepseek_v41_flash");
  j["text_config"]["rope_scaling"].erase("rope_type");
  j["text_config"]["rope_scaling"]["type"] = "yarn";
  EXPECT_EQ(parse_model_config(j, "t")->rope_scaling.factor, 16.0);
  json v4 = read_json("deepseek_v4_flash");
  v4["rope_scaling"].erase("type");
  v4["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_EQ(parse_model_config(v4, "t")->rope_scaling.original_max_position_embeddings, 65536);
}

TEST(Config, RoundTripThroughHfJson) {
  for (const char* name :
       {"deepseek_v41_flash", "deepseek_v41_flash_inference", "deepseek_v4_flash", "deepseek_v4_flash_0731"}) {
    SCOPED_TRACE(name);
    ModelConfig a = load(name);
    auto b = parse_model_config(to_hf_config_json(a), "roundtrip");
    ASSERT_TRUE(b.ok()) << b.error().message;
    ModelConfig bb = *b;
    a.source = bb.source = "";
    a.source_format = bb.source_format = "";
    EXPECT_EQ(to_hf_config_json(a).dump(1), to_hf_config_json(bb).dump(1));
    EXPECT_TRUE(a == bb);
  }
}

TEST(Config, V4NewerTransformersSpellingEqualsLegacy) {
  json legacy = read_json("deepseek_v4_flash");
  json modern = legacy;
  json types = json::array();
  for (int i = 0; i < 43; ++i) {  // transformers writes one type per backbone layer
    const json& r = legacy["compress_ratios"][i];
    types.push_back(r == 0 ? "sliding_attention" : r == 4 ? "compressed_sparse_attention" : "heavily_compressed_attention");
  }
  modern["layer_types"] = types;
  modern["compress_rates"] = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 128}};
  modern["mlp_layer_types"] = json::array();
  for (int i = 0; i < 43; ++i) modern["mlp_layer_types"].push_back(i < 3 ? "hash_moe" : "moe");
  modern["partial_rotary_factor"] = 0.125;
  for (const char* k : {"compress_ratios", "num_hash_layers", "qk_rope_head_dim"}) modern.erase(k);
  auto a = parse_model_config(legacy, "legacy");
  auto b = parse_model_config(modern, "modern");
  ASSERT_TRUE(b.ok()) << b.error().message;
  // layer_types spans the backbone only, so the NextN block count comes from num_nextn_predict_layers.
  std::vector<int64_t> backbone(a->compress_ratios.begin(), a->compress_ratios.begin() + 43);
  EXPECT_EQ(b->compress_ratios, backbone);
  EXPECT_EQ(b->num_hash_layers, 3);
  EXPECT_EQ(b->qk_rope_head_dim, 64);
  EXPECT_EQ(b->num_draft_blocks(), 1);
}

TEST(Config, BareTextConfigAndBf16Checkpoint) {
  json j = read_json("deepseek_v41_flash")["text_config"];
  auto c = parse_model_config(j, "text.json");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->source_format, "hf-text");
  EXPECT_FALSE(c->quant.quantized());  // no quantization_config: bf16 weights
  EXPECT_FALSE(c->has_vision);
}

TEST(Config, EosMayBeAList) {
  json j = read_json("deepseek_v4_flash");
  j["eos_token_id"] = {1, 128803};
  EXPECT_EQ(parse_model_config(j, "t")->eos_token_id, 1);
}

TEST(ConfigErrors, WrongTypeNamesFileAndField) {
  json j = read_json("deepseek_v41_flash");
  j["text_config"]["hidden_size"] = "5120";
  const std::string e = parse_error(j);
  EXPECT_NE(e.find("test.json: text_config.hidden_size: expected an integer, got string \"5120\""), std::string::npos) << e;
}

TEST(ConfigErrors, MissingRequiredField) {
  json j = read_json("deepseek_v41_flash");
  j["text_config"].erase("n_routed_experts");
  const std::string e = parse_error(j);
  EXPECT_NE(e.find("text_config.n_routed_experts: required field is missing"), std::string::npos) << e;
  json inf = read_json("deepseek_v41_flash_inference");
  inf.erase("norm_eps");
  EXPECT_NE(parse_error(inf).find("norm_eps: required field is missing"), std::string::npos);
}

TEST(ConfigErrors, OutOfRangeValues) {
  json j = read_json("deepseek_v4_flash");
  j["num_hidden_layers"] = 0;
  EXPECT_NE(parse_error(j).find("num_hidden_layers: must be >= 1, got 0"), std::string::npos) << parse_error(j);
  j = read_json("deepseek_v4_flash");
  j["compress_ratios"][3] = -4;
  EXPECT_NE(parse_error(j).find("compress_ratios: element 3: must be >= 0, got -4"), std::string::npos) << parse_error(j);
  j = read_json("deepseek_v4_flash");
  j["compress_ratios"][5] = "x";
  EXPECT_NE(parse_error(j).find("compress_ratios: element 5: expected an integer"), std::string::npos);
  j = read_json("deepseek_v4_flash");
  j["rms_norm_eps"] = 0.0;
  EXPECT_NE(parse_error(j).find("rms_norm_eps: must be > 0"), std::string::npos) << parse_error(j);
  j = read_json("deepseek_v4_flash");
  j["num_key_value_heads"] = 8;
  EXPECT_NE(parse_error(j).find("num_key_value_heads: must be <= 1"), std::string::npos);
}

TEST(ConfigErrors, AllProblemsReportedTogether) {
  json j = read_json("deepseek_v41_flash");
  j["text_config"]["hidden_size"] = -1;
  j["text_config"]["scoring_func"] = "relu";
  j["text_config"].erase("kv_source_layer_ids");
  const std::string e = parse_error(j);
  EXPECT_NE(e.find("3 problems"), std::string::npos) << e;
  EXPECT_NE(e.find("text_config.hidden_size: must be >= 1, got -1"), std::string::npos) << e;
  EXPECT_NE(e.find("text_config.scoring_func: unsupported value \"relu\""), std::string::npos) << e;
  EXPECT_NE(e.find("text_config.kv_source_layer_ids: required field is missing"), std::string::npos) << e;
}

TEST(ConfigErrors, UnsupportedValues) {
  auto expect = [](json j, const std::string& needle) {
    const std::string e = parse_error(j);
    EXPECT_NE(e.find(needle), std::string::npos) << "expected '" << needle << "' in: " << e;
  };
  json j = read_json("deepseek_v41_flash");
  j["quantization_config"]["quant_method"] = "awq";
  expect(j, "quantization_config.quant_method: unsupported value \"awq\"");
  j = read_json("deepseek_v41_flash");
  j["quantization_config"]["weight_block_size"] = {32, 32, 32};
  expect(j, "quantization_config.weight_block_size: expected 2 entries");
  j = read_json("deepseek_v41_flash");
  j["text_config"]["rope_scaling"]["rope_type"] = "linear";
  expect(j, "text_config.rope_scaling.rope_type: unsupported value \"linear\"");
  j = read_json("deepseek_v41_flash");
  j["text_config"]["attention_bias"] = true;
  expect(j, "text_config.attention_bias: true is not supported");
  j = read_json("deepseek_v41_flash");
  j["model_type"] = "llama";
  expect(j, "test.json: model_type: unsupported string \"llama\"");
  j = read_json("deepseek_v41_flash");
  j.erase("text_config");
  expect(j, "text_config: required for model_type deepseek_v41");
  j = read_json("deepseek_v41_flash");
  j["text_config"] = 5;
  expect(j, "text_config: expected an object, got number 5");
  expect(json::array(), "expected a JSON object at the top level");
  expect(json{{"hello", 1}}, "not a recognised model config");
}

TEST(ConfigErrors, CrossFieldChecks) {
  json j = read_json("deepseek_v41_flash");
  j["text_config"]["qk_rope_head_dim"] = 512;
  EXPECT_NE(parse_error(j).find("qk_rope_head_dim: must be even and smaller than head_dim (512), got 512"),
            std::string::npos)
      << parse_error(j);
  j = read_json("deepseek_v41_flash");
  j["text_config"]["num_experts_per_tok"] = 400;
  EXPECT_NE(parse_error(j).find("num_experts_per_tok: 400 exceeds n_routed_experts 384"), std::string::npos);
  j = read_json("deepseek_v41_flash");
  j["text_config"]["moe_intermediate_size"] = 2300;
  EXPECT_NE(parse_error(j).find("MXFP4 experts need hidden and expert widths divisible by 32"), std::string::npos);
  j = read_json("deepseek_v41_flash");
  j["text_config"]["o_groups"] = 7;
  EXPECT_NE(parse_error(j).find("o_groups: 7 does not divide the 64 heads"), std::string::npos);
}

class ConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("cedar_config_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(dir_ / "config.json") << text; }
  std::filesystem::path dir_;
};

TEST_F(ConfigFiles, LoadsDirectoryOrFile) {
  write(read_json("deepseek_v4_flash").dump());
  EXPECT_TRUE(load_model_config(dir_).ok());
  EXPECT_TRUE(load_model_config(dir_ / "config.json").ok());
}

TEST_F(ConfigFiles, InvalidJsonNamesTheFile) {
  write("{\"model_type\": \"deepseek_v4\",");
  auto c = load_model_config(dir_);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find((dir_ / "config.json").string() + ": not valid JSON"), std::string::npos)
      << c.error().message;
}

TEST_F(ConfigFiles, MissingFile) {
  auto c = load_model_config(dir_ / "nope");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("cannot open config file"), std::string::npos);
}

TEST_F(ConfigFiles, FieldErrorsNameTheFile) {
  json j = read_json("deepseek_v4_flash");
  j["hidden_size"] = 1.5;
  write(j.dump());
  auto c = load_model_config(dir_);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find((dir_ / "config.json").string() + ": hidden_size: expected an integer, got number 1.5"),
            std::string::npos)
      << c.error().message;
}

}  // namespace
}  // namespace cedar
