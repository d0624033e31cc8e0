// Internals shared by cuda_model.cpp (load, sequences, steps) and cuda_model_layers.cpp / _moe.cpp (the layer
// loop): the activation workspace, the step inputs and the per-layer descriptor tables. Host-side C++20.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/gemm_kernels.h"
#include "backend/cuda/kernels.h"

namespace cedar::cuda {

inline constexpr int64_t kMixWidth = 24;  // pre[4], post[4], comb[16] per token (hc = 4)

// Per-row inputs of one call, struct of arrays with `capacity` rows. Two regions: decode (capacity
// max_batch, uploaded as one block per step) and prefill (capacity max_chunk, the used rows only).
struct StepInputs {
  int64_t capacity = 0;
  int32_t* ids = nullptr;    // token ids
  int32_t* slots = nullptr;  // KV slot of the row's sequence (AttnToken::seq, Engram history index)
  int64_t* pos = nullptr;    // absolute positions
  // Attention rows: exact (swa_start 0), decoder (swa_start = the CED replay start of CED sequences),
  // boundary (swa_start = replay start only for CED sequences with the GlobalKvOnly boundary).
  AttnToken* tok_exact = nullptr;
  AttnToken* tok_dec = nullptr;
  AttnToken* tok_bnd = nullptr;
  uint8_t* block = nullptr;  // the region's first byte (all arrays are inside [block, block + bytes))
  uint64_t bytes = 0;
  uint8_t* staging = nullptr;  // pinned host mirror of the block (same offsets)
};

struct CudaModel::Workspace {
  int64_t rows = 0, logit_rows = 0;
  DeviceBuffer<uint8_t> slab;
  uint8_t* pinned = nullptr;  // host staging of both step-input regions
  StepInputs decode_in, prefill_in;
  // Streams and sublayer I/O.
  float *X = nullptr, *x = nullptr, *xn = nullptr, *y = nullptr;
  // mHC mix rows [rows, 24] (pre, post, comb of each row; the next site reads them in place by stride).
  float *mix_attn = nullptr, *mix_ffn = nullptr;
  float* e0 = nullptr;         // [rows, hc]: e_0, the collapse weights before layer 0
  float* final_pre = nullptr;  // [rows, hc]: the last site's pre, packed for final_head (rows > 1)
  // Activation quantization (two buffers: an input reused by several linears stays quantized).
  uint16_t *act_a = nullptr, *act_b = nullptr;
  float *act_a_scales = nullptr, *act_b_scales = nullptr;
  int64_t act_capacity = 0;  // values per buffer
  // Attention.
  float *qr = nullptr, *q = nullptr, *kvw = nullptr, *o = nullptr, *u = nullptr;
  uint8_t* chunk_records = nullptr;  // [rows, swa record]
  float *comp_kv = nullptr, *comp_gate = nullptr, *latent = nullptr, *index_k = nullptr;
  float *qi = nullptr, *w_raw = nullptr, *iw = nullptr, *q_scales = nullptr;
  uint16_t* q_codes = nullptr;
  float* index_scores = nullptr;  // [rows, max_slots]
  int64_t max_slots_cap = 0;
  void* select_ws = nullptr;
  int64_t select_ws_bytes = 0;
  int32_t* cand_blocks = nullptr;  // [rows, candidate_topk_blocks]
  std::vector<int32_t*> topk;      // per layer: [rows, index_topk] (index sources), else null
  SparseAttnWorkspace sparse;
  // MoE.
  float *router_logits = nullptr, *route_w = nullptr;
  std::vector<int32_t*> experts;  // per layer: [rows, topk]
  SplitKWorkspace router_ws;      // router_workspace_size: split-K logits, the fused launch's ticket
  int64_t items_rows = 0;         // rows the item-table path (routed GEMVs) is sized for
  int64_t gemv_rows = 0;          // rows the shared expert's GEMV path (sg, su) is sized for
  DeviceGemvItem *items13 = nullptr, *items2 = nullptr;
  int32_t* item_counts = nullptr;
  unsigned* item_work = nullptr;  // 2 × GemvItemsOptions::work (w1/w3, w2): zero, re-armed by the kernels
  float *g = nullptr, *gu = nullptr, *routed = nullptr;  // item path: [items_rows·topk, inter] / [.., d]
  uint16_t* h_codes = nullptr;                           // [rows·topk, inter]
  float* h_scales = nullptr;
  uint16_t* y_rows = nullptr;  // [rows·topk, d] bf16 (GEMM path)
  MoePermutation perm;
  float *sg = nullptr, *su = nullptr, *shared = nullptr;  // shared expert
  uint16_t* sh_codes = nullptr;
  float* sh_scales = nullptr;
  // Engram.
  int64_t* engram_rows = nullptr;  // [slots, rows, cols]
  uint16_t* e_codes = nullptr;
  float* e_scales = nullptr;
  int32_t* engram_recent = nullptr;  // [max_sequences, N − 1]
  int64_t* engram_next = nullptr;    // [max_sequences]
  // paths.engram_ahead (decode, <= ahead_rows rows): per Engram slot the gather's codes / scales and the
  // wkv output [ahead_rows, (hc+1)·d], and the Engram stream's split-K scratch.
  int64_t engram_ahead_rows = 0;
  std::vector<uint16_t*> ahead_codes;
  std::vector<float*> ahead_scales, ahead_kv;
  SplitKWorkspace splitk_engram;
  // Split-K / mHC / GEMM / cuBLAS scratch.
  SplitKWorkspace splitk, splitk_aux;  // the aux stream's GEMVs have their own
  MhcWorkspace mhc, mhc_legacy;        // sized (all tiles in one launch, streaming) / the same memory, legacy contract
  QuantGemmWorkspace gemm;             // + the cuBLASLt path's bf16 scratch (dequantized weights, activations)
  float* blas_gu = nullptr;            // swiglu_gemm's cuBLASLt path: fp32 g / u
  int64_t blas_gu_floats = 0;
  uint16_t* dense_x = nullptr;
  int64_t dense_x_elems = 0;
  // Head.
  float* logits = nullptr;
  int32_t* argmax = nullptr;
  ~Workspace() {
    if (pinned) cudaFreeHost(pinned);
  }
};

// Device descriptor tables indexed by KV slot, built once (a captured graph keeps their addresses).
struct CudaModel::Tables {
  std::vector<DeviceBuffer<SwaRingDesc>> rings;    // per layer
  std::vector<DeviceBuffer<KvSourceSeq>> sources;  // per layer (KV sources only; else empty)
  DeviceBuffer<float> rope_main, rope_compress;    // [max_context, rope_dim]
  RopeTableView rope_main_view, rope_compress_view;
  DeviceBuffer<int64_t> engram_hash_table;
  EngramHashTables engram_layout;
  DeviceBuffer<int32_t> engram_map;
  int32_t engram_pad = 0;
  std::vector<int64_t> engram_slot;  // per layer, −1 without Engram
  std::unique_ptr<BlasContext> blas;
  std::string blas_error;
  bool mhc_cluster = false;
  float attn_scale = 0;
  bool index_reference = true, bf16_probabilities = true;
  // Concurrent branches of a decode step.
  Stream aux;
  cudaEvent_t fork_ev = nullptr, join_ev = nullptr;
  cudaEvent_t shared_late_ev = nullptr;  // the routed w1 / w3 done: the shared w2 may start (paths.shared_w2_late)
  // The SWA ring commit beside wo_a / wo_b (paths.swa_commit_aside), on the aux stream.
  cudaEvent_t swa_fork_ev = nullptr, swa_done_ev = nullptr;
  // The mHC coefficients beside the sublayer (paths.mhc_split).
  Stream coef;
  cudaEvent_t coef_fork_ev = nullptr, coef_done_ev = nullptr;
  // The Engram projections ahead of the layers (paths.engram_ahead): one done event per Engram slot.
  Stream engram;
  cudaEvent_t engram_fork_ev = nullptr;
  std::vector<cudaEvent_t> engram_done_ev;
  ~Tables() {
    if (engram_fork_ev) cudaEventDestroy(engram_fork_ev);
    for (cudaEvent_t e : engram_done_ev)
      if (e) cudaEventDestroy(e);
    if (fork_ev) cudaEventDestroy(fork_ev);
    if (swa_fork_ev) cudaEventDestroy(swa_fork_ev);
    if (swa_done_ev) cudaEventDestroy(swa_done_ev);
    if (join_ev) cudaEventDestroy(join_ev);
    if (shared_late_ev) cudaEventDestroy(shared_late_ev);
    if (coef_fork_ev) cudaEventDestroy(coef_fork_ev);
    if (coef_done_ev) cudaEventDestroy(coef_done_ev);
  }
};

// Events after every stage of one decode step (profile_decode_step).
struct CudaModel::Profiler {
  bool graph = true;  // events recorded as nodes of the step's graph (else a direct run)
  std::vector<cudaEvent_t> events;
  std::vector<std::string> labels;
  std::vector<uint64_t> bytes;
  size_t used = 0;
  ~Profiler() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
};

// Carves typed arrays from a slab; with base == nullptr it only sums the bytes (the plan).
class Carver {
 public:
  explicit Carver(uint8_t* base, DeviceMemoryPlan* plan) : base_(base), plan_(plan) {}
  template <typename T>
  T* take(const char* component, int64_t count) {
    const uint64_t bytes = static_cast<uint64_t>(count > 0 ? count : 0) * sizeof(T);
    if (plan_) plan_->add(component, bytes, false, "rows");
    T* p = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ = (offset_ + bytes + 255) / 256 * 256;
    return p;
  }
  uint64_t bytes() const { return offset_; }

