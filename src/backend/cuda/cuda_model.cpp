// The CUDA model (cuda_model.h): loading, the memory plan, the device tables, the per-step inputs, and
// the decode / prefill entry points. The layer loop is in cuda_model_layers.cpp.
#include "backend/cuda/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_model_internal.h"
#include "backend/cuda/cuda_status.h"
#include "model/attention_params.h"
#include "model/engram.h"

namespace cedar::cuda {
namespace {

std::string str(int64_t v) { return std::to_string(v); }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

QuantWeightView quant_shape(const ModelConfig& c, QuantWeightFormat f, int64_t out, int64_t in) {
  QuantWeightView v;
  v.format = f;
  v.out = out;
  v.in = in;
  v.block_out = c.quant.weight_block_rows > 0 ? c.quant.weight_block_rows : 32;
  v.block_in = c.quant.weight_block_cols > 0 ? c.quant.weight_block_cols : 32;
  return v;
}

int64_t engram_in(const ModelConfig& c) {
  return c.engram_layer_ids.empty() ? 0 : (c.engram_max_ngram_size - 1) * c.engram_n_heads * c.engram_head_dim;
}

// The quantized linears of the loop: (view shape, matrices launched together).
std::vector<std::pair<QuantWeightView, int64_t>> quant_shapes(const ModelConfig& c) {
  const int64_t d = c.hidden_size, hd = c.head_dim, inter = c.moe_intermediate_size;
  const auto F = QuantWeightFormat::FP8Block, M = QuantWeightFormat::MXFP4;
  std::vector<std::pair<QuantWeightView, int64_t>> s = {
      {quant_shape(c, F, c.q_lora_rank, d), 1},
      {quant_shape(c, F, c.num_attention_heads * hd, c.q_lora_rank), 1},
      {quant_shape(c, F, hd, d), 1},
      {quant_shape(c, F, d, c.o_groups * c.o_lora_rank), 1},
      {quant_shape(c, F, c.index_n_heads * c.index_head_dim, c.q_lora_rank), 1},
      {quant_shape(c, F, inter, d), 2},
      {quant_shape(c, F, d, inter), 1},
      {quant_shape(c, M, inter, d), 2 * c.num_experts_per_tok},
      {quant_shape(c, M, d, inter), c.num_experts_per_tok},
  };
  if (!c.engram_layer_ids.empty()) s.push_back({quant_shape(c, F, (c.hc_mult + 1) * d, engram_in(c)), 1});
  return s;
}

// Split-K scratch of every GEMV of the loop (quantized and BF16 share it: they run one after another).
SplitKSize max_splitk(const ModelConfig& c) {
  SplitKSize best;
  auto take = [&](SplitKSize k) {
    best.partial_floats = std::max(best.partial_floats, k.partial_floats);
    best.counters = std::max(best.counters, k.counters);
  };
  for (const auto& [v, count] : quant_shapes(c)) take(splitk_workspace_size(v, count));
  const int64_t d = c.hidden_size, hd = c.head_dim;
  const auto F = QuantWeightFormat::FP8Block;
  // gemv_quantized_multi: wq_a + wkv (x's codes), wq_b + the indexer's wq_b (qr's codes).
  const QuantWeightView xa[2] = {quant_shape(c, F, c.q_lora_rank, d), quant_shape(c, F, hd, d)};
  const QuantWeightView qb[2] = {quant_shape(c, F, c.num_attention_heads * hd, c.q_lora_rank),
                                 quant_shape(c, F, c.index_n_heads * c.index_head_dim, c.q_lora_rank)};
  take(splitk_workspace_size_multi(xa, 2));
  take(splitk_workspace_size_multi(qb, 2));
  const int64_t in_g = c.num_attention_heads * hd / std::max<int64_t>(c.o_groups, 1);
  take(gemv_bf16_splitk_size(hd, d));
  take(gemv_bf16_splitk_size(c.index_head_dim, hd));
  take(gemv_bf16_splitk_size(c.index_n_heads, d));
  take(gemv_bf16_splitk_size(c.o_lora_rank, in_g, c.o_groups));
  take(gemv_bf16_splitk_size(c.vocab_size, d));
  return best;
}

// Largest slot count an indexer scan of this plan can have at `context` positions.
int64_t max_index_slots(const ModelConfig& c, const LayerPlan& plan, int64_t context) {
  int64_t m = 1;
  for (const LayerRole& r : plan.layers) {
    if (!r.owns_indexer || r.compress_ratio <= 0) continue;
    m = std::max(
        m, r.uses_candidates ? c.candidate_topk_blocks * c.candidate_block_size : ceil_div(context, r.compress_ratio));
  }
  return m;
}

void step_inputs_layout(int64_t capacity, Carver& k, StepInputs& in) {
  in.capacity = capacity;
  in.ids = k.take<int32_t>("step inputs", capacity);
  in.slots = k.take<int32_t>("step inputs", capacity);
  in.pos = k.take<int64_t>("step inputs", capacity);
  in.tok_exact = k.take<AttnToken>("step inputs", capacity);
  in.tok_dec = k.take<AttnToken>("step inputs", capacity);
  in.tok_bnd = k.take<AttnToken>("step inputs", capacity);
}

int64_t workspace_rows(const CudaModelOptions& o) { return std::max(o.max_batch, o.max_chunk); }

// The rows a GEMV-path threshold (moe_items_max_rows: the item tables and their outputs; gemv_max_rows: the shared
// expert's GEMV scratch) is sized for: at least one GEMV tile, at most the workspace's rows.
int64_t gemv_path_rows(const CudaModelOptions& o, int64_t max_rows) {
  return std::clamp<int64_t>(max_rows, kGemvMaxRows, std::max(kGemvMaxRows, workspace_rows(o)));
}

// Every buffer of the loop for `rows` rows (decode batch or prefill chunk) and the tables sized by the
// context. Planning (Carver without base) and allocation walk the same function.
void workspace_layout(const ModelConfig& c, const LayerPlan& plan, const CudaModelOptions& o, Carver& k,
                      CudaModel::Workspace& w) {
  const int64_t R = workspace_rows(o), LR = o.max_batch;
  const int64_t d = c.hidden_size, hc = c.hc_mult, H = c.num_attention_heads, hd = c.head_dim;
  const int64_t K = c.num_experts_per_tok, E = c.n_routed_experts, inter = c.moe_intermediate_size;
  const int64_t ih = c.index_n_heads, ihd = c.index_head_dim, og = c.o_groups, ol = c.o_lora_rank;
  const int64_t L = plan.num_layers(), IR = gemv_path_rows(o, o.paths.moe_items_max_rows), item_pairs = IR * K;
  w.rows = R;
  w.logit_rows = LR;
  // Step inputs: the decode region first (one block per decode step), then the prefill region.
  {
    const uint64_t at = k.bytes();
    step_inputs_layout(o.max_batch, k, w.decode_in);
    w.decode_in.bytes = k.bytes() - at;
    const uint64_t at2 = k.bytes();
    step_inputs_layout(o.max_chunk, k, w.prefill_in);
    w.prefill_in.bytes = k.bytes() - at2;
  }
  w.X = k.take<float>("activations", R * hc * d);
  w.x = k.take<float>("activations", R * d);
  w.xn = k.take<float>("activations", R * d);
  w.y = k.take<float>("activations", R * std::max(d, (hc + 1) * d));  // sublayer / Engram kv outputs
  w.mix_attn = k.take<float>("activations", R * kMixWidth);
  w.mix_ffn = k.take<float>("activations", R * kMixWidth);
  w.e0 = k.take<float>("activations", R * hc);
  w.final_pre = k.take<float>("activations", R * hc);
  const int64_t max_in = std::max({d, c.q_lora_rank, og * ol, inter, engram_in(c)});
  // paths.wo_a_f16 stages o [rows <= gemv_max_rows, H·hd] in act_b (cuda_model_layers.cpp dense()).
  w.act_capacity = std::max(R * max_in, gemv_path_rows(o, o.paths.gemv_max_rows) * H * hd);
  w.act_a = k.take<uint16_t>("activations", w.act_capacity);
  w.act_a_scales = k.take<float>("activations", w.act_capacity / 32 + 1);
  w.act_b = k.take<uint16_t>("activations", w.act_capacity);
  w.act_b_scales = k.take<float>("activations", w.act_capacity / 32 + 1);

  w.qr = k.take<float>("attention scratch", R * c.q_lora_rank);
  w.q = k.take<float>("attention scratch", R * H * hd);
  w.kvw = k.take<float>("attention scratch", R * hd);
  w.o = k.take<float>("attention scratch", R * H * hd);
  w.u = k.take<float>("attention scratch", R * og * ol);
  w.chunk_records = k.take<uint8_t>("attention scratch", R * swa_record_bytes(hd));
  w.comp_kv = k.take<float>("attention scratch", R * hd);
  w.comp_gate = k.take<float>("attention scratch", R * hd);
  w.latent = k.take<float>("attention scratch", R * hd);
  w.index_k = k.take<float>("attention scratch", R * ihd);
  w.qi = k.take<float>("indexer scratch", R * ih * ihd);
  w.w_raw = k.take<float>("indexer scratch", R * ih);
  w.iw = k.take<float>("indexer scratch", R * ih);
  w.q_codes = k.take<uint16_t>("indexer scratch", R * ih * ihd);
  w.q_scales = k.take<float>("indexer scratch", R * ih * ihd / 32 + 1);
  w.max_slots_cap = max_index_slots(c, plan, o.kv.max_context);
  w.index_scores = k.take<float>("indexer scratch", R * w.max_slots_cap);
  w.select_ws_bytes =
      indexer_select_workspace_bytes(R, w.max_slots_cap, c.index_topk, c.candidate_topk_blocks, c.candidate_block_size);
  w.select_ws = k.take<uint8_t>("indexer scratch", w.select_ws_bytes);
  w.cand_blocks = k.take<int32_t>("indexer scratch", R * std::max<int64_t>(c.candidate_topk_blocks, 1));
  w.topk.assign(static_cast<size_t>(L), nullptr);
  for (const LayerRole& role : plan.layers)
    if (role.owns_indexer && role.compress_ratio > 0)
      w.topk[static_cast<size_t>(role.layer)] = k.take<int32_t>("indexer scratch", R * c.index_topk);
  SparseAttnWorkspaceSize sp;
  for (int64_t n = 1; n <= std::max<int64_t>(LR, 64); ++n) {
    const SparseAttnWorkspaceSize s = sparse_attention_workspace_size(n, H, hd, c.sliding_window, c.index_topk);
    sp.floats = std::max(sp.floats, s.floats);
    sp.counters = std::max(sp.counters, s.counters);
  }
  w.sparse.floats = k.take<float>("attention scratch", sp.floats);
  w.sparse.counters = k.take<unsigned>("attention scratch", sp.counters);
  w.sparse.float_count = sp.floats;
  w.sparse.counter_count = sp.counters;

  w.router_logits = k.take<float>("moe scratch", R * E);
  w.route_w = k.take<float>("moe scratch", R * K);
  if (E > 0) {
    const SplitKSize rs = router_workspace_size(E, d);
    w.router_ws.partials = k.take<float>("moe scratch", rs.partial_floats);
    w.router_ws.counters = k.take<unsigned>("moe scratch", rs.counters);
    w.router_ws.partial_floats = rs.partial_floats;
    w.router_ws.counter_count = rs.counters;
  }
  w.experts.assign(static_cast<size_t>(L), nullptr);
  for (int64_t l = 0; l < L; ++l) w.experts[static_cast<size_t>(l)] = k.take<int32_t>("moe scratch", R * K);
  w.items_rows = IR;
  w.items13 = k.take<DeviceGemvItem>("moe scratch", 2 * item_pairs);
  w.items2 = k.take<DeviceGemvItem>("moe scratch", item_pairs);
  w.item_counts = k.take<int32_t>("moe scratch", 2);
  w.item_work = k.take<unsigned>("moe scratch", 4);
  w.g = k.take<float>("moe scratch", item_pairs * inter);
  w.gu = k.take<float>("moe scratch", item_pairs * inter);
  w.routed = k.take<float>("moe scratch", item_pairs * d);
  w.h_codes = k.take<uint16_t>("moe scratch", R * K * inter);
  w.h_scales = k.take<float>("moe scratch", R * K * inter / 32 + 1);
  w.y_rows = k.take<uint16_t>("moe scratch", R * K * d);
  const MoePermutationSizes ps = moe_permutation_sizes(R, K, E);
  w.perm.chunk_hist = k.take<int32_t>("moe scratch", ps.chunk_hist);
  w.perm.row_offsets = k.take<int32_t>("moe scratch", ps.offsets);
  w.perm.tile_offsets = k.take<int32_t>("moe scratch", ps.offsets);
  w.perm.row_token = k.take<int32_t>("moe scratch", ps.rows);
  w.perm.row_weight = k.take<float>("moe scratch", ps.rows);
  w.perm.slot_row = k.take<int32_t>("moe scratch", ps.rows);
  w.gemv_rows = gemv_path_rows(o, o.paths.gemv_max_rows);
  w.sg = k.take<float>("moe scratch", w.gemv_rows * inter);
  w.su = k.take<float>("moe scratch", w.gemv_rows * inter);
  w.shared = k.take<float>("moe scratch", R * d);
  w.sh_codes = k.take<uint16_t>("moe scratch", R * inter);
  w.sh_scales = k.take<float>("moe scratch", R * inter / 32 + 1);

  if (!c.engram_layer_ids.empty()) {
    const int64_t slots = static_cast<int64_t>(c.engram_layer_ids.size());
    const int64_t cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
    w.engram_rows = k.take<int64_t>("engram scratch", slots * R * cols);
    w.e_codes = k.take<uint16_t>("engram scratch", R * engram_in(c));
    w.e_scales = k.take<float>("engram scratch", R * engram_in(c) / 32 + 1);
    w.engram_recent = k.take<int32_t>("engram history", o.kv.max_sequences * (c.engram_max_ngram_size - 1));
    w.engram_next = k.take<int64_t>("engram history", o.kv.max_sequences);
    // paths.engram_ahead: each slot's projection has its own buffers (they run beside the loop, which
    // keeps e_codes / y for the serial path); decode GEMV rows only.
    w.engram_ahead_rows = std::min(LR, kGemvMaxRows);
    const int64_t ar = w.engram_ahead_rows;
    w.ahead_codes.assign(static_cast<size_t>(slots), nullptr);
    w.ahead_scales.assign(static_cast<size_t>(slots), nullptr);
    w.ahead_kv.assign(static_cast<size_t>(slots), nullptr);
    for (size_t s = 0; s < static_cast<size_t>(slots); ++s) {
      w.ahead_codes[s] = k.take<uint16_t>("engram scratch", ar * engram_in(c));
      w.ahead_scales[s] = k.take<float>("engram scratch", ar * engram_in(c) / 32 + 1);
      w.ahead_kv[s] = k.take<float>("engram scratch", ar * (hc + 1) * d);
    }
  }

  const SplitKSize sk = max_splitk(c);
  w.splitk.partials = k.take<float>("split-k + mhc scratch", sk.partial_floats);
  w.splitk.counters = k.take<unsigned>("split-k + mhc scratch", sk.counters);
  w.splitk.partial_floats = sk.partial_floats;
  w.splitk.counter_count = sk.counters;
  w.splitk_aux.partials = k.take<float>("split-k + mhc scratch", sk.partial_floats);
  w.splitk_aux.counters = k.take<unsigned>("split-k + mhc scratch", sk.counters);
  w.splitk_aux.partial_floats = sk.partial_floats;
  w.splitk_aux.counter_count = sk.counters;
  if (!c.engram_layer_ids.empty()) {  // the Engram stream's wkv GEMVs (the same size: the same K split)
    w.splitk_engram.partials = k.take<float>("split-k + mhc scratch", sk.partial_floats);
    w.splitk_engram.counters = k.take<unsigned>("split-k + mhc scratch", sk.counters);
    w.splitk_engram.partial_floats = sk.partial_floats;
    w.splitk_engram.counter_count = sk.counters;
  }
  // mHC: every decode tile in one launch, the streaming kernel from kMhcStreamMinTokens rows on.
  w.mhc.partial_floats = mhc_workspace_floats(R, d);
  w.mhc.counter_count = mhc_workspace_counters(R);
  w.mhc.partials = k.take<float>("split-k + mhc scratch", w.mhc.partial_floats);
  w.mhc.counter = k.take<unsigned>("split-k + mhc scratch", w.mhc.counter_count);
  // The expand + collapse + norm kernel's own ticket (the critical half of a split site, mhc_split).
  w.mhc.norm_counter = k.take<unsigned>("split-k + mhc scratch", kMhcNormCounters);
  // The legacy contract (partial_floats = 0: min(n, 8)·25·(d/32) floats, one counter) on the same memory.
  w.mhc_legacy.partials = w.mhc.partials;
  w.mhc_legacy.counter = w.mhc.counter;
  w.mhc_legacy.norm_counter = w.mhc.norm_counter;
  int64_t gemm_floats = 0;
  for (const auto& [v, count] : quant_shapes(c))
    for (int64_t m : {R, LR}) gemm_floats = std::max(gemm_floats, quant_gemm_workspace_floats(v, m));
  w.gemm.partials = k.take<float>("split-k + mhc scratch", gemm_floats);
  w.gemm.partial_floats = gemm_floats;
  if (o.use_cublas) {
    w.dense_x_elems = R * std::max({d, hd, H * hd});
    w.dense_x = k.take<uint16_t>("activations", w.dense_x_elems);
    // cuBLASLt path of the FP8 / MXFP4 linears (rows >= blas_min_rows): the dequantized weight + the
    // activations of the largest shape; the shared expert's two weights; wo_a dequantized (FP8 wo_a).
    // Sized for every row count (set_paths may lower the threshold after load).
    int64_t elems = 0;
    for (const auto& [v, count] : quant_shapes(c)) elems = std::max(elems, quant_gemm_blas_elems(v, R, false));
    const SwigluBlasSizes sz = swiglu_gemm_blas_sizes(quant_shape(c, QuantWeightFormat::FP8Block, inter, d), R, false);
    elems = std::max(elems, sz.bf16_elems);
    const int64_t gu = sz.floats;
    if (o.wo_a_fp8) elems = std::max(elems, og * ol * (H * hd / std::max<int64_t>(og, 1)));
    w.gemm.bf16_elems = elems;
    w.gemm.bf16 = k.take<uint16_t>("blas scratch", elems);
    w.blas_gu_floats = gu;
    w.blas_gu = k.take<float>("blas scratch", gu);
  }
  w.logits = k.take<float>("logits", LR * c.vocab_size);
  w.argmax = k.take<int32_t>("logits", LR);
}

}  // namespace

Result<DeviceMemoryPlan> cuda_model_extra_plan(const ModelConfig& c, const LayerPlan& plan, const CudaModelOptions& o) {
  CEDAR_ASSIGN_OR_RETURN(const DeviceKvGeometry g, DeviceKvGeometry::create(c, plan, o.kv));
  DeviceMemoryPlan p = g.memory_plan();
  CudaModel::Workspace w;
  Carver k(nullptr, &p);
  workspace_layout(c, plan, o, k, w);
  // RoPE tables (CudaModel::Tables): two [max_context, rope_dim] float tables.
  p.add("rope tables", static_cast<uint64_t>(2 * o.kv.max_context * c.qk_rope_head_dim) * sizeof(float), false, "rows");
  return p;
}

CudaModel::CudaModel(std::shared_ptr<const DeepseekV41Model> host, const CudaModelOptions& options, Stream stream,
                     DeviceWeights weights, DeviceKvPool kv, std::unique_ptr<Workspace> ws,
                     std::unique_ptr<Tables> tables, DeviceMemoryPlan plan)
    : host_(std::move(host)),
      options_(options),
      stream_(std::move(stream)),
      weights_(std::move(weights)),
      kv_(std::move(kv)),
      ws_(std::move(ws)),
      tables_(std::move(tables)),
      memory_plan_(std::move(plan)),
      engram_pending_(tables_->engram_done_ev.size(), false) {
  set_paths(options_.paths);  // the row thresholds clamped to the workspace, as every later set_paths does
}

CudaModel::~CudaModel() = default;

bool CudaModel::has_cublas() const { return tables_->blas != nullptr; }
bool CudaModel::tables_blas() const { return tables_->blas != nullptr; }

bool CudaModel::wo_a_fp8() const {
  return !weights_.layers().empty() && weights_.layers()[0].wo_a.format == DeviceFormat::Fp8Block;
}

void CudaModel::set_paths(const CudaKernelPaths& p) {
  options_.paths = p;
  options_.paths.moe_items_max_rows = std::clamp<int64_t>(p.moe_items_max_rows, kGemvMaxRows, ws_->items_rows);
  options_.paths.gemv_max_rows = std::clamp<int64_t>(p.gemv_max_rows, kGemvMaxRows, ws_->gemv_rows);
  // A captured graph holds the launches of the paths it was captured with.
  decode_graphs_.clear();
  warmed_.clear();
}

const MhcWorkspace& CudaModel::mhc_ws() const { return options_.paths.mhc_batched ? ws_->mhc : ws_->mhc_legacy; }

CudaKernelPaths CudaKernelPaths::legacy() {
  CudaKernelPaths p;
  p.programmatic_launch = false;
  p.router_splitk = false;
  p.mhc_batched = false;
  p.mhc_cluster = true;  // the loop before the performance pass took the cluster kernel above 4 rows
  p.mhc_fused_norm = false;
  p.gemv_multi = false;
  p.blas_min_rows = INT64_MAX;
  p.moe_items_max_rows = kGemvMaxRows;
  p.gemv_max_rows = kGemvMaxRows;
  p.fused_q_rope = false;
  p.attn_head_split = false;
  p.mhc_split = false;
  p.mhc_split_norm = false;
  p.engram_ahead = false;
  p.wo_a_f16 = false;
  p.fused_act_quant = false;
  p.site_act_quant = false;
  p.site_cluster = false;
  p.swa_commit_aside = false;
  p.router_ahead = false;
  p.dispatch_in_router = false;
  p.router_splitk_beside = false;
  p.router_one_token = false;
  p.fork_pdl = false;
  p.q_norm_kv_encode = false;
  p.attn_merge_trigger = false;
  p.routed_full_edge = false;
  p.attn_stage_wo_a = false;
  p.site_combine = false;
  p.warp_items = false;
  p.scale_exp_add = false;
  p.branches_above_tile = false;
  p.routed_tiles = false;
  return p;
}

namespace {

struct NamedOption {
  const char* name;
  bool* flag;
  int64_t* value;
};

std::vector<NamedOption> named_options(CudaModelOptions& o) {
  CudaKernelPaths& p = o.paths;
  return {{"programmatic_launch", &p.programmatic_launch, nullptr},
          {"router_splitk", &p.router_splitk, nullptr},
          {"mhc_batched", &p.mhc_batched, nullptr},
          {"mhc_cluster", &p.mhc_cluster, nullptr},
          {"mhc_fused_norm", &p.mhc_fused_norm, nullptr},
          {"gemv_multi", &p.gemv_multi, nullptr},
          {"fused_q_rope", &p.fused_q_rope, nullptr},
          {"attn_head_split", &p.attn_head_split, nullptr},
          {"mhc_split", &p.mhc_split, nullptr},
          {"mhc_split_norm", &p.mhc_split_norm, nullptr},
          {"engram_ahead", &p.engram_ahead, nullptr},
          {"wo_a_f16", &p.wo_a_f16, nullptr},
          {"fused_act_quant", &p.fused_act_quant, nullptr},
          {"site_act_quant", &p.site_act_quant, nullptr},
          {"site_cluster", &p.site_cluster, nullptr},
          {"swa_commit_aside", &p.swa_commit_aside, nullptr},
          {"router_ahead", &p.router_ahead, nullptr},
          {"dispatch_in_router", &p.dispatch_in_router, nullptr},
          {"router_splitk_beside", &p.router_splitk_beside, nullptr},
          {"router_one_token", &p.router_one_token, nullptr},
          {"shared_splitk", &p.shared_splitk, nullptr},
          {"fork_pdl", &p.fork_pdl, nullptr},
          {"fork_pdl_compressor", &p.fork_pdl_compressor, nullptr},
          {"q_norm_kv_encode", &p.q_norm_kv_encode, nullptr},
          {"attn_merge_trigger", &p.attn_merge_trigger, nullptr},
          {"routed_full_edge", &p.routed_full_edge, nullptr},
          {"attn_stage_wo_a", &p.attn_stage_wo_a, nullptr},
          {"site_combine", &p.site_combine, nullptr},
          {"warp_items", &p.warp_items, nullptr},
          {"scale_exp_add", &p.scale_exp_add, nullptr},
          {"branches_above_tile", &p.branches_above_tile, nullptr},
          {"blas_min_rows", nullptr, &p.blas_min_rows},
          {"moe_items_max_rows", nullptr, &p.moe_items_max_rows},
          {"gemv_max_rows", nullptr, &p.gemv_max_rows},
          {"routed_warps", nullptr, &p.routed_warps},
          {"routed_tiles", &p.routed_tiles, nullptr},
          {"mhc_one_token", &p.mhc_one_token, nullptr},
          {"routed_w2_prefetch", nullptr, &p.routed_w2_prefetch},
          {"shared_w2_late", &p.shared_w2_late, nullptr},
          {"graph_carveout", nullptr, &p.graph_carveout},
          {"tiled_experts", &o.tiled_experts, nullptr},
          {"packed_experts", &o.packed_experts, nullptr},
          {"wo_a_fp8", &o.wo_a_fp8, nullptr},
          {"concurrent_branches", &o.concurrent_branches, nullptr},
          {"cuda_graphs", &o.cuda_graphs, nullptr}};
}

}  // namespace

Status apply_cuda_options(std::string_view spec, CudaModelOptions& o) {
  std::vector<NamedOption> names = named_options(o);
  std::string known;
  for (const NamedOption& n : names) known += std::string(known.empty() ? "" : ", ") + n.name;
  while (!spec.empty()) {
    const size_t comma = spec.find(',');
    const std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    if (item.empty()) continue;
    if (item == "legacy") {  // every kernel path as before the performance pass (wo_a stays as given)
      o.paths = CudaKernelPaths::legacy();
      continue;
    }
    const size_t eq = item.find('=');
    const std::string key(item.substr(0, eq));
    const std::string val = eq == std::string_view::npos ? std::string() : std::string(item.substr(eq + 1));
    auto it = std::find_if(names.begin(), names.end(), [&](const NamedOption& n) { return key == n.name; });
    if (it == names.end()) return make_error("CUDA option '" + key + "' is unknown (known: legacy, " + known + ")");
    char* end = nullptr;
    const long long v = val.empty() ? -1 : std::strtoll(val.c_str(), &end, 10);
    if (val.empty() || *end != '\0' || v < 0 || (it->flag && v > 1))
      return make_error("CUDA option '" + key + "': value '" + val + "' is not " +
                        (it->flag ? "0 or 1" : "a non-negative integer"));
    if (it->flag) *it->flag = v != 0;
    if (it->value) *it->value = static_cast<int64_t>(v);
  }
  // Checked here, not at the first decode launch: the error names the option.
  const int64_t rw = o.paths.routed_warps;
  if (rw != 0 && (rw < kForcedSplitMinWarps || rw > kForcedSplitMaxWarps))
    return make_error("CUDA option 'routed_warps': " + std::to_string(rw) + " is not 0 (the default split) or " +
                      std::to_string(kForcedSplitMinWarps) + ".." + std::to_string(kForcedSplitMaxWarps));
  if (o.paths.routed_w2_prefetch > 2)
    return make_error("CUDA option 'routed_w2_prefetch': " + std::to_string(o.paths.routed_w2_prefetch) +
                      " is not 0 (off), 1 (before a block's units) or 2 (after them)");
  if (o.paths.graph_carveout > 100)
    return make_error("CUDA option 'graph_carveout': " + std::to_string(o.paths.graph_carveout) +
                      " is not 0 (each kernel's own) or a percent 1..100");
  return Status::Ok();
}

std::string describe_cuda_options(const CudaModelOptions& o) {
  CudaModelOptions copy = o;
  std::string out;
  for (const NamedOption& n : named_options(copy)) {
    out += std::string(out.empty() ? "" : ",") + n.name + "=";
    out += n.flag ? (*n.flag ? "1" : "0") : (*n.value == INT64_MAX ? std::string("max") : std::to_string(*n.value));
  }
  return out;
}

namespace {

// Per-slot descriptor tables, RoPE and Engram tables, cuBLASLt.
Status build_tables(const DeepseekV41Model& host, const CudaModelOptions& o, DeviceKvPool& kv, CudaModel::Tables& t) {
  const ModelConfig& c = host.config();
  const LayerPlan& plan = host.plan();
  const DeviceKvGeometry& g = kv.geometry();
  CEDAR_ASSIGN_OR_RETURN(const AttentionParams ap, attention_params_from_config(c));
  t.attn_scale = static_cast<float>(std::pow(1.0 / static_cast<double>(c.head_dim), 0.5));
  t.index_reference = ap.index_precision == IndexScorePrecision::Reference;
  t.bf16_probabilities = ap.bf16_probabilities;
  const int64_t positions = o.kv.max_context;
  auto rope = [&](const cpu::RopeTable& r, DeviceBuffer<float>& buf, RopeTableView& view) -> Status {
    CEDAR_ASSIGN_OR_RETURN(
        buf, DeviceBuffer<float>::from_host(rope_cos_sin_table(r.inv_freq().data(), r.rope_dim(), positions)));
    view = RopeTableView{buf.get(), positions, r.rope_dim()};
    return Status::Ok();
  };
  CEDAR_RETURN_IF_ERROR(rope(ap.main_rope, t.rope_main, t.rope_main_view));
  CEDAR_RETURN_IF_ERROR(rope(ap.compress_rope, t.rope_compress, t.rope_compress_view));

  t.rings.resize(static_cast<size_t>(plan.num_layers()));
  t.sources.resize(static_cast<size_t>(plan.num_layers()));
  for (const LayerRole& role : plan.layers) {
    const int64_t l = role.layer;
    CEDAR_ASSIGN_OR_RETURN(t.rings[static_cast<size_t>(l)], kv.slot_table<SwaRingDesc>([&](int64_t s) {
      const SwaRingView v = kv.ring_view(s, l);
      return SwaRingDesc{v.records, v.positions};
    }));
    if (!role.owns_compressor || role.compress_ratio <= 0) continue;
    int64_t main_stream = -1, key_stream = -1, source = -1;
    for (size_t i = 0; i < g.streams.size(); ++i)
      if (g.streams[i].layer == l)
        (g.streams[i].kind == KvStreamKind::MainKv ? main_stream : key_stream) = static_cast<int64_t>(i);
    for (size_t i = 0; i < g.source_layers.size(); ++i)
      if (g.source_layers[i] == l) source = static_cast<int64_t>(i);
    if (main_stream < 0 || source < 0)
      return make_error("device KV has no main-KV stream for KV source layer " + str(l));
    auto paged = [](const KvStreamView& v) {
      return PagedRecords{v.pool, v.block_table, v.block_bytes, v.entries_per_block, v.record_bytes};
    };
    CEDAR_ASSIGN_OR_RETURN(t.sources[static_cast<size_t>(l)], kv.slot_table<KvSourceSeq>([&](int64_t s) {
      KvSourceSeq q;
      q.kv = paged(kv.stream_view(s, main_stream));
      if (key_stream >= 0) q.index_k = paged(kv.stream_view(s, key_stream));
      q.pending_kv = kv.pending_kv(s, source);
      q.pending_gate = kv.pending_gate(s, source);
      return q;
    }));
  }

  t.engram_slot.assign(static_cast<size_t>(plan.num_layers()), -1);
  if (const EngramHasher* h = host.engram_hasher()) {
    const EngramLayout& layout = h->layout();
    EngramHashTablesHost ht = engram_hash_tables(layout);
    CEDAR_ASSIGN_OR_RETURN(t.engram_hash_table, DeviceBuffer<int64_t>::from_host(ht.values));
    t.engram_layout = ht.view;
    t.engram_layout.table = t.engram_hash_table.get();
    const std::span<const int32_t> map = h->token_map();
    CEDAR_ASSIGN_OR_RETURN(t.engram_map, DeviceBuffer<int32_t>::from_host(map.data(), map.size()));
    t.engram_pad = static_cast<int32_t>(h->pad());
    for (int64_t l = 0; l < plan.num_layers(); ++l) t.engram_slot[static_cast<size_t>(l)] = layout.slot_of_layer(l);
  }
  if (o.use_cublas) {
    auto blas = BlasContext::create();
    if (blas.ok())
      t.blas = std::move(*blas);
    else
      t.blas_error = blas.error().message;
  }
  t.mhc_cluster = mhc_cluster_supported(c.hidden_size).ok();
  CEDAR_ASSIGN_OR_RETURN(t.aux, Stream::create());
  CEDAR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&t.fork_ev, cudaEventDisableTiming));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&t.join_ev, cudaEventDisableTiming));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&t.shared_late_ev, cudaEventDisableTiming));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&t.swa_fork_ev, cudaEventDisableTiming));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&t.swa_done_ev, cudaEventDisableTiming));
  CEDAR_ASSIGN_OR_RETURN(t.coef, Stream::create());
  CEDAR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&t.coef_fork_ev, cudaEventDisableTiming));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&t.coef_done_ev, cudaEventDisableTiming));
  if (!c.engram_layer_ids.empty()) {
    CEDAR_ASSIGN_OR_RETURN(t.engram, Stream::create());
    CEDAR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&t.engram_fork_ev, cudaEventDisableTiming));
    t.engram_done_ev.assign(c.engram_layer_ids.size(), nullptr);
    for (cudaEvent_t& e : t.engram_done_ev)
      CEDAR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  return Status::Ok();
}

