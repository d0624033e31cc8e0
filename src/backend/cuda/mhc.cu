// Fused single-pass mHC (§3.3): expand + collapse + the next site's coefficients (RMS-scaled GEMV
// with fn, sigmoid/softmax, Sinkhorn) — kernels.h mhc_fused. Three paths:
//
// * Decode (n < kMhcStreamMinTokens): a latency problem (2.2 MB at n = 1). Block = 64 channels of
//   all 4 streams (thread = stream × channel, 80 blocks at d = 5120). Every load — fn first (a weight,
//   before griddepcontrol.wait under PDL), then X, y and the per-token coefficients — is issued at the
//   start: one memory round trip. The 25 per-token sums are reduced in the block (reduce-scatter
//   butterfly, warps in order), written to the workspace, and the last block (ticket) adds the blocks'
//   sums in block order and runs the coefficients + Sinkhorn with one warp per token in registers
//   (finish_mix_warp; the session-3 kernel's one thread per token with __frcp_rn cost 0.4 µs per
//   Sinkhorn iteration: legacy_decode), then, if asked, the RMSNorm of collapsed (args.normed).
//   X_out / collapsed are stored after the ticket, off the critical path. All token tiles of a batch
//   run in one launch when the workspace has a counter per tile. (The first version: 160 blocks, X
//   staged through shared memory, coefficients loaded after two barriers, the X_out stores before the
//   threadfence, the last block's 4000 partials read with dependent loads, a warp-per-two-tokens
//   Sinkhorn with shuffles and divisions: 12.8 µs at n = 1 on the H200, tiles one launch each.)
// * Streaming (prefill, n >= kMhcStreamMinTokens): bandwidth-bound (X read + written, ~200 KB per
//   token). Block = 64 tokens × a channel range (split), chunks of 32 channels × 4 streams: X and y
//   are streamed, expanded, collapsed and stored; X_new goes to shared memory [value][token] and the
//   fn chunk to [value][24] (one broadcast float4 per 4 rows), and lane = token (two tokens per lane)
//   accumulates its 25 sums with FMAs. Per split, the warps' sums are added in order into
//   partials[split][token][25]; a second kernel adds the splits in order and finishes each token.
// * fn == null: expand and/or collapse only (elementwise, any n); with normed, up to
//   kMhcNormFuseMaxTokens rows and the workspace's norm_counter, expand + collapse + norm in one
//   launch (mhc_norm.cu).
// normed_quant: every kernel that writes normed also writes its FP8 codes (act_quant.cuh).
//
// Expand and collapse are bit-exact with model/mhc.h in every path (mhc_common.cuh); the coefficients
// are summed in fixed blocked orders (deterministic, ~1e-6 relative from the CPU's sequential sums).
#include <algorithm>
#include <string>
#include <utility>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mhc_common.cuh"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda {
namespace {

using namespace mhc_detail;

// ---- decode ------------------------------------------------------------------------------------

constexpr int kDecThreads = 256;
constexpr int kDecChannels = 64;                  // per block, of all 4 streams: thread = (stream warp/2, channel)

struct MhcDecodeParams {
  MhcFusedArgs a;      // strides resolved
  float* partials;     // [tile][kMaxTokens·kSlot][blocks] (one tile per launch: tile 0 only)
  unsigned* counters;  // [tiles of the launch]
  int64_t tile0;       // first token tile of this launch
  bool fuse_norm;      // a.normed by the last block (collapsed stored before the ticket)
};

int64_t decode_blocks(int64_t d) { return (d + kDecChannels - 1) / kDecChannels; }

// v[k] for a runtime k without a local-memory array.
__device__ __forceinline__ float pick(const float (&v)[kHc], int k) {
  return k == 0 ? v[0] : (k == 1 ? v[1] : (k == 2 ? v[2] : v[3]));
}

using detail::cp_async16;
using detail::cp_async4;
using detail::cp_async_commit;
using detail::smem_addr;

// The last block's partial loads in flight per lane and slot: G <= 128.
constexpr int kTailBlocksPerLane = 4;
static_assert(kDecThreads == kNormThreads, "the fused norm (norm_row) runs on the whole decode block");

// kLegacy: the session-3 kernel (coefficients by one thread per token; collapsed after the ticket; no
// fused norm), kept for the parity test and the bench rows. The current one: the last block runs the
// coefficients with one warp per token (finish_mix_warp) and, when p.fuse_norm, the RMSNorm of
// collapsed (stored before the ticket so that the last block can read every channel).
// kQuant (with p.fuse_norm): the norm also writes normed's FP8 codes (a.normed_quant).
// kTok: the tokens a block holds in registers and shared memory (kMaxTokens, or 1: mhc_decode_one_kernel).
template <bool kLegacy, bool kQuant, int kTok>
__device__ __forceinline__ void mhc_decode_block(const MhcDecodeParams& p) {
  static_assert(kTok == kMaxTokens || (kTok == 1 && !kLegacy), "one-token blocks: the current kernel only");
  const MhcFusedArgs& a = p.a;
  __shared__ float coef[kTok][kCoef];
  __shared__ float red[kTok][kDecThreads / 32][kSlot];
  __shared__ float m_all[kTok][kSlot];
  __shared__ float own[kTok][kDecThreads];
  __shared__ float warp_sums[kDecThreads / 32];
  __shared__ bool is_last;
  detail::pdl_launch_dependents();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int k = warp >> 1;  // this thread's stream
  const int64_t d = a.d, width = kHc * d;
  const int64_t c_raw = static_cast<int64_t>(blockIdx.x) * kDecChannels + (warp & 1) * 32 + lane;
  const bool cv = c_raw < d;  // the last block may own 32 channels only
  const int64_t c = cv ? c_raw : d - 1;
  const int64_t t0 = (p.tile0 + blockIdx.y) * kMaxTokens;
  const int nt = static_cast<int>(a.n - t0 < kTok ? a.n - t0 : kTok);
  const int64_t G = gridDim.x;
  const bool early_collapse = !kLegacy && p.fuse_norm;

  // fn is a weight (independent of the previous kernel): first, before the PDL wait.
  float fw[kMix];
#pragma unroll
  for (int i = 0; i < kMix; ++i) fw[i] = cv ? __ldg(a.fn + i * width + k * d + c) : 0.0f;
  detail::pdl_wait();
  // X of all 4 streams (this channel) and y for the tile's tokens; tokens past n read token t0 (the
  // current kernel skips them).
  float xv[kTok][kHc], yv[kTok];
#pragma unroll
  for (int t = 0; t < kTok; ++t) {
    const bool live = kLegacy || t < nt;
    const int64_t tok = t0 + (t < nt ? t : 0);
#pragma unroll
    for (int j = 0; j < kHc; ++j) xv[t][j] = live ? a.X[tok * width + j * d + c] : 0.0f;
    yv[t] = a.y && live ? a.y[tok * d + c] : 0.0f;
  }
  if (tid < nt * kCoef) {
    const int t = tid / kCoef, q = tid % kCoef;
    coef[t][q] = mix_coefficient(a, t0 + t, q);
  }
  __syncthreads();

  float xn[kTok][kHc];  // X_new of this channel, all streams
#pragma unroll
  for (int t = 0; t < kTok; ++t) {
    if (a.y) {
      expand_channel(xv[t], yv[t], coef[t], coef[t] + kHc, xn[t]);
    } else {
#pragma unroll
      for (int j = 0; j < kHc; ++j) xn[t][j] = xv[t][j];
    }
  }
  if (early_collapse && cv && a.collapse_w && k == 0) {
#pragma unroll
    for (int t = 0; t < kTok; ++t)
      if (t < nt) a.collapsed[(t0 + t) * d + c] = collapse_channel(xn[t], coef[t] + kHc + kHc * kHc);
  }
  // Per token: 24 products with fn and the square of this thread's X_new value, reduced over the warp
  // (lane i ends with value i), then the block's 8 warps in order. (The thread's own values go through
  // shared memory so the token loop can stay rolled: unrolled 8 times, the butterfly's 32-value array
  // would end up in local memory.)
#pragma unroll
  for (int t = 0; t < kTok; ++t) own[t][tid] = cv ? pick(xn[t], k) : 0.0f;
#pragma unroll 1
  for (int t = 0; t < nt; ++t) {
    const float x = own[t][tid];
    float v[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = i < kMix ? fw[i] * x : (i == kMix ? x * x : 0.0f);
    warp_reduce_scatter32(v, lane);
    if (lane < kSlot) red[t][warp][lane] = v[0];
  }
  __syncthreads();
  float* part = p.partials + static_cast<int64_t>(blockIdx.y) * kMaxTokens * kSlot * G;
  if (tid < nt * kSlot) {
    const int t = tid / kSlot, i = tid % kSlot;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecThreads / 32; ++w) s += red[t][w][i];
    part[static_cast<int64_t>(t * kSlot + i) * G + blockIdx.x] = s;
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) is_last = atomicAdd(p.counters + blockIdx.y, 1u) == static_cast<unsigned>(G - 1);
  __syncthreads();
  // X_out (and collapsed unless early) after the ticket: their stores do not delay the fence above.
  if (cv) {
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      if (t >= nt) break;
      const int64_t tok = t0 + t;
      if (a.y) a.X_out[tok * width + k * d + c] = own[t][tid];
      if (!early_collapse && a.collapse_w && k == 0)
        a.collapsed[tok * d + c] = collapse_channel(xn[t], coef[t] + kHc + kHc * kHc);
    }
  }
  if (!is_last) return;
  __threadfence();
  // Σ over the blocks in block order per (token, slot): warp w takes slots w, w+8, ...; lane l the
  // blocks l, l+32, l+64, ... (sequentially), then a fixed butterfly. 4 slots' loads in flight per lane.
  const int slots = nt * kSlot;
  for (int s0 = warp * 4; s0 < slots; s0 += (kDecThreads / 32) * 4) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (!kLegacy && G <= 32 * kTailBlocksPerLane) {
      // All of a lane's loads at once (the runtime loop below issues one L2 round trip per 32 blocks);
      // the same additions in the same order.
      float v[4][kTailBlocksPerLane];
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int r = 0; r < kTailBlocksPerLane; ++r) {
          const int64_t b = lane + 32 * r;
          v[q][r] = b < G ? __ldcg(part + static_cast<int64_t>(min(s0 + q, slots - 1)) * G + b) : 0.0f;
        }
#pragma unroll
      for (int r = 0; r < kTailBlocksPerLane; ++r)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (lane + 32 * r < G) acc[q] += v[q][r];
    } else {
      for (int64_t b = lane; b < G; b += 32) {
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = __ldcg(part + static_cast<int64_t>(min(s0 + q, slots - 1)) * G + b);
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[q] += v[q];
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float v = detail::warp_sum(acc[q]);
      if (lane == 0 && s0 + q < slots) m_all[(s0 + q) / kSlot][(s0 + q) % kSlot] = v;
    }
  }
  __syncthreads();
  if constexpr (kLegacy) {
    if (tid < nt) {
      float m[kSlot];
#pragma unroll
      for (int i = 0; i < kSlot; ++i) m[i] = m_all[tid][i];
      finish_mix(m, a, a.mix_out + (t0 + tid) * a.mix_stride);
    }
  } else {
    // The norm first (all threads, its stores in flight), then one warp per token's coefficients.
    if (p.fuse_norm) {
      for (int t = 0; t < nt; ++t) {
        ActQuantOut q;
        if constexpr (kQuant)
          q = ActQuantOut{a.normed_quant.codes + (t0 + t) * d, a.normed_quant.scales + (t0 + t) * (d / 32)};
        norm_row<false, kQuant>(a.collapsed + (t0 + t) * d, a.norm_weight, d, a.normed_eps, a.normed + (t0 + t) * d,
                                warp_sums, tid, q);
      }
    }
    if (warp < nt) finish_mix_warp(m_all[warp], a, a.mix_out + (t0 + warp) * a.mix_stride, lane);
  }
  if (tid == 0) p.counters[blockIdx.y] = 0;  // re-armed for the next launch / graph replay
}

