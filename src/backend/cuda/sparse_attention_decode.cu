// Decode-shaped sparse attention (attention_kernels.h, sparse_attention_decode): few query rows, the keys
// of a row split across blocks (flash-decoding), every block covering a key range for 64 heads, so each
// key is dequantized once per row and pass (all heads share K = V: MQA), and a row of 640 keys fills 20
// blocks instead of the tiled kernel's 40 blocks that dequantize every key 8×.
//
// Block (key range z, row, head group of kHB = 64 heads, or 32 / 16 in the head-split plan): 16 warps,
// key tiles of 32 dequantized into shared memory as bf16 (exact, as in sparse_attention.cu).
//   phase A  S = Q·Kᵀ: warp (m-tile mt = warp % kMt, channel part cq = warp / kMt; kMt = kHB / 16 m-tiles,
//            16 / kMt parts) holds its Q A-fragments (16 heads × the part's channels, bf16) in registers
//            for the whole range and computes the 16 × 32 partial scores of its part with ldmatrix'd K
//            fragments; the parts are added in part order (fixed) and scaled into the range's score rows
//            Ss[kHB][keys] (64 heads: four quarters, the legacy kernel's order);
//   phase B  the range's max m_z per head (512 / kHB threads per head), p = exp(s − m_z) in place, l_z = Σp;
//   phase C  O_z = P·V: warp w owns channels [w·hd/16, (w+1)·hd/16) for the block's heads, P's A fragments from
//            Ss (bf16, or three exact bf16 parts in fp32 mode), V via ldmatrix.trans; tiles in reverse
//            order, so the last tile of phase A is still in shared memory (one dequantization saved).
//   A tile's records are loaded into registers while the previous tile is computed.
// One range per row (splits == 1): the block finishes the row itself (o = bf16(O / (l + exp(sink − m))),
// inverse RoPE in registers). Otherwise it writes (m_z, l_z, O_z) and sparse_attention_merge_kernel
// combines the ranges in range order: M = max m_z, w_z = exp(m_z − M),
//   o = bf16( Σ_z w_z·O_z / (Σ_z w_z·l_z + exp(sink − M)) ), then the inverse RoPE.
// Deterministic (no atomics but a shared-memory max of key indices) and graph-capturable.
//
// Plans (DecodePlan): the legacy one (64 heads per block, key ranges for ~132 blocks) and the head-split
// one (SparseAttnArgs::decode_head_split): 16 heads per block (32 at head_dim 128) while rows × head
// groups <= 33 and rows × key tiles <= 64 (measured: more key tiles pay the 4× dequantization), so batch 1 of an SWA-only layer (128 keys) runs 4 ranges × 4 groups = 16 blocks, not 4;
// 64 heads from there on (batch 64: the legacy split). Each block dequantizes its key tiles once for its
// heads, so a key is dequantized once per head group (4× at 16 heads: 32 × 512 values per tile, ~100
// instructions per thread, against a block chain that loses 3/4 of its Q loads, MMAs and partials).
// The 16-head kernel fits 64 registers (two blocks per SM), and the split aims at two per SM.
//
// Arithmetic vs the CPU (sparse_attention_row): p_j is exp(s_j − m_z) with the range's max instead of the
// row's, rounded to bf16 (bf16 mode) before the rescale by w_z, and exp is expf (≤ 2 ulp) instead of the
// correctly rounded exp_f32 (a double exp costs ~5 µs of FP64 issue per block at 320 keys). So each
// bf16(p_j)·w_z is within 2^-8·p_j of the CPU's bf16(p_j) (two roundings of 2^-9 of different values,
// plus O(2^-22) from expf and w_z) — inside the tiled kernel's allowance of 2^-7·p_j per key — and the
// sums run in other orders. Bitwise equality with the CPU or the tiled kernel is not expected.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/attention_math.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kHeads = 64;  // heads per block of the legacy plan: 4 MMA m-tiles (head groups of 16/32: fewer)
constexpr int kTile = 32;   // keys per tile
constexpr int kMaxTilesPerSplit = 16;  // shared memory: Ss holds 64 × 512 scores
constexpr int kMaxSplitKeys = kTile * kMaxTilesPerSplit;
constexpr int kSpLd = kTile + 8;    // partial-score row stride (floats): conflict-free float2 stores
constexpr int kTargetBlocks = 132;  // one wave on an H200 (one block per SM: ~200 KB of shared memory)

struct DecodeParams : detail::SparseAttnInputs {
  int splits;
  int keys_per_split;  // multiple of kTile, <= kMaxSplitKeys
  int ld_s;            // floats per score row: keys_per_split + 8 (≡ 8 mod 32: conflict-free float2 reads)
  float* ws_m;         // [n, splits, heads]
  float* ws_l;         // [n, splits, heads]
  float* ws_acc;       // [n, splits, heads, head_dim]
  bool legacy_merge;   // the first merge (serial loads, plain launch): kept for the bitwise test and bench
  bool q_rope;         // q is before RoPE: the kernel rotates it as rope_apply would (one launch saved)
  uint16_t* out_codes;  // SparseAttnArgs::out_f16_codes (null: none); written by the fast merge
  float* out_scales;
  bool merge_trigger;  // SparseAttnArgs::decode_merge_trigger
};

enum KeyKind : int8_t { kNone = 0, kFp8 = 1, kFp4 = 2 };

using detail::ldmatrix_x2_trans;
using detail::ldmatrix_x4;
using detail::ldmatrix_x4_trans;
using detail::mma_bf16_16816;
using detail::pack_bf16x2_rn;

__device__ __forceinline__ uint32_t load_u32(const uint8_t* r) {
  if ((reinterpret_cast<uintptr_t>(r) & 3u) == 0) return __ldg(reinterpret_cast<const uint32_t*>(r));
  return r[0] | (r[1] << 8) | (r[2] << 16) | (static_cast<uint32_t>(r[3]) << 24);
}

// kN (1, 2 or 4) consecutive floats of shared memory, 4·kN-byte aligned, in one access.
template <int kN>
__device__ __forceinline__ void load_floats(const float* src, float (&d)[kN]) {
  if constexpr (kN == 4) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    d[0] = v.x, d[1] = v.y, d[2] = v.z, d[3] = v.w;
  } else if constexpr (kN == 2) {
    const float2 v = *reinterpret_cast<const float2*>(src);
    d[0] = v.x, d[1] = v.y;
  } else {
    d[0] = *src;
  }
}
template <int kN>
__device__ __forceinline__ void store_floats(float* dst, const float (&d)[kN]) {
  if constexpr (kN == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(d[0], d[1], d[2], d[3]);
  } else if constexpr (kN == 2) {
    *reinterpret_cast<float2*>(dst) = make_float2(d[0], d[1]);
  } else {
    *dst = d[0];
  }
}

