// Embedding gather + stream expansion (§3.2) and the MoE router (§3.8): fp32 logits from the bf16
// gate, sqrtsoftplus, biased top-k selection with the CPU's strict order, routing weights.
//
// Router logits: a bandwidth problem (the 384×5120 bf16 gate is 3.9 MB, read once per step). The gate
// is streamed by bf16 tensor-core MMAs (mma_bf16.cuh's fragment convention: 16 experts × 8 tokens per
// MMA, products exact in fp32) with K split over the 8 warps of a block and over `ksplit` blocks, so
// ~120 blocks each issue all their weight loads at once (4 chunks × 2 rows × 16 B per thread). The
// partial sums meet in a workspace in a fixed order (warps, then splits): deterministic, and a token's
// logits do not depend on the other tokens of the call (MMA columns are independent, the split
// depends only on the shape). For n <= 8 with a workspace, moe_route fuses the selection into the
// same launch: the last block (ticket) adds the partials and one warp per token selects its top-k
// (K rounds of a warp max over order-preserving 64-bit keys) — one kernel instead of two.
// (The first version — 2 rows per block, CUDA-core FMAs, one block per token for the selection with
// an O(E²) rank loop per thread — measured 62 µs at n = 1 on the H200, almost all of it the selection.)
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/ffn_device.cuh"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/gemm_kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma_bf16.cuh"
#include "backend/cuda/moe_items_build.cuh"