template <bool kLegacy, bool kQuant = false>
__global__ void __launch_bounds__(kDecThreads) mhc_decode_kernel(MhcDecodeParams p) {
  mhc_decode_block<kLegacy, kQuant, kMaxTokens>(p);
}

// A one-row launch (MhcFusedArgs::decode_one_token): one token's registers and shared memory (3 KB instead of
// 17), and a register bound so that it holds less of the SMs the GEMVs beside it stream on. The coefficients
// alone (the split site's, beside the sublayer): 4 blocks per SM, 64 registers a thread instead of 108 (16 K a
// block instead of 27.6 K; 32 bytes of stack). With the fused norm and codes (mhc_split=0, on the critical path):
// 3 blocks, 80 registers (4 blocks would spill 160 bytes). The same arithmetic and bits.
template <bool kQuant>
__global__ void __launch_bounds__(kDecThreads, kQuant ? 3 : 4) mhc_decode_one_kernel(MhcDecodeParams p) {
  mhc_decode_block<false, kQuant, 1>(p);
}

// ---- streaming (prefill) -----------------------------------------------------------------------

constexpr int kStThreads = 256;
constexpr int kStWarps = kStThreads / 32;
constexpr int kStTokens = 64;                               // per block; lane = tokens lane and lane + 32
constexpr int kStValues = kHc * kChannels;                  // 128 values (4 streams × 32 channels) per chunk
constexpr int kStXs = kStTokens + 1;                        // row stride of xs: conflict-free stores and loads
// Blocks per SM the channel split aims at. s6 run 8 swept the target for the tensor-core kernel: 264 /
// 528 / 792 / 1056 / 1584 / 2112 / 3168 blocks gave 668 / 661 / 657 / 657 / 654 / 669 / 687 µs at 8192
// rows and 398 / 366 / 339 / 344 / 359 / 360 / 379 µs at 4096 (best near 6 per SM); at 1024 rows 792
// was slower than 528 (114.5 vs 103.6 µs, run 9): 6 per SM from 64 token tiles on, 4 below.
constexpr int64_t kStTargetBlocks = 6 * 132;
constexpr int64_t kStTargetBlocksSmall = 4 * 132;
constexpr int64_t kStManyTiles = 64;
constexpr int kStPieces = kStTokens * kHc * kChannels / 4;  // 16-byte X pieces per chunk (2048)
constexpr int kStYPieces = kStTokens * kChannels / 4;       // 16-byte y pieces per chunk (512)
static_assert(kStPieces == kStThreads * (kStTokens / kStWarps) && kStYPieces % kStThreads == 0,
              "stream_prefetch's piece mapping");

