// The block-scaled FP8 GEMV for 9..64 tokens in one launch: gemv.cu's grid, warps and per-warp K runs (so the same
// bits as its one-launch-per-8-token-tile loop), but each warp loads a run's weight words once, converts each pair
// to f16 once, and feeds every token tile of the launch from them; the next chunk's words load while this one's
// MMAs run. Tiles past the first cost MMAs, scale products and activation loads only (L1 / L2 hits: every block
// reads the same activation rows). s28 (H100, 16384²): 134 / 248 / 479 µs at 16 / 32 / 64 tokens against ~90 for
// one token; decode at batch 32 / 64 31.1 / 50.1 ms against the tile loop's 32.9 / 55.6. Past ~16 tokens the issue
// rate binds: half of each MMA's columns are the other block's zeros (fp8_chunk's layout, kept for its bits).
// K splits are gemv.cu's (the same ranges, the same split-order sums); their workspace holds kGemvTokensPerLaunch
// tokens per split for FP8 (splitk_workspace_size). With them the split shapes (wq_a, the shared expert's w1 / w3)
// read their weights once too: s28 (H100) wq_a at 64 tokens 53.6 -> 33.6 µs, decode at batch 32 / 64 30.09 / 47.71
// -> 28.73 / 45.76 ms.
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/gemv_fp8.cuh"
#include "backend/cuda/launch.h"