// The raw bytes of one thread's share of a 32-key tile (kIters chunks of 8 channels), loaded ahead.
// kPacked: the chunks' kinds and scale bytes 4 to a register (6 registers fewer at head_dim 512: the
// 64-head kernel stops spilling; the 16-head one, capped at 64 registers, spills with the extra shifts).
template <int kHd, bool kPacked>
struct TileRegs {
  static constexpr int kChunks = kHd / 8;
  static constexpr int kIters = kTile * kChunks / kThreads;
  static_assert(kTile * kChunks % kThreads == 0, "whole chunks per thread");
  static_assert(kIters <= 4, "kinds and scale bytes packed 4 to a register");
  static constexpr int kWords = kPacked ? 1 : kIters;
  uint32_t lo[kIters], hi[kIters];
  uint32_t sb[kWords], kd[kWords];
  __device__ __forceinline__ void clear(int it) {
    if (!kPacked || it == 0) sb[kPacked ? 0 : it] = kd[kPacked ? 0 : it] = 0;
  }
  __device__ __forceinline__ void set_kind(int it, uint32_t v) {
    if (kPacked)
      kd[0] |= v << (8 * it);
    else
      kd[it] = v;
  }
  __device__ __forceinline__ void set_scale(int it, uint32_t v) {
    if (kPacked)
      sb[0] |= v << (8 * it);
    else
      sb[it] = v;
  }
  __device__ __forceinline__ uint32_t kind(int it) const { return kPacked ? (kd[0] >> (8 * it)) & 0xFFu : kd[it]; }
  __device__ __forceinline__ uint32_t scale(int it) const { return kPacked ? (sb[0] >> (8 * it)) & 0xFFu : sb[it]; }
};

// Loads the records of keys [tile·32, tile·32 + 32) of the range (pointers rec / kinds kind in shared
// memory). Chunk e = tid + it·512: key e / kChunks, channels 8·(e % kChunks): a warp reads 256 (FP8) or
// 128 (FP4) contiguous bytes of one record and later stores 512 contiguous bytes of its bf16 row.
template <int kHd, bool kPacked>
__device__ __forceinline__ void tile_load(TileRegs<kHd, kPacked>& t, int tile, const uint8_t* const* rec,
                                          const int8_t* kind) {
  using Regs = TileRegs<kHd, kPacked>;
#pragma unroll
  for (int it = 0; it < Regs::kIters; ++it) {
    const int e = threadIdx.x + it * kThreads;
    const int key = tile * kTile + e / Regs::kChunks, c = (e % Regs::kChunks) * 8;
    const int kd = kind[key];
    const uint8_t* r = rec[key];
    t.clear(it);
    t.set_kind(it, static_cast<uint32_t>(kd));
    t.lo[it] = t.hi[it] = 0;
    if (kd == kFp8) {
      t.set_scale(it, __ldg(r + kHd + c / 32));
      t.lo[it] = load_u32(r + c);
      t.hi[it] = load_u32(r + c + 4);
    } else if (kd == kFp4) {
      t.set_scale(it, __ldg(r + kHd / 2 + c / 16));
      t.lo[it] = load_u32(r + c / 2);
    }
  }
}

// Dequantizes the loaded tile into Ks (bf16 rows of kHd + 8): exact values, absent keys zero.
template <int kHd, bool kPacked>
__device__ __forceinline__ void tile_store(const TileRegs<kHd, kPacked>& t, __nv_bfloat16* Ks) {
  using Regs = TileRegs<kHd, kPacked>;
#pragma unroll
  for (int it = 0; it < Regs::kIters; ++it) {
    const int e = threadIdx.x + it * kThreads;
    const int key = e / Regs::kChunks, c = (e % Regs::kChunks) * 8;
    const uint32_t kd = t.kind(it), sb = t.scale(it);
    *reinterpret_cast<uint4*>(Ks + key * (kHd + 8) + c) =
        detail::key_chunk_to_bf16(kd == kFp8, kd == kFp4, t.lo[it], t.hi[it], sb);
  }
}

// o = bf16(x / (l + exp(sink − m))) for the pair (c, c + 1) of head h, inverse RoPE when c is a rope
// channel. m = −inf (no key): 0 / inf = 0, as in the tiled kernel.
__device__ __forceinline__ float2 finish_pair(const DecodeParams& p, int64_t pos, int64_t h, int c, int hd, float x0,
                                              float x1, float m, float l) {
  const float denom = __fadd_rn(l, expf(__fsub_rn(p.sink[h], m)));
  float e = detail::round_bf16(__fdiv_rn(x0, denom)), o = detail::round_bf16(__fdiv_rn(x1, denom));
  const int rope_start = hd - static_cast<int>(p.rope.rope_dim);
  if (c >= rope_start) detail::rope_pair(p.rope, pos, (c - rope_start) / 2, true, e, o);
  return make_float2(e, o);
}

// Blocks of one SM at kHB heads: 16 heads need few enough registers for two (64 per thread).
template <int kHB>
constexpr int decode_min_blocks() {
  return kHB == 16 ? 2 : 1;
}

