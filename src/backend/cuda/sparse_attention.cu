// Sparse MQA attention over window ∪ selected compressed entries with the per-head sink, inverse RoPE
// (attention_kernels.h), and the output projection helper.
//
// Block (head group, row, key range): 4 warps, 16 heads (one MMA m-tile). Keys are handled in tiles
// of 32: their records (FP8 SWA / FP4 main KV) are dequantized into shared memory as bf16 rows. The
// tile loader issues all of a thread's global loads of a tile (16 at head_dim 512) before converting
// any: converting and storing each 8-channel chunk before loading the next (the compiler cannot hoist
// a global load above the preceding shared-memory store) paid ~16 serialized memory latencies per tile
// with 4 warps per SM to hide them (H200, released shape: prefill attention 416 → 368 ms per 2048-row
// chunk). The values and their order are the same either way, so the results are too.
//   phase A  S = Q·Kᵀ·scale: warp w owns keys 8w..8w+7 of the tile (one n-tile), k-steps over head_dim
//            (four independent accumulators), scores kept in shared memory for the block's keys;
//   phase B  M per head (8 threads per head), p = exp(s − M) in place, the denominator partials;
//   phase C  O = P·V: the tiles are dequantized again, warp w owns head_dim/4 channels, P's A fragments
//            come from the stored p (bf16, or three bf16 parts in fp32 mode), V's B fragments via
//            ldmatrix.trans; the output pairs (2t, 2t+1) sit in one thread, so the inverse RoPE is
//            applied in registers.
// Key split (few rows): launch 1 writes each range's max, launch 2 uses the max over ranges, writes the
// partial sums and the last block of a (row, head group) adds them in range order (ticket).
// sparse_attention dispatches decode-shaped calls (<= kSparseDecodeMaxRows rows) to
// sparse_attention_decode.cu instead; this kernel (sparse_attention_tiled) serves prefill rows.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/attention_math.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kHeadsPerBlock = 16;
constexpr int kTile = 32;
constexpr int kSmemLimit = 227 * 1024;

struct AttnParams : detail::SparseAttnInputs {
  int splits;
  int64_t keys_per_split;  // multiple of kTile
  int64_t ld_s;            // floats per score row in shared memory
  float* ws_max;           // [n, heads, splits]
  float* ws_den;           // [n, heads, splits]
  float* ws_acc;           // [n, heads, splits, head_dim]
  unsigned* ws_count;      // [n, head groups]
};

using detail::ldmatrix_x2_trans;
using detail::ldmatrix_x4_trans;
using detail::mma_bf16_16816;
using detail::pack_bf16x2_rn;

// The key list of a row: window positions [lo, lo + nw), then nc compressed ids.
struct RowKeys {
  int64_t lo, nw, nc;
};
__device__ __forceinline__ RowKeys row_keys(const AttnParams& p, const AttnToken& tk, int64_t row) {
  RowKeys k;
  const int64_t first = tk.pos - p.window + 1;
  k.lo = tk.swa_start > first ? tk.swa_start : first;
  if (k.lo < 0) k.lo = 0;
  k.nw = tk.pos >= k.lo ? tk.pos - k.lo + 1 : 0;
  k.nc = 0;
  if (p.topk != nullptr) {  // ids ascending then −1: the count is the first −1 (binary search)
    const int32_t* t = p.topk + row * p.topk_width;
    int64_t a = 0, b = p.topk_width;
    while (a < b) {
      const int64_t m = (a + b) / 2;
      if (t[m] >= 0)
        a = m + 1;
      else
        b = m;
    }
    k.nc = a;
  }
  return k;
}

enum KeyKind : int { kNone = 0, kFp8 = 1, kFp4 = 2 };

