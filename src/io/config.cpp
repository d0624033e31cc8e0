// Config parsing for the three released spellings (architecture.md §1.1). Policy:
//   * keys that fix tensor shapes or numerics (widths, layer counts, ratios, source ids, norm eps,
//     routed scale) are required in every spelling — a silent default there would load garbage;
//   * behavioural scalars default to the HF class defaults of the architecture
//     (configuration_deepseek_v41.py / configuration_deepseek_v4.py), since HF writes only
//     non-default values in some exports;
//   * every problem is collected and reported at once, each naming the file and the field.
#include "io/config.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/json_fields.h"

namespace cedar {
namespace {

using nlohmann::json;

enum class Format { HfComposite, HfText, HfFlat, Inference };

constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxCount = int64_t{1} << 40;
constexpr Need kRequired = Need::Required;
constexpr Need kOptional = Need::Optional;

// Picks the key spelling of the current format.
struct Spelling {
  bool inference = false;
  JsonKey operator()(std::string_view hf, std::string_view inf) const { return {inference ? inf : hf}; }
};

void read_shape(JsonFields& f, const Spelling& k, ModelConfig& c) {
  f.read_int(k("vocab_size", "vocab_size"), &c.vocab_size, kRequired, 1, kMaxDim);
  f.read_int(k("hidden_size", "dim"), &c.hidden_size, kRequired, 1, kMaxDim);
  f.read_int(k("num_hidden_layers", "n_layers"), &c.num_hidden_layers, kRequired, 1, 4096);
  f.read_int(k("num_nextn_predict_layers", "n_mtp_layers"), &c.num_nextn_predict_layers,
             k.inference ? kRequired : kOptional, 0, 64);
  f.read_int(k("num_attention_heads", "n_heads"), &c.num_attention_heads, kRequired, 1, 4096);
  // One shared K=V latent is the only layout these models have (§1.1).
  f.read_int(k("num_key_value_heads", ""), &c.num_key_value_heads, kOptional, 1, 1);
  f.read_int(k("head_dim", "head_dim"), &c.head_dim, kRequired, 2, kMaxDim);
  f.read_int(k("q_lora_rank", "q_lora_rank"), &c.q_lora_rank, kRequired, 1, kMaxDim);
  f.read_int(k("o_groups", "o_groups"), &c.o_groups, kRequired, 1, 4096);
  f.read_int(k("o_lora_rank", "o_lora_rank"), &c.o_lora_rank, kRequired, 1, kMaxDim);
  f.read_int(k("sliding_window", "window_size"), &c.sliding_window, kRequired, 1, kMaxDim);
  f.read_int(k("index_n_heads", "index_n_heads"), &c.index_n_heads, kRequired, 1, 4096);
  f.read_int(k("index_head_dim", "index_head_dim"), &c.index_head_dim, kRequired, 2, kMaxDim);
  f.read_int(k("index_topk", "index_topk"), &c.index_topk, kRequired, 1, kMaxCount);
  f.read_double(k("rope_theta", "rope_theta"), &c.rope_theta, kOptional, 1.0);
  f.read_double(k("compress_rope_theta", "compress_rope_theta"), &c.compress_rope_theta, kOptional, 1.0);
  f.read_double(k("rms_norm_eps", "norm_eps"), &c.rms_norm_eps, kRequired, 0.0, 1.0);
  if (c.rms_norm_eps <= 0.0 && f.has(k("rms_norm_eps", "norm_eps")))
    f.error(k.inference ? "norm_eps" : "rms_norm_eps", "must be > 0");
  f.read_int(k("max_position_embeddings", ""), &c.max_position_embeddings, kOptional, 1, kMaxCount);

  f.read_int(k("n_routed_experts", "n_routed_experts"), &c.n_routed_experts, kRequired, 1, 1 << 20);
  f.read_int(k("n_shared_experts", "n_shared_experts"), &c.n_shared_experts, kOptional, 0, 64);
  f.read_int(k("num_experts_per_tok", "n_activated_experts"), &c.num_experts_per_tok, kRequired, 1, 1 << 20);
  f.read_int(k("moe_intermediate_size", "moe_inter_dim"), &c.moe_intermediate_size, kRequired, 1, kMaxDim);
  f.read_string(k("scoring_func", "score_func"), &c.scoring_func, kOptional, {"sqrtsoftplus", "softmax", "sigmoid"});
  f.read_string(k("topk_method", ""), &c.topk_method, kOptional, {"noaux_tc"});
  f.read_string(k("hidden_act", ""), &c.hidden_act, kOptional, {"silu"});
  f.read_bool(k("norm_topk_prob", ""), &c.norm_topk_prob, kOptional);
  f.read_double(k("routed_scaling_factor", "route_scale"), &c.routed_scaling_factor, kRequired, 0.0);
  f.read_double(k("swiglu_limit", "swiglu_limit"), &c.swiglu_limit, kOptional, 0.0);
  f.read_double(k("gate_temp", "gate_temp"), &c.gate_temp, kOptional, 1e-30);

  f.read_int(k("hc_mult", "hc_mult"), &c.hc_mult, kOptional, 1, 64);
  f.read_int(k("hc_sinkhorn_iters", "hc_sinkhorn_iters"), &c.hc_sinkhorn_iters, kOptional, 1, 10000);
  f.read_double(k("hc_eps", "hc_eps"), &c.hc_eps, kOptional, 0.0);

  f.read_bool(k("tie_word_embeddings", ""), &c.tie_word_embeddings, kOptional);
  bool attention_bias = false;
  f.read_bool(k("attention_bias", ""), &attention_bias, kOptional);
  if (attention_bias) f.error("attention_bias", "true is not supported (these models have no attention biases)");
}

// qk_rope_head_dim, or newer transformers' partial_rotary_factor (V4) = rope dims / head_dim.
void read_rope_dim(JsonFields& f, const Spelling& k, ModelConfig& c) {
  if (!k.inference && !f.has({"qk_rope_head_dim"}) && f.has({"partial_rotary_factor"})) {
    double factor = 0.0;
    f.read_double({"partial_rotary_factor"}, &factor, kRequired, 0.0, 1.0);
    c.qk_rope_head_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * factor + 0.5);
    return;
  }
  f.read_int(k("qk_rope_head_dim", "rope_head_dim"), &c.qk_rope_head_dim, kRequired, 2, kMaxDim);
}

// YaRN on the compressed branch: HF `rope_scaling` (key `rope_type` in V4.1, `type` in V4), newer
// HF `rope_parameters.compress`, or the reference's flat original_seq_len / rope_factor / beta_*.
void read_rope_scaling(JsonFields& f, const Spelling& k, ModelConfig& c) {
  RopeScaling& r = c.rope_scaling;
  if (k.inference) {
    f.read_int({"original_seq_len"}, &r.original_max_position_embeddings, kOptional, 0, kMaxCount);
    f.read_double({"rope_factor"}, &r.factor, kOptional, 1.0);
    f.read_double({"beta_fast"}, &r.beta_fast, kOptional);
    f.read_double({"beta_slow"}, &r.beta_slow, kOptional);
    return;
  }
  std::string_view key = "rope_scaling";
  if (!f.has({"rope_scaling"}) && f.has({"rope_parameters"})) {
    JsonFields rp = f.child("rope_parameters");
    if (!rp.has({"compress"})) return;
    JsonFields yarn = rp.child("compress");
    std::string type = "default";
    yarn.read_string({"rope_type", "type"}, &type, kOptional, {"yarn", "default"});
    if (type != "yarn") return;
    yarn.read_double({"factor"}, &r.factor, kRequired, 1.0);
    yarn.read_double({"beta_fast"}, &r.beta_fast, kOptional);
    yarn.read_double({"beta_slow"}, &r.beta_slow, kOptional);
    yarn.read_int({"original_max_position_embeddings"}, &r.original_max_position_embeddings, kRequired, 1, kMaxCount);
    return;
  }
  if (!f.has({key})) return;
  JsonFields yarn = f.child(key);
  yarn.read_string({"rope_type", "type"}, &r.type, kRequired, {"yarn"});
  yarn.read_double({"factor"}, &r.factor, kRequired, 1.0);
  yarn.read_double({"beta_fast"}, &r.beta_fast, kOptional);
  yarn.read_double({"beta_slow"}, &r.beta_slow, kOptional);
  yarn.read_int({"original_max_position_embeddings"}, &r.original_max_position_embeddings, kRequired, 1, kMaxCount);
}

// DSpark drafter keys, shared by V4.1 and V4-Flash-0731; the target layers are required when the
// config declares draft blocks (V4.1).
void read_dspark_fields(JsonFields& f, const Spelling& k, ModelConfig& c, Need targets_need) {
  f.read_int_list(k("dspark_target_layer_ids", "dspark_target_layer_ids"), &c.dspark_target_layer_ids, targets_need,
                  0, 4095);
  f.read_int(k("dspark_block_size", "dspark_block_size"), &c.dspark_block_size, kOptional, 1, 4096);
  f.read_int(k("dspark_noise_token_id", "dspark_noise_token_id"), &c.dspark_noise_token_id, kOptional, 0, kMaxCount);
  f.read_int(k("dspark_markov_rank", "dspark_markov_rank"), &c.dspark_markov_rank, kOptional, 1, kMaxDim);
  f.read_int(k("dspark_n_routed_experts", "dspark_n_routed_experts"), &c.dspark_n_routed_experts, kOptional, 1,
             1 << 20);
  f.read_int(k("dspark_num_experts_per_tok", "dspark_n_activated_experts"), &c.dspark_num_experts_per_tok,
             kOptional, 1, 1 << 20);
}

void read_v41_fields(JsonFields& f, const Spelling& k, ModelConfig& c) {
  f.read_int_list(k("compress_ratios", "compress_ratios"), &c.compress_ratios, kRequired, 0, 1 << 20);
  f.read_int_list(k("kv_source_layer_ids", "kv_source_layers"), &c.kv_source_layer_ids, kRequired, 0, 4095);
  f.read_int_list(k("index_source_layer_ids", "index_source_layers"), &c.index_source_layer_ids, kRequired, 0, 4095);
  // HF default: the last KV source; negative disables the hierarchical top-k.
  c.candidate_source_layer_id = c.kv_source_layer_ids.empty() ? -1 : c.kv_source_layer_ids.back();
  f.read_int(k("candidate_source_layer_id", "candidate_source_layer"), &c.candidate_source_layer_id, kOptional);
  if (c.candidate_source_layer_id < 0) c.candidate_source_layer_id = -1;
  f.read_int(k("candidate_topk_blocks", "candidate_topk_blocks"), &c.candidate_topk_blocks, kOptional, 1, kMaxCount);
  f.read_int(k("candidate_block_size", "candidate_block_size"), &c.candidate_block_size, kOptional, 1, kMaxCount);

  f.read_int_list(k("engram_layer_ids", "engram_layer_ids"), &c.engram_layer_ids, kOptional, 0, 4095);
  const Need engram_need = c.engram_layer_ids.empty() ? kOptional : kRequired;
  f.read_int_list(k("engram_num_embeddings", "engram_num_embeddings"), &c.engram_num_embeddings, engram_need, 1,
                  kMaxCount);
  f.read_int(k("engram_max_ngram_size", "engram_max_ngram_size"), &c.engram_max_ngram_size, kOptional, 2, 64);
  f.read_int(k("engram_vocab_size", "engram_vocab_size"), &c.engram_vocab_size, kOptional, 1, kMaxCount);
  f.read_int(k("engram_n_heads", "engram_n_heads"), &c.engram_n_heads, kOptional, 1, 4096);
  f.read_int(k("engram_head_dim", "engram_head_dim"), &c.engram_head_dim, kOptional, 1, kMaxDim);
  // Released HF config.json says engram_pad_token_id; the transformers class and inference/config.json
  // say engram_pad_id (§6 item 1).
  f.read_int(k.inference ? JsonKey{"engram_pad_id"} : JsonKey{"engram_pad_token_id", "engram_pad_id"},
             &c.engram_pad_id, kOptional, 0, kMaxCount);
  f.read_int(k("engram_compressed_vocab_size", "engram_compressed_vocab_size"), &c.engram_compressed_vocab_size,
             kOptional, 1, kMaxCount);

  read_dspark_fields(f, k, c, c.num_nextn_predict_layers > 0 ? kRequired : kOptional);
}

// V4 layer schedule: legacy per-layer `compress_ratios` (the released config), or newer transformers'
// `layer_types` + `compress_rates`.
void read_v4_schedule(JsonFields& f, const Spelling& k, ModelConfig& c) {
  if (k.inference || f.has({"compress_ratios"}) || !f.has({"layer_types"})) {
    f.read_int_list(k("compress_ratios", "compress_ratios"), &c.compress_ratios, kRequired, 0, 1 << 20);
    return;
  }
  int64_t csa = 4, hca = 128;
  if (f.has({"compress_rates"})) {
    JsonFields rates = f.child("compress_rates");
    rates.read_int({"compressed_sparse_attention"}, &csa, kOptional, 1, 1 << 20);
    rates.read_int({"heavily_compressed_attention"}, &hca, kOptional, 1, 1 << 20);
  }
  const json* types = f.find({"layer_types"});
  if (!types->is_array()) {
    f.error("layer_types", "expected a list of strings, got " + describe_json(*types));
    return;
  }
  for (size_t i = 0; i < types->size(); ++i) {
    const json& t = (*types)[i];
    const std::string s = t.is_string() ? t.get<std::string>() : "";
    if (s == "sliding_attention") c.compress_ratios.push_back(0);
    else if (s == "compressed_sparse_attention") c.compress_ratios.push_back(csa);
    else if (s == "heavily_compressed_attention") c.compress_ratios.push_back(hca);
    else f.error("layer_types", "element " + std::to_string(i) + ": unsupported " + describe_json(t));
  }
}

void read_v4_fields(JsonFields& f, const Spelling& k, ModelConfig& c) {
  read_v4_schedule(f, k, c);
  c.num_hash_layers = 3;  // HF DeepseekV4Config.default_num_hash_layers
  if (!k.inference && !f.has({"num_hash_layers"}) && f.has({"mlp_layer_types"})) {
    const json* types = f.find({"mlp_layer_types"});
    if (!types->is_array()) {
      f.error("mlp_layer_types", "expected a list of strings, got " + describe_json(*types));
      return;
    }
    int64_t n = 0;
    for (size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      const bool hash = t.is_string() && t.get<std::string>() == "hash_moe";
      if (!hash && !(t.is_string() && t.get<std::string>() == "moe"))
        f.error("mlp_layer_types", "element " + std::to_string(i) + ": unsupported " + describe_json(t));
      else if (hash && n != static_cast<int64_t>(i))
        f.error("mlp_layer_types", "hash_moe layers must come first (element " + std::to_string(i) + ")");
      else if (hash) ++n;
    }
    c.num_hash_layers = n;
  } else {
    f.read_int(k("num_hash_layers", "n_hash_layers"), &c.num_hash_layers, k.inference ? kRequired : kOptional, 0,
               4096);
  }
  // V4-Flash-0731 ships a DSpark drafter described by the same keys as V4.1 (experts default to the
  // backbone's).
  read_dspark_fields(f, k, c, kOptional);
}

// HF quantization_config (V4.1: inside it `expert_dtype`; V4: `fmt` inside, `expert_dtype` top level).
void read_hf_quant(JsonFields& top, ModelConfig& c) {
  if (!top.has({"quantization_config"})) return;
  JsonFields q = top.child("quantization_config");
  QuantConfig& qc = c.quant;
  q.read_string({"quant_method"}, &qc.quant_method, kRequired, {"fp8"});
  q.read_string({"activation_scheme"}, &qc.activation_scheme, kOptional, {"dynamic"});
  std::vector<int64_t> block;
  q.read_int_list({"weight_block_size"}, &block, kRequired, 1, 1 << 16);
  if (block.size() == 2) {
    qc.weight_block_rows = block[0];
    qc.weight_block_cols = block[1];
  } else if (q.has({"weight_block_size"}) && !block.empty()) {
    q.error("weight_block_size", "expected 2 entries [rows, cols], got " + std::to_string(block.size()));
  }
  qc.fmt = "e4m3";
  q.read_string({"fmt"}, &qc.fmt, kOptional, {"e4m3"});
  qc.scale_fmt = "ue8m0";
  q.read_string({"scale_fmt"}, &qc.scale_fmt, kOptional, {"ue8m0"});
  q.read_string({"expert_dtype"}, &qc.expert_dtype, kOptional, {"fp4", "fp8"});
  if (qc.expert_dtype.empty()) top.read_string({"expert_dtype"}, &qc.expert_dtype, kOptional, {"fp4", "fp8"});
}

// inference/config.json: dtype "fp8" | "bf16", expert_dtype "fp4" | null. The reference kernels fix
// the weight block: 32×32 for V4.1, 128×128 for V4 (the HF configs state the same).
void read_inference_quant(JsonFields& f, ModelConfig& c) {
  std::string dtype = "bf16";
  f.read_string({"dtype"}, &dtype, kOptional, {"fp8", "bf16"});
  if (dtype != "fp8") return;
  QuantConfig& qc = c.quant;
  qc.quant_method = "fp8";
  qc.activation_scheme = "dynamic";
  qc.weight_block_rows = qc.weight_block_cols = c.arch == Arch::DeepseekV41 ? 32 : 128;
  qc.fmt = "e4m3";
  qc.scale_fmt = "ue8m0";
  f.read_string({"scale_fmt"}, &qc.scale_fmt, kOptional, {"ue8m0"});
  f.read_string({"expert_dtype"}, &qc.expert_dtype, kOptional, {"fp4", "fp8"});
}

void read_vision(JsonFields& v, const Spelling& k, ModelConfig& c) {
  VisionConfig& vc = c.vision;
  v.read_int(k("num_hidden_layers", "vision_n_layers"), &vc.num_hidden_layers, kRequired, 1, 4096);
  v.read_int(k("hidden_size", "vision_dim"), &vc.hidden_size, kRequired, 1, kMaxDim);
  v.read_int(k("num_attention_heads", "vision_n_heads"), &vc.num_attention_heads, kRequired, 1, 4096);
  v.read_int(k("intermediate_size", "vision_inter_dim"), &vc.intermediate_size, kRequired, 1, kMaxDim);
  v.read_int(k("patch_size", "vision_patch_size"), &vc.patch_size, kRequired, 1, 4096);
  v.read_int(k("downsample_ratio", "vision_downsample_ratio"), &vc.downsample_ratio, kOptional, 1, 64);
  v.read_int(k("max_image_tokens", "vision_max_n_token"), &vc.max_image_tokens, kOptional, 0, kMaxCount);
  v.read_int(k("min_pixels", "vision_min_pixels"), &vc.min_pixels, kOptional, 0, kMaxCount);
  v.read_double(k("rope_theta", "vision_rope_theta"), &vc.rope_theta, kOptional, 1.0);
  c.has_vision = true;
}

void read_token_ids(JsonFields& f, ModelConfig& c) {
  f.read_int({"bos_token_id"}, &c.bos_token_id, kOptional, 0, kMaxCount);
  f.read_int_or_first({"eos_token_id"}, &c.eos_token_id, kOptional);
  f.read_int({"pad_token_id"}, &c.pad_token_id, kOptional, 0, kMaxCount);
  f.read_int({"image_token_id"}, &c.image_token_id, kOptional, 0, kMaxCount);
}

// HF class defaults that differ between the two architectures.
void set_arch_defaults(ModelConfig& c) {
  if (c.arch == Arch::DeepseekV41) {
    c.num_nextn_predict_layers = 3;
    c.max_position_embeddings = 1048576;
    c.candidate_topk_blocks = 2048;
    c.candidate_block_size = 8;
    c.routed_scaling_factor = 1.5;
    c.swiglu_limit = 10.0;
    c.engram_max_ngram_size = 4;
    c.engram_vocab_size = 16000000;
    c.engram_n_heads = 8;
    c.engram_head_dim = 256;
    c.engram_pad_id = 2;
    c.engram_compressed_vocab_size = 99092;
    c.dspark_block_size = 5;
    c.dspark_noise_token_id = 128799;
    c.dspark_markov_rank = 256;
    c.dspark_n_routed_experts = 128;
    c.dspark_num_experts_per_tok = 3;
  } else {
    c.num_nextn_predict_layers = 1;
    c.max_position_embeddings = 1048576;
    c.routed_scaling_factor = 1.5;
    c.swiglu_limit = 10.0;
    c.dspark_block_size = 5;
    c.dspark_noise_token_id = 128799;
    c.dspark_markov_rank = 256;
  }
}

// Checks that involve more than one field (run only when every field parsed, to avoid cascades).
void check_cross_fields(const ModelConfig& c, const Spelling& k, std::vector<std::string>& errors) {
  auto err = [&](std::string_view hf, std::string_view inf, const std::string& what) {
    errors.push_back(std::string(k.inference ? inf : hf) + ": " + what);
  };
  if (c.qk_rope_head_dim % 2 != 0 || c.qk_rope_head_dim >= c.head_dim)
    err("qk_rope_head_dim", "rope_head_dim",
        "must be even and smaller than head_dim (" + std::to_string(c.head_dim) + "), got " +
            std::to_string(c.qk_rope_head_dim));
  if (c.index_head_dim < c.qk_rope_head_dim)
    err("index_head_dim", "index_head_dim",
        "must be >= the rope dims (" + std::to_string(c.qk_rope_head_dim) + "), got " + std::to_string(c.index_head_dim));
  if ((c.num_attention_heads * c.head_dim) % c.o_groups != 0 || c.num_attention_heads % c.o_groups != 0)
    err("o_groups", "o_groups",
        std::to_string(c.o_groups) + " does not divide the " + std::to_string(c.num_attention_heads) + " heads");
  if (c.num_experts_per_tok > c.n_routed_experts)
    err("num_experts_per_tok", "n_activated_experts",
        std::to_string(c.num_experts_per_tok) + " exceeds n_routed_experts " + std::to_string(c.n_routed_experts));
  if (c.draft_kind == DraftKind::DSpark && c.draft_num_experts_per_tok() > c.draft_n_routed_experts())
    err("dspark_num_experts_per_tok", "dspark_n_activated_experts",
        std::to_string(c.draft_num_experts_per_tok()) + " exceeds the drafter's " +
            std::to_string(c.draft_n_routed_experts()) + " experts");
  if (c.quant.fp4_experts() && (c.hidden_size % 32 != 0 || c.moe_intermediate_size % 32 != 0))
    err("moe_intermediate_size", "moe_inter_dim",
        "MXFP4 experts need hidden and expert widths divisible by 32, got " + std::to_string(c.hidden_size) + " and " +
            std::to_string(c.moe_intermediate_size));
  if (!c.engram_layer_ids.empty() && c.quant.quantized() && c.engram_head_dim % 32 != 0)
    err("engram_head_dim", "engram_head_dim",
        "FP8 Engram tables need a row width divisible by 32, got " + std::to_string(c.engram_head_dim));
  if (c.quant.quantized() && (c.quant.weight_block_rows <= 0 || c.quant.weight_block_cols <= 0))
    errors.push_back("quantization_config.weight_block_size: required for fp8 checkpoints");
}

Result<Format> detect_format(const json& j, const std::string& label) {
  if (j.contains("model_type")) {
    const json& mt = j["model_type"];
    const std::string t = mt.is_string() ? mt.get<std::string>() : "";
    if (t == "deepseek_v41") return Format::HfComposite;
    if (t == "deepseek_v41_text") return Format::HfText;
    if (t == "deepseek_v4") return Format::HfFlat;
    return make_error(label + ": model_type: unsupported " + describe_json(mt) +
                      " (cedar reads deepseek_v41, deepseek_v41_text, deepseek_v4, or a reference inference/config.json)");
  }
  if (j.contains("dim") && j.contains("n_layers")) return Format::Inference;
  return make_error(label +
                    ": not a recognised model config: no 'model_type' (HF config.json) and no 'dim'/'n_layers' "
                    "(reference inference/config.json)");
}

std::string join_errors(const std::string& label, const std::vector<std::string>& errors) {
  if (errors.size() == 1) return label + ": " + errors[0];
  std::string out = label + ": " + std::to_string(errors.size()) + " problems:";
  for (const auto& e : errors) out += "\n  - " + e;
  return out;
}

}  // namespace

