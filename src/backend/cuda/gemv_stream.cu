// The FP8 GEMV as a weight stream (GemvSchedule::Stream): warp-persistent, each warp pipelines its own
// contiguous run of 2 KiB weight chunks through shared memory with cp.async.
//
// Why: the tile schedule (gemv.cu: a block per 16-row tile, its warps splitting K) issues a chunk's
// loads, waits for them and computes, so every chunk costs a full HBM round trip per warp; short-K
// matrices (wq_b: 2 048 tiles of 10 chunks) also pay a prologue, an epilogue and a tail wave per block
// (s15: wq_b at 56 % of copy, ~2.5 TB/s even with its weights in L2). Here the grid is the resident
// warps; warp w owns the units ⌊w·U/W⌋ .. ⌊(w+1)·U/W⌋ of the U = tiles × chunks units (row-tile major),
// keeps kStages − 1 chunks in flight while it computes one, and its first chunks are requested before
// griddepcontrol.wait (under PDL they arrive while the previous kernel runs). A tile shared by several
// warps meets in the split-K workspace: each writes its partial to slot (w − the tile's first warp), the
// last to take the tile's ticket adds the slots in slot order — deterministic, and re-armed for replays.
//
// The arithmetic per K block is gemv.cu's (two f16 m16n8k16 MMAs on exact e4m3 → f16 conversions, the
// power-of-two scales per block in fp32); only the order of the K blocks' sums differs.
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma_bf16.cuh"
#include "backend/cuda/gemv_stream.h"

namespace cedar::cuda::gemv_detail {
namespace {

constexpr int kStreamWarps = 4;        // per block (warps never wait on each other: no block barrier)
constexpr int kStreamBlocksPerSm = 6;  // 24 warps per SM at 80 registers (30 KiB of rings per block)
constexpr int kStages = 3;             // chunks per warp's ring: two in flight while one is computed
constexpr int kChunkKb = 4;            // K blocks per chunk: 128 bytes of each row
constexpr int kRowPitch = kChunkKb * 32 + 32;                // a row's 128 bytes + 32 of padding
constexpr int kChunkBytes = kRowsPerBlock * kRowPitch;        // 2 KiB of weights per stage
constexpr int kTileFloats = kRowsPerBlock * kTokensPerTile;

// 16 bytes global → shared, L2 evict-first (the weights are read once per step: detail::ld_weight);
// src_bytes 0 fills zeros without reading (rows past `out`, K past `in`).
__device__ __forceinline__ void cp_async_weight16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile(
      "{ .reg .b64 pol; createpolicy.fractional.L2::evict_first.b64 pol, 1.0; "
      "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, pol; }" ::"r"(dst),
      "l"(src), "r"(src_bytes)
      : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ uint2 lds64(uint32_t a) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a));
  return v;
}

// The matrix z and its row tile x of global tile T (tile_end: cumulative tiles per matrix).
__device__ __forceinline__ void locate_tile(const StreamParams& p, int T, int& z, int& x) {
  z = 0;
  while (z + 1 < p.count && T >= p.tile_end[z]) ++z;
  x = T - (z > 0 ? p.tile_end[z - 1] : 0);
}

// The first warp whose run holds unit a: the largest w with ⌊w·U/W⌋ <= a.
__device__ __forceinline__ int first_warp_of(int64_t a, const StreamParams& p) {
  return static_cast<int>(((a + 1) * p.warps_total - 1) / p.units);
}

// This lane's share of one chunk's copy: row lane / 2, bytes 32j + 16·(lane % 2) (j = 0..3) of the
// row's 128 — each copy instruction takes one whole 32-byte sector of all 16 rows. Rows sit
// kRowPitch = 160 bytes apart in the stage, so the MMA-order reads (thread (g, t): 8 bytes at row g,
// column 8t) of any 16 threads hit distinct banks, and every address on both sides is a lane base plus
// an immediate.
struct Producer {
  const uint8_t* src;  // this lane's row and piece at the next chunk
  const uint8_t* row;  // the same at K 0 (valid memory: the source of zero-filled pieces)
  bool row_ok;         // the row exists (the last tile of a matrix may be partial)
  int k_left;          // bytes of the row left from the next chunk on

