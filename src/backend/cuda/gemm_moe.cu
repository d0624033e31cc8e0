// Routed experts of a prefill chunk on the device (gemm_kernels.h): the permutation (a stable counting
// sort of the router's (token, slot) entries by expert), the grouped W1/W3 + SwiGLU and W2 launches of
// the tile kernel (gemm_tile.cu), and the combine back to token order.
//
// Determinism: the permutation uses no atomics whose order matters (per-chunk histograms, a scan in
// chunk order, and in-chunk ranks from warp match masks, processed in entry order), so row order is a
// function of the routing alone: by (token, slot) within an expert, as model/moe.cpp groups them. The
// combine sums a token's expert outputs in ascending expert id (slot order for a repeated id) from 0,
// then adds the shared expert and rounds once to bf16 — the CPU's loop, operation for operation.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_internal.h"
#include "backend/cuda/gemm_kernels.h"

namespace cedar::cuda {
namespace {

using gemm_detail::Epilogue;
using gemm_detail::Problem;

constexpr int kChunk = 256;         // routing entries per histogram chunk (8 rounds of one warp)
constexpr int kScanThreads = 1024;  // one thread per expert in the scan (kMoePrefillMaxExperts)

// Per chunk of entries: how many go to each expert.
__global__ void moe_hist_kernel(const int32_t* ids, int64_t entries, int n_experts, int32_t* hist) {
  extern __shared__ int32_t counts[];
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kChunk + threadIdx.x;
  if (i < entries) {
    const int e = ids[i];
    if (e >= 0 && e < n_experts) atomicAdd(&counts[e], 1);  // integer counts: order-free
  }
  __syncthreads();
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x)
    hist[static_cast<int64_t>(blockIdx.x) * n_experts + e] = counts[e];
}

// One block: per expert the exclusive prefix over chunks (in place), then the expert row offsets and
// the tile offsets (tiles of tile_rows rows) as exclusive scans over experts.
__global__ void __launch_bounds__(kScanThreads)
    moe_scan_kernel(int32_t* hist, int n_chunks, int n_experts, int tile_rows, int32_t* row_offsets,
                    int32_t* tile_offsets) {
  __shared__ int32_t rows_s[kScanThreads], tiles_s[kScanThreads];
  const int e = threadIdx.x;
  int32_t count = 0;
  if (e < n_experts) {
    for (int c = 0; c < n_chunks; ++c) {
      int32_t* h = hist + static_cast<int64_t>(c) * n_experts + e;
      const int32_t v = *h;
      *h = count;
      count += v;
    }
  }
  rows_s[e] = count;
  tiles_s[e] = (count + tile_rows - 1) / tile_rows;
  __syncthreads();
  // Inclusive Hillis–Steele scans over the 1024 slots (experts past n_experts hold 0).
  for (int off = 1; off < kScanThreads; off <<= 1) {
    const int32_t r = e >= off ? rows_s[e - off] : 0, t = e >= off ? tiles_s[e - off] : 0;
    __syncthreads();
    rows_s[e] += r;
    tiles_s[e] += t;
    __syncthreads();
  }
  if (e < n_experts) {
    row_offsets[e] = rows_s[e] - count;
    tile_offsets[e] = tiles_s[e] - (count + tile_rows - 1) / tile_rows;
  }
  if (e == n_experts - 1) {
    row_offsets[n_experts] = rows_s[e];
    tile_offsets[n_experts] = tiles_s[e];
  }
}

// One warp per chunk, entries in order: rank of an entry among the chunk's earlier entries of its
// expert (match mask), placed after the earlier chunks' and experts' rows.
__global__ void moe_scatter_kernel(const int32_t* ids, const float* weights, int64_t entries, int topk, int n_experts,
                                   const int32_t* hist, const int32_t* row_offsets, int32_t* row_token,
                                   float* row_weight, int32_t* slot_row) {
  extern __shared__ int32_t next[];  // next free row of each expert for this chunk
  const int lane = threadIdx.x;
  const int64_t chunk = blockIdx.x;
  for (int e = lane; e < n_experts; e += 32) next[e] = row_offsets[e] + hist[chunk * n_experts + e];
  __syncwarp();
  for (int round = 0; round < kChunk / 32; ++round) {
    const int64_t i = chunk * kChunk + round * 32 + lane;
    int e = -1;
    if (i < entries) {
      e = ids[i];
      if (e < 0 || e >= n_experts) e = -1;
    }
    const unsigned same = __match_any_sync(detail::kFullMask, e);
    const int rank = __popc(same & ((1u << lane) - 1u));
    int row = -1;
    if (e >= 0) row = next[e] + rank;
    __syncwarp();
    if (e >= 0 && rank == __popc(same) - 1) next[e] += __popc(same);  // the group's last lane advances it
    __syncwarp();
    if (i < entries) {
      slot_row[i] = row;
      if (row >= 0) {
        row_token[row] = static_cast<int32_t>(i / topk);
        row_weight[row] = weights[i];
      }
    }
  }
}

// One block per token: its slots ordered by (expert id, slot) in shared memory, then per 8 columns the
// fp32 sum in that order, plus the shared expert, rounded to bf16.
__global__ void moe_combine_kernel(const int32_t* ids, const int32_t* slot_row, const uint16_t* y_rows,
                                   const float* shared, int topk, int64_t d, int n_experts, float* y) {
  extern __shared__ int32_t order[];  // [topk] rows in summation order (−1: dropped)
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    // Insertion sort of (expert, slot) keys: topk is small (6); stable by slot.
    int32_t key_e[32], key_r[32];
    int count = 0;
    for (int k = 0; k < topk; ++k) {
      const int e = ids[t * topk + k];
      const int r = slot_row[t * topk + k];
      if (e < 0 || e >= n_experts || r < 0) continue;
      int pos = count++;
      while (pos > 0 && key_e[pos - 1] > e) {
        key_e[pos] = key_e[pos - 1];
        key_r[pos] = key_r[pos - 1];
        --pos;
      }
      key_e[pos] = e;
      key_r[pos] = r;
    }
    for (int k = 0; k < topk; ++k) order[k] = k < count ? key_r[k] : -1;
  }
  __syncthreads();
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * 8; c < d; c += static_cast<int64_t>(blockDim.x) * 8) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < topk; ++k) {
      const int r = order[k];
      if (r < 0) break;
      const uint4 v = *reinterpret_cast<const uint4*>(y_rows + static_cast<int64_t>(r) * d + c);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        acc[2 * q] = __fadd_rn(acc[2 * q], __uint_as_float(w[q] << 16));
        acc[2 * q + 1] = __fadd_rn(acc[2 * q + 1], __uint_as_float(w[q] & 0xFFFF0000u));
      }
    }
    float* dst = y + t * d + c;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const float v = shared != nullptr ? __fadd_rn(acc[q], shared[t * d + c + q]) : acc[q];
      dst[q] = detail::round_bf16(v);
    }
  }
}