namespace cedar::cuda {
namespace {

constexpr int kEmbedThreads = 256;
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxTopk = 64;

constexpr int kRlWarps = 8;
constexpr int kRlThreads = kRlWarps * 32;
constexpr int kRlRows = 16;                           // experts per block (the MMA's M)
constexpr int kRlTile = 8;                            // tokens per MMA (N)
constexpr int kRlMaxTiles = 8;                        // tokens per pass: up to 64
constexpr int kRlPassTokens = kRlTile * kRlMaxTiles;  // also the token stride of the partials
constexpr int kRlChunk = 32;                          // K values per chunk (two k16 MMAs)
constexpr int kRlChunksPerWarp = 4;                   // per split: all of a warp's weight loads in flight
constexpr int kFuseMaxTokens = 8;
constexpr int64_t kFuseMaxValues = 5120;  // n·E: score + biased rows in <= 40 KB of dynamic shared memory
constexpr int kSelectMaxWarps = 8;
constexpr int kSelectKeyRegs = 12;  // keys per lane kept in registers: E <= 384 (V4.1's 384 experts)
constexpr int64_t kSelectSmemBytes = 48 * 1024;

// One block per (token, slice of 8-value chunks). Out-of-range tokens give zero rows.
__global__ void __launch_bounds__(kEmbedThreads) embed_gather_kernel(EmbedGatherArgs a) {
  const int64_t t = blockIdx.y;
  const int32_t tok = a.tokens[t];
  const bool ok = tok >= 0 && tok < a.vocab;
  if (!ok && a.bad_token && threadIdx.x == 0 && blockIdx.x == 0) atomicMax(a.bad_token, static_cast<int32_t>(t + 1));
  const int64_t d = a.d;
  const uint16_t* src = a.table + (ok ? static_cast<int64_t>(tok) : 0) * d;
  for (int64_t c = (static_cast<int64_t>(blockIdx.x) * kEmbedThreads + threadIdx.x); c < d;
       c += static_cast<int64_t>(gridDim.x) * kEmbedThreads) {
    const float v = ok ? detail::bf16_bits_to_float(src[c]) : 0.0f;
    if (a.x) a.x[t * d + c] = v;
    if (a.X)
      for (int64_t k = 0; k < a.hc; ++k) a.X[(t * a.hc + k) * d + c] = v;
  }
  if (a.pre_prev && blockIdx.x == 0 && threadIdx.x < a.hc)
    a.pre_prev[t * a.hc + threadIdx.x] = threadIdx.x == 0 ? 1.0f : 0.0f;
}

// ---- selection helpers ----------------------------------------------------------------------------

// torch softplus (beta 1, threshold 20) then sqrt, with the CPU's fp32 rounding steps.
__device__ __forceinline__ float sqrt_softplus(float v) {
  return sqrtf(v > 20.0f ? v : detail::log1pf_cr(detail::expf_cr(v)));
}

// The selection bias of expert e for token t (the image bias for image tokens); 0 when tid2eid routes.
__device__ __forceinline__ float bias_of(const RouterArgs& a, int64_t t, int64_t e) {
  if (a.tid2eid != nullptr) return 0.0f;
  const bool image = a.is_image != nullptr && a.is_image[t] != 0;
  return (image ? a.bias_vl : a.bias)[e];
}

// Score of expert e for token t from its logit; the biased value (selection key) unless tid2eid routes.
__device__ __forceinline__ void score_entry(const RouterArgs& a, int64_t t, int64_t e, float logit, float bias,
                                            float* score, float* biased) {
  const float s = sqrt_softplus(logit / a.gate_temp);
  score[e] = s;
  if (a.scores) a.scores[t * a.n_experts + e] = s;
  if (a.tid2eid == nullptr) biased[e] = s + bias;
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The split-K ticket as one acquire-release atomic (after the block's barrier, thread 0 only): its release
// publishes the block's partials (ordered before it by the barrier), its acquire makes the others'
// partials visible to the last block (ordered after it by the next barrier).
__device__ __forceinline__ unsigned ticket_acq_rel(unsigned* counter) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

// A total order equal to the CPU's SelectionOrder (larger value first, NaN above every number, lower
// id on ties; −0 == +0) as one unsigned key, larger = selected first. Keys of distinct experts differ.
__device__ __forceinline__ uint64_t selection_key(float v, int64_t e) {
  uint32_t ord = 0xFFFFFFFFu;  // every NaN
  if (!isnan(v)) {
    uint32_t b = __float_as_uint(v);
    if ((b & 0x7FFFFFFFu) == 0) b = 0;  // −0 → +0
    ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  }
  return (static_cast<uint64_t>(ord) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(e));
}

// The warp's largest key (every lane's `best`; 0 when none): two 32-bit redux steps, the high word, then the
// low word among the lanes holding the maximal high word.
__device__ __forceinline__ uint64_t warp_max_key(uint64_t best) {
  const uint32_t hi = static_cast<uint32_t>(best >> 32);
  const uint32_t max_hi = __reduce_max_sync(detail::kFullMask, hi);
  const uint32_t max_lo = __reduce_max_sync(detail::kFullMask, hi == max_hi ? static_cast<uint32_t>(best) : 0u);
  return (static_cast<uint64_t>(max_hi) << 32) | max_lo;
}

__device__ __forceinline__ int32_t expert_of_key(uint64_t key) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
}

__device__ void route_weights_warp(const RouterArgs& a, int64_t t, const float* score, const int32_t* sel, int lane);

// One warp selects token t's top-k from its scores / biased values (shared memory rows of n_experts)
// and lane 0 writes the experts and weights. K rounds: every lane takes the largest of its keys below
// the previous winner, then a warp max (two 32-bit redux steps: high word, then the low word among
// the lanes holding the maximal high word). sel: per-warp shared scratch [kMaxTopk].
__device__ void select_warp(const RouterArgs& a, int64_t t, const float* score, const float* biased, int lane,
                            int32_t* sel) {
  const int64_t E = a.n_experts, K = a.topk;
  if (a.tid2eid != nullptr) {
    int64_t id = a.token_ids[t];
    id = id < 0 ? 0 : (id >= a.tid2eid_vocab ? a.tid2eid_vocab - 1 : id);
    for (int64_t k = lane; k < K; k += 32) sel[k] = a.tid2eid[id * K + k];
  } else if (E <= 32 * kSelectKeyRegs) {
    // The lane's keys computed once, in registers (the rounds below rescan registers, not shared memory).
    uint64_t keys[kSelectKeyRegs];
#pragma unroll
    for (int r = 0; r < kSelectKeyRegs; ++r) {
      const int64_t e = lane + 32 * r;
      keys[r] = e < E ? selection_key(biased[e], e) : 0;  // 0: below every real key, never selected
    }
    uint64_t prev = 0;
#pragma unroll 1  // small code: the fused launch's tail runs it cold (see router_logits_kernel)
    for (int64_t k = 0; k < K; ++k) {
      uint64_t best = 0;
#pragma unroll
      for (int r = 0; r < kSelectKeyRegs; ++r)
        if ((k == 0 || keys[r] < prev) && keys[r] > best) best = keys[r];
      prev = warp_max_key(best);
      if (lane == 0) sel[k] = expert_of_key(prev);
    }
  } else {
    uint64_t prev = 0;
    for (int64_t k = 0; k < K; ++k) {
      uint64_t best = 0;  // below every real key (their low word is >= 0xFFFFF000)
      for (int64_t e = lane; e < E; e += 32) {
        const uint64_t key = selection_key(biased[e], e);
        if ((k == 0 || key < prev) && key > best) best = key;
      }
      prev = warp_max_key(best);
      if (lane == 0) sel[k] = expert_of_key(prev);
    }
  }
  route_weights_warp(a, t, score, sel, lane);
}

// Token t's routing weights from its selected ids (sel[0, K), visible to the warp after its __syncwarp) and
// scores; lane k writes slot k of a.experts / a.weights.
__device__ void route_weights_warp(const RouterArgs& a, int64_t t, const float* score, const int32_t* sel, int lane) {
  const int64_t E = a.n_experts, K = a.topk;
  __syncwarp();
  // Weights in slot order, as route_tokens: w_k = s_k / (Σ + 1e-20) · route_scale (no contraction:
  // each step is one rounded operation). Every lane forms the same Σ in slot order; lane k writes slot
  // k (slots k, k + 32, ...): the divisions in parallel instead of one after another in lane 0.
  float sum = 0.0f;
#pragma unroll 1
  for (int64_t k = 0; k < K; ++k) {
    const int32_t e = sel[k];
    sum = __fadd_rn(sum, (e >= 0 && e < E) ? score[e] : 0.0f);
  }
#pragma unroll 1
  for (int64_t k = lane; k < K; k += 32) {
    const int32_t e = sel[k];
    float v = (e >= 0 && e < E) ? score[e] : 0.0f;
    if (a.norm_topk_prob) v = v / __fadd_rn(sum, 1e-20f);
    v = __fmul_rn(v, a.route_scale);
    a.experts[t * K + k] = e;
    a.weights[t * K + k] = v;
  }
}

// Batch 1: the token's top-k by every warp of the block at once, from this thread's two selection keys (experts
// threadIdx.x and threadIdx.x + blockDim.x; 0: none). Each warp takes the top-k of its 64 keys (k rounds of
// warp_max_key), then warp 0 the top-k of the warps' candidates (cand: shared [kRlWarps][kOneMaxTopk]). Keys are a
// strict total order, so the top-k of the union is the top-k of the parts' top-k: select_warp's ids in its order.
// s33 stamps (kernel bench, V4.1's 384 experts): the selection 5 230 → 3 260 cycles of the tail on the H200.
constexpr int kOneMaxTopk = 8;

// K rounds over two keys per lane (0: none): emit(k, the warp's k-th largest key) on every lane, largest first.
template <class Emit>
__device__ __forceinline__ void warp_top_k_of_two(uint64_t key0, uint64_t key1, int K, Emit emit) {
  uint64_t prev = 0;
#pragma unroll 1
  for (int k = 0; k < K; ++k) {
    uint64_t best = 0;
    if ((k == 0 || key0 < prev) && key0 > best) best = key0;
    if ((k == 0 || key1 < prev) && key1 > best) best = key1;
    prev = warp_max_key(best);
    emit(k, prev);
  }
}

__device__ void select_one_token_block(const RouterArgs& a, uint64_t key0, uint64_t key1, const float* score,
                                       uint64_t* cand, int32_t* sel) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int K = static_cast<int>(a.topk);
  warp_top_k_of_two(key0, key1, K, [&](int k, uint64_t key) {
    if (lane == 0) cand[warp * kOneMaxTopk + k] = key;
  });
  if (lane < kOneMaxTopk - K) cand[warp * kOneMaxTopk + K + lane] = 0;  // below every real key
  __syncthreads();  // the candidates, and the score rows route_weights_warp reads
  if (warp != 0) return;
  static_assert(kRlWarps * kOneMaxTopk == 64, "warp 0 holds two candidates per lane");
  warp_top_k_of_two(cand[lane], cand[lane + 32], K, [&](int k, uint64_t key) {
    if (lane == 0) sel[k] = expert_of_key(key);
  });
  route_weights_warp(a, 0, score, sel, lane);
}

// ---- logits ---------------------------------------------------------------------------------------

// Σ_{z < ksplit} parts[i][z·stride] in split order (from 0.0f) for kN independent sums, loads issued
// 8 splits × kN at a time (one L2 round trip per 8 splits instead of one per split).
template <int kN>
__device__ __forceinline__ void sum_splits(const float* const (&parts)[kN], int64_t stride, int ksplit,
                                           float (&s)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) s[i] = 0.0f;
  for (int z0 = 0; z0 < ksplit; z0 += 8) {
    float v[kN][8];
#pragma unroll
    for (int i = 0; i < kN; ++i)
#pragma unroll
      for (int q = 0; q < 8; ++q) v[i][q] = __ldcg(parts[i] + static_cast<int64_t>(min(z0 + q, ksplit - 1)) * stride);
#pragma unroll
    for (int i = 0; i < kN; ++i)
#pragma unroll
      for (int q = 0; q < 8; ++q)
        if (z0 + q < ksplit) s[i] += v[i][q];
  }
}

struct RouterLogitsParams {
  const float* x;  // [n, d] of this pass
  const uint16_t* gate;
  int64_t d, E;
  int n;          // tokens of this pass (1..64; <= 8 when fused)
  float* logits;  // [n, E] of this pass
  int ksplit, chunks_per_split;
  float* partials;     // [ksplit][kRlPassTokens][E]
  unsigned* counters;  // [row tiles] per-tile tickets, then one ticket for the fused selection
};

template <int kTiles>
constexpr int kRlUnroll = kTiles == 1 ? 4 : 2;

// Block (x, y): experts [16x, 16x+16), K chunks of split y. kFuse: the last block of the grid adds the
// partials of every (token, expert) and selects (dynamic shared memory: score and biased rows), then with
// `dispatch` builds the expert items (`items`) from the ids it selected (the same shared memory, reused).
template <int kTiles, bool kFuse>
__global__ void __launch_bounds__(kRlThreads)
    router_logits_kernel(RouterLogitsParams p, RouterArgs a, MoeDispatchArgs items, bool dispatch) {
  constexpr int kTok = kTiles * kRlTile;
  constexpr int kU = kRlUnroll<kTiles>;
  __shared__ float partial[kRlWarps][kRlRows][kTok];
  __shared__ int32_t sel[kFuse ? kFuseMaxTokens : 1][kMaxTopk];
  __shared__ bool is_last;
  __shared__ int32_t warp_tot[kFuse ? 32 : 1];
  __shared__ uint64_t cand[kFuse ? kRlWarps * kOneMaxTopk : 1];  // select_one_token_block's candidates
  detail::pdl_launch_dependents();
  const bool stamp = kFuse && a.stamps != nullptr && threadIdx.x == 0;
  unsigned long long* const stamps =
      stamp ? a.stamps + (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * kRouterStampsPerBlock : nullptr;
  if (stamp) stamps[0] = global_ns();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t E = p.E, d = p.d;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRlRows;
  // Rows past E and tokens past n read row / token 0 (valid memory); their outputs are never written.
  const int64_t r_lo = row0 + g < E ? row0 + g : 0;
  const int64_t r_hi = row0 + g + 8 < E ? row0 + g + 8 : 0;
  const uint16_t* w_lo = p.gate + r_lo * d + 8 * t;
  const uint16_t* w_hi = p.gate + r_hi * d + 8 * t;
  const int n_chunks = static_cast<int>((d + kRlChunk - 1) / kRlChunk);
  const int c_begin = static_cast<int>(blockIdx.y) * p.chunks_per_split;
  const int c_end = min(n_chunks, c_begin + p.chunks_per_split);
  // PDL: the first round's gate lines into L2 while the previous kernel finishes (the weights do not
  // depend on it; x waits). A chunk of a row is 64 bytes (one line when 2d is a multiple of 64, as at
  // d = 5120): lanes t = 0 ask for it.
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int c = c_begin + warp + u * kRlWarps;
    if (t == 0 && c < c_end) {
      detail::prefetch_l2(w_lo + static_cast<int64_t>(c) * kRlChunk);
      detail::prefetch_l2(w_hi + static_cast<int64_t>(c) * kRlChunk);
    }
  }
  detail::pdl_wait();  // under PDL: x comes from the previous kernel
  if (stamp) stamps[1] = global_ns();
  const float* x_tile[kTiles];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int tok = i * kRlTile + g;
    x_tile[i] = p.x + static_cast<int64_t>(tok < p.n ? tok : 0) * d + 8 * t;
  }

