// The block-scaled FP8 GEMV for 9..64 tokens in one launch: gemv.cu's grid, warps, per-warp K runs and K splits, but
// each warp loads a run's weight words once, converts each pair to f16 once, and feeds every 8-token tile of the
// launch from them; the next chunk's words load while this one's MMAs run. Its MMAs take one K block each (lanes
// trade half their words, tokens_chunk), so they are half of fp8_chunk's, whose columns carry the other block's
// zeros, and its sums round at other points than the 8-token tile kernel's: a token's bits do not depend on the
// launch's other tokens, but calls of up to 8 tokens are not them (the CPU oracle's bounds apply).
// s29 (H100, one call, twice each): decode at batch 16 / 32 / 64 18.25 / 26.85 / 45.31 ms with fp8_chunk's layout,
// 17.47 / 25.65 / 44.29 with this one; at batch 32 the kernel's mean in the model went 51.5 -> 45.5 µs. Alone
// (cuda_kernels_bench, 16384² at 16 / 32 / 64 tokens: 120 / 195 / 426 µs) the two layouts are level, so something
// both share binds there (not profiled; the activation loads, the same in both, are the likely one), and the
// instructions saved pay where other kernels share the SMs.
// K splits are gemv.cu's (the same ranges, split-order sums); their workspace holds kGemvTokensPerLaunch tokens per
// split for FP8 (splitk_workspace_size).
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

// Thread (g, t)'s token operands, as 32-bit element offsets from the launch's (uniform) codes and scales, which the
// host keeps below 2^31. In this kernel's MMAs column n is token n of the tile (B from lane g: token g) and D's
// columns 2t, 2t + 1 are tokens 2t, 2t + 1. Tokens past n read token n - 1 (valid memory; never stored).
struct TokenLanes {
  const uint16_t* act;  // op.act
  const float* scales;  // op.act_scales
  int act_stride, scale_stride;
  int pos[2];           // this lane's 8 values of block b of a pair (see tokens_chunk), from the pair's start
};

