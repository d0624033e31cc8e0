// The tiled tensor-core kernel behind every FP8 / MXFP4 prefill GEMM (gemm_kernels.h).
//
// Arithmetic (as the decode GEMV, gemv.cu): the e4m3 weight (and the e2m1 weight, via e4m3, exactly) is
// converted in registers to f16, the activations are the f16 values of their e4m3 codes, so every
// product is exact; per 32-wide K block two mma.sync m16n8k16 (f16 × f16 → f32, C = 0) form the block's
// Σ q_a·q_w and it is added to the fp32 accumulator as acc = fma(blocksum, s_w·s_a, acc) — the scales are
// powers of two, so that is the reference's acc += blocksum·s_a·s_w rounded once — with the K blocks in
// ascending order. Unsplit, an output differs from cpu::linear only where the tensor core's block sum is
// not the CPU's sequential fp32 block sum (both are exact whenever the exact sum fits in fp32).
//
// Why mma.sync and not wgmma: wgmma (the only path to the top ~35 % of Hopper's f16 peak) needs the
// operands in shared memory in its swizzled descriptor layout, asynchronous-proxy fences and a
// producer/consumer warpgroup split to overlap the per-block scaling with the MMAs; written without a
// GPU to test on, one wrong descriptor bit is garbage or a hang. Every mma.sync operand is a per-thread
// register whose index math can be checked by reading, and the per-32-K scaling sits naturally between
// two HMMAs. The cost: mma.sync tops out well below wgmma's rate on Hopper (docs/cuda-log.md "Prefill GEMMs").
//
// Tile: 256 weight rows (4 warps × 64) × tile_m tokens (1 or 2 warps × 8·J), K in stages of 64 (two
// scale blocks) through a cp.async ring of 4 (FP8) / 5 (MXFP4) stages. Each warp holds a 64 × 8J
// accumulator; a thread's A fragments (4 m16 tiles of weights) are converted once per K block and
// reused by J token tiles. Within a K block thread t takes the 8 consecutive values 8t..8t+7 (the GEMV's
// permutation: the first MMA takes 8t+{0..3} in its k slots 2t, 2t+1, 2t+8, 2t+9, the second 8t+{4..7}),
// so the weight bytes and activation halves of a thread are contiguous 8- / 16-byte shared loads.
// Shared-memory layouts are XOR-swizzled per 16-byte chunk so that those loads and the cp.async stores
// are free of bank conflicts (see the swizzle functions).
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_internal.h"
#include "backend/cuda/gemv_common.cuh"