  float acc[kTiles][4];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  // Loads are unconditional (a chunk past the split reads the split's first chunk, then counts as
  // zeros). ptxas interleaves loads with the MMAs (one chunk in flight at a time: 4 HBM round trips per
  // warp instead of one), so every MMA is made to depend on all of the iteration's loads through the
  // chunk mask, with a runtime condition that is never true (n < 0): all loads are issued up front.
  // At one token tile the activations are loaded up front as well.
  constexpr bool kXUpFront = kTiles == 1;
  for (int c0 = c_begin + warp; c0 < c_end; c0 += kRlWarps * kU) {
    uint4 wl[kU], wh[kU];
    float4 xa[kXUpFront ? kU : 1][2];
    bool ok[kU];
    int64_t off[kU];
    uint32_t dep = 0;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + u * kRlWarps;
      ok[u] = c < c_end && static_cast<int64_t>(c) * kRlChunk + 8 * t < d;  // d % 8 == 0: 8 values all in or out
      off[u] = static_cast<int64_t>(ok[u] ? c : c_begin) * kRlChunk;
      wl[u] = detail::ld_weight(reinterpret_cast<const uint4*>(w_lo + off[u]));
      wh[u] = detail::ld_weight(reinterpret_cast<const uint4*>(w_hi + off[u]));
      dep ^= wl[u].x ^ wl[u].y ^ wl[u].z ^ wl[u].w ^ wh[u].x ^ wh[u].y ^ wh[u].z ^ wh[u].w;
      if constexpr (kXUpFront) {
        xa[u][0] = __ldg(reinterpret_cast<const float4*>(x_tile[0] + off[u]));
        xa[u][1] = __ldg(reinterpret_cast<const float4*>(x_tile[0] + off[u] + 4));
        dep ^= __float_as_uint(xa[u][0].x) ^ __float_as_uint(xa[u][1].w);
      }
    }
    const uint32_t keep = (static_cast<uint32_t>(p.n < 0) & static_cast<uint32_t>(dep == 0)) ? 0u : 0xFFFFFFFFu;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint32_t m = ok[u] ? keep : 0u;  // zero weights and activations of a skipped chunk
      const uint32_t a1[4] = {wl[u].x & m, wh[u].x & m, wl[u].y & m, wh[u].y & m};
      const uint32_t a2[4] = {wl[u].z & m, wh[u].z & m, wl[u].w & m, wh[u].w & m};
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        float4 x0, x1;
        if constexpr (kXUpFront) {
          x0 = xa[u][0];
          x1 = xa[u][1];
        } else {
          const float* xp = x_tile[i] + off[u];
          x0 = __ldg(reinterpret_cast<const float4*>(xp));
          x1 = __ldg(reinterpret_cast<const float4*>(xp + 4));
        }
        detail::mma_bf16_16816(a1, detail::pack_bf16x2_rn(x0.x, x0.y) & m, detail::pack_bf16x2_rn(x0.z, x0.w) & m,
                               acc[i]);
        detail::mma_bf16_16816(a2, detail::pack_bf16x2_rn(x1.x, x1.y) & m, detail::pack_bf16x2_rn(x1.z, x1.w) & m,
                               acc[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int tok0 = i * kRlTile + 2 * t;
    partial[warp][g][tok0] = acc[i][0];
    partial[warp][g][tok0 + 1] = acc[i][1];
    partial[warp][g + 8][tok0] = acc[i][2];
    partial[warp][g + 8][tok0 + 1] = acc[i][3];
  }
  __syncthreads();

  // Thread outputs (row, tok) = (e / kTok, e % kTok), e = threadIdx.x + j·256: the warps in order.
  constexpr int kOutputs = kRlRows * kTok;
  constexpr int kPer = (kOutputs + kRlThreads - 1) / kRlThreads;
  float sum[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = threadIdx.x + j * kRlThreads;
    sum[j] = 0.0f;
    if (e < kOutputs) {
#pragma unroll
      for (int w = 0; w < kRlWarps; ++w) sum[j] += partial[w][e / kTok][e % kTok];
    }
  }
  auto writer = [&](int e) { return e < kOutputs && (e % kTok) < p.n && row0 + e / kTok < E; };
  if (!kFuse && p.ksplit == 1) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int e = threadIdx.x + j * kRlThreads;
      if (writer(e)) p.logits[static_cast<int64_t>(e % kTok) * E + row0 + e / kTok] = sum[j];
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = threadIdx.x + j * kRlThreads;
    if (writer(e))
      p.partials[(static_cast<int64_t>(blockIdx.y) * kRlPassTokens + e % kTok) * E + row0 + e / kTok] = sum[j];
  }
  if (stamp) stamps[2] = global_ns();
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* const ticket = p.counters + (kFuse ? gridDim.x : blockIdx.x);
    const unsigned arrivals = kFuse ? gridDim.x * gridDim.y : static_cast<unsigned>(p.ksplit);
    is_last = ticket_acq_rel(ticket) == arrivals - 1;
  }
  __syncthreads();
  if (stamp) stamps[3] = global_ns();
  if (!is_last) return;
  if (!kFuse) {  // the last split of this row tile: Σ over splits in split order
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int e = threadIdx.x + j * kRlThreads;
      if (writer(e)) {
        const float* const base[1] = {p.partials + static_cast<int64_t>(e % kTok) * E + row0 + e / kTok};
        float s[1];
        sum_splits<1>(base, kRlPassTokens * E, p.ksplit, s);
        p.logits[static_cast<int64_t>(e % kTok) * E + row0 + e / kTok] = s[0];
      }
    }
    if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;  // re-armed for the next launch / graph replay
    return;
  }
  // Fused selection: every logit (same split order as above, so the same bits as the two-kernel path),
  // its score and biased value, then one warp per token. This tail runs once per launch on one SM, with
  // its code cold in the instruction cache (and in L2, after a decode step's weights streamed through):
  // s13's stamps put 12 µs of a 16 µs launch here. So it is kept small: 32-bit index math (no 64-bit
  // division routine), one copy of the score code (FP64 exp / log1p) instead of one per unrolled pair.
  unsigned long long* const tail =
      stamp ? a.stamps + static_cast<int64_t>(gridDim.x) * gridDim.y * kRouterStampsPerBlock : nullptr;
  if (stamp) tail[0] = clock64();
  if (dispatch) detail::prefetch_moe_tables(items);  // used last: their DRAM round trip hides behind the rest
  extern __shared__ float rows_smem[];
  float* score = rows_smem;             // [n][E]
  float* biased = rows_smem + p.n * E;  // [n][E]
  constexpr int kGroup = 4;  // (token, expert) pairs per thread whose loads are in flight together
  const int En = static_cast<int>(E), pairs = p.n * En;  // pair idx = token·E + expert (<= kFuseMaxValues)
  // Batch 1 (block-uniform): the keys stay in registers and every warp selects (select_one_token_block).
  const bool one =
      a.one_token_select && p.n == 1 && a.tid2eid == nullptr && En <= 2 * kRlThreads && a.topk <= kOneMaxTopk;
  if (one) {
    const float* base[2] = {p.partials + min(static_cast<int>(threadIdx.x), En - 1),
                            p.partials + min(static_cast<int>(threadIdx.x) + kRlThreads, En - 1)};
    float bias[2] = {bias_of(a, 0, base[0] - p.partials), bias_of(a, 0, base[1] - p.partials)};
    float s[2];
    sum_splits<2>(base, kRlPassTokens * E, p.ksplit, s);
    uint64_t key0 = 0, key1 = 0;
#pragma unroll 1
    for (int q = 0; q < 2; ++q) {
      const int e = static_cast<int>(threadIdx.x) + q * kRlThreads;
      if (e < En) {
        p.logits[e] = s[0];
        score_entry(a, 0, e, s[0], bias[0], score, biased);
        const uint64_t key = selection_key(biased[e], e);
        key0 = q == 0 ? key : key0;
        key1 = q == 0 ? key1 : key;
      }
      s[0] = s[1];
      bias[0] = bias[1];
    }
    if (stamp) tail[1] = clock64();
    select_one_token_block(a, key0, key1, score, cand, sel[0]);
  }
  for (int i0 = one ? pairs : static_cast<int>(threadIdx.x); i0 < pairs; i0 += kGroup * kRlThreads) {
    const float* base[kGroup];
    float bias[kGroup];
    // The pairs' biases are requested with the partials: read in the loop below, after its logit store (which
    // they may alias, so the compiler cannot hoist them), each cost one more L2 / DRAM round trip (s32).
#pragma unroll
    for (int q = 0; q < kGroup; ++q) {
      const int idx = min(i0 + q * kRlThreads, pairs - 1);
      const int tt = idx / En;
      base[q] = p.partials + idx;  // split 0's
      bias[q] = bias_of(a, tt, idx - tt * En);
    }
    float s[kGroup];
    sum_splits<kGroup>(base, kRlPassTokens * E, p.ksplit, s);
#pragma unroll 1
    for (int q = 0; q < kGroup; ++q) {
      const int idx = i0 + q * kRlThreads;
      if (idx >= pairs) break;
      const int tt = idx / En, e = idx - tt * En;
      const float logit = s[0], b = bias[0];
      s[0] = s[1];  // the next pair's sum and bias to the front: registers, not a dynamically indexed array
      s[1] = s[2];
      s[2] = s[3];
      bias[0] = bias[1];
      bias[1] = bias[2];
      bias[2] = bias[3];
      p.logits[idx] = logit;
      score_entry(a, tt, e, logit, b, score + tt * En, biased + tt * En);
    }
  }
  if (!one) {
    __syncthreads();
    if (stamp) tail[1] = clock64();
    if (warp < p.n) select_warp(a, warp, score + warp * E, biased + warp * E, lane, sel[warp]);
  }
  if (stamp) tail[2] = clock64();
  if (threadIdx.x == 0) p.counters[gridDim.x] = 0;
  if (dispatch) {
    // The ids this block wrote are visible to it after the barrier, and the score rows are free.
    __syncthreads();
    const int K = static_cast<int>(a.topk);
    const auto expert_of = [&](int64_t q) {  // pair q's id as this block selected it (= a.experts[q])
      const int i = static_cast<int>(q), t = i / K;
      return sel[t][i - t * K];
    };
    detail::build_moe_items(items, expert_of, reinterpret_cast<int32_t*>(rows_smem), warp_tot);
  }
  if (a.stamps != nullptr) {
    __syncthreads();
    if (stamp) {
      tail[3] = clock64();
      tail[4] = global_ns();
    }
  }
}