// Record of key j of the row (kind kNone: absent, e.g. a ring slot overwritten).
__device__ __forceinline__ const uint8_t* key_record(const AttnParams& p, const AttnToken& tk, int64_t row,
                                                     const RowKeys& rk, int64_t j, int64_t hd, int& kind) {
  if (j < rk.nw) {
    const int64_t kpos = rk.lo + j, rb = swa_record_bytes(hd);
    if (kpos >= tk.chunk_pos0) {
      kind = kFp8;
      return p.chunk_records + (tk.chunk_row0 + (kpos - tk.chunk_pos0)) * rb;
    }
    const SwaRingDesc ring = p.rings[tk.seq];
    const int64_t slot = kpos % p.window;
    kind = ring.positions[slot] == kpos ? kFp8 : kNone;
    return ring.records + slot * rb;
  }
  kind = kFp4;
  return detail::record_ptr(p.kv_seqs[tk.seq].kv, p.topk[row * p.topk_width + (j - rk.nw)]);
}

// Dequantizes keys [j0, j0 + 32) ∩ [j0, je) of the row into Ks (bf16 rows of ld elements); rows of
// absent keys are zero. Uses rp/kind (shared) as scratch; ends with __syncthreads. All of a thread's
// global loads are issued first (kIters independent loads in flight), then converted (see the header).
template <int kHd>
__device__ void load_tile(const AttnParams& p, const AttnToken& tk, int64_t row, const RowKeys& rk, int64_t j0,
                          int64_t je, __nv_bfloat16* Ks, int ld, const uint8_t** rp, int* kind) {
  if (threadIdx.x < kTile) {
    const int64_t j = j0 + threadIdx.x;
    int k = kNone;
    const uint8_t* r = j < je ? key_record(p, tk, row, rk, j, kHd, k) : nullptr;
    rp[threadIdx.x] = r;
    kind[threadIdx.x] = j < je ? k : static_cast<int>(kNone);
  }
  __syncthreads();
  constexpr int kChunks = kHd / 8;
  constexpr int kIters = kTile * kChunks / kThreads;
  static_assert(kTile * kChunks % kThreads == 0, "whole iterations per thread");
  uint32_t lo[kIters], hi[kIters];
  uint8_t sb[kIters];
  int kd[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int e = threadIdx.x + it * kThreads;
    const int key = e / kChunks, c = (e % kChunks) * 8;
    kd[it] = kind[key];
    const uint8_t* r = rp[key];
    lo[it] = hi[it] = 0;
    sb[it] = 0;
    if (kd[it] == kFp8) {
      sb[it] = __ldg(r + kHd + c / 32);
      if ((reinterpret_cast<uintptr_t>(r + c) & 7u) == 0) {
        const uint2 w = __ldg(reinterpret_cast<const uint2*>(r + c));
        lo[it] = w.x;
        hi[it] = w.y;
      } else {
        lo[it] = r[c] | (r[c + 1] << 8) | (r[c + 2] << 16) | (static_cast<uint32_t>(r[c + 3]) << 24);
        hi[it] = r[c + 4] | (r[c + 5] << 8) | (r[c + 6] << 16) | (static_cast<uint32_t>(r[c + 7]) << 24);
      }
    } else if (kd[it] == kFp4) {
      sb[it] = __ldg(r + kHd / 2 + c / 16);
      const uint8_t* cb = r + c / 2;
      lo[it] = (reinterpret_cast<uintptr_t>(cb) & 3u) == 0
                   ? __ldg(reinterpret_cast<const uint32_t*>(cb))
                   : cb[0] | (cb[1] << 8) | (cb[2] << 16) | (static_cast<uint32_t>(cb[3]) << 24);
    }
  }
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int e = threadIdx.x + it * kThreads;
    const int key = e / kChunks, c = (e % kChunks) * 8;
    *reinterpret_cast<uint4*>(Ks + key * ld + c) =
        detail::key_chunk_to_bf16(kd[it] == kFp8, kd[it] == kFp4, lo[it], hi[it], sb[it]);
  }
  __syncthreads();
}

