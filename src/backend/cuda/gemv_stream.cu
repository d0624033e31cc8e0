// The FP8 GEMV as a weight stream (GemvSchedule::Stream): warp-persistent, each warp pipelines its own
// contiguous run of chunks — 16 weight rows × 8 K blocks (4 KiB) with the chunk's activation codes and
// scales — through shared memory with cp.async.
//
// Why: the tile schedule (gemv.cu: a block per 16-row tile, its warps splitting K) issues a chunk's
// loads, waits for them and computes, so every chunk costs a full HBM round trip per warp; short-K
// matrices (wq_b: 2 048 tiles of 10 chunks) also pay a prologue, an epilogue and a tail wave per block
// (s15: wq_b at 56 % of copy, ~2.5 TB/s even with its weights in L2). Here the grid is the resident
// warps; warp w owns a contiguous run of the U = tiles × chunks units (row-tile major), keeps
// kStages − 1 chunks in flight while it computes one, and its first weights are requested before
// griddepcontrol.wait (under PDL they arrive while the previous kernel runs). Every operand of a chunk
// sits in its stage, so the MMA chain waits on shared memory only (s16: with the activations read from
// global memory per K group the kernel was no faster with L2-resident weights — the load latency in
// the chain, not DRAM, limited it). A tile shared by several warps meets in the split-K workspace: each
// writes its partial to slot (w − the tile's first warp), the last to take the tile's ticket adds the
// slots in slot order — deterministic, and re-armed for replays.
//
// The arithmetic per K block is gemv.cu's (two f16 m16n8k16 MMAs on exact e4m3 → f16 conversions, the
// power-of-two scales per block in fp32); only the order of the K blocks' sums differs. Past K, past the
// matrix's rows and past the tile's tokens the stage is zero-filled, so those terms are exact zeros.
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_stream.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda::gemv_detail {
namespace {

constexpr int kStreamWarps = 4;  // per block (warps never wait on each other: no block barrier)
constexpr int kStages = 3;       // chunks per warp's ring: two in flight while one is computed
constexpr int kChunkKb = 8;      // K blocks per chunk (s16: 8 beat 4 and 16 — 256 bytes of each row)
constexpr int kGroupKb = 4;      // K blocks per compute group (gemv.cu's chunk)
constexpr int kTileFloats = kRowsPerBlock * kTokensPerTile;
constexpr int kRowBytes = kChunkKb * 32;

// One stage: the weights (16 rows, kWeightPitch apart so the MMA-order reads — thread (g, t): 8 bytes
// at row g, column 8t — of any 16 threads hit distinct banks), kTokens activation rows (f16 codes,
// kActPitch apart: tokens g and g + 1 read 16 banks apart), their scales, and the tile's weight scales.
template <int kTokens_>
struct Stage {
  static constexpr int kTokens = kTokens_;                 // 1 (the one-token kernel) or 8
  static constexpr int kWeightPitch = kRowBytes + 32;      // 288
  static constexpr int kActPitch = kChunkKb * 64 + 64;     // 576
  static constexpr int kAct = kRowsPerBlock * kWeightPitch;
  static constexpr int kScales = kAct + kTokens * kActPitch;  // kTokens × kChunkKb floats
  static constexpr int kWScales = kScales + kTokens * kChunkKb * 4;  // kChunkKb bytes
  static constexpr int kBytes = (kWScales + kChunkKb + 15) / 16 * 16;
  static constexpr int kRingBytes = kStreamWarps * kStages * kBytes;  // per block
  static constexpr int kBlocksPerSm = kTokens == 1 ? 3 : 2;          // as many rings as fit 227 KiB
  static_assert(kStreamWarps * kStages * kBytes * kBlocksPerSm <= 227 * 1024);
};

// cp.async: 16 bytes global → shared (.cg), the weights with an L2 evict-first policy (read once per
// step: detail::ld_weight); src_bytes 0 fills zeros without reading. 4 bytes (.ca) for the weight scales.
__device__ __forceinline__ void cp_async_weight16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile(
      "{ .reg .b64 pol; createpolicy.fractional.L2::evict_first.b64 pol, 1.0; "
      "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, pol; }" ::"r"(dst),
      "l"(src), "r"(src_bytes)
      : "memory");
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
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
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a));
  return v;
}

