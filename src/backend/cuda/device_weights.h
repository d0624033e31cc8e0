// A loaded checkpoint's weights (model/weight_binding.h BoundWeights) on the GPU, in the layouts the
// kernels take, with a memory plan (bytes per component) computed before anything is allocated.
// Host-side C++20 (included from .cpp files only; the views it hands out are plain device pointers).
//
// Layouts (every pointer is device memory, or mapped pinned host memory where the plan says "host"):
//   * FP8 block weights: e4m3 [out, in] + UE8M0 scales [ceil(out/bo), ceil(in/bi)] as stored
//     (QuantWeightView, kernels.h); MXFP4 experts: packed e2m1 [out, in/2] + UE8M0 [out, in/32].
//   * BF16 weights as stored (head, embedding, compressor, indexer keys, weights_proj); the router
//     [E, d] as BF16 (the CPU binding widens it to fp32; the values are bf16, so it is exact);
//   * wo_a as BF16 values (what the reference computes with after convert.py; 2 B / parameter) or,
//     with DeviceWeightOptions::wo_a_fp8, as stored FP8 + scales for a kernel that dequantizes in
//     registers (1 B / parameter: −1.34 GB per decode token on the perf model);
//   * fp32: norms, mHC fn / base / scale, attention sinks, router bias, Engram q ⊙ k;
//   * routed experts: per layer, each matrix kind (w1, w3, w2 data, then scales) of all experts in one
//     contiguous run — expert e's w1 at experts.w1.data + e · data_stride[kW1] — so a device-side
//     expert table (the router's ids) addresses them without host pointers (graph-capturable); per
//     kind, device arrays of the experts' data / scale pointers as well (ExpertWeightTable). MXFP4
//     data is optionally repacked at upload (DeviceWeightOptions::repack_mxfp4).
//   * Engram tables: FP8 rows + UE8M0 scales in HBM, or (engram_tables_in_host) in pinned mapped
//     host memory read over PCIe (the released tables are 2 × 101 GB).
// Not uploaded: gate.bias_vl (image tokens only), DSpark blocks, vision.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/status.h"
#include "core/threads.h"
#include "io/config.h"
#include "model/layer_plan.h"
#include "model/weight_binding.h"