  __device__ void set_tile(const StreamParams& p, int T, int c, int lane) {
    int z, x;
    locate_tile(p, T, z, x);
    const GemvOperands& op = p.ops[z];
    const int r = x * kRowsPerBlock + (lane >> 1);
    row_ok = r < op.out;
    row = op.w + static_cast<int64_t>(row_ok ? r : 0) * p.in + (lane & 1) * 16;
    src = row + c * (kChunkKb * 32);
    k_left = static_cast<int>(p.in) - c * (kChunkKb * 32);
  }
  __device__ __forceinline__ void issue(uint32_t dst) {
    if (row_ok && k_left >= kChunkKb * 32) {
#pragma unroll
      for (int j = 0; j < kChunkKb; ++j) cp_async_weight16(dst + j * 32, src + j * 32, 16u);
    } else {  // a partial tile's missing rows or the K tail: zero fill (in % 32 == 0: whole sectors)
#pragma unroll
      for (int j = 0; j < kChunkKb; ++j) {
        const bool ok = row_ok && 32 * j < k_left;
        cp_async_weight16(dst + j * 32, ok ? src + j * 32 : row, ok ? 16u : 0u);
      }
    }
    src += kChunkKb * 32;
    k_left -= kChunkKb * 32;
  }
};

// The consumer's operands at the current chunk (thread g = lane / 4, t = lane % 4 of the MMA layouts),
// advanced by constant strides per chunk.
struct TileOperands {
  const uint16_t* act;   // token g's codes at the chunk's K, + 8t
  const float* as0;      // activation scales of tokens 2t, 2t+1 at the chunk's K block
  const float* as1;
  const uint8_t* s_row;  // the tile's weight scale row (kScaleStep: at the chunk's K block)
  int kb0;               // the chunk's first K block
  float* y;
  int32_t y_stride;
  int32_t row0, out;

  __device__ __forceinline__ void next_chunk(bool scale_step) {
    act += kChunkKb * 32;
    as0 += kChunkKb;
    as1 += kChunkKb;
    if (scale_step) s_row += kChunkKb;
    kb0 += kChunkKb;
  }
};

__device__ __forceinline__ TileOperands tile_operands_of(const StreamParams& p, int T, int c, int lane,
                                                         bool scale_step) {
  int z, x;
  locate_tile(p, T, z, x);
  const GemvOperands& op = p.ops[z];
  const int g = lane >> 2, t = lane & 3;
  const int kb0 = c * kChunkKb;
  TileOperands o;
  o.row0 = x * kRowsPerBlock;
  o.out = static_cast<int32_t>(op.out);
  o.act = op.act + static_cast<int64_t>(g < p.n ? g : 0) * op.act_stride + t * 8 + kb0 * 32;
  o.as0 = op.act_scales + static_cast<int64_t>(2 * t < p.n ? 2 * t : 0) * op.scale_stride + kb0;
  o.as1 = op.act_scales + static_cast<int64_t>(2 * t + 1 < p.n ? 2 * t + 1 : 0) * op.scale_stride + kb0;
  o.s_row = op.w_scales + static_cast<int64_t>(o.row0 / p.block_out) * p.scale_cols + (scale_step ? kb0 : 0);
  o.kb0 = kb0;
  o.y = op.y;
  o.y_stride = op.y_stride;
  return o;
}

// One chunk (K blocks kb0 .. kb0+3 of the tile) from its stage (at this lane's row g, column 8t) into
// acc: gemv.cu's gemv_chunk with the weights from shared memory. kFull: all four blocks inside K;
// otherwise blocks past K have zero weights (cp.async zero fill) and sa = 0.
template <bool kFull, bool kScaleStep, bool kOne>
__device__ __forceinline__ void compute_chunk(uint32_t w_at, const TileOperands& o, int n_kb, int kb_shift,
                                              float (&acc)[4]) {
  uint2 w_lo[kChunkKb], w_hi[kChunkKb];
  uint4 act[kChunkKb];
  float sw[kChunkKb], sa0[kChunkKb], sa1[kChunkKb];
#pragma unroll
  for (int u = 0; u < kChunkKb; ++u) {
    const bool k_ok = kFull || o.kb0 + u < n_kb;
    const int off = k_ok ? u : -o.kb0;  // past K: block 0 (valid memory; sa = 0 drops it)
    act[u] = __ldg(reinterpret_cast<const uint4*>(o.act + off * 32));
    w_lo[u] = lds64(w_at + u * 32);
    w_hi[u] = lds64(w_at + 8 * kRowPitch + u * 32);
    sw[u] = detail::ue8m0_scale(__ldg(kScaleStep ? o.s_row + off : o.s_row + ((o.kb0 + off) >> kb_shift)));
    sa0[u] = k_ok ? __ldg(o.as0 + off) : 0.0f;
    sa1[u] = k_ok && !kOne ? __ldg(o.as1 + off) : 0.0f;
  }
#pragma unroll
  for (int u = 0; u < kChunkKb; ++u) {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint32_t a1[4] = {e4m3x2_to_f16x2(w_lo[u].x), e4m3x2_to_f16x2(w_hi[u].x), e4m3x2_hi_to_f16x2(w_lo[u].x),
                            e4m3x2_hi_to_f16x2(w_hi[u].x)};
    mma_f16(a1, act[u].x, act[u].y, d);
    const uint32_t a2[4] = {e4m3x2_to_f16x2(w_lo[u].y), e4m3x2_to_f16x2(w_hi[u].y), e4m3x2_hi_to_f16x2(w_lo[u].y),
                            e4m3x2_hi_to_f16x2(w_hi[u].y)};
    mma_f16(a2, act[u].z, act[u].w, d);
    acc[0] += d[0] * (sw[u] * sa0[u]);
    acc[2] += d[2] * (sw[u] * sa0[u]);
    if (!kOne) {
      acc[1] += d[1] * (sw[u] * sa1[u]);
      acc[3] += d[3] * (sw[u] * sa1[u]);
    }
  }
}