// One warp per token (warps_per_block tokens per block): scores of all experts into shared memory,
// then select_warp.
__global__ void __launch_bounds__(kSelectMaxWarps * 32) router_select_kernel(RouterArgs a, int warps_per_block) {
  extern __shared__ float smem[];  // [warps_per_block][2][E]
  __shared__ int32_t sel[kSelectMaxWarps][kMaxTopk];
  detail::pdl_launch_dependents();
  detail::pdl_wait();  // under PDL: the logits come from the previous kernel
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * warps_per_block + warp;
  if (t >= a.n) return;  // whole warps: no block-wide barrier follows
  const int64_t E = a.n_experts;
  float* score = smem + static_cast<int64_t>(warp) * 2 * E;
  float* biased = score + E;
  for (int64_t e = lane; e < E; e += 32) score_entry(a, t, e, a.logits[t * E + e], bias_of(a, t, e), score, biased);
  __syncwarp();
  select_warp(a, t, score, biased, lane, sel[warp]);
}

int64_t router_row_tiles(int64_t E) { return (E + kRlRows - 1) / kRlRows; }

// K splits: ~4 chunks per warp and split (d = 5120: 5 splits × 24 row tiles = 120 blocks). Depends on
// the shape only, so a token's logits are the same bits at every batch size.
int router_ksplit(int64_t d) {
  const int64_t chunks = (d + kRlChunk - 1) / kRlChunk;
  const int64_t per_split = int64_t{kRlWarps} * kRlChunksPerWarp;
  return static_cast<int>(std::clamp<int64_t>((chunks + per_split - 1) / per_split, 1, 64));
}