struct MhcStreamParams {
  MhcFusedArgs a;  // strides resolved
  int chunks_per_split;
  float* partials;  // [split][n][kSlot]
};

// Shared memory (floats): X / y staging, X_new [value][token], two fn buffers [value][24], coefficients.
constexpr size_t kStStage = static_cast<size_t>(kStTokens) * kHc * kChannels;
constexpr size_t kStYStage = static_cast<size_t>(kStTokens) * kChannels;
// Tensor path: xs is [token][value] with row stride kStXt = 132 (≡ 4 mod 32): the A fragment loads
// (lanes g = 0..7 rows × t = 0..3 columns) hit banks 4g + t, the expand's stores (lane = channel) are
// consecutive. The FMA path keeps [value][token] with stride 65.
constexpr int kStXt = kStValues + 4;
constexpr size_t kStXsSize = std::max(static_cast<size_t>(kStValues) * kStXs, static_cast<size_t>(kStTokens) * kStXt);
constexpr size_t kStFs = static_cast<size_t>(kStValues) * kMix;
constexpr size_t stream_smem_bytes() {
  return sizeof(float) * (kStStage + kStYStage + kStXsSize + 2 * kStFs + static_cast<size_t>(kStTokens) * kCoef);
}
// The tensor path double-buffers y: 113 664 B, still 2 blocks per SM (2 × (113 664 + 1 024) <= 228 KB).
constexpr size_t stream_tc_smem_bytes() { return stream_smem_bytes() + sizeof(float) * kStYStage; }
static_assert(2 * (stream_tc_smem_bytes() + 1024) <= 228 * 1024, "2 blocks per SM");

// Copies chunk ch's X and y rows of the block's tokens into the staging buffers and its fn rows into
// fs (transposed to [value][24] by 4-byte copies): all asynchronous, no registers held. Thread tid
// copies 16-byte piece tid % 8 of stream (tid / 8) % 4 for tokens tid / 32 + 8q (X), of token
// tid / 8 + 32q' for y, and fn rows warp + 8q (i = row / 4, stream row % 4) at channel lane.
// Offsets are 32-bit element offsets from per-call bases (the host checks they fit), which keeps the
// loop-invariant part the compiler hoists out of the chunk loop small.
struct StreamOffsets {
  uint32_t x[kStTokens / kStWarps];  // token rows of the 8 X pieces (clamped to the tile's first token)
  uint32_t y[kStYPieces / kStThreads];
};
__device__ __forceinline__ void stream_prefetch(const MhcFusedArgs& a, const StreamOffsets& o, int64_t ch, float* stage,
                                                float* ystage, float* fs, int tid) {
  const uint32_t d = static_cast<uint32_t>(a.d), width = kHc * d;
  const uint32_t c0 = static_cast<uint32_t>(ch) * kChannels;
  const int piece = tid % (kChannels / 4), j = (tid / (kChannels / 4)) % kHc;
  const float* xb = a.X + c0 + j * d + 4 * piece;
#pragma unroll
  for (int q = 0; q < kStTokens / kStWarps; ++q) {
    const int row = tid / (kChannels / 4) + (kStThreads / (kChannels / 4)) * q;  // (token, stream) row
    cp_async16(smem_addr(stage + row * kChannels + 4 * piece), xb + o.x[q]);
  }
  if (a.y) {
    const float* yb = a.y + c0 + 4 * piece;
#pragma unroll
    for (int q = 0; q < kStYPieces / kStThreads; ++q) {
      const int t = tid / (kChannels / 4) + (kStThreads / (kChannels / 4)) * q;
      cp_async16(smem_addr(ystage + t * kChannels + 4 * piece), yb + o.y[q]);
    }
  }
  const int warp = tid >> 5, lane = tid & 31;
  const float* fb = a.fn + c0 + lane;
#pragma unroll
  for (int q = 0; q < kMix * kHc / kStWarps; ++q) {
    const int r = warp + kStWarps * q, i = r / kHc, jj = r % kHc;
    cp_async4(smem_addr(fs + (jj * kChannels + lane) * kMix + i), fb + i * width + jj * d);
  }
  cp_async_commit();
}

// The tile's per-token mix rows for the expand (post[4], comb[16]) and the collapse (collapse_w[4]) into
// coef[kStTokens][kCoef]; tokens past n repeat token t0 (never stored), absent inputs are zeros.
__device__ __forceinline__ void stage_tile_coefficients(const MhcFusedArgs& a, int64_t t0, int64_t n, float* coef,
                                                        int tid) {
  for (int q = tid; q < kStTokens * kCoef; q += kStThreads) {
    const int t = q / kCoef, r = q % kCoef;
    coef[q] = mix_coefficient(a, t0 + t < n ? t0 + t : t0, r);
  }
}

