// FP8 activation quantization and the block-scaled FP8 / MXFP4 GEMV (skinny GEMM, ≤ 8 tokens per tile).
//
// Both weight formats run on the tensor cores through mma.sync m16n8k16 f16 × f16 → f32: the e4m3
// weight (and the e2m1 weight, via e4m3) is converted in registers to f16 and the activations arrive as
// the f16 values of their e4m3 codes — all exact, and every product is exact — so the MMAs form each
// 32-wide scale block's Σ q_a·q_w for 16 weight rows (MXFP4: two per block × 8 tokens; FP8: four per
// block pair × 4 tokens, below), and the UE8M0 scales are applied per block in fp32, as the reference
// does. (mma.sync m16n8k32 e4m3 exists, but on sm_90 ptxas lowers it to the same conversions and HMMAs
// plus extra adds: FP8 is native only in wgmma on Hopper.)
//
// MXFP4 path — Hopper has no FP4 MMA (e2m1 MMA is sm_100+), so the weight is dequantized in
// registers, first to e4m3, which is exact: every e2m1 value is an e4m3 value. With the 3 magnitude bits
// `eem` moved to e4m3 bits 2..4 (`((c & 7) << 2) | ((c & 8) << 4)`, 2 logic ops per 4 values on the
// packed word), the e4m3 value is e2m1 · 2^-6 for normals and subnormals alike, and the 2^6 is folded
// into the block scale. This keeps the weight read at 0.53 bytes/parameter (the roofline of a
// memory-bound GEMV) and adds ~2 logic ops per 4 values to the FP8 path; the alternatives
// (dequant to bf16 and a bf16 MMA: 2× the conversion work and bf16 activations that lose the FP8
// quantization the reference applies; or a CUDA-core FMA loop: compute-bound at ~1/3 of HBM speed)
// are slower and no more exact. The even/odd nibble split is undone with two byte permutes.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/f16_stage.h"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_fp8.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda {
namespace {

using namespace gemv_detail;

constexpr int kQuantThreads = 256;
// One warp per 32-value block: warp max of |x|, UE8M0 scale, e4m3 codes (cvt.rn.satfinite), stored
// as their exact f16 values (the GEMV's MMA operand) — act_quant.cuh, which the producers that write
// the codes of their own output share.
__global__ void __launch_bounds__(kQuantThreads) quantize_act_fp8_kernel(const float* x, int64_t n_blocks,
                                                                         uint16_t* codes, float* scales) {
  detail::pdl_launch_dependents();
  detail::pdl_wait();
  const int64_t blk = (static_cast<int64_t>(blockIdx.x) * kQuantThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (blk >= n_blocks) return;  // whole warps exit together
  detail::quantize_act_warp(x[blk * 32 + lane], codes + blk * 32, scales + blk, lane);
}

// The same recipe with 4 consecutive values per thread (one float4): a 32-block is an aligned group
// of 8 lanes (max by 3 shuffles), grid-stride with 16-byte loads and 8-byte code stores — prefill
// sizes are bandwidth-bound (the one-value-per-lane kernel above reaches ~1/3 of it: 707 µs for
// 32k × 5120 on the H200). Bit-identical results.
__global__ void __launch_bounds__(kQuantThreads) quantize_act_fp8_x4_kernel(const float* x, int64_t quads,
                                                                            uint16_t* codes, float* scales) {
  detail::pdl_launch_dependents();
  detail::pdl_wait();
  for (int64_t q0 = static_cast<int64_t>(blockIdx.x) * kQuantThreads; q0 < quads;
       q0 += static_cast<int64_t>(gridDim.x) * kQuantThreads) {
    const int64_t q = q0 + threadIdx.x;
    const bool live = q < quads;  // quads % 8 == 0: an 8-lane group is live or not as a whole
    const float4 v = live ? __ldg(reinterpret_cast<const float4*>(x) + q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    m = fmaxf(m, __shfl_xor_sync(detail::kFullMask, m, 1));
    m = fmaxf(m, __shfl_xor_sync(detail::kFullMask, m, 2));
    m = fmaxf(m, __shfl_xor_sync(detail::kFullMask, m, 4));
    const float s = detail::act_block_scale(m);
    const float vs[4] = {v.x, v.y, v.z, v.w};
    uint32_t c[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] = detail::act_code_f16(vs[i], s);
    if (live) {
      reinterpret_cast<uint2*>(codes)[q] = make_uint2(c[0] | (c[1] << 16), c[2] | (c[3] << 16));
      if ((threadIdx.x & 7) == 0) scales[q >> 3] = s;
    }
  }
}

// stage_act_f16 (kernels.h, f16_stage.h): one warp per 32-value block, as quantize_act_fp8_kernel.
__global__ void __launch_bounds__(kQuantThreads) stage_act_f16_kernel(const float* x, int64_t n_blocks,
                                                                      uint16_t* codes, float* scales) {
  detail::pdl_launch_dependents();
  detail::pdl_wait();
  const int64_t blk = (static_cast<int64_t>(blockIdx.x) * kQuantThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (blk >= n_blocks) return;  // whole warps exit together
  const float v = detail::round_bf16(x[blk * 32 + lane]);  // gemv_bf16's operand (pack_bf16x2: RNE)
  const float a = fabsf(v);
  const float amax = detail::warp_max(isfinite(a) ? a : 0.0f);  // the finite values' amax
  const int j = f16_stage_exponent(__float_as_uint(amax));
  codes[blk * 32 + lane] = detail::f16_stage_code_of(v, j);
  if (lane == 0) scales[blk] = detail::f16_stage_scale_of(j);
}

// ---- MXFP4 (plain layout): thread (g = lane/4, t = lane%4) holds values 8t..8t+7 of each K block ----

struct ChunkPointers {  // this thread's operands at K block 0
  const uint8_t* w_lo;   // row g, this thread's bytes of K block 0
  const uint8_t* w_hi;   // row g + 8
  const uint8_t* s_lo;   // weight scale row of row g
  const uint8_t* s_hi;
  const uint16_t* act;   // token g, this thread's values of K block 0
  const float* as0;      // activation scales of tokens 2t, 2t+1
  const float* as1;
};

// kU consecutive K blocks from kb0 into acc (the MMA accumulator layout); `c` points at kb0. kFull: all
// inside the range, so every operand sits at a constant offset (immediate in the loads).
template <bool kFull>
__device__ __forceinline__ void mxfp4_chunk(const ChunkPointers& c, int kb0, int kb_begin, int kb_end,
                                            float (&acc)[4]) {
  constexpr int kU = kUnroll<true>;
  // Per K block, thread t holds values 8t..8t+7 of rows g, g+8 (w01: values 0..3, w23: 4..7, e4m3 bytes)
  // and of token g (act: 8 f16). Two m16n8k16 MMAs: the first takes values 8t+{0,1} in k slots
  // 2t, 2t+1 and 8t+{2,3} in 2t+8, 2t+9; the second values 8t+{4..7} alike.
  uint32_t w_lo[kU][2], w_hi[kU][2];
  uint4 act[kU];
  float sw_lo[kU], sw_hi[kU], sa0[kU], sa1[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const bool k_ok = kFull || kb0 + u < kb_end;
    const int off = k_ok ? u : kb_begin - kb0;  // past the range: a valid block, zeroed by sa = 0 below
    act[u] = __ldg(reinterpret_cast<const uint4*>(c.act + off * 32));
    // 16 bytes per row-block: one 32-bit word of 8 nibbles per thread, to e4m3 in value order. Plain
    // loads: with ld_weight's L2 hint these 4-byte loads ran 4-6 % slower alone (s14 kernel rows), and
    // decode reads the experts through the packed GEMV (gemv_packed.cu), which has the hint.
    const uint32_t lo = __ldg(reinterpret_cast<const uint32_t*>(c.w_lo + off * 16));
    const uint32_t hi = __ldg(reinterpret_cast<const uint32_t*>(c.w_hi + off * 16));
    e2m1x8_to_e4m3(lo, w_lo[u][0], w_lo[u][1]);  // values 0..3, 4..7
    e2m1x8_to_e4m3(hi, w_hi[u][0], w_hi[u][1]);
    // 2^6 undoes the e2m1 → e4m3 exponent shift.
    sw_lo[u] = 64.0f * detail::ue8m0_scale(__ldg(c.s_lo + off));
    sw_hi[u] = 64.0f * detail::ue8m0_scale(__ldg(c.s_hi + off));
    sa0[u] = k_ok ? __ldg(c.as0 + off) : 0.0f;
    sa1[u] = k_ok ? __ldg(c.as1 + off) : 0.0f;
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint32_t a1[4] = {e4m3x2_to_f16x2(w_lo[u][0]), e4m3x2_to_f16x2(w_hi[u][0]),
                            e4m3x2_hi_to_f16x2(w_lo[u][0]), e4m3x2_hi_to_f16x2(w_hi[u][0])};
    mma_f16(a1, act[u].x, act[u].y, d);
    const uint32_t a2[4] = {e4m3x2_to_f16x2(w_lo[u][1]), e4m3x2_to_f16x2(w_hi[u][1]),
                            e4m3x2_hi_to_f16x2(w_lo[u][1]), e4m3x2_hi_to_f16x2(w_hi[u][1])};
    mma_f16(a2, act[u].z, act[u].w, d);
    // Scales are powers of two: (Σ q_a q_w)·(s_w·s_a) rounds like the reference's (Σ)·s_a·s_w.
    // A block past the K range has sa = 0 (its finite MMA result vanishes).
    acc[0] += d[0] * (sw_lo[u] * sa0[u]);
    acc[1] += d[1] * (sw_lo[u] * sa1[u]);
    acc[2] += d[2] * (sw_hi[u] * sa0[u]);
    acc[3] += d[3] * (sw_hi[u] * sa1[u]);
  }
}

// One warp's chunks of the K range [kb_begin, kb_end): kU blocks from `first`, then every `step` blocks,
// summed in that order. The operand pointers are loop-carried and advance by constant strides, so each
// chunk costs a few adds; computed from the chunk's index instead, the compiler re-derived every row's
// address (its clamp, 64-bit multiply and adds) per chunk (SASS, s15). Only the last chunk can reach
// past kb_end.
__device__ __forceinline__ void mxfp4_warp_k(const ChunkPointers& at0, int first, int step, int kb_begin, int kb_end,
                                             float (&acc)[4]) {
  constexpr int kU = kUnroll<true>;
  ChunkPointers c{at0.w_lo + first * 16, at0.w_hi + first * 16, at0.s_lo + first, at0.s_hi + first,
                  at0.act + first * 32,  at0.as0 + first,       at0.as1 + first};
  int kb0 = first;
  for (; kb0 + kU <= kb_end; kb0 += step) {
    mxfp4_chunk<true>(c, kb0, kb_begin, kb_end, acc);
    c.w_lo += step * 16;
    c.w_hi += step * 16;
    c.s_lo += step;
    c.s_hi += step;
    c.act += step * 32;
    c.as0 += step;
    c.as1 += step;
  }
  if (kb0 < kb_end) mxfp4_chunk<false>(c, kb0, kb_begin, kb_end, acc);
}

// Thread (g, t)'s accumulators (rows g, g+8 × tokens 2t, 2t+1) into its warp's partial tile.
__device__ __forceinline__ void mxfp4_store(float (&part)[kRowsPerBlock][kTokensPerTile], const float (&acc)[4], int g,
                                            int t) {
  part[g][2 * t] = acc[0];
  part[g][2 * t + 1] = acc[1];
  part[g + 8][2 * t] = acc[2];
  part[g + 8][2 * t + 1] = acc[3];
}

// Block (x, y, z): 16 weight rows (x) × the y-th K range of matrix z; its warps take runs of kUnroll
// consecutive K blocks (whole 128-byte lines per row for FP8), strided by the warp count, each
// accumulating a 16-row tile. With ksplit > 1 the K ranges' sums meet in split_partials and the last
// block of the row tile (atomic ticket) adds them in split order, so the result does not depend on
// scheduling. kTok8 (FP8): tokens 4..7 present (a second MMA pass).
// The kTok8 instance holds twice the activation fragments and spills a few registers at 3 blocks per SM
// (ptxas -v: 68 bytes); at 2 it spilled nothing but ran slower at n = 8 on every decode shape (H200, s17:
// wo_b 21.2 vs 17.7 us, decode batch 8 12.29 vs 11.87 ms; only the 16384² row gained, 90 -> 78 us).
template <bool kFp4, bool kTok8 = false>
__global__ void __launch_bounds__(kGemvWarps * 32, kMinBlocksPerSm<kFp4>) gemv_quantized_kernel(GemvParams p) {
  static_assert(!kFp4 || !kTok8, "kTok8 is an FP8 variant");
  constexpr int kU = kUnroll<kFp4>;
  __shared__ float partial[kGemvWarps][kRowsPerBlock][kTokensPerTile];
  __shared__ bool is_last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const GemvOperands& op = p.ops[blockIdx.z];
  // gemv_quantized_multi: matrices of different heights share the grid (p.out = the tallest); the row
  // tiles past this matrix's rows have nothing to do (the whole block leaves: no barrier follows).
  const int64_t out = op.out > 0 ? op.out : p.out;
  if (row0 >= out) return;
  // Rows past `out` and tokens past `n` read row 0 / token 0 (valid memory) instead of predicating
  // every load: an MMA row or column only feeds its own outputs, and those are never written.
  const int64_t r_lo = row0 + g < out ? row0 + g : 0;
  const int64_t r_hi = row0 + g + 8 < out ? row0 + g + 8 : 0;
  const int n_kb = static_cast<int>(p.in / 32);
  const int kb_begin = static_cast<int>(blockIdx.y) * p.kb_per_split;
  const int kb_end = min(n_kb, kb_begin + p.kb_per_split);
  const int64_t w_stride = kFp4 ? p.in / 2 : p.in;
  constexpr int kLaneBytes = kFp4 ? 4 : 16;  // a thread's bytes of a K block (MXFP4) / pair (FP8)
  const uint8_t* w_lo_ptr = op.w + r_lo * w_stride + t * kLaneBytes;
  const uint8_t* w_hi_ptr = op.w + r_hi * w_stride + t * kLaneBytes;
  auto token = [&](int j) { return static_cast<int64_t>(j < p.n ? j : 0); };

  detail::pdl_launch_dependents();
  // No L2 prefetch of the first weight lines before the wait: the FP8 rows measured faster without it
  // (H200, s17: decode batch 1 7.176 -> 7.005 ms, batch 8 11.868 -> 11.600; wq_b 16.6 -> 15.4 us alone).
  detail::pdl_wait();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if constexpr (kFp4) {
    const ChunkPointers cp{w_lo_ptr,
                           w_hi_ptr,
                           op.w_scales + r_lo * n_kb,
                           op.w_scales + r_hi * n_kb,
                           op.act + token(g) * op.act_stride + t * 8,  // B operand: token g
                           op.act_scales + token(2 * t) * op.scale_stride,
                           op.act_scales + token(2 * t + 1) * op.scale_stride};
    mxfp4_warp_k(cp, kb_begin + warp * kU, p.warps * kU, kb_begin, kb_end, acc);
    mxfp4_store(partial[warp], acc, g, t);
  } else {
    const Fp8Lane lane_ops = fp8_lane(p, op, w_lo_ptr, w_hi_ptr, r_lo, g, t, p.n);
    fp8_tile<kTok8>(lane_ops, kb_begin + warp * kU, p.warps * kU, kb_begin, kb_end, p.kb_shift, t, acc);
    fp8_store<kTok8>(partial[warp], acc, g, t);
  }
  gemv_block_end(p, op, partial, row0, out, p.n, is_last);
}

// gemv_quantized_kernel over a device item table (DeviceGemvItem): the same tile computation (same K
// runs per warp, same summation order; no split-K), with gathered activation rows and scattered output
// rows. Blocks loop over the (item, row tile) units of the live items, so the grid (sized from the
// capacity) never depends on the device-side count.
struct GemvItemsParams {
  const DeviceGemvItem* items;
  const int32_t* count;
  int64_t capacity;
  int64_t out, in;
  int64_t block_out, scale_cols;
  int kb_shift;
  int64_t tiles;  // row tiles per matrix
  bool bf16_output;
  int warps;  // = blockDim.x / 32 (gemv_warps)
};

template <bool kFp4>
__global__ void __launch_bounds__(kGemvWarps * 32, kMinBlocksPerSm<kFp4>) gemv_items_kernel(GemvItemsParams p) {
  constexpr int kU = kUnroll<kFp4>;
  __shared__ float partial[kGemvWarps][kRowsPerBlock][kTokensPerTile];
  detail::pdl_launch_dependents();
  detail::pdl_wait();  // under PDL: the item table and the activations come from the previous kernels
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int n_kb = static_cast<int>(p.in / 32);
  const int64_t w_stride = kFp4 ? p.in / 2 : p.in;
  int64_t count = *p.count;
  count = count < 0 ? 0 : (count > p.capacity ? p.capacity : count);
  const int64_t units = count * p.tiles;
  for (int64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const DeviceGemvItem* it = p.items + unit / p.tiles;
    const int64_t row0 = (unit % p.tiles) * kRowsPerBlock;
    const int n = min(max(it->n, 0), kTokensPerTile);
    const uint8_t* w = it->data;
    const uint8_t* ws = it->scales;
    const int64_t r_lo = row0 + g < p.out ? row0 + g : 0;
    const int64_t r_hi = row0 + g + 8 < p.out ? row0 + g + 8 : 0;
    auto act_row = [&](int j) { return static_cast<int64_t>(it->act_row[j < n ? j : 0]); };
    const uint8_t* w_lo = w + r_lo * w_stride;
    const uint8_t* w_hi = w + r_hi * w_stride;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (kFp4) {
      const ChunkPointers cp{w_lo + t * 4,
                             w_hi + t * 4,
                             ws + r_lo * n_kb,
                             ws + r_hi * n_kb,
                             it->act_codes + act_row(g) * p.in + t * 8,
                             it->act_scales + act_row(2 * t) * n_kb,
                             it->act_scales + act_row(2 * t + 1) * n_kb};
      mxfp4_warp_k(cp, warp * kU, p.warps * kU, 0, n_kb, acc);
      mxfp4_store(partial[warp], acc, g, t);
    } else {
      const Fp8Lane lane_ops{w_lo + t * 16,
                             w_hi + t * 16,
                             ws + (r_lo / p.block_out) * p.scale_cols,
                             it->act_codes + act_row(g >> 1) * p.in + t * 16,
                             it->act_codes + act_row(4 + (g >> 1)) * p.in + t * 16,
                             it->act_scales + act_row(t) * n_kb,
                             it->act_scales + act_row(4 + t) * n_kb,
                             (g & 1) == (t >> 1)};
      if (n > 4) {  // block-uniform
        fp8_tile<true>(lane_ops, warp * kU, p.warps * kU, 0, n_kb, p.kb_shift, t, acc);
        fp8_store<true>(partial[warp], acc, g, t);
      } else {
        fp8_tile<false>(lane_ops, warp * kU, p.warps * kU, 0, n_kb, p.kb_shift, t, acc);
        fp8_store<false>(partial[warp], acc, g, t);
      }
    }
    __syncthreads();
    if (threadIdx.x < kRowsPerBlock * kTokensPerTile) {
      const int row = threadIdx.x / kTokensPerTile, tok = threadIdx.x % kTokensPerTile;
      const float sum = sum_partials(partial, p.warps, row, tok, n);
      if (tok < n && row0 + row < p.out)
        it->y[static_cast<int64_t>(it->y_row[tok]) * p.out + row0 + row] = p.bf16_output ? detail::round_bf16(sum) : sum;
    }
    __syncthreads();  // `partial` is reused by the next unit
  }
}

Status check_weight(const QuantWeightView& w) {
  if (w.out <= 0 || w.in <= 0 || w.data == nullptr || w.scales == nullptr)
    return make_error("cuda::gemv_quantized: empty weight (out=" + std::to_string(w.out) + ", in=" +
                      std::to_string(w.in) + ")");
  if (w.in % 32 != 0)
    return make_error("cuda::gemv_quantized: in=" + std::to_string(w.in) + " is not a multiple of 32");
  const int64_t kb_per_scale = w.block_in / 32;
  if (w.format == QuantWeightFormat::FP8Block &&
      (w.block_out <= 0 || w.block_out % kRowsPerBlock != 0 || w.block_in <= 0 || w.block_in % 32 != 0 ||
       (kb_per_scale & (kb_per_scale - 1)) != 0))
    return make_error("cuda::gemv_quantized: FP8 weight block " + std::to_string(w.block_out) + "×" +
                      std::to_string(w.block_in) +
                      " (block_out must be a multiple of 16, block_in 32 times a power of two)");
  if (w.in / 32 > 0x3FFFFFF)
    return make_error("cuda::gemv_quantized: in=" + std::to_string(w.in) + " is too large");
  if ((w.out + kRowsPerBlock - 1) / kRowsPerBlock > 0x7FFFFFFF)
    return make_error("cuda::gemv_quantized: out=" + std::to_string(w.out) + " is too large");
  return Status::Ok();
}

// Warps per block (each takes chunks of kUnroll K blocks, strided by the warp count). MXFP4: 8 (the
// packed layout is bit-equal to this schedule). FP8: the W in 8..4 with the fewest HBM round trips per
// SM — waves (blocks over the resident blocks at W warps) × chunk rounds per warp (ceil(chunks / W));
// ties to more warps. At least 4 warps: the epilogue reduces 16 rows × 8 tokens with one thread each.
// * Short K (at most two rounds at 8 warps), fractional waves: many short-K blocks gain — wq_b (K = 1280:
//   10 chunks, 2 048 blocks) runs 5 warps × 2 rounds at 5 blocks per SM instead of 8 warps (two of them
//   in a second round) at 3.
// * Longer K, a grid of one to two waves at 8 warps: the tail wave costs whole rounds (every block is a
//   chain of round trips, so the second wave starts when the first ends), so waves count whole — wo_a
//   (512 blocks of 32 chunks) is 2 waves × 4 rounds at 8 warps, 1 wave × 6 rounds at 6 (4 per SM).
// * Longer K otherwise keeps 8: its tail is amortized, and fewer warps per block only lengthen it
//   (16384² went 78 → 101 µs at 4 warps); a grid within one wave has nothing to gain from fewer warps.
int gemv_warps(bool fp4, int64_t kb_range, int64_t blocks) {
  const int64_t chunks = (kb_range + kUnroll<false> - 1) / kUnroll<false>;
  if (fp4) return kGemvWarps;
  const bool short_k = chunks <= 2 * kGemvWarps;
  const int sms = device_sm_count();
  int best = kGemvWarps;
  double best_cost = 0;
  for (int w = kGemvWarps; w >= 4; --w) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_quantized_kernel<false>, w * 32, 0) != cudaSuccess ||
        per_sm <= 0) {
      (void)cudaGetLastError();
      return kGemvWarps;
    }
    const double resident = static_cast<double>(per_sm) * sms;
    const double fraction = static_cast<double>(blocks) / resident;
    if (w == kGemvWarps && !short_k && (fraction <= 1.0 || fraction > 2.0)) return kGemvWarps;
    const double waves = short_k ? std::max(1.0, fraction) : std::ceil(fraction);
    const double cost = waves * static_cast<double>((chunks + w - 1) / w);
    if (w == kGemvWarps || cost < best_cost - 1e-9) {
      best_cost = cost;
      best = w;
    }
  }
  return best;
}

// K splits: when the row tiles of all matrices of a launch fill less than one wave (the blocks one
// wave holds on a 132-SM H200), K is split so the whole GPU streams the weights; whole waves only
// (floor), each split keeping >= 32 K blocks (1 KiB per FP8 row) so the partial traffic stays small.
int64_t choose_ksplit_tiles(const QuantWeightView& w, int64_t tiles) {
  const int64_t wave = (w.format == QuantWeightFormat::MXFP4 ? kMinBlocksPerSm<true> : kMinBlocksPerSm<false>) * 132;
  const int64_t most = std::max<int64_t>(1, (w.in / 32) / 32);
  return std::max<int64_t>(1, std::min(wave / tiles, most));
}
int64_t choose_ksplit(const QuantWeightView& w, int64_t count) {
  return choose_ksplit_tiles(w, (w.out + kRowsPerBlock - 1) / kRowsPerBlock * count);
}

// gemv_quantized_kernel for one token tile of `format` (FP8 with more than 4 tokens: the kTok8 instance).
Status launch_gemv(QuantWeightFormat format, const GemvParams& p, dim3 grid, cudaStream_t stream,
                   bool programmatic_launch) {
  if (format == QuantWeightFormat::MXFP4)
    return launch_kernel(gemv_quantized_kernel<true>, grid, dim3(p.warps * 32), 0, stream, programmatic_launch,
                         "gemv_quantized_kernel<MXFP4>", p);
  if (p.n > 4)
    return launch_kernel(gemv_quantized_kernel<false, true>, grid, dim3(p.warps * 32), 0, stream, programmatic_launch,
                         "gemv_quantized_kernel<FP8Block, 8 tokens>", p);
  return launch_kernel(gemv_quantized_kernel<false>, grid, dim3(p.warps * 32), 0, stream, programmatic_launch,
                       "gemv_quantized_kernel<FP8Block>", p);
}

// Tokens per launch: up to kGemvTokensPerLaunch for FP8 (gemv_fp8_tokens.cu reads each weight word once for all of
// them; a token's bits do not depend on the others, but are not the 8-token tile kernel's), else one 8-token tile
// per launch. That kernel keeps its operand offsets in 32 bits: every item's activation rows of one launch must lie
// within 2^31 elements.
int64_t tokens_per_launch(QuantWeightFormat format, int64_t n, const GemvGroupItem* items, int64_t count, int64_t in) {
  if (format != QuantWeightFormat::FP8Block || n <= kTokensPerTile) return kTokensPerTile;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t stride = items[i].act_row_stride ? items[i].act_row_stride : in;
    if ((kGemvTokensPerLaunch + 1) * stride >= (int64_t{1} << 31)) return kTokensPerTile;
  }
  return kGemvTokensPerLaunch;
}