// kHB heads per block (64: the legacy plan; 32 or 16: the head-split plan). kMt = kHB / 16 m-tiles; in
// phase A the 16 warps are kMt m-tiles × kParts channel parts of kHd / kParts channels (kParts = 4 at 64
// heads: the quarters), summed in part order.
template <int kHd, int kHB>
__global__ void __launch_bounds__(kThreads, decode_min_blocks<kHB>()) sparse_attention_decode_kernel(DecodeParams p) {
  constexpr int kLd = kHd + 8;  // bf16 key row: 16-byte rows, conflict-free ldmatrix (stride ≡ 4 words mod 32)
  constexpr int kMt = kHB / 16;
  constexpr int kParts = kWarps / kMt;
  constexpr int kPartCh = kHd / kParts;  // channels of a phase-A part
  constexpr int kQSteps = kPartCh / 16;  // k-steps of 16 channels per part (phase A)
  constexpr int kNTw = kHd / 128;        // n-tiles of 8 channels per warp (phase C)
  constexpr int kTph = kThreads / kHB;   // threads per head in the score sum and phase B (8, 16 or 32)
  constexpr int kKpt = kTile / kTph;     // keys per thread in the score sum (4, 2 or 1)
  static_assert(kHB == 16 || kHB == 32 || kHB == 64, "head groups of 16, 32 or 64");
  static_assert(kPartCh % 16 == 0, "a phase-A part spans whole k-steps");
  extern __shared__ __align__(16) uint8_t smem[];
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem);
  float* Sp = reinterpret_cast<float*>(Ks + kTile * kLd);  // [kParts][kHB heads][kSpLd]
  float* Ss = Sp + kParts * kHB * kSpLd;                   // [kHB heads][ld_s]
  __shared__ const uint8_t* rec[kMaxSplitKeys];
  __shared__ int8_t kind[kMaxSplitKeys];
  __shared__ float Ms[kHB], Ls[kHB];
  __shared__ int last_key;

  // The merge launch (programmatic, new merge only) may be scheduled now: its prologue (tokens, sink,
  // RoPE table) overlaps this grid, and it waits for this grid's completion before reading partials.
  if (!p.legacy_merge) detail::pdl_launch_dependents();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int z = blockIdx.x;
  const int64_t row = blockIdx.y, h0 = static_cast<int64_t>(blockIdx.z) * kHB;
  const AttnToken tk = p.tokens[row];

  // Q A-fragments of this warp (heads h0 + 16·mt + g, +8; channels cq·kPartCh + 16·ks + 2t, +1, +8, +9),
  // loaded first so their latency overlaps the key lookups (with q_rope: tokens → {q, cos/sin}, still
  // shorter than the lookup chain). Heads past the end are zero.
  const int mt = warp % kMt, cq = warp / kMt;
  uint32_t qa[kQSteps][4];
  {
    const int64_t ha = h0 + 16 * mt + g, hb = ha + 8;
    const float* qra = p.q + (row * p.heads + ha) * kHd + cq * kPartCh + 2 * t;
    const float* qrb = p.q + (row * p.heads + hb) * kHd + cq * kPartCh + 2 * t;
#pragma unroll
    for (int ks = 0; ks < kQSteps; ++ks) {
      float2 a0 = make_float2(0.0f, 0.0f), a1 = a0, a2 = a0, a3 = a0;
      if (ha < p.heads) {
        a0 = __ldg(reinterpret_cast<const float2*>(qra + 16 * ks));
        a2 = __ldg(reinterpret_cast<const float2*>(qra + 16 * ks + 8));
      }
      if (hb < p.heads) {
        a1 = __ldg(reinterpret_cast<const float2*>(qrb + 16 * ks));
        a3 = __ldg(reinterpret_cast<const float2*>(qrb + 16 * ks + 8));
      }
      if (p.q_rope) {  // rope_apply's forward rotation of the pairs (c, c + 1), c = the float2's channel
        const int rope_start = kHd - static_cast<int>(p.rope.rope_dim);
        const int c0 = cq * kPartCh + 16 * ks + 2 * t, c1 = c0 + 8;
        if (c0 >= rope_start) {
          if (ha < p.heads) detail::rope_pair(p.rope, tk.pos, (c0 - rope_start) / 2, false, a0.x, a0.y);
          if (hb < p.heads) detail::rope_pair(p.rope, tk.pos, (c0 - rope_start) / 2, false, a1.x, a1.y);
        }
        if (c1 >= rope_start) {
          if (ha < p.heads) detail::rope_pair(p.rope, tk.pos, (c1 - rope_start) / 2, false, a2.x, a2.y);
          if (hb < p.heads) detail::rope_pair(p.rope, tk.pos, (c1 - rope_start) / 2, false, a3.x, a3.y);
        }
      }
      qa[ks][0] = pack_bf16x2_rn(a0.x, a0.y);
      qa[ks][1] = pack_bf16x2_rn(a1.x, a1.y);
      qa[ks][2] = pack_bf16x2_rn(a2.x, a2.y);
      qa[ks][3] = pack_bf16x2_rn(a3.x, a3.y);
    }
  }

  // The range's keys: window positions [lo, lo + nw) (staged records for the call's own positions, else
  // the ring when its slot holds the position), then the top-k ids (−1: absent). Every slot of the range
  // gets a kind (kNone past the end), so whole tiles can be read; last_key bounds the tiles.
  int64_t lo = tk.pos - p.window + 1;
  if (tk.swa_start > lo) lo = tk.swa_start;
  if (lo < 0) lo = 0;
  const int64_t nw = tk.pos >= lo ? tk.pos - lo + 1 : 0;
  const int64_t nkeys = nw + (p.topk != nullptr ? p.topk_width : 0);
  const int64_t jb = static_cast<int64_t>(z) * p.keys_per_split;
  if (tid == 0) last_key = -1;
  __syncthreads();
  // The sequence's ring and KV-source descriptors are read by every lookup thread up front (not inside
  // the branches that need them), so they arrive with the top-k id instead of one round trip after it:
  // the chain is tokens → {top-k id, descriptors} → block table → record (tokens → ring positions →
  // record for window keys).
  const bool lookup = tid < p.keys_per_split;
  SwaRingDesc ring{};
  PagedRecords kv{};
  if (lookup) {
    ring = p.rings[tk.seq];
    if (p.topk != nullptr) kv = p.kv_seqs[tk.seq].kv;
  }
  int my_last = -1;  // this thread's last slot holding a key
  for (int i = tid; i < p.keys_per_split; i += kThreads) {
    const int64_t j = jb + i;
    int8_t k = kNone;
    const uint8_t* r = nullptr;
    if (j < nw) {
      const int64_t kpos = lo + j, rb = swa_record_bytes(kHd);
      if (kpos >= tk.chunk_pos0) {
        k = kFp8;
        r = p.chunk_records + (tk.chunk_row0 + (kpos - tk.chunk_pos0)) * rb;
      } else {
        const int64_t slot = kpos % p.window;
        if (ring.positions[slot] == kpos) {
          k = kFp8;
          r = ring.records + slot * rb;
        }
      }
    } else if (j < nkeys) {
      const int32_t id = p.topk[row * p.topk_width + (j - nw)];
      if (id >= 0) {
        k = kFp4;
        r = detail::record_ptr(kv, id);
      }
    }
    rec[i] = r;
    kind[i] = k;
    if (k != kNone) my_last = i;
  }
  // One shared atomic per warp (up to 16 lanes-full warps on one address serialized otherwise); the max
  // is order-independent.
  my_last = __reduce_max_sync(detail::kFullMask, my_last);
  if (lane == 0 && my_last >= 0) atomicMax(&last_key, my_last);
  __syncthreads();
  const int ntiles = last_key >= 0 ? last_key / kTile + 1 : 0;

  // ---- phase A: scores of the range ----
  TileRegs<kHd, kHB == 64> regs;
  if (ntiles > 0) tile_load(regs, 0, rec, kind);
  for (int tile = 0; tile < ntiles; ++tile) {
    tile_store(regs, Ks);
    __syncthreads();  // Ks holds the tile; the previous tile's Sp reads are done
    // Prefetch: the next tile, or after the last one the tile phase C needs first (ntiles − 2).
    if (tile + 1 < ntiles)
      tile_load(regs, tile + 1, rec, kind);
    else if (ntiles >= 2)
      tile_load(regs, ntiles - 2, rec, kind);
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    // ldmatrix x4 (rows = keys): lane l addresses key 16·pair + (l & 7) + 8·(l >> 4), channel +8·((l >> 3) & 1);
    // r0, r1 = b0, b1 of n-tile 2·pair, r2, r3 = those of n-tile 2·pair + 1.
    const __nv_bfloat16* kb = Ks + ((lane & 7) + ((lane >> 4) << 3)) * kLd + cq * kPartCh + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int ks = 0; ks < kQSteps; ++ks) {
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(kb + pair * 16 * kLd + 16 * ks, b0, b1, b2, b3);
        mma_bf16_16816(qa[ks], b0, b1, acc[2 * pair]);
        mma_bf16_16816(qa[ks], b2, b3, acc[2 * pair + 1]);
      }
    }
    // C fragments: heads 16·mt + g (+8), keys 8·nt + 2t (+1).
    float* sp = Sp + (cq * kHB + 16 * mt + g) * kSpLd + 2 * t;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      *reinterpret_cast<float2*>(sp + 8 * nt) = make_float2(acc[nt][0], acc[nt][1]);
      *reinterpret_cast<float2*>(sp + 8 * kSpLd + 8 * nt) = make_float2(acc[nt][2], acc[nt][3]);
    }
    __syncthreads();
    {  // s = ((S0 + S1) + S2) + … (part order), scaled; absent keys −inf. Thread: head tid / kTph, kKpt keys
      // (at 64 heads: ((S0 + S1) + S2) + S3, the legacy kernel's order and bits).
      const int hh = tid / kTph, kk0 = (tid % kTph) * kKpt;
      float s[kKpt], v[kKpt];
      load_floats<kKpt>(Sp + hh * kSpLd + kk0, s);
#pragma unroll
      for (int part = 1; part < kParts; ++part) {
        load_floats<kKpt>(Sp + (part * kHB + hh) * kSpLd + kk0, v);
#pragma unroll
        for (int k = 0; k < kKpt; ++k) s[k] = __fadd_rn(s[k], v[k]);
      }
      const int kb0 = tile * kTile + kk0;
#pragma unroll
      for (int k = 0; k < kKpt; ++k) s[k] = kind[kb0 + k] != kNone ? __fmul_rn(s[k], p.scale) : -INFINITY;
      store_floats<kKpt>(Ss + hh * p.ld_s + kb0, s);
    }
    // (the next tile's first __syncthreads orders these Sp reads before its Sp writes)
  }
  __syncthreads();

  // ---- phase B: the range's max per head, p = exp(s − m), l = Σp ----
  {
    const int hh = tid / kTph, l8 = tid % kTph;  // kTph threads per head (8 at 64 heads)
    const int span = ntiles * kTile;
    float* srow = Ss + hh * p.ld_s;
    float m = -INFINITY;
    for (int j = l8; j < span; j += kTph) {
      const float v = srow[j];
      m = m < v ? v : m;
    }
#pragma unroll
    for (int o = kTph / 2; o > 0; o >>= 1) {
      const float v = __shfl_xor_sync(detail::kFullMask, m, o);
      m = m < v ? v : m;
    }
    float den = 0.0f;
    for (int j = l8; j < span; j += kTph) {
      const float pj = m == -INFINITY ? 0.0f : expf(__fsub_rn(srow[j], m));
      srow[j] = pj;
      den = __fadd_rn(den, pj);
    }
#pragma unroll
    for (int o = kTph / 2; o > 0; o >>= 1) den = __fadd_rn(den, __shfl_xor_sync(detail::kFullMask, den, o));
    if (l8 == 0) {
      Ms[hh] = m;
      Ls[hh] = den;
    }
  }
  __syncthreads();

  // ---- phase C: O = P·V, tiles in reverse order (the last one is still in Ks) ----
  float acc[kMt][kNTw][4];