// Block (tile x, split y). Per chunk: wait for its copies, expand / collapse / store from the staging
// buffer into xs, start the next chunk's copies, then the FMAs over xs and fs. The session-4 kernel:
// MhcFusedArgs::legacy_stream (A/B and parity only); the default is mhc_stream_tc_kernel below.
__global__ void __launch_bounds__(kStThreads, 2) mhc_stream_kernel(MhcStreamParams p) {
  const MhcFusedArgs& a = p.a;
  extern __shared__ __align__(16) float smem[];
  float* fs_buf = smem;               // 2 × [kStValues][kMix] (96-byte rows: float4-aligned)
  float* stage = fs_buf + 2 * kStFs;  // [token][stream][32]
  float* ystage = stage + kStStage;   // [token][32]
  float* xs = ystage + kStYStage;     // [kStValues][kStXs]
  float* coef = xs + kStXsSize;       // [kStTokens][kCoef]
  detail::pdl_launch_dependents();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t d = a.d, width = kHc * d, n = a.n;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kStTokens;
  const int64_t n_chunks = d / kChannels;
  const int64_t ch_begin = static_cast<int64_t>(blockIdx.y) * p.chunks_per_split;
  const int64_t ch_end = min(n_chunks, ch_begin + p.chunks_per_split);
  StreamOffsets off;
  {
    const uint32_t width = static_cast<uint32_t>(kHc * d), dd = static_cast<uint32_t>(d);
#pragma unroll
    for (int q = 0; q < kStTokens / kStWarps; ++q) {
      const int64_t t = tid / 32 + kStWarps * q;  // token of X row tid / 8 + 32q
      off.x[q] = static_cast<uint32_t>((t0 + t < n ? t0 + t : t0) * width);
    }
#pragma unroll
    for (int q = 0; q < kStYPieces / kStThreads; ++q) {
      const int64_t t = tid / 8 + 32 * q;
      off.y[q] = static_cast<uint32_t>((t0 + t < n ? t0 + t : t0) * dd);
    }
  }
  detail::pdl_wait();
  stream_prefetch(a, off, ch_begin, stage, ystage, fs_buf, tid);
  stage_tile_coefficients(a, t0, n, coef, tid);
  float acc0[kSlot], acc1[kSlot];  // tokens lane and lane + 32
#pragma unroll
  for (int i = 0; i < kSlot; ++i) acc0[i] = acc1[i] = 0.0f;

#pragma unroll 1
  for (int64_t ch = ch_begin; ch < ch_end; ++ch) {
    const float* fs = fs_buf + ((ch - ch_begin) & 1) * kStFs;
    cp_async_wait_all();
    __syncthreads();  // this chunk's copies (and, on the first chunk, coef) are visible
    const int64_t c = ch * kChannels + lane;
#pragma unroll 2
    for (int u = 0; u < kStTokens / kStWarps; ++u) {
      const int tl = warp + kStWarps * u;
      const int64_t tok = t0 + tl;
      const bool valid = tok < n;
      const float* cf = coef + tl * kCoef;
      float x[kHc], v[kHc];
#pragma unroll
      for (int j = 0; j < kHc; ++j) x[j] = stage[(tl * kHc + j) * kChannels + lane];
      if (a.y) {
        expand_channel(x, ystage[tl * kChannels + lane], cf, cf + kHc, v);
      } else {
#pragma unroll
        for (int j = 0; j < kHc; ++j) v[j] = x[j];
      }
      if (valid) {
        if (a.y) {
#pragma unroll
          for (int j = 0; j < kHc; ++j) a.X_out[tok * width + j * d + c] = v[j];
        }
        if (a.collapse_w) a.collapsed[tok * d + c] = collapse_channel(v, cf + kHc + kHc * kHc);
      }
#pragma unroll
      for (int j = 0; j < kHc; ++j) xs[(j * kChannels + lane) * kStXs + tl] = valid ? v[j] : 0.0f;
    }
    __syncthreads();  // xs complete; the staging buffers and the other fs buffer are free
    if (ch + 1 < ch_end) {
      stream_prefetch(a, off, ch + 1, stage, ystage, fs_buf + ((ch + 1 - ch_begin) & 1) * kStFs, tid);
    }
    // Warp w: values w, w+8, ..., lane: tokens lane and lane + 32.
#pragma unroll 1
    for (int vv = 0; vv < kStValues / kStWarps; ++vv) {
      const int v = warp + kStWarps * vv;
      const float x0 = xs[v * kStXs + lane], x1 = xs[v * kStXs + lane + 32];
      const float4* f4 = reinterpret_cast<const float4*>(fs + v * kMix);
#pragma unroll
      for (int q = 0; q < kMix / 4; ++q) {
        const float4 f = f4[q];
        acc0[4 * q] = fmaf(f.x, x0, acc0[4 * q]);
        acc0[4 * q + 1] = fmaf(f.y, x0, acc0[4 * q + 1]);
        acc0[4 * q + 2] = fmaf(f.z, x0, acc0[4 * q + 2]);
        acc0[4 * q + 3] = fmaf(f.w, x0, acc0[4 * q + 3]);
        acc1[4 * q] = fmaf(f.x, x1, acc1[4 * q]);
        acc1[4 * q + 1] = fmaf(f.y, x1, acc1[4 * q + 1]);
        acc1[4 * q + 2] = fmaf(f.z, x1, acc1[4 * q + 2]);
        acc1[4 * q + 3] = fmaf(f.w, x1, acc1[4 * q + 3]);
      }
      acc0[kMix] = fmaf(x0, x0, acc0[kMix]);
      acc1[kMix] = fmaf(x1, x1, acc1[kMix]);
    }
    __syncthreads();  // xs and this fs buffer are rewritten by the next chunks
  }
  // The 8 warps' sums per (token, slot) in warp order, through xs (8 × 25 × 32 floats per half).
  float* red = xs;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int i = 0; i < kSlot; ++i) red[(warp * kSlot + i) * 32 + lane] = h ? acc1[i] : acc0[i];
    __syncthreads();
    for (int o = tid; o < kSlot * 32; o += kStThreads) {
      const int i = o / 32, tl = o % 32;
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kStWarps; ++w) s += red[(w * kSlot + i) * 32 + tl];
      const int64_t tok = t0 + 32 * h + tl;
      if (tok < n) p.partials[(static_cast<int64_t>(blockIdx.y) * n + tok) * kSlot + i] = s;
    }
    __syncthreads();
  }
}

