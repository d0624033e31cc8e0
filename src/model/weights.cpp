// Shared part of the weight inventory: storage formats, naming, the block tensors common to both
// architectures (architecture.md §2.1–2.2), and the vision group.
#include "model/weights.h"

#include "model/weight_list_builder.h"

namespace cedar {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

}  // namespace

std::string_view weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16: return "bf16";
    case WeightFormat::F32: return "f32";
    case WeightFormat::FP8Block: return "fp8_block";
    case WeightFormat::MXFP4: return "mxfp4";
    case WeightFormat::FP8Rows: return "fp8_rows";
    case WeightFormat::Scale: return "scale";
    case WeightFormat::Other: return "other";
  }
  return "?";
}

std::string_view component_name(Component c) {
  switch (c) {
    case Component::Embedding: return "embedding";
    case Component::Head: return "head";
    case Component::FinalNorm: return "final_norm";
    case Component::Norms: return "norms";
    case Component::HyperConnections: return "hyper_connections";
    case Component::Attention: return "attention";
    case Component::Compressor: return "compressor";
    case Component::Indexer: return "indexer";
    case Component::IndexerKeys: return "indexer_keys";
    case Component::Router: return "router";
    case Component::RoutedExperts: return "routed_experts";
    case Component::SharedExpert: return "shared_expert";
    case Component::Engram: return "engram";
    case Component::EngramTable: return "engram_tables";
    case Component::Draft: return "draft";
    case Component::Vision: return "vision";
  }
  return "?";
}

int64_t WeightSpec::numel() const { return product(shape); }
uint64_t WeightSpec::nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype); }

void WeightListBuilder::set_scope(std::string prefix, int64_t layer, int64_t draft_block) {
  prefix_ = std::move(prefix);
  layer_ = layer;
  draft_block_ = draft_block;
}

void WeightListBuilder::push(WeightSpec s) {
  s.name = prefix_ + s.name;
  s.layer = layer_;
  s.draft_block = draft_block_;
  out_->push_back(std::move(s));
}

void WeightListBuilder::bf16(const std::string& name, std::vector<int64_t> shape, Component comp) {
  const int64_t n = product(shape);
  push({name, DType::BF16, std::move(shape), WeightFormat::BF16, comp, -1, -1, -1, n});
}

void WeightListBuilder::f32(const std::string& name, std::vector<int64_t> shape, Component comp) {
  const int64_t n = product(shape);
  push({name, DType::F32, std::move(shape), WeightFormat::F32, comp, -1, -1, -1, n});
}

void WeightListBuilder::other(const std::string& name, DType dtype, std::vector<int64_t> shape, Component comp) {
  const int64_t n = product(shape);
  push({name, dtype, std::move(shape), WeightFormat::Other, comp, -1, -1, -1, n});
}

void WeightListBuilder::linear(const std::string& stem, int64_t out, int64_t in, Component comp) {
  const QuantConfig& q = c_.quant;
  if (!q.quantized()) {
    bf16(stem + ".weight", {out, in}, comp);
    return;
  }
  push({stem + ".weight", DType::F8_E4M3, {out, in}, WeightFormat::FP8Block, comp, -1, -1, -1, out * in});
  push({stem + ".scale", DType::F8_E8M0, {ceil_div(out, q.weight_block_rows), ceil_div(in, q.weight_block_cols)},
        WeightFormat::Scale, comp, -1, -1, -1, 0});
}

void WeightListBuilder::expert(const std::string& stem, int64_t out, int64_t in, int64_t expert_index) {
  const size_t first = out_->size();
  if (c_.quant.fp4_experts()) {
    push({stem + ".weight", DType::I8, {out, in / 2}, WeightFormat::MXFP4, Component::RoutedExperts, -1, -1, -1,
          out * in});
    push({stem + ".scale", DType::F8_E8M0, {out, in / 32}, WeightFormat::Scale, Component::RoutedExperts, -1, -1, -1,
          0});
  } else {
    linear(stem, out, in, Component::RoutedExperts);
  }
  for (size_t i = first; i < out_->size(); ++i) (*out_)[i].expert = expert_index;
}

void WeightListBuilder::engram_table(const std::string& stem, int64_t rows, int64_t width) {
  if (!c_.quant.quantized()) {
    bf16(stem + ".weight", {rows, width}, Component::EngramTable);
    return;
  }
  push({stem + ".weight", DType::F8_E4M3, {rows, width}, WeightFormat::FP8Rows, Component::EngramTable, -1, -1, -1,
        rows * width});
  push({stem + ".scale", DType::F8_E8M0, {rows, width / 32}, WeightFormat::Scale, Component::EngramTable, -1, -1, -1,
        0});
}

