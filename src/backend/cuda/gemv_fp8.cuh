// The block-scaled FP8 GEMV's launch parameters, pair layout, per-warp K loop (fp8_chunk over a weight source) and
// block end. gemv.cu's kernel (one 8-token tile per launch) runs fp8_chunk; gemv_fp8_tokens.cu's (up to 8 tiles per
// launch over the same weight words) shares the parameters, the pair loads and the block end, with its own MMA
// layout (one K block per MMA).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/mma_bf16.cuh"
#include "core/status.h"

namespace cedar::cuda::gemv_detail {

struct GemvParams {
  GemvOperands ops[kMaxGroup];
  int64_t out, in;
  int64_t block_out, scale_cols;  // FP8Block scale grid
  int kb_shift;                   // FP8Block: log2(block_in / 32)
  int n;                          // tokens of the launch: 1..8 (gemv.cu), up to kGemvTokensPerLaunch (gemv_fp8_tokens.cu)
  bool bf16_output;
  int ksplit;                     // blocks along K (gridDim.y); > 1 needs the two buffers below
  int kb_per_split;
  float* split_partials;          // [group][ksplit][8][out] (gemv.cu), [..][kGemvTokensPerLaunch][out] (tokens)
  unsigned* split_counters;       // [group][row tiles], zero between launches
  int warps;                      // = blockDim.x / 32 (gemv_warps)
};

// ---- FP8: K blocks in pairs, 16-byte weight loads ------------------------------------------------
// A K-block pair is 64 bytes of a row; thread (g, t) loads bytes 16t..16t+15 of it — half (t & 1) of
// block (t >> 1) — so one warp load covers 64 contiguous bytes of 8 rows: half the load instructions,
// L1 wavefronts and L2 requests per weight byte of one 8-byte piece per lane (s16 ncu: the 8-byte form
// kept L1's data pipe 75 % and L2's tags 61 % busy at 64 % of DRAM bandwidth). Each thread's 16 values
// then belong to one block of the pair, and a block's scales must multiply its sum alone, so the MMA's
// columns separate the blocks: column 2c + b holds token c's activations of block b in the k slots of
// the lanes holding block b and zeros in the others, so D[row][2c + b] is Σ over block b exactly as a
// block's own MMA would form it, and 4 chained MMAs (4 values per lane each) finish both blocks' sums.
// Four tokens per pass: as many MMAs per weight byte as the one-block form for n <= 4 (every decode
// GEMV at batch 1..4); a second pass over the same converted weights for tokens 4..7. Every (token,
// block) sum is formed the same way in either pass, so a token's result does not depend on n.
constexpr int kFp8PairBytes = 64;

struct Fp8Lane {  // this thread's operands at K block 0
  const uint8_t* w_lo;    // row g, bytes 16t.. of the pair
  const uint8_t* w_hi;    // row g + 8
  const uint8_t* s_row;   // the tile's weight-scale row (16 rows share it)
  const uint16_t* act0;   // B operand: token g/2, values 16t.. of the pair (pass 0)
  const uint16_t* act1;   // token 4 + g/2 (pass 1)
  const float* as0;       // activation scales of accumulator token t (pass 0)
  const float* as1;       // token 4 + t (pass 1)
  bool live;              // (g & 1) == (t >> 1): this lane's column takes its own block (else zeros)

