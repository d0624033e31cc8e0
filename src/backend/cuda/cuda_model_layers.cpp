// The CUDA model's layer loop (cuda_model.h): embed → per layer [Engram] → attention site (mHC) →
// attention (compressor, indexer, sparse attention, output projection) → ffn site (mHC) → MoE (in
// cuda_model_moe.cpp) → final expand, head and argmax. Mirrors DeepseekV41Model::run_rows / run_layer /
// finish_rows step by step; each call names the CPU step it reproduces. Every launch is asynchronous on the model's stream and
// graph-capturable: nothing here reads device data back or depends on it on the host.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_model_internal.h"
#include "backend/cuda/cuda_status.h"

namespace cedar::cuda {
using namespace model_detail;


Status CudaModel::mark(const char* stage, uint64_t weight_bytes) {
  if (!profiler_) return Status::Ok();
  Profiler& p = *profiler_;
  if (p.used == p.events.size()) return make_error("profile: more stages than events");
  cudaEvent_t ev = p.events[p.used];
  const cudaError_t e = p.graph ? cudaEventRecordWithFlags(ev, stream_.get(), cudaEventRecordExternal)
                                : cudaEventRecord(ev, stream_.get());
  CEDAR_RETURN_IF_ERROR(cuda_status(e, "cudaEventRecord(profile)"));
  p.labels.emplace_back(stage);
  p.bytes.push_back(weight_bytes);
  ++p.used;
  return Status::Ok();
}

Status CudaModel::debug(const std::string& name, const Rows& r, const float* data, int64_t width) {
  if (!debug_sink_ || r.decode) return Status::Ok();
  std::vector<float> host(static_cast<size_t>(r.n * width));
  CEDAR_RETURN_IF_ERROR(stream_.synchronize());
  CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), data, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  debug_sink_(TensorRecord{name, r.pos0, r.n, width, host});
  return Status::Ok();
}

const SplitKWorkspace& CudaModel::splitk() const { return cur_ ? ws_->splitk_aux : ws_->splitk; }

bool CudaModel::branches(const Rows& r) const {
  // Serial while profiling (the stage events time one stream) and on the GEMM path (one GEMM workspace): decode
  // up to one GEMV tile, or with paths.branches_above_tile up to both GEMV-path thresholds.
  const CudaKernelPaths& p = options_.paths;
  const int64_t most = p.branches_above_tile ? std::min(p.gemv_max_rows, p.moe_items_max_rows) : kGemvMaxRows;
  return options_.concurrent_branches && r.decode && r.n <= most && !profiler_;
}

bool CudaModel::pdl() {
  const int s = cur_ ? 1 : 0;
  const bool fresh = pdl_fresh_[s];
  pdl_fresh_[s] = false;
  return pdl_rows_ && !fresh && options_.paths.programmatic_launch && !profiler_;
}

void CudaModel::pdl_barrier() { pdl_fresh_[cur_ ? 1 : 0] = true; }

Status CudaModel::quantize(const float* x, int64_t n, int64_t in, uint16_t* codes, float* scales) {
  if (n * in > ws_->act_capacity)
    return make_error("activation quantization of " + str(n) + "×" + str(in) + " exceeds the workspace");
  return quantize_act_fp8(x, n, in, codes, scales, cs(), pdl());
}

Status CudaModel::norm(const float* x, int64_t n, int64_t dim, const DeviceVector& weight, float* y,
                       const ActQuantOut* quant) {
  return rms_norm(x, n, dim, weight.data, static_cast<float>(config().rms_norm_eps), y, cs(), pdl(),
                  quant ? *quant : ActQuantOut{});
}

bool CudaModel::fold_act_quant(int64_t n, int64_t width, bool site) const {
  const CudaKernelPaths& p = options_.paths;
  // site_cluster writes the codes wherever its kernel runs (the split sites of a shape it fits).
  const bool site_codes = p.site_act_quant || (p.site_cluster && p.mhc_split && mhc_site_cluster_fits(n, width));
  return (site ? site_codes : p.fused_act_quant) && n * width <= ws_->act_capacity;
}

Status CudaModel::qlinear(const DeviceMatrix& w, const uint16_t* codes, const float* scales, int64_t n, float* y,
                          bool bf16_output) {
  if (w.format != DeviceFormat::Fp8Block && w.format != DeviceFormat::Mxfp4)
    return make_error("qlinear: weight format " + std::string(device_format_name(w.format)) + " is not quantized");
  Workspace& ws = *ws_;
  if (n <= options_.paths.gemv_max_rows)
    return gemv_quantized(w.quant(), codes, scales, n, y, bf16_output, cs(), splitk(), pdl());
  QuantGemmArgs a;
  a.w = w.quant();
  a.act_codes = codes;
  a.act_scales = scales;
  a.m = n;
  a.act_block = 32;
  a.y = y;
  a.bf16_output = bf16_output;
  // Exact bf16 operands through cuBLASLt (the fp32 summation order differs from the tile kernel's).
  if (blas_rows(n)) a.blas = tables_->blas.get();
  const Status st = quant_gemm(a, ws.gemm, cs());
  if (a.blas) pdl_barrier();
  return st;
}

bool CudaModel::staged_wo_a(const DeviceMatrix& w, int64_t n, int64_t groups, int64_t out, int64_t in) const {
  return options_.paths.wo_a_f16 && w.format == DeviceFormat::Fp8Block && w.fp8_fast && n >= 1 &&
         n <= options_.paths.gemv_max_rows &&
         groups >= 1 && out >= 1 && w.out == groups * out && w.block_out > 0 && out % w.block_out == 0 && w.in == in &&
         in % 32 == 0 && n * groups * in <= ws_->act_capacity;
}

