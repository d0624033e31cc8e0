// The MoE combine of one channel (ffn_kernels.h moe_combine), shared by moe_combine_kernel and the mHC site
// kernel that combines the channels it expands (MhcFusedArgs::y_combine): the same operations, so the same
// bits. y = bf16(Σ_k routed[slot order_k] (+ shared)) from 0.0f, the slots in stable expert-id order (the
// CPU's combine, moe_forward).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_math.cuh"

namespace cedar::cuda::detail {

constexpr int kCombinePrefetch = 8;  // routed values a thread holds in registers (topk <= 8)

// The position of slot k in the stable order of the K ids: #{j: id_j < id_k, or id_j == id_k and j < k}.
__device__ __forceinline__ int combine_rank(const int32_t* ids, int K, int k) {
  const int32_t me = ids[k];
  int rank = 0;
  for (int j = 0; j < K; ++j) rank += ids[j] < me || (ids[j] == me && j < k);
  return rank;
}

__device__ __forceinline__ float pick_slot(const float (&v)[kCombinePrefetch], int i) {
  float r = v[0];
#pragma unroll
  for (int q = 1; q < kCombinePrefetch; ++q) r = i == q ? v[q] : r;
  return r;
}

// One channel from its K <= kCombinePrefetch routed values (v[slot]) and the slots' order.
__device__ __forceinline__ float combine_channel(const float (&v)[kCombinePrefetch], const int32_t* order, int K,
                                                 bool has_shared, float shared) {
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc = __fadd_rn(acc, pick_slot(v, order[k]));
  return round_bf16(has_shared ? __fadd_rn(acc, shared) : acc);
}

}  // namespace cedar::cuda::detail
