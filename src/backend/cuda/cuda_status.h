// CUDA runtime errors as cedar::Status: every failing call is reported with the call's text and the
// runtime's error name, e.g. "cudaMalloc(&ptr, 4096): cudaErrorMemoryAllocation (out of memory)".
// C++17 (included from .cu files).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/status.h"

namespace cedar::cuda {

inline Status cuda_status(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return Status::Ok();
  return make_error(std::string(call) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

// The error of the last kernel launch (launch configuration errors; asynchronous faults surface at
// the next synchronizing call). Clears the sticky-free launch error state.
inline Status launch_status(const char* kernel) {
  return cuda_status(cudaGetLastError(), (std::string("launch of ") + kernel).c_str());
}

}  // namespace cedar::cuda

// Returns from the enclosing function (returning Status or Result<T>) when a CUDA call fails.
#define CEDAR_CUDA_RETURN_IF_ERROR(call)                                        \
  do {                                                                          \
    const cudaError_t cedar_cuda_err_ = (call);                                 \
    if (cedar_cuda_err_ != cudaSuccess)                                         \
      return ::cedar::cuda::cuda_status(cedar_cuda_err_, #call).error();        \
  } while (0)