bool router_workspace_ok(const RouterArgs& a) {
  const SplitKSize need = router_workspace_size(a.n_experts, a.d);
  return a.splitk.partials != nullptr && a.splitk.counters != nullptr &&
         a.splitk.partial_floats >= need.partial_floats && a.splitk.counter_count >= need.counters;
}

Status check_router(const RouterArgs& a, bool logits_stage) {
  auto fail = [](const std::string& m) { return make_error("cuda::moe_route: " + m); };
  if (a.n < 0 || a.n > 0x7FFFFFFF) return fail("n=" + std::to_string(a.n));
  if (a.n_experts <= 0 || a.n_experts > kMaxExperts)
    return fail("n_experts=" + std::to_string(a.n_experts) + " (1.." + std::to_string(kMaxExperts) + ")");
  if (a.logits == nullptr) return fail("logits buffer is required");
  if (logits_stage) {
    if (a.d <= 0 || a.d % 8 != 0) return fail("d=" + std::to_string(a.d) + " must be a positive multiple of 8");
    if (!a.x || !a.gate) return fail("x and gate are required");
    if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<uintptr_t>(a.gate) % 16 != 0)
      return fail("x and gate must be 16-byte aligned");
    return Status::Ok();
  }
  if (a.topk < 1 || a.topk > a.n_experts || a.topk > kMaxTopk)
    return fail("topk=" + std::to_string(a.topk) + " outside [1, min(n_experts, " + std::to_string(kMaxTopk) + ")]");
  if (!(a.gate_temp > 0.0f)) return fail("gate_temp must be positive");
  if (!a.experts || !a.weights) return fail("experts and weights outputs are required");
  if (a.tid2eid) {
    if (!a.token_ids || a.tid2eid_vocab <= 0) return fail("tid2eid needs token_ids and tid2eid_vocab");
  } else {
    if (!a.bias) return fail("bias is required (selection)");
    if (a.is_image && !a.bias_vl) return fail("is_image given but the gate has no bias_vl");
  }
  return Status::Ok();
}

