#include "cli/device_runner.h"

#ifdef CEDAR_HAVE_CUDA
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_runner.h"
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

Result<double> cuda_context_bytes_per_position(const ModelConfig& c, const LayerPlan& plan, int64_t max_running) {
  return cuda::cuda_context_bytes_per_position(c, plan, max_running);
}

Result<DeviceRunner> cuda_runner(const CudaRunnerRequest& request) {
  if (!request.host) return make_error("no host model");
  const DeepseekV41Model& host = *request.host;
  cuda::CudaModelOptions o = cuda::cuda_runner_model_options(
      host.config(), host.plan(), {request.max_running, request.kv_bytes, request.context});
  o.pool = request.pool;
  CEDAR_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaModel> model, cuda::CudaModel::load(request.host, o));
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

Result<double> cuda_context_bytes_per_position(const ModelConfig&, const LayerPlan&, int64_t) {
  return make_error("this cedar was built without the CUDA backend (configure with: cmake --preset cuda)");
}

Result<DeviceRunner> cuda_runner(const CudaRunnerRequest&) {
  return make_error("this cedar was built without the CUDA backend (configure with: cmake --preset cuda)");
}

#endif

}  // namespace cedar::cli
