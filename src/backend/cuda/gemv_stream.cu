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

constexpr int kStreamWarps = 4;  // per block (warps never wait on each other: no block barrier)
constexpr int kStages = 3;       // chunks per warp's ring: two in flight while one is computed
constexpr int kGroupKb = 4;      // K blocks per compute group (gemv.cu's chunk)
constexpr int kTileFloats = kRowsPerBlock * kTokensPerTile;

// A chunk: 16 rows × kChunkKb K blocks (32·kChunkKb bytes of each row). Rows sit 32·kChunkKb + 32 bytes
// apart in the stage, so the MMA-order reads (thread (g, t): 8 bytes at row g, column 8t) of any 16
// threads hit distinct banks. Wider chunks read longer runs of each row per request (DRAM pages) with
// fewer warps: the rings fill the SM's shared memory at 6 / 4 / 2 blocks.
template <int kChunkKb_>
struct Geometry {
  static constexpr int kChunkKb = kChunkKb_;
  static constexpr int kRowBytes = kChunkKb * 32;
  static constexpr int kRowPitch = kRowBytes + 32;
  static constexpr int kChunkBytes = kRowsPerBlock * kRowPitch;
  static constexpr int kRingBytes = kStreamWarps * kStages * kChunkBytes;  // per block
  static constexpr int kBlocksPerSm = kChunkKb <= 4 ? 6 : kChunkKb <= 8 ? 4 : 2;
  static_assert(kChunkKb % kGroupKb == 0);
};

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

// Warp w's run: units start(w) .. start(w + 1), start(w) = w·q + min(w, r) (q = ⌊U/W⌋, r = U mod W: the
// first r runs hold one unit more). All in 32 bits (U < 2^31), no 64-bit division on the warp's path.
__device__ __forceinline__ int run_start(int w, const StreamParams& p) { return w * p.per_warp + min(w, p.extra); }
// The warp whose run holds unit a.
__device__ __forceinline__ int warp_of(int a, const StreamParams& p) {
  const int long_units = p.extra * (p.per_warp + 1);
  return a < long_units ? a / (p.per_warp + 1) : p.extra + (a - long_units) / p.per_warp;
}

// This lane's share of one chunk's copy: row lane / 2, bytes 32j + 16·(lane % 2) (j < kChunkKb) of the
// row's chunk — each copy instruction takes one whole 32-byte sector of all 16 rows; every address on
// both sides is a lane base plus an immediate.
template <class G>
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
    src = row + c * G::kRowBytes;
    k_left = static_cast<int>(p.in) - c * G::kRowBytes;
  }
  __device__ __forceinline__ void issue(uint32_t dst) {
    if (row_ok && k_left >= G::kRowBytes) {
#pragma unroll
      for (int j = 0; j < G::kChunkKb; ++j) cp_async_weight16(dst + j * 32, src + j * 32, 16u);
    } else {  // a partial tile's missing rows or the K tail: zero fill (in % 32 == 0: whole sectors)
#pragma unroll
      for (int j = 0; j < G::kChunkKb; ++j) {
        const bool ok = row_ok && 32 * j < k_left;
        cp_async_weight16(dst + j * 32, ok ? src + j * 32 : row, ok ? 16u : 0u);
      }
    }
    src += G::kRowBytes;
    k_left -= G::kRowBytes;
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

  __device__ __forceinline__ void advance(int kb, bool scale_step) {
    act += kb * 32;
    as0 += kb;
    as1 += kb;
    if (scale_step) s_row += kb;
    kb0 += kb;
  }
};