template <int kTiles, bool kFuse>
Status launch_logits(const RouterLogitsParams& p, const RouterArgs& a, size_t smem, cudaStream_t stream,
                     const MoeDispatchArgs* dispatch = nullptr) {
  const dim3 grid(static_cast<unsigned>(router_row_tiles(p.E)), static_cast<unsigned>(p.ksplit));
  return launch_kernel(router_logits_kernel<kTiles, kFuse>, grid, dim3(kRlThreads), smem, stream,
                       a.programmatic_launch, "router_logits_kernel", p, a,
                       dispatch ? *dispatch : MoeDispatchArgs{}, dispatch != nullptr);
}

RouterLogitsParams logits_params(const RouterArgs& a) {
  RouterLogitsParams p{};
  p.x = a.x;
  p.gate = a.gate;
  p.d = a.d;
  p.E = a.n_experts;
  p.logits = a.logits;
  const bool ws = router_workspace_ok(a);
  p.ksplit = ws ? router_ksplit(a.d) : 1;
  const int n_chunks = static_cast<int>((a.d + kRlChunk - 1) / kRlChunk);
  p.chunks_per_split = (n_chunks + p.ksplit - 1) / p.ksplit;
  p.partials = a.splitk.partials;
  p.counters = a.splitk.counters;
  return p;
}

}  // namespace

