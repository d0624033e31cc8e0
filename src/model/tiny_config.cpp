// The tiny profiles: small widths, the released layer structure in miniature.
#include <cstdint>
#include <string>
#include <vector>

#include "model/tiny_checkpoint.h"

namespace cedar {
namespace {

bool is_prime(int64_t n) {
  if (n < 2) return false;
  for (int64_t d = 2; d * d <= n; ++d)
    if (n % d == 0) return false;
  return true;
}

// Fields shared by both architectures' tiny profiles.
void set_tiny_common(ModelConfig& c) {
  c.vocab_size = 129280;  // the real tokenizer's id space
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 1;
  c.head_dim = 32;          // multiple of 32: the FP8/FP4 KV blocks are 16 and 32 wide
  c.qk_rope_head_dim = 8;
  c.q_lora_rank = 32;
  c.o_groups = 2;
  c.o_lora_rank = 32;
  c.sliding_window = 8;     // a 20-token prompt already slides the window
  c.index_head_dim = 32;
  c.index_topk = 4;         // fewer than the compressed entries of a short prompt: selection matters
  c.rope_theta = 10000.0;
  c.compress_rope_theta = 160000.0;
  c.rope_scaling = RopeScaling{"yarn", 16.0, 32.0, 1.0, 65536};
  c.max_position_embeddings = 1048576;
  c.n_routed_experts = 8;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;  // multiple of 32: MXFP4 scales cover 32 inputs
  c.scoring_func = "sqrtsoftplus";
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 1.5;
  c.swiglu_limit = 10.0;
  c.gate_temp = 1.0;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.pad_token_id = 2;
  c.tie_word_embeddings = false;
  c.has_vision = false;
}

// V4.1 in miniature (§1.2): layers 0–1 SWA only (Engram on 1); encoder = two ratio-2 groups
// [Full, Reuse] at 2–3 and 4–5 (Engram on the Full layer 4, like 14); decoder = ratio-1 layers 6–9:
// 6 Full + candidate source, 7 Reuse, 8 Reindex (restricted to 6's pool), 9 Reuse; then three
// ratio-0 DSpark blocks reading layers 7–9.
ModelConfig tiny_v41() {
  ModelConfig c;
  c.arch = Arch::DeepseekV41;
  set_tiny_common(c);
  c.num_hidden_layers = 10;
  c.num_nextn_predict_layers = 3;
  c.compress_ratios = {0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0};
  c.kv_source_layer_ids = {2, 4, 6};
  c.index_source_layer_ids = {2, 4, 6, 8};
  c.candidate_source_layer_id = 6;
  c.candidate_topk_blocks = 3;
  c.candidate_block_size = 2;  // pool of 6 positions >= index_topk, smaller than a short prompt
  c.index_n_heads = 2;
  c.rms_norm_eps = 1e-20;
  c.engram_layer_ids = {1, 4};
  c.engram_max_ngram_size = 4;   // orders 2, 3, 4 as released
  c.engram_vocab_size = 1000;    // primes from 1009 on (released: 16 000 000)
  c.engram_n_heads = 2;
  c.engram_head_dim = 32;
  c.engram_pad_id = 2;
  c.engram_compressed_vocab_size = 99092;  // fixed by the tokenizer (§3.9 item 1)
  c.engram_num_embeddings = engram_table_rows(c);
  c.dspark_block_size = 5;
  c.dspark_noise_token_id = 128799;
  c.dspark_target_layer_ids = {7, 8, 9};
  c.dspark_markov_rank = 16;
  c.dspark_n_routed_experts = 6;
  c.dspark_num_experts_per_tok = 3;
  c.image_token_id = 129264;
  c.draft_kind = DraftKind::DSpark;
  c.quant = QuantConfig{"fp8", "dynamic", 32, 32, "e4m3", "ue8m0", "fp4"};
  return c;
}

// V4-Flash in miniature: 2 SWA-only layers, then CSA (ratio 4, own indexer) / HCA (ratio 128)
// alternating and ending on CSA like the 43-layer original; the first 3 MoE layers are hash-routed;
// one NextN block (its ratio is the trailing compress_ratios entry, as in the released config).
ModelConfig tiny_v4() {
  ModelConfig c;
  c.arch = Arch::DeepseekV4;
  set_tiny_common(c);
  c.num_hidden_layers = 5;
  c.num_nextn_predict_layers = 1;
  c.compress_ratios = {0, 0, 4, 128, 4, 0};
  c.index_n_heads = 4;
  c.rms_norm_eps = 1e-6;
  c.num_hash_layers = 3;
  c.draft_kind = DraftKind::NextN;
  // What a V4 config without DSpark keys means (the V4-Flash-0731 values); unused by a NextN block.
  c.dspark_block_size = 5;
  c.dspark_noise_token_id = 128799;
  c.dspark_markov_rank = 256;
  c.quant = QuantConfig{"fp8", "dynamic", 128, 128, "e4m3", "ue8m0", "fp4"};
  return c;
}

// The "small" profile: the tiny layer structure at widths where the layers, not the 129 280-row head,
// dominate a forward (benchmarks of the CPU backend). Every width stays a multiple of the FP8/FP4 blocks.
void widen_to_small(ModelConfig& c) {
  c.hidden_size = 512;
  c.num_attention_heads = 8;
  c.head_dim = 128;
  c.qk_rope_head_dim = 32;
  c.q_lora_rank = 256;
  c.o_lora_rank = 128;
  c.index_head_dim = 64;
  c.moe_intermediate_size = 256;
  c.n_routed_experts = 16;
  c.sliding_window = 32;
  c.index_topk = 16;
  if (c.arch == Arch::DeepseekV41) {
    c.candidate_topk_blocks = 8;
    c.candidate_block_size = 4;
    c.engram_head_dim = 64;
    c.engram_num_embeddings = engram_table_rows(c);
  }
}

// The perf profile: DeepSeek-V4.1-Flash as released (../shared/spec/architecture.md §1.1, the values
// of tests/data/configs/deepseek_v41_flash) except
//   * n_routed_experts = kPerfRoutedExperts (top-6 of them, as released): the checkpoint fits one
//     H200 with room for KV, and a batch-1 decode step reads 6 experts per layer either way;
//   * engram_vocab_size = kPerfEngramVocabSize: the same two Engram layers, orders, heads, widths and
//     hashing, with tables of Σ 24 primes from 160 000 on (≈ 3.84 M rows, 1 GB per layer) instead of
//     384 M rows (Engram rows are lookups: not part of the per-token weight bytes);
//   * no DSpark blocks (num_nextn_predict_layers = 0): decode steps without speculation never read
//     them (≈ 14 B parameters), and the config allows their absence;
//   * no vision tower (a text engine does not load it).
ModelConfig perf_v41() {
  ModelConfig c;
  c.arch = Arch::DeepseekV41;
  c.vocab_size = 129280;
  c.hidden_size = 5120;
  c.num_hidden_layers = 40;
  c.num_nextn_predict_layers = 0;
  c.num_attention_heads = 64;
  c.num_key_value_heads = 1;
  c.head_dim = 512;
  c.qk_rope_head_dim = 64;
  c.q_lora_rank = 1280;
  c.o_groups = 8;
  c.o_lora_rank = 1024;
  c.sliding_window = 128;
  c.compress_ratios.assign(2, 0);
  c.compress_ratios.insert(c.compress_ratios.end(), 18, 2);
  c.compress_ratios.insert(c.compress_ratios.end(), 20, 1);
  c.kv_source_layer_ids = {2, 8, 14, 20};
  c.index_source_layer_ids = {2, 8, 14, 20, 24, 28, 32, 36};
  c.candidate_source_layer_id = 20;
  c.candidate_topk_blocks = 2048;
  c.candidate_block_size = 8;
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.rope_theta = 10000.0;
  c.compress_rope_theta = 160000.0;
  c.rope_scaling = RopeScaling{"yarn", 16.0, 32.0, 1.0, 65536};
  c.max_position_embeddings = 1048576;
  c.rms_norm_eps = 1e-20;
  c.n_routed_experts = kPerfRoutedExperts;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 6;
  c.moe_intermediate_size = 2304;
  c.scoring_func = "sqrtsoftplus";
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 1.5;
  c.swiglu_limit = 10.0;
  c.gate_temp = 1.0;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.engram_layer_ids = {1, 14};
  c.engram_max_ngram_size = 4;
  c.engram_vocab_size = kPerfEngramVocabSize;
  c.engram_n_heads = 8;
  c.engram_head_dim = 256;
  c.engram_pad_id = 2;
  c.engram_compressed_vocab_size = 99092;
  c.engram_num_embeddings = engram_table_rows(c);
  c.draft_kind = DraftKind::None;
  // The released DSpark hyper-parameters without blocks (what a V4.1 config.json without the keys
  // means): config.json must carry valid values even when num_nextn_predict_layers is 0.
  c.dspark_block_size = 5;
  c.dspark_noise_token_id = 128799;
  c.dspark_markov_rank = 256;
  c.dspark_n_routed_experts = 128;
  c.dspark_num_experts_per_tok = 3;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.pad_token_id = 2;
  c.image_token_id = 129264;
  c.tie_word_embeddings = false;
  c.has_vision = false;
  c.quant = QuantConfig{"fp8", "dynamic", 32, 32, "e4m3", "ue8m0", "fp4"};
  return c;
}

}  // namespace

std::vector<int64_t> engram_table_rows(const ModelConfig& c) {
  std::vector<int64_t> rows;
  int64_t candidate = c.engram_vocab_size;
  for (size_t layer = 0; layer < c.engram_layer_ids.size(); ++layer) {
    int64_t sum = 0;
    for (int64_t order = 2; order <= c.engram_max_ngram_size; ++order) {
      for (int64_t head = 0; head < c.engram_n_heads; ++head) {
        while (!is_prime(candidate)) ++candidate;
        sum += candidate++;  // used: the next head starts above it
      }
    }
    rows.push_back(sum);
  }
  return rows;
}

Result<ModelConfig> tiny_model_config(Arch arch, std::string_view profile, bool bf16) {
  if (profile == "perf") {
    if (arch != Arch::DeepseekV41) return make_error("the perf profile exists for deepseek_v41 only");
    if (bf16) return make_error("the perf profile has no bf16 variant (it measures the released formats)");
    ModelConfig c = perf_v41();
    c.source_format = "cedar make-tiny";
    return c;
  }
  if (profile != "tiny" && profile != "small")
    return make_error("unknown tiny-checkpoint profile '" + std::string(profile) + "' (known: tiny, small, perf)");
  ModelConfig c = arch == Arch::DeepseekV41 ? tiny_v41() : tiny_v4();
  if (profile == "small") widen_to_small(c);
  c.source_format = "cedar make-tiny";
  if (bf16) c.quant = QuantConfig{};
  return c;
}

}  // namespace cedar
