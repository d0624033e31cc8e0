// Small device helpers of the CUDA model's layer loop (owner: cuda-model), kept apart from the kernel
// owners' files. Same conventions as kernels.h: device pointers, async on `stream`, arguments checked
// before the launch, deterministic, graph-capturable. C++17 (included from .cu files).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/attention_kernels.h"
#include "core/status.h"

namespace cedar::cuda {

// sparse_attention (attention_kernels.h, owner cuda-attn) with the key tiles' global loads issued before
// any is converted (model_attention.cu): the same grid, arithmetic and results bit for bit, without the
// serialized memory latencies of the owner's tile loader. Same arguments, same workspace.
Status sparse_attention_prefetch(const SparseAttnArgs& a, cudaStream_t stream, const SparseAttnWorkspace& ws = {});

}  // namespace cedar::cuda