// ---- streaming, coefficients on the tensor cores (3xTF32) ----------------------------------------
//
// Per chunk the block's dot products are a GEMM: D[64 tokens][24] += X_new[64][128 values] · fn^T[128][24].
// Warp w takes tokens 32·(w & 1) .. +31 (2 m16 tiles) and the values of stream w >> 1 (4 k8 steps), all
// 3 n8 tiles: 24 mma.m16n8k8 per term. 3xTF32: x = big + small (big = tf32_rna(x), small =
// tf32_rna(x − big), |x − big − small| <= 2^-24·|x|), D += A_big·B_small + A_small·B_big + A_big·B_big
// (A_small·A_small ~2^-24 dropped). With expand (y given) X_new = bf16(...) is exact in TF32, so
// A_small = 0 and that term is skipped (kSplitA = false). The tensor cores' fp32 accumulation truncates,
// so each chunk's 8–12 MMAs start from zero and their result is added (RN) into the per-thread sums:
// no long truncating chains. Σ X_new² (slot 24) is summed from the A fragments with FMAs. At the end the
// 4 stream warps' sums are added in stream order into partials[split][token][25].

constexpr int kTcMTiles = 2;              // m16 tiles per warp (32 tokens)
constexpr int kTcNTiles = kMix / 8;       // 3
constexpr int kTcKSteps = kChannels / 8;  // 4 k8 steps: one stream's 32 values per warp
static_assert(kStWarps == 2 * kHc && kStTokens == 2 * 16 * kTcMTiles, "the tensor path's warp map");
static_assert(kHc * kStTokens * kSlot <= kStTokens * kStXt, "the final reduction fits in xs");

// Block (tile x, split y), as mhc_stream_kernel; per chunk: wait for its copies, read this thread's
// X values of the chunk from the staging buffer into registers, barrier, start the next chunk's copies
// (X, fn and y into the other y buffer: in flight during the expand and the MMAs), expand / collapse /
// store into xs, barrier, MMAs.
// The chunk's first barrier also orders the previous chunk's xs / fs reads before their rewrite.
template <bool kSplitA>
__global__ void __launch_bounds__(kStThreads, 2) mhc_stream_tc_kernel(MhcStreamParams p) {
  const MhcFusedArgs& a = p.a;
  extern __shared__ __align__(16) float smem[];
  float* fs_buf = smem;               // 2 × [kStValues][kMix]
  float* stage = fs_buf + 2 * kStFs;  // [token][stream][32]
  float* ybuf = stage + kStStage;     // 2 × [token][32]: chunk k + 1's y copies overlap chunk k's expand
  float* xs = ybuf + 2 * kStYStage;   // [kStTokens][kStXt]
  float* coef = xs + kStXsSize;       // [kStTokens][kCoef]
  detail::pdl_launch_dependents();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;   // fragment row / column of this lane
  const int tb = 32 * (warp & 1);          // first token of this warp's MMA rows
  const int vb = kChannels * (warp >> 1);  // first value (stream warp >> 1) of this warp's k range
  const int64_t d = a.d, width = kHc * d, n = a.n;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kStTokens;
  const int64_t n_chunks = d / kChannels;
  const int64_t ch_begin = static_cast<int64_t>(blockIdx.y) * p.chunks_per_split;
  const int64_t ch_end = min(n_chunks, ch_begin + p.chunks_per_split);
  // The copy offsets are recomputed per chunk (a few integer ops) instead of held in 10 registers.
  auto offsets = [&]() {
    StreamOffsets off;
    const uint32_t w32 = static_cast<uint32_t>(width), d32 = static_cast<uint32_t>(d);
    const uint32_t last =
        static_cast<uint32_t>((n - t0 < kStTokens ? n - t0 : kStTokens) - 1);  // tokens past n read t0
#pragma unroll
    for (int q = 0; q < kStTokens / kStWarps; ++q) {
      const uint32_t tt = tid / 32 + kStWarps * q;
      off.x[q] = (static_cast<uint32_t>(t0) + (tt <= last ? tt : 0)) * w32;
    }
#pragma unroll
    for (int q = 0; q < kStYPieces / kStThreads; ++q) {
      const uint32_t tt = tid / 8 + 32 * q;
      off.y[q] = (static_cast<uint32_t>(t0) + (tt <= last ? tt : 0)) * d32;
    }
    return off;
  };
  detail::pdl_wait();
  stream_prefetch(a, offsets(), ch_begin, stage, ybuf, fs_buf, tid);
  stage_tile_coefficients(a, t0, n, coef, tid);
  float acc[kTcMTiles][kTcNTiles][4];  // rows tb + 16mi + g (+8), slots 8ni + 2t (+1)
  float sq[kTcMTiles][2];              // Σ x² of rows tb + 16mi + g and + 8 (this lane's columns)
#pragma unroll
  for (int mi = 0; mi < kTcMTiles; ++mi) {
    sq[mi][0] = sq[mi][1] = 0.0f;
#pragma unroll
    for (int ni = 0; ni < kTcNTiles; ++ni)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.0f;
  }

#pragma unroll 1
  for (int64_t ch = ch_begin; ch < ch_end; ++ch) {
    const float* fs = fs_buf + ((ch - ch_begin) & 1) * kStFs;
    const float* ystage = ybuf + ((ch - ch_begin) & 1) * kStYStage;
    cp_async_wait_all();
    __syncthreads();  // this chunk's copies (and coef) visible; the previous chunk's MMAs are done
    float xr[kStTokens / kStWarps][kHc];
#pragma unroll
    for (int u = 0; u < kStTokens / kStWarps; ++u) {
      const int tl = warp + kStWarps * u;
#pragma unroll
      for (int j = 0; j < kHc; ++j) xr[u][j] = stage[(tl * kHc + j) * kChannels + lane];
    }
    __syncthreads();  // the X staging buffer is free: the next chunk's copies overlap the expand and MMAs
    if (ch + 1 < ch_end) {
      const int nb = (ch + 1 - ch_begin) & 1;  // buffers last read by chunk ch − 1 (before the first barrier)
      stream_prefetch(a, offsets(), ch + 1, stage, ybuf + nb * kStYStage, fs_buf + nb * kStFs, tid);
    }
    const int64_t c = ch * kChannels + lane;
#pragma unroll
    for (int u = 0; u < kStTokens / kStWarps; ++u) {
      const int tl = warp + kStWarps * u;
      const int64_t tok = t0 + tl;
      const bool valid = tok < n;
      const float* cf = coef + tl * kCoef;
      float v[kHc];
      if (a.y) {
        expand_channel(xr[u], ystage[tl * kChannels + lane], cf, cf + kHc, v);
      } else {
#pragma unroll
        for (int j = 0; j < kHc; ++j) v[j] = xr[u][j];
      }
      if (valid) {
        if (a.y) {
#pragma unroll
          for (int j = 0; j < kHc; ++j) a.X_out[tok * width + j * d + c] = v[j];
        }
        if (a.collapse_w) a.collapsed[tok * d + c] = collapse_channel(v, cf + kHc + kHc * kHc);
      }
#pragma unroll
      for (int j = 0; j < kHc; ++j) xs[tl * kStXt + j * kChannels + lane] = valid ? v[j] : 0.0f;
    }
    __syncthreads();  // xs complete
    float loc[kTcMTiles][kTcNTiles][4];
#pragma unroll
    for (int mi = 0; mi < kTcMTiles; ++mi)
#pragma unroll
      for (int ni = 0; ni < kTcNTiles; ++ni)
#pragma unroll
        for (int r = 0; r < 4; ++r) loc[mi][ni][r] = 0.0f;
#pragma unroll 2  // fully unrolled, the hoisted fragment loads spill (ptxas: 128 registers, 12 B spill)
    for (int ks = 0; ks < kTcKSteps; ++ks) {
      const int k0 = vb + 8 * ks;
      uint32_t bb[kTcNTiles][2], bs[kTcNTiles][2];
#pragma unroll
      for (int ni = 0; ni < kTcNTiles; ++ni) {
        split_tf32(fs[(k0 + t) * kMix + 8 * ni + g], bb[ni][0], bs[ni][0]);
        split_tf32(fs[(k0 + t + 4) * kMix + 8 * ni + g], bb[ni][1], bs[ni][1]);
      }
#pragma unroll
      for (int mi = 0; mi < kTcMTiles; ++mi) {
        const float* xrow = xs + (tb + 16 * mi + g) * kStXt + k0 + t;
        const float x[4] = {xrow[0], xrow[8 * kStXt], xrow[4], xrow[8 * kStXt + 4]};
        sq[mi][0] = fmaf(x[2], x[2], fmaf(x[0], x[0], sq[mi][0]));
        sq[mi][1] = fmaf(x[3], x[3], fmaf(x[1], x[1], sq[mi][1]));
        uint32_t ab[4], as[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if constexpr (kSplitA) {
            split_tf32(x[r], ab[r], as[r]);
          } else {
            ab[r] = __float_as_uint(x[r]);  // bf16 values: exact in TF32
            as[r] = 0;
          }
        }
#pragma unroll
        for (int ni = 0; ni < kTcNTiles; ++ni) {
          mma_tf32(loc[mi][ni], ab, bs[ni][0], bs[ni][1]);
          if constexpr (kSplitA) mma_tf32(loc[mi][ni], as, bb[ni][0], bb[ni][1]);
          mma_tf32(loc[mi][ni], ab, bb[ni][0], bb[ni][1]);
        }
      }
    }
#pragma unroll
    for (int mi = 0; mi < kTcMTiles; ++mi)
#pragma unroll
      for (int ni = 0; ni < kTcNTiles; ++ni)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mi][ni][r] = __fadd_rn(acc[mi][ni][r], loc[mi][ni][r]);
  }
  // Per (stream warp, token, slot) through xs, then the 4 stream warps in order.
  __syncthreads();  // the last chunk's xs reads are done
  float* red = xs;  // [kHc][kStTokens][kSlot]
  const int kq = warp >> 1;