#pragma unroll
  for (int a = 0; a < kMt; ++a)
#pragma unroll
    for (int i = 0; i < kNTw; ++i) acc[a][i][0] = acc[a][i][1] = acc[a][i][2] = acc[a][i][3] = 0.0f;
  const int nbase = warp * kNTw * 8;  // the warp's first channel
  for (int it = 0; it < ntiles; ++it) {
    const int tile = ntiles - 1 - it;
    if (it > 0) {
      tile_store(regs, Ks);
      __syncthreads();
      if (tile >= 1) tile_load(regs, tile - 1, rec, kind);
    }
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const int k0 = 16 * ks;  // key offset in the tile
      // V fragments: matrices (keys k0..+7 | k0+8..+15) × (channels n | n+8), as in sparse_attention.cu.
      const int mtx = lane >> 3, mr = lane & 7;
      const __nv_bfloat16* vrow = Ks + (k0 + mr + ((mtx & 1) ? 8 : 0)) * kLd;
      uint32_t bv[kNTw][2];
      if constexpr (kNTw == 1) {
        ldmatrix_x2_trans(vrow + nbase, bv[0][0], bv[0][1]);
      } else {
#pragma unroll
        for (int np = 0; np < kNTw / 2; ++np)
          ldmatrix_x4_trans(vrow + nbase + np * 16 + ((mtx >> 1) ? 8 : 0), bv[2 * np][0], bv[2 * np][1],
                            bv[2 * np + 1][0], bv[2 * np + 1][1]);
      }
      const int col = tile * kTile + k0 + 2 * t;
#pragma unroll
      for (int m4 = 0; m4 < kMt; ++m4) {
        const float* pr = Ss + (16 * m4 + g) * p.ld_s + col;
        const float2 p00 = *reinterpret_cast<const float2*>(pr);
        const float2 p10 = *reinterpret_cast<const float2*>(pr + 8 * p.ld_s);
        const float2 p01 = *reinterpret_cast<const float2*>(pr + 8);
        const float2 p11 = *reinterpret_cast<const float2*>(pr + 8 * p.ld_s + 8);
        const float pv[8] = {p00.x, p00.y, p10.x, p10.y, p01.x, p01.y, p11.x, p11.y};
        if (p.bf16_p) {
          uint32_t a[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) a[i] = pack_bf16x2_rn(pv[2 * i], pv[2 * i + 1]);
#pragma unroll
          for (int i = 0; i < kNTw; ++i) mma_bf16_16816(a, bv[i][0], bv[i][1], acc[m4][i]);
        } else {  // p = hi + mid + lo exactly (8 + 8 + 8 bits)
          float r[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) r[i] = pv[i];
#pragma unroll
          for (int part = 0; part < 3; ++part) {
            uint32_t a[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float q0 = detail::round_bf16(r[2 * i]), q1 = detail::round_bf16(r[2 * i + 1]);
              a[i] = pack_bf16x2_rn(q0, q1);
              r[2 * i] = __fsub_rn(r[2 * i], q0);
              r[2 * i + 1] = __fsub_rn(r[2 * i + 1], q1);
            }
#pragma unroll
            for (int i = 0; i < kNTw; ++i) mma_bf16_16816(a, bv[i][0], bv[i][1], acc[m4][i]);
          }
        }
      }
    }
    __syncthreads();  // Ks is rewritten by the next tile
  }

  // ---- output: heads 16·m4 + g (+8), channels nbase + 8i + 2t (+1) ----
  if (p.splits == 1) {
#pragma unroll
    for (int m4 = 0; m4 < kMt; ++m4)
#pragma unroll
      for (int i = 0; i < kNTw; ++i) {
        const int c = nbase + 8 * i + 2 * t;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int hl = 16 * m4 + g + 8 * half;
          const int64_t h = h0 + hl;
          if (h >= p.heads) continue;
          *reinterpret_cast<float2*>(p.out + (row * p.heads + h) * kHd + c) =
              finish_pair(p, tk.pos, h, c, kHd, acc[m4][i][2 * half], acc[m4][i][2 * half + 1], Ms[hl], Ls[hl]);
        }
      }
    return;
  }
  const int64_t part = (row * p.splits + z) * p.heads;  // (row, range) partials, head-major