// Grid (head groups, rows, key ranges). kMaxOnly: launch 1 of a key split (range maxima only).
template <int kNT, bool kMaxOnly>
__global__ void __launch_bounds__(kThreads) sparse_attention_kernel(AttnParams p) {
  constexpr int kHd = 32 * kNT;  // head_dim; warp w owns channels [w·kHd/4, (w+1)·kHd/4) in phase C
  constexpr int kLd = kHd + 8;   // bf16 row stride: 16-byte rows for ldmatrix, conflict-free fragments
  extern __shared__ __align__(16) uint8_t smem[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* Ks = Qs + kHeadsPerBlock * kLd;
  float* Ss = reinterpret_cast<float*>(Ks + kTile * kLd);
  __shared__ const uint8_t* rp[kTile];
  __shared__ int kind[kTile];
  __shared__ float Mh[kHeadsPerBlock], Dh[kHeadsPerBlock];
  __shared__ bool is_last;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int64_t row = blockIdx.y, h0 = static_cast<int64_t>(blockIdx.x) * kHeadsPerBlock;
  const int z = blockIdx.z;
  const AttnToken tk = p.tokens[row];
  const RowKeys rk = row_keys(p, tk, row);
  const int64_t nk = rk.nw + rk.nc;
  const int64_t jb = static_cast<int64_t>(z) * p.keys_per_split;
  const int64_t je = jb + p.keys_per_split < nk ? jb + p.keys_per_split : nk;
  const int ntiles = je > jb ? static_cast<int>((je - jb + kTile - 1) / kTile) : 0;

  // Q of the block's heads as bf16 (exact: bf16 values); heads past the end are zero.
  for (int e = tid; e < kHeadsPerBlock * kHd / 2; e += kThreads) {
    const int h = e / (kHd / 2), c = 2 * (e % (kHd / 2));
    float2 v = make_float2(0.0f, 0.0f);
    if (h0 + h < p.heads) v = *reinterpret_cast<const float2*>(p.q + (row * p.heads + h0 + h) * kHd + c);
    *reinterpret_cast<uint32_t*>(Qs + h * kLd + c) = pack_bf16x2_rn(v.x, v.y);
  }
  // (load_tile's first __syncthreads orders these stores before phase A reads them)

  // ---- phase A: scores ----
  for (int tile = 0; tile < ntiles; ++tile) {
    const int64_t j0 = jb + static_cast<int64_t>(tile) * kTile;
    load_tile<kHd>(p, tk, row, rk, j0, je, Ks, kLd, rp, kind);
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    const int key = 8 * warp + g;
#pragma unroll 4
    for (int ks = 0; ks < kHd / 16; ++ks) {
      const int c0 = 16 * ks;
      const uint32_t a[4] = {*reinterpret_cast<const uint32_t*>(Qs + g * kLd + c0 + 2 * t),
                             *reinterpret_cast<const uint32_t*>(Qs + (g + 8) * kLd + c0 + 2 * t),
                             *reinterpret_cast<const uint32_t*>(Qs + g * kLd + c0 + 2 * t + 8),
                             *reinterpret_cast<const uint32_t*>(Qs + (g + 8) * kLd + c0 + 2 * t + 8)};
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(Ks + key * kLd + c0 + 2 * t);
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(Ks + key * kLd + c0 + 2 * t + 8);
      mma_bf16_16816(a, b0, b1, acc[ks & 3]);
    }
    // Keys 8w + 2t, +1 for heads g, g + 8; absent keys score −inf.
    const int kc = 8 * warp + 2 * t;
    const int64_t col = static_cast<int64_t>(tile) * kTile + kc;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float d = __fadd_rn(__fadd_rn(acc[0][i], acc[1][i]), __fadd_rn(acc[2][i], acc[3][i]));
      const int kk = kc + (i & 1), hrow = g + ((i & 2) ? 8 : 0);
      Ss[hrow * p.ld_s + col + (i & 1)] = kind[kk] != kNone ? __fmul_rn(d, p.scale) : -INFINITY;
    }
    __syncthreads();  // Ks is rewritten by the next tile
  }

  // ---- phase B: max per head, p = exp(s − M), denominators ----
  const int hh = tid >> 3, l8 = tid & 7;  // 8 threads per head
  const int64_t span = static_cast<int64_t>(ntiles) * kTile;
  float m = -INFINITY;
  for (int64_t j = l8; j < span; j += 8) {
    const float v = Ss[hh * p.ld_s + j];
    m = m < v ? v : m;  // std::max(m, v)
  }
  for (int o = 4; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(detail::kFullMask, m, o);
    m = m < v ? v : m;
  }
  const bool head_ok = h0 + hh < p.heads;
  if (kMaxOnly) {
    if (l8 == 0 && head_ok) p.ws_max[(row * p.heads + h0 + hh) * p.splits + z] = m;
    return;
  }
  if (p.splits > 1) {  // the max over all key ranges (launch 1)
    m = -INFINITY;
    if (head_ok)
      for (int zz = 0; zz < p.splits; ++zz) {
        const float v = p.ws_max[(row * p.heads + h0 + hh) * p.splits + zz];
        m = m < v ? v : m;
      }
  }
  float den = 0.0f;
  for (int64_t j = l8; j < span; j += 8) {
    float* sp = Ss + hh * p.ld_s + j;
    const float pj = m == -INFINITY ? 0.0f : detail::exp_f32(__fsub_rn(*sp, m));
    *sp = pj;
    den = __fadd_rn(den, pj);
  }
  for (int o = 4; o > 0; o >>= 1) den = __fadd_rn(den, __shfl_xor_sync(detail::kFullMask, den, o));
  if (l8 == 0) {
    Mh[hh] = m;
    Dh[hh] = den;
  }
  __syncthreads();

  // ---- phase C: O = P·V ----
  float acc[kNT][4];
#pragma unroll
  for (int i = 0; i < kNT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  const int nbase = warp * kNT * 8;  // first channel of the warp
  for (int tile = 0; tile < ntiles; ++tile) {
    const int64_t j0 = jb + static_cast<int64_t>(tile) * kTile;
    load_tile<kHd>(p, tk, row, rk, j0, je, Ks, kLd, rp, kind);
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const int k0 = 16 * ks;  // key offset in the tile
      const int64_t col = static_cast<int64_t>(tile) * kTile + k0 + 2 * t;
      const float2 p00 = *reinterpret_cast<const float2*>(Ss + g * p.ld_s + col);
      const float2 p10 = *reinterpret_cast<const float2*>(Ss + (g + 8) * p.ld_s + col);
      const float2 p01 = *reinterpret_cast<const float2*>(Ss + g * p.ld_s + col + 8);
      const float2 p11 = *reinterpret_cast<const float2*>(Ss + (g + 8) * p.ld_s + col + 8);
      const float pv[8] = {p00.x, p00.y, p10.x, p10.y, p01.x, p01.y, p11.x, p11.y};
      uint32_t a[3][4];
      int parts = 1;
      if (p.bf16_p) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[0][i] = pack_bf16x2_rn(pv[2 * i], pv[2 * i + 1]);
      } else {  // p = hi + mid + lo exactly (8 + 8 + 8 bits)
        parts = 3;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float r0 = pv[2 * i], r1 = pv[2 * i + 1];
#pragma unroll
          for (int part = 0; part < 3; ++part) {
            const float q0 = detail::round_bf16(r0), q1 = detail::round_bf16(r1);
            a[part][i] = pack_bf16x2_rn(q0, q1);
            r0 = __fsub_rn(r0, q0);
            r1 = __fsub_rn(r1, q1);
          }
        }
      }
      // V fragments: matrices (keys k0..+7 | k0+8..+15) × (channels n | n+8).
      const int mtx = lane >> 3, mr = lane & 7;
      const __nv_bfloat16* vrow = Ks + (k0 + mr + ((mtx & 1) ? 8 : 0)) * kLd;
      if constexpr (kNT == 1) {
        uint32_t b0, b1;
        ldmatrix_x2_trans(vrow + nbase, b0, b1);
        for (int part = 0; part < parts; ++part) mma_bf16_16816(a[part], b0, b1, acc[0]);
      } else {
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4_trans(vrow + nbase + np * 16 + ((mtx >> 1) ? 8 : 0), b0, b1, b2, b3);
          for (int part = 0; part < parts; ++part) {
            mma_bf16_16816(a[part], b0, b1, acc[2 * np]);
            mma_bf16_16816(a[part], b2, b3, acc[2 * np + 1]);
          }
        }
      }
    }
    __syncthreads();
  }

  // ---- output: o = bf16(acc / (Σp + exp(sink − M))), inverse RoPE at p ----
  const int64_t rope_start = kHd - p.rope.rope_dim;
  auto finish = [&](int hl, int c, float x0, float x1, float den_total) {
    const int64_t h = h0 + hl;
    if (h >= p.heads) return;
    const float mm = Mh[hl];
    const float denom = __fadd_rn(den_total, detail::exp_f32(__fsub_rn(p.sink[h], mm)));
    float e = detail::round_bf16(__fdiv_rn(x0, denom)), o = detail::round_bf16(__fdiv_rn(x1, denom));
    if (c >= rope_start) detail::rope_pair(p.rope, tk.pos, (c - rope_start) / 2, true, e, o);
    *reinterpret_cast<float2*>(p.out + (row * p.heads + h) * kHd + c) = make_float2(e, o);
  };
  if (p.splits == 1) {
#pragma unroll
    for (int i = 0; i < kNT; ++i) {
      const int c = nbase + 8 * i + 2 * t;
      finish(g, c, acc[i][0], acc[i][1], Dh[g]);
      finish(g + 8, c, acc[i][2], acc[i][3], Dh[g + 8]);
    }
    return;
  }
  // Key split: every range writes its partial sums; the last block of (row, head group) adds them.
  const int64_t stride_h = static_cast<int64_t>(p.splits) * kHd;