void add_block_core(WeightListBuilder& b, int64_t n_experts, RouterKind router) {
  const ModelConfig& c = b.config();
  const int64_t d = c.hidden_size, hc = c.hc_mult;
  const int64_t mix = (2 + hc) * hc;  // pre (hc) + post (hc) + residual combine (hc×hc)
  for (const char* site : {"attn", "ffn"}) {
    const std::string s = site;
    b.f32("hc_" + s + "_fn", {mix, hc * d}, Component::HyperConnections);
    b.f32("hc_" + s + "_base", {mix}, Component::HyperConnections);
    b.f32("hc_" + s + "_scale", {3}, Component::HyperConnections);
  }
  b.bf16("attn_norm.weight", {d}, Component::Norms);
  b.bf16("ffn_norm.weight", {d}, Component::Norms);

  const int64_t heads = c.num_attention_heads, hd = c.head_dim, ql = c.q_lora_rank;
  const int64_t o_width = c.o_groups * c.o_lora_rank;
  b.f32("attn.attn_sink", {heads}, Component::Attention);
  b.linear("attn.wq_a", ql, d, Component::Attention);
  b.bf16("attn.q_norm.weight", {ql}, Component::Attention);
  b.linear("attn.wq_b", heads * hd, ql, Component::Attention);
  b.linear("attn.wkv", hd, d, Component::Attention);
  b.bf16("attn.kv_norm.weight", {hd}, Component::Attention);
  b.linear("attn.wo_a", o_width, heads * hd / c.o_groups, Component::Attention);
  b.linear("attn.wo_b", d, o_width, Component::Attention);

  b.bf16("ffn.gate.weight", {n_experts, d}, Component::Router);
  if (router == RouterKind::HashTable) {
    b.other("ffn.gate.tid2eid", DType::I64, {c.vocab_size, c.num_experts_per_tok}, Component::Router);
  } else {
    b.f32("ffn.gate.bias", {n_experts}, Component::Router);
    if (router == RouterKind::BiasAndVisionBias) b.f32("ffn.gate.bias_vl", {n_experts}, Component::Router);
  }
  const int64_t inter = c.moe_intermediate_size;
  if (c.n_shared_experts > 0) {
    const int64_t shared = c.n_shared_experts * inter;
    b.linear("ffn.shared_experts.w1", shared, d, Component::SharedExpert);
    b.linear("ffn.shared_experts.w3", shared, d, Component::SharedExpert);
    b.linear("ffn.shared_experts.w2", d, shared, Component::SharedExpert);
  }
  for (int64_t e = 0; e < n_experts; ++e) {
    const std::string p = "ffn.experts." + std::to_string(e);
    b.expert(p + ".w1", inter, d, e);
    b.expert(p + ".w3", inter, d, e);
    b.expert(p + ".w2", d, inter, e);
  }
}

void add_hc_head(WeightListBuilder& b, Component comp) {
  const ModelConfig& c = b.config();
  b.f32("hc_head_fn", {c.hc_mult, c.hc_mult * c.hidden_size}, comp);
  b.f32("hc_head_base", {c.hc_mult}, comp);
  b.f32("hc_head_scale", {1}, comp);
}

Result<std::vector<WeightSpec>> expected_weights(const ModelConfig& c, const LayerPlan& plan) {
  if (plan.arch != c.arch || plan.num_layers() != c.num_hidden_layers)
    return make_error(c.source + ": layer plan does not belong to this config (" + std::string(arch_name(plan.arch)) +
                      ", " + std::to_string(plan.num_layers()) + " layers)");
  std::vector<WeightSpec> out;
  WeightListBuilder b(c, &out);
  if (c.arch == Arch::DeepseekV41) add_deepseek_v41_weights(plan, b);
  else add_deepseek_v4_weights(plan, b);
  return out;
}

bool is_vision_tensor(std::string_view name) {
  return starts_with(name, "vision.") || starts_with(name, "aligner.") || name == "image_start" ||
         name == "image_end" || name == "image_newline";
}

VisionEstimate estimate_vision(const ModelConfig& c) {
  VisionEstimate e;
  if (!c.has_vision) return e;
  const VisionConfig& v = c.vision;
  const int64_t vd = v.hidden_size, vi = v.intermediate_size, D = c.hidden_size;
  const int64_t r = v.downsample_ratio;
  const int64_t block = 2 * vd + (3 * vd * vd + 3 * vd) + (vd * vd + vd) + 2 * vi * vd + vd * vi;
  e.params = (vd * 3 * v.patch_size * v.patch_size + vd) + v.num_hidden_layers * block + vd +
             (D * vd * r * r + D) + (D * D + D) + 3 * D;
  e.tensors = 2 + 8 * v.num_hidden_layers + 1 + 4 + 3;
  return e;
}

void add_dspark_stage_extras(WeightListBuilder& b, const DraftBlockRole& d) {
  const ModelConfig& c = b.config();
  const int64_t dim = c.hidden_size, rank = c.dspark_markov_rank;
  if (d.is_first) {
    b.linear("main_proj", dim, dim * static_cast<int64_t>(c.dspark_target_layer_ids.size()), Component::Draft);
    b.bf16("main_norm.weight", {dim}, Component::Draft);
  }
  if (d.is_last) {
    b.bf16("norm.weight", {dim}, Component::Draft);
    b.bf16("markov_head.embed.weight", {c.vocab_size, rank}, Component::Draft);
    b.bf16("markov_head.head.weight", {c.vocab_size, rank}, Component::Draft);
    b.bf16("confidence_head.proj.weight", {1, dim + rank}, Component::Draft);
  }
}

}  // namespace cedar