#pragma unroll
  for (int mi = 0; mi < kTcMTiles; ++mi) {
#pragma unroll
    for (int ni = 0; ni < kTcNTiles; ++ni)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int tl = tb + 16 * mi + g + (r >= 2 ? 8 : 0), slot = 8 * ni + 2 * t + (r & 1);
        red[(kq * kStTokens + tl) * kSlot + slot] = acc[mi][ni][r];
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float s = sq[mi][h];
      s += __shfl_xor_sync(detail::kFullMask, s, 1);
      s += __shfl_xor_sync(detail::kFullMask, s, 2);
      if (t == 0) red[(kq * kStTokens + tb + 16 * mi + g + 8 * h) * kSlot + kMix] = s;
    }
  }
  __syncthreads();
  for (int o = tid; o < kStTokens * kSlot; o += kStThreads) {
    float s = red[o];
#pragma unroll
    for (int k = 1; k < kHc; ++k) s += red[k * kStTokens * kSlot + o];
    const int64_t tok = t0 + o / kSlot;
    if (tok < n) p.partials[(static_cast<int64_t>(blockIdx.y) * n + t0) * kSlot + o] = s;
  }
}

// One warp per token: Σ over the splits in split order (lane l takes splits l, l+32, ..., then a
// fixed butterfly), and lane 0 finishes the token.
__global__ void __launch_bounds__(256) mhc_stream_finish_kernel(MhcFusedArgs a, const float* partials, int splits) {
  detail::pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t tok = static_cast<int64_t>(blockIdx.x) * 8 + warp;
  if (tok >= a.n) return;  // whole warps
  float m[kSlot];
  sum_token_splits(partials, a.n, tok, splits, lane, m);
  if (lane == 0) finish_mix(m, a, a.mix_out + tok * a.mix_stride);
}

// ---- expand / collapse only (fn == null) -----------------------------------------------------------

__global__ void __launch_bounds__(256) mhc_elementwise_kernel(MhcFusedArgs a) {
  detail::pdl_launch_dependents();
  detail::pdl_wait();
  const int64_t d = a.d, width = kHc * d, total = a.n * d;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t tok = e / d, c = e % d;
    float x[kHc], v[kHc];
#pragma unroll
    for (int j = 0; j < kHc; ++j) x[j] = a.X[tok * width + j * d + c];
    if (a.y) {
      expand_channel(x, a.y[tok * d + c], a.post + tok * a.post_stride, a.comb + tok * a.comb_stride, v);
#pragma unroll
      for (int j = 0; j < kHc; ++j) a.X_out[tok * width + j * d + c] = v[j];
    } else {
#pragma unroll
      for (int j = 0; j < kHc; ++j) v[j] = x[j];
    }
    if (a.collapse_w) a.collapsed[tok * d + c] = collapse_channel(v, a.collapse_w + tok * a.collapse_w_stride);
  }
}

// ---- host ----------------------------------------------------------------------------------------

