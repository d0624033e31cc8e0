// The routed experts' grouped-GEMV item tables (ffn_kernels.h "MoE dispatch") built by one block: the
// body of moe_build_items_kernel, and of the fused router's last block (moe_route with a dispatch), which
// builds them right after its selection instead of handing the expert ids to a second launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda::detail {

// Shared ints build_moe_items needs for P pairs over E experts.
__host__ __device__ constexpr int64_t moe_items_smem_ints(int64_t pairs, int64_t experts) {
  return 2 * pairs + 3 * experts;
}

// Exclusive scan of v[0..count) in place (count <= 4 * blockDim.x), fixed order; returns the total.
// All threads call it.
__device__ inline int32_t block_exclusive_scan(int32_t* v, int64_t count, int32_t* warp_tot) {
  constexpr int kPer = 4;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int32_t local[kPer];
  int32_t sum = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t at = static_cast<int64_t>(tid) * kPer + i;
    local[i] = at < count ? v[at] : 0;
    sum += local[i];
  }
  // Inclusive warp scan of the per-thread sums, then the warp totals.
  int32_t incl = sum;
  for (int o = 1; o < 32; o <<= 1) {
    const int32_t up = __shfl_up_sync(0xFFFFFFFFu, incl, o);
    if (lane >= o) incl += up;
  }
  __syncthreads();
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  int32_t warp_base = 0, total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
    if (w < warp) warp_base += warp_tot[w];
    total += warp_tot[w];
  }
  int32_t run = warp_base + incl - sum;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t at = static_cast<int64_t>(tid) * kPer + i;
    if (at < count) v[at] = run;
    run += local[i];
  }
  __syncthreads();
  return total;
}

// Asks L2 for the per-expert weight pointer tables of every item table (one 128-byte line per thread and
// step): a caller that knows it will build items soon hides the tables' DRAM round trip behind its work.
__device__ inline void prefetch_moe_tables(const MoeDispatchArgs& a) {
  const int64_t lines = (a.n_experts * static_cast<int64_t>(sizeof(void*)) + 127) / 128;
  for (int ti = 0; ti < a.n_tables; ++ti)
    for (int m = 0; m < a.tables[ti].n_mats; ++m)
      for (int64_t l = threadIdx.x; l < 2 * lines; l += blockDim.x) {
        const ExpertWeightTable& w = a.tables[ti].mats[m];
        const void* at = (l < lines ? reinterpret_cast<const char*>(w.data) : reinterpret_cast<const char*>(w.scales)) +
                         (l % lines) * 128;
        detail::prefetch_l2(at);
      }
}

// Pairs p = t·K + k grouped by expert (counts → offsets → each expert's thread lists its pairs in order),
// then items of <= 8 pairs per expert, n_mats items per group, for each table. All threads of the block
// call it (n_experts <= 4 * blockDim.x); `sm` holds moe_items_smem_ints(n·topk, n_experts) ints and
// `warp_tot` 32. expert_of(p) gives pair p's expert id and must be readable by the whole block (a.experts
// written by a kernel before this one, or this block's writes — global or shared — before a __syncthreads).
template <class ExpertOf>
__device__ inline void build_moe_items(const MoeDispatchArgs& a, ExpertOf expert_of, int32_t* sm, int32_t* warp_tot) {
  const int64_t P = a.n * a.topk, E = a.n_experts;
  const int32_t K = static_cast<int32_t>(a.topk);  // <= 64
  int32_t* pair_expert = sm;       // [P]
  int32_t* num = pair_expert + P;  // [E] pairs per expert
  int32_t* offset = num + E;       // [E] first position of expert e in `order`
  int32_t* group = offset + E;     // [E] first item group of expert e
  int32_t* order = group + E;      // [P] pairs sorted by (expert, pair)
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) pair_expert[p] = expert_of(p);
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) num[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    const int32_t e = pair_expert[p];
    if (e >= 0 && e < E) atomicAdd(num + e, 1);  // integer counts: order-independent
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    offset[e] = num[e];
    group[e] = (num[e] + kGemvItemRows - 1) / kGemvItemRows;
  }
  __syncthreads();
  block_exclusive_scan(offset, E, warp_tot);
  const int32_t n_groups = block_exclusive_scan(group, E, warp_tot);
  // Stable lists: the thread of expert e appends its pairs in pair order.
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    if (num[e] == 0) continue;
    int32_t at = offset[e];
#pragma unroll 1
    for (int64_t p = 0; p < P; ++p)
      if (pair_expert[p] == e) order[at++] = static_cast<int32_t>(p);
  }
  __syncthreads();
  // Loops kept rolled: the fused router's tail runs this code once per launch, cold in the instruction cache.
#pragma unroll 1
  for (int ti = 0; ti < a.n_tables; ++ti) {
    const MoeItemTable& tb = a.tables[ti];
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
      const int32_t pairs = num[e];
#pragma unroll 1
      for (int32_t g = 0; g * kGemvItemRows < pairs; ++g) {
        const int32_t off = offset[e] + g * kGemvItemRows;
        const int32_t rows = pairs - g * kGemvItemRows < kGemvItemRows ? pairs - g * kGemvItemRows : kGemvItemRows;
#pragma unroll 1
        for (int m = 0; m < tb.n_mats; ++m) {
          DeviceGemvItem it;
          it.data = tb.mats[m].data[e];
          it.scales = tb.mats[m].scales[e];
          it.act_codes = tb.act_codes;
          it.act_scales = tb.act_scales;
          it.y = tb.y[m];
          it.n = rows;
          for (int j = 0; j < kGemvItemRows; ++j) {  // rows past `rows` repeat the first (never written)
            const int32_t p = order[off + (j < rows ? j : 0)];
            it.act_row[j] = tb.act_by_pair ? p : p / K;  // 32-bit: no 64-bit division routine per row
            it.y_row[j] = p;
          }
          tb.items[static_cast<int64_t>(group[e] + g) * tb.n_mats + m] = it;
        }
      }
    }
    if (threadIdx.x == 0) *tb.count = n_groups * tb.n_mats;
  }
}

}  // namespace cedar::cuda::detail