// One chunk for every token tile, one K block per MMA. Lane (g, t) loaded 16 bytes of block t >> 1 (values 16 (t & 1)
// .. + 15); it keeps words 0, 1 and trades words 2, 3 with lane t ^ 2 (the other block, the same half). Then for
// block b and part p every lane holds one word of block b: its own word p (b == t >> 1) or the traded word 2 + p,
// so MMA (b, p) sums 16 products of block b for 8 tokens, and parts 0, 1 chain to the block's 32. Half the MMAs of
// fp8_chunk's layout (whose columns carry the other block's zeros), and no zeroed operands; other fp32 rounding
// points, so these sums are not the 8-token tile kernel's bits (the CPU oracle's bounds apply). kFull: every block
// of the chunk inside the range; kScaleStep as in fp8_warp_k.
template <bool kFull, bool kScaleStep, int kTiles>
__device__ __forceinline__ void tokens_chunk(const TokenLanes& tl, const Fp8ChunkWords& w, const uint8_t* s_row,
                                             int kb0, KRange kr, int g, int t, int n, float (&acc)[kTiles][4]) {
  constexpr int kPairs = kUnroll<false> / 2;
  const int own = t >> 1;
  bool ok[kPairs][2];
  int ob[kPairs][2];       // the blocks' offsets from kb0 (past the range: the range's first, a finite scale × sa = 0)
  int act_off[kPairs][2];  // this lane's 8 values of block b from the codes' row start (redirected likewise)
  float sw[kPairs][2];
  uint32_t a[kPairs][2][2][4];  // [pair][block][part]: rows g, g + 8 at k slots 2t, 2t+1 and 2t+8, 2t+9
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      ok[j][b] = kFull || block_ok(kb0, j, b, kr.end);
      ob[j][b] = ok[j][b] ? 2 * j + b : kr.begin - kb0;
      const int kb = kb0 + ob[j][b];
      sw[j][b] = detail::ue8m0_scale(kScaleStep ? __ldg(s_row + kb) : __ldg(s_row + (kb >> kr.shift)));
      act_off[j][b] = ok[j][b] ? 32 * kb0 + kFp8PairBytes * j + tl.pos[b] : 32 * kr.begin + (tl.pos[b] & 31);
    }
    // Words 2, 3 of both rows from lane t ^ 2; then each (block, part)'s word, converted once for every tile.
    const uint32_t lo2 = __shfl_xor_sync(detail::kFullMask, w.lo[j].z, 2);
    const uint32_t lo3 = __shfl_xor_sync(detail::kFullMask, w.lo[j].w, 2);
    const uint32_t hi2 = __shfl_xor_sync(detail::kFullMask, w.hi[j].z, 2);
    const uint32_t hi3 = __shfl_xor_sync(detail::kFullMask, w.hi[j].w, 2);
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const uint32_t x = b == own ? (q ? w.lo[j].y : w.lo[j].x) : (q ? lo3 : lo2);
        const uint32_t y = b == own ? (q ? w.hi[j].y : w.hi[j].x) : (q ? hi3 : hi2);
        a[j][b][q][0] = e4m3x2_to_f16x2(x);
        a[j][b][q][1] = e4m3x2_to_f16x2(y);
        a[j][b][q][2] = e4m3x2_hi_to_f16x2(x);
        a[j][b][q][3] = e4m3x2_hi_to_f16x2(y);
      }
  }
  // Tiles outermost: a tile's rows are one offset each (B: token g; D: tokens 2t, 2t + 1), the pairs' constants.
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    const int tok0 = tile * kTokensPerTile;
    if (tok0 >= n) break;
    const uint16_t* codes = tl.act + min(tok0 + g, n - 1) * tl.act_stride;
    const float* sa_rows[2] = {tl.scales + min(tok0 + 2 * t, n - 1) * tl.scale_stride + kb0,
                               tl.scales + min(tok0 + 2 * t + 1, n - 1) * tl.scale_stride + kb0};
    float(&c)[4] = acc[tile];
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      float d[2][4];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(codes + act_off[j][b]));  // parts 0, 1: 4 values each
        d[b][0] = d[b][1] = d[b][2] = d[b][3] = 0.0f;
        mma_f16(a[j][b][0], v.x, v.y, d[b]);
        mma_f16(a[j][b][1], v.z, v.w, d[b]);
      }
      float se[2], so[2];  // s_w · s_a of the even / odd block for tokens 2t, 2t + 1
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        se[k] = ok[j][0] ? sw[j][0] * __ldg(sa_rows[k] + ob[j][0]) : 0.0f;
        so[k] = ok[j][1] ? sw[j][1] * __ldg(sa_rows[k] + ob[j][1]) : 0.0f;
      }
      // D (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1): the even block's sum, then the odd block's.
      c[0] += d[0][0] * se[0];
      c[0] += d[1][0] * so[0];
      c[1] += d[0][1] * se[1];
      c[1] += d[1][1] * so[1];
      c[2] += d[0][2] * se[0];
      c[2] += d[1][2] * so[0];
      c[3] += d[0][3] * se[1];
      c[3] += d[1][3] * so[1];
    }
  }
}

// Thread (g, t)'s accumulators (rows g, g + 8 × tokens 2t, 2t + 1, tokens_chunk's D layout) into its warp's tile.
__device__ __forceinline__ void tokens_store(float (&part)[kRowsPerBlock][kTokensPerTile], const float (&acc)[4],
                                             int g, int t) {
  part[g][2 * t] = acc[0];
  part[g][2 * t + 1] = acc[1];
  part[g + 8][2 * t] = acc[2];
  part[g + 8][2 * t + 1] = acc[3];
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
    tokens_store(partial[warp], acc[tile], g, t);
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
  const int half = 16 * (t & 1), own = t >> 1;
  const TokenLanes tl{op.act, op.act_scales, op.act_stride, op.scale_stride,
                      {half + (own == 0 ? 0 : 8), 32 + half + (own == 1 ? 0 : 8)}};
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
    tokens_store(partial[warp], acc[tile], g, t);
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