bool CudaModel::wo_a_f16_active(int64_t n) const {
  const ModelConfig& c = config();
  const int64_t in = c.num_attention_heads * c.head_dim / std::max<int64_t>(c.o_groups, 1);
  if (weights_.layers().empty()) return false;
  for (const DeviceLayer& L : weights_.layers())
    if (!staged_wo_a(L.wo_a, n, c.o_groups, c.o_lora_rank, in)) return false;
  return true;
}

Status CudaModel::dense(const DenseCall& c) {
  const DeviceMatrix& w = *c.w;
  Workspace& ws = *ws_;
  const bool f32 = w.format == DeviceFormat::F32;
  const bool fp8 = w.format == DeviceFormat::Fp8Block;  // wo_a as stored: its bf16 values are dequantized
  if (w.format != DeviceFormat::Bf16 && !f32 && !fp8)
    return make_error("dense: weight format " + std::string(device_format_name(w.format)) +
                      " is not BF16 / F32 / FP8 (wo_a)");
  if ((c.n > 64 || f32) && tables_->blas) {
    DenseGemmArgs a;
    a.type = f32 ? DenseWeightType::F32 : DenseWeightType::BF16;
    a.w = w.data;
    if (fp8) {  // the same bf16 values as the BF16 upload (dequant_weight_bf16 == the load-time conversion)
      if (w.out * w.in > ws.gemm.bf16_elems)
        return make_error("dense: FP8 weight [" + str(w.out) + ", " + str(w.in) + "] exceeds the bf16 scratch (" +
                          str(ws.gemm.bf16_elems) + " elements)");
      CEDAR_RETURN_IF_ERROR(dequant_weight_bf16(w.quant(), ws.gemm.bf16, cs()));
      a.w = ws.gemm.bf16;
    }
    a.out = c.out;
    a.in = c.in;
    a.x = c.x;
    a.n = c.n;
    a.ldx = c.groups * c.in;
    a.y = c.y;
    a.ldy = c.groups * c.out;
    a.bf16_output = c.bf16_output;
    a.batch = c.groups;
    a.w_stride = c.out * c.in;
    a.x_stride = c.in;
    a.y_stride = c.out;
    const Status st = dense_gemm(*tables_->blas, a, ws.dense_x, ws.dense_x_elems, cs());
    pdl_barrier();
    return st;
  }
  if (f32) return make_error("dense: F32 weights need cuBLASLt (" + tables_->blas_error + ")");
  if (fp8 && staged_wo_a(w, c.n, c.groups, c.out, c.in)) {
    // paths.wo_a_f16: x staged as exact f16 blocks (act_b: qr's codes are dead once attention ran, and
    // wo_b's input goes to act_a) + the FP8 grouped GEMV; the same exact products as gemv_bf16.
    StagedGemvArgs a;
    a.w = w.quant();
    a.groups = c.groups;
    a.x = c.x;
    a.y = c.y;
    a.n = c.n;
    a.bf16_output = c.bf16_output;
    a.codes = ws.act_b;
    a.scales = ws.act_b_scales;
    a.capacity_values = ws.act_capacity;
    a.programmatic_launch = pdl();
    a.codes_staged = c.x_staged;
    return gemv_fp8_staged(a, cs(), splitk());
  }
  Bf16GemvArgs a;
  if (fp8) {  // dequantized in registers: bit-identical to gemv_bf16 on the BF16 values
    a.w_fp8 = w.data;
    a.w_scales = w.scales;
    a.w_fp8_fast = w.fp8_fast;
    a.block_out = w.block_out;
    a.block_in = w.block_in;
  } else {
    a.w = bf16_bits(w);
  }
  a.out = c.out;
  a.in = c.in;
  a.groups = c.groups;
  a.x = c.x;
  a.y = c.y;
  a.n = c.n;
  a.bf16_output = c.bf16_output;
  a.programmatic_launch = pdl();
  return gemv_bf16(a, cs(), splitk());
}

Status CudaModel::mhc(const void* args_ptr, const Rows& r) {
  MhcFusedArgs a = *static_cast<const MhcFusedArgs*>(args_ptr);
  const CudaKernelPaths& p = options_.paths;
  a.programmatic_launch = pdl();
  a.decode_one_token = p.mhc_one_token;
  // The cluster kernel (coefficients only) is one launch per 8-token tile without a global workspace;
  // the sized decode kernel runs every tile in one launch and the streaming one covers prefill.
  if (p.mhc_cluster && tables_->mhc_cluster && a.fn && r.n > 4 && (r.n < kMhcStreamMinTokens || !p.mhc_batched)) {
    CEDAR_RETURN_IF_ERROR(mhc_combine_y(a, cs()));  // the cluster kernel reads y as given
    CEDAR_RETURN_IF_ERROR(mhc_fused_cluster(a, cs(), false));  // cluster launches without PDL: not tested together yet
    return a.normed ? rms_norm(a.collapsed, a.n, a.d, a.norm_weight, a.normed_eps, a.normed, cs(), false,
                               a.normed_quant)
                    : Status::Ok();
  }
  MhcWorkspace ws = mhc_ws();
  if (!p.mhc_split_norm) ws.norm_counter = nullptr;  // fn = null with normed: elementwise + rms_norm launches
  return mhc_fused(a, ws, cs());
}

MhcYCombine CudaModel::take_combine() {
  const MoeCombineArgs p = std::exchange(pending_combine_, MoeCombineArgs{});
  return p.n > 0 ? MhcYCombine{p.experts, p.routed, p.shared, p.topk, p.y} : MhcYCombine{};
}

Status CudaModel::flush_combine() {
  const MoeCombineArgs p = std::exchange(pending_combine_, MoeCombineArgs{});
  return p.n > 0 ? moe_combine(p, cs()) : Status::Ok();
}