namespace cedar::cuda::gemm_detail {
namespace {

// The f16 HMMA and the exact e4m3 / e2m1 conversions of the decode GEMVs.
using gemv_detail::e2m1x4_to_e4m3x4;
using gemv_detail::e4m3x2_to_f16x2;
using gemv_detail::e4m3x2_hi_to_f16x2;
using gemv_detail::mma_f16;

template <bool kFp4_, int kWarpsM_, int kJ_>
struct Cfg {
  static constexpr bool kFp4 = kFp4_;
  static constexpr int kWarpsM = kWarpsM_;  // warps along tokens
  static constexpr int kJ = kJ_;            // 8-token MMA tiles per warp
  static constexpr int kWarpsN = 4;         // warps along weight rows (64 rows each)
  static constexpr int kWarps = kWarpsN * kWarpsM;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBN = 256;
  static constexpr int kBM = kWarpsM * 8 * kJ;
  static constexpr int kSub = 2;                              // 32-wide K blocks per stage
  static constexpr int kWRow = kFp4 ? 16 * kSub : 32 * kSub;  // weight bytes per row and stage
  static constexpr int kARow = 64 * kSub;                     // activation bytes (f16) per token and stage
  static constexpr int kStages = kFp4 ? 5 : 4;
  static constexpr int kActBytes = kBM * kARow;
  static constexpr int kWBytes = kBN * kWRow;
  static constexpr int kSaBytes = kSub * kBM * 4;  // activation scales [kSub][kBM] fp32
  static constexpr int kSwBytes = kSub * kBN * 4;  // weight scales per row [kSub][kBN] fp32
  static constexpr int kStageBytes = kActBytes + kWBytes + kSaBytes + kSwBytes;
  static constexpr int kOutStride = kBN + 4;  // floats per staged output row (bank offset 8)
  static constexpr int kEpiBytes = kBM * kOutStride * 4;
  static constexpr int kRingBytes = kStages * kStageBytes > kEpiBytes ? kStages* kStageBytes : kEpiBytes;
  // + the tile's activation rows (int32, −1 past the end) and the per-half weight bases (TileInfo).
  static constexpr int kSmem = kRingBytes + kBM * 4 + 64;
  static constexpr int kMinBlocks = kWarpsM == 2 ? 1 : 2;
  // Loader items per thread (16-byte chunks, 4-byte scales, weight-scale bytes).
  static constexpr int kActChunks = kBM * kARow / 16;
  static constexpr int kWChunks = kBN * kWRow / 16;
  static constexpr int kActPer = kActChunks / kThreads;
  static constexpr int kWPer = kWChunks / kThreads;
  static constexpr int kSaItems = kSub * kBM;
  static constexpr int kSaPer = (kSaItems + kThreads - 1) / kThreads;
  static constexpr int kSwPer = kSub * kBN / kThreads;
  static_assert(kActChunks % kThreads == 0 && kWChunks % kThreads == 0 && (kSub * kBN) % kThreads == 0);
  static_assert(kStageBytes % 128 == 0);
};

// ---- small device helpers -------------------------------------------------------------------------

using detail::cp_async16;
using detail::cp_async4;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::smem_addr;

// Shared-memory swizzles (16-byte chunk index XOR a function of the row):
//  * activations, rows of 128 B (8 chunks): a 16-byte read of 8 lanes covers tokens 2q, 2q+1 × the 4
//    chunks of one K block; XOR 4 on odd tokens puts them in the other 64-byte half of the banks.
//  * FP8 weights, rows of 64 B (4 chunks): an 8-byte read of 16 lanes covers rows 4q..4q+3 × one
//    32-byte K block; rows r and r+2 share banks unless bit 1 of the row flips the 32-byte half.
//  * MXFP4 weights, rows of 32 B (2 chunks): a 4-byte read of 32 lanes covers rows 8q..8q+7 × one
//    16-byte K block; rows r and r+4 share banks unless bit 2 of the row flips the chunk.
__device__ __forceinline__ int act_swizzle(int row) { return (row & 1) << 2; }
template <bool kFp4>
__device__ __forceinline__ int w_swizzle(int row) {
  return kFp4 ? (row >> 2) & 1 : ((row >> 1) & 1) << 1;
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ float clamp_swiglu(float v, float limit, bool both_sides) {
  v = v > limit ? limit : v;
  if (both_sides) v = v < -limit ? -limit : v;
  return v;
}

// e4m3 code (RNE, saturating) of v / s as its f16 bits, and the block scale — quantize_act_fp8's recipe
// (act_quant.cuh).
__device__ __forceinline__ uint16_t fp8_code_f16(float v, float s) { return detail::act_code_f16(v, s); }
__device__ __forceinline__ float act_scale_of(float amax_raw) { return detail::act_block_scale(amax_raw); }

// Loop-invariant tile facts kept in shared memory (read by the loaders) rather than in registers.
struct TileInfo {
  const uint8_t* w[2];   // weight bases of the two halves
  const uint8_t* ws[2];  // their scale bases
  int64_t hrow[2];       // first weight row of each half
};
static_assert(sizeof(TileInfo) <= 64);

// ---- the kernel -------------------------------------------------------------------------------------

template <typename C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) gemm_kernel(const Problem p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int wn = warp & 3, wm = warp >> 2;

  // ---- which tile: rows [row0, row0 + rows) of the output, weight rows from n0 ----
  int64_t row0 = 0;  // first output row (token / permuted row) of the tile
  int rows = 0;      // valid rows in the tile
  int64_t n_tile = 0;
  const uint8_t* wbase[2];
  const uint8_t* wsbase[2];
  if (p.row_offsets != nullptr) {
    const int tile = static_cast<int>(blockIdx.y);
    if (tile >= p.tile_offsets[p.n_experts]) return;  // past the schedule: the whole CTA leaves
    int lo = 0, hi = p.n_experts;                     // tile_offsets[lo] <= tile < tile_offsets[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (p.tile_offsets[mid] <= tile)
        lo = mid;
      else
        hi = mid;
    }
    const int e = lo;
    row0 = p.row_offsets[e] + static_cast<int64_t>(tile - p.tile_offsets[e]) * C::kBM;
    rows = static_cast<int>(min64(C::kBM, static_cast<int64_t>(p.row_offsets[e + 1]) - row0));
    n_tile = blockIdx.x;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wbase[h] = p.ew[h][e];
      wsbase[h] = p.ews[h][e];
    }
  } else {
    // Grouped raster: 8 row tiles share each weight tile while it is in L2.
    const int64_t num_n = n_tiles(p), num_m = (p.m + C::kBM - 1) / C::kBM;
    const int64_t pid = blockIdx.x, per_group = 8 * num_n;
    const int64_t first_m = (pid / per_group) * 8;
    const int64_t gsize = min64(num_m - first_m, 8);
    const int64_t in_group = pid % per_group;
    const int64_t m_tile = first_m + in_group % gsize;
    n_tile = in_group / gsize;
    row0 = m_tile * C::kBM;
    rows = static_cast<int>(min64(C::kBM, p.m - row0));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wbase[h] = p.w[h];
      wsbase[h] = p.ws[h];
    }
  }
  // Weight rows of the two halves: plain [n0, n0 + 256) of one matrix; dual [n0, n0 + 128) of each.
  const int64_t n0 = n_tile * (p.dual ? 128 : 256);

  const int n_kb = static_cast<int>(p.K >> 5);
  const int kb_begin = static_cast<int>(blockIdx.z) * p.kb_per_split;
  const int kb_end = min(n_kb, kb_begin + p.kb_per_split);
  const int n_kt = kb_end > kb_begin ? (kb_end - kb_begin + C::kSub - 1) / C::kSub : 0;
  const int64_t w_row_bytes = C::kFp4 ? p.K / 2 : p.K;
  const int64_t n_as = p.K >> (5 + p.act_shift);  // activation scales per row

  // ---- per-thread loader slots: chunk c = tid + q·threads of each stage ----
  // Only the (possibly gathered) activation rows are kept; weight rows and scale items are recomputed
  // from tid per stage, which costs a few integer ops and keeps registers for the accumulators.
  // The tile's activation rows (gathered for grouped W1/W3), −1 past the tile, in shared memory so the
  // loaders keep no per-row registers (the accumulators need them).
  int* const tile_rows = reinterpret_cast<int*>(smem + C::kRingBytes);
  TileInfo* const info = reinterpret_cast<TileInfo*>(smem + C::kRingBytes + C::kBM * 4);
  for (int r = tid; r < C::kBM; r += C::kThreads) {
    int64_t arow = -1;
    if (r < rows) arow = p.gather != nullptr ? p.gather[row0 + r] : row0 + r;
    tile_rows[r] = static_cast<int>(arow);
  }
  if (tid == 0) {
    *info = TileInfo{{wbase[0], wbase[1]}, {wsbase[0], wsbase[1]}, {n0, p.dual ? n0 : n0 + 128}};
  }
  __syncthreads();
  // Weight scales (bytes, decoded to fp32 in shared memory), item idx = (sub-block, row); rows past N
  // read row N−1 (valid memory; their outputs are never written).
  auto sw_byte = [&](int q, int kb0) -> uint32_t {
    const int idx = tid + q * C::kThreads, s = idx >> 8, r = idx & 255;
    const int64_t grow = min64(info->hrow[r >> 7] + (r & 127), p.N - 1);
    const uint8_t* sbase = info->ws[r >> 7];
    const int kb = min(kb0 + s, kb_end - 1);
    return C::kFp4 ? sbase[grow * n_kb + kb] : sbase[(grow / p.block_out) * p.scale_cols + (kb >> p.kb_shift)];
  };
  auto sw_decode = [](uint32_t b) -> float {
    // 2^(b−127) (byte 0: 2^-127); MXFP4 × 2^6 undoes the e2m1 → e4m3 shift.
    const float s = detail::ue8m0_scale(b);
    return C::kFp4 ? 64.0f * s : s;
  };

  uint8_t* const stage_base = smem;
  auto load_stage = [&](int st, int kb0) {
    uint8_t* base = stage_base + st * C::kStageBytes;
    const uint32_t a_s = smem_addr(base), w_s = smem_addr(base + C::kActBytes);
    const uint32_t sa_s = smem_addr(base + C::kActBytes + C::kWBytes);
#pragma unroll
    for (int q = 0; q < C::kActPer; ++q) {
      const int c = tid + q * C::kThreads, r = c >> 3, chunk = c & 7;
      const int arow = tile_rows[r];
      const bool ok = arow >= 0 && kb0 + (chunk >> 2) < kb_end;
      const uint16_t* src =
          ok ? p.act + static_cast<int64_t>(arow) * p.K + static_cast<int64_t>(kb0) * 32 + 8 * chunk : p.act;
      cp_async16(a_s + r * C::kARow + 16 * (chunk ^ act_swizzle(r)), src, ok);
    }
#pragma unroll
    for (int q = 0; q < C::kWPer; ++q) {
      const int c = tid + q * C::kThreads;
      const int r = C::kFp4 ? c >> 1 : c >> 2, chunk = C::kFp4 ? c & 1 : c & 3;
      const int64_t grow = info->hrow[r >> 7] + (r & 127);
      const bool ok = grow < p.N && kb0 + (C::kFp4 ? chunk : chunk >> 1) < kb_end;
      const uint8_t* src =
          ok ? info->w[r >> 7] + grow * w_row_bytes + static_cast<int64_t>(kb0) * (C::kFp4 ? 16 : 32) + 16 * chunk
             : reinterpret_cast<const uint8_t*>(p.act);
      cp_async16(w_s + r * C::kWRow + 16 * (chunk ^ w_swizzle<C::kFp4>(r)), src, ok);
    }
#pragma unroll
    for (int q = 0; q < C::kSaPer; ++q) {
      const int idx = tid + q * C::kThreads;
      if (idx < C::kSaItems) {
        const int s = idx / C::kBM, arow = tile_rows[idx % C::kBM];
        const bool ok = arow >= 0 && kb0 + s < kb_end;
        const float* src =
            ok ? p.act_scales + static_cast<int64_t>(arow) * n_as + ((kb0 + s) >> p.act_shift) : p.act_scales;
        cp_async4(sa_s + 4 * idx, src, ok);
      }
    }
  };
  auto sw_stage = [&](int st) {
    return reinterpret_cast<float*>(stage_base + st * C::kStageBytes + C::kActBytes + C::kWBytes + C::kSaBytes);
  };

  float acc[4][C::kJ][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < C::kJ; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;

  // Per-thread shared-memory read offsets (bytes), constant over stages.
  const int a_row_lo = wn * 64 + g;  // weight row of tile 0, MMA rows g (+8 for the upper half)
  const int tok_base = wm * 8 * C::kJ;
  int w_off[C::kSub];
#pragma unroll
  for (int s = 0; s < C::kSub; ++s) {
    w_off[s] = C::kFp4 ? a_row_lo * C::kWRow + 16 * (s ^ w_swizzle<true>(a_row_lo)) + 4 * t
                       : a_row_lo * C::kWRow + 16 * ((2 * s + (t >> 1)) ^ w_swizzle<false>(a_row_lo)) + 8 * (t & 1);
  }
  const int b_tok = tok_base + g;
  int b_off[C::kSub];
#pragma unroll
  for (int s = 0; s < C::kSub; ++s) b_off[s] = b_tok * C::kARow + 16 * ((4 * s + t) ^ act_swizzle(b_tok));

  auto compute = [&](int st, int kb0) {
    const uint8_t* base = stage_base + st * C::kStageBytes;
    const uint8_t* a_sm = base;
    const uint8_t* w_sm = base + C::kActBytes;
    const float* sa_sm = reinterpret_cast<const float*>(base + C::kActBytes + C::kWBytes);
    const float* sw_sm = sw_stage(st);
#pragma unroll
    for (int s = 0; s < C::kSub; ++s) {
      if (kb0 + s >= kb_end) break;  // uniform: the K tail's second block
      // A fragments (weights) of the 4 m16 tiles: [tile][MMA][reg].
      uint32_t a[4][2][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (C::kFp4) {
          const uint32_t lo = *reinterpret_cast<const uint32_t*>(w_sm + w_off[s] + i * 16 * C::kWRow);
          const uint32_t hi = *reinterpret_cast<const uint32_t*>(w_sm + w_off[s] + i * 16 * C::kWRow + 8 * C::kWRow);
          const uint32_t lo_e = e2m1x4_to_e4m3x4(lo & 0x0F0F0F0Fu), lo_o = e2m1x4_to_e4m3x4((lo >> 4) & 0x0F0F0F0Fu);
          const uint32_t hi_e = e2m1x4_to_e4m3x4(hi & 0x0F0F0F0Fu), hi_o = e2m1x4_to_e4m3x4((hi >> 4) & 0x0F0F0F0Fu);
          const uint32_t l0 = __byte_perm(lo_e, lo_o, 0x5140), l1 = __byte_perm(lo_e, lo_o, 0x7362);
          const uint32_t h0 = __byte_perm(hi_e, hi_o, 0x5140), h1 = __byte_perm(hi_e, hi_o, 0x7362);
          a[i][0][0] = e4m3x2_to_f16x2(l0);
          a[i][0][1] = e4m3x2_to_f16x2(h0);
          a[i][0][2] = e4m3x2_hi_to_f16x2(l0);
          a[i][0][3] = e4m3x2_hi_to_f16x2(h0);
          a[i][1][0] = e4m3x2_to_f16x2(l1);
          a[i][1][1] = e4m3x2_to_f16x2(h1);
          a[i][1][2] = e4m3x2_hi_to_f16x2(l1);
          a[i][1][3] = e4m3x2_hi_to_f16x2(h1);
        } else {
          const uint2 lo = *reinterpret_cast<const uint2*>(w_sm + w_off[s] + i * 16 * C::kWRow);
          const uint2 hi = *reinterpret_cast<const uint2*>(w_sm + w_off[s] + i * 16 * C::kWRow + 8 * C::kWRow);
          a[i][0][0] = e4m3x2_to_f16x2(lo.x);
          a[i][0][1] = e4m3x2_to_f16x2(hi.x);
          a[i][0][2] = e4m3x2_hi_to_f16x2(lo.x);
          a[i][0][3] = e4m3x2_hi_to_f16x2(hi.x);
          a[i][1][0] = e4m3x2_to_f16x2(lo.y);
          a[i][1][1] = e4m3x2_to_f16x2(hi.y);
          a[i][1][2] = e4m3x2_hi_to_f16x2(lo.y);
          a[i][1][3] = e4m3x2_hi_to_f16x2(hi.y);
        }
      }
      // Weight scales: MXFP4 per row (g, g+8 of each tile); FP8 per 32-row block (a tile pair).
      float sw_lo[4], sw_hi[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (C::kFp4) {
          sw_lo[i] = sw_sm[s * C::kBN + a_row_lo + 16 * i];
          sw_hi[i] = sw_sm[s * C::kBN + a_row_lo + 16 * i + 8];
        } else {
          sw_lo[i] = sw_hi[i] = sw_sm[s * C::kBN + wn * 64 + 32 * (i >> 1)];
        }
      }
      // Token tiles, one 16-byte operand load ahead; the empty asm keeps the compiler from hoisting
      // every tile's loads at once (registers belong to the accumulators).
      const uint8_t* b_ptr = a_sm + b_off[s];
      const float* sa_ptr = sa_sm + s * C::kBM + tok_base + 2 * t;
      uint4 b = *reinterpret_cast<const uint4*>(b_ptr);
      float2 sa = *reinterpret_cast<const float2*>(sa_ptr);
#pragma unroll
      for (int j = 0; j < C::kJ; ++j) {
        uint4 b_next = b;
        float2 sa_next = sa;
        if (j + 1 < C::kJ) {
          b_next = *reinterpret_cast<const uint4*>(b_ptr + (j + 1) * 8 * C::kARow);
          sa_next = *reinterpret_cast<const float2*>(sa_ptr + 8 * (j + 1));
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma_f16(a[i][0], b.x, b.y, d);
          mma_f16(a[i][1], b.z, b.w, d);
          // Power-of-two scales: fma(d, s_w·s_a, acc) = acc + d·s_a·s_w rounded once (the reference).
          acc[i][j][0] = fmaf(d[0], sw_lo[i] * sa.x, acc[i][j][0]);
          acc[i][j][1] = fmaf(d[1], sw_lo[i] * sa.y, acc[i][j][1]);
          acc[i][j][2] = fmaf(d[2], sw_hi[i] * sa.x, acc[i][j][2]);
          acc[i][j][3] = fmaf(d[3], sw_hi[i] * sa.y, acc[i][j][3]);
        }
        asm volatile("" ::: "memory");
        b = b_next;
        sa = sa_next;
      }
    }
  };

  // ---- pipeline: stages 0..S-2 in flight before the loop; stage kt+S-1 issued in iteration kt ----
  // Weight scales travel through registers: loaded (ld.global) with their stage's cp.async, stored to
  // shared memory one iteration later, consumed at least one barrier after that.
  uint32_t sw_regs = 0;  // kSwPer (<= 4) scale bytes, packed
  static_assert(C::kSwPer <= 4);
#pragma unroll
  for (int st = 0; st < C::kStages - 1; ++st) {
    if (st < n_kt) {
      const int kb0 = kb_begin + st * C::kSub;
      load_stage(st, kb0);
      float* sw = sw_stage(st);
#pragma unroll
      for (int q = 0; q < C::kSwPer; ++q) sw[tid + q * C::kThreads] = sw_decode(sw_byte(q, kb0));
    }
    cp_async_commit();
  }
  for (int kt = 0; kt < n_kt; ++kt) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();                          // stage kt landed for every thread; everyone is done with stage kt-1
    const int pending = kt + C::kStages - 2;  // stage whose scales sit in sw_regs (loaded last iteration)
    if (kt >= 1 && pending < n_kt) {
      float* sw = sw_stage(pending % C::kStages);
#pragma unroll
      for (int q = 0; q < C::kSwPer; ++q) sw[tid + q * C::kThreads] = sw_decode((sw_regs >> (8 * q)) & 0xFFu);
    }
    const int next = kt + C::kStages - 1;
    if (next < n_kt) {
      const int kb0 = kb_begin + next * C::kSub;
      load_stage(next % C::kStages, kb0);
      sw_regs = 0;
#pragma unroll
      for (int q = 0; q < C::kSwPer; ++q) sw_regs |= sw_byte(q, kb0) << (8 * q);
    }
    cp_async_commit();
    compute(kt % C::kStages, kb_begin + kt * C::kSub);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: stage the tile for a coalesced epilogue

  // ---- epilogue: accumulators → shared [token][256 weight rows] ----
  float* ot = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < C::kJ; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int wrow = a_row_lo + 16 * i + 8 * (c >> 1);
        const int tok = tok_base + 8 * j + 2 * t + (c & 1);
        ot[tok * C::kOutStride + wrow] = acc[i][j][c];
      }
  __syncthreads();

  if (p.epilogue == Epilogue::kSwiglu) {
    // Column i of the tile: g in [0, 128), u in [128, 256). One warp per token row, lane = channel.
    const bool clamp = p.swiglu_limit > 0.0f;
    const int64_t i0 = n0;
    const int64_t scale_cols = p.N >> (5 + p.h_act_shift);
    for (int r = warp; r < rows; r += C::kWarps) {
      const int64_t orow = row0 + r;
      const float wt = p.row_weights != nullptr ? p.row_weights[orow] : 1.0f;
      float h[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int i = 32 * q + lane;
        float gv = detail::round_bf16(ot[r * C::kOutStride + i]);
        float uv = detail::round_bf16(ot[r * C::kOutStride + 128 + i]);
        if (clamp) {  // gate from above only, up on both sides; NaN passes (as torch.clamp / the CPU)
          gv = clamp_swiglu(gv, p.swiglu_limit, false);
          uv = clamp_swiglu(uv, p.swiglu_limit, true);
        }
        // silu(g)·u in fp32 as the CPU: g / (1 + exp(−g)) · u; exp in double rounded to float.
        const float e = static_cast<float>(exp(-static_cast<double>(gv)));
        float hv = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, e)), uv);
        if (p.row_weights != nullptr) hv = __fmul_rn(wt, hv);
        h[q] = detail::round_bf16(hv);
      }
      uint16_t* codes = p.h_codes + orow * p.N + i0;
      float* scales = p.h_scales + orow * scale_cols;
      if (p.h_act_shift == 0) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (i0 + 32 * q >= p.N) break;  // uniform; N % 32 == 0
          const float s = act_scale_of(detail::warp_max(fabsf(h[q])));
          codes[32 * q + lane] = fp8_code_f16(h[q], s);
          if (lane == 0) scales[(i0 >> 5) + q] = s;
        }
      } else {  // one 128-wide block (V4): N % 128 == 0, i0 % 128 == 0
        const float amax = fmaxf(fmaxf(fabsf(h[0]), fabsf(h[1])), fmaxf(fabsf(h[2]), fabsf(h[3])));
        const float s = act_scale_of(detail::warp_max(amax));
#pragma unroll
        for (int q = 0; q < 4; ++q) codes[32 * q + lane] = fp8_code_f16(h[q], s);
        if (lane == 0) scales[i0 >> 7] = s;
      }
    }
    return;
  }

  // Plain tiles: output columns [n0, n0 + 256) of rows row0 + r.
  const bool bf16_bits = p.epilogue == Epilogue::kBf16Bits;
  const bool round = p.epilogue == Epilogue::kF32 && p.bf16_round;
  float* ybase = p.y;
  int64_t ld = p.ldy;
  if (p.epilogue == Epilogue::kPartial) ybase = p.y + static_cast<int64_t>(blockIdx.z) * p.m * p.ldy;
  if (bf16_bits) ld = p.N;
  const bool full_cols = n0 + 256 <= p.N;
  const bool vec =
      full_cols && (ld % 4 == 0) &&
      (bf16_bits ? (reinterpret_cast<uintptr_t>(p.y_bf16) % 8 == 0) : (reinterpret_cast<uintptr_t>(ybase) % 16 == 0));
  for (int r = warp; r < rows; r += C::kWarps) {
    const int64_t orow = row0 + r;
#pragma unroll
    for (int c4 = lane; c4 < 64; c4 += 32) {
      float4 v = *reinterpret_cast<const float4*>(ot + r * C::kOutStride + 4 * c4);
      const int64_t col = n0 + 4 * c4;
      if (bf16_bits) {
        const __nv_bfloat16 b[4] = {__float2bfloat16_rn(v.x), __float2bfloat16_rn(v.y), __float2bfloat16_rn(v.z),
                                    __float2bfloat16_rn(v.w)};
        uint16_t bits[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) bits[e] = __bfloat16_as_ushort(b[e]);
        uint16_t* dst = p.y_bf16 + orow * ld + col;
        if (vec) {
          *reinterpret_cast<uint2*>(dst) = make_uint2(bits[0] | (static_cast<uint32_t>(bits[1]) << 16),
                                                      bits[2] | (static_cast<uint32_t>(bits[3]) << 16));
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (col + e < p.N) dst[e] = bits[e];
        }
      } else {
        if (round) {
          v.x = detail::round_bf16(v.x);
          v.y = detail::round_bf16(v.y);
          v.z = detail::round_bf16(v.z);
          v.w = detail::round_bf16(v.w);
        }
        float* dst = ybase + orow * ld + col;
        if (vec) {
          *reinterpret_cast<float4*>(dst) = v;
        } else {
          const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (col + e < p.N) dst[e] = vs[e];
        }
      }
    }
  }
}