// What load checks before it reads anything (the path overload: before the host model loads).
Status check_load_options(const CudaModelOptions& o) {
  CEDAR_CUDA_RETURN_IF_ERROR(cudaSetDevice(o.device));
  if (o.max_batch < 1 || o.max_chunk < 1)
    return make_error("CudaModel: max_batch and max_chunk must be >= 1 (got " + str(o.max_batch) + ", " +
                      str(o.max_chunk) + ")");
  if (o.kv.max_sequences < o.max_batch)
    return make_error("CudaModel: kv.max_sequences " + str(o.kv.max_sequences) + " < max_batch " + str(o.max_batch));
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<CudaModel>> CudaModel::load(const std::filesystem::path& path, const CudaModelOptions& options) {
  CEDAR_RETURN_IF_ERROR(check_load_options(options));
  LoadOptions lo;
  lo.engram_map = options.engram_map;
  lo.pool = options.pool;
  CEDAR_ASSIGN_OR_RETURN(DeepseekV41Model host, DeepseekV41Model::load(path, lo));
  return load(std::make_shared<const DeepseekV41Model>(std::move(host)), options);
}

Result<std::unique_ptr<CudaModel>> CudaModel::load(std::shared_ptr<const DeepseekV41Model> shared,
                                                   const CudaModelOptions& options) {
  if (!shared) return make_error("CudaModel: no host model");
  CudaModelOptions o = options;
  CEDAR_RETURN_IF_ERROR(check_load_options(o));
  const DeepseekV41Model& host = *shared;
  const ModelConfig& c = host.config();
  if (c.hc_mult != 4)
    return make_error("CudaModel: the fused mHC kernel is built for hc_mult 4, got " + str(c.hc_mult));
  if (!c.quant.quantized())
    return make_error("CudaModel: " + c.source +
                      " has BF16 linear weights; the CUDA layer loop runs the released FP8 / MXFP4 formats only");
  // Routed MXFP4 experts: the checkpoint's plain bytes (the prefill GEMMs; the decode GEMVs' fallback), the
  // tile copy the decode GEMVs stream (tiled_experts), and the packed copy only when asked (packed_experts: the
  // balanced packed kernel, routed_tiles=0's comparison). Either copy checks the scales for the exponent add.
  const int64_t inter = c.moe_intermediate_size, d = c.hidden_size;
  if (o.packed_experts && mxfp4_packable(inter, d) && mxfp4_packable(d, inter)) {
    o.weights.repack_mxfp4 = [](const uint8_t* plain, int64_t out, int64_t in, uint8_t* packed) {
      return repack_mxfp4(plain, out, in, packed);
    };
    o.weights.keep_plain_mxfp4 = true;
  }
  if (o.tiled_experts && mxfp4_tileable(inter, d) && mxfp4_tileable(d, inter))
    o.weights.tile_mxfp4 = [](const uint8_t* plain, const uint8_t* scales, int64_t out, int64_t in, uint8_t* tiles) {
      return repack_mxfp4_tiles(plain, scales, out, in, tiles);
    };
  if (o.weights.repack_mxfp4 || o.weights.tile_mxfp4) o.weights.mxfp4_scale_check = mxfp4_scales_allow_exp_add;
  o.weights.pool = o.pool;
  o.weights.wo_a_fp8 = o.wo_a_fp8;

  // Everything is planned before anything is allocated: weights + KV + workspace must fit together.
  CEDAR_ASSIGN_OR_RETURN(DeviceMemoryPlan extra, cuda_model_extra_plan(c, host.plan(), o));
  CEDAR_ASSIGN_OR_RETURN(DeviceWeights weights,
                         DeviceWeights::upload(c, host.weights(), o.weights, extra, o.headroom_bytes));
  DeviceMemoryPlan plan = weights.memory_plan();
  for (const MemoryPlanEntry& e : extra.entries) plan.add(e.component, e.bytes, e.in_host, e.read_per_step);
  CEDAR_ASSIGN_OR_RETURN(DeviceKvPool kv, DeviceKvPool::create(c, host.plan(), o.kv));
  CEDAR_ASSIGN_OR_RETURN(Stream stream, Stream::create());

  auto ws = std::make_unique<Workspace>();
  {
    Carver sizing(nullptr, nullptr);
    workspace_layout(c, host.plan(), o, sizing, *ws);
    CEDAR_ASSIGN_OR_RETURN(ws->slab, DeviceBuffer<uint8_t>::allocate(sizing.bytes()));
    CEDAR_RETURN_IF_ERROR(ws->slab.zero());  // split-K / mHC / attention counters start at zero (kernels re-arm)
    Carver carve(ws->slab.get(), nullptr);
    workspace_layout(c, host.plan(), o, carve, *ws);
    const uint64_t pinned = ws->decode_in.bytes + ws->prefill_in.bytes;
    CEDAR_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&ws->pinned), pinned, cudaHostAllocDefault));
    ws->decode_in.block = reinterpret_cast<uint8_t*>(ws->decode_in.ids);
    ws->decode_in.staging = ws->pinned;
    ws->prefill_in.block = reinterpret_cast<uint8_t*>(ws->prefill_in.ids);
    ws->prefill_in.staging = ws->pinned + ws->decode_in.bytes;
    // e_0 rows: the collapse weights before layer 0 (pre_prev = e_0, §3.2).
    std::vector<float> e0(static_cast<size_t>(ws->rows * c.hc_mult), 0.0f);
    for (int64_t r = 0; r < ws->rows; ++r) e0[static_cast<size_t>(r * c.hc_mult)] = 1.0f;
    CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpy(ws->e0, e0.data(), e0.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  auto tables = std::make_unique<Tables>();
  CEDAR_RETURN_IF_ERROR(build_tables(host, o, kv, *tables));
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(shared), o, std::move(stream), std::move(weights),
                                                  std::move(kv), std::move(ws), std::move(tables), std::move(plan)));
}