Status CudaModel::fork_coefficients(const void* args_ptr) {
  MhcFusedArgs a = *static_cast<const MhcFusedArgs*>(args_ptr);
  // The streams as the critical kernels left them (X_out = X): no expand, no collapse, no norm.
  a.y = nullptr;
  a.y_combine = {};
  a.post = a.comb = nullptr;
  a.collapse_w = nullptr;
  a.collapsed = nullptr;
  a.norm_weight = nullptr;
  a.normed = nullptr;
  a.normed_quant = ActQuantOut{};
  a.programmatic_launch = false;  // its predecessor is an event, not a kernel of its stream
  a.decode_one_token = options_.paths.mhc_one_token;
  const cudaStream_t s = stream_.get(), c = tables_->coef.get();
  CEDAR_CUDA_RETURN_IF_ERROR(cudaEventRecord(tables_->coef_fork_ev, s));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(c, tables_->coef_fork_ev, 0));
  coef_pending_ = true;  // joined even if the launch fails, so a capture in progress ends merged
  const Status st = mhc_fused(a, mhc_ws(), c);
  const cudaError_t e = cudaEventRecord(tables_->coef_done_ev, c);
  CEDAR_RETURN_IF_ERROR(st);
  return cuda_status(e, "cudaEventRecord(coefficients)");
}

Status CudaModel::join_swa_commit() {
  if (!swa_commit_pending_) return Status::Ok();
  swa_commit_pending_ = false;
  pdl_fresh_[0] = true;  // the next kernel also depends on the aux stream
  return cuda_status(cudaStreamWaitEvent(stream_.get(), tables_->swa_done_ev, 0), "cudaStreamWaitEvent(swa commit)");
}

Status CudaModel::join_coefficients() {
  if (!coef_pending_) return Status::Ok();
  coef_pending_ = false;
  pdl_fresh_[0] = true;  // the next kernel also depends on the coefficient stream
  return cuda_status(cudaStreamWaitEvent(stream_.get(), tables_->coef_done_ev, 0), "cudaStreamWaitEvent(coefficients)");
}

// The site's input norm: requested from mhc_fused (fused into its decode kernel up to
// kMhcNormFuseMaxTokens rows), or a separate rms_norm launch (paths.mhc_fused_norm = false). With
// paths.mhc_split (decode branches), the critical kernel first (expand + collapse + the norm in one
// launch up to kMhcNormFuseMaxTokens rows, paths.mhc_split_norm; else the elementwise kernel and
// rms_norm), the coefficients on the coefficient stream. With paths.site_act_quant, whichever kernel
// writes xn also writes its FP8 codes into act_a (the attention's wq_a + wkv, the experts read them).
Status CudaModel::site_norm(void* args_ptr, const Rows& r, const DeviceVector& weight) {
  MhcFusedArgs& a = *static_cast<MhcFusedArgs*>(args_ptr);
  ActQuantOut quant;
  if (fold_act_quant(r.n, config().hidden_size, true)) quant = ActQuantOut{ws_->act_a, ws_->act_a_scales};
  // (One GEMV tile at most: above it mhc_fused takes other kernels, whose workspace use beside the critical
  // launch is not established.)
  if (options_.paths.mhc_split && branches(r) && r.n <= kGemvMaxRows && a.fn && a.mix_out && !cur_) {
    MhcFusedArgs crit = a;
    crit.fn = nullptr;
    crit.mix_out = nullptr;
    crit.norm_weight = weight.data;
    crit.normed = ws_->xn;
    crit.normed_eps = static_cast<float>(config().rms_norm_eps);
    crit.normed_quant = quant;
    crit.site_cluster = options_.paths.site_cluster;
    CEDAR_RETURN_IF_ERROR(mhc(&crit, r));
    return fork_coefficients(&a);
  }
  if (!options_.paths.mhc_fused_norm) {
    CEDAR_RETURN_IF_ERROR(mhc(&a, r));
    return norm(a.collapsed, r.n, config().hidden_size, weight, ws_->xn, &quant);
  }
  a.norm_weight = weight.data;
  a.normed = ws_->xn;
  a.normed_eps = static_cast<float>(config().rms_norm_eps);
  a.normed_quant = quant;
  return mhc(&a, r);
}

namespace {

// A site's mix rows [n, kMixWidth] = pre[4], post[4], comb[16] per token, read in place by stride.
struct MixPtrs {
  const float *pre = nullptr, *post = nullptr, *comb = nullptr;
  int64_t stride = 0;  // 0: packed [n, hc] (e_0)
};
MixPtrs mix_rows(const float* mix) { return MixPtrs{mix, mix + 4, mix + 8, kMixWidth}; }

// The next site's expand inputs (y with the previous site's post / comb) and collapse weights.
void set_expand(MhcFusedArgs& a, const float* y, const MixPtrs& m) {
  a.y = y;
  a.post = m.post;
  a.comb = m.comb;
  a.post_stride = a.comb_stride = m.stride;
}
void set_collapse(MhcFusedArgs& a, const MixPtrs& m, float* collapsed) {
  a.collapse_w = m.pre;
  a.collapse_w_stride = m.stride;
  a.collapsed = collapsed;
}

MhcFusedArgs mhc_args(const ModelConfig& c, const DeviceHc& hc, int64_t n, float* X) {
  MhcFusedArgs a;
  a.n = n;
  a.hc = c.hc_mult;
  a.d = c.hidden_size;
  a.X = X;
  a.X_out = X;
  a.fn = hc.fn.data;
  a.base = hc.base.data;
  a.scale = hc.scale.data;
  a.sinkhorn_iters = c.hc_sinkhorn_iters;
  a.hc_eps = static_cast<float>(c.hc_eps);
  a.norm_eps = static_cast<float>(c.rms_norm_eps);
  a.mix_stride = kMixWidth;
  return a;
}

}  // namespace

// ---- the loop (DeepseekV41Model::run_rows) ------------------------------------------------------