struct StreamPlan {
  int64_t tiles = 0, splits = 0, chunks_per_split = 0;
};
// Channel splits for about `target` blocks (MhcFusedArgs::stream_blocks; kStTargetBlocks by default).
// What limits the kernel is not the tail of the last wave: nsight (s6 run 6, 8192 rows, 5 splits) shows
// DRAM at 49 %, 0.57 instructions issued per scheduler and cycle, 1.07 of 3.64 resident warps eligible —
// latency with 16 warps per SM (registers and 114 KB of shared memory allow 2 blocks).
// (Minimizing waves × chunks per block — 8192 rows in one wave of 2 splits — measured slower: 832 vs
// 662 µs, s6 run 7: the blocks of a wave run in step, so more, shorter blocks overlap better.)
StreamPlan stream_plan(int64_t n, int64_t d, int64_t target = 0) {
  StreamPlan s;
  s.tiles = (n + kStTokens - 1) / kStTokens;
  if (target <= 0) target = s.tiles >= kStManyTiles ? kStTargetBlocks : kStTargetBlocksSmall;
  const int64_t chunks = d / kChannels;
  const int64_t want = std::clamp<int64_t>((target + s.tiles - 1) / s.tiles, 1, chunks);
  s.chunks_per_split = (chunks + want - 1) / want;
  s.splits = (chunks + s.chunks_per_split - 1) / s.chunks_per_split;  // no empty splits
  return s;
}
// Room for either streaming kernel's default plan.
int64_t stream_floats(int64_t n, int64_t d) {
  return std::max(stream_plan(n, d).splits, stream64_plan(n, d, 0).splits) * n * kSlot;
}
int64_t decode_tile_floats(int64_t d) { return int64_t{kMaxTokens} * kSlot * decode_blocks(d); }

Status check_args(const MhcFusedArgs& a, const char* who) {
  const std::string w(who);
  if (a.hc != kHc) return make_error(w + ": hc=" + std::to_string(a.hc) + " (the kernel is built for 4)");
  if (a.d <= 0 || a.d % kChannels != 0 || a.d / kChannels > 0x7FFFFFFF)
    return make_error(w + ": d=" + std::to_string(a.d) + " must be a positive multiple of 32");
  if (a.n < 0 || a.sinkhorn_iters < 1)
    return make_error(w + ": n=" + std::to_string(a.n) + ", sinkhorn_iters=" + std::to_string(a.sinkhorn_iters));
  if (!a.X) return make_error(w + ": X is required");
  if (a.y && (!a.post || !a.comb || !a.X_out)) return make_error(w + ": expand (y given) needs post, comb and X_out");
  if (a.collapse_w && !a.collapsed) return make_error(w + ": collapse_w given without collapsed");
  if (a.normed && !a.collapse_w) return make_error(w + ": normed (the RMSNorm of collapsed) needs collapse_w");
  if (a.normed_quant.on() != (a.normed_quant.scales != nullptr) || (a.normed_quant.on() && !a.normed))
    return make_error(w + ": normed_quant (the FP8 codes of normed) needs codes, scales and normed");
  if (a.fn && (!a.base || !a.scale || !a.mix_out))
    return make_error(w + ": coefficients (fn given) need base, scale and mix_out");
  if (a.post_stride < 0 || a.comb_stride < 0 || a.collapse_w_stride < 0 || a.mix_stride < 0)
    return make_error(w + ": negative row stride");
  if ((a.post_stride > 0 && a.post_stride < kHc) || (a.comb_stride > 0 && a.comb_stride < kHc * kHc) ||
      (a.collapse_w_stride > 0 && a.collapse_w_stride < kHc) || (a.mix_stride > 0 && a.mix_stride < kMix))
    return make_error(w + ": a row stride is shorter than its row (post " + std::to_string(a.post_stride) + ", comb " +
                      std::to_string(a.comb_stride) + ", collapse_w " + std::to_string(a.collapse_w_stride) + ", mix " +
                      std::to_string(a.mix_stride) + ")");
  return Status::Ok();
}

template <typename Kernel, typename Params>
Status launch(Kernel kernel, dim3 grid, unsigned threads, size_t smem, bool pdl, cudaStream_t stream,
              const Params& params, const char* name) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  CEDAR_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, kernel, params));
  return launch_status(name);
}

}  // namespace

int64_t mhc_workspace_floats(int64_t n, int64_t d) {
  if (n <= 0 || d <= 0) return 0;
  const int64_t tiles = (n + kMaxTokens - 1) / kMaxTokens;
  int64_t need = std::max(tiles * decode_tile_floats(d), std::min<int64_t>(n, kMaxTokens) * kSlot * (d / kChannels));
  if (n >= kMhcStreamMinTokens && d % kChannels == 0) need = std::max(need, stream_floats(n, d));
  return need;
}

int64_t mhc_workspace_counters(int64_t n) { return std::max<int64_t>(1, (n + kMaxTokens - 1) / kMaxTokens); }