Result<CudaSequence> CudaModel::new_sequence(const SequenceOptions& options) {
  CudaSequence s;
  s.options = options;
  if (options.mode == ForwardMode::Ced) {
    if (!plan().ced) return make_error("ced mode is unavailable for this model: " + plan().ced_unavailable_reason);
    if (options.prompt_length <= 0) return make_error("ced mode needs the prompt length (> 0)");
    const int64_t tail = options.ced_tail > 0 ? options.ced_tail : config().sliding_window;
    s.replay_start = std::max<int64_t>(0, options.prompt_length - tail);
  }
  CEDAR_ASSIGN_OR_RETURN(s.kv, kv_.new_sequence(stream_.get()));
  if (ws_->engram_next) {  // a fresh Engram history for the slot
    CEDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ws_->engram_next + s.kv.slot(), 0, sizeof(int64_t), stream_.get()));
  }
  return s;
}

Result<CudaSequence> CudaModel::fork_sequence(const CudaSequence& from) {
  if (from.failed) return make_error("fork_sequence: the source sequence is unusable after an earlier error");
  CEDAR_ASSIGN_OR_RETURN(CudaSequence s, new_sequence(from.options));
  s.length = from.length;
  s.replay_start = from.replay_start;
  const cudaStream_t st = stream_.get();
  CEDAR_RETURN_IF_ERROR(kv_.copy_sequence(from.kv, s.kv, st));
  if (ws_->engram_next) {
    const int64_t hist = config().engram_max_ngram_size - 1;
    CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ws_->engram_recent + s.kv.slot() * hist,
                                               ws_->engram_recent + from.kv.slot() * hist, hist * sizeof(int32_t),
                                               cudaMemcpyDeviceToDevice, st));
    CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ws_->engram_next + s.kv.slot(), ws_->engram_next + from.kv.slot(),
                                               sizeof(int64_t), cudaMemcpyDeviceToDevice, st));
  }
  CEDAR_RETURN_IF_ERROR(stream_.synchronize());
  return s;
}