// Tokens a split's partials hold: one launch's (FP8: gemv_fp8_tokens.cu's up to kGemvTokensPerLaunch).
int64_t split_tokens(QuantWeightFormat format) {
  return format == QuantWeightFormat::FP8Block ? kGemvTokensPerLaunch : kTokensPerTile;
}

// FP8 rows are read 16 bytes per lane (rows are multiples of 32 bytes, so the base decides).
Status check_weight_alignment(const QuantWeightView& w, int64_t i, const char* who) {
  if (w.format == QuantWeightFormat::FP8Block && reinterpret_cast<uintptr_t>(w.data) % 16 != 0)
    return make_error(std::string(who) + ": item " + std::to_string(i) + " FP8 weight data must be 16-byte aligned");
  return Status::Ok();
}

// An item's token row strides (GemvGroupItem: 0 = contiguous), checked: the codes' rows stay 16-byte
// aligned (the kernel's uint4 loads) and no two tokens' rows overlap in y.
Status check_item_strides(const GemvGroupItem& it, int64_t in, int64_t out, int64_t i, const char* who) {
  auto fail = [&](const std::string& what) {
    return make_error(std::string(who) + ": item " + std::to_string(i) + " " + what);
  };
  if (it.act_row_stride < 0 || it.act_scale_row_stride < 0 || it.y_row_stride < 0)
    return fail("has a negative row stride");
  if (it.act_row_stride != 0 && (it.act_row_stride < in || it.act_row_stride % 8 != 0))
    return fail("act_row_stride=" + std::to_string(it.act_row_stride) + " (>= in=" + std::to_string(in) +
                " and a multiple of 8 codes)");
  if (it.act_scale_row_stride != 0 && it.act_scale_row_stride < in / 32)
    return fail("act_scale_row_stride=" + std::to_string(it.act_scale_row_stride) +
                " (>= in/32=" + std::to_string(in / 32) + ")");
  if (it.y_row_stride != 0 && it.y_row_stride < out)
    return fail("y_row_stride=" + std::to_string(it.y_row_stride) + " (>= out=" + std::to_string(out) + ")");
  constexpr int64_t kMaxStride = 0x7FFFFFFF;  // the kernel keeps strides in 32 bits
  if (it.act_row_stride > kMaxStride || it.act_scale_row_stride > kMaxStride || it.y_row_stride > kMaxStride ||
      in > kMaxStride || out > kMaxStride)
    return fail("row strides must be below 2^31 elements");
  return Status::Ok();
}