#pragma unroll
  for (int m4 = 0; m4 < kMt; ++m4)
#pragma unroll
    for (int i = 0; i < kNTw; ++i) {
      const int c = nbase + 8 * i + 2 * t;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t h = h0 + 16 * m4 + g + 8 * half;
        if (h >= p.heads) continue;
        __stcg(reinterpret_cast<float2*>(p.ws_acc + (part + h) * kHd + c),
               make_float2(acc[m4][i][2 * half], acc[m4][i][2 * half + 1]));
      }
    }
  if (tid < kHB && h0 + tid < p.heads) {
    p.ws_m[part + h0 + tid] = Ms[tid];
    p.ws_l[part + h0 + tid] = Ls[tid];
  }
}

// Grid (heads, rows), kHd / 4 threads of 4 channels: the ranges' partials added in range order.
template <int kHd>
__global__ void __launch_bounds__(kHd / 4) sparse_attention_merge_kernel(DecodeParams p) {
  const int64_t h = blockIdx.x, row = blockIdx.y;
  const int c = 4 * threadIdx.x;
  const int64_t base = row * p.splits * p.heads + h;  // + z·heads
  float mx = -INFINITY;
  for (int z = 0; z < p.splits; ++z) {
    const float v = __ldcg(p.ws_m + base + z * p.heads);
    mx = mx < v ? v : mx;
  }
  float den = 0.0f, x0 = 0.0f, x1 = 0.0f, x2 = 0.0f, x3 = 0.0f;
  for (int z = 0; z < p.splits; ++z) {
    const float mz = __ldcg(p.ws_m + base + z * p.heads);
    if (mz == -INFINITY) continue;  // a range without keys (its partials are zero)
    const float w = expf(__fsub_rn(mz, mx));
    den = __fadd_rn(den, __fmul_rn(w, __ldcg(p.ws_l + base + z * p.heads)));
    const float4 a = __ldcg(reinterpret_cast<const float4*>(p.ws_acc + (base + z * p.heads) * kHd + c));
    x0 = __fadd_rn(x0, __fmul_rn(w, a.x));
    x1 = __fadd_rn(x1, __fmul_rn(w, a.y));
    x2 = __fadd_rn(x2, __fmul_rn(w, a.z));
    x3 = __fadd_rn(x3, __fmul_rn(w, a.w));
  }
  const int64_t pos = p.tokens[row].pos;
  const float2 e = finish_pair(p, pos, h, c, kHd, x0, x1, mx, den);
  const float2 o = finish_pair(p, pos, h, c + 2, kHd, x2, x3, mx, den);
  *reinterpret_cast<float4*>(p.out + (row * p.heads + h) * kHd + c) = make_float4(e.x, e.y, o.x, o.y);
}