namespace cedar::cuda {
namespace {

using namespace gemv_detail;

// One chunk of a warp's K run (kU blocks from kb0, kU / 2 block pairs): this lane's weight words, loaded where
// fp8_chunk loads them (a block past the range redirected to the range's first: finite values whose scale product
// is 0).
struct Fp8ChunkWords {
  uint4 lo[kUnroll<false> / 2], hi[kUnroll<false> / 2];
};

// A block's K range [begin, end) (its split of the K blocks) and the shift from a K block to its weight-scale column.
struct KRange {
  int begin, end, shift;
};

__device__ __forceinline__ bool block_ok(int kb0, int j, int b, int kb_end) { return kb0 + 2 * j + b < kb_end; }

__device__ __forceinline__ Fp8ChunkWords load_chunk(const uint8_t* w_lo, const uint8_t* w_hi, int kb0, KRange kr,
                                                    int t, uint64_t policy) {
  Fp8ChunkWords w;
#pragma unroll
  for (int j = 0; j < kUnroll<false> / 2; ++j) {
    const int off = block_ok(kb0, j, t >> 1, kr.end) ? 32 * kb0 + kFp8PairBytes * j : 32 * kr.begin - 32 * (t >> 1);
    w.lo[j] = detail::ld_weight(reinterpret_cast<const uint4*>(w_lo + off), policy);
    w.hi[j] = detail::ld_weight(reinterpret_cast<const uint4*>(w_hi + off), policy);
  }
  return w;
}

// Thread (g, t)'s token operands at tile 0 and K block 0, as 32-bit element offsets from the launch's (uniform)
// codes and scales, which the host keeps below 2^31 (one 32-bit step per tile; 64-bit pointers stepped per tile
// were rebuilt by the compiler from the token index at every load). A tile is 8 tokens on. Tokens past n are
// not read: their MMA columns get zeros and are never stored.
struct TokenLanes {
  const uint16_t* act;  // op.act
  const float* scales;  // op.act_scales
  int act0;             // B operand: token g/2 of the tile, values 16t.. of a pair (fp8_chunk's pass 0)
  int act1;             // token 4 + g/2 (pass 1)
  int as0;              // activation scales of accumulator token t
  int as1;              // token 4 + t
  int act_tile, scale_tile;
  bool live;            // (g & 1) == (t >> 1): this lane's column takes its own block (else zeros)
};

// One chunk for every token tile: each pair's weights converted to f16 once, then per tile the 8-token MMAs and
// scale products of fp8_chunk<.., kTok8> in its order (pair by pair, even block before odd), so each tile's
// accumulators take the tile loop's bits. The tile loop is outermost so that each tile's operand addresses are one
// pointer step, the pairs' offsets constants. kFull: every block of the chunk inside the range; kScaleStep as in
// fp8_warp_k.
template <bool kFull, bool kScaleStep, int kTiles>
__device__ __forceinline__ void tokens_chunk(const TokenLanes& tl, const Fp8ChunkWords& w, const uint8_t* s_row,
                                             int kb0, KRange kr, int g, int t, int n, float (&acc)[kTiles][4]) {
  constexpr int kPairs = kUnroll<false> / 2;
  bool ok[kPairs][2];
  int ob[kPairs][2];   // the blocks' scale offsets from kb0 (a block past the range: block 0's, a finite scale × sa = 0)
  int act_off[kPairs];  // this lane's values of pair j (its block's half) from kb0, redirected as its weight words are
  float sw[kPairs][2];
  uint32_t a[kPairs][4][4];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      ok[j][b] = kFull || block_ok(kb0, j, b, kr.end);
      ob[j][b] = ok[j][b] ? 2 * j + b : kr.begin - kb0;
      const int kb = kb0 + ob[j][b];
      sw[j][b] = detail::ue8m0_scale(kScaleStep ? __ldg(s_row + kb) : __ldg(s_row + (kb >> kr.shift)));
    }
    act_off[j] = kFull || block_ok(kb0, j, t >> 1, kr.end) ? kFp8PairBytes * j : 32 * (kr.begin - kb0) - 32 * (t >> 1);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const uint32_t lo = word_of(w.lo[j], m), hi = word_of(w.hi[j], m);
      a[j][m][0] = e4m3x2_to_f16x2(lo);
      a[j][m][1] = e4m3x2_to_f16x2(hi);
      a[j][m][2] = e4m3x2_hi_to_f16x2(lo);
      a[j][m][3] = e4m3x2_hi_to_f16x2(hi);
    }
  }
  const int live_lim0 = tl.live ? n - (g >> 1) : 0, live_lim1 = live_lim0 - 4;  // token tok0 + .. < n
  const int scale_lim0 = n - t, scale_lim1 = scale_lim0 - 4;
  int p0 = tl.act0 + 32 * kb0, p1 = tl.act1 + 32 * kb0, q0 = tl.as0 + kb0, q1 = tl.as1 + kb0;
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    const int tok0 = tile * kTokensPerTile;
    if (tok0 >= n) break;
    const bool live0 = tok0 < live_lim0, live1 = tok0 < live_lim1;
    const bool scaled0 = tok0 < scale_lim0, scaled1 = tok0 < scale_lim1;
    float(&c)[4] = acc[tile];
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
      uint4 a0[2], a1[2];
      const uint4* v0 = reinterpret_cast<const uint4*>(tl.act + (p0 + act_off[j]));
      const uint4* v1 = reinterpret_cast<const uint4*>(tl.act + (p1 + act_off[j]));
      a0[0] = live0 ? __ldg(v0) : zero;
      a0[1] = live0 ? __ldg(v0 + 1) : zero;
      a1[0] = live1 ? __ldg(v1) : zero;
      a1[1] = live1 ? __ldg(v1 + 1) : zero;
      float sa0[2], sa1[2];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        sa0[b] = ok[j][b] && scaled0 ? __ldg(tl.scales + (q0 + ob[j][b])) : 0.0f;
        sa1[b] = ok[j][b] && scaled1 ? __ldg(tl.scales + (q1 + ob[j][b])) : 0.0f;
      }
      float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        mma_f16(a[j][m], word_of(a0[m >> 1], 2 * (m & 1)), word_of(a0[m >> 1], 2 * (m & 1) + 1), d0);
        mma_f16(a[j][m], word_of(a1[m >> 1], 2 * (m & 1)), word_of(a1[m >> 1], 2 * (m & 1) + 1), d1);
      }
      const float se = sw[j][0] * sa0[0], so = sw[j][1] * sa0[1], se1 = sw[j][0] * sa1[0], so1 = sw[j][1] * sa1[1];
      c[0] += d0[0] * se;
      c[0] += d0[1] * so;
      c[1] += d0[2] * se;
      c[1] += d0[3] * so;
      c[2] += d1[0] * se1;
      c[2] += d1[1] * so1;
      c[3] += d1[2] * se1;
      c[3] += d1[3] * so1;
    }
    p0 += tl.act_tile;
    p1 += tl.act_tile;
    q0 += tl.scale_tile;
    q1 += tl.scale_tile;
  }
}

