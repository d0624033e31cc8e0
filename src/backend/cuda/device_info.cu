#include <cuda_runtime.h>

#include "backend/cuda/device_info.h"

namespace cedar::cuda {

Result<RuntimeInfo> query_runtime() {
  RuntimeInfo info;
  cudaDriverGetVersion(&info.driver_version);
  cudaRuntimeGetVersion(&info.runtime_version);
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess)
    return make_error(std::string("no usable CUDA device: ") + cudaGetErrorString(err));
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaError_t err = cudaGetDeviceProperties(&prop, i); err != cudaSuccess)
      return make_error("cudaGetDeviceProperties(" + std::to_string(i) + "): " + cudaGetErrorString(err));
    info.devices.push_back(DeviceInfo{i, prop.name, prop.major, prop.minor, prop.totalGlobalMem,
                                      prop.multiProcessorCount});
  }
  return info;
}

Result<DeviceMemory> device_memory(int device) {
  DeviceMemory m;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess)
    return make_error("cudaSetDevice(" + std::to_string(device) + "): " + cudaGetErrorString(err));
  if (cudaError_t err = cudaMemGetInfo(&m.free_bytes, &m.total_bytes); err != cudaSuccess)
    return make_error(std::string("cudaMemGetInfo: ") + cudaGetErrorString(err));
  return m;
}

}  // namespace cedar::cuda