// The merge, latency-bound rewrite (same arithmetic in the same order as the kernel above, so bit for
// bit the same output). The old one issued its loads one range at a time: the loop over ranges read
// m_z, branched on it, then read l_z and O_z — two dependent L2 round trips per range, ~40 at 20 ranges
// (b1), which is most of the b1 time. Here:
//   prologue (before griddepcontrol.wait, overlapping the decode grid under PDL): the row's position,
//     the head's sink and this thread's RoPE cos/sin (inputs the decode kernel does not write);
//   one round trip for every range's (m_z, l_z) into shared memory (thread z loads range z);
//   w_z = expf(m_z − M) once per range (thread z), not once per thread and range;
//   the partial sums loaded 8 ranges at a time, unconditionally (an empty range's partials are written
//   zeros; the first 8 with the (m_z, l_z) loads), then added in range order skipping empty ranges exactly
//   as before.
// Dynamic shared memory: 3 floats per range.
// kTrigger: DecodeParams::merge_trigger — the grid after it may launch at this grid's start
// (griddepcontrol.launch_dependents) instead of its end; what either reads and writes is unchanged.
template <int kHd, bool kTrigger = false>
__global__ void __launch_bounds__(kHd / 4) sparse_attention_merge_fast_kernel(DecodeParams p) {
  if constexpr (kTrigger) detail::pdl_launch_dependents();
  extern __shared__ float msm[];  // [splits] m_z, [splits] l_z, [splits] w_z
  float* sm = msm;
  float* sl = msm + p.splits;
  float* sw = msm + 2 * p.splits;
  const int64_t h = blockIdx.x, row = blockIdx.y;
  const int c = 4 * threadIdx.x;
  const int64_t base = row * p.splits * p.heads + h;  // + z·heads
  // Prologue: what finish_pair reads besides the partials.
  const int64_t pos = p.tokens[row].pos;
  const float sink = p.sink[h];
  const int rope_start = kHd - static_cast<int>(p.rope.rope_dim);
  float cs[4] = {detail::nan_f(), detail::nan_f(), detail::nan_f(), detail::nan_f()};
  if (c + 3 >= rope_start && pos >= 0 && pos < p.rope.positions) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int cc = c + 2 * k;
      if (cc >= rope_start) {
        const float2 v = *reinterpret_cast<const float2*>(p.rope.cos_sin + pos * p.rope.rope_dim + (cc - rope_start));
        cs[2 * k] = v.x;
        cs[2 * k + 1] = -v.y;  // the inverse rotation's sine (outside the table both stay NaN, as in rope_pair)
      }
    }
  }
  detail::pdl_wait();
  // The first batch of partial sums is requested together with (m_z, l_z): they do not depend on them, and at
  // batch 1 (20 ranges) that is one dependent L2 round trip of four fewer.
  constexpr int kBatch = 8;
  const auto load_batch = [&](float4 (&a)[kBatch], int z0) {
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      a[i] = z0 + i < p.splits
                 ? __ldcg(reinterpret_cast<const float4*>(p.ws_acc + (base + (z0 + i) * p.heads) * kHd + c))
                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  };
  float4 a[kBatch];
  load_batch(a, 0);
  for (int z = threadIdx.x; z < p.splits; z += blockDim.x) {
    sm[z] = __ldcg(p.ws_m + base + z * p.heads);
    sl[z] = __ldcg(p.ws_l + base + z * p.heads);
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int z = 0; z < p.splits; ++z) {
    const float v = sm[z];
    mx = mx < v ? v : mx;
  }
  for (int z = threadIdx.x; z < p.splits; z += blockDim.x)
    sw[z] = sm[z] == -INFINITY ? 0.0f : expf(__fsub_rn(sm[z], mx));
  __syncthreads();
  float den = 0.0f, x0 = 0.0f, x1 = 0.0f, x2 = 0.0f, x3 = 0.0f;
  for (int z0 = 0; z0 < p.splits; z0 += kBatch) {
    if (z0 > 0) load_batch(a, z0);
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int z = z0 + i;
      if (z >= p.splits || sm[z] == -INFINITY) continue;  // past the end / a range without keys
      const float w = sw[z];
      den = __fadd_rn(den, __fmul_rn(w, sl[z]));
      x0 = __fadd_rn(x0, __fmul_rn(w, a[i].x));
      x1 = __fadd_rn(x1, __fmul_rn(w, a[i].y));
      x2 = __fadd_rn(x2, __fmul_rn(w, a[i].z));
      x3 = __fadd_rn(x3, __fmul_rn(w, a[i].w));
    }
  }
  // finish_pair with the prefetched sink and cos/sin (same expressions).
  const float denom = __fadd_rn(den, expf(__fsub_rn(sink, mx)));
  float o[4] = {x0, x1, x2, x3};
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    float e = detail::round_bf16(__fdiv_rn(o[2 * k], denom)), od = detail::round_bf16(__fdiv_rn(o[2 * k + 1], denom));
    if (c + 2 * k >= rope_start) {
      const float co = cs[2 * k], si = cs[2 * k + 1];
      const float ne = detail::round_bf16(__fsub_rn(__fmul_rn(e, co), __fmul_rn(od, si)));
      const float no = detail::round_bf16(__fadd_rn(__fmul_rn(e, si), __fmul_rn(od, co)));
      e = ne;
      od = no;
    }
    o[2 * k] = e;
    o[2 * k + 1] = od;
  }
  const int64_t at = (row * p.heads + h) * kHd + c;
  *reinterpret_cast<float4*>(p.out + at) = make_float4(o[0], o[1], o[2], o[3]);
  if (p.out_codes != nullptr) {  // stage_act_f16's operations: this thread's 4 values of a 32-block of 8 lanes
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o[k] = detail::round_bf16(o[k]);  // bf16 already: stage_act_f16's operand rounding is the identity
      const float m = fabsf(o[k]);
      amax = fmaxf(amax, isfinite(m) ? m : 0.0f);
    }
#pragma unroll
    for (int s = 1; s < 8; s <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, s));
    const int j = f16_stage_exponent(__float_as_uint(amax));
    ushort4 q;
    q.x = detail::f16_stage_code_of(o[0], j);
    q.y = detail::f16_stage_code_of(o[1], j);
    q.z = detail::f16_stage_code_of(o[2], j);
    q.w = detail::f16_stage_code_of(o[3], j);
    *reinterpret_cast<ushort4*>(p.out_codes + at) = q;
    if ((threadIdx.x & 7) == 0) p.out_scales[at >> 5] = detail::f16_stage_scale_of(j);
  }
}

// Key ranges (and heads per block): as many as fill ~one wave of blocks, at most 16 tiles each (shared
// memory).
struct DecodePlan {
  int splits = 1, keys_per_split = kTile, heads_per_block = kHeads;
};
// The legacy plan: 64 heads per block.
DecodePlan decode_plan(int64_t n, int64_t heads, int64_t max_keys) {
  const int64_t tiles = std::max<int64_t>(1, (max_keys + kTile - 1) / kTile);
  const int64_t groups = (heads + kHeads - 1) / kHeads;
  const int64_t target = std::max<int64_t>(1, kTargetBlocks / std::max<int64_t>(1, n * groups));
  const int64_t tps = std::min<int64_t>(kMaxTilesPerSplit, (tiles + target - 1) / target);
  DecodePlan d;
  d.keys_per_split = static_cast<int>(tps * kTile);
  d.splits = static_cast<int>((tiles + tps - 1) / tps);
  return d;
}

// Head groups a head_dim allows: a phase-A part must span 16 channels (16 heads: 16 parts, head_dim >= 256).
bool head_group_allowed(int64_t hd, int hb) { return hb == 64 || hb == 32 || (hb == 16 && hd >= 256); }
int smallest_head_group(int64_t hd) { return hd >= 256 ? 16 : 32; }

