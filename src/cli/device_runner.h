// --device cpu|cuda for the commands that serve or generate: the engine's ModelRunner on the GPU
// (backend/cuda/cuda_runner.h) when cedar was built with CUDA. The CPU path stays in the commands
// (engine::DeepseekRunner with the prefix cache); this builds the GPU one.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "cli/args.h"
#include "core/status.h"
#include "core/threads.h"
#include "engine/model_runner.h"
#include "io/config.h"
#include "model/deepseek_v41.h"
#include "model/layer_plan.h"

namespace cedar::cli {

// The host model is the one the command loaded (load_for_generation) for its tokenizer and config: the
// GPU model shares it instead of loading the checkpoint a second time (476 GiB for V4.1-Flash).
struct CudaRunnerRequest {
  std::shared_ptr<const DeepseekV41Model> host;
  int64_t max_running = 16;    // sequences decoded together (the step's batch; <= 64)
  int64_t kv_bytes = 0;        // KV budget of all sequences (the device pool is sized for it)
  int64_t context = 0;         // positions one sequence can reach (context_from_args)
  ThreadPool* pool = nullptr;  // host-side load conversions
};

struct DeviceRunner {
  std::shared_ptr<void> model;  // the device model; outlives `runner` (declare the runner after it)
  std::unique_ptr<engine::ModelRunner> runner;
  int64_t kv_capacity_bytes = 0;  // what the engine may schedule (a ByteCacheBudget of this)
  int64_t max_running = 0;        // the engine's max_running (<= the request's)
  int64_t context_length = 0;     // positions one sequence can reach on the device
  std::string summary;            // one line for the startup log
};

// --device cpu|cuda (default cpu).
OptionSpec device_option_spec();

// --device of `a`: true for cuda, false for cpu; an error for another value, or for cuda with the
// options the GPU does not support yet (--kv-cache-dir).
Result<bool> cuda_device_requested(const ParsedArgs& a);

// True when this binary has the CUDA backend.
bool cuda_backend_built();

// Device bytes per context position of the GPU model cuda_runner builds for `max_running` sequences,
// besides the KV pool: what its memory plan sizes by the context (the indexer's scores and selection
// workspace of a prefill chunk, the RoPE and KV block tables), the slope of the plan between two contexts.
// Host arithmetic, no GPU needed; an error without the CUDA backend.
Result<double> cuda_context_bytes_per_position(const ModelConfig& config, const LayerPlan& plan,
                                               int64_t max_running);

// Uploads the host model to GPU 0, sized for request.context positions per sequence, and wraps it in a
// CudaRunner. Errors name the reason (no CUDA in this build, no GPU, the memory plan does not fit).
Result<DeviceRunner> cuda_runner(const CudaRunnerRequest& request);

}  // namespace cedar::cli