// This warp's sums of tile T: stored, or met with the other warps' partials (ticket; slot order).
__device__ __forceinline__ void finish_tile(const StreamParams& p, int T, const TileOperands& o, int warp_id,
                                            int lane, float (&acc)[4]) {
  const int64_t first_unit = static_cast<int64_t>(T) * p.chunks;
  const int w_first = first_warp_of(first_unit, p);
  const int pieces = first_warp_of(first_unit + p.chunks - 1, p) - w_first + 1;
  float v[4] = {acc[0], acc[1], acc[2], acc[3]};
  if (pieces > 1) {
    float* slots = p.partials + static_cast<int64_t>(T) * p.pieces_max * kTileFloats;
    const int mine = warp_id - w_first;
    __stcg(reinterpret_cast<float4*>(slots + mine * kTileFloats) + lane, make_float4(v[0], v[1], v[2], v[3]));
    __threadfence();
    __syncwarp();
    unsigned ticket = 0;
    if (lane == 0) ticket = atomicAdd(p.counters + T, 1u);
    ticket = __shfl_sync(detail::kFullMask, ticket, 0);
    if (ticket != static_cast<unsigned>(pieces - 1)) return;
    __threadfence();
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < pieces; ++j) {
      const float4 q = j == mine ? make_float4(v[0], v[1], v[2], v[3])
                                 : __ldcg(reinterpret_cast<const float4*>(slots + j * kTileFloats) + lane);
      s[0] += q.x;
      s[1] += q.y;
      s[2] += q.z;
      s[3] += q.w;
    }
    if (lane == 0) p.counters[T] = 0;  // re-armed for the next launch / graph replay
    for (int i = 0; i < 4; ++i) v[i] = s[i];
  }
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = o.row0 + g + (i >> 1) * 8;
    const int tok = 2 * t + (i & 1);
    if (r < o.out && tok < p.n) o.y[static_cast<int64_t>(tok) * o.y_stride + r] = p.bf16_output ? detail::round_bf16(v[i]) : v[i];
  }
}

