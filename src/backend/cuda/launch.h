// Kernel launch with optional programmatic dependent launch (PDL, sm_90): with `pdl` the kernel is
// launched with programmatic stream serialization, so it may start while the previous kernel of the
// stream is still running; such kernels call detail::pdl_wait() (mma_bf16.cuh) before reading anything
// the previous kernel writes and may prefetch their weights before it. Inside a CUDA graph capture
// the launch becomes a programmatic edge. Include from .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_status.h"

namespace cedar::cuda {

template <typename... KernelArgs, typename... Args>
Status launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                     const char* name, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n_attr = 0;
  if (pdl) {
    attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n_attr++].val.programmaticStreamSerializationAllowed = 1;
  }
  // The stream's priority on the launch itself, so a graph captured from the stream keeps it per kernel node.
  int priority = 0;
  if (cudaStreamGetPriority(stream, &priority) != cudaSuccess) {
    (void)cudaGetLastError();  // the launch reports a bad stream itself
  } else if (priority != 0) {
    attr[n_attr].id = cudaLaunchAttributePriority;
    attr[n_attr++].val.priority = priority;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n_attr;
  if (cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...); err != cudaSuccess) {
    (void)cudaGetLastError();  // a rejected launch (bad configuration) must not fail the next launch's check
    return cuda_status(err, name);
  }
  return launch_status(name);
}

}  // namespace cedar::cuda
