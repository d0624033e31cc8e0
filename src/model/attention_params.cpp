#include "model/attention_params.h"

#include <string>
#include <vector>

namespace cedar {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

Status AttentionParams::validate() const {
  std::vector<std::string> bad;
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) bad.push_back(std::string(name) + " must be > 0, got " + str(v));
  };
  positive("hidden_size", dim);
  positive("num_attention_heads", n_heads);
  positive("head_dim", head_dim);
  positive("q_lora_rank", q_lora);
  positive("o_groups", o_groups);
  positive("o_lora_rank", o_lora);
  positive("sliding_window", window);
  if (head_dim > 0 && head_dim % 32 != 0)
    bad.push_back("head_dim " + str(head_dim) + " is not a multiple of 32 (SWA KV FP8 blocks, compressed KV FP4 blocks)");
  if (rope_dim <= 0 || rope_dim % 2 != 0 || rope_dim > head_dim)
    bad.push_back("qk_rope_head_dim " + str(rope_dim) + " must be even, > 0 and <= head_dim " + str(head_dim));
  if (n_heads > 0 && o_groups > 0 && n_heads % o_groups != 0)
    bad.push_back("num_attention_heads " + str(n_heads) + " is not a multiple of o_groups " + str(o_groups));
  if (main_rope.rope_dim() != rope_dim || compress_rope.rope_dim() != rope_dim)
    bad.push_back("rope tables rotate " + str(main_rope.rope_dim()) + " / " + str(compress_rope.rope_dim()) +
                  " channels, qk_rope_head_dim is " + str(rope_dim));
  // Indexer fields matter only for models with compressed layers; 0 means "no indexer".
  if (index_heads > 0 || index_head_dim > 0 || index_topk > 0) {
    positive("index_n_heads", index_heads);
    positive("index_topk", index_topk);
    if (index_head_dim <= 0 || index_head_dim % 32 != 0)
      bad.push_back("index_head_dim " + str(index_head_dim) + " must be a positive multiple of 32 (FP4 blocks)");
    if (rope_dim > index_head_dim)
      bad.push_back("qk_rope_head_dim " + str(rope_dim) + " exceeds index_head_dim " + str(index_head_dim));
  }
  if (candidate_topk_blocks > 0 && candidate_block_size <= 0)
    bad.push_back("candidate_block_size must be > 0, got " + str(candidate_block_size));
  if (bad.empty()) return Status::Ok();
  std::string msg = "attention parameters:";
  for (const auto& b : bad) msg += " " + b + ";";
  msg.pop_back();
  return make_error(msg);
}

Result<AttentionParams> attention_params_from_config(const ModelConfig& c) {
  AttentionParams p;
  p.dim = c.hidden_size;
  p.n_heads = c.num_attention_heads;
  p.head_dim = c.head_dim;
  p.rope_dim = c.qk_rope_head_dim;
  p.q_lora = c.q_lora_rank;
  p.o_groups = c.o_groups;
  p.o_lora = c.o_lora_rank;
  p.window = c.sliding_window;
  p.index_heads = c.index_n_heads;
  p.index_head_dim = c.index_head_dim;
  p.index_topk = c.index_topk;
  p.candidate_block_size = c.candidate_block_size;
  p.candidate_topk_blocks = c.candidate_source_layer_id >= 0 ? c.candidate_topk_blocks : 0;
  p.eps = c.rms_norm_eps;
  p.act_block = c.quant.quantized() ? c.quant.weight_block_cols : 32;
  p.main_rope = cpu::RopeTable(cpu::RopeConfig{.rope_dim = c.qk_rope_head_dim, .base = c.rope_theta});
  cpu::RopeConfig compress{.rope_dim = c.qk_rope_head_dim, .base = c.compress_rope_theta};
  if (c.rope_scaling.enabled()) {
    compress.yarn_factor = c.rope_scaling.factor;
    compress.beta_fast = c.rope_scaling.beta_fast;
    compress.beta_slow = c.rope_scaling.beta_slow;
    compress.original_max_position = c.rope_scaling.original_max_position_embeddings;
  }
  p.compress_rope = cpu::RopeTable(compress);
  if (auto s = p.validate(); !s.ok()) return s.error().with_context(c.source.empty() ? "config" : c.source);
  return p;
}

}  // namespace cedar