// One sequence's rows of a call: positions [pos0, pos0 + n), staged at rows [row0, row0 + n) of the
// region; `first` is the row where the call containing them starts (AttnToken::chunk_row0 is relative to it).
struct CudaModel::RowSpan {
  const CudaSequence* seq = nullptr;
  const int64_t* tokens = nullptr;
  int64_t pos0 = 0, n = 0, row0 = 0, first = 0;
};

Status CudaModel::stage_rows(bool decode, std::span<const RowSpan> spans, int64_t n) {
  StepInputs& in = decode ? ws_->decode_in : ws_->prefill_in;
  if (n > in.capacity) return make_error("stage_rows: " + str(n) + " rows exceed the capacity " + str(in.capacity));
  uint8_t* h = in.staging;
  auto host = [&](auto* device_ptr) {
    using T = std::remove_pointer_t<decltype(device_ptr)>;
    return reinterpret_cast<T*>(h + (reinterpret_cast<uint8_t*>(device_ptr) - in.block));
  };
  int32_t* ids = host(in.ids);
  int32_t* slots = host(in.slots);
  int64_t* pos = host(in.pos);
  AttnToken* te = host(in.tok_exact);
  AttnToken* td = host(in.tok_dec);
  AttnToken* tb = host(in.tok_bnd);
  for (const RowSpan& sp : spans) {
    const CudaSequence& s = *sp.seq;
    const bool ced = s.options.mode == ForwardMode::Ced;
    const int64_t dec = ced ? s.replay_start : 0;
    const int64_t bnd = ced && s.options.ced_boundary == CedBoundary::GlobalKvOnly ? s.replay_start : 0;
    for (int64_t i = 0; i < sp.n; ++i) {
      const int64_t r = sp.row0 + i;
      ids[r] = static_cast<int32_t>(sp.tokens[i]);
      slots[r] = static_cast<int32_t>(s.kv.slot());
      pos[r] = sp.pos0 + i;
      const AttnToken t{
          static_cast<int32_t>(s.kv.slot()), static_cast<int32_t>(sp.n), sp.pos0 + i, sp.pos0, sp.row0 - sp.first, 0};
      te[r] = t;
      td[r] = t;
      td[r].swa_start = dec;
      tb[r] = t;
      tb[r].swa_start = bnd;
    }
  }
  const cudaStream_t st = stream_.get();
  if (decode)  // one copy of the whole (small) region
    return cuda_status(cudaMemcpyAsync(in.block, in.staging, in.bytes, cudaMemcpyHostToDevice, st),
                       "cudaMemcpyAsync(step inputs)");
  auto copy = [&](auto* device_ptr, size_t elem) -> Status {
    return cuda_status(
        cudaMemcpyAsync(device_ptr, host(device_ptr), static_cast<size_t>(n) * elem, cudaMemcpyHostToDevice, st),
        "cudaMemcpyAsync(step inputs)");
  };
  CEDAR_RETURN_IF_ERROR(copy(in.ids, sizeof(int32_t)));
  CEDAR_RETURN_IF_ERROR(copy(in.slots, sizeof(int32_t)));
  CEDAR_RETURN_IF_ERROR(copy(in.pos, sizeof(int64_t)));
  CEDAR_RETURN_IF_ERROR(copy(in.tok_exact, sizeof(AttnToken)));
  CEDAR_RETURN_IF_ERROR(copy(in.tok_dec, sizeof(AttnToken)));
  return copy(in.tok_bnd, sizeof(AttnToken));
}

