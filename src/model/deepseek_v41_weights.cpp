// DeepSeek-V4.1 tensor table (architecture.md §2.2). Cross-checked against the published
// per-dtype totals of the released checkpoint (tests/model/weights_test.cpp).
#include <string>

#include "model/weight_list_builder.h"

namespace cedar {
namespace {

// CSA2 pieces a layer owns according to its role: KV sources carry the compressor and the indexer
// keys, index sources the indexer queries (§3.5–3.6).
void add_csa2(WeightListBuilder& b, const LayerRole& role) {
  const ModelConfig& c = b.config();
  const int64_t d = c.hidden_size, hd = c.head_dim, ihd = c.index_head_dim;
  if (role.owns_compressor) {
    b.bf16("attn.compressor.wkv.weight", {hd, d}, Component::Compressor);
    if (role.compressor_has_gate) b.bf16("attn.compressor.wgate.weight", {hd, d}, Component::Compressor);
    b.bf16("attn.compressor.norm.weight", {hd}, Component::Compressor);
  }
  if (role.owns_indexer_keys) {
    b.bf16("attn.indexer.wk.weight", {ihd, hd}, Component::IndexerKeys);
    b.bf16("attn.indexer.k_norm.weight", {ihd}, Component::IndexerKeys);
  }
  if (role.owns_indexer) {
    b.linear("attn.indexer.wq_b", c.index_n_heads * ihd, c.q_lora_rank, Component::Indexer);
    b.bf16("attn.indexer.weights_proj.weight", {c.index_n_heads, d}, Component::Indexer);
  }
}

// Engram before the block (§3.9): hashed rows of (max_ngram−1)·n_heads columns, projected to
// hc_mult keys + one value of width d.
void add_engram(WeightListBuilder& b, int64_t rows) {
  const ModelConfig& c = b.config();
  const int64_t d = c.hidden_size, width = c.engram_head_dim;
  const int64_t cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
  b.engram_table("engram.embed", rows, width);
  b.linear("engram.wkv", d * (c.hc_mult + 1), cols * width, Component::Engram);
  b.bf16("engram.q_weight", {c.hc_mult, d}, Component::Engram);
  b.bf16("engram.k_weight", {c.hc_mult, d}, Component::Engram);
}

}  // namespace

void add_deepseek_v41_weights(const LayerPlan& plan, WeightListBuilder& b) {
  const ModelConfig& c = b.config();
  const int64_t d = c.hidden_size;
  b.set_scope("", -1, -1);
  b.bf16("embed.weight", {c.vocab_size, d}, Component::Embedding);
  b.bf16("norm.weight", {d}, Component::FinalNorm);
  if (!c.tie_word_embeddings) b.bf16("head.weight", {c.vocab_size, d}, Component::Head);

  // Every V4.1 gate, drafter included, carries `bias_vl` (the image-token correction bias) next to
  // `bias`: §2.2 lists it on all layers and the released F32 total needs it on the drafter too. It is
  // expected without a vision tower as well (a text-only V4.1 export keeps the Gate's parameters; the
  // independent tools/tiny_checkpoint.py writer agrees).
  const RouterKind router = RouterKind::BiasAndVisionBias;
  for (const LayerRole& role : plan.layers) {
    b.set_scope("layers." + std::to_string(role.layer) + ".", role.layer, -1);
    add_block_core(b, c.n_routed_experts, router);
    add_csa2(b, role);
    if (role.has_engram) {
      for (size_t i = 0; i < c.engram_layer_ids.size(); ++i)
        if (c.engram_layer_ids[i] == role.layer) add_engram(b, c.engram_num_embeddings[i]);
    }
  }
  for (const DraftBlockRole& draft : plan.drafts) {
    b.set_scope("mtp." + std::to_string(draft.index) + ".", -1, draft.index);
    add_block_core(b, c.draft_n_routed_experts(), router);
    add_dspark_stage_extras(b, draft);
  }
}

}  // namespace cedar