 private:
  uint8_t* base_;
  DeviceMemoryPlan* plan_;
  uint64_t offset_ = 0;
};

// One dense projection of the layer loop (CudaModel::dense): FP8 / MXFP4 GEMV or GEMM, or bf16 / fp32.
struct CudaModel::DenseCall {
  const DeviceMatrix* w = nullptr;
  int64_t out = 0, in = 0, groups = 1;  // per group; groups share x's and y's rows (wo_a)
  const float* x = nullptr;
  float* y = nullptr;
  int64_t n = 0;
  bool bf16_output = true;
  bool x_staged = false;  // the staged wo_a path's f16 codes of x are in act_b already (paths.attn_stage_wo_a)
};

// Small helpers of the layer loop's files (cuda_model_layers.cpp, cuda_model_keys.cpp, cuda_model_moe.cpp).
namespace model_detail {
inline std::string str(int64_t v) { return std::to_string(v); }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline const uint16_t* bf16_bits(const DeviceMatrix& m) { return reinterpret_cast<const uint16_t*>(m.data); }
inline QuantWeightFormat quant_format(const DeviceMatrix& m) {
  return m.format == DeviceFormat::Mxfp4 ? QuantWeightFormat::MXFP4 : QuantWeightFormat::FP8Block;
}
}  // namespace model_detail

template <typename Main, typename Aux>
Status CudaModel::parallel(bool on, Main&& main, Aux&& aux, bool main_critical) {
  if (!on) {
    CEDAR_RETURN_IF_ERROR(aux());
    return main();
  }
  const cudaStream_t s = stream_.get(), a = tables_->aux.get();
  // The aux stream's first kernel after the fork and the main stream's after the join depend on the other
  // stream too: launched without PDL (a programmatic edge expresses a dependency on one same-stream
  // predecessor). The main stream's first kernel after the fork depends on its own stream only
  // (paths.fork_pdl keeps its edge programmatic where main is the critical branch).
  pdl_fresh_[1] = true;
  if (!options_.paths.fork_pdl || !main_critical) pdl_fresh_[0] = true;
  CEDAR_CUDA_RETURN_IF_ERROR(cudaEventRecord(tables_->fork_ev, s));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(a, tables_->fork_ev, 0));
  cur_ = a;
  const Status sa = aux();
  cur_ = nullptr;
  const Status sm = sa.ok() ? main() : Status::Ok();
  // Join even after an error, so that a capture in progress ends with every branch merged.
  const cudaError_t e1 = cudaEventRecord(tables_->join_ev, a);
  const cudaError_t e2 = cudaStreamWaitEvent(s, tables_->join_ev, 0);
  pdl_fresh_[0] = pdl_fresh_[1] = true;
  CEDAR_RETURN_IF_ERROR(sa);
  CEDAR_RETURN_IF_ERROR(sm);
  CEDAR_CUDA_RETURN_IF_ERROR(e1);
  return cuda_status(e2, "cudaStreamWaitEvent(join)");
}

}  // namespace cedar::cuda