// The matrix z and its row tile x of global tile T (tile_end: cumulative tiles per matrix).
__device__ __forceinline__ void locate_tile(const StreamParams& p, int T, int& z, int& x) {
  z = 0;
  while (z + 1 < p.count && T >= p.tile_end[z]) ++z;
  x = T - (z > 0 ? p.tile_end[z - 1] : 0);
}

// Item i: row tile i / ksplit, chunks [L·(i mod ksplit), min(C, L·(i mod ksplit + 1))) of it. Warp w takes
// items w, w + W, w + 2W, …, so at any time the warps stream one contiguous band of the matrix, as the
// tile schedule's blocks do (s16: with each warp on its own contiguous run the accesses spread over the
// whole matrix and HBM latency under load tripled — ~5.5 µs for the same bandwidth).
struct Item {
  int tile, slot, c_begin, c_end;
};
__device__ __forceinline__ Item item_of(int i, const StreamParams& p) {
  Item it;
  it.tile = i / p.ksplit;
  it.slot = i - it.tile * p.ksplit;
  it.c_begin = it.slot * p.item_chunks;
  it.c_end = min(p.chunks, it.c_begin + p.item_chunks);
  return it;
}

// This lane's share of one chunk's copies, each a lane base plus an immediate: weights — row lane / 2,
// bytes 32j + 16·(lane % 2) (each instruction one whole 32-byte sector of all 16 rows); activation codes
// — token j·(32 / kActPieces)... (kChunkKb·64 bytes per token: lane's 16-byte piece); activation scales —
// lanes 0 .. 2·kTokens − 1; weight scales (kScaleStep) — lanes 0, 1 (4 bytes each).
template <class S, bool kScaleStep>
struct Producer {
  static constexpr int kActPieces = kChunkKb * 64 / 16;  // per token: 32
  static_assert(kActPieces == 32, "one activation piece per lane and token");
  const uint8_t* w;      // this lane's weight row and piece at the next chunk
  const uint8_t* w_row;  // the same at K 0 (valid memory: the source of zero-filled pieces)
  const uint8_t* act;    // this lane's activation piece (token 0) at the next chunk
  const uint8_t* act0;   // the same at K 0
  const uint8_t* sa;     // lanes < 2·kTokens: token lane / 2's scales, piece lane % 2, at the next chunk
  const uint8_t* sa0;
  const uint8_t* sw;     // lanes 0, 1 (kScaleStep): the tile's weight scales, 4 bytes each, next chunk
  const uint8_t* sw0;
  int64_t act_stride;    // bytes between tokens' codes
  bool row_ok;           // the weight row exists (the last tile of a matrix may be partial)
  int k_left;            // bytes of a weight row left from the next chunk on
  int n;                 // tokens in the tile

  __device__ void set_tile(const StreamParams& p, int T, int c, int lane) {
    int z, x;
    locate_tile(p, T, z, x);
    const GemvOperands& op = p.ops[z];
    const int r = x * kRowsPerBlock + (lane >> 1);
    row_ok = r < op.out;
    w_row = op.w + static_cast<int64_t>(row_ok ? r : 0) * p.in + (lane & 1) * 16;
    act_stride = static_cast<int64_t>(op.act_stride) * 2;
    act0 = reinterpret_cast<const uint8_t*>(op.act) + lane * 16;
    const int tok = min(lane >> 1, p.n - 1);
    sa0 = reinterpret_cast<const uint8_t*>(op.act_scales + static_cast<int64_t>(tok) * op.scale_stride) + (lane & 1) * 16;
    sw0 = op.w_scales + static_cast<int64_t>(x * kRowsPerBlock / p.block_out) * p.scale_cols + (lane & 1) * 4;
    const int kb0 = c * kChunkKb;
    w = w_row + kb0 * 32;
    act = act0 + kb0 * 64;
    sa = sa0 + kb0 * 4;
    sw = sw0 + kb0;
    k_left = static_cast<int>(p.in) - kb0 * 32;
    n = p.n;
  }
  // The weights of the next chunk (without advancing).
  __device__ __forceinline__ void issue_weights(uint32_t stage, int lane) const {
    const uint32_t w_dst = stage + (lane >> 1) * S::kWeightPitch + (lane & 1) * 16;
    if (row_ok && k_left >= kRowBytes) {
#pragma unroll
      for (int j = 0; j < kChunkKb; ++j) cp_async_weight16(w_dst + j * 32, w + j * 32, 16u);
    } else {  // a partial tile's missing rows or the K tail: zero fill (in % 32 == 0: whole sectors)
#pragma unroll
      for (int j = 0; j < kChunkKb; ++j) {
        const bool ok = row_ok && 32 * j < k_left;
        cp_async_weight16(w_dst + j * 32, ok ? w + j * 32 : w_row, ok ? 16u : 0u);
      }
    }
  }
  // The next chunk's copies (its weights unless they were issued ahead), then on to the chunk after.
  __device__ __forceinline__ void issue(uint32_t stage, int lane, bool weights) {
    if (weights) issue_weights(stage, lane);
    // Activation codes: lane's 16 bytes (8 values: K block lane / 4) of each token row; past K or past n: zeros.
    const bool act_k = 8 * (lane >> 2) * 4 < k_left;  // the piece's K block starts inside K
#pragma unroll
    for (int tk = 0; tk < S::kTokens; ++tk) {
      const bool ok = act_k && tk < n;
      cp_async16(stage + S::kAct + tk * S::kActPitch + lane * 16, ok ? act + tk * act_stride : act0, ok ? 16u : 0u);
    }
    if (lane < 2 * S::kTokens) {  // activation scales: token lane / 2, K blocks 4·(lane % 2) .. + 3
      const bool ok = (lane >> 1) < n && 4 * (lane & 1) * 32 < k_left;
      cp_async16(stage + S::kScales + (lane >> 1) * (kChunkKb * 4) + (lane & 1) * 16, ok ? sa : sa0, ok ? 16u : 0u);
    }
    if (kScaleStep && lane < 2) {  // weight scales of K blocks 4·lane .. + 3
      const bool ok = 4 * lane * 32 < k_left;
      cp_async4(stage + S::kWScales + lane * 4, ok ? sw : sw0, ok ? 4u : 0u);
    }
    w += kRowBytes;
    act += kChunkKb * 64;
    sa += kChunkKb * 4;
    sw += kChunkKb;
    k_left -= kRowBytes;
  }
};