namespace {

// The coefficients of the streaming path from its partials: one lane per token, or the s6 kernel.
Status launch_stream_finish(const MhcFusedArgs& a, float* partials, int64_t splits, cudaStream_t stream) {
  if (!a.stream_serial_finish) return launch_stream_finish_lanes(a, partials, splits, stream);
  const auto grid = static_cast<unsigned>((a.n + 7) / 8);
  mhc_stream_finish_kernel<<<grid, 256, 0, stream>>>(a, partials, static_cast<int>(splits));
  return launch_status("mhc_stream_finish_kernel");
}

// The critical half of a split decode site: expand / collapse and the norm in one launch (its own ticket
// counter). The one kernel that also combines y_combine as it reads y.
bool takes_expand_collapse_norm(const MhcFusedArgs& a, const MhcWorkspace& ws) {
  return a.fn == nullptr && (a.y || a.collapse_w) && a.normed && ws.norm_counter && a.n <= kMhcNormFuseMaxTokens;
}

// The launches of mhc_fused except a separate RMSNorm; *norm_fused: the decode kernel wrote a.normed.
Status mhc_launch(const MhcFusedArgs& a, const MhcWorkspace& ws, cudaStream_t stream, bool* norm_fused) {
  const bool pdl = a.programmatic_launch;
  if (a.fn == nullptr) {  // expand / collapse only
    if (!a.y && !a.collapse_w) return Status::Ok();
    if (takes_expand_collapse_norm(a, ws)) {
      *norm_fused = true;
      if (a.site_cluster && site_cluster_fits(a)) return launch_site_cluster(a, stream);
      return launch_expand_collapse_norm(a, ws.norm_counter, stream);
    }
    const int64_t total = a.n * a.d;
    const auto grid = static_cast<unsigned>(std::clamp<int64_t>((total + 255) / 256, 1, 132 * 8));
    return launch(mhc_elementwise_kernel, dim3(grid), 256, 0, pdl, stream, a, "mhc_elementwise_kernel");
  }
  if (!ws.partials || !ws.counter)
    return make_error("cuda::mhc_fused: the workspace (partials and counter) is required with fn");
  const bool aligned = (reinterpret_cast<uintptr_t>(a.X) & 15) == 0 && (reinterpret_cast<uintptr_t>(a.y) & 15) == 0;
  const bool stream_fits = a.n >= kMhcStreamMinTokens && aligned && a.n * kHc * a.d < (int64_t{1} << 32);
  if (stream_fits && !a.legacy_stream && !a.stream_c32 && stream64_supported(a)) {  // the s8 kernel (default)
    const Stream64Plan sp = stream64_plan(a.n, a.d, a.stream_blocks);
    if (ws.partial_floats >= sp.splits * a.n * kSlot) {
      CEDAR_RETURN_IF_ERROR(launch_stream64(a, sp, ws.partials, stream));
      return launch_stream_finish(a, ws.partials, sp.splits, stream);
    }
  }
  const StreamPlan sp = stream_plan(a.n, a.d, a.stream_blocks);
  if (stream_fits && ws.partial_floats >= sp.splits * a.n * kSlot) {  // 16-byte copies, 32-bit offsets
    if (sp.tiles > 0x7FFFFFFF || sp.splits > 65535)
      return make_error("cuda::mhc_fused: n=" + std::to_string(a.n) + " too large");
    const size_t smem = a.legacy_stream ? stream_smem_bytes() : stream_tc_smem_bytes();
    // Tensor cores by default; A_small is zero when X_new is expanded (bf16), so kSplitA = !y.
    auto kernel =
        a.legacy_stream ? mhc_stream_kernel : (a.y ? mhc_stream_tc_kernel<false> : mhc_stream_tc_kernel<true>);
    CEDAR_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    MhcStreamParams p{a, static_cast<int>(sp.chunks_per_split), ws.partials};
    CEDAR_RETURN_IF_ERROR(launch(kernel, dim3(static_cast<unsigned>(sp.tiles), static_cast<unsigned>(sp.splits)),
                                 kStThreads, smem, pdl, stream, p,
                                 a.legacy_stream ? "mhc_stream_kernel" : "mhc_stream_tc_kernel"));
    return launch_stream_finish(a, ws.partials, sp.splits, stream);
  }
  const int64_t tiles = (a.n + kMaxTokens - 1) / kMaxTokens;
  const auto G = static_cast<unsigned>(decode_blocks(a.d));
  const bool together =
      tiles == 1 || (ws.partial_floats >= tiles * decode_tile_floats(a.d) && ws.counter_count >= tiles);
  if (tiles > 65535) return make_error("cuda::mhc_fused: n=" + std::to_string(a.n) + " too large for the decode path");
  // The last block normalizes its tile's rows one after another: worth it for a few rows only.
  const bool fuse = a.normed && !a.legacy_decode && a.n <= kMhcNormFuseMaxTokens;
  const bool one = a.decode_one_token && a.n == 1 && !a.legacy_decode;
  auto kernel = a.legacy_decode               ? mhc_decode_kernel<true>
                : fuse && a.normed_quant.on() ? (one ? mhc_decode_one_kernel<true> : mhc_decode_kernel<false, true>)
                : one                         ? mhc_decode_one_kernel<false>
                                              : mhc_decode_kernel<false>;
  if (together) {
    MhcDecodeParams p{a, ws.partials, ws.counter, 0, fuse};
    *norm_fused = fuse;
    return launch(kernel, dim3(G, static_cast<unsigned>(tiles)), kDecThreads, 0, pdl, stream, p, "mhc_decode_kernel");
  }
  for (int64_t tile = 0; tile < tiles; ++tile) {  // one tile per launch: the legacy workspace
    MhcDecodeParams p{a, ws.partials, ws.counter, tile, fuse};
    CEDAR_RETURN_IF_ERROR(launch(kernel, dim3(G, 1), kDecThreads, 0, pdl && tile == 0, stream, p, "mhc_decode_kernel"));
  }
  *norm_fused = fuse;
  return Status::Ok();
}

}  // namespace

Status mhc_combine_y(MhcFusedArgs& a, cudaStream_t stream) {
  const MhcYCombine yc = std::exchange(a.y_combine, MhcYCombine{});
  if (!yc.on()) return Status::Ok();
  return moe_combine(MoeCombineArgs{a.n, yc.topk, a.d, yc.experts, yc.routed, yc.shared, yc.y}, stream);
}

Status mhc_fused(const MhcFusedArgs& args, const MhcWorkspace& ws, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_args(args, "cuda::mhc_fused"));
  const MhcYCombine& yc = args.y_combine;
  if (yc.on()) {
    if (!args.y || yc.y != args.y || !yc.experts || yc.topk < 1)
      return make_error("cuda::mhc_fused: y_combine needs y (its y), experts and topk >= 1");
    // Only the expand + collapse + norm kernel combines as it reads y; before any other launch, the combine.
    if (!takes_expand_collapse_norm(args, ws) || yc.topk > kMhcCombineMaxTopk) {
      MhcFusedArgs b = args;
      CEDAR_RETURN_IF_ERROR(mhc_combine_y(b, stream));
      return mhc_fused(b, ws, stream);
    }
  }
  const MhcFusedArgs a = resolve_strides(args);
  if (a.n == 0) return Status::Ok();
  bool norm_fused = false;
  CEDAR_RETURN_IF_ERROR(mhc_launch(a, ws, stream, &norm_fused));
  if (!a.normed || norm_fused) return Status::Ok();
  return rms_norm(a.collapsed, a.n, a.d, a.norm_weight, a.normed_eps, a.normed, stream, a.programmatic_launch,
                  a.normed_quant);
}

const void* mhc_fused_kernel_ptr() { return reinterpret_cast<const void*>(&mhc_decode_kernel<false>); }
const void* mhc_stream_kernel_ptr() { return reinterpret_cast<const void*>(&mhc_stream_tc_kernel<false>); }
const void* mhc_stream_finish_kernel_ptr() { return reinterpret_cast<const void*>(&mhc_stream_finish_kernel); }
const void* mhc_elementwise_kernel_ptr() { return reinterpret_cast<const void*>(&mhc_elementwise_kernel); }

}  // namespace cedar::cuda