#pragma unroll
  for (int i = 0; i < kNT; ++i) {
    const int c = nbase + 8 * i + 2 * t;
    if (h0 + g < p.heads)
      *reinterpret_cast<float2*>(p.ws_acc + (row * p.heads + h0 + g) * stride_h + z * kHd + c) =
          make_float2(acc[i][0], acc[i][1]);
    if (h0 + g + 8 < p.heads)
      *reinterpret_cast<float2*>(p.ws_acc + (row * p.heads + h0 + g + 8) * stride_h + z * kHd + c) =
          make_float2(acc[i][2], acc[i][3]);
  }
  if (tid < kHeadsPerBlock && h0 + tid < p.heads) p.ws_den[(row * p.heads + h0 + tid) * p.splits + z] = Dh[tid];
  __threadfence();
  __syncthreads();
  unsigned* counter = p.ws_count + row * gridDim.x + blockIdx.x;
  if (tid == 0) is_last = atomicAdd(counter, 1u) == static_cast<unsigned>(p.splits - 1);
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  if (tid < kHeadsPerBlock) {
    float d = 0.0f;
    if (h0 + tid < p.heads)
      for (int zz = 0; zz < p.splits; ++zz)
        d = __fadd_rn(d, __ldcg(p.ws_den + (row * p.heads + h0 + tid) * p.splits + zz));
    Dh[tid] = d;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kNT; ++i) {
    const int c = nbase + 8 * i + 2 * t;
    for (int half = 0; half < 2; ++half) {
      const int hl = g + 8 * half;
      if (h0 + hl >= p.heads) continue;
      float x0 = 0.0f, x1 = 0.0f;
      const float* base = p.ws_acc + (row * p.heads + h0 + hl) * stride_h + c;
      for (int zz = 0; zz < p.splits; ++zz) {
        const float2 v = __ldcg(reinterpret_cast<const float2*>(base + zz * kHd));
        x0 = __fadd_rn(x0, v.x);
        x1 = __fadd_rn(x1, v.y);
      }
      finish(hl, c, x0, x1, Dh[hl]);
    }
  }
  if (tid == 0) *counter = 0;  // re-armed for the next launch / graph replay
}

