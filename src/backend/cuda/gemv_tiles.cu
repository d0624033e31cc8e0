// MXFP4 GEMV over the tile layout (ffn_kernels.h "MXFP4 tile layout"): the balanced packed kernel's
// arithmetic (gemv_common.cuh packed_block_math, the same 4-warp K partition, the same order: the same
// bits) with another memory side. The packed kernel holds a pair of K groups in registers per warp (44
// registers of loads), which caps it at 128 registers and 16 warps per SM; it is bound by per-warp
// latency with too few warps to hide it (s12: half the warps, twice the time; L2-resident weights, 5 %).
// Here each warp streams its groups into its own shared-memory ring with TMA bulk copies (one 2 176-byte
// chunk per group: the 32 rows' words and scales, contiguous in the tile layout), issued by its lane 0
// as slots free up, so the loads cost no registers: 64 registers, 8 blocks of 4 warps (32 warps) per SM,
// and the weight bytes in flight do not depend on the warps' progress.
#include <algorithm>
#include <string>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda {
namespace {

using namespace gemv_detail;

constexpr int kTileRows = 32;
constexpr int kTileWarps = 4;  // the K split of a unit: gemv_packed.cu's default (kItemsWarps)
constexpr int kTileBlocksPerSm = 8;
// Chunks in flight per warp. 3 slots were slower on both cards: s25 H200 batch 1 w1/w3 / w2 26.4 / 17.5 µs against
// 25.0 / 15.8 with 2 (batch 8 157.9 / 89.7 against 155.7 / 88.6); s26 H100 33.1 / 20.5 against 30.2 / 17.7.
constexpr int kTileSlots = 2;
constexpr int kWeightBytes = 2048;  // a chunk: [u 4][lane 32][row i 4] words, then [u 4][g 8][row i 4] scale bytes
constexpr int kChunkBytes = kWeightBytes + 128;
static_assert(kChunkBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
static_assert(kTileRows * kTokensPerTile * sizeof(float) <= kChunkBytes, "a warp's partial sums fit its slot 0");

struct TilesParams {
  const DeviceGemvItem* items;
  const int32_t* count;
  int64_t capacity;
  int64_t out, in, tiles;
  bool bf16_output;
  unsigned* work;  // or null: [next unit, blocks done] (GemvItemsOptions::work)
  // GemvItemsOptions::l2_prefetch (pf_items null: none); pf_tiles row tiles and pf_unit_bytes per matrix unit.
  const DeviceGemvItem* pf_items;
  const int32_t* pf_count;
  int64_t pf_capacity, pf_tiles, pf_unit_bytes, pf_max_bytes;
  bool pf_after_units;
};

// The prefetch table's live units, cut into pieces of at most kPrefetchPiece bytes, one piece per thread of
// the grid (grid-stride): each a TMA bulk prefetch into L2, which no thread waits for.
constexpr int64_t kPrefetchPiece = 4096;
__device__ void prefetch_table_l2(const TilesParams& p) {
  int64_t matrices = *p.pf_count;
  matrices = matrices < 0 ? 0 : (matrices > p.pf_capacity ? p.pf_capacity : matrices);
  const int64_t units = matrices * p.pf_tiles;
  if (units * p.pf_unit_bytes > p.pf_max_bytes) return;
  const int64_t per_unit = (p.pf_unit_bytes + kPrefetchPiece - 1) / kPrefetchPiece;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < units * per_unit; i += stride) {
    const int64_t unit = i / per_unit, off = (i % per_unit) * kPrefetchPiece;
    const uint8_t* src = p.pf_items[unit / p.pf_tiles].data + (unit % p.pf_tiles) * p.pf_unit_bytes + off;
    detail::bulk_prefetch_l2(src, static_cast<unsigned>(min(kPrefetchPiece, p.pf_unit_bytes - off)));
  }
}

// Slot `bar` expects one chunk; the bulk copy completes it (weights evict-first in L2, as ld_weight).
__device__ __forceinline__ void fetch_chunk(uint64_t* bar, void* dst, const uint8_t* src, uint64_t policy) {
  detail::mbar_expect_tx(bar, kChunkBytes);
  detail::bulk_copy(dst, src, kChunkBytes, bar, policy);
}

__device__ __forceinline__ float comp_of(const float4& v, int u) {
  return u == 0 ? v.x : u == 1 ? v.y : u == 2 ? v.z : v.w;
}

// One warp's K groups [q_begin, q_end) of one unit: chunk k waits in slot k % kTileSlots; once the warp has
// read it, lane 0 refills the slot with chunk k + kTileSlots. `phases` carries each slot's parity across units.
template <bool kOne, bool kExpAdd>
__device__ __forceinline__ void tiles_k_loop(const uint8_t* chunks, int q_begin, int q_end, uint8_t* ring,
                                             uint64_t* bars, unsigned& phases, const uint16_t* a_row,
                                             const float* as0, const float* as1, uint64_t policy,
                                             float (&acc)[2][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2;
  const int mine = q_end - q_begin;
  if (lane == 0)
    for (int s = 0; s < kTileSlots && s < mine; ++s)
      fetch_chunk(&bars[s], ring + s * kChunkBytes, chunks + int64_t{q_begin + s} * kChunkBytes, policy);
  // Pointers step by constants (no per-block address arithmetic): activations 128 codes and 4 scales per group.
  const uint8_t* next = chunks + int64_t{q_begin + kTileSlots} * kChunkBytes;
  a_row += q_begin * 128;
  as0 += q_begin * 4;
  as1 += q_begin * 4;
  int s = 0;
  for (int k = 0; k < mine; ++k) {
    const float4 sa0 = __ldg(reinterpret_cast<const float4*>(as0));
    const float4 sa1 = __ldg(reinterpret_cast<const float4*>(as1));
    detail::mbar_wait(&bars[s], (phases >> s) & 1u);
    phases ^= 1u << s;
    const uint8_t* c = ring + s * kChunkBytes;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint4 wv = *reinterpret_cast<const uint4*>(c + u * 512 + lane * 16);
      const uint32_t sb = *reinterpret_cast<const uint32_t*>(c + kWeightBytes + u * 32 + g * 4);
      const uint4 av = __ldg(reinterpret_cast<const uint4*>(a_row + u * 32));
      const uint32_t w[4] = {wv.x, wv.y, wv.z, wv.w};
      const uint32_t b[4] = {sb & 0xFFu, (sb >> 8) & 0xFFu, (sb >> 16) & 0xFFu, sb >> 24};
      packed_block_math<kOne, kExpAdd>(w, b, av, comp_of(sa0, u), comp_of(sa1, u), acc);
    }
    if (k + kTileSlots < mine) {
      __syncwarp();  // every lane has read slot s
      if (lane == 0) fetch_chunk(&bars[s], ring + s * kChunkBytes, next, policy);
      next += kChunkBytes;
    }
    a_row += 128;
    as0 += 4;
    as1 += 4;
    s = s + 1 == kTileSlots ? 0 : s + 1;
  }
}

// Block = 4 warps = one (matrix, 32-row tile) unit at a time, K split as the balanced packed kernel;
// blocks loop over the units (work counter or fixed stride, as gemv_mxfp4_packed_kernel).
// kPrefetch: p.pf_items is set (GemvItemsOptions::l2_prefetch); the instances without it compile as before.
template <bool kExpAdd, bool kPrefetch>
__global__ void __launch_bounds__(kTileWarps * 32, kTileBlocksPerSm) gemv_mxfp4_tiles_kernel(TilesParams p) {
  extern __shared__ __align__(128) uint8_t rings[];  // [warp][slot][kChunkBytes]
  __shared__ __align__(8) uint64_t bars[kTileWarps][kTileSlots];
  __shared__ int64_t next_unit;
  detail::pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tok0 = 2 * t, tok1 = 2 * t + 1;
  if (lane == 0) {
    for (int s = 0; s < kTileSlots; ++s) detail::mbar_init(&bars[warp][s]);
    detail::mbar_init_fence();
  }
  __syncwarp();
  // Under PDL: the item table (which experts) and the activations come from the previous kernels.
  detail::pdl_wait();
  const int n_kb = static_cast<int>(p.in / 32);
  const int n_groups = n_kb / 4;
  const int q_begin = n_groups * warp / kTileWarps, q_end = n_groups * (warp + 1) / kTileWarps;
  int64_t matrices = *p.count;
  matrices = matrices < 0 ? 0 : (matrices > p.capacity ? p.capacity : matrices);
  const int64_t units = matrices * p.tiles;
  uint8_t* ring = rings + warp * kTileSlots * kChunkBytes;
  float* partial = reinterpret_cast<float*>(ring);  // slot 0 after the warp's last chunk: [32 rows][8 tokens]
  const uint64_t policy = detail::l2_evict_first_policy();
  unsigned phases = 0;
  unsigned* const work = p.work;
  if (kPrefetch && !p.pf_after_units) prefetch_table_l2(p);
  for (int64_t unit = blockIdx.x; unit < units; unit = work ? next_unit : unit + gridDim.x) {
    int64_t claimed = 0;
    if (work != nullptr && threadIdx.x == 0) claimed = gridDim.x + int64_t{atomicAdd(work, 1u)};
    const int64_t m = unit / p.tiles, tile = unit % p.tiles;
    const DeviceGemvItem* it = p.items + m;
    const int n = min(max(it->n, 0), kTokensPerTile);
    const int32_t* act_row = it->act_row;
    const uint16_t* a_row = it->act_codes + int64_t{act_row[g < n ? g : 0]} * p.in + t * 8;
    const float* as0 = it->act_scales + int64_t{act_row[tok0 < n ? tok0 : 0]} * n_kb;
    const float* as1 = it->act_scales + int64_t{act_row[tok1 < n ? tok1 : 0]} * n_kb;
    const uint8_t* chunks = it->data + tile * n_groups * int64_t{kChunkBytes};
    float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    if (n == 1)  // block-uniform
      tiles_k_loop<true, kExpAdd>(chunks, q_begin, q_end, ring, bars[warp], phases, a_row, as0, as1, policy, acc);
    else
      tiles_k_loop<false, kExpAdd>(chunks, q_begin, q_end, ring, bars[warp], phases, a_row, as0, as1, policy, acc);
    __syncwarp();  // every lane has read the warp's last chunk: slot 0 takes the partial sums
#pragma unroll
    for (int rt = 0; rt < 2; ++rt) {
      partial[(16 * rt + g) * kTokensPerTile + tok0] = acc[rt][0];
      partial[(16 * rt + g) * kTokensPerTile + tok1] = acc[rt][1];
      partial[(16 * rt + g + 8) * kTokensPerTile + tok0] = acc[rt][2];
      partial[(16 * rt + g + 8) * kTokensPerTile + tok1] = acc[rt][3];
    }
    __syncthreads();  // every partial is stored; every thread has read `unit`: next_unit may change
    if (work != nullptr && threadIdx.x == 0) next_unit = claimed;
    const int64_t row0 = tile * kTileRows;
    for (int e = threadIdx.x; e < kTileRows * kTokensPerTile; e += blockDim.x) {
      const int row = e / kTokensPerTile, tok = e % kTokensPerTile;
      float sum = 0.0f;
      for (int ww = 0; ww < kTileWarps; ++ww)  // warp order, as the packed kernel
        sum += reinterpret_cast<const float*>(rings + ww * kTileSlots * kChunkBytes)[row * kTokensPerTile + tok];
      if (tok < n) it->y[int64_t{it->y_row[tok]} * p.out + row0 + row] = p.bf16_output ? detail::round_bf16(sum) : sum;
    }
    // The partials (generic-proxy accesses) are done before the next unit's bulk copies (async proxy)
    // overwrite slot 0.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
  }
  if (kPrefetch && p.pf_after_units) prefetch_table_l2(p);
  if (work != nullptr && threadIdx.x == 0 && atomicAdd(work + 1, 1u) == gridDim.x - 1) {
    work[0] = 0;
    work[1] = 0;
  }
}

}  // namespace