__device__ __forceinline__ TileOperands tile_operands_of(const StreamParams& p, int T, int kb0, int lane,
                                                         bool scale_step) {
  int z, x;
  locate_tile(p, T, z, x);
  const GemvOperands& op = p.ops[z];
  const int g = lane >> 2, t = lane & 3;
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

// One group (K blocks kb0 .. kb0+3 of the tile) from its stage (at this lane's row g, column 8t) into
// acc: gemv.cu's gemv_chunk with the weights from shared memory. kFull: all four blocks inside K;
// otherwise blocks past K have zero weights (cp.async zero fill) and sa = 0.
template <int kRowPitch, bool kFull, bool kScaleStep, bool kOne>
__device__ __forceinline__ void compute_group(uint32_t w_at, const TileOperands& o, int n_kb, int kb_shift,
                                              float (&acc)[4]) {
  uint2 w_lo[kGroupKb], w_hi[kGroupKb];
  uint4 act[kGroupKb];
  float sw[kGroupKb], sa0[kGroupKb], sa1[kGroupKb];
#pragma unroll
  for (int u = 0; u < kGroupKb; ++u) {
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
  for (int u = 0; u < kGroupKb; ++u) {
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
  const int first_unit = T * p.chunks;
  const int w_first = warp_of(first_unit, p);
  const int pieces = warp_of(first_unit + p.chunks - 1, p) - w_first + 1;
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

template <class G, bool kScaleStep, bool kOne>
__global__ void __launch_bounds__(kStreamWarps * 32, G::kBlocksPerSm) gemv_stream_kernel(StreamParams p) {
  extern __shared__ __align__(128) uint8_t ring[];  // [kStreamWarps][kStages][kChunkBytes]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int warp_id = static_cast<int>(blockIdx.x) * kStreamWarps + warp;
  if (warp_id >= p.warps_total) return;  // whole warps; nothing below waits on another warp
  const int u_begin = run_start(warp_id, p);
  const int run = run_start(warp_id + 1, p) - u_begin;
  const uint32_t ring0 =
      static_cast<uint32_t>(__cvta_generic_to_shared(ring)) + warp * (kStages * G::kChunkBytes);
  const int n_kb = static_cast<int>(p.in / 32);
  // This lane's stage offsets: its copy destination (row lane / 2, piece lane % 2) and its MMA read
  // position (row g, column 8t).
  const uint32_t copy_at = (lane >> 1) * G::kRowPitch + (lane & 1) * 16;
  const uint32_t read_at = (lane >> 2) * G::kRowPitch + (lane & 3) * 8;

  detail::pdl_launch_dependents();
  // The first kStages − 1 chunks are requested before the wait: weights never depend on the previous
  // kernel. Every step commits a group (empty past the run), so wait_group counts stay uniform.
  Producer<G> prod;
  const int tile0 = u_begin / p.chunks, c0 = u_begin - tile0 * p.chunks;
  int pt = tile0, pc = c0;
  prod.set_tile(p, pt, pc, lane);
  int to_issue = run;
  auto issue_next = [&](int slot) {
    if (to_issue-- > 0) {
      prod.issue(ring0 + slot * G::kChunkBytes + copy_at);
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

  int tile = tile0, c = c0;
  TileOperands o = tile_operands_of(p, tile, c * G::kChunkKb, lane, kScaleStep);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int slot = 0;
  for (int i = 0; i < run; ++i) {
    issue_next(slot == 0 ? kStages - 1 : slot - 1);  // the stage computed last step
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const uint32_t w_at = ring0 + slot * G::kChunkBytes + read_at;
#pragma unroll
    for (int gi = 0; gi < G::kChunkKb / kGroupKb; ++gi) {
      if (o.kb0 + kGroupKb <= n_kb)
        compute_group<G::kRowPitch, true, kScaleStep, kOne>(w_at + gi * kGroupKb * 32, o, n_kb, p.kb_shift, acc);
      else if (o.kb0 < n_kb)
        compute_group<G::kRowPitch, false, kScaleStep, kOne>(w_at + gi * kGroupKb * 32, o, n_kb, p.kb_shift, acc);
      o.advance(kGroupKb, kScaleStep);
    }
    __syncwarp();  // every lane has read the stage before it is refilled
    slot = slot == kStages - 1 ? 0 : slot + 1;
    if (++c == p.chunks || i + 1 == run) {
      finish_tile(p, tile, o, warp_id, lane, acc);
      acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
      c = 0;
      if (i + 1 < run) o = tile_operands_of(p, ++tile, 0, lane, kScaleStep);
    }
  }
  cp_async_wait<0>();  // no copy may outlive the warp's shared memory
}

// The rings' dynamic shared memory, and the largest carveout (the SM's unified L1 / shared memory given
// to shared memory: kBlocksPerSm rings must fit; the activations are small enough for the L1 left).
template <class G, bool kScaleStep, bool kOne>
Status prepare(const char* name) {
  const auto kernel = gemv_stream_kernel<G, kScaleStep, kOne>;
  CEDAR_RETURN_IF_ERROR(
      cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, G::kRingBytes), name));
  return cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared),
      name);
}

template <class G>
int occupancy_of() {
  int per_sm = 0;
  if (!prepare<G, true, true>("gemv_stream_kernel").ok() ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_stream_kernel<G, true, true>, kStreamWarps * 32,
                                                    G::kRingBytes) != cudaSuccess ||
      per_sm <= 0) {
    (void)cudaGetLastError();
    return G::kBlocksPerSm;
  }
  return per_sm;
}

template <class G>
StreamPlan plan_for(int64_t tiles, int64_t in) {
  StreamPlan s;
  s.chunk_kb = G::kChunkKb;
  s.chunks = (in / 32 + G::kChunkKb - 1) / G::kChunkKb;
  s.units = tiles * s.chunks;
  if (s.units <= 0) return s;
  // The resident warps, but at least kStreamMinUnits chunks per warp so a tile's partials stay few.
  const int64_t resident = static_cast<int64_t>(occupancy_of<G>()) * device_sm_count() * kStreamWarps;
  s.warps_total = std::max<int64_t>(1, std::min(resident, s.units / kStreamMinUnits));
  const int64_t least = s.units / s.warps_total;  // every run holds at least this many units (run_start)
  s.pieces_max = std::min<int64_t>(s.chunks, 1 + (s.chunks - 1 + least - 1) / least);
  s.blocks = (s.warps_total + kStreamWarps - 1) / kStreamWarps;
  return s;
}

template <class G>
Status launch_for(const StreamParams& p, int64_t blocks, bool scale_step, cudaStream_t stream, bool pdl) {
  const dim3 grid(static_cast<unsigned>(blocks)), block(kStreamWarps * 32);
  const size_t smem = G::kRingBytes;
  if (scale_step) {
    if (p.n == 1) {
      CEDAR_RETURN_IF_ERROR((prepare<G, true, true>("gemv_stream_kernel<one token>")));
      return launch_kernel(gemv_stream_kernel<G, true, true>, grid, block, smem, stream, pdl,
                           "gemv_stream_kernel<one token>", p);
    }
    CEDAR_RETURN_IF_ERROR((prepare<G, true, false>("gemv_stream_kernel")));
    return launch_kernel(gemv_stream_kernel<G, true, false>, grid, block, smem, stream, pdl, "gemv_stream_kernel", p);
  }
  if (p.n == 1) {
    CEDAR_RETURN_IF_ERROR((prepare<G, false, true>("gemv_stream_kernel<wide scale blocks, one token>")));
    return launch_kernel(gemv_stream_kernel<G, false, true>, grid, block, smem, stream, pdl,
                         "gemv_stream_kernel<wide scale blocks, one token>", p);
  }
  CEDAR_RETURN_IF_ERROR((prepare<G, false, false>("gemv_stream_kernel<wide scale blocks>")));
  return launch_kernel(gemv_stream_kernel<G, false, false>, grid, block, smem, stream, pdl,
                       "gemv_stream_kernel<wide scale blocks>", p);
}

}  // namespace