int64_t router_fused_blocks(int64_t n_experts, int64_t d) {
  return n_experts <= 0 || d <= 0 ? 0 : router_row_tiles(n_experts) * router_ksplit(d);
}

SplitKSize router_workspace_size(int64_t n_experts, int64_t d) {
  if (n_experts <= 0 || d <= 0) return {};
  return SplitKSize{router_ksplit(d) * kRlPassTokens * n_experts, router_row_tiles(n_experts) + 1};
}

Status embed_gather(const EmbedGatherArgs& a, cudaStream_t stream) {
  if (a.n < 0 || a.n > 65535 || a.d <= 0 || a.vocab <= 0 || a.hc <= 0 || a.hc > kEmbedThreads)
    return make_error("cuda::embed_gather: n=" + std::to_string(a.n) + " (<= 65535 per launch), d=" +
                      std::to_string(a.d) + ", vocab=" + std::to_string(a.vocab) + ", hc=" + std::to_string(a.hc));
  if (!a.table || !a.tokens) return make_error("cuda::embed_gather: table and tokens are required");
  if (a.n == 0) return Status::Ok();
  const int64_t slices = (a.d + kEmbedThreads * 4 - 1) / (kEmbedThreads * 4);  // ~4 values per thread
  embed_gather_kernel<<<dim3(static_cast<unsigned>(slices), static_cast<unsigned>(a.n)), kEmbedThreads, 0, stream>>>(a);
  return launch_status("embed_gather_kernel");
}