namespace {

// Context bucket of a decode step: the indexer scans are sized for it, so one graph serves every step
// until the longest sequence crosses the next power of two.
int64_t context_bucket(int64_t positions, int64_t max_context) {
  int64_t b = 256;
  while (b < positions) b *= 2;
  return std::min(b, max_context);
}

}  // namespace

Status CudaModel::run_step(const Rows& r, CudaStepOutput& out) {
  Status st;
  // One graph per shape: batch, context bucket, concurrent branches (set_paths drops the graphs of the
  // other switches).
  const std::pair<int64_t, int64_t> key{r.n, 2 * r.context + (branches(r) ? 1 : 0)};
  if (r.decode && options_.cuda_graphs && !profiler_) {
    auto it = decode_graphs_.find(key);
    if (it == decode_graphs_.end() && !warmed_[key]) {
      // The first step of a shape runs directly (function attributes, cuBLAS heuristics), later ones
      // capture once and replay.
      st = run_rows(r);
      if (st.ok()) warmed_[key] = true;
    } else {
      if (it == decode_graphs_.end()) {
        auto captured =
            CudaGraph::capture(stream_.get(), [&](cudaStream_t) { return run_rows(r); }, graph_options());
        if (!captured.ok()) return captured.error().with_context("decode_step (batch " + str(r.n) + ")");
        it = decode_graphs_.emplace(key, std::move(*captured)).first;
      }
      st = it->second.launch(stream_.get());
    }
  } else if (profiler_ && profiler_->graph) {  // a fresh graph with the profile's event nodes
    auto captured = CudaGraph::capture(stream_.get(), [&](cudaStream_t) { return run_rows(r); }, graph_options());
    st = captured.ok() ? captured->launch(stream_.get()) : Status(captured.error());
    if (st.ok()) st = stream_.synchronize();  // the graph must outlive its replay
  } else {
    st = run_rows(r);
  }
  const int64_t rows = r.logits == LogitRows::None ? 0 : (r.logits == LogitRows::Last ? 1 : r.n);
  out.argmax.assign(static_cast<size_t>(rows), -1);
  if (st.ok() && rows > 0)
    st = cuda_status(cudaMemcpyAsync(out.argmax.data(), ws_->argmax, static_cast<size_t>(rows) * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, stream_.get()),
                     "cudaMemcpyAsync(argmax)");
  if (st.ok()) st = stream_.synchronize();
  last_rows_ = r.first + r.n;
  return st;
}

