// Small device helpers of the CUDA model's layer loop (owner: cuda-model), kept apart from the kernel
// owners' files. Same conventions as kernels.h: device pointers, async on `stream`, arguments checked
// before the launch, deterministic, graph-capturable. C++17 (included from .cu files).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/attention_kernels.h"
#include "core/status.h"

namespace cedar::cuda {

// The mHC coefficients of n tokens as mhc_fused writes them, rows of [pre(hc), post(hc), comb(hc·hc)],
// split into the contiguous [n, hc] / [n, hc] / [n, hc·hc] arrays mhc_fused and final_head read
// (an exact copy). For n == 1 the row itself is already in that layout: callers pass pointers into it.
Status split_mix_rows(const float* mix, int64_t n, int64_t hc, float* pre, float* post, float* comb,
                      cudaStream_t stream);

// sparse_attention (attention_kernels.h, owner cuda-attn) with the key tiles' global loads issued before
// any is converted (model_attention.cu): the same grid, arithmetic and results bit for bit, without the
// serialized memory latencies of the owner's tile loader. Same arguments, same workspace.
Status sparse_attention_prefetch(const SparseAttnArgs& a, cudaStream_t stream, const SparseAttnWorkspace& ws = {});

}  // namespace cedar::cuda