bool mxfp4_tileable(int64_t out, int64_t in) { return mxfp4_packable(out, in) && out % kTileRows == 0; }

uint64_t mxfp4_tiles_bytes(int64_t out, int64_t in) {
  const uint64_t values = static_cast<uint64_t>(out) * static_cast<uint64_t>(in);
  return values / 2 + values / 32;  // e2m1 codes + one scale byte per 32
}

Status repack_mxfp4_tiles(const uint8_t* plain, const uint8_t* scales, int64_t out, int64_t in, uint8_t* tiles) {
  if (!mxfp4_tileable(out, in))
    return make_error("repack_mxfp4_tiles: shape " + std::to_string(out) + "×" + std::to_string(in) +
                      " (out must be a positive multiple of 32, in of 128)");
  if (plain == nullptr || scales == nullptr || tiles == nullptr)
    return make_error("repack_mxfp4_tiles: null data, scales or destination");
  const int64_t row_bytes = in / 2, n_kb = in / 32, n_groups = in / 128;
  for (int64_t tile = 0; tile < out / kTileRows; ++tile)
    for (int64_t q = 0; q < n_groups; ++q) {
      uint8_t* chunk = tiles + (tile * n_groups + q) * kChunkBytes;
      for (int u = 0; u < 4; ++u)
        for (int g = 0; g < 8; ++g)
          for (int i = 0; i < 4; ++i) {
            const int64_t r = tile * kTileRows + g + 8 * i;
            chunk[kWeightBytes + u * 32 + g * 4 + i] = scales[r * n_kb + 4 * q + u];
            for (int t = 0; t < 4; ++t) {
              // Thread t's 4 bytes of K block 4q + u (values 8t .. 8t + 7) as the packed layout's word.
              const uint8_t* b = plain + r * row_bytes + 64 * q + 16 * u + 4 * t;
              const uint8_t code[8] = {uint8_t(b[0] & 15), uint8_t(b[0] >> 4), uint8_t(b[1] & 15), uint8_t(b[1] >> 4),
                                       uint8_t(b[2] & 15), uint8_t(b[2] >> 4), uint8_t(b[3] & 15), uint8_t(b[3] >> 4)};
              const uint32_t w = e2m1_f16_word(code);
              uint8_t* dst = chunk + u * 512 + (g * 4 + t) * 16 + i * 4;
              for (int j = 0; j < 4; ++j) dst[j] = static_cast<uint8_t>(w >> (8 * j));
            }
          }
    }
  return Status::Ok();
}