Status CudaModel::decode_step(std::span<CudaSequence* const> seqs, std::span<const int64_t> tokens,
                              CudaStepOutput& out) {
  const int64_t batch = static_cast<int64_t>(seqs.size());
  if (batch < 1 || batch > options_.max_batch || tokens.size() != seqs.size())
    return make_error("decode_step: " + str(batch) + " sequences and " + str(static_cast<int64_t>(tokens.size())) +
                      " tokens (need 1..max_batch " + str(options_.max_batch) + ", one token each)");
  std::set<int64_t> slots;
  std::vector<int64_t> positions;
  std::vector<RowSpan> spans;
  int64_t longest = 0;
  for (int64_t i = 0; i < batch; ++i) {
    CudaSequence& s = *seqs[static_cast<size_t>(i)];
    if (s.failed) return make_error("decode_step: sequence " + str(i) + " is unusable after an earlier error");
    if (!slots.insert(s.kv.slot()).second) return make_error("decode_step: sequence " + str(i) + " appears twice");
    if (tokens[static_cast<size_t>(i)] < 0 || tokens[static_cast<size_t>(i)] >= config().vocab_size)
      return make_error("decode_step: token " + str(tokens[static_cast<size_t>(i)]) + " of sequence " + str(i) +
                        " is outside the vocabulary");
    if (s.length + 1 > options_.kv.max_context)
      return make_error("decode_step: sequence " + str(i) + " reached max_context " + str(options_.kv.max_context));
    CEDAR_RETURN_IF_ERROR(s.kv.ensure(s.length + 1));
    CEDAR_RETURN_IF_ERROR(s.kv.upload_tables(stream_.get()));
    positions.push_back(s.length);
    spans.push_back(RowSpan{&s, &tokens[static_cast<size_t>(i)], s.length, 1, i, 0});
    longest = std::max(longest, s.length + 1);
  }
  CEDAR_RETURN_IF_ERROR(stage_rows(true, spans, batch));
  Rows r;
  r.n = batch;
  r.decode = true;
  r.logits = LogitRows::All;
  r.context = context_bucket(longest, options_.kv.max_context);
  const Status st = run_step(r, out);
  if (!st.ok()) {
    if (state_written_)
      for (CudaSequence* s : seqs) s->failed = true;
    return st.error().with_context("decode_step");
  }
  out.logits = ws_->logits;
  out.rows = batch;
  out.positions = positions;
  for (CudaSequence* s : seqs) ++s->length;
  return Status::Ok();
}