StreamPlan plan_gemv_stream(int64_t tiles, int64_t in, int chunk_kb) {
  if (chunk_kb == 4) return plan_for<Geometry<4>>(tiles, in);
  if (chunk_kb == 8) return plan_for<Geometry<8>>(tiles, in);
  return plan_for<Geometry<16>>(tiles, in);
}

SplitKSize stream_workspace_size(int64_t tiles, int64_t in) {
  SplitKSize most;
  for (const int kb : {4, 8, 16}) {
    const StreamPlan s = plan_gemv_stream(tiles, in, kb);
    if (s.units <= 0 || s.pieces_max <= 1) continue;
    most.partial_floats = std::max(most.partial_floats, tiles * s.pieces_max * kTileFloats);
    most.counters = std::max(most.counters, tiles);
  }
  return most;
}

Status launch_gemv_stream(const StreamParams& p, const StreamPlan& plan, bool scale_step, cudaStream_t stream,
                          bool pdl) {
  if (plan.chunk_kb == 4) return launch_for<Geometry<4>>(p, plan.blocks, scale_step, stream, pdl);
  if (plan.chunk_kb == 8) return launch_for<Geometry<8>>(p, plan.blocks, scale_step, stream, pdl);
  return launch_for<Geometry<16>>(p, plan.blocks, scale_step, stream, pdl);
}

}  // namespace cedar::cuda::gemv_detail