std::string route_str(const MoeRouteView& r) {
  return "n=" + std::to_string(r.n) + ", topk=" + std::to_string(r.topk) + ", n_experts=" + std::to_string(r.n_experts);
}

Status check_route(const MoeRouteView& r, const char* who) {
  if (r.n < 0 || r.topk < 1 || r.topk > 32 || r.n_experts < 1 || r.n_experts > kMoePrefillMaxExperts ||
      r.n * r.topk > 0x7FFFFFFF)
    return make_error(std::string("cuda::") + who + ": routing " + route_str(r) + " (topk 1..32, n_experts 1.." +
                      std::to_string(kMoePrefillMaxExperts) + ")");
  return Status::Ok();
}

int64_t max_tiles(const MoeRouteView& r, int tile_rows) {
  const int64_t rows = r.n * r.topk, nz = std::min<int64_t>(r.n_experts, rows);
  return (rows + nz * (tile_rows - 1)) / tile_rows;
}

}  // namespace

MoePermutationSizes moe_permutation_sizes(int64_t n, int64_t topk, int64_t n_experts) {
  const int64_t entries = n * topk;
  return MoePermutationSizes{(entries + kChunk - 1) / kChunk * n_experts, n_experts + 1, entries};
}

int moe_tile_rows(int64_t n, int64_t topk, int64_t n_experts) {
  const double per_expert = static_cast<double>(n) * static_cast<double>(topk) / static_cast<double>(n_experts);
  return per_expert >= 96.0 ? 128 : (per_expert >= 40.0 ? 64 : 32);
}

