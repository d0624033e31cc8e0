// Shared helpers for the per-architecture weight tables: naming under a scope (`layers.{L}.`,
// `mtp.{k}.`), the storage format of each kind of matrix under the checkpoint's quantization, and
// the tensors every transformer block of both architectures has (mHC, attention core, MoE).
#pragma once

#include <string>
#include <vector>

#include "io/config.h"
#include "model/weights.h"

namespace cedar {

class WeightListBuilder {
 public:
  WeightListBuilder(const ModelConfig& c, std::vector<WeightSpec>* out) : c_(c), out_(out) {}

  // Subsequent names are `prefix + name`; `layer` / `draft_block` tag the specs.
  void set_scope(std::string prefix, int64_t layer, int64_t draft_block);
  const ModelConfig& config() const { return c_; }

  void bf16(const std::string& name, std::vector<int64_t> shape, Component comp);
  void f32(const std::string& name, std::vector<int64_t> shape, Component comp);
  void other(const std::string& name, DType dtype, std::vector<int64_t> shape, Component comp);
  // A dense Linear weight `stem.weight` [out, in]: FP8 blocks + `stem.scale`
  // [ceil(out/block_rows), ceil(in/block_cols)] in quantized checkpoints, BF16 otherwise.
  void linear(const std::string& stem, int64_t out, int64_t in, Component comp);
  // A routed expert matrix [out, in]: MXFP4 (I8 [out, in/2] + E8M0 [out, in/32]) with fp4 experts,
  // FP8 blocks with fp8 experts, BF16 in unquantized checkpoints.
  void expert(const std::string& stem, int64_t out, int64_t in, int64_t expert_index);
  // An Engram table [rows, width]: F8_E4M3 rows + E8M0 [rows, width/32] when quantized, else BF16.
  void engram_table(const std::string& stem, int64_t rows, int64_t width);

 private:
  void push(WeightSpec s);

  const ModelConfig& c_;
  std::vector<WeightSpec>* out_;
  std::string prefix_;
  int64_t layer_ = -1;
  int64_t draft_block_ = -1;
};

// How a block's router is biased: V4.1 `bias` + `bias_vl` (image tokens), V4 `bias` or, on
// hash-routed layers, the `tid2eid` token→experts table.
enum class RouterKind { Bias, BiasAndVisionBias, HashTable };

// The tensors every block has (backbone layers and draft blocks, both architectures): attn/ffn norms,
// mHC mixes, attention core (wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, attn_sink), MoE with
// `n_experts` routed experts.
void add_block_core(WeightListBuilder& b, int64_t n_experts, RouterKind router);

// Global or draft-head mHC collapse (`hc_head_fn` [hc, hc·d], `hc_head_base` [hc], `hc_head_scale` [1]).
void add_hc_head(WeightListBuilder& b, Component comp);
// DSpark stage extras (§2.2 drafter table): stage 0 folds the target hidden states in (main_proj,
// main_norm); the last stage holds the final norm and the Markov and confidence heads.
void add_dspark_stage_extras(WeightListBuilder& b, const DraftBlockRole& d);

// Per-architecture tables (deepseek_v41_weights.cpp / deepseek_v4_weights.cpp).
void add_deepseek_v41_weights(const LayerPlan& plan, WeightListBuilder& b);
void add_deepseek_v4_weights(const LayerPlan& plan, WeightListBuilder& b);

}  // namespace cedar