Status CudaModel::run_rows(const Rows& r) {
  const Status st = run_layers(r);
  // Every fork of the coefficient, Engram and aux (ring commit) streams is joined, after an error too: a
  // capture in progress ends merged.
  const Status joined = join_coefficients();
  const Status engram_joined = join_engram(-1);
  const Status swa_joined = join_swa_commit();
  CEDAR_RETURN_IF_ERROR(st);
  CEDAR_RETURN_IF_ERROR(joined);
  CEDAR_RETURN_IF_ERROR(engram_joined);
  return swa_joined;
}

Status CudaModel::run_layers(const Rows& r) {
  state_written_ = true;  // from the first kernel on, sequence state (rings, caches, Engram history) changes
  pdl_rows_ = r.decode;   // PDL inside decode steps (prefill kernels are long: nothing to hide)
  pdl_fresh_[0] = pdl_fresh_[1] = true;
  engram_ahead_layers_ = 0;
  q_norm_kv_layers_ = 0;
  pending_combine_ = MoeCombineArgs{};  // a step that failed may have left one
  CEDAR_RETURN_IF_ERROR(mark("start"));
  CEDAR_RETURN_IF_ERROR(embed(r));
  if (engram_ahead_on(r)) CEDAR_RETURN_IF_ERROR(fork_engram(r));
  const LayerPlan& p = plan();
  const int64_t last = r.tail ? p.num_layers() - 1 : p.last_kv_source;
  const int64_t d = config().hidden_size;
  for (int64_t l = 0; l <= last; ++l) {
    const std::string at = "layers." + str(l) + ".";
    const bool boundary_stop = !r.tail && l == p.last_kv_source;
    Status st = attention_site(l, r);
    if (st.ok()) st = debug(at + "attn_in", r, ws_->xn, d);
    if (st.ok()) st = attention(l, r);
    if (st.ok() && boundary_stop) return Status::Ok();  // pre-tail rows stop after the boundary
    if (st.ok()) st = debug(at + "attn_out", r, ws_->y, d);
    if (st.ok()) st = ffn_site(l, r);
    if (st.ok()) st = debug(at + "ffn_in", r, ws_->xn, d);
    if (st.ok()) st = moe(l, r);
    if (st.ok()) st = debug(at + "ffn_out", r, ws_->y, d);
    if (!st.ok()) return st.error().with_context("layer " + str(l));
  }
  if (r.tail) return finish(r);
  return flush_combine();  // y is complete when the call returns
}

Status CudaModel::embed(const Rows& r) {
  const ModelConfig& c = config();
  Workspace& w = *ws_;
  const StepInputs& in = r.decode ? w.decode_in : w.prefill_in;
  // §3.2: X_0 = [e, e, e, e] (pre_prev = e_0 is the constant w.e0).
  EmbedGatherArgs a;
  a.table = bf16_bits(weights_.embed());
  a.vocab = c.vocab_size;
  a.d = c.hidden_size;
  a.hc = c.hc_mult;
  a.tokens = in.ids + r.first;
  a.n = r.n;
  a.X = w.X;
  CEDAR_RETURN_IF_ERROR(embed_gather(a, cs()));
  if (w.engram_rows) {  // EngramHasher::hash_chunk with the device history of each row's slot
    EngramHashArgs h;
    h.layout = tables_->engram_layout;
    h.token_map = tables_->engram_map.get();
    h.map_size = static_cast<int64_t>(tables_->engram_map.size());
    h.pad = tables_->engram_pad;
    h.n = r.n;
    h.tokens = in.ids + r.first;
    h.seq = in.slots + r.first;
    h.pos = in.pos + r.first;
    h.recent = w.engram_recent;
    h.next_pos = w.engram_next;
    h.rows = w.engram_rows;
    CEDAR_RETURN_IF_ERROR(engram_hash(h, cs()));
  }
  return mark("embed");
}

namespace {

// engram_gather_quant's arguments for one layer's slot of the step's hashes.
EngramGatherArgs gather_args(const ModelConfig& c, const DeviceEngram& E, const int64_t* rows, int64_t slot, int64_t n,
                             uint16_t* codes, float* scales) {
  const int64_t cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
  EngramGatherArgs g;
  g.n = n;
  g.cols = cols;
  g.head_dim = E.head_dim;
  g.rows = rows + slot * n * cols;
  g.table_rows = E.rows;
  g.bf16_table = !E.table_fp8;
  g.table = E.table;
  g.table_scale = E.table_scale;
  g.codes = codes;
  g.scales = scales;
  return g;
}

}  // namespace

bool CudaModel::engram_ahead_on(const Rows& r) const {
  return options_.paths.engram_ahead && branches(r) && !cur_ && ws_->engram_rows && tables_->engram.get() &&
         r.n <= ws_->engram_ahead_rows;
}

// The gathers and wkv GEMVs of every Engram layer these rows run, on the Engram stream after the hashes
// (embed). The GEMV is the serial path's (gemv_quantized with a split-K workspace of the same size), so
// each layer's kv is the serial path's to the bit.
Status CudaModel::fork_engram(const Rows& r) {
  const ModelConfig& c = config();
  Workspace& w = *ws_;
  Tables& t = *tables_;
  const cudaStream_t s = stream_.get(), e = t.engram.get();
  const int64_t last = r.tail ? plan().num_layers() - 1 : plan().last_kv_source;
  CEDAR_CUDA_RETURN_IF_ERROR(cudaEventRecord(t.engram_fork_ev, s));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(e, t.engram_fork_ev, 0));
  for (int64_t l = 0; l <= last; ++l) {
    const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
    const int64_t slot = t.engram_slot[static_cast<size_t>(l)];
    // No slot: the serial path reports it at the layer. Each slot joins once per call.
    if (!L.engram || slot < 0 || engram_pending_[static_cast<size_t>(slot)]) continue;
    const DeviceEngram& E = *L.engram;
    const size_t si = static_cast<size_t>(slot);
    engram_pending_[si] = true;  // joined even if a launch fails, so a capture in progress ends merged
    Status st =
        engram_gather_quant(gather_args(c, E, w.engram_rows, slot, r.n, w.ahead_codes[si], w.ahead_scales[si]), e);
    // The gather launches without PDL (the first kernel after the fork event, and after the previous
    // layer's GEMV, whose codes buffer it does not share anyway); the GEMV follows it as in qlinear.
    const bool pdl_gemv = pdl_rows_ && options_.paths.programmatic_launch && !profiler_;
    if (st.ok())
      st = gemv_quantized(E.wkv.quant(), w.ahead_codes[si], w.ahead_scales[si], r.n, w.ahead_kv[si], true, e,
                          w.splitk_engram, pdl_gemv);
    const cudaError_t rec = cudaEventRecord(t.engram_done_ev[si], e);
    if (!st.ok()) return st.error().with_context("Engram layer " + str(l) + " (ahead)");
    CEDAR_CUDA_RETURN_IF_ERROR(rec);
    ++engram_ahead_layers_;
  }
  return Status::Ok();
}