Status moe_permute(const MoeRouteView& route, int tile_rows, const MoePermutation& perm, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_route(route, "moe_permute"));
  if (!gemm_detail::valid_tile_m(tile_rows))
    return make_error("cuda::moe_permute: tile_rows=" + std::to_string(tile_rows) + " (32, 64 or 128)");
  if (perm.chunk_hist == nullptr || perm.row_offsets == nullptr || perm.tile_offsets == nullptr ||
      (route.n > 0 && (route.expert_ids == nullptr || route.weights == nullptr || perm.row_token == nullptr ||
                       perm.row_weight == nullptr || perm.slot_row == nullptr)))
    return make_error("cuda::moe_permute: null buffer (" + route_str(route) + ")");
  const int64_t entries = route.n * route.topk;
  const int n_chunks = static_cast<int>((entries + kChunk - 1) / kChunk);
  const int E = static_cast<int>(route.n_experts);
  const size_t smem = static_cast<size_t>(E) * sizeof(int32_t);
  if (n_chunks > 0) {
    moe_hist_kernel<<<n_chunks, kChunk, smem, stream>>>(route.expert_ids, entries, E, perm.chunk_hist);
    CEDAR_RETURN_IF_ERROR(launch_status("moe_hist_kernel"));
  }
  moe_scan_kernel<<<1, kScanThreads, 0, stream>>>(perm.chunk_hist, n_chunks, E, tile_rows, perm.row_offsets,
                                                  perm.tile_offsets);
  CEDAR_RETURN_IF_ERROR(launch_status("moe_scan_kernel"));
  if (n_chunks > 0) {
    moe_scatter_kernel<<<n_chunks, 32, smem, stream>>>(
        route.expert_ids, route.weights, entries, static_cast<int>(route.topk), E, perm.chunk_hist, perm.row_offsets,
        perm.row_token, perm.row_weight, perm.slot_row);
    CEDAR_RETURN_IF_ERROR(launch_status("moe_scatter_kernel"));
  }
  return Status::Ok();
}