// A warp's K run (the tile kernel's schedule: kU blocks from `first`, then every `step`); the next chunk's weight
// words are loaded before this chunk's MMAs, so they stream while the tiles compute.
template <bool kScaleStep, int kTiles>
__device__ __forceinline__ void tokens_warp_k(const TokenLanes& tl, const uint8_t* w_lo, const uint8_t* w_hi,
                                              const uint8_t* s_row, int first, int step, KRange kr, int g, int t,
                                              int n, float (&acc)[kTiles][4]) {
  const uint64_t policy = detail::l2_evict_first_policy();
  if (first >= kr.end) return;
  Fp8ChunkWords cur = load_chunk(w_lo, w_hi, first, kr, t, policy);
  for (int kb0 = first; kb0 < kr.end; kb0 += step) {
    Fp8ChunkWords next = cur;
    if (kb0 + step < kr.end) next = load_chunk(w_lo, w_hi, kb0 + step, kr, t, policy);
    if (kb0 + kUnroll<false> <= kr.end)
      tokens_chunk<true, kScaleStep, kTiles>(tl, cur, s_row, kb0, kr, g, t, n, acc);
    else
      tokens_chunk<false, kScaleStep, kTiles>(tl, cur, s_row, kb0, kr, g, t, n, acc);
    cur = next;
  }
}

// The K-split end of a block: each tile's warp-summed partials (warp order) to p.split_partials, then the row tile's
// last block (atomic ticket) adds the splits in split order for every tile: gemv_block_end's arithmetic per tile,
// with one ticket for all of them. Split partials: [matrix][split][kGemvTokensPerLaunch][p.out].
template <int kTiles>
__device__ __forceinline__ void tokens_split_end(const GemvParams& p, const GemvOperands& op,
                                                 float (&partial)[kGemvWarps][kRowsPerBlock][kTokensPerTile],
                                                 const float (&acc)[kTiles][4], int64_t row0, int64_t out, int warp,
                                                 int g, int t, bool& is_last) {
  const int row = threadIdx.x / kTokensPerTile, tok = threadIdx.x % kTokensPerTile;
  const bool cell = threadIdx.x < kRowsPerBlock * kTokensPerTile && row0 + row < out;
  const int64_t split_floats = static_cast<int64_t>(kGemvTokensPerLaunch) * p.out;
  float* mine = p.split_partials + (static_cast<int64_t>(blockIdx.z) * p.ksplit + blockIdx.y) * split_floats;
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    const int n = min(p.n - tile * kTokensPerTile, kTokensPerTile);
    if (n <= 0) break;
    fp8_store<true>(partial[warp], acc[tile], g, t);
    __syncthreads();
    if (cell && tok < n)
      mine[static_cast<int64_t>(tile * kTokensPerTile + tok) * p.out + row0 + row] =
          sum_partials(partial, p.warps, row, tok, n);
    __syncthreads();  // the partials are read before the next tile's stores
  }
  unsigned* counter = p.split_counters + static_cast<int64_t>(blockIdx.z) * gridDim.x + blockIdx.x;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(counter, 1u) == static_cast<unsigned>(p.ksplit - 1);
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  const float* first = p.split_partials + static_cast<int64_t>(blockIdx.z) * p.ksplit * split_floats;
  for (int tile = 0; tile < kTiles; ++tile) {
    const int n = min(p.n - tile * kTokensPerTile, kTokensPerTile);
    if (n <= 0) break;
    if (!cell || tok >= n) continue;
    const int64_t at = static_cast<int64_t>(tile * kTokensPerTile + tok) * p.out + row0 + row;
    float sum = 0.0f;
    for (int z = 0; z < p.ksplit; ++z) sum += __ldcg(first + z * split_floats + at);
    op.y[static_cast<int64_t>(tile * kTokensPerTile + tok) * op.y_stride + row0 + row] =
        p.bf16_output ? detail::round_bf16(sum) : sum;
  }
  if (threadIdx.x == 0) *counter = 0;  // re-armed for the next launch / graph replay
}