int choose_splits(int64_t n, int64_t heads, int64_t max_keys) {
  const int64_t blocks = n * ((heads + kHeadsPerBlock - 1) / kHeadsPerBlock);
  const int64_t want = 2 * 132;  // two blocks per SM of an H200
  if (blocks >= want) return 1;
  const int64_t by_keys = std::max<int64_t>(1, (max_keys + 2 * kTile - 1) / (2 * kTile));  // >= 64 keys per range
  return static_cast<int>(std::max<int64_t>(1, std::min((want + blocks - 1) / blocks, by_keys)));
}

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

size_t smem_bytes(int64_t hd, int64_t keys_per_split) {
  return static_cast<size_t>((kHeadsPerBlock + kTile) * (hd + 8) * 2 + kHeadsPerBlock * (keys_per_split + 8) * 4);
}

template <int kNT, bool kMaxOnly>
Status launch(const AttnParams& p, dim3 grid, size_t smem, cudaStream_t stream) {
  auto* fn = &sparse_attention_kernel<kNT, kMaxOnly>;
  // Above the default 48 KiB the kernel must opt in (a function attribute, not a stream operation).
  if (smem > 48 * 1024)
    CEDAR_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  fn<<<grid, kThreads, smem, stream>>>(p);
  return launch_status("sparse_attention_kernel");
}

