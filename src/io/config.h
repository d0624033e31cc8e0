// Model configuration, read from any of the released spellings (../shared/spec/architecture.md §1.1):
//   * HF composite `config.json` for deepseek_v41 (`text_config` + top-level `quantization_config`,
//     `vision_config`); a bare `deepseek_v41_text` config is accepted too,
//   * HF flat `config.json` for deepseek_v4 (`quantization_config` with `fmt`, `expert_dtype` top level;
//     `rope_scaling.type` instead of `rope_type`; newer transformers spellings `layer_types` /
//     `compress_rates` / `mlp_layer_types` / `partial_rotary_factor` / `rope_parameters` as well),
//   * the reference `inference/config.json` (ModelArgs key names: dim, n_layers, window_size, ...).
// Nothing about layer counts or ids is assumed; the layer plan is derived from these fields
// (model/layer_plan.h). Unknown keys are ignored (HF configs carry many training-only keys).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace cedar {

enum class Arch { DeepseekV41, DeepseekV4 };
std::string_view arch_name(Arch a);  // "deepseek_v41" / "deepseek_v4"

// Speculative-decoding blocks after the backbone (`mtp.{k}` tensors).
enum class DraftKind {
  None,
  NextN,   // V4-Flash (June): one MTP block with e_proj/h_proj/enorm/hnorm and its own hc_head
  DSpark,  // V4.1-Flash and V4-Flash-0731: main_proj on stage 0, Markov + confidence heads on the last
};
std::string_view draft_kind_name(DraftKind k);

struct RopeScaling {
  std::string type = "yarn";  // only YaRN is used by these models
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position_embeddings = 0;  // 0 = no scaling
  bool enabled() const { return original_max_position_embeddings > 0; }
  bool operator==(const RopeScaling&) const = default;
};

struct QuantConfig {
  std::string quant_method;          // "fp8" or "" (bf16 checkpoint: no quantization_config)
  std::string activation_scheme;     // "dynamic"
  int64_t weight_block_rows = 0;     // [32, 32] for V4.1, [128, 128] for V4
  int64_t weight_block_cols = 0;
  std::string fmt;                   // weight element format: "e4m3" (V4 spells it; V4.1 implies it)
  std::string scale_fmt;             // "ue8m0": every `.scale` is F8_E8M0
  std::string expert_dtype;          // "fp4" (MXFP4 routed experts) or "" (same as dense weights)
  bool quantized() const { return !quant_method.empty(); }
  bool fp4_experts() const { return quantized() && expert_dtype == "fp4"; }
  bool operator==(const QuantConfig&) const = default;
};

// The vision tower (`vision.*`, `aligner.*`, image delimiters). cedar is a text engine: the tower is
// only accounted for (inspect) and its tensors accepted by the inventory check.
struct VisionConfig {
  int64_t num_hidden_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t intermediate_size = 0;
  int64_t patch_size = 0;
  int64_t downsample_ratio = 1;
  int64_t max_image_tokens = 0;
  int64_t min_pixels = 0;
  double rope_theta = 10000.0;
  bool operator==(const VisionConfig&) const = default;
};

struct ModelConfig {
  Arch arch = Arch::DeepseekV41;
  std::string source_format;  // "hf-composite", "hf-text", "hf-flat", "inference" — for messages
  std::string source;         // file the config came from (prefixes every later error)

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_nextn_predict_layers = 0;  // as written; see num_draft_blocks()
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 1;
  int64_t head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t sliding_window = 0;
  std::vector<int64_t> compress_ratios;  // backbone layers first, then draft blocks

  // CSA2 (V4.1): which layers own caches / indexers. Empty for V4.
  std::vector<int64_t> kv_source_layer_ids;
  std::vector<int64_t> index_source_layer_ids;
  int64_t candidate_source_layer_id = -1;  // < 0: no hierarchical top-k
  int64_t candidate_topk_blocks = 0;
  int64_t candidate_block_size = 0;

  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;

  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;

  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 1;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  std::string scoring_func = "sqrtsoftplus";
  std::string topk_method = "noaux_tc";
  std::string hidden_act = "silu";
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  double swiglu_limit = 0.0;
  double gate_temp = 1.0;
  int64_t num_hash_layers = 0;  // V4: first N MoE layers are hash-routed

  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;

  // Engram (V4.1)
  std::vector<int64_t> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;  // one per Engram layer
  int64_t engram_max_ngram_size = 0;
  int64_t engram_vocab_size = 0;
  int64_t engram_n_heads = 0;
  int64_t engram_head_dim = 0;
  int64_t engram_pad_id = 2;
  int64_t engram_compressed_vocab_size = 0;

  // Draft blocks (DSpark / NextN)
  DraftKind draft_kind = DraftKind::None;
  int64_t dspark_block_size = 0;
  int64_t dspark_noise_token_id = -1;
  std::vector<int64_t> dspark_target_layer_ids;
  int64_t dspark_markov_rank = 0;
  int64_t dspark_n_routed_experts = 0;     // V4-0731 (absent): same as the backbone
  int64_t dspark_num_experts_per_tok = 0;  // absent: same as the backbone

  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  int64_t pad_token_id = 2;
  int64_t image_token_id = -1;
  bool tie_word_embeddings = false;

  QuantConfig quant;
  bool has_vision = false;  // vision_config present (vision tensors expected in the checkpoint)
  VisionConfig vision;

  // Number of draft blocks actually present. V4.1: num_nextn_predict_layers (= the reference's
  // n_mtp_layers). V4: the compress_ratios tail beyond the backbone when there is one (V4-Flash-0731
  // writes num_nextn_predict_layers = 1 but ships 3 DSpark stages and 46 ratios), else
  // num_nextn_predict_layers (architecture.md §6 item 12).
  int64_t num_draft_blocks() const;
  // Routed experts / top-k of the draft blocks' MoE.
  int64_t draft_n_routed_experts() const;
  int64_t draft_num_experts_per_tok() const;

  bool operator==(const ModelConfig&) const = default;
};

// Parses a config json in any supported spelling. `label` names the file in errors. All problems
// found (wrong types, missing required fields, out-of-range values) are reported together.
Result<ModelConfig> parse_model_config(const nlohmann::json& j, const std::string& label);
// Reads `<dir>/config.json` (or a path to a json file) and parses it.
Result<ModelConfig> load_model_config(const std::filesystem::path& path);
// Serializes as an HF config.json of the config's architecture (composite for V4.1, flat for V4).
// parse_model_config(to_hf_config_json(c)) reproduces every field of c except source/source_format.
nlohmann::json to_hf_config_json(const ModelConfig& c);

}  // namespace cedar