Status router_logits(const RouterArgs& a, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_router(a, true));
  if (a.n == 0) return Status::Ok();
  if (a.blas != nullptr && a.n > kRouterBlasMinTokens) {  // prefill: one cuBLASLt GEMM
    DenseGemmArgs g;
    g.type = DenseWeightType::BF16;
    g.w = a.gate;
    g.out = a.n_experts;
    g.in = a.d;
    g.x = a.x;
    g.n = a.n;
    g.y = a.logits;
    g.bf16_output = false;
    const Status s = dense_gemm(*a.blas, g, a.x_bf16, a.x_bf16_elems, stream);
    if (!s.ok()) return s.error().with_context("cuda::router_logits");
    return s;
  }
  RouterLogitsParams p = logits_params(a);
  for (int64_t t0 = 0; t0 < a.n; t0 += kRlPassTokens) {
    const int64_t nt = std::min<int64_t>(kRlPassTokens, a.n - t0);
    RouterLogitsParams q = p;
    q.x = a.x + t0 * a.d;
    q.logits = a.logits + t0 * a.n_experts;
    q.n = static_cast<int>(nt);
    const int64_t tiles = (nt + kRlTile - 1) / kRlTile;
    Status s = tiles <= 1   ? launch_logits<1, false>(q, a, 0, stream)
               : tiles <= 2 ? launch_logits<2, false>(q, a, 0, stream)
               : tiles <= 4 ? launch_logits<4, false>(q, a, 0, stream)
                            : launch_logits<8, false>(q, a, 0, stream);
    CEDAR_RETURN_IF_ERROR(s);
  }
  return Status::Ok();
}

Status router_select(const RouterArgs& a, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_router(a, false));
  if (a.n == 0) return Status::Ok();
  const int64_t row_bytes = 2 * a.n_experts * static_cast<int64_t>(sizeof(float));
  const int wpb = static_cast<int>(std::clamp<int64_t>(kSelectSmemBytes / row_bytes, 1, kSelectMaxWarps));
  const unsigned grid = static_cast<unsigned>((a.n + wpb - 1) / wpb);
  return launch_kernel(router_select_kernel, dim3(grid), dim3(wpb * 32), static_cast<size_t>(wpb * row_bytes), stream,
                       a.programmatic_launch, "router_select_kernel", a, wpb);
}

bool moe_route_fused(const RouterArgs& a) {
  return a.n >= 1 && a.n <= kFuseMaxTokens && a.n * a.n_experts <= kFuseMaxValues && router_workspace_ok(a);
}

Status moe_route(const RouterArgs& a, cudaStream_t stream, const MoeDispatchArgs* dispatch) {
  CEDAR_RETURN_IF_ERROR(check_router(a, true));
  CEDAR_RETURN_IF_ERROR(check_router(a, false));
  if (dispatch) {
    CEDAR_RETURN_IF_ERROR(check_moe_dispatch(*dispatch));
    if (dispatch->experts != a.experts || dispatch->n != a.n || dispatch->topk != a.topk ||
        dispatch->n_experts != a.n_experts)
      return make_error("cuda::moe_route: the dispatch must read the router's experts (same pointer, n, topk, "
                        "n_experts)");
  }
  if (moe_route_fused(a) && (!dispatch || a.n_experts <= 4 * kRlThreads)) {
    RouterLogitsParams p = logits_params(a);
    p.n = static_cast<int>(a.n);
    const int64_t floats = 2 * a.n * a.n_experts;
    const int64_t ints = dispatch ? detail::moe_items_smem_ints(a.n * a.topk, a.n_experts) : 0;
    // <= 40 KB: n·E <= kFuseMaxValues, and the items' 2·n·topk + 3·E ints <= 16 KB (n <= 8, topk <= 64).
    const size_t smem = static_cast<size_t>(std::max(floats, ints)) * 4;
    return launch_logits<1, true>(p, a, smem, stream, dispatch);
  }
  CEDAR_RETURN_IF_ERROR(router_logits(a, stream));
  CEDAR_RETURN_IF_ERROR(router_select(a, stream));
  if (!dispatch) return Status::Ok();
  MoeDispatchArgs d = *dispatch;
  d.programmatic_launch = a.programmatic_launch;
  return moe_build_items(d, stream);
}

const void* embed_gather_kernel_ptr() { return reinterpret_cast<const void*>(&embed_gather_kernel); }
const void* router_logits_kernel_ptr() { return reinterpret_cast<const void*>(&router_logits_kernel<1, true>); }
const void* router_select_kernel_ptr() { return reinterpret_cast<const void*>(&router_select_kernel); }

}  // namespace cedar::cuda