template <bool kMaxOnly>
Status launch_hd(int64_t hd, const AttnParams& p, dim3 grid, size_t smem, cudaStream_t stream) {
  switch (hd) {
    case 32:
      return launch<1, kMaxOnly>(p, grid, smem, stream);
    case 64:
      return launch<2, kMaxOnly>(p, grid, smem, stream);
    case 128:
      return launch<4, kMaxOnly>(p, grid, smem, stream);
    case 256:
      return launch<8, kMaxOnly>(p, grid, smem, stream);
    default:
      return launch<16, kMaxOnly>(p, grid, smem, stream);
  }
}

}  // namespace

SparseAttnWorkspaceSize sparse_attention_workspace_size(int64_t n, int64_t heads, int64_t head_dim, int64_t window,
                                                        int64_t topk_width) {
  const SparseAttnWorkspaceSize t = sparse_attention_tiled_workspace_size(n, heads, head_dim, window, topk_width);
  const SparseAttnWorkspaceSize d = sparse_attention_decode_workspace_size(n, heads, head_dim, window, topk_width);
  return SparseAttnWorkspaceSize{std::max(t.floats, d.floats), std::max(t.counters, d.counters)};
}

Status sparse_attention(const SparseAttnArgs& a, cudaStream_t stream, const SparseAttnWorkspace& ws) {
  if (sparse_attention_picks_decode(a, ws)) return sparse_attention_decode(a, stream, ws);
  if ((a.out_f16_codes == nullptr) != (a.out_f16_scales == nullptr))
    return make_error("cuda::sparse_attention: out_f16_codes and out_f16_scales: both or neither");
  CEDAR_RETURN_IF_ERROR(sparse_attention_tiled(a, stream, ws));
  return a.out_f16_codes ? stage_act_f16(a.out, a.n, a.heads * a.head_dim, a.out_f16_codes, a.out_f16_scales, stream)
                         : Status::Ok();
}

SparseAttnWorkspaceSize sparse_attention_tiled_workspace_size(int64_t n, int64_t heads, int64_t head_dim,
                                                              int64_t window, int64_t topk_width) {
  if (n <= 0 || heads <= 0 || head_dim <= 0) return {};
  const int64_t max_keys = window + std::max<int64_t>(0, topk_width);
  const int splits = choose_splits(n, heads, max_keys);
  if (splits <= 1) return {};
  return SparseAttnWorkspaceSize{n * heads * splits * (head_dim + 2),
                                 n * ((heads + kHeadsPerBlock - 1) / kHeadsPerBlock)};
}

