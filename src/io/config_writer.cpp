// ModelConfig → HF config.json, in the layout the released checkpoints use: composite
// (text_config / vision_config / top-level quantization_config) for V4.1, flat for V4.
#include <nlohmann/json.hpp>

#include "io/config.h"

namespace cedar {
namespace {

using nlohmann::json;

json quant_json(const ModelConfig& c) {
  const QuantConfig& q = c.quant;
  json out = json::object();
  out["quant_method"] = q.quant_method;
  if (!q.activation_scheme.empty()) out["activation_scheme"] = q.activation_scheme;
  out["weight_block_size"] = {q.weight_block_rows, q.weight_block_cols};
  out["scale_fmt"] = q.scale_fmt;
  if (c.arch == Arch::DeepseekV4) {
    out["fmt"] = q.fmt;
  } else if (!q.expert_dtype.empty()) {
    out["expert_dtype"] = q.expert_dtype;
  }
  return out;
}

// Keys common to both architectures' text configs.
json text_json(const ModelConfig& c) {
  json t = json::object();
  t["vocab_size"] = c.vocab_size;
  t["hidden_size"] = c.hidden_size;
  t["num_hidden_layers"] = c.num_hidden_layers;
  t["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  t["num_attention_heads"] = c.num_attention_heads;
  t["num_key_value_heads"] = c.num_key_value_heads;
  t["head_dim"] = c.head_dim;
  t["qk_rope_head_dim"] = c.qk_rope_head_dim;
  t["q_lora_rank"] = c.q_lora_rank;
  t["o_groups"] = c.o_groups;
  t["o_lora_rank"] = c.o_lora_rank;
  t["sliding_window"] = c.sliding_window;
  t["compress_ratios"] = c.compress_ratios;
  t["index_n_heads"] = c.index_n_heads;
  t["index_head_dim"] = c.index_head_dim;
  t["index_topk"] = c.index_topk;
  t["rope_theta"] = c.rope_theta;
  t["compress_rope_theta"] = c.compress_rope_theta;
  if (c.rope_scaling.enabled()) {
    const RopeScaling& r = c.rope_scaling;
    // V4.1 writes `rope_type`, V4 writes `type` (as released).
    t["rope_scaling"] = {{c.arch == Arch::DeepseekV41 ? "rope_type" : "type", r.type},
                         {"factor", r.factor},
                         {"beta_fast", r.beta_fast},
                         {"beta_slow", r.beta_slow},
                         {"original_max_position_embeddings", r.original_max_position_embeddings}};
  }
  t["max_position_embeddings"] = c.max_position_embeddings;
  t["rms_norm_eps"] = c.rms_norm_eps;
  t["n_routed_experts"] = c.n_routed_experts;
  t["n_shared_experts"] = c.n_shared_experts;
  t["num_experts_per_tok"] = c.num_experts_per_tok;
  t["moe_intermediate_size"] = c.moe_intermediate_size;
  t["scoring_func"] = c.scoring_func;
  t["topk_method"] = c.topk_method;
  t["hidden_act"] = c.hidden_act;
  t["norm_topk_prob"] = c.norm_topk_prob;
  t["routed_scaling_factor"] = c.routed_scaling_factor;
  t["swiglu_limit"] = c.swiglu_limit;
  t["hc_mult"] = c.hc_mult;
  t["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  t["hc_eps"] = c.hc_eps;
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  t["attention_bias"] = false;
  t["bos_token_id"] = c.bos_token_id;
  t["eos_token_id"] = c.eos_token_id;
  t["pad_token_id"] = c.pad_token_id;
  return t;
}

void add_dspark(const ModelConfig& c, json& t) {
  t["dspark_block_size"] = c.dspark_block_size;
  t["dspark_noise_token_id"] = c.dspark_noise_token_id;
  t["dspark_target_layer_ids"] = c.dspark_target_layer_ids;
  t["dspark_markov_rank"] = c.dspark_markov_rank;
  if (c.dspark_n_routed_experts > 0) t["dspark_n_routed_experts"] = c.dspark_n_routed_experts;
  if (c.dspark_num_experts_per_tok > 0) t["dspark_num_experts_per_tok"] = c.dspark_num_experts_per_tok;
}

json v41_json(const ModelConfig& c) {
  json t = text_json(c);
  t["model_type"] = "deepseek_v41_text";
  t["gate_temp"] = c.gate_temp;
  t["kv_source_layer_ids"] = c.kv_source_layer_ids;
  t["index_source_layer_ids"] = c.index_source_layer_ids;
  t["candidate_source_layer_id"] = c.candidate_source_layer_id;
  t["candidate_topk_blocks"] = c.candidate_topk_blocks;
  t["candidate_block_size"] = c.candidate_block_size;
  t["engram_layer_ids"] = c.engram_layer_ids;
  t["engram_num_embeddings"] = c.engram_num_embeddings;
  t["engram_max_ngram_size"] = c.engram_max_ngram_size;
  t["engram_vocab_size"] = c.engram_vocab_size;
  t["engram_n_heads"] = c.engram_n_heads;
  t["engram_head_dim"] = c.engram_head_dim;
  t["engram_pad_token_id"] = c.engram_pad_id;  // the released spelling
  t["engram_compressed_vocab_size"] = c.engram_compressed_vocab_size;
  add_dspark(c, t);

  json out = json::object();
  out["architectures"] = {"DeepseekV41ForCausalLM"};
  out["model_type"] = "deepseek_v41";
  out["bos_token_id"] = c.bos_token_id;
  out["eos_token_id"] = c.eos_token_id;
  out["pad_token_id"] = c.pad_token_id;
  if (c.image_token_id >= 0) out["image_token_id"] = c.image_token_id;
  out["tie_word_embeddings"] = c.tie_word_embeddings;
  out["torch_dtype"] = "bfloat16";
  if (c.quant.quantized()) out["quantization_config"] = quant_json(c);
  out["text_config"] = std::move(t);
  if (c.has_vision) {
    const VisionConfig& v = c.vision;
    out["vision_config"] = {{"model_type", "deepseek_v41_vision"},
                            {"num_hidden_layers", v.num_hidden_layers},
                            {"hidden_size", v.hidden_size},
                            {"num_attention_heads", v.num_attention_heads},
                            {"intermediate_size", v.intermediate_size},
                            {"patch_size", v.patch_size},
                            {"downsample_ratio", v.downsample_ratio},
                            {"max_image_tokens", v.max_image_tokens},
                            {"min_pixels", v.min_pixels},
                            {"rope_theta", v.rope_theta}};
  }
  return out;
}

json v4_json(const ModelConfig& c) {
  json t = text_json(c);
  t["architectures"] = {"DeepseekV4ForCausalLM"};
  t["model_type"] = "deepseek_v4";
  t["num_hash_layers"] = c.num_hash_layers;
  t["torch_dtype"] = "bfloat16";
  if (c.image_token_id >= 0) t["image_token_id"] = c.image_token_id;
  if (c.quant.quantized()) {
    t["quantization_config"] = quant_json(c);
    if (!c.quant.expert_dtype.empty()) t["expert_dtype"] = c.quant.expert_dtype;
  }
  if (c.draft_kind == DraftKind::DSpark) add_dspark(c, t);
  return t;
}

}  // namespace

nlohmann::json to_hf_config_json(const ModelConfig& c) {
  return c.arch == Arch::DeepseekV41 ? v41_json(c) : v4_json(c);
}

}  // namespace cedar