template <bool kScaleStep, bool kOne>
__global__ void __launch_bounds__(kStreamWarps * 32, kStreamBlocksPerSm) gemv_stream_kernel(StreamParams p) {
  __shared__ __align__(128) uint8_t ring[kStreamWarps][kStages][kChunkBytes];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int warp_id = static_cast<int>(blockIdx.x) * kStreamWarps + warp;
  if (warp_id >= p.warps_total) return;  // whole warps; nothing below waits on another warp
  const int64_t u_begin = static_cast<int64_t>(warp_id) * p.units / p.warps_total;
  const int run = static_cast<int>(static_cast<int64_t>(warp_id + 1) * p.units / p.warps_total - u_begin);
  const uint32_t ring0 = static_cast<uint32_t>(__cvta_generic_to_shared(&ring[warp][0][0]));
  const int n_kb = static_cast<int>(p.in / 32);
  // This lane's stage offsets: its copy destination (row lane / 2, piece lane % 2) and its MMA read
  // position (row g, column 8t).
  const uint32_t copy_at = (lane >> 1) * kRowPitch + (lane & 1) * 16;
  const uint32_t read_at = (lane >> 2) * kRowPitch + (lane & 3) * 8;

  detail::pdl_launch_dependents();
  // The first kStages − 1 chunks are requested before the wait: weights never depend on the previous
  // kernel. Every step commits a group (empty past the run), so wait_group counts stay uniform.
  Producer prod;
  int pt = static_cast<int>(u_begin / p.chunks), pc = static_cast<int>(u_begin % p.chunks);
  prod.set_tile(p, pt, pc, lane);
  int to_issue = run;
  auto issue_next = [&](int slot) {
    if (to_issue-- > 0) {
      prod.issue(ring0 + slot * kChunkBytes + copy_at);
      if (++pc == p.chunks && to_issue > 0) {
        pc = 0;
        prod.set_tile(p, ++pt, 0, lane);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_next(s);
  detail::pdl_wait();

  int tile = static_cast<int>(u_begin / p.chunks), c = static_cast<int>(u_begin % p.chunks);
  TileOperands o = tile_operands_of(p, tile, c, lane, kScaleStep);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int slot = 0;
  for (int i = 0; i < run; ++i) {
    issue_next(slot == 0 ? kStages - 1 : slot - 1);  // the stage computed last step
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const uint32_t w_at = ring0 + slot * kChunkBytes + read_at;
    if (o.kb0 + kChunkKb <= n_kb)
      compute_chunk<true, kScaleStep, kOne>(w_at, o, n_kb, p.kb_shift, acc);
    else
      compute_chunk<false, kScaleStep, kOne>(w_at, o, n_kb, p.kb_shift, acc);
    __syncwarp();  // every lane has read the stage before it is refilled
    slot = slot == kStages - 1 ? 0 : slot + 1;
    o.next_chunk(kScaleStep);
    if (++c == p.chunks || i + 1 == run) {
      finish_tile(p, tile, o, warp_id, lane, acc);
      acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
      c = 0;
      if (i + 1 < run) o = tile_operands_of(p, ++tile, 0, lane, kScaleStep);
    }
  }
  cp_async_wait<0>();  // no copy may outlive the warp's shared memory
}

template <bool kScaleStep, bool kOne>
int occupancy_of() {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_stream_kernel<kScaleStep, kOne>,
                                                    kStreamWarps * 32, 0) != cudaSuccess ||
      per_sm <= 0) {
    (void)cudaGetLastError();
    return kStreamBlocksPerSm;
  }
  return per_sm;
}

}  // namespace

StreamPlan plan_gemv_stream(int64_t tiles, int64_t in) {
  StreamPlan s;
  s.chunks = (in / 32 + kChunkKb - 1) / kChunkKb;
  s.units = tiles * s.chunks;
  if (s.units <= 0) return s;
  // Resident warps (every instance has the same budget: 80 registers, 30 KiB of rings per block), but at
  // least kMinUnits chunks per warp so a tile's partials stay few.
  static_assert(kStages >= 2);
  const int64_t resident = static_cast<int64_t>(occupancy_of<true, true>()) * device_sm_count() * kStreamWarps;
  s.warps_total = std::max<int64_t>(1, std::min(resident, s.units / kStreamMinUnits));
  const int64_t least = s.units / s.warps_total;  // every run holds at least this many units
  s.pieces_max = std::min<int64_t>(s.chunks, 1 + (s.chunks - 1 + least - 1) / least);
  s.blocks = (s.warps_total + kStreamWarps - 1) / kStreamWarps;
  return s;
}

SplitKSize stream_workspace_size(int64_t tiles, int64_t in) {
  const StreamPlan s = plan_gemv_stream(tiles, in);
  if (s.units <= 0 || s.pieces_max <= 1) return {};
  return SplitKSize{tiles * s.pieces_max * kTileFloats, tiles};
}

Status launch_gemv_stream(const StreamParams& p, int64_t blocks, bool scale_step, cudaStream_t stream, bool pdl) {
  const dim3 grid(static_cast<unsigned>(blocks)), block(kStreamWarps * 32);
  if (scale_step) {
    if (p.n == 1)
      return launch_kernel(gemv_stream_kernel<true, true>, grid, block, 0, stream, pdl,
                           "gemv_stream_kernel<one token>", p);
    return launch_kernel(gemv_stream_kernel<true, false>, grid, block, 0, stream, pdl, "gemv_stream_kernel", p);
  }
  if (p.n == 1)
    return launch_kernel(gemv_stream_kernel<false, true>, grid, block, 0, stream, pdl,
                         "gemv_stream_kernel<wide scale blocks, one token>", p);
  return launch_kernel(gemv_stream_kernel<false, false>, grid, block, 0, stream, pdl,
                       "gemv_stream_kernel<wide scale blocks>", p);
}

}  // namespace cedar::cuda::gemv_detail