Status sparse_attention_tiled(const SparseAttnArgs& a, cudaStream_t stream, const SparseAttnWorkspace& ws) {
  const std::string who = "cuda::sparse_attention: ";
  const int64_t hd = a.head_dim;
  if (a.q_before_rope)
    return make_error(who + "q_before_rope is a decode-kernel option (" + str(a.n) +
                      " rows, or no split workspace: the tiled kernel needs q after rope_apply)");
  if (hd != 32 && hd != 64 && hd != 128 && hd != 256 && hd != 512)
    return make_error(who + "head_dim " + str(hd) + " (32, 64, 128, 256 or 512)");
  if (a.heads <= 0 || a.window <= 0) return make_error(who + "heads " + str(a.heads) + ", window " + str(a.window));
  if (a.n < 0 || a.n > 65535) return make_error(who + "n=" + str(a.n) + " rows (at most 65535 per call)");
  if (a.rope.cos_sin == nullptr || a.rope.rope_dim <= 0 || a.rope.rope_dim % 2 != 0 || a.rope.rope_dim > hd)
    return make_error(who + "RoPE table with rope_dim " + str(a.rope.rope_dim) + " does not fit head_dim " + str(hd));
  if (a.topk != nullptr && (a.topk_width <= 0 || a.kv_seqs == nullptr))
    return make_error(who + "top-k without a width or KV source");
  if (a.n == 0) return Status::Ok();
  if (a.q == nullptr || a.sink == nullptr || a.tokens == nullptr || a.chunk_records == nullptr || a.rings == nullptr ||
      a.out == nullptr)
    return make_error(who + "null query, sink, tokens, records, rings or output");
  const int64_t max_keys = a.window + (a.topk != nullptr ? a.topk_width : 0);
  int splits = choose_splits(a.n, a.heads, max_keys);
  const SparseAttnWorkspaceSize need =
      sparse_attention_tiled_workspace_size(a.n, a.heads, hd, a.window, a.topk != nullptr ? a.topk_width : 0);
  if (splits > 1 && (ws.floats == nullptr || ws.counters == nullptr || ws.float_count < need.floats ||
                     ws.counter_count < need.counters))
    splits = 1;  // no (or too small a) workspace: one block per (row, head group)
  int64_t kps = round_up((max_keys + splits - 1) / splits, kTile);
  while (smem_bytes(hd, kps) > kSmemLimit) {  // very long key lists: more ranges (needs the workspace)
    if (ws.floats == nullptr) return make_error(who + str(max_keys) + " keys per row need the split workspace");
    ++splits;
    kps = round_up((max_keys + splits - 1) / splits, kTile);
  }
  splits = static_cast<int>((max_keys + kps - 1) / kps);
  if (splits > 1 && (ws.float_count < a.n * a.heads * splits * (hd + 2) ||
                     ws.counter_count < a.n * ((a.heads + kHeadsPerBlock - 1) / kHeadsPerBlock)))
    return make_error(who + "split workspace too small for " + str(splits) + " key ranges");
  AttnParams p{detail::sparse_attn_inputs(a)};  // the plan's fields zero until set
  p.splits = splits;
  p.keys_per_split = kps;
  p.ld_s = kps + 8;
  if (splits > 1) {
    const int64_t nh = a.n * a.heads * splits;
    p.ws_max = ws.floats;
    p.ws_den = ws.floats + nh;
    p.ws_acc = ws.floats + 2 * nh;
    p.ws_count = ws.counters;
  }
  const dim3 grid(static_cast<unsigned>((a.heads + kHeadsPerBlock - 1) / kHeadsPerBlock), static_cast<unsigned>(a.n),
                  static_cast<unsigned>(splits));
  const size_t smem = smem_bytes(hd, kps);
  if (splits > 1) CEDAR_RETURN_IF_ERROR(launch_hd<true>(hd, p, grid, smem, stream));
  return launch_hd<false>(hd, p, grid, smem, stream);
}

Status attention_output(const AttnOutputArgs& a, cudaStream_t stream) {
  if (a.act == nullptr) return make_error("cuda::attention_output: no activation workspace for wo_b");
  CEDAR_RETURN_IF_ERROR(gemv_bf16({.w = a.wo_a,
                                   .out = a.o_lora,
                                   .in = a.in_per_group,
                                   .groups = a.groups,
                                   .x = a.o,
                                   .y = a.u,
                                   .n = a.n,
                                   .bf16_output = true},
                                  stream, a.wo_a_splitk));
  return linear_quantized(a.wo_b, a.u, a.n, *a.act, a.out, true, stream);
}

// For the catalog's loadability check.
const void* sparse_attention_kernel_ptr() { return reinterpret_cast<const void*>(&sparse_attention_kernel<16, false>); }

}  // namespace cedar::cuda