Status CudaModel::join_engram(int64_t slot) {
  Status first;
  for (size_t s = 0; s < engram_pending_.size(); ++s) {
    if (!engram_pending_[s] || (slot >= 0 && static_cast<size_t>(slot) != s)) continue;
    engram_pending_[s] = false;
    // After the final join the next kernel depends on the Engram stream too. At a layer the next one is
    // engram_update, which launches without PDL, so the collapse after it keeps its programmatic edge.
    if (slot < 0) pdl_fresh_[0] = true;
    const Status st =
        cuda_status(cudaStreamWaitEvent(stream_.get(), tables_->engram_done_ev[s], 0), "cudaStreamWaitEvent(engram)");
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

// engram_forward: gather + dequant (+ FP8 codes of E), wkv, gated update of the streams. With the
// projection ahead (fork_engram), the wait for it and the update only.
Status CudaModel::engram(int64_t l, const Rows& r) {
  const ModelConfig& c = config();
  Workspace& w = *ws_;
  const DeviceEngram& E = *weights_.layers()[static_cast<size_t>(l)].engram;
  const int64_t slot = tables_->engram_slot[static_cast<size_t>(l)];
  if (slot < 0 || !w.engram_rows) return make_error("Engram layer " + str(l) + " has no hash slot");
  const float* kv = w.y;
  if (engram_pending_[static_cast<size_t>(slot)]) {
    CEDAR_RETURN_IF_ERROR(join_engram(slot));
    kv = w.ahead_kv[static_cast<size_t>(slot)];
  } else {
    CEDAR_RETURN_IF_ERROR(
        engram_gather_quant(gather_args(c, E, w.engram_rows, slot, r.n, w.e_codes, w.e_scales), cs()));
    CEDAR_RETURN_IF_ERROR(qlinear(E.wkv, w.e_codes, w.e_scales, r.n, w.y));
  }
  EngramUpdateArgs u;
  u.n = r.n;
  u.hc = c.hc_mult;
  u.d = c.hidden_size;
  u.X = w.X;
  u.kv = kv;
  u.qk = E.qk.data;
  u.norm_eps = static_cast<float>(c.rms_norm_eps);
  CEDAR_RETURN_IF_ERROR(engram_update(u, cs()));
  CEDAR_RETURN_IF_ERROR(debug("layers." + str(l) + ".engram_out", r, w.X, c.hc_mult * c.hidden_size));
  return mark("engram", E.wkv.bytes());
}

// Attention site: [expand of the previous ffn output] → [Engram] → collapse with pre_prev, the site's
// coefficients → attn_norm.
Status CudaModel::attention_site(int64_t l, const Rows& r) {
  CEDAR_RETURN_IF_ERROR(join_coefficients());  // the previous site's mix rows; the streams are rewritten
  const ModelConfig& c = config();
  const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
  Workspace& w = *ws_;
  MhcFusedArgs a = mhc_args(c, L.hc_attn, r.n, w.X);
  MixPtrs prev{w.e0, nullptr, nullptr, 0};
  // The previous layer's ffn output, expanded with its site's post / comb; collapse with its pre.
  if (l > 0) {
    prev = mix_rows(w.mix_ffn);
    set_expand(a, w.y, prev);
    a.y_combine = take_combine();  // paths.site_combine: y combined by the kernel that expands it
  }
  if (L.engram) {
    // Engram changes the streams between the expand and this site's collapse and coefficients: the
    // expand alone first (no coefficients: fn = null), Engram, then collapse + coefficients.
    if (a.y) {
      MhcFusedArgs expand = a;
      expand.fn = nullptr;
      expand.mix_out = nullptr;
      CEDAR_RETURN_IF_ERROR(mhc(&expand, r));
    }
    CEDAR_RETURN_IF_ERROR(engram(l, r));
    a.y = nullptr;
    a.y_combine = {};
  }
  set_collapse(a, prev, w.x);
  a.mix_out = w.mix_attn;
  CEDAR_RETURN_IF_ERROR(site_norm(&a, r, L.attn_norm));
  return mark("mhc + norm", L.hc_attn.fn.size * 4);
}

// attention_forward (model/attention.cpp) for the rows of one call.
Status CudaModel::attention(int64_t l, const Rows& r) {
  const ModelConfig& c = config();
  const LayerPlan& p = plan();
  const LayerRole& role = p.layers[static_cast<size_t>(l)];
  const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
  Workspace& w = *ws_;
  const StepInputs& in = r.decode ? w.decode_in : w.prefill_in;
  const int64_t n = r.n, d = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const bool boundary = l == p.last_kv_source;
  // SWA truncation (§3.11): decoder layers of tail rows see keys from the replay start on; the boundary
  // only under GlobalKvOnly. The three row arrays differ in swa_start only (0 for exact sequences).
  const AttnToken* tok = (r.tail && p.last_kv_source >= 0 && l > p.last_kv_source) ? in.tok_dec
                         : (r.tail && boundary)                                    ? in.tok_bnd
                                                                                   : in.tok_exact;
  tok += r.first;
  const RopeTableView rope = role.compress_ratio > 0 ? tables_->rope_compress_view : tables_->rope_main_view;
  // Calls the decode kernel takes: it rotates q while loading it, so the query path skips rope_apply.
  const bool q_rope_in_attention =
      options_.paths.fused_q_rope && sparse_attention_decode_fits(n, H, hd, kv_.geometry().swa_slots,
                                                                  role.compress_ratio > 0 ? c.index_topk : 0, w.sparse);

  // Global KV first (the chunk's complete groups), as attention_forward.
  const bool compress = role.owns_compressor && role.compress_ratio > 0;
  if (!r.tail && boundary && r.global_kv_only_boundary) {  // AttentionPass::GlobalKvOnly
    return compress ? compressor(l, r) : Status::Ok();
  }

  // The staged records are rewritten below (swa_kv_encode): a previous layer's commit must have read them
  // (joined at its ffn site already; this keeps the order if a layer ever returns before its ffn site).
  CEDAR_RETURN_IF_ERROR(join_swa_commit());
  // x's FP8 codes serve wq_a and wkv (written by the site norm with paths.site_act_quant), qr's wq_b
  // and the indexer's wq_b (written by q_norm with paths.fused_act_quant).
  if (!fold_act_quant(n, d, true)) CEDAR_RETURN_IF_ERROR(quantize(w.xn, n, d, w.act_a, w.act_a_scales));
  const bool qr_codes_in_norm = fold_act_quant(n, c.q_lora_rank, false);
  const ActQuantOut qr_codes{w.act_b, w.act_b_scales};
  // Decode: matrices that read the same codes share one launch (gemv_quantized_multi): wq_a + wkv
  // before the branches, wq_b + the indexer's wq_b on index-source layers.
  const bool multi = options_.paths.gemv_multi && n <= options_.paths.gemv_max_rows;
  const bool multi_qb = multi && role.compress_ratio > 0 && role.owns_indexer && L.wq_b_i.present();
  if (multi) {
    const QuantWeightView mats[2] = {L.wq_a.quant(), L.wkv.quant()};
    const GemvGroupItem items[2] = {{L.wq_a.data, L.wq_a.scales, w.act_a, w.act_a_scales, w.qr},
                                    {L.wkv.data, L.wkv.scales, w.act_a, w.act_a_scales, w.kvw}};
    CEDAR_RETURN_IF_ERROR(gemv_quantized_multi(mats, items, 2, n, true, cs(), splitk(), pdl()));
    CEDAR_RETURN_IF_ERROR(mark("attn.wq_a+wkv", L.wq_a.bytes() + L.wkv.bytes()));
  }
  SwaKvArgs sk;
  sk.kv = w.kvw;
  sk.norm_weight = L.kv_norm.data;
  sk.eps = eps;
  sk.n = n;
  sk.head_dim = hd;
  sk.tokens = tok;
  sk.rope = rope;
  sk.records = w.chunk_records;
  // paths.q_norm_kv_encode: where the keys branch would be the encode alone, q_norm and the encode share a
  // launch on the main stream (no fork: on the aux stream the encode waited for wq_b's blocks to drain).
  // Where the branches run (decode, not profiling: the serial path keeps its per-stage marks).
  // (One GEMV tile at most: the fused launch is not established above it.)
  const bool q_norm_kv = options_.paths.q_norm_kv_encode && multi && n <= kGemvMaxRows && !compress && branches(r);
  // Query path: qr = RMSNorm_q(wq_a·x); q = RoPE(wq_b·qr).
  auto query = [&]() -> Status {
    if (!multi) CEDAR_RETURN_IF_ERROR(qlinear(L.wq_a, w.act_a, w.act_a_scales, n, w.qr));
    if (q_norm_kv) {
      QNormArgs qa;
      qa.x = w.qr;
      qa.dim = c.q_lora_rank;
      qa.weight = L.q_norm.data;
      qa.eps = eps;
      qa.y = w.qr;
      if (qr_codes_in_norm) qa.quant = qr_codes;
      CEDAR_RETURN_IF_ERROR(q_norm_swa_kv_encode(qa, sk, cs(), pdl()));
      ++q_norm_kv_layers_;
    } else {
      CEDAR_RETURN_IF_ERROR(norm(w.qr, n, c.q_lora_rank, L.q_norm, w.qr, qr_codes_in_norm ? &qr_codes : nullptr));
    }
    if (!qr_codes_in_norm) CEDAR_RETURN_IF_ERROR(quantize(w.qr, n, c.q_lora_rank, w.act_b, w.act_b_scales));
    if (multi_qb) {
      const QuantWeightView mats[2] = {L.wq_b.quant(), L.wq_b_i.quant()};
      const GemvGroupItem items[2] = {{L.wq_b.data, L.wq_b.scales, w.act_b, w.act_b_scales, w.q},
                                      {L.wq_b_i.data, L.wq_b_i.scales, w.act_b, w.act_b_scales, w.qi}};
      CEDAR_RETURN_IF_ERROR(gemv_quantized_multi(mats, items, 2, n, true, cs(), splitk(), pdl()));
    } else {
      CEDAR_RETURN_IF_ERROR(qlinear(L.wq_b, w.act_b, w.act_b_scales, n, w.q));
    }
    if (!q_rope_in_attention) {
      RopeApplyArgs ra;
      ra.x = w.q;
      ra.rows = n;
      ra.n_vec = H;
      ra.width = hd;
      ra.tokens = tok;
      CEDAR_RETURN_IF_ERROR(rope_apply(rope, ra, cs()));
    }
    return mark("attn.q", (multi ? 0 : L.wq_a.bytes()) + L.wq_b.bytes() + (multi_qb ? L.wq_b_i.bytes() : 0));
  };
  // The compressor's global KV and the layer's own SWA KV: FP8-QDQ(RoPE(RMSNorm_kv(wkv·x))) as staged
  // ring records (independent of the query path: a second branch in decode).
  auto keys = [&]() -> Status {
    if (compress) CEDAR_RETURN_IF_ERROR(compressor(l, r));
    if (!multi) CEDAR_RETURN_IF_ERROR(qlinear(L.wkv, w.act_a, w.act_a_scales, n, w.kvw));
    CEDAR_RETURN_IF_ERROR(swa_kv_encode(sk, cs()));
    return mark("attn.kv", multi ? 0 : L.wkv.bytes());
  };
  if (q_norm_kv) {
    CEDAR_RETURN_IF_ERROR(query());
  } else {
    CEDAR_RETURN_IF_ERROR(parallel(branches(r), query, keys, !compress || options_.paths.fork_pdl_compressor));
  }

  // Compressed entries: the index source's top-k of this call.
  const int32_t* topk = nullptr;
  if (role.compress_ratio > 0) {
    if (role.owns_indexer) CEDAR_RETURN_IF_ERROR(indexer(l, r, multi_qb));
    topk = w.topk[static_cast<size_t>(role.index_source)];
    if (!topk) return make_error("index source layer " + str(role.index_source) + " has no top-k buffer");
    topk += r.first * c.index_topk;
  }
  const int64_t slots = kv_.geometry().swa_slots;
  SparseAttnArgs sa;
  sa.n = n;
  sa.heads = H;
  sa.head_dim = hd;
  sa.window = slots;
  sa.q = w.q;
  sa.sink = L.attn_sink.data;
  sa.scale = tables_->attn_scale;
  sa.bf16_probabilities = tables_->bf16_probabilities;
  sa.tokens = tok;
  sa.chunk_records = w.chunk_records;
  sa.rings = tables_->rings[static_cast<size_t>(l)].get();
  sa.topk = topk;
  sa.topk_width = topk ? c.index_topk : 0;
  sa.kv_seqs = topk ? tables_->sources[static_cast<size_t>(role.kv_source)].get() : nullptr;
  sa.rope = rope;
  sa.out = w.o;
  sa.q_before_rope = q_rope_in_attention;
  sa.decode_head_split = options_.paths.attn_head_split;
  sa.decode_merge_trigger = options_.paths.attn_merge_trigger;
  // paths.attn_stage_wo_a: o's f16 staging for the staged wo_a GEMV written with o (act_b: qr's codes are
  // dead once the attention read q).
  const int64_t wo_a_in = H * hd / c.o_groups;
  // (The decode merge writes it up to one GEMV tile of rows; above, gemv_fp8_staged stages o itself.)
  const bool stage_in_attention = options_.paths.attn_stage_wo_a && n <= kGemvMaxRows &&
                                  staged_wo_a(L.wo_a, n, c.o_groups, c.o_lora_rank, wo_a_in);
  if (stage_in_attention) {
    sa.out_f16_codes = w.act_b;
    sa.out_f16_scales = w.act_b_scales;
  }
  CEDAR_RETURN_IF_ERROR(sparse_attention(sa, cs(), w.sparse));
  CEDAR_RETURN_IF_ERROR(mark("attn.sparse"));
  // The ring is written after attending (the chunk's own keys came from the staged records). Nothing
  // later in the layer reads the ring or writes the staged records: with paths.swa_commit_aside the
  // commit runs on the aux stream beside wo_a / wo_b, joined at the ffn site (before the next layer's
  // swa_kv_encode rewrites chunk_records; the next step's attention comes later still).
  SwaRingCommitArgs rc;
  rc.records = w.chunk_records;
  rc.n = n;
  rc.record_bytes = swa_record_bytes(hd);
  rc.tokens = tok;
  rc.rings = tables_->rings[static_cast<size_t>(l)].get();
  rc.slots = slots;
  if (options_.paths.swa_commit_aside && branches(r) && !cur_) {
    const cudaStream_t s = stream_.get(), a = tables_->aux.get();
    CEDAR_CUDA_RETURN_IF_ERROR(cudaEventRecord(tables_->swa_fork_ev, s));
    CEDAR_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(a, tables_->swa_fork_ev, 0));
    swa_commit_pending_ = true;  // joined even if the launch fails, so a capture in progress ends merged
    const Status st = swa_ring_commit(rc, a);
    const cudaError_t e = cudaEventRecord(tables_->swa_done_ev, a);
    CEDAR_RETURN_IF_ERROR(st);
    CEDAR_RETURN_IF_ERROR(cuda_status(e, "cudaEventRecord(swa commit)"));
  } else {
    CEDAR_RETURN_IF_ERROR(swa_ring_commit(rc, cs()));
  }

  // out = wo_b · concat_g(wo_a[g] · o_g) (attention_output_projection).
  DenseCall oa;
  oa.w = &L.wo_a;
  oa.out = c.o_lora_rank;
  oa.in = wo_a_in;
  oa.groups = c.o_groups;
  oa.x = w.o;
  oa.y = w.u;
  oa.n = n;
  oa.x_staged = stage_in_attention;
  CEDAR_RETURN_IF_ERROR(dense(oa));
  CEDAR_RETURN_IF_ERROR(quantize(w.u, n, c.o_groups * c.o_lora_rank, w.act_a, w.act_a_scales));
  CEDAR_RETURN_IF_ERROR(qlinear(L.wo_b, w.act_a, w.act_a_scales, n, w.y));
  return mark("attn.out", L.wo_a.bytes() + L.wo_b.bytes());
}

// FFN site: expand the attention output, collapse with the attention site's pre, the ffn coefficients.
Status CudaModel::ffn_site(int64_t l, const Rows& r) {
  CEDAR_RETURN_IF_ERROR(join_coefficients());
  CEDAR_RETURN_IF_ERROR(join_swa_commit());  // the layer's ring commit (the same PDL break as the join above)
  const ModelConfig& c = config();
  const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
  Workspace& w = *ws_;
  const MixPtrs m = mix_rows(w.mix_attn);
  MhcFusedArgs a = mhc_args(c, L.hc_ffn, r.n, w.X);
  set_expand(a, w.y, m);
  set_collapse(a, m, w.x);
  a.mix_out = w.mix_ffn;
  CEDAR_RETURN_IF_ERROR(site_norm(&a, r, L.ffn_norm));
  return mark("mhc + norm", L.hc_ffn.fn.size * 4);
}

// finish_rows: the last ffn output expanded into the streams, then (final_head) the collapse with that
// site's pre, the final RMSNorm, the fp32 head over the logit rows, and argmax.
Status CudaModel::finish(const Rows& r) {
  CEDAR_RETURN_IF_ERROR(join_coefficients());
  const ModelConfig& c = config();
  Workspace& w = *ws_;
  const cudaStream_t s = cs();
  const DeviceLayer& last = weights_.layers().back();
  const MixPtrs m = mix_rows(w.mix_ffn);
  MhcFusedArgs a = mhc_args(c, last.hc_ffn, r.n, w.X);  // expand only: no coefficients after the last layer
  set_expand(a, w.y, m);
  a.y_combine = take_combine();
  a.fn = nullptr;
  a.mix_out = nullptr;
  CEDAR_RETURN_IF_ERROR(mhc(&a, r));
  if (r.logits == LogitRows::None) return mark("final expand");
  const int64_t first = r.logits == LogitRows::Last ? r.n - 1 : 0, rows = r.n - first;
  if (rows > w.logit_rows) return make_error("finish: " + str(rows) + " logit rows exceed " + str(w.logit_rows));
  // final_head reads pre packed [rows, hc]: one row is its mix row; more rows are copied out of theirs.
  const float* pre = m.pre + first * kMixWidth;
  if (rows > 1) {
    const size_t row = static_cast<size_t>(c.hc_mult) * sizeof(float);
    CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(w.final_pre, row, pre, kMixWidth * sizeof(float), row,
                                                 static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, s));
    pre = w.final_pre;
  }
  FinalHeadArgs h;
  h.n = rows;
  h.hc = c.hc_mult;
  h.d = c.hidden_size;
  h.vocab = c.vocab_size;
  h.X = w.X + first * c.hc_mult * c.hidden_size;
  h.pre = pre;
  h.norm_weight = weights_.final_norm().data;
  h.norm_eps = static_cast<float>(c.rms_norm_eps);
  h.head = bf16_bits(weights_.head());
  h.x = w.x;
  h.logits = w.logits;
  h.splitk = splitk();
  CEDAR_RETURN_IF_ERROR(final_head(h, s));
  CEDAR_RETURN_IF_ERROR(argmax_rows(w.logits, rows, c.vocab_size, w.argmax, s));
  return mark("head + argmax", weights_.head().bytes());
}