// The head-split plan. Heads per block: the smallest group (16, else 32) while the (row, head group)
// pairs leave room for >= 4 key ranges each in one wave (n·groups <= 132 / 4: batch 1 and 8 at 64
// heads), else 64 (batch 64: 64 pairs already fill half a wave; the key split adds the rest). Then the
// legacy key split for those pairs aiming at one wave of co-resident blocks (two per SM at 16 heads:
// 64 registers), its ranges balanced (20 tiles in 2 ranges: 10 + 10, not 16 + 4). forced_hb (16, 32,
// 64) replaces the choice.
DecodePlan head_split_plan(int64_t n, int64_t heads, int64_t hd, int64_t max_keys, int forced_hb) {
  int hb = forced_hb;
  const int64_t key_tiles = std::max<int64_t>(1, (max_keys + kTile - 1) / kTile);
  if (hb == 0) {
    hb = kHeads;
    // Measured on the H200 (s5 run 4): 16 heads per block wins at 1 row (640 keys 13.5 vs 18.7 µs, 128
    // keys 9.9 vs 15.6) and at 8 rows of 128 keys (12.3 vs 17.0) but loses at 8 rows of 640 keys (36.9 vs
    // 27.8): each group dequantizes the tiles again. So: rows × key tiles <= 64.
    if (n * key_tiles <= 64) {
      for (int c = smallest_head_group(hd); c < kHeads; c *= 2)
        if (n * ((heads + c - 1) / c) * 4 <= kTargetBlocks) {
          hb = c;
          break;
        }
    }
  }
  const int64_t tiles = key_tiles;
  const int64_t groups = (heads + hb - 1) / hb;
  const int64_t wave = kTargetBlocks * (hb == 16 ? decode_min_blocks<16>() : 1);
  const int64_t target = std::max<int64_t>(1, wave / std::max<int64_t>(1, n * groups));
  const int64_t splits0 =
      std::min<int64_t>(tiles, std::max<int64_t>(target, (tiles + kMaxTilesPerSplit - 1) / kMaxTilesPerSplit));
  const int64_t tps = (tiles + splits0 - 1) / splits0;
  DecodePlan d;
  d.keys_per_split = static_cast<int>(tps * kTile);
  d.splits = static_cast<int>((tiles + tps - 1) / tps);
  d.heads_per_block = hb;
  return d;
}

// Workspace floats of a split launch: m and l ([n, splits, heads] each, padded to an even count so the
// partial sums that follow are 16-byte aligned for the merge's float4 reads), then the partial sums.
int64_t decode_ws_floats(int64_t n, int splits, int64_t heads, int64_t hd) {
  const int64_t nh = n * splits * heads;
  return 2 * (nh + (nh & 1)) + nh * hd;
}

// Ks, Sp (kWarps · 16 rows of partial scores at any head group), Ss.
size_t decode_smem_bytes(int64_t hd, int keys_per_split, int hb) {
  return static_cast<size_t>(kTile * (hd + 8) * 2 + kWarps * 16 * kSpLd * 4 + hb * (keys_per_split + 8) * 4);
}

template <int kHd, int kHB>
Status launch_decode(const DecodeParams& p, int64_t n, cudaStream_t stream) {
  auto* fn = &sparse_attention_decode_kernel<kHd, kHB>;
  const size_t smem = decode_smem_bytes(kHd, p.keys_per_split, kHB);
  // Above the default 48 KiB the kernel must opt in (a function attribute, not a stream operation).
  if (smem > 48 * 1024)
    CEDAR_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(n),
                  static_cast<unsigned>((p.heads + kHB - 1) / kHB));
  fn<<<grid, kThreads, smem, stream>>>(p);
  CEDAR_RETURN_IF_ERROR(launch_status("sparse_attention_decode_kernel"));
  // out's f16 staging where no fast merge writes it (p.out_codes).
  auto stage_after = [&]() -> Status {
    return p.out_codes ? stage_act_f16(p.out, n, p.heads * kHd, p.out_codes, p.out_scales, stream, false)
                       : Status::Ok();
  };
  if (p.splits == 1) return stage_after();
  const dim3 mgrid(static_cast<unsigned>(p.heads), static_cast<unsigned>(n));
  // (3 floats per range in shared memory: past 48 KB of them the old merge serves.)
  if (p.legacy_merge || 3 * p.splits * sizeof(float) > 48 * 1024) {
    sparse_attention_merge_kernel<kHd><<<mgrid, kHd / 4, 0, stream>>>(p);
    CEDAR_RETURN_IF_ERROR(launch_status("sparse_attention_merge_kernel"));
    return stage_after();
  }
  auto* merge =
      p.merge_trigger ? &sparse_attention_merge_fast_kernel<kHd, true> : &sparse_attention_merge_fast_kernel<kHd>;
  return launch_kernel(merge, mgrid, dim3(kHd / 4),
                       static_cast<size_t>(3 * p.splits) * sizeof(float), stream, /*pdl=*/true,
                       "sparse_attention_merge_fast_kernel", p);
}

}  // namespace

bool sparse_attention_decode_supported(int64_t n, int64_t head_dim) {
  return n >= 1 && n <= kSparseDecodeMaxRows && (head_dim == 128 || head_dim == 256 || head_dim == 512);
}

SparseAttnWorkspaceSize sparse_attention_decode_workspace_size(int64_t n, int64_t heads, int64_t head_dim,
                                                               int64_t window, int64_t topk_width) {
  if (!sparse_attention_decode_supported(n, head_dim) || heads <= 0 || window <= 0) return {};
  // Covers both plans and every head group the head-split plan may be given (none splits more than the
  // legacy plan today: the max keeps that true by construction).
  const int64_t keys = window + std::max<int64_t>(0, topk_width);
  int splits = decode_plan(n, heads, keys).splits;
  for (int hb = smallest_head_group(head_dim); hb <= kHeads; hb *= 2)
    splits = std::max(splits, head_split_plan(n, heads, head_dim, keys, hb).splits);
  if (splits <= 1) return {};
  return SparseAttnWorkspaceSize{decode_ws_floats(n, splits, heads, head_dim), 0};
}

bool sparse_attention_decode_fits(int64_t n, int64_t heads, int64_t head_dim, int64_t window, int64_t topk_width,
                                  const SparseAttnWorkspace& ws) {
  if (!sparse_attention_decode_supported(n, head_dim) || heads <= 0 || window <= 0) return false;
  const SparseAttnWorkspaceSize need = sparse_attention_decode_workspace_size(n, heads, head_dim, window, topk_width);
  return need.floats == 0 ||
         (ws.floats != nullptr && ws.float_count >= need.floats && (reinterpret_cast<uintptr_t>(ws.floats) & 15u) == 0);
}