namespace cedar::cuda {

enum class DeviceFormat { Bf16, F32, Fp8Block, Mxfp4 };
std::string_view device_format_name(DeviceFormat f);

// One linear weight, logical [out, in].
struct DeviceMatrix {
  DeviceFormat format = DeviceFormat::Bf16;
  int64_t out = 0, in = 0;
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;        // Fp8Block / Mxfp4
  int64_t block_out = 32, block_in = 32;  // Fp8Block
  // Fp8Block: no NaN code and every scale in [20, 142] (fp8_weight_fast, checked at upload; set for
  // wo_a as stored): gemv_bf16 may skip its per-chunk check.
  bool fp8_fast = false;
  bool present() const { return data != nullptr; }
  uint64_t data_bytes() const;
  uint64_t scale_bytes() const;
  uint64_t bytes() const { return data_bytes() + scale_bytes(); }
  // For gemv_quantized / linear_quantized (Fp8Block and Mxfp4 only).
  QuantWeightView quant() const;
};

struct DeviceVector {
  const float* data = nullptr;
  int64_t size = 0;
};

struct DeviceHc {
  DeviceVector fn, base, scale;  // [(2+hc)·hc, hc·d], [(2+hc)·hc], [3]
};

struct DeviceExperts {
  enum Kind { kW1 = 0, kW3 = 1, kW2 = 2 };
  int64_t count = 0;
  DeviceMatrix first[3];               // expert 0's w1, w3, w2
  int64_t data_stride[3] = {0, 0, 0};  // bytes from expert e to e + 1
  int64_t scale_stride[3] = {0, 0, 0};
  // Device arrays [count] of each kind's per-expert pointers (ffn_kernels.h ExpertWeightTable).
  const uint8_t* const* data_table[3] = {nullptr, nullptr, nullptr};
  const uint8_t* const* scale_table[3] = {nullptr, nullptr, nullptr};
  bool repacked = false;  // MXFP4 data went through DeviceWeightOptions::repack_mxfp4
  // Every expert's MXFP4 scale bytes passed DeviceWeightOptions::mxfp4_scale_check (false without one).
  bool scales_checked = false;
  // With repack and keep_plain_mxfp4: the checkpoint's plain bytes as well (the prefill GEMMs read the plain
  // layout); device arrays [count] per kind; the scales are shared (repacking leaves them unchanged).
  const uint8_t* const* plain_data_table[3] = {nullptr, nullptr, nullptr};
  // With DeviceWeightOptions::tile_mxfp4: each expert's tile-layout buffer; device arrays [count] per kind.
  const uint8_t* const* tile_table[3] = {nullptr, nullptr, nullptr};
  DeviceMatrix matrix(int64_t expert, Kind kind) const;
};

struct DeviceEngram {
  const uint8_t* table = nullptr;        // FP8Rows: e4m3 [rows, head_dim]; BF16 checkpoints: bf16 rows
  const uint8_t* table_scale = nullptr;  // UE8M0 [rows, head_dim / 32] (FP8Rows)
  bool table_fp8 = true;
  bool table_in_host = false;  // pinned mapped host memory (device-accessible pointer)
  int64_t rows = 0, head_dim = 0;
  DeviceMatrix wkv;                 // [(hc+1)·d, cols·head_dim]
  // [hc, d] q_weight ⊙ k_weight in fp32 (exact: products of bf16 values), the only form the gate uses
  // (ffn_kernels.h engram_update); q_weight and k_weight themselves are not uploaded.
  DeviceVector qk;
};

struct DeviceLayer {
  DeviceVector attn_norm, ffn_norm;
  DeviceHc hc_attn, hc_ffn;
  DeviceMatrix wq_a, wq_b, wkv, wo_a, wo_b;
  DeviceVector q_norm, kv_norm, attn_sink;
  DeviceMatrix wkv_c, wgate_c;  // KV sources (wgate_c: ratio 2 only)
  DeviceVector norm_c;
  DeviceMatrix wk;  // indexer keys (KV sources)
  DeviceVector k_norm;
  DeviceMatrix wq_b_i, weights_proj;  // index sources
  DeviceMatrix gate;                  // router [E, d] BF16
  DeviceVector gate_bias;             // [E]
  DeviceMatrix shared_w1, shared_w3, shared_w2;
  DeviceExperts experts;
  std::optional<DeviceEngram> engram;
};

// Bytes per component, before allocation.
struct MemoryPlanEntry {
  std::string component;
  uint64_t bytes = 0;
  bool in_host = false;       // pinned host memory instead of HBM
  std::string read_per_step;  // what a decode step reads of it: "all", "rows", "top-k", ...
};

struct DeviceMemoryPlan {
  std::vector<MemoryPlanEntry> entries;
  uint64_t device_bytes() const;
  uint64_t host_bytes() const;
  // Bytes every decode step reads whatever the batch (read_per_step == "all").
  uint64_t per_step_bytes() const;
  MemoryPlanEntry* find(const std::string& component);
  const MemoryPlanEntry* find(const std::string& component) const;
  void add(const std::string& component, uint64_t bytes, bool in_host, const std::string& read_per_step);
  // A text table (component, GB, where, read per step) with the device total.
  std::string table() const;
};

struct DeviceWeightOptions {
  bool wo_a_fp8 = false;
  bool engram_tables_in_host = false;
  // Applied to every MXFP4 expert matrix at upload (e.g. ffn_kernels.h repack_mxfp4, the "packed"
  // layout of 16-byte GEMV loads: same size, scales unchanged); null: the checkpoint's plain layout.
  std::function<Status(const uint8_t* plain, int64_t out, int64_t in, uint8_t* packed)> repack_mxfp4;
  // With repack_mxfp4: keep a plain copy too ("routed experts (plain)": the prefill GEMMs read that layout).
  bool keep_plain_mxfp4 = false;
  // Applied to every MXFP4 expert matrix at upload as a further copy (e.g. ffn_kernels.h repack_mxfp4_tiles, the
  // "tiles" layout the decode GEMVs stream with TMA: data + scales bytes in one buffer per matrix; "routed experts
  // (tiles)", DeviceExperts::tile_table); null: none.
  std::function<Status(const uint8_t* plain, const uint8_t* scales, int64_t out, int64_t in, uint8_t* tiles)> tile_mxfp4;
  // Run over every MXFP4 expert matrix's scale bytes at upload; DeviceExperts::scales_checked = all passed
  // (e.g. ffn_kernels.h mxfp4_scales_allow_exp_add, the condition of GemvItemsOptions::scale_exp_add).
  std::function<bool(const uint8_t* scales, size_t count)> mxfp4_scale_check;
  // Runs the expert conversions above (repack_mxfp4, tile_mxfp4) several experts at a time; null: one by one.
  ThreadPool* pool = nullptr;
};

class DeviceWeights {
 public:
  // The layout's bytes per component, without touching the GPU.
  static Result<DeviceMemoryPlan> plan(const ModelConfig& c, const BoundWeights& w, const DeviceWeightOptions& options);
  // Uploads every tensor. `other` are the caller's further device allocations (KV, workspaces) that must
  // fit next to the weights; when weights + other + headroom exceed the device's free memory nothing is
  // allocated and the error carries the whole plan.
  static Result<DeviceWeights> upload(const ModelConfig& c, const BoundWeights& w, const DeviceWeightOptions& options,
                                      const DeviceMemoryPlan& other, uint64_t headroom_bytes);

  DeviceWeights(DeviceWeights&&) noexcept;
  DeviceWeights& operator=(DeviceWeights&&) noexcept;
  ~DeviceWeights();

  const DeviceMatrix& embed() const { return embed_; }  // [vocab, d] BF16 rows
  const DeviceMatrix& head() const { return head_; }    // [vocab, d] BF16
  const DeviceVector& final_norm() const { return final_norm_; }
  const std::vector<DeviceLayer>& layers() const { return layers_; }
  const DeviceMemoryPlan& memory_plan() const { return plan_; }

 private:
  DeviceWeights();
  friend class DeviceWeightPlacer;
  struct Storage;
  std::unique_ptr<Storage> storage_;  // the device slab and the pinned host slab
  DeviceMatrix embed_, head_;
  DeviceVector final_norm_;
  std::vector<DeviceLayer> layers_;
  DeviceMemoryPlan plan_;
};

}  // namespace cedar::cuda
