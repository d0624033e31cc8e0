// Host entry points of the CUDA attention path (owner: cuda-attn): the BF16 GEMV / skinny GEMM,
// RoPE/YaRN, the SWA KV path, the CSA2 compressor and its cache writes, the indexer (scores,
// candidate blocks, top-k) and the sparse attention with the sink. Every pointer argument is DEVICE
// memory unless stated; every call is asynchronous on `stream`, validates its arguments before any
// launch and returns the launch status. Kernels are deterministic (no order-dependent atomics) and
// graph-capturable (no host sync, no allocation). The CPU oracle modules are backend/cpu/ops.h,
// model/{compressor,indexer,sparse_attention,attention}.h, core/numeric.h and kv/kv_format.h;
// tests/backend/cuda/attention_*_cutest.cpp check each kernel against them. C++17 (included from .cu
// files).
//
// Activations are fp32 arrays holding bf16-exact values, row-major [tokens, width], as on the CPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/status.h"

namespace cedar::cuda {

// ---- BF16 GEMV / skinny GEMM ------------------------------------------------------------------
// y[t, r] = Σ_c x[t, c] · W[r, c] for a bf16 weight W [out, in] (row-major, bf16 bits) and n tokens of
// fp32 activations holding bf16 values (cpu::linear for BF16 weights: fp32 products and accumulation,
// no activation quantization). bf16_output rounds y to bf16 (what the reference's bf16 linear
// returns); otherwise y is fp32 (the fp32 head, the ratio-2 compressor projections).
//
// `groups` matrices of one shape run in one launch (grid.z): group g uses the weight at
// w + g·w_group_stride and the activations / outputs at the given strides, so wo_a (8 groups of
// [o_lora, in_g] applied to consecutive slices of o) is one call with the default strides:
//   x of token t, group g: x + t·x_row_stride + g·x_group_stride   (defaults: groups·in, in)
//   y of token t, group g: y + t·y_row_stride + g·y_group_stride   (defaults: groups·out, out)
// Requirements: in % 8 == 0; w and x 16-byte aligned, strides of w multiples of 8 elements and of x
// multiples of 4; y must not overlap x. Values of x that are not bf16-exact are rounded to bf16.
//
// Design: tensor cores (mma.sync m16n8k16 bf16 × bf16 → f32; the products are exact, as on the CPU)
// with 16 weight rows per block and 16-byte weight loads, K split over the block's 8 warps, and up to
// 64 tokens per pass (more tokens: several passes). Small `out` splits K across blocks through the
// split-K workspace (deterministic: the last block of a row tile adds the partials in split order).
// Only the summation order differs from the CPU's sequential sum.
struct Bf16GemvArgs {
  const uint16_t* w = nullptr;
  int64_t out = 0, in = 0;
  int64_t groups = 1;
  int64_t w_group_stride = 0;  // elements; 0 = out·in
  const float* x = nullptr;
  int64_t x_row_stride = 0;    // 0 = groups·in
  int64_t x_group_stride = 0;  // 0 = in
  float* y = nullptr;
  int64_t y_row_stride = 0;    // 0 = groups·out
  int64_t y_group_stride = 0;  // 0 = out
  int64_t n = 1;               // tokens (0: nothing to do)
  bool bf16_output = false;
};
// Workspace a split-K launch of this shape can use (zeros: never split). Counters must be zero before
// the first call; the kernel re-arms them.
SplitKSize gemv_bf16_splitk_size(int64_t out, int64_t in, int64_t groups = 1);
Status gemv_bf16(const Bf16GemvArgs& a, cudaStream_t stream, const SplitKWorkspace& splitk = {});

// ---- catalog -----------------------------------------------------------------------------------
// The attention kernels of this build (for kernel_catalog / cedar doctor) and their loadability.
std::vector<KernelInfo> attention_kernel_catalog();
Status check_attention_kernels_loadable();

}  // namespace cedar::cuda