bool sparse_attention_picks_decode(const SparseAttnArgs& a, const SparseAttnWorkspace& ws) {
  return sparse_attention_decode_fits(a.n, a.heads, a.head_dim, a.window, a.topk != nullptr ? a.topk_width : 0, ws);
}

Status sparse_attention_decode(const SparseAttnArgs& a, cudaStream_t stream, const SparseAttnWorkspace& ws) {
  const std::string who = "cuda::sparse_attention_decode: ";
  const int64_t hd = a.head_dim;
  if (hd != 128 && hd != 256 && hd != 512) return make_error(who + "head_dim " + str(hd) + " (128, 256 or 512)");
  const int hb_forced = a.decode_head_split ? a.decode_heads_per_block : 0;
  if (hb_forced != 0 && !head_group_allowed(hd, hb_forced))
    return make_error(who + "decode_heads_per_block " + str(hb_forced) + " at head_dim " + str(hd) +
                      " (16 needs head_dim >= 256; else 32 or 64; 0: the plan picks)");
  if (a.heads <= 0 || a.window <= 0) return make_error(who + "heads " + str(a.heads) + ", window " + str(a.window));
  if (a.decode_max_splits < 0) return make_error(who + "decode_max_splits " + str(a.decode_max_splits) + " (0: the plan's)");
  if ((a.out_f16_codes == nullptr) != (a.out_f16_scales == nullptr) ||
      reinterpret_cast<uintptr_t>(a.out_f16_codes) % 16 != 0 || reinterpret_cast<uintptr_t>(a.out_f16_scales) % 4 != 0)
    return make_error(who + "out_f16_codes and out_f16_scales: both or neither, 16- and 4-byte aligned");
  if (a.n < 0 || a.n > kSparseDecodeMaxRows)
    return make_error(who + "n=" + str(a.n) + " rows (at most " + str(kSparseDecodeMaxRows) +
                      "; more: sparse_attention)");
  if (a.rope.cos_sin == nullptr || a.rope.rope_dim <= 0 || a.rope.rope_dim % 2 != 0 || a.rope.rope_dim > hd)
    return make_error(who + "RoPE table with rope_dim " + str(a.rope.rope_dim) + " does not fit head_dim " + str(hd));
  if (a.topk != nullptr && (a.topk_width <= 0 || a.kv_seqs == nullptr))
    return make_error(who + "top-k without a width or KV source");
  if (a.n == 0) return Status::Ok();
  if (a.q == nullptr || a.sink == nullptr || a.tokens == nullptr || a.chunk_records == nullptr || a.rings == nullptr ||
      a.out == nullptr)
    return make_error(who + "null query, sink, tokens, records, rings or output");
  const int64_t topk_width = a.topk != nullptr ? a.topk_width : 0;
  DecodePlan d = a.decode_head_split ? head_split_plan(a.n, a.heads, hd, a.window + topk_width, hb_forced)
                                     : decode_plan(a.n, a.heads, a.window + topk_width);
  if (a.decode_max_splits > 0 && d.splits > a.decode_max_splits) {  // fewer, longer ranges (<= 16 tiles each)
    const int64_t tiles = std::max<int64_t>(1, (a.window + topk_width + kTile - 1) / kTile);
    const int64_t tps = std::min<int64_t>(kMaxTilesPerSplit, (tiles + a.decode_max_splits - 1) / a.decode_max_splits);
    d.keys_per_split = static_cast<int>(tps * kTile);
    d.splits = static_cast<int>((tiles + tps - 1) / tps);
  }
  const SparseAttnWorkspaceSize need = sparse_attention_decode_workspace_size(a.n, a.heads, hd, a.window, topk_width);
  if (need.floats > 0 && (ws.floats == nullptr || ws.float_count < need.floats))
    return make_error(who + str(d.splits) + " key ranges need " + str(need.floats) + " workspace floats, got " +
                      str(ws.floats ? ws.float_count : 0));
  if ((a.heads + d.heads_per_block - 1) / d.heads_per_block > 65535)
    return make_error(who + str(a.heads) + " heads (grid z: " + str(d.heads_per_block) + " per block)");
  DecodeParams p{detail::sparse_attn_inputs(a)};  // the plan's fields zero until set
  p.legacy_merge = a.legacy_decode_merge;
  p.q_rope = a.q_before_rope;
  p.out_codes = a.out_f16_codes;
  p.out_scales = a.out_f16_scales;
  p.merge_trigger = a.decode_merge_trigger;
  p.splits = d.splits;
  p.keys_per_split = d.keys_per_split;
  p.ld_s = d.keys_per_split + 8;
  if (d.splits > 1) {
    const int64_t nh = a.n * d.splits * a.heads, nh2 = nh + (nh & 1);
    if ((reinterpret_cast<uintptr_t>(ws.floats) & 15u) != 0) return make_error(who + "workspace not 16-byte aligned");
    p.ws_m = ws.floats;
    p.ws_l = ws.floats + nh2;
    p.ws_acc = ws.floats + 2 * nh2;
  }
  switch (hd * 1000 + d.heads_per_block) {
    case 128 * 1000 + 32:
      return launch_decode<128, 32>(p, a.n, stream);
    case 128 * 1000 + 64:
      return launch_decode<128, 64>(p, a.n, stream);
    case 256 * 1000 + 16:
      return launch_decode<256, 16>(p, a.n, stream);
    case 256 * 1000 + 32:
      return launch_decode<256, 32>(p, a.n, stream);
    case 256 * 1000 + 64:
      return launch_decode<256, 64>(p, a.n, stream);
    case 512 * 1000 + 16:
      return launch_decode<512, 16>(p, a.n, stream);
    case 512 * 1000 + 32:
      return launch_decode<512, 32>(p, a.n, stream);
    case 512 * 1000 + 64:
      return launch_decode<512, 64>(p, a.n, stream);
    default:
      return make_error(who + str(d.heads_per_block) + " heads per block at head_dim " + str(hd));
  }
}

// For the catalog's loadability check.
const void* sparse_attention_decode_kernel_ptr() {
  return reinterpret_cast<const void*>(&sparse_attention_decode_kernel<512, 64>);
}

}  // namespace cedar::cuda
