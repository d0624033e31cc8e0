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
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  if (cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...); err != cudaSuccess) {
    (void)cudaGetLastError();  // a rejected launch (bad configuration) must not fail the next launch's check
    return cuda_status(err, name);
  }
  return launch_status(name);
}

}  // namespace cedar::cuda