// The consumer's per-tile outputs, and (wide scale blocks only) its weight-scale row.
struct TileOut {
  float* y;
  int32_t y_stride;
  int32_t row0, out;
  const uint8_t* s_row;  // !kScaleStep: the tile's weight scale row
};

__device__ __forceinline__ TileOut tile_out_of(const StreamParams& p, int T) {
  int z, x;
  locate_tile(p, T, z, x);
  const GemvOperands& op = p.ops[z];
  TileOut o;
  o.row0 = x * kRowsPerBlock;
  o.out = static_cast<int32_t>(op.out);
  o.y = op.y;
  o.y_stride = op.y_stride;
  o.s_row = op.w_scales + static_cast<int64_t>(o.row0 / p.block_out) * p.scale_cols;
  return o;
}

// One group of 4 K blocks (gi of the chunk) from the stage into acc: gemv.cu's gemv_chunk with every
// operand from shared memory (thread g = lane / 4, t = lane % 4 of the MMA layouts).
template <class S, bool kScaleStep, bool kOne>
__device__ __forceinline__ void compute_group(uint32_t stage, int gi, int lane, const TileOut& o, int kb0,
                                              int kb_shift, float (&acc)[4]) {
  const int g = lane >> 2, t = lane & 3;
  const uint32_t w_at = stage + g * S::kWeightPitch + t * 8 + gi * (kGroupKb * 32);
  const uint32_t a_at = stage + S::kAct + (kOne ? 0 : g * S::kActPitch) + t * 16 + gi * (kGroupKb * 64);
  float sw[kGroupKb], sa0[kGroupKb], sa1[kGroupKb] = {0.0f, 0.0f, 0.0f, 0.0f};
  {
    const uint4 s0 = lds128(stage + S::kScales + (kOne ? 0 : 2 * t) * (kChunkKb * 4) + gi * 16);
    sa0[0] = __uint_as_float(s0.x), sa0[1] = __uint_as_float(s0.y), sa0[2] = __uint_as_float(s0.z),
    sa0[3] = __uint_as_float(s0.w);
    if (!kOne) {
      const uint4 s1 = lds128(stage + S::kScales + (2 * t + 1) * (kChunkKb * 4) + gi * 16);
      sa1[0] = __uint_as_float(s1.x), sa1[1] = __uint_as_float(s1.y), sa1[2] = __uint_as_float(s1.z),
      sa1[3] = __uint_as_float(s1.w);
    }
    if (kScaleStep) {
      const uint32_t b = lds32(stage + S::kWScales + gi * 4);
#pragma unroll
      for (int u = 0; u < kGroupKb; ++u) sw[u] = detail::ue8m0_scale((b >> (8 * u)) & 0xFFu);
    } else {
#pragma unroll
      for (int u = 0; u < kGroupKb; ++u) sw[u] = detail::ue8m0_scale(__ldg(o.s_row + ((kb0 + gi * kGroupKb + u) >> kb_shift)));
    }
  }
#pragma unroll
  for (int u = 0; u < kGroupKb; ++u) {
    const uint2 w_lo = lds64(w_at + u * 32), w_hi = lds64(w_at + 8 * S::kWeightPitch + u * 32);
    const uint4 act = lds128(a_at + u * 64);
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint32_t a1[4] = {e4m3x2_to_f16x2(w_lo.x), e4m3x2_to_f16x2(w_hi.x), e4m3x2_hi_to_f16x2(w_lo.x),
                            e4m3x2_hi_to_f16x2(w_hi.x)};
    mma_f16(a1, act.x, act.y, d);
    const uint32_t a2[4] = {e4m3x2_to_f16x2(w_lo.y), e4m3x2_to_f16x2(w_hi.y), e4m3x2_hi_to_f16x2(w_lo.y),
                            e4m3x2_hi_to_f16x2(w_hi.y)};
    mma_f16(a2, act.z, act.w, d);
    acc[0] += d[0] * (sw[u] * sa0[u]);
    acc[2] += d[2] * (sw[u] * sa0[u]);
    if (!kOne) {
      acc[1] += d[1] * (sw[u] * sa1[u]);
      acc[3] += d[3] * (sw[u] * sa1[u]);
    }
  }
}