std::string_view arch_name(Arch a) { return a == Arch::DeepseekV41 ? "deepseek_v41" : "deepseek_v4"; }

std::string_view draft_kind_name(DraftKind k) {
  switch (k) {
    case DraftKind::None: return "none";
    case DraftKind::NextN: return "nextn";
    case DraftKind::DSpark: return "dspark";
  }
  return "?";
}

int64_t ModelConfig::num_draft_blocks() const {
  if (arch == Arch::DeepseekV41) return num_nextn_predict_layers;
  const int64_t tail = static_cast<int64_t>(compress_ratios.size()) - num_hidden_layers;
  return tail > 0 ? tail : num_nextn_predict_layers;
}

int64_t ModelConfig::draft_n_routed_experts() const {
  return dspark_n_routed_experts > 0 && draft_kind == DraftKind::DSpark ? dspark_n_routed_experts : n_routed_experts;
}

int64_t ModelConfig::draft_num_experts_per_tok() const {
  return dspark_num_experts_per_tok > 0 && draft_kind == DraftKind::DSpark ? dspark_num_experts_per_tok
                                                                           : num_experts_per_tok;
}

Result<ModelConfig> parse_model_config(const json& j, const std::string& label) {
  if (!j.is_object()) return make_error(label + ": expected a JSON object at the top level, got " + describe_json(j));
  CEDAR_ASSIGN_OR_RETURN(const Format format, detect_format(j, label));

  ModelConfig c;
  c.source = label;
  std::vector<std::string> errors;
  JsonFields top(j, "", &errors);
  const Spelling k{format == Format::Inference};
  switch (format) {
    case Format::HfComposite: c.source_format = "hf-composite"; break;
    case Format::HfText: c.source_format = "hf-text"; break;
    case Format::HfFlat: c.source_format = "hf-flat"; break;
    case Format::Inference: c.source_format = "inference"; break;
  }
  c.arch = format == Format::HfFlat ? Arch::DeepseekV4 : Arch::DeepseekV41;
  if (format == Format::Inference && !top.has({"kv_source_layers"}) && !top.has({"engram_layer_ids"}))
    c.arch = Arch::DeepseekV4;
  set_arch_defaults(c);

  if (format == Format::HfComposite && !top.has({"text_config"}))
    return make_error(label + ": text_config: required for model_type deepseek_v41 (composite config)");
  if (format == Format::HfComposite && !j["text_config"].is_object())
    return make_error(label + ": text_config: expected an object, got " + describe_json(j["text_config"]));
  JsonFields text = format == Format::HfComposite ? top.child("text_config") : top;
  if (format == Format::HfComposite) {
    std::string text_type = "deepseek_v41_text";
    text.read_string({"model_type"}, &text_type, kOptional, {"deepseek_v41_text"});
  }

  read_shape(text, k, c);
  read_rope_dim(text, k, c);
  read_rope_scaling(text, k, c);
  if (c.arch == Arch::DeepseekV41) read_v41_fields(text, k, c);
  else read_v4_fields(text, k, c);

  if (format == Format::Inference) {
    read_inference_quant(top, c);
    // The reference takes max_seq_len at run time; the trained context is original_seq_len × factor.
    if (c.rope_scaling.enabled())
      c.max_position_embeddings =
          static_cast<int64_t>(static_cast<double>(c.rope_scaling.original_max_position_embeddings) * c.rope_scaling.factor);
    read_token_ids(top, c);
    if (top.has({"vision_n_layers"})) read_vision(top, k, c);
  } else {
    read_hf_quant(top, c);
    read_token_ids(text, c);
    if (format == Format::HfComposite) {
      read_token_ids(top, c);
      if (top.has({"vision_config"})) {
        JsonFields v = top.child("vision_config");  // records a type error if it is not an object
        if (j["vision_config"].is_object()) read_vision(v, k, c);
      }
    }
  }

  const int64_t drafts = c.num_draft_blocks();
  if (drafts > 0) {
    const bool dspark = c.arch == Arch::DeepseekV41 || !c.dspark_target_layer_ids.empty();
    c.draft_kind = dspark ? DraftKind::DSpark : DraftKind::NextN;
  }

  if (errors.empty()) check_cross_fields(c, k, errors);
  if (!errors.empty()) return make_error(join_errors(label, errors));
  return c;
}

Result<ModelConfig> load_model_config(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::path file = std::filesystem::is_directory(path, ec) ? path / "config.json" : path;
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error(file.string() + ": cannot open config file");
  std::ostringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::parse_error& e) {  // nlohmann reports bad JSON only by exception
    return make_error(file.string() + ": not valid JSON: " + e.what());
  }
  return parse_model_config(j, file.string());
}

}  // namespace cedar
