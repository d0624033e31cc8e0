// The CUDA model's MoE (cuda_model.h): route_tokens, the routed experts through device item tables (decode
// GEMVs) or the grouped GEMMs (prefill), the shared expert and the combine — DeepseekV41Model's moe step.
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_model_internal.h"
#include "backend/cuda/cuda_status.h"

namespace cedar::cuda {

using namespace model_detail;

Status CudaModel::moe(int64_t l, const Rows& r) {
  const ModelConfig& c = config();
  Workspace& w = *ws_;
  // x's FP8 codes feed the shared and the routed experts. Item tables (GEMVs) up to moe_items_max_rows
  // rows: the router runs inside moe_gemv's routed branch, beside the shared expert. Else the grouped GEMMs.
  // With paths.site_act_quant the ffn site's norm wrote them.
  const bool quantize_x = !fold_act_quant(r.n, c.hidden_size, true);
  if (r.n <= options_.paths.moe_items_max_rows) {
    if (quantize_x) CEDAR_RETURN_IF_ERROR(quantize(w.xn, r.n, c.hidden_size, w.act_a, w.act_a_scales));
    return moe_gemv(l, r);
  }
  CEDAR_RETURN_IF_ERROR(route(l, r, false));
  if (quantize_x) CEDAR_RETURN_IF_ERROR(quantize(w.xn, r.n, c.hidden_size, w.act_a, w.act_a_scales));
  return moe_gemm(l, r);
}

Status CudaModel::route(int64_t l, const Rows& r, bool beside_shared, MoeDispatchArgs* dispatch) {
  const ModelConfig& c = config();
  const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
  Workspace& w = *ws_;
  // route_tokens: fp32 logits, sqrt(softplus), biased top-k, normalized weights × route scale.
  RouterArgs ra;
  ra.n = r.n;
  ra.d = c.hidden_size;
  ra.n_experts = L.experts.count;
  ra.topk = c.num_experts_per_tok;
  ra.x = w.xn;
  ra.gate = bf16_bits(L.gate);
  ra.bias = L.gate_bias.data;
  ra.gate_temp = static_cast<float>(c.gate_temp);
  ra.route_scale = static_cast<float>(c.routed_scaling_factor);
  ra.norm_topk_prob = c.norm_topk_prob;
  ra.logits = w.router_logits;
  ra.experts = w.experts[static_cast<size_t>(l)] + r.first * c.num_experts_per_tok;
  ra.weights = w.route_w;
  ra.one_token_select = options_.paths.router_one_token;
  // Split-K logits (one fused launch up to 8 rows); above kRouterBlasMinTokens rows one cuBLASLt GEMM.
  // Beside the shared expert (decode branches, router_ahead = 0) only with paths.router_splitk_beside: s5 /
  // s6 measured the unsplit kernel faster there (−0.08 to −0.09 ms) while the selection and the items were
  // launches of their own; with the items in the fused launch (dispatch_in_router) the split one is faster
  // (s9 run 6: router_splitk_beside=0 +0.07 ms).
  if (options_.paths.router_splitk && (!beside_shared || options_.paths.router_splitk_beside)) {
    ra.splitk = w.router_ws;
    if (tables_->blas && r.n * c.hidden_size <= w.dense_x_elems) {
      ra.blas = tables_->blas.get();
      ra.x_bf16 = w.dense_x;
      ra.x_bf16_elems = w.dense_x_elems;
    }
  }
  ra.programmatic_launch = pdl();
  if (!ra.splitk.partials && !ra.blas) {  // unsplit logits, then the selection: a PDL edge between them
    CEDAR_RETURN_IF_ERROR(router_logits(ra, cs()));
    ra.programmatic_launch = pdl();
    CEDAR_RETURN_IF_ERROR(router_select(ra, cs()));
  } else if (dispatch && options_.paths.dispatch_in_router) {
    CEDAR_RETURN_IF_ERROR(moe_route(ra, cs(), dispatch));
    dispatch = nullptr;
  } else {
    CEDAR_RETURN_IF_ERROR(moe_route(ra, cs()));
  }
  if (ra.blas && r.n > kRouterBlasMinTokens) pdl_barrier();
  if (dispatch) {  // the chain after the router runs under PDL: each kernel waits before reading
    dispatch->programmatic_launch = pdl();
    CEDAR_RETURN_IF_ERROR(moe_build_items(*dispatch, cs()));
  }
  return mark("moe.route", L.gate.bytes());
}

// The shared expert into w.shared: w1 / w3 + SwiGLU (+ FP8 codes), then w2 (qlinear). Up to paths.gemv_max_rows rows
// w1 / w3 are one grouped GEMV launch and a SwiGLU launch; more rows the fused SwiGLU GEMM (cuBLASLt
// from blas_min_rows rows on).
Status CudaModel::shared_expert(int64_t l, const Rows& r, SharedPart part) {
  const ModelConfig& c = config();
  const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
  Workspace& w = *ws_;
  const int64_t n = r.n;
  const float limit = static_cast<float>(c.swiglu_limit);
  const bool gemv = n <= options_.paths.gemv_max_rows;
  if (part != SharedPart::All && !gemv)
    return make_error("shared expert of " + str(n) + " rows: the halves launch apart on the GEMV path only");
  const SplitKWorkspace unsplit{};  // paths.shared_splitk = false: one block per row tile
  const SplitKWorkspace& split = options_.paths.shared_splitk ? splitk() : unsplit;
  if (gemv && part != SharedPart::Down) {
    const GemvGroupItem s13[2] = {{L.shared_w1.data, L.shared_w1.scales, w.act_a, w.act_a_scales, w.sg},
                                  {L.shared_w3.data, L.shared_w3.scales, w.act_a, w.act_a_scales, w.su}};
    CEDAR_RETURN_IF_ERROR(gemv_quantized_grouped(L.shared_w1.quant(), s13, 2, n, true, cs(), split, pdl()));
    const SwigluArgs ss{.rows = n,
                        .inter = c.moe_intermediate_size,
                        .g = w.sg,
                        .u = w.su,
                        .limit = limit,
                        .codes = w.sh_codes,
                        .scales = w.sh_scales,
                        .programmatic_launch = pdl()};
    CEDAR_RETURN_IF_ERROR(swiglu(ss, cs()));
    if (part == SharedPart::Up) return Status::Ok();
  } else if (!gemv) {
    SwigluGemmArgs sg;
    sg.w1 = L.shared_w1.quant();
    sg.w3 = L.shared_w3.quant();
    sg.act_codes = w.act_a;
    sg.act_scales = w.act_a_scales;
    sg.m = n;
    sg.act_block = 32;
    sg.swiglu_limit = limit;
    sg.h_codes = w.sh_codes;
    sg.h_scales = w.sh_scales;
    if (blas_rows(n)) {
      sg.blas = tables_->blas.get();
      sg.bf16_scratch = w.gemm.bf16;
      sg.bf16_scratch_elems = w.gemm.bf16_elems;
      sg.gu_scratch = w.blas_gu;
      sg.gu_scratch_floats = w.blas_gu_floats;
    }
    CEDAR_RETURN_IF_ERROR(swiglu_gemm(sg, cs()));
    if (sg.blas) pdl_barrier();
  }
  if (gemv && !options_.paths.shared_splitk)
    CEDAR_RETURN_IF_ERROR(gemv_quantized(L.shared_w2.quant(), w.sh_codes, w.sh_scales, n, w.shared, true, cs(), split,
                                         pdl()));
  else
    CEDAR_RETURN_IF_ERROR(qlinear(L.shared_w2, w.sh_codes, w.sh_scales, n, w.shared));
  return mark("moe.shared", L.shared_w1.bytes() + L.shared_w2.bytes() + L.shared_w3.bytes());
}

// Decode: device-built item tables over the routed experts (packed MXFP4 GEMVs), SwiGLU, W2, the shared
// expert as grouped GEMVs, and the combine in the CPU's order.
Status CudaModel::moe_gemv(int64_t l, const Rows& r) {
  const ModelConfig& c = config();
  const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
  const DeviceExperts& X = L.experts;
  Workspace& w = *ws_;
  const cudaStream_t s = cs();
  const int64_t n = r.n, K = c.num_experts_per_tok, P = n * K, d = c.hidden_size, inter = c.moe_intermediate_size;
  const float limit = static_cast<float>(c.swiglu_limit);
  const bool fork = branches(r);
  // paths.shared_w2_late: the shared expert's halves apart, w2 after the routed w1 / w3 (the branches forked).
  const bool shared_late = fork && options_.paths.shared_w2_late && n <= options_.paths.gemv_max_rows;
  const int32_t* experts = w.experts[static_cast<size_t>(l)] + r.first * K;
  MoeDispatchArgs da;
  da.experts = experts;
  da.n = n;
  da.topk = K;
  da.n_experts = X.count;
  da.n_tables = 2;
  da.block_build = !options_.paths.warp_items;
  // paths.routed_tiles: the items point at the tile-layout copy (its chunks hold the scales too).
  const bool tiles = options_.paths.routed_tiles && X.tile_table[DeviceExperts::kW1] != nullptr;
  auto data = [&](DeviceExperts::Kind k) { return tiles ? X.tile_table[k] : X.data_table[k]; };
  da.tables[0] = MoeItemTable{2,
                              {{data(DeviceExperts::kW1), X.scale_table[DeviceExperts::kW1]},
                               {data(DeviceExperts::kW3), X.scale_table[DeviceExperts::kW3]}},
                              {w.g, w.gu},
                              w.act_a,
                              w.act_a_scales,
                              false,
                              w.items13,
                              w.item_counts,
                              2 * P};
  da.tables[1] = MoeItemTable{1,
                              {{data(DeviceExperts::kW2), X.scale_table[DeviceExperts::kW2]}, {}},
                              {w.routed, nullptr},
                              w.h_codes,
                              w.h_scales,
                              true,
                              w.items2,
                              w.item_counts + 1,
                              P};
  const Mxfp4Layout layout = tiles ? Mxfp4Layout::Tiles : X.repacked ? Mxfp4Layout::PackedBalanced : Mxfp4Layout::Plain;
  // The router and the dispatch are latency-bound (4 MB and a few item rows at batch 1). In the routed
  // branch, beside the shared expert's GEMVs, the s8 kernel timeline shows router + select + dispatch + the
  // fork's first launch put ~31 µs before w1/w3 at batch 1. paths.router_ahead: both on the main stream
  // before the fork, so the routed branch starts with its first GEMV — off: +0.25 ms (s9), that latency hid
  // the shared expert's GEMVs. paths.dispatch_in_router: the dispatch inside the fused router launch.
  auto dispatch = [&]() -> Status {
    return route(l, r, /*beside_shared=*/!options_.paths.router_ahead && fork, &da);
  };
  if (options_.paths.router_ahead) CEDAR_RETURN_IF_ERROR(dispatch());
  auto routed = [&]() -> Status {
    if (!options_.paths.router_ahead) CEDAR_RETURN_IF_ERROR(dispatch());
    if (options_.paths.routed_full_edge && fork) pdl_barrier();  // w1 / w3 does not hold the SMs early
    QuantWeightView shape13 = X.first[DeviceExperts::kW1].quant();
    QuantWeightView shape2 = X.first[DeviceExperts::kW2].quant();
    shape13.data = shape2.data = nullptr;
    shape13.scales = shape2.scales = nullptr;
    const bool packed = layout != Mxfp4Layout::Plain;
    const bool exp_add = packed && X.scales_checked && options_.paths.scale_exp_add;
    const int warps = layout == Mxfp4Layout::PackedBalanced ? static_cast<int>(options_.paths.routed_warps) : 0;
    // (Tiles: the 4-warp split only; routed_warps does not apply.)
    GemvItemsOptions o13{.programmatic_launch = pdl(),
                         .work = packed ? w.item_work : nullptr,
                         .packed_warps = warps,
                         .scale_exp_add = exp_add};
    if (layout == Mxfp4Layout::Tiles && options_.paths.routed_w2_prefetch > 0)
      o13.l2_prefetch = TilesL2Prefetch{.items = w.items2,
                                        .count = w.item_counts + 1,
                                        .capacity = P,
                                        .out = shape2.out,
                                        .in = shape2.in,
                                        .after_units = options_.paths.routed_w2_prefetch == 2};
    CEDAR_RETURN_IF_ERROR(gemv_quantized_items(shape13, layout, w.items13, w.item_counts, 2 * P, true, cs(), o13));
    if (shared_late) {  // the shared w2 on the aux stream after its SwiGLU and this w1 / w3
      const cudaStream_t a = tables_->aux.get();
      CEDAR_CUDA_RETURN_IF_ERROR(cudaEventRecord(tables_->shared_late_ev, cs()));
      CEDAR_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(a, tables_->shared_late_ev, 0));
      cur_ = a;
      pdl_fresh_[1] = true;  // two predecessors: no programmatic edge
      const Status st = shared_expert(l, r, SharedPart::Down);
      cur_ = nullptr;
      CEDAR_RETURN_IF_ERROR(st);
    }
    const SwigluArgs sw{.rows = P,
                        .inter = inter,
                        .g = w.g,
                        .u = w.gu,
                        .row_weights = w.route_w,
                        .limit = limit,
                        .codes = w.h_codes,
                        .scales = w.h_scales,
                        .programmatic_launch = pdl()};
    CEDAR_RETURN_IF_ERROR(swiglu(sw, cs()));
    GemvItemsOptions o2{.programmatic_launch = pdl(),
                        .work = packed ? w.item_work + 2 : nullptr,
                        .packed_warps = warps,
                        .scale_exp_add = exp_add};
    CEDAR_RETURN_IF_ERROR(gemv_quantized_items(shape2, layout, w.items2, w.item_counts + 1, P, true, cs(), o2));
    const uint64_t expert_bytes = X.first[0].bytes() + X.first[1].bytes() + X.first[2].bytes();
    return mark("moe.experts", static_cast<uint64_t>(K) * expert_bytes);
  };
  // Shared expert (weight 1) — a second branch.
  auto shared = [&]() { return shared_expert(l, r, shared_late ? SharedPart::Up : SharedPart::All); };
  CEDAR_RETURN_IF_ERROR(parallel(fork, routed, shared));
  if (options_.paths.site_combine && fork && n <= kMhcNormFuseMaxTokens && K <= kMhcCombineMaxTopk) {
    pending_combine_ = MoeCombineArgs{n, K, d, experts, w.routed, w.shared, w.y};  // the next site combines it
    return Status::Ok();
  }
  CEDAR_RETURN_IF_ERROR(moe_combine(MoeCombineArgs{n, K, d, experts, w.routed, w.shared, w.y}, s));
  return mark("moe.combine");
}