  // Every operand `blocks` K blocks on (the scale row too where it has one scale per block).
  template <bool kScaleStep>
  __device__ __forceinline__ void advance(int blocks) {
    w_lo += 32 * blocks;
    w_hi += 32 * blocks;
    if (kScaleStep) s_row += blocks;
    act0 += 32 * blocks;
    act1 += 32 * blocks;
    as0 += blocks;
    as1 += blocks;
  }
};

// Thread (g, t)'s operands at K block 0 of a launch's matrix `op`, for weight rows r_lo (= g's) and the one 8 below
// (w_lo / w_hi: their bytes 16t..), over op's first n tokens. Tokens past n read token 0 (valid memory; those
// columns are never written).
// The tile's 16 rows share one scale row (block_out % 16 == 0, checked on the host).
__device__ __forceinline__ Fp8Lane fp8_lane(const GemvParams& p, const GemvOperands& op, const uint8_t* w_lo,
                                            const uint8_t* w_hi, int64_t r_lo, int g, int t, int n) {
  auto token = [&](int j) { return static_cast<int64_t>(j < n ? j : 0); };
  return Fp8Lane{w_lo,
                 w_hi,
                 op.w_scales + (r_lo / p.block_out) * p.scale_cols,
                 op.act + token(g >> 1) * op.act_stride + t * 16,
                 op.act + token(4 + (g >> 1)) * op.act_stride + t * 16,
                 op.act_scales + token(t) * op.scale_stride,
                 op.act_scales + token(4 + t) * op.scale_stride,
                 (g & 1) == (t >> 1)};
}

// Where fp8_chunk takes pair j's weight words (rows g and g + 8, this lane's 16 bytes). `off` is the pair's
// offset in the lane's rows, redirected by fp8_chunk to block kb_begin for a block past the range (`ok` false),
// which only needs finite values: its scale product is 0.
struct Fp8GlobalWeights {  // the row-major [out, in] bytes (Fp8Lane's row pointers), evict-first in L2
  uint64_t policy;
  __device__ __forceinline__ void load(const Fp8Lane& c, int, int off, bool, uint4& lo, uint4& hi) const {
    lo = detail::ld_weight(reinterpret_cast<const uint4*>(c.w_lo + off), policy);
    hi = detail::ld_weight(reinterpret_cast<const uint4*>(c.w_hi + off), policy);
  }
};

// kU consecutive K blocks from kb0 (kU / 2 pairs); `c` points at kb0. kFull: all inside the range
// (constant offsets). kScaleStep: one weight scale per K block; else block kb's is s_row[kb >> kb_shift].
template <bool kFull, bool kScaleStep, bool kTok8, class Weights>
__device__ __forceinline__ void fp8_chunk(const Fp8Lane& c, const Weights& weights, int kb0, int kb_begin, int kb_end,
                                          int kb_shift, int t, float (&acc)[4]) {
  constexpr int kPairs = kUnroll<false> / 2;
  uint4 wl[kPairs], wh[kPairs], a0[kPairs][2], a1[kPairs][2];
  float sw[kPairs][2], sa0[kPairs][2], sa1[kPairs][2];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const bool ok_e = kFull || kb0 + 2 * j < kb_end, ok_o = kFull || kb0 + 2 * j + 1 < kb_end;
    // A block past the range reads block kb_begin (valid memory) and gets sa = 0 below.
    const bool ok_pair = (t >> 1) ? ok_o : ok_e;
    const int off = ok_pair ? kFp8PairBytes * j : 32 * (kb_begin - kb0) - 32 * (t >> 1);
    weights.load(c, j, off, ok_pair, wl[j], wh[j]);
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    a0[j][0] = c.live ? __ldg(reinterpret_cast<const uint4*>(c.act0 + off)) : zero;
    a0[j][1] = c.live ? __ldg(reinterpret_cast<const uint4*>(c.act0 + off + 8)) : zero;
    if constexpr (kTok8) {
      a1[j][0] = c.live ? __ldg(reinterpret_cast<const uint4*>(c.act1 + off)) : zero;
      a1[j][1] = c.live ? __ldg(reinterpret_cast<const uint4*>(c.act1 + off + 8)) : zero;
    }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const bool ok = b ? ok_o : ok_e;
      const int ob = ok ? 2 * j + b : kb_begin - kb0;
      sw[j][b] = detail::ue8m0_scale(kScaleStep ? __ldg(c.s_row + ob) : __ldg(c.s_row + ((kb0 + ob) >> kb_shift)));
      sa0[j][b] = ok ? __ldg(c.as0 + ob) : 0.0f;
      sa1[j][b] = kTok8 && ok ? __ldg(c.as1 + ob) : 0.0f;
    }
  }
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < 4; ++m) {  // values 4m..4m+3 of the lane's 16: k slots 2t, 2t+1, 2t+8, 2t+9
      const uint32_t lo = word_of(wl[j], m), hi = word_of(wh[j], m);
      const uint32_t a[4] = {e4m3x2_to_f16x2(lo), e4m3x2_to_f16x2(hi), e4m3x2_hi_to_f16x2(lo), e4m3x2_hi_to_f16x2(hi)};
      mma_f16(a, word_of(a0[j][m >> 1], 2 * (m & 1)), word_of(a0[j][m >> 1], 2 * (m & 1) + 1), d0);
      if constexpr (kTok8)
        mma_f16(a, word_of(a1[j][m >> 1], 2 * (m & 1)), word_of(a1[j][m >> 1], 2 * (m & 1) + 1), d1);
    }
    // D columns 2t, 2t+1: token t's sums of the even and odd block, added in block order. Scales are
    // powers of two: (Σ q_a q_w)·(s_w·s_a) rounds like the reference's (Σ)·s_a·s_w; a block past the K
    // range has sa = 0 (its finite sum vanishes).
    const float se = sw[j][0] * sa0[j][0], so = sw[j][1] * sa0[j][1];
    acc[0] += d0[0] * se;
    acc[0] += d0[1] * so;
    acc[1] += d0[2] * se;
    acc[1] += d0[3] * so;
    if constexpr (kTok8) {
      const float se1 = sw[j][0] * sa1[j][0], so1 = sw[j][1] * sa1[j][1];
      acc[2] += d1[0] * se1;
      acc[2] += d1[1] * so1;
      acc[3] += d1[2] * se1;
      acc[3] += d1[3] * so1;
    }
  }
}