// The kernel operands of item `it` for the token tile starting at t0 (strides resolved).
GemvOperands tile_operands(const GemvGroupItem& it, int64_t in, int64_t out, int64_t t0, int64_t op_out) {
  const int64_t as = it.act_row_stride ? it.act_row_stride : in;
  const int64_t ss = it.act_scale_row_stride ? it.act_scale_row_stride : in / 32;
  const int64_t ys = it.y_row_stride ? it.y_row_stride : out;
  GemvOperands o{it.data, it.scales, it.act_codes + t0 * as, it.act_scales + t0 * ss, it.y + t0 * ys, op_out};
  o.act_stride = static_cast<int32_t>(as);
  o.scale_stride = static_cast<int32_t>(ss);
  o.y_stride = static_cast<int32_t>(ys);
  return o;
}

}  // namespace

Status quantize_act_fp8(const float* x, int64_t n, int64_t in, uint16_t* codes, float* scales, cudaStream_t stream,
                        bool programmatic_launch) {
  if (n < 0 || in <= 0 || in % 32 != 0)
    return make_error("cuda::quantize_act_fp8: n=" + std::to_string(n) + ", in=" + std::to_string(in) +
                      " (in must be a positive multiple of 32)");
  const int64_t n_blocks = n * in / 32;
  if (n_blocks == 0) return Status::Ok();
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(codes) % 8 == 0) {
    const int64_t quads = n_blocks * 8;
    const auto grid = static_cast<unsigned>(std::min<int64_t>((quads + kQuantThreads - 1) / kQuantThreads, 132 * 16));
    return launch_kernel(quantize_act_fp8_x4_kernel, dim3(grid), dim3(kQuantThreads), 0, stream, programmatic_launch,
                         "quantize_act_fp8_x4_kernel", x, quads, codes, scales);
  }
  const int64_t grid = (n_blocks * 32 + kQuantThreads - 1) / kQuantThreads;
  return launch_kernel(quantize_act_fp8_kernel, dim3(static_cast<unsigned>(grid)), dim3(kQuantThreads), 0, stream,
                       programmatic_launch, "quantize_act_fp8_kernel", x, n_blocks, codes, scales);
}