// ---- profiling -------------------------------------------------------------------------------------

// Stage times of the last profiled call: the interval before each event goes to that event's stage.
Result<std::vector<StageTime>> CudaModel::collect_profile(double* total_us) {
  Profiler& p = *profiler_;
  std::vector<StageTime> stages;
  double total = 0;
  for (size_t i = 1; i < p.used; ++i) {
    float ms = 0;
    const cudaError_t e = cudaEventElapsedTime(&ms, p.events[i - 1], p.events[i]);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return cuda_status(e, "cudaEventElapsedTime(profile)").error();
    }
    total += 1e3 * ms;
    auto it = std::find_if(stages.begin(), stages.end(), [&](const StageTime& s) { return s.stage == p.labels[i]; });
    if (it == stages.end()) it = stages.insert(stages.end(), StageTime{p.labels[i], 0, 0, 0});
    it->us += 1e3 * ms;
    it->weight_bytes += p.bytes[i];
    ++it->calls;
  }
  if (total_us) *total_us = total;
  std::sort(stages.begin(), stages.end(), [](const StageTime& a, const StageTime& b) { return a.us > b.us; });
  return stages;
}

Result<std::vector<StageTime>> CudaModel::profile_decode_step(std::span<CudaSequence* const> seqs,
                                                              std::span<const int64_t> tokens, CudaStepOutput& out,
                                                              double* step_us) {
  Profiler p;
  p.graph = options_.cuda_graphs;
  p.events.resize(4096);
  for (cudaEvent_t& e : p.events) CEDAR_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  for (int attempt = 0; attempt < 2; ++attempt) {
    p.used = 0;
    p.labels.clear();
    p.bytes.clear();
    profiler_ = &p;
    Status st = decode_step(seqs, tokens, out);
    Result<std::vector<StageTime>> stages =
        st.ok() ? collect_profile(step_us) : Result<std::vector<StageTime>>(st.error());
    profiler_ = nullptr;
    CEDAR_RETURN_IF_ERROR(st);
    if (stages.ok() || !p.graph) return stages;
    p.graph = false;  // events in graphs did not time here: one more step, launched directly
  }
  return make_error("profile: CUDA events gave no timings");
}

Result<std::vector<StageTime>> CudaModel::profile_prefill(CudaSequence& seq, std::span<const int64_t> tokens,
                                                          double* total_us) {
  Profiler p;
  p.graph = false;
  p.events.resize(4096);
  for (cudaEvent_t& e : p.events) CEDAR_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  profiler_ = &p;
  CudaStepOutput out;
  const Status st = prefill(seq, tokens, LogitRows::Last, out);
  Result<std::vector<StageTime>> stages =
      st.ok() ? collect_profile(total_us) : Result<std::vector<StageTime>>(st.error());
  profiler_ = nullptr;
  return stages;
}

}  // namespace cedar::cuda