Status moe_experts(const MoeExpertArgs& a, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_route(a.route, "moe_experts"));
  const MoeExpertTable& x = a.experts;
  const std::string shape = "experts d=" + std::to_string(x.d) + ", inter=" + std::to_string(x.inter);
  if (!gemm_detail::valid_tile_m(a.tile_rows))
    return make_error("cuda::moe_experts: tile_rows=" + std::to_string(a.tile_rows) + " (32, 64 or 128)");
  if (x.d <= 0 || x.inter <= 0 || x.d % 32 != 0 || x.inter % 32 != 0 || x.d / 32 > 0x3FFFFFFF ||
      x.inter / 32 > 0x3FFFFFFF)
    return make_error("cuda::moe_experts: " + shape + " (positive multiples of 32)");
  if (a.act_block != 32 && a.act_block != 128)
    return make_error("cuda::moe_experts: act_block=" + std::to_string(a.act_block) + " (32 or 128)");
  if (x.d % a.act_block != 0 || x.inter % a.act_block != 0)
    return make_error("cuda::moe_experts: " + shape + " not multiples of the activation block " +
                      std::to_string(a.act_block));
  int kb_shift = 0;
  if (x.format == QuantWeightFormat::FP8Block) {
    while ((int64_t{32} << kb_shift) < x.block_in) ++kb_shift;
    if (x.block_out <= 0 || x.block_out % 32 != 0 || x.block_in % a.act_block != 0 ||
        (int64_t{32} << kb_shift) != x.block_in)
      return make_error("cuda::moe_experts: FP8 block " + std::to_string(x.block_out) + "x" +
                        std::to_string(x.block_in) + " (block_out a multiple of 32, block_in 32·2^k >= act_block)");
  }
  if (a.route.n == 0) return Status::Ok();
  if (x.w1_data == nullptr || x.w1_scales == nullptr || x.w3_data == nullptr || x.w3_scales == nullptr ||
      x.w2_data == nullptr || x.w2_scales == nullptr || a.x_codes == nullptr || a.x_scales == nullptr ||
      a.h_codes == nullptr || a.h_scales == nullptr || a.y_rows == nullptr || a.perm.row_offsets == nullptr ||
      a.perm.tile_offsets == nullptr || a.perm.row_token == nullptr || a.perm.row_weight == nullptr)
    return make_error("cuda::moe_experts: null pointer (" + shape + ", " + route_str(a.route) + ")");
  const int64_t tiles = max_tiles(a.route, a.tile_rows);
  const bool fp4 = x.format == QuantWeightFormat::MXFP4;
  const int act_shift = a.act_block == 128 ? 2 : 0;

  // Up: h[r] = SwiGLU(W1 x[token r], W3 x[token r]) · w_r, quantized for W2; x rows gathered per row.
  Problem up;
  up.fp4 = fp4;
  up.act = a.x_codes;
  up.act_scales = a.x_scales;
  up.gather = a.perm.row_token;
  up.K = x.d;
  up.act_shift = act_shift;
  up.row_offsets = a.perm.row_offsets;
  up.tile_offsets = a.perm.tile_offsets;
  up.n_experts = static_cast<int>(a.route.n_experts);
  up.ew[0] = x.w1_data;
  up.ew[1] = x.w3_data;
  up.ews[0] = x.w1_scales;
  up.ews[1] = x.w3_scales;
  up.N = x.inter;
  up.dual = true;
  up.block_out = x.block_out;
  up.scale_cols = (x.d + x.block_in - 1) / x.block_in;
  up.kb_shift = fp4 ? 0 : kb_shift;
  up.kb_per_split = static_cast<int>(x.d / 32);
  up.epilogue = Epilogue::kSwiglu;
  up.row_weights = a.perm.row_weight;
  up.swiglu_limit = a.swiglu_limit;
  up.h_codes = a.h_codes;
  up.h_scales = a.h_scales;
  up.h_act_shift = act_shift;
  CEDAR_RETURN_IF_ERROR(gemm_detail::launch(up, a.tile_rows, tiles, 1, stream));

  // Down: y_rows[r] = bf16(W2 h[r]) in permuted order.
  Problem down = up;
  down.act = a.h_codes;
  down.act_scales = a.h_scales;
  down.gather = nullptr;
  down.K = x.inter;
  down.ew[0] = down.ew[1] = x.w2_data;
  down.ews[0] = down.ews[1] = x.w2_scales;
  down.N = x.d;
  down.dual = false;
  down.scale_cols = (x.inter + x.block_in - 1) / x.block_in;
  down.kb_per_split = static_cast<int>(x.inter / 32);
  down.epilogue = Epilogue::kBf16Bits;
  down.y_bf16 = a.y_rows;
  down.row_weights = nullptr;
  down.h_codes = nullptr;
  down.h_scales = nullptr;
  return gemm_detail::launch(down, a.tile_rows, tiles, 1, stream);
}

Status moe_prefill_combine(const MoePrefillCombineArgs& a, cudaStream_t stream) {
  if (a.n < 0 || a.topk < 1 || a.topk > 32 || a.d <= 0 || a.d % 8 != 0 || a.n_experts < 1 || a.n * a.topk > 0x7FFFFFFF)
    return make_error("cuda::moe_prefill_combine: n=" + std::to_string(a.n) + ", topk=" + std::to_string(a.topk) +
                      ", d=" + std::to_string(a.d) + " (topk 1..32, d a multiple of 8)");
  if (a.n == 0) return Status::Ok();
  if (a.expert_ids == nullptr || a.slot_row == nullptr || a.y_rows == nullptr || a.y == nullptr)
    return make_error("cuda::moe_prefill_combine: null pointer");
  if (reinterpret_cast<uintptr_t>(a.y_rows) % 16 != 0)
    return make_error("cuda::moe_prefill_combine: y_rows is not 16-byte aligned");
  if (a.n > 0x7FFFFFFF) return make_error("cuda::moe_prefill_combine: n=" + std::to_string(a.n));
  const int threads = static_cast<int>(std::min<int64_t>(256, (a.d / 8 + 31) / 32 * 32));
  moe_combine_kernel<<<static_cast<unsigned>(a.n), threads, static_cast<size_t>(a.topk) * sizeof(int32_t), stream>>>(
      a.expert_ids, a.slot_row, a.y_rows, a.shared, static_cast<int>(a.topk), a.d, static_cast<int>(a.n_experts), a.y);
  return launch_status("moe_combine_kernel");
}

}  // namespace cedar::cuda
