// DeepSeek-V4 tensor table (architecture.md §5; official V4 inference/model.py names). Every
// compressed layer owns a compressor; CSA (ratio 4) compressors use overlapping windows, so their
// projections are twice as wide (coff = 2) and their learned position bias `ape` is [ratio, coff·dim];
// the CSA indexer has its own compressor at index_head_dim. V4's per-head query RMS norm is unweighted,
// so it has no tensor; the first num_hash_layers gates route by `tid2eid` (I64 [vocab, top-k]) instead of a
// bias; a global `hc_head_*` collapses the streams before the head. Cross-checked against the published
// per-dtype totals of DeepSeek-V4-Flash-0731 (tests/model/weights_test.cpp).
#include <string>

#include "model/weight_list_builder.h"

namespace cedar {
namespace {

void add_compressor(WeightListBuilder& b, const std::string& stem, int64_t ratio, int64_t head_dim, Component comp) {
  const ModelConfig& c = b.config();
  const int64_t coff = ratio == 4 ? 2 : 1;  // overlapping windows: current + previous half
  b.bf16(stem + ".wkv.weight", {coff * head_dim, c.hidden_size}, comp);
  b.bf16(stem + ".wgate.weight", {coff * head_dim, c.hidden_size}, comp);
  b.f32(stem + ".ape", {ratio, coff * head_dim}, comp);
  b.bf16(stem + ".norm.weight", {head_dim}, comp);
}

void add_compressed_attention(WeightListBuilder& b, const LayerRole& role) {
  const ModelConfig& c = b.config();
  if (!role.owns_compressor) return;
  add_compressor(b, "attn.compressor", role.compress_ratio, c.head_dim, Component::Compressor);
  if (!role.owns_indexer) return;
  b.linear("attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank, Component::Indexer);
  b.bf16("attn.indexer.weights_proj.weight", {c.index_n_heads, c.hidden_size}, Component::Indexer);
  add_compressor(b, "attn.indexer.compressor", role.compress_ratio, c.index_head_dim, Component::IndexerKeys);
}

// V4-Flash (June) NextN block: embeds the next token and the previous hidden state separately.
void add_nextn_extras(WeightListBuilder& b) {
  const int64_t d = b.config().hidden_size;
  b.linear("e_proj", d, d, Component::Draft);
  b.linear("h_proj", d, d, Component::Draft);
  b.bf16("enorm.weight", {d}, Component::Draft);
  b.bf16("hnorm.weight", {d}, Component::Draft);
  b.bf16("norm.weight", {d}, Component::Draft);
  add_hc_head(b, Component::Draft);
}

// V4-Flash-0731 DSpark stage: as in V4.1, plus a learned hc_head on the last stage.
void add_dspark_extras(WeightListBuilder& b, const DraftBlockRole& draft) {
  add_dspark_stage_extras(b, draft);
  if (draft.is_last) add_hc_head(b, Component::Draft);
}

}  // namespace

void add_deepseek_v4_weights(const LayerPlan& plan, WeightListBuilder& b) {
  const ModelConfig& c = b.config();
  const int64_t d = c.hidden_size;
  b.set_scope("", -1, -1);
  b.bf16("embed.weight", {c.vocab_size, d}, Component::Embedding);
  b.bf16("norm.weight", {d}, Component::FinalNorm);
  if (!c.tie_word_embeddings) b.bf16("head.weight", {c.vocab_size, d}, Component::Head);
  add_hc_head(b, Component::HyperConnections);

  for (const LayerRole& role : plan.layers) {
    b.set_scope("layers." + std::to_string(role.layer) + ".", role.layer, -1);
    add_block_core(b, c.n_routed_experts, role.hash_routed ? RouterKind::HashTable : RouterKind::Bias);
    add_compressed_attention(b, role);
  }
  for (const DraftBlockRole& draft : plan.drafts) {
    b.set_scope("mtp." + std::to_string(draft.index) + ".", -1, draft.index);
    add_block_core(b, c.draft_n_routed_experts(), RouterKind::Bias);
    if (plan.draft_kind == DraftKind::NextN) add_nextn_extras(b);
    else add_dspark_extras(b, draft);
  }
}

}  // namespace cedar