namespace gemv_detail {
Status gemv_mxfp4_tiles_items(const QuantWeightView& shape, const DeviceGemvItem* items, const int32_t* count,
                              int64_t capacity, bool bf16_output, cudaStream_t stream,
                              const GemvItemsOptions& options) {
  const char* who = "cuda::gemv_quantized_items(tiles)";
  if (shape.format != QuantWeightFormat::MXFP4 || !mxfp4_tileable(shape.out, shape.in))
    return make_error(std::string(who) + ": MXFP4 with out a multiple of 32 and in of 128 (got " +
                      std::to_string(shape.out) + "×" + std::to_string(shape.in) + ")");
  if (items == nullptr || count == nullptr || capacity <= 0 || capacity > (int64_t{1} << 24))
    return make_error(std::string(who) + ": items, count and a capacity in [1, 2^24] are required (capacity " +
                      std::to_string(capacity) + ")");
  if (options.packed_warps != 0)
    return make_error(std::string(who) + ": packed_warps: the tile layout splits K over 4 warps only");
  TilesParams p{};
  p.items = items;
  p.count = count;
  p.capacity = capacity;
  p.out = shape.out;
  p.in = shape.in;
  p.tiles = shape.out / kTileRows;
  p.bf16_output = bf16_output;
  p.work = options.work;
  const TilesL2Prefetch& pf = options.l2_prefetch;
  if (pf.items != nullptr) {
    if (pf.count == nullptr || pf.capacity <= 0 || pf.capacity > (int64_t{1} << 24) || !mxfp4_tileable(pf.out, pf.in))
      return make_error(std::string(who) + ": l2_prefetch needs a count, a capacity in [1, 2^24] and a tile shape (got " +
                        std::to_string(pf.out) + "×" + std::to_string(pf.in) + ", capacity " +
                        std::to_string(pf.capacity) + ")");
    p.pf_items = pf.items;
    p.pf_count = pf.count;
    p.pf_capacity = pf.capacity;
    p.pf_tiles = pf.out / kTileRows;
    p.pf_unit_bytes = pf.in / 128 * int64_t{kChunkBytes};
    p.pf_max_bytes = pf.max_bytes > 0 ? pf.max_bytes : device_l2_bytes() / 4 * 3;
    p.pf_after_units = pf.after_units;
  }
  const size_t smem = static_cast<size_t>(kTileWarps) * kTileSlots * kChunkBytes;
  auto kernel = options.scale_exp_add ? (p.pf_items ? gemv_mxfp4_tiles_kernel<true, true> : gemv_mxfp4_tiles_kernel<true, false>)
                                      : (p.pf_items ? gemv_mxfp4_tiles_kernel<false, true> : gemv_mxfp4_tiles_kernel<false, false>);
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kTileWarps * 32, smem) != cudaSuccess ||
      per_sm <= 0) {
    (void)cudaGetLastError();
    per_sm = kTileBlocksPerSm;
  }
  const int64_t wave = static_cast<int64_t>(per_sm) * device_sm_count();
  const auto grid = static_cast<unsigned>(std::min<int64_t>(capacity * p.tiles, wave));
  return launch_kernel(kernel, dim3(grid), dim3(kTileWarps * 32), smem, stream, options.programmatic_launch,
                       "gemv_mxfp4_tiles_kernel", p);
}
}  // namespace gemv_detail

}  // namespace cedar::cuda