// Split-K: y[r, c] = Σ_z partials[z][r][c] in split order (optionally bf16-rounded).
__global__ void splitk_reduce_kernel(const float* partials, int splits, int64_t m, int64_t n, float* y, int64_t ldy,
                                     bool round) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= m * n) return;
  const int64_t r = idx / n, c = idx % n;
  float s = partials[idx];
  for (int z = 1; z < splits; ++z) s += partials[static_cast<int64_t>(z) * m * n + idx];
  y[r * ldy + c] = round ? detail::round_bf16(s) : s;
}

template <typename C>
Status launch_cfg(const Problem& p, int64_t m_tiles, int splits, cudaStream_t stream) {
  const auto kernel = gemm_kernel<C>;
  CEDAR_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  const int64_t nt = n_tiles(p);
  dim3 grid;
  if (p.row_offsets != nullptr) {
    if (m_tiles > 65535) return make_error("cuda::gemm: " + std::to_string(m_tiles) + " row tiles (at most 65535)");
    grid = dim3(static_cast<unsigned>(nt), static_cast<unsigned>(m_tiles), 1);
  } else {
    if (nt * m_tiles > 0x7FFFFFFF) return make_error("cuda::gemm: too many tiles");
    grid = dim3(static_cast<unsigned>(nt * m_tiles), 1, static_cast<unsigned>(splits));
  }
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(p);
  return launch_status("gemm_kernel");
}

}  // namespace