// This warp's sums of item `it`: stored (one item per tile), or met with the tile's other items'
// partials (ticket; the last adds them in slot order).
__device__ __forceinline__ void finish_item(const StreamParams& p, const Item& it, const TileOut& o, int lane,
                                            float (&acc)[4]) {
  const int T = it.tile, pieces = p.ksplit, mine = it.slot;
  float v[4] = {acc[0], acc[1], acc[2], acc[3]};
  if (pieces > 1) {
    float* slots = p.partials + static_cast<int64_t>(T) * pieces * kTileFloats;
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

template <class S, bool kScaleStep, bool kOne>
__global__ void __launch_bounds__(kStreamWarps * 32, S::kBlocksPerSm) gemv_stream_kernel(StreamParams p) {
  extern __shared__ __align__(128) uint8_t ring[];  // [kStreamWarps][kStages][S::kBytes]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int warp_id = static_cast<int>(blockIdx.x) * kStreamWarps + warp;
  if (warp_id >= p.warps_total) return;  // whole warps; nothing below waits on another warp
  const uint32_t ring0 = static_cast<uint32_t>(__cvta_generic_to_shared(ring)) + warp * (kStages * S::kBytes);

  detail::pdl_launch_dependents();
  Producer<S, kScaleStep> prod;
  Item pit = item_of(warp_id, p);
  int pc = pit.c_begin, p_item = warp_id;
  prod.set_tile(p, pit.tile, pc, lane);
  // Before the wait: the weights of the first chunks of this item (they never depend on the previous
  // kernel); they join the first commit group below, whose wait then covers them.
  int ahead = 0;
  {
    Producer<S, kScaleStep> pre = prod;
    while (ahead < kStages - 1 && pc + ahead < pit.c_end) {
      pre.issue_weights(ring0 + ahead * S::kBytes, lane);
      pre.w += kRowBytes;
      pre.k_left -= kRowBytes;
      ++ahead;
    }
  }
  detail::pdl_wait();
  int issued = 0;
  bool more = true;  // the producer has chunks left
  auto issue_next = [&](int slot) {
    if (more) {
      prod.issue(ring0 + slot * S::kBytes, lane, issued++ >= ahead);
      if (++pc == pit.c_end) {
        p_item += p.warps_total;
        more = p_item < p.items;
        if (more) {
          pit = item_of(p_item, p);
          pc = pit.c_begin;
          prod.set_tile(p, pit.tile, pc, lane);
        }
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_next(s);

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int slot = 0;
  for (int i = warp_id; i < p.items; i += p.warps_total) {
    const Item it = item_of(i, p);
    const TileOut o = tile_out_of(p, it.tile);
    for (int c = it.c_begin; c < it.c_end; ++c) {
      issue_next(slot == 0 ? kStages - 1 : slot - 1);  // the stage computed last step
      cp_async_wait<kStages - 1>();
      __syncwarp();
      const uint32_t stage = ring0 + slot * S::kBytes;
#pragma unroll
      for (int gi = 0; gi < kChunkKb / kGroupKb; ++gi)
        compute_group<S, kScaleStep, kOne>(stage, gi, lane, o, c * kChunkKb, p.kb_shift, acc);
      __syncwarp();  // every lane has read the stage before it is refilled
      slot = slot == kStages - 1 ? 0 : slot + 1;
    }
    finish_item(p, it, o, lane, acc);
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
  }
  cp_async_wait<0>();  // no copy may outlive the warp's shared memory
}

// The rings' dynamic shared memory, and the largest carveout (the SM's unified L1 / shared memory given
// to shared memory: kBlocksPerSm rings must fit; every operand is staged, so little is left to L1).
template <class S, bool kScaleStep, bool kOne>
Status prepare(const char* name) {
  const auto kernel = gemv_stream_kernel<S, kScaleStep, kOne>;
  CEDAR_RETURN_IF_ERROR(
      cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kRingBytes), name));
  return cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared),
      name);
}

template <class S, bool kOne>
int occupancy_of() {
  int per_sm = 0;
  if (!prepare<S, true, kOne>("gemv_stream_kernel").ok() ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_stream_kernel<S, true, kOne>, kStreamWarps * 32,
                                                    S::kRingBytes) != cudaSuccess ||
      per_sm <= 0) {
    (void)cudaGetLastError();
    return S::kBlocksPerSm;
  }
  return per_sm;
}