Status stage_act_f16(const float* x, int64_t n, int64_t in, uint16_t* codes, float* scales, cudaStream_t stream,
                     bool programmatic_launch) {
  if (n < 0 || in <= 0 || in % 32 != 0)
    return make_error("cuda::stage_act_f16: n=" + std::to_string(n) + ", in=" + std::to_string(in) +
                      " (in must be a positive multiple of 32)");
  const int64_t n_blocks = n * in / 32;
  if (n_blocks == 0) return Status::Ok();
  if (x == nullptr || codes == nullptr || scales == nullptr)
    return make_error("cuda::stage_act_f16: x, codes and scales are required");
  const int64_t grid = (n_blocks * 32 + kQuantThreads - 1) / kQuantThreads;
  if (grid > 0x7FFFFFFF) return make_error("cuda::stage_act_f16: n·in=" + std::to_string(n * in) + " is too large");
  return launch_kernel(stage_act_f16_kernel, dim3(static_cast<unsigned>(grid)), dim3(kQuantThreads), 0, stream,
                       programmatic_launch, "stage_act_f16_kernel", x, n_blocks, codes, scales);
}

Status gemv_fp8_staged(const StagedGemvArgs& a, cudaStream_t stream, const SplitKWorkspace& splitk) {
  const QuantWeightView& w = a.w;
  const std::string shape =
      "[" + std::to_string(w.out) + ", " + std::to_string(w.in) + "] in " + std::to_string(a.groups) + " groups";
  auto fail = [&](const std::string& what) { return make_error("cuda::gemv_fp8_staged " + shape + ": " + what); };
  if (w.format != QuantWeightFormat::FP8Block) return fail("the weight must be FP8Block");
  if (a.groups < 1 || w.out % a.groups != 0) return fail("groups must divide out");
  const int64_t out = w.out / a.groups, in = w.in;
  if (w.block_out <= 0 || out % w.block_out != 0)
    return fail("block_out=" + std::to_string(w.block_out) + " must divide the group's out=" + std::to_string(out));
  CEDAR_RETURN_IF_ERROR(check_weight(w));
  if (a.n < 0) return fail("n=" + std::to_string(a.n));
  if (a.n == 0) return Status::Ok();
  if (a.x == nullptr || a.y == nullptr) return fail("x and y are required");
  const int64_t values = a.n * a.groups * in;
  if (a.codes == nullptr || a.scales == nullptr || a.capacity_values < values)
    return fail("workspace holds " + std::to_string(a.capacity_values) + " values, need " + std::to_string(values));
  if (reinterpret_cast<uintptr_t>(a.codes) % 16 != 0 || reinterpret_cast<uintptr_t>(a.scales) % 4 != 0)
    return fail("workspace codes must be 16-byte and scales 4-byte aligned");
  if (!a.codes_staged)
    CEDAR_RETURN_IF_ERROR(stage_act_f16(a.x, a.n, a.groups * in, a.codes, a.scales, stream, a.programmatic_launch));
  // Group g: rows [g·out, (g+1)·out) and their scale rows; its column slices of the codes, scales and y.
  const int64_t scale_cols = (in + w.block_in - 1) / w.block_in;
  std::vector<GemvGroupItem> items(static_cast<size_t>(a.groups));
  for (int64_t g = 0; g < a.groups; ++g) {
    GemvGroupItem& it = items[static_cast<size_t>(g)];
    it.data = w.data + g * out * in;
    it.scales = w.scales + g * (out / w.block_out) * scale_cols;
    it.act_codes = a.codes + g * in;
    it.act_scales = a.scales + g * (in / 32);
    it.y = a.y + g * out;
    it.act_row_stride = a.groups * in;
    it.act_scale_row_stride = a.groups * in / 32;
    it.y_row_stride = a.groups * out;
  }
  QuantWeightView group_shape = w;
  group_shape.out = out;
  return gemv_quantized_grouped(group_shape, items.data(), a.groups, a.n, a.bf16_output, stream, splitk,
                                a.programmatic_launch);
}