// Prefill (and large decode batches): tokens grouped per expert, grouped W1/W3+SwiGLU and W2 GEMMs over
// the plain MXFP4 bytes, the shared expert's fused SwiGLU GEMM, the combine in the CPU's order.
Status CudaModel::moe_gemm(int64_t l, const Rows& r) {
  const ModelConfig& c = config();
  const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
  const DeviceExperts& X = L.experts;
  Workspace& w = *ws_;
  const cudaStream_t s = cs();
  const int64_t n = r.n, K = c.num_experts_per_tok, d = c.hidden_size, inter = c.moe_intermediate_size;
  const float limit = static_cast<float>(c.swiglu_limit);
  const int32_t* experts = w.experts[static_cast<size_t>(l)] + r.first * K;
  MoeRouteView rv;
  rv.expert_ids = experts;
  rv.weights = w.route_w;
  rv.n = n;
  rv.topk = K;
  rv.n_experts = X.count;
  const int tile = moe_tile_rows(n, K, X.count);
  CEDAR_RETURN_IF_ERROR(moe_permute(rv, tile, w.perm, s));
  auto data = [&](int k) { return X.plain_data_table[k] ? X.plain_data_table[k] : X.data_table[k]; };
  MoeExpertArgs ea;
  ea.experts.format = quant_format(X.first[0]);
  ea.experts.d = d;
  ea.experts.inter = inter;
  ea.experts.block_out = X.first[0].block_out;
  ea.experts.block_in = X.first[0].block_in;
  ea.experts.w1_data = data(DeviceExperts::kW1);
  ea.experts.w1_scales = X.scale_table[DeviceExperts::kW1];
  ea.experts.w3_data = data(DeviceExperts::kW3);
  ea.experts.w3_scales = X.scale_table[DeviceExperts::kW3];
  ea.experts.w2_data = data(DeviceExperts::kW2);
  ea.experts.w2_scales = X.scale_table[DeviceExperts::kW2];
  ea.route = rv;
  ea.perm = w.perm;
  ea.tile_rows = tile;
  ea.x_codes = w.act_a;
  ea.x_scales = w.act_a_scales;
  ea.act_block = 32;
  ea.swiglu_limit = limit;
  ea.h_codes = w.h_codes;
  ea.h_scales = w.h_scales;
  ea.y_rows = w.y_rows;
  CEDAR_RETURN_IF_ERROR(moe_experts(ea, s));
  CEDAR_RETURN_IF_ERROR(mark("moe.experts"));
  CEDAR_RETURN_IF_ERROR(shared_expert(l, r));
  MoePrefillCombineArgs ca;
  ca.expert_ids = experts;
  ca.slot_row = w.perm.slot_row;
  ca.y_rows = w.y_rows;
  ca.shared = w.shared;
  ca.n = n;
  ca.topk = K;
  ca.d = d;
  ca.n_experts = X.count;
  ca.y = w.y;
  CEDAR_RETURN_IF_ERROR(moe_prefill_combine(ca, s));
  return mark("moe.combine");
}

}  // namespace cedar::cuda