Status launch(const Problem& p, int tile_m, int64_t m_tiles, int splits, cudaStream_t stream) {
  if (m_tiles <= 0 || n_tiles(p) <= 0) return Status::Ok();
  if (splits < 1 || splits > 65535) return make_error("cuda::gemm: splits=" + std::to_string(splits));
  switch (tile_m) {
    case 128:
      return p.fp4 ? launch_cfg<Cfg<true, 2, 8>>(p, m_tiles, splits, stream)
                   : launch_cfg<Cfg<false, 2, 8>>(p, m_tiles, splits, stream);
    case 64:
      return p.fp4 ? launch_cfg<Cfg<true, 1, 8>>(p, m_tiles, splits, stream)
                   : launch_cfg<Cfg<false, 1, 8>>(p, m_tiles, splits, stream);
    case 32:
      return p.fp4 ? launch_cfg<Cfg<true, 1, 4>>(p, m_tiles, splits, stream)
                   : launch_cfg<Cfg<false, 1, 4>>(p, m_tiles, splits, stream);
    default:
      return make_error("cuda::gemm: tile_m=" + std::to_string(tile_m) + " (32, 64 or 128)");
  }
}

Status splitk_reduce(const float* partials, int splits, int64_t m, int64_t n, float* y, int64_t ldy, bool round,
                     cudaStream_t stream) {
  const int64_t total = m * n;
  if (total == 0) return Status::Ok();
  const int64_t blocks = (total + 255) / 256;
  splitk_reduce_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(partials, splits, m, n, y, ldy, round);
  return launch_status("splitk_reduce_kernel");
}

const void* gemm_fp8_kernel_ptr() { return reinterpret_cast<const void*>(&gemm_kernel<Cfg<false, 2, 8>>); }
const void* gemm_mxfp4_kernel_ptr() { return reinterpret_cast<const void*>(&gemm_kernel<Cfg<true, 2, 8>>); }

}  // namespace cedar::cuda::gemm_detail