// Block (x, y, z): 16 weight rows × the y-th K range of matrix z (gemv.cu's splits), all p.n (<= 8 · kTiles) tokens.
template <int kTiles>
__global__ void __launch_bounds__(kGemvWarps * 32, kTiles > 4 ? 1 : 2) gemv_fp8_tokens_kernel(GemvParams p) {
  constexpr int kU = kUnroll<false>;
  __shared__ float partial[kGemvWarps][kRowsPerBlock][kTokensPerTile];
  __shared__ bool is_last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const GemvOperands& op = p.ops[blockIdx.z];
  const int64_t out = op.out > 0 ? op.out : p.out;
  if (row0 >= out) return;
  const int64_t r_lo = row0 + g < out ? row0 + g : 0;
  const int64_t r_hi = row0 + g + 8 < out ? row0 + g + 8 : 0;
  const int n_kb = static_cast<int>(p.in / 32);
  const int kb_begin = static_cast<int>(blockIdx.y) * p.kb_per_split;
  const KRange kr{kb_begin, min(n_kb, kb_begin + p.kb_per_split), p.kb_shift};
  const uint8_t* w_lo = op.w + r_lo * p.in + t * 16;
  const uint8_t* w_hi = op.w + r_hi * p.in + t * 16;
  const uint8_t* s_row = op.w_scales + (r_lo / p.block_out) * p.scale_cols;  // 16 rows share it
  const TokenLanes tl{op.act,
                      op.act_scales,
                      (g >> 1) * op.act_stride + t * 16,
                      (4 + (g >> 1)) * op.act_stride + t * 16,
                      t * op.scale_stride,
                      (4 + t) * op.scale_stride,
                      kTokensPerTile * op.act_stride,
                      kTokensPerTile * op.scale_stride,
                      (g & 1) == (t >> 1)};
  detail::pdl_launch_dependents();
  detail::pdl_wait();
  float acc[kTiles][4];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  const int first = kb_begin + warp * kU, step = p.warps * kU;
  if (p.kb_shift == 0)
    tokens_warp_k<true, kTiles>(tl, w_lo, w_hi, s_row, first, step, kr, g, t, p.n, acc);
  else
    tokens_warp_k<false, kTiles>(tl, w_lo, w_hi, s_row, first, step, kr, g, t, p.n, acc);
  if (p.ksplit > 1) {
    tokens_split_end<kTiles>(p, op, partial, acc, row0, out, warp, g, t, is_last);
    return;
  }
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    const int n = min(p.n - tile * kTokensPerTile, kTokensPerTile);
    if (n <= 0) break;
    fp8_store<true>(partial[warp], acc[tile], g, t);
    GemvOperands o = op;
    o.y += static_cast<int64_t>(tile) * kTokensPerTile * op.y_stride;
    gemv_block_end(p, o, partial, row0, out, n, is_last);  // ksplit 1 here: every block writes its rows
    __syncthreads();  // the partials are read before the next tile's stores
  }
}

}  // namespace

namespace gemv_detail {
Status launch_gemv_fp8_tokens(const GemvParams& p, dim3 grid, cudaStream_t stream, bool programmatic_launch) {
  if (p.ksplit < 1 || grid.y != static_cast<unsigned>(p.ksplit) ||
      (p.ksplit > 1 && (p.split_partials == nullptr || p.split_counters == nullptr)))
    return make_error("cuda::gemv_fp8_tokens: ksplit " + std::to_string(p.ksplit) + " needs grid.y = ksplit and, above 1, "
                      "the split workspace");
  if (p.n < 1 || p.n > kGemvTokensPerLaunch)
    return make_error("cuda::gemv_fp8_tokens: n=" + std::to_string(p.n) + " (1.." +
                      std::to_string(kGemvTokensPerLaunch) + ")");
  if (p.n <= 2 * kTokensPerTile)
    return launch_kernel(gemv_fp8_tokens_kernel<2>, grid, dim3(p.warps * 32), 0, stream, programmatic_launch,
                         "gemv_fp8_tokens_kernel<16>", p);
  if (p.n <= 4 * kTokensPerTile)
    return launch_kernel(gemv_fp8_tokens_kernel<4>, grid, dim3(p.warps * 32), 0, stream, programmatic_launch,
                         "gemv_fp8_tokens_kernel<32>", p);
  return launch_kernel(gemv_fp8_tokens_kernel<8>, grid, dim3(p.warps * 32), 0, stream, programmatic_launch,
                       "gemv_fp8_tokens_kernel<64>", p);
}
}  // namespace gemv_detail

}  // namespace cedar::cuda