template <class S, bool kScaleStep, bool kOne>
Status launch_one(const StreamParams& p, int64_t blocks, cudaStream_t stream, bool pdl, const char* name) {
  CEDAR_RETURN_IF_ERROR((prepare<S, kScaleStep, kOne>(name)));
  return launch_kernel(gemv_stream_kernel<S, kScaleStep, kOne>, dim3(static_cast<unsigned>(blocks)),
                       dim3(kStreamWarps * 32), S::kRingBytes, stream, pdl, name, p);
}

}  // namespace

StreamPlan plan_gemv_stream(int64_t tiles, int64_t in, int64_t n) {
  StreamPlan s;
  s.chunks = (in / 32 + kChunkKb - 1) / kChunkKb;
  const int64_t units = tiles * s.chunks;
  if (units <= 0) return s;
  const int per_sm = n == 1 ? occupancy_of<Stage<1>, true>() : occupancy_of<Stage<8>, false>();
  const int64_t resident = static_cast<int64_t>(per_sm) * device_sm_count() * kStreamWarps;
  // Items of L chunks: about kStreamItemsPerWarp per resident warp (a warp's last item is the tail).
  s.item_chunks = std::clamp<int64_t>(units / (resident * kStreamItemsPerWarp), 1, s.chunks);
  s.ksplit = (s.chunks + s.item_chunks - 1) / s.item_chunks;
  s.items = tiles * s.ksplit;
  s.warps_total = std::min(resident, s.items);
  s.blocks = (s.warps_total + kStreamWarps - 1) / kStreamWarps;
  return s;
}

SplitKSize stream_workspace_size(int64_t tiles, int64_t in) {
  SplitKSize most;
  for (const int64_t n : {1, 8}) {
    const StreamPlan s = plan_gemv_stream(tiles, in, n);
    if (s.items <= 0 || s.ksplit <= 1) continue;
    most.partial_floats = std::max(most.partial_floats, tiles * s.ksplit * kTileFloats);
    most.counters = std::max(most.counters, tiles);
  }
  return most;
}

Status launch_gemv_stream(const StreamParams& p, const StreamPlan& plan, bool scale_step, cudaStream_t stream,
                          bool pdl) {
  if (p.n == 1)
    return scale_step ? launch_one<Stage<1>, true, true>(p, plan.blocks, stream, pdl, "gemv_stream_kernel<one token>")
                      : launch_one<Stage<1>, false, true>(p, plan.blocks, stream, pdl,
                                                          "gemv_stream_kernel<wide scale blocks, one token>");
  return scale_step ? launch_one<Stage<8>, true, false>(p, plan.blocks, stream, pdl, "gemv_stream_kernel")
                    : launch_one<Stage<8>, false, false>(p, plan.blocks, stream, pdl,
                                                         "gemv_stream_kernel<wide scale blocks>");
}

}  // namespace cedar::cuda::gemv_detail