SplitKSize splitk_workspace_size(const QuantWeightView& w, int64_t count) {
  count = std::min<int64_t>(std::max<int64_t>(count, 1), kMaxGroup);
  const int64_t ksplit = choose_ksplit(w, count);
  if (ksplit <= 1) return {};
  return SplitKSize{count * ksplit * split_tokens(w.format) * w.out,
                    count * ((w.out + kRowsPerBlock - 1) / kRowsPerBlock)};
}

Status gemv_quantized_grouped(const QuantWeightView& shape, const GemvGroupItem* items, int64_t count, int64_t n,
                              bool bf16_output, cudaStream_t stream, const SplitKWorkspace& splitk,
                              bool programmatic_launch) {
  if (count < 0 || (count > 0 && items == nullptr))
    return make_error("cuda::gemv_quantized_grouped: count=" + std::to_string(count));
  if (n < 0) return make_error("cuda::gemv_quantized: n=" + std::to_string(n));
  for (int64_t i = 0; i < count; ++i) {
    QuantWeightView w = shape;
    w.data = items[i].data;
    w.scales = items[i].scales;
    CEDAR_RETURN_IF_ERROR(check_weight(w));
    CEDAR_RETURN_IF_ERROR(check_weight_alignment(w, i, "cuda::gemv_quantized_grouped"));
    CEDAR_RETURN_IF_ERROR(check_item_strides(items[i], shape.in, shape.out, i, "cuda::gemv_quantized_grouped"));
  }
  const int64_t n_kb = shape.in / 32;
  int kb_shift = 0;
  while ((int64_t{32} << kb_shift) < shape.block_in) ++kb_shift;
  for (int64_t g0 = 0; g0 < count; g0 += kMaxGroup) {
    const int64_t group = std::min<int64_t>(kMaxGroup, count - g0);
    int64_t ksplit = choose_ksplit(shape, group);
    const SplitKSize need = splitk_workspace_size(shape, group);
    if (ksplit > 1 && (splitk.partials == nullptr || splitk.counters == nullptr ||
                       splitk.partial_floats < need.partial_floats || splitk.counter_count < need.counters))
      ksplit = 1;  // no (or too small a) workspace: one block per row tile
    const int64_t kb_per_split = (n_kb + ksplit - 1) / ksplit;
    const dim3 grid(static_cast<unsigned>((shape.out + kRowsPerBlock - 1) / kRowsPerBlock),
                    static_cast<unsigned>(ksplit), static_cast<unsigned>(group));
    const int64_t per_launch = tokens_per_launch(shape.format, n, items + g0, group, shape.in);
    for (int64_t t0 = 0; t0 < n; t0 += per_launch) {
      GemvParams p{};
      for (int64_t i = 0; i < group; ++i) p.ops[i] = tile_operands(items[g0 + i], shape.in, shape.out, t0, 0);
      p.out = shape.out;
      p.in = shape.in;
      p.block_out = shape.block_out;
      p.scale_cols = (shape.in + shape.block_in - 1) / shape.block_in;
      p.kb_shift = kb_shift;
      p.n = static_cast<int>(std::min(n - t0, per_launch));
      p.bf16_output = bf16_output;
      p.ksplit = static_cast<int>(ksplit);
      p.kb_per_split = static_cast<int>(kb_per_split);
      p.split_partials = splitk.partials;
      p.split_counters = splitk.counters;
      p.warps = gemv_warps(shape.format == QuantWeightFormat::MXFP4, kb_per_split,
                           static_cast<int64_t>(grid.x) * grid.y * grid.z);
      // Token tiles of one call write disjoint rows, so every launch of the call may take PDL.
      CEDAR_RETURN_IF_ERROR(per_launch > kTokensPerTile ? launch_gemv_fp8_tokens(p, grid, stream, programmatic_launch)
                                                        : launch_gemv(shape.format, p, grid, stream, programmatic_launch));
    }
  }
  return Status::Ok();
}

