#include "cli/device_runner.h"

#include <algorithm>

#ifdef CEDAR_HAVE_CUDA
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_runner.h"
#include "io/config.h"
#include "model/layer_plan.h"
#include "model/model_stats.h"
#endif

namespace cedar::cli {

OptionSpec device_option_spec() {
  return {"device", "cpu (the reference backend, with the prefix cache) or cuda (GPU 0; no prefix cache yet)", true,
          "cpu", "DEVICE"};
}

Result<bool> cuda_device_requested(const ParsedArgs& a) {
  const std::string device = a.has("device") ? a.get("device") : "cpu";
  if (device != "cpu" && device != "cuda") return make_error("--device must be cpu or cuda, got '" + device + "'");
  if (device == "cuda" && a.has("kv-cache-dir"))
    return make_error("--kv-cache-dir needs --device cpu (no prefix cache on the GPU yet)");
  if (device == "cuda" && !cuda_backend_built())  // before any model is loaded
    return make_error(
        "--device cuda: this cedar was built without the CUDA backend (configure with: cmake --preset cuda)");
  return device == "cuda";
}

#ifdef CEDAR_HAVE_CUDA

bool cuda_backend_built() { return true; }

Result<DeviceRunner> cuda_runner(const CudaRunnerRequest& request) {
  auto config = load_model_config(request.model / "config.json");
  if (!config.ok()) return config.error();
  CEDAR_ASSIGN_OR_RETURN(const LayerPlan plan, build_layer_plan(*config));
  const KvBudget kv = compute_kv_budget(*config, plan);
  cuda::CudaModelOptions o;
  o.max_batch = std::clamp<int64_t>(request.max_running, 1, 64);
  o.kv.max_sequences = o.max_batch;
  // Positions the pools hold: the KV budget at the packed bytes per token, at least one full context.
  const int64_t context = std::max<int64_t>(1, config->max_position_embeddings);
  const int64_t positions =
      kv.bytes_per_token() > 0 ? static_cast<int64_t>(static_cast<double>(request.kv_bytes) / kv.bytes_per_token()) : 0;
  o.kv.token_capacity = std::max<int64_t>(positions, std::min<int64_t>(context, 1 << 20));
  o.kv.max_context = std::min(context, o.kv.token_capacity);
  o.pool = request.pool;
  CEDAR_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaModel> model, cuda::CudaModel::load(request.model, o));
  DeviceRunner d;
  d.kv_capacity_bytes = cuda::cuda_runner_budget_bytes(*model, request.kv_bytes);
  auto runner = std::make_unique<cuda::CudaRunner>(*model);
  d.max_running = runner->max_sequences();
  d.context_length = o.kv.max_context;
  d.summary = "GPU model on the device (" + std::to_string(model->memory_plan().device_bytes() >> 20) +
              " MiB; decode batch " + std::to_string(d.max_running) + ", KV budget " +
              std::to_string(d.kv_capacity_bytes >> 20) + " MiB, context " + std::to_string(d.context_length) + ")";
  d.runner = std::move(runner);
  d.model = std::shared_ptr<void>(std::move(model));
  return d;
}

#else

bool cuda_backend_built() { return false; }

Result<DeviceRunner> cuda_runner(const CudaRunnerRequest&) {
  return make_error("this cedar was built without the CUDA backend (configure with: cmake --preset cuda)");
}

#endif

}  // namespace cedar::cli
