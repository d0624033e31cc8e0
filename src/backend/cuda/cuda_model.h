// The DeepSeek-V4.1 model on the GPU (issue 8): load (the CPU model's config, plan and bound weights) →
// device weights → device KV → new_sequence → decode_step (one token per sequence, batched, replayed as
// a CUDA graph) / prefill (a chunk of one sequence, exact or CED). The CPU model (model/deepseek_v41.h)
// is the oracle: same layer loop, same block order (single-pass mHC, Engram before the block, the CED
// row split), same per-sequence state, on the device. Host-side C++20 (included from .cpp files).
//
// PHASE 1 STATUS — the loop is written against the kernel APIs that exist (kernels.h: rms_norm,
// quantize_act_fp8 / linear_quantized / gemv_quantized(_grouped), mhc_fused). The steps that wait for
// the other CUDA engineers' kernels return an error naming the kernel and its owner
// ("pending: cuda-attn …" / "pending: cuda-ffn …"), so decode_step and prefill fail cleanly, before
// touching any sequence state, until phase 2 wires them (docs/cuda.md "CUDA model").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/device_kv.h"
#include "backend/cuda/device_weights.h"
#include "backend/cuda/stream.h"
#include "core/status.h"
#include "core/threads.h"
#include "model/deepseek_v41.h"
#include "model/forward_types.h"

namespace cedar::cuda {

struct CudaModelOptions {
  int device = 0;
  DeviceWeightOptions weights;
  DeviceKvOptions kv;
  int64_t max_batch = 64;                       // decode sequences per step
  int64_t max_chunk = 2048;                     // prefill rows per call (the activation workspace is sized for it)
  uint64_t headroom_bytes = uint64_t{2} << 30;  // left free: CUDA context, library workspaces
  bool cuda_graphs = true;                      // decode steps replayed as one graph per batch size
  ThreadPool* pool = nullptr;                   // host-side load conversions
  std::filesystem::path engram_map;             // as LoadOptions::engram_map
};

// One sequence on the device: its KV slot and tables, its length and prefill mode.
struct CudaSequence {
  DeviceKvSequence kv;
  SequenceOptions options;
  int64_t length = 0;
  int64_t replay_start = 0;  // CED: rows before it run the encoder + boundary only
  bool failed = false;       // a step failed after touching the state: discard the sequence
};

struct CudaStepOutput {
  const float* logits = nullptr;  // device [rows, vocab] fp32, valid until the next call
  int64_t rows = 0;
  std::vector<int64_t> positions;  // absolute position of each logit row
};

class CudaModel {
 public:
  static Result<std::unique_ptr<CudaModel>> load(const std::filesystem::path& path, const CudaModelOptions& options);
  ~CudaModel();

  const ModelConfig& config() const { return host_.config(); }
  const LayerPlan& plan() const { return host_.plan(); }
  const DeviceWeights& weights() const { return weights_; }
  DeviceKvPool& kv_pool() { return kv_; }
  // Weights + KV + workspace, per component (what load checked against the free memory).
  const DeviceMemoryPlan& memory_plan() const { return memory_plan_; }
  cudaStream_t stream() const { return stream_.get(); }

  Result<CudaSequence> new_sequence(const SequenceOptions& options);

  // One token per sequence at its current length (batch <= max_batch, distinct sequences); logits of
  // every row. On error before any state was touched the sequences stay usable.
  Status decode_step(std::span<CudaSequence* const> seqs, std::span<const int64_t> tokens, CudaStepOutput& out);
  // The next chunk (<= max_chunk tokens) of one sequence's prompt, in the sequence's mode.
  Status prefill(CudaSequence& seq, std::span<const int64_t> tokens, LogitRows logits, CudaStepOutput& out);

  struct Workspace;  // activation buffers (cuda_model.cpp)

 private:
  CudaModel(DeepseekV41Model host, const CudaModelOptions& options, Stream stream, DeviceWeights weights,
            DeviceKvPool kv, std::unique_ptr<Workspace> ws, DeviceMemoryPlan plan);

  // Rows of one forward call that run the same layers (the CED split, as in the CPU model).
  // Per-row data (token, position, KV slot, SWA start) is in the workspace's step inputs, so a
  // captured decode graph stays valid from step to step.
  struct Rows {
    int64_t first = 0;  // offset of these rows in the step inputs
    int64_t n = 0;
    bool tail = true;     // false: rows before the CED replay start
    bool decode = false;  // one row per sequence (batched decode)
    CedBoundary boundary = CedBoundary::ExactSource;
  };
  Status run_rows(const Rows& r);
  Status embed(const Rows& r);
  Status attention_site(int64_t layer, const Rows& r);
  Status attention(int64_t layer, const Rows& r);
  Status ffn_site(int64_t layer, const Rows& r);
  Status moe(int64_t layer, const Rows& r);
  Status finish(const Rows& r);
  Status linear(const DeviceMatrix& w, const float* x, int64_t n, float* y);
  Status upload_step_inputs(std::span<CudaSequence* const> seqs, std::span<const int64_t> tokens,
                            std::span<const int64_t> positions);

  DeepseekV41Model host_;
  CudaModelOptions options_;
  Stream stream_;
  DeviceWeights weights_;
  DeviceKvPool kv_;
  std::unique_ptr<Workspace> ws_;
  DeviceMemoryPlan memory_plan_;
  std::map<int64_t, CudaGraph> decode_graphs_;  // by batch size
  bool state_written_ = false;  // a step has written sequence state (KV rings / caches): errors poison it
};

// The device memory one CudaModel of this config needs besides its weights (KV pools, rings, tables,
// activation workspace), per component — load() checks it against the free memory before allocating.
Result<DeviceMemoryPlan> cuda_model_extra_plan(const ModelConfig& c, const LayerPlan& plan, const CudaModelOptions& o);

}  // namespace cedar::cuda
