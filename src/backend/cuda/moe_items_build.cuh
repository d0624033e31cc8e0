// The routed experts' grouped-GEMV item tables (ffn_kernels.h "MoE dispatch") built by one block (or, up to
// kMoeWarpBuildPairs pairs, by its first warp): the body of moe_build_items_kernel, and of the fused router's
// last block (moe_route with a dispatch), which builds them right after its selection instead of handing the
// expert ids to a second launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_math.cuh"
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

// One item of table tb: matrix m of an expert (data, scales) over the item's rows; pair[j] / token[j]
// for j < 8 (rows past `rows` repeat the first pair).
__device__ inline void write_moe_item(const MoeItemTable& tb, int m, const uint8_t* data, const uint8_t* scales,
                                      int32_t rows, const int32_t (&pair)[kGemvItemRows],
                                      const int32_t (&token)[kGemvItemRows], int32_t group) {
  DeviceGemvItem it;
  it.data = data;
  it.scales = scales;
  it.act_codes = tb.act_codes;
  it.act_scales = tb.act_scales;
  it.y = tb.y[m];
  it.n = rows;
#pragma unroll
  for (int j = 0; j < kGemvItemRows; ++j) {
    it.act_row[j] = tb.act_by_pair ? pair[j] : token[j];
    it.y_row[j] = pair[j];
  }
  tb.items[static_cast<int64_t>(group) * tb.n_mats + m] = it;
}

// The items of <= kMoeWarpBuildPairs pairs by one warp (decode: a few tokens). Lane p holds pair p; the
// lanes of one expert come from a match mask, so a pair's place in its expert's list is a popcount and
// the experts' order a loop over the lanes that lead an expert: no shared memory, no block barrier (the
// block builder below takes ~12 barriers and two scans, a long chain for the fused router's tail). The
// first lane of each item loads every table's weight pointers at once: one L2 round trip, not one per
// table and matrix. The same items in the same order as the block builder.
template <class ExpertOf>
__device__ inline void build_moe_items_warp(const MoeDispatchArgs& a, ExpertOf expert_of, int lane) {
  const int P = static_cast<int>(a.n * a.topk), E = static_cast<int>(a.n_experts), K = static_cast<int>(a.topk);
  const int32_t e = lane < P ? expert_of(lane) : -1;
  const bool ok = lane < P && e >= 0 && e < E;  // ids outside [0, E) are skipped
  const unsigned live = __ballot_sync(kFullMask, ok);
  const unsigned match = __match_any_sync(kFullMask, ok ? e : -1 - lane);  // a skipped lane matches no one
  const unsigned peers = ok ? match & live : 0u;
  const unsigned below = (1u << lane) - 1u;
  const int32_t place = __popc(peers & below), count = __popc(peers);
  const unsigned leaders = __ballot_sync(kFullMask, ok && place == 0);
  int32_t group = 0, n_groups = 0;  // this expert's first item group (experts ascending); groups in all
#pragma unroll 1
  for (unsigned rest = leaders; rest != 0; rest &= rest - 1) {
    const int q = __ffs(rest) - 1;
    const int32_t eq = __shfl_sync(kFullMask, e, q);
    const int32_t gq = (__shfl_sync(kFullMask, count, q) + kGemvItemRows - 1) / kGemvItemRows;
    n_groups += gq;
    if (eq < e) group += gq;
  }
  if (ok && place % kGemvItemRows == 0) {
    const int32_t rows = min(count - place, static_cast<int32_t>(kGemvItemRows));
    int32_t pair[kGemvItemRows], token[kGemvItemRows];
    unsigned rest = peers & ~below;  // this pair and its expert's later ones, in pair order
#pragma unroll
    for (int j = 0; j < kGemvItemRows; ++j) {
      pair[j] = j < rows ? __ffs(rest) - 1 : lane;
      token[j] = pair[j] / K;
      rest &= rest - 1;
    }
    constexpr int kTables = sizeof(MoeDispatchArgs::tables) / sizeof(MoeItemTable);
    constexpr int kMats = sizeof(MoeItemTable::mats) / sizeof(ExpertWeightTable);
    const uint8_t* data[kTables][kMats] = {};
    const uint8_t* scales[kTables][kMats] = {};
#pragma unroll
    for (int ti = 0; ti < kTables; ++ti)
#pragma unroll
      for (int m = 0; m < kMats; ++m)
        if (ti < a.n_tables && m < a.tables[ti].n_mats) {
          data[ti][m] = a.tables[ti].mats[m].data[e];
          scales[ti][m] = a.tables[ti].mats[m].scales[e];
        }
    const int32_t item = group + place / kGemvItemRows;
#pragma unroll
    for (int ti = 0; ti < kTables; ++ti)
#pragma unroll
      for (int m = 0; m < kMats; ++m)
        if (ti < a.n_tables && m < a.tables[ti].n_mats)
          write_moe_item(a.tables[ti], m, data[ti][m], scales[ti][m], rows, pair, token, item);
  }
  if (lane == 0)
    for (int ti = 0; ti < a.n_tables; ++ti) *a.tables[ti].count = n_groups * a.tables[ti].n_mats;
}

// Pairs p = t·K + k grouped by expert (counts → offsets → each expert's thread lists its pairs in order),
// then items of <= 8 pairs per expert, n_mats items per group, for each table. All threads of the block
// call it (n_experts <= 4 * blockDim.x); `sm` holds moe_items_smem_ints(n·topk, n_experts) ints and
// `warp_tot` 32. expert_of(p) gives pair p's expert id and must be readable by the whole block (a.experts
// written by a kernel before this one, or this block's writes — global or shared — before a __syncthreads).
// Up to kMoeWarpBuildPairs pairs (and !a.block_build) warp 0 builds them (build_moe_items_warp) and the
// other warps return at once.
template <class ExpertOf>
__device__ inline void build_moe_items(const MoeDispatchArgs& a, ExpertOf expert_of, int32_t* sm, int32_t* warp_tot) {
  const int64_t P = a.n * a.topk, E = a.n_experts;
  if (P <= kMoeWarpBuildPairs && !a.block_build) {
    if (threadIdx.x < 32) build_moe_items_warp(a, expert_of, static_cast<int>(threadIdx.x));
    return;
  }
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
        int32_t pair[kGemvItemRows], token[kGemvItemRows];
#pragma unroll
        for (int j = 0; j < kGemvItemRows; ++j) {  // rows past `rows` repeat the first (never written)
          pair[j] = order[off + (j < rows ? j : 0)];
          token[j] = pair[j] / K;  // 32-bit: no 64-bit division routine per row
        }
#pragma unroll 1
        for (int m = 0; m < tb.n_mats; ++m)
          write_moe_item(tb, m, tb.mats[m].data[e], tb.mats[m].scales[e], rows, pair, token, group[e] + g);
      }
    }
    if (threadIdx.x == 0) *tb.count = n_groups * tb.n_mats;
  }
}

}  // namespace cedar::cuda::detail