Status CudaModel::prefill(CudaSequence& seq, std::span<const int64_t> tokens, LogitRows logits, CudaStepOutput& out) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (seq.failed) return make_error("prefill: the sequence is unusable after an earlier error");
  if (n < 1 || n > options_.max_chunk)
    return make_error("prefill: chunk of " + str(n) + " tokens (need 1..max_chunk " + str(options_.max_chunk) + ")");
  if (seq.length + n > options_.kv.max_context)
    return make_error("prefill: " + str(seq.length + n) + " positions exceed max_context " +
                      str(options_.kv.max_context));
  for (int64_t i = 0; i < n; ++i)
    if (tokens[static_cast<size_t>(i)] < 0 || tokens[static_cast<size_t>(i)] >= config().vocab_size)
      return make_error("prefill: token " + str(tokens[static_cast<size_t>(i)]) + " at position " +
                        str(seq.length + i) + " is outside the vocabulary");
  // Rows before the CED replay start run the encoder and the boundary layer only (as the CPU model):
  // split the chunk there. Each part is a call of its own (its own AttnToken chunk).
  const int64_t head = std::clamp<int64_t>(seq.replay_start - seq.length, 0, n);
  if (logits == LogitRows::All && n - head > ws_->logit_rows)
    return make_error("prefill: logits of all " + str(n - head) + " rows exceed the " + str(ws_->logit_rows) +
                      " logit rows (max_batch)");
  CEDAR_RETURN_IF_ERROR(seq.kv.ensure(seq.length + n));
  CEDAR_RETURN_IF_ERROR(seq.kv.upload_tables(stream_.get()));
  std::vector<RowSpan> spans;
  if (head > 0) spans.push_back(RowSpan{&seq, tokens.data(), seq.length, head, 0, 0});
  if (n > head) spans.push_back(RowSpan{&seq, tokens.data() + head, seq.length + head, n - head, head, head});
  CEDAR_RETURN_IF_ERROR(stage_rows(false, spans, n));
  Status st;
  CudaStepOutput part;
  const bool gkv = seq.options.ced_boundary == CedBoundary::GlobalKvOnly;
  if (head > 0) {
    Rows r{0, head, false, false, LogitRows::None, seq.length + head, gkv, seq.length};
    st = run_step(r, part);
  }
  if (st.ok() && n > head) {
    Rows r{head, n - head, true, false, logits, seq.length + n, gkv, seq.length + head};
    st = run_step(r, part);
  }
  if (!st.ok()) {
    if (state_written_) seq.failed = true;
    return st.error().with_context("prefill");
  }
  out.logits = ws_->logits;
  out.rows = n > head ? static_cast<int64_t>(part.argmax.size()) : 0;
  out.argmax = n > head ? part.argmax : std::vector<int32_t>{};
  out.positions.clear();
  for (int64_t i = n - out.rows; i < n; ++i) out.positions.push_back(seq.length + i);
  seq.length += n;
  return Status::Ok();
}

Result<CudaSelections> CudaModel::last_selections(int64_t rows) const {
  if (rows < 0 || rows > last_rows_)
    return make_error("last_selections: " + str(rows) + " rows, the last call had " + str(last_rows_));
  CudaSelections s;
  s.rows = rows;
  s.index_topk = config().index_topk;
  s.experts_per_token = config().num_experts_per_tok;
  s.topk.resize(ws_->topk.size());
  s.experts.resize(ws_->experts.size());
  CEDAR_RETURN_IF_ERROR(stream_.synchronize());
  for (size_t l = 0; l < ws_->topk.size(); ++l) {
    if (ws_->topk[l]) {
      s.topk[l].resize(static_cast<size_t>(rows * s.index_topk));
      CEDAR_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(s.topk[l].data(), ws_->topk[l], s.topk[l].size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    }
    s.experts[l].resize(static_cast<size_t>(rows * s.experts_per_token));
    CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpy(s.experts[l].data(), ws_->experts[l], s.experts[l].size() * sizeof(int32_t),
                                          cudaMemcpyDeviceToHost));
  }
  return s;
}

}  // namespace cedar::cuda