SplitKSize splitk_workspace_size_multi(const QuantWeightView* mats, int64_t count) {
  if (count < 1 || count > kMaxGroup || mats == nullptr) return {};
  int64_t tiles = 0, out = 0;
  for (int64_t i = 0; i < count; ++i) {
    tiles += (mats[i].out + kRowsPerBlock - 1) / kRowsPerBlock;
    out = std::max(out, mats[i].out);
  }
  QuantWeightView tallest = mats[0];
  tallest.out = out;
  const int64_t ksplit = choose_ksplit_tiles(tallest, tiles);
  if (ksplit <= 1) return {};
  return SplitKSize{count * ksplit * split_tokens(mats[0].format) * out,
                    count * ((out + kRowsPerBlock - 1) / kRowsPerBlock)};
}

Status gemv_quantized_multi(const QuantWeightView* mats, const GemvGroupItem* items, int64_t count, int64_t n,
                            bool bf16_output, cudaStream_t stream, const SplitKWorkspace& splitk,
                            bool programmatic_launch) {
  if (count < 1 || count > kMaxGroup || mats == nullptr || items == nullptr)
    return make_error("cuda::gemv_quantized_multi: count=" + std::to_string(count) + " (1.." +
                      std::to_string(kMaxGroup) + ", mats and items required)");
  if (n < 0) return make_error("cuda::gemv_quantized_multi: n=" + std::to_string(n));
  int64_t tiles = 0, out = 0;
  for (int64_t i = 0; i < count; ++i) {
    QuantWeightView w = mats[i];
    w.data = items[i].data;
    w.scales = items[i].scales;
    CEDAR_RETURN_IF_ERROR(check_weight(w));
    CEDAR_RETURN_IF_ERROR(check_weight_alignment(w, i, "cuda::gemv_quantized_multi"));
    CEDAR_RETURN_IF_ERROR(check_item_strides(items[i], w.in, w.out, i, "cuda::gemv_quantized_multi"));
    if (w.format != mats[0].format || w.in != mats[0].in ||
        (w.format == QuantWeightFormat::FP8Block &&
         (w.block_out != mats[0].block_out || w.block_in != mats[0].block_in)))
      return make_error("cuda::gemv_quantized_multi: matrix " + std::to_string(i) +
                        " differs from matrix 0 in format, in or blocks (only out may differ)");
    tiles += (w.out + kRowsPerBlock - 1) / kRowsPerBlock;
    out = std::max(out, w.out);
  }
  QuantWeightView tallest = mats[0];
  tallest.out = out;
  int64_t ksplit = choose_ksplit_tiles(tallest, tiles);
  const SplitKSize need = splitk_workspace_size_multi(mats, count);
  if (ksplit > 1 && (splitk.partials == nullptr || splitk.counters == nullptr ||
                     splitk.partial_floats < need.partial_floats || splitk.counter_count < need.counters))
    ksplit = 1;
  const int64_t n_kb = tallest.in / 32;
  int kb_shift = 0;
  while ((int64_t{32} << kb_shift) < tallest.block_in) ++kb_shift;
  const dim3 grid(static_cast<unsigned>((out + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(ksplit),
                  static_cast<unsigned>(count));
  const int64_t per_launch = tokens_per_launch(tallest.format, n, items, count, tallest.in);
  for (int64_t t0 = 0; t0 < n; t0 += per_launch) {
    GemvParams p{};
    for (int64_t i = 0; i < count; ++i) p.ops[i] = tile_operands(items[i], tallest.in, mats[i].out, t0, mats[i].out);
    p.out = out;
    p.in = tallest.in;
    p.block_out = tallest.block_out;
    p.scale_cols = (tallest.in + tallest.block_in - 1) / tallest.block_in;
    p.kb_shift = kb_shift;
    p.n = static_cast<int>(std::min(n - t0, per_launch));
    p.bf16_output = bf16_output;
    p.ksplit = static_cast<int>(ksplit);
    p.kb_per_split = static_cast<int>((n_kb + ksplit - 1) / ksplit);
    p.split_partials = splitk.partials;
    p.split_counters = splitk.counters;
    p.warps = gemv_warps(tallest.format == QuantWeightFormat::MXFP4, p.kb_per_split,
                         static_cast<int64_t>(grid.x) * grid.y * grid.z);
    CEDAR_RETURN_IF_ERROR(per_launch > kTokensPerTile ? launch_gemv_fp8_tokens(p, grid, stream, programmatic_launch)
                                                      : launch_gemv(tallest.format, p, grid, stream, programmatic_launch));
  }
  return Status::Ok();
}

Status gemv_quantized_items(const QuantWeightView& shape, Mxfp4Layout layout, const DeviceGemvItem* items,
                            const int32_t* count, int64_t capacity, bool bf16_output, cudaStream_t stream,
                            const GemvItemsOptions& options) {
  if (layout != Mxfp4Layout::Tiles && options.l2_prefetch.items != nullptr)
    return make_error("cuda::gemv_quantized_items: l2_prefetch is for the tile layout only");
  if (layout == Mxfp4Layout::Tiles)
    return gemv_mxfp4_tiles_items(shape, items, count, capacity, bf16_output, stream, options);
  if (layout != Mxfp4Layout::Plain)
    return gemv_mxfp4_packed_items(shape, items, count, capacity, bf16_output, stream,
                                   layout == Mxfp4Layout::PackedBalanced, options);
  if (options.packed_warps != 0 || options.work != nullptr || options.scale_exp_add)
    return make_error(
        "cuda::gemv_quantized_items: packed_warps, work counters and scale_exp_add are for the packed layouts only");
  const bool programmatic_launch = options.programmatic_launch;
  QuantWeightView w = shape;
  w.data = w.scales = reinterpret_cast<const uint8_t*>(&shape);  // per-item pointers live on the device
  CEDAR_RETURN_IF_ERROR(check_weight(w));
  if (items == nullptr || count == nullptr || capacity <= 0 || capacity > (int64_t{1} << 24))
    return make_error("cuda::gemv_quantized_items: items, count and a capacity in [1, 2^24] are required (capacity " +
                      std::to_string(capacity) + ")");
  GemvItemsParams p{};
  p.items = items;
  p.count = count;
  p.capacity = capacity;
  p.out = shape.out;
  p.in = shape.in;
  p.block_out = shape.block_out;
  p.scale_cols = (shape.in + shape.block_in - 1) / shape.block_in;
  p.kb_shift = 0;
  while ((int64_t{32} << p.kb_shift) < shape.block_in) ++p.kb_shift;
  p.tiles = (shape.out + kRowsPerBlock - 1) / kRowsPerBlock;
  p.bf16_output = bf16_output;
  const bool fp4 = shape.format == QuantWeightFormat::MXFP4;
  // The rule of gemv_quantized over this launch's units (the same W, so the same bits, wherever both
  // see the same number of waves).
  p.warps = gemv_warps(fp4, shape.in / 32, capacity * p.tiles);
  const int64_t wave = static_cast<int64_t>(fp4 ? kMinBlocksPerSm<true> : kMinBlocksPerSm<false>) * device_sm_count();
  const auto grid = static_cast<unsigned>(std::min<int64_t>(capacity * p.tiles, wave));
  if (fp4)
    return launch_kernel(gemv_items_kernel<true>, dim3(grid), dim3(p.warps * 32), 0, stream, programmatic_launch,
                         "gemv_items_kernel<MXFP4>", p);
  return launch_kernel(gemv_items_kernel<false>, dim3(grid), dim3(p.warps * 32), 0, stream, programmatic_launch,
                       "gemv_items_kernel<FP8Block>", p);
}

Status gemv_quantized(const QuantWeightView& w, const uint16_t* act_codes, const float* act_scales, int64_t n,
                      float* y, bool bf16_output, cudaStream_t stream, const SplitKWorkspace& splitk,
                      bool programmatic_launch) {
  const GemvGroupItem item{w.data, w.scales, act_codes, act_scales, y};
  return gemv_quantized_grouped(w, &item, 1, n, bf16_output, stream, splitk, programmatic_launch);
}

Status linear_quantized(const QuantWeightView& w, const float* x, int64_t n, const ActWorkspace& ws, float* y,
                        bool bf16_output, cudaStream_t stream, bool programmatic_launch) {
  CEDAR_RETURN_IF_ERROR(check_weight(w));
  if (n * w.in > ws.capacity_values)
    return make_error("cuda::linear_quantized: workspace holds " + std::to_string(ws.capacity_values) +
                      " activation values, need " + std::to_string(n * w.in));
  CEDAR_RETURN_IF_ERROR(quantize_act_fp8(x, n, w.in, ws.codes, ws.scales, stream, programmatic_launch));
  return gemv_quantized(w, ws.codes, ws.scales, n, y, bf16_output, stream, ws.splitk, programmatic_launch);
}

// Exposed to catalog.cu for the loadability check.
const void* quantize_act_fp8_kernel_ptr() { return reinterpret_cast<const void*>(&quantize_act_fp8_kernel); }
const void* stage_act_f16_kernel_ptr() { return reinterpret_cast<const void*>(&stage_act_f16_kernel); }
const void* gemv_fp8_kernel_ptr() { return reinterpret_cast<const void*>(&gemv_quantized_kernel<false>); }
const void* gemv_mxfp4_kernel_ptr() { return reinterpret_cast<const void*>(&gemv_quantized_kernel<true>); }
const void* gemv_items_fp8_kernel_ptr() { return reinterpret_cast<const void*>(&gemv_items_kernel<false>); }
const void* gemv_items_mxfp4_kernel_ptr() { return reinterpret_cast<const void*>(&gemv_items_kernel<true>); }

}  // namespace cedar::cuda