// One warp's chunks (the MXFP4 schedule: kU blocks from `first`, then every `step`), pointers loop-carried.
template <bool kScaleStep, bool kTok8>
__device__ __forceinline__ void fp8_warp_k(const Fp8Lane& at0, int first, int step, int kb_begin, int kb_end,
                                           int kb_shift, int t, float (&acc)[4]) {
  constexpr int kU = kUnroll<false>;
  Fp8Lane c = at0;
  c.advance<kScaleStep>(first);
  const Fp8GlobalWeights weights{detail::l2_evict_first_policy()};
  int kb0 = first;
  for (; kb0 + kU <= kb_end; kb0 += step) {
    fp8_chunk<true, kScaleStep, kTok8>(c, weights, kb0, kb_begin, kb_end, kb_shift, t, acc);
    c.advance<kScaleStep>(step);
  }
  if (kb0 < kb_end) fp8_chunk<false, kScaleStep, kTok8>(c, weights, kb0, kb_begin, kb_end, kb_shift, t, acc);
}

// FP8 with one scale per K block (block_in 32, V4.1) walks its scales like the other operands; wider
// blocks (V4: 128) index them by kb >> kb_shift from the row's start.
template <bool kTok8>
__device__ __forceinline__ void fp8_tile(const Fp8Lane& at0, int first, int step, int kb_begin, int kb_end,
                                         int kb_shift, int t, float (&acc)[4]) {
  if (kb_shift == 0) fp8_warp_k<true, kTok8>(at0, first, step, kb_begin, kb_end, kb_shift, t, acc);
  else fp8_warp_k<false, kTok8>(at0, first, step, kb_begin, kb_end, kb_shift, t, acc);
}

// Thread (g, t)'s accumulators (rows g, g+8 × tokens t and, with kTok8, t + 4) into its warp's tile.
template <bool kTok8>
__device__ __forceinline__ void fp8_store(float (&part)[kRowsPerBlock][kTokensPerTile], const float (&acc)[4], int g,
                                          int t) {
  part[g][t] = acc[0];
  part[g + 8][t] = acc[1];
  if (kTok8) {
    part[g][t + 4] = acc[2];
    part[g + 8][t + 4] = acc[3];
  }
}

// Adds the warps' tiles (warp order) for thread e's (row, token) of the block; tokens past n: 0.
__device__ __forceinline__ float sum_partials(const float (&partial)[kGemvWarps][kRowsPerBlock][kTokensPerTile],
                                              int warps, int row, int tok, int n) {
  float sum = 0.0f;
  if (tok < n)
    for (int w = 0; w < warps; ++w) sum += partial[w][row][tok];
  return sum;
}

// A block's end: the warps' partial tiles summed (warp order) into its 16 rows × n tokens of op.y; with a K split, the
// splits' sums meet in p.split_partials and the row tile's last block (atomic ticket) adds them in split order,
// so the result does not depend on scheduling. `is_last` is a __shared__ flag of the block.
__device__ __forceinline__ void gemv_block_end(const GemvParams& p, const GemvOperands& op,
                                               const float (&partial)[kGemvWarps][kRowsPerBlock][kTokensPerTile],
                                               int64_t row0, int64_t out, int n, bool& is_last) {
  __syncthreads();
  const int row = threadIdx.x / kTokensPerTile, tok = threadIdx.x % kTokensPerTile;
  const bool writer = threadIdx.x < kRowsPerBlock * kTokensPerTile && tok < n && row0 + row < out;
  float sum = threadIdx.x < kRowsPerBlock * kTokensPerTile ? sum_partials(partial, p.warps, row, tok, n) : 0.0f;
  if (p.ksplit > 1) {
    float* split_partials = p.split_partials + static_cast<int64_t>(blockIdx.z) * p.ksplit * kTokensPerTile * p.out;
    unsigned* split_counters = p.split_counters + static_cast<int64_t>(blockIdx.z) * gridDim.x;
    if (writer) split_partials[(static_cast<int64_t>(blockIdx.y) * kTokensPerTile + tok) * p.out + row0 + row] = sum;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(split_counters + blockIdx.x, 1u) == static_cast<unsigned>(p.ksplit - 1);
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    sum = 0.0f;
    if (writer)
      for (int z = 0; z < p.ksplit; ++z) sum += __ldcg(split_partials + (static_cast<int64_t>(z) * kTokensPerTile + tok) * p.out + row0 + row);
    if (threadIdx.x == 0) split_counters[blockIdx.x] = 0;  // re-armed for the next launch / graph replay
  }
  if (writer)
    op.y[static_cast<int64_t>(tok) * op.y_stride + row0 + row] = p.bf16_output ? detail::round_bf16(sum) : sum;
}

// gemv_fp8_tokens.cu: FP8, no K split, up to this many tokens in one launch (gemv.cu's bits per 8-token tile).
constexpr int kGemvTokensPerLaunch = 64;
Status launch_gemv_fp8_tokens(const GemvParams& p, dim3 grid, cudaStream_t stream, bool programmatic_launch);

}  // namespace cedar::cuda::gemv_detail
