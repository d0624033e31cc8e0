// The block-scaled FP8 GEMV for 9..64 tokens in one launch: gemv.cu's grid, warps and per-warp K runs (so the same
// bits as its one-launch-per-8-token-tile loop), but each warp loads a run's weight words once and feeds every
// token tile of the launch from them. The tile loop re-read the weights per 8 tokens: 8 passes at 64 tokens, which
// s27 run 2 measured slower than the GEMMs (batch 64 52.9 vs 50.7 ms on the H200). Token tiles past the first cost
// MMAs and activation loads only (L1 / L2 hits: every block reads the same activation rows).
// K splits are not taken here (their workspace holds one token tile): the host keeps the tile loop for them.
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/gemv_fp8.cuh"
#include "backend/cuda/launch.h"

namespace cedar::cuda {
namespace {

using namespace gemv_detail;

// A run's weight words held in registers for every token tile: loaded as fp8_chunk's row-major source loads them
// (its redirect of a block past the range included, so every tile sees the same words the tile loop's launches do).
struct Fp8HeldWeights {
  uint4 lo[kUnroll<false> / 2], hi[kUnroll<false> / 2];
  __device__ __forceinline__ void load(const Fp8Lane&, int j, int, bool, uint4& l, uint4& h) const {
    l = lo[j];
    h = hi[j];
  }
};

template <bool kFull>
__device__ __forceinline__ Fp8HeldWeights hold_weights(const uint8_t* w_lo, const uint8_t* w_hi, int kb0, int kb_begin,
                                                       int kb_end, int t, uint64_t policy) {
  Fp8HeldWeights w;
#pragma unroll
  for (int j = 0; j < kUnroll<false> / 2; ++j) {
    const bool ok_e = kFull || kb0 + 2 * j < kb_end, ok_o = kFull || kb0 + 2 * j + 1 < kb_end;
    const int off = ((t >> 1) ? ok_o : ok_e) ? kFp8PairBytes * j : 32 * (kb_begin - kb0) - 32 * (t >> 1);
    w.lo[j] = detail::ld_weight(reinterpret_cast<const uint4*>(w_lo + off), policy);
    w.hi[j] = detail::ld_weight(reinterpret_cast<const uint4*>(w_hi + off), policy);
  }
  return w;
}

// Thread (g, t)'s operands of the 4-token group `quad` (tokens 4·quad .. of op, n in all) at K block kb0: what
// fp8_chunk's first pass reads for those tokens. (Its second pass, tokens 4..7 of an 8-token tile, is the same
// arithmetic on the next group, so a group at a time gives the tile loop's bits with half the operand registers.)
__device__ __forceinline__ Fp8Lane quad_lane(const GemvParams& p, const GemvOperands& op, int64_t r_lo, int g, int t,
                                             int quad, int n, int kb0) {
  GemvOperands o = op;
  o.act += static_cast<int64_t>(quad) * 4 * op.act_stride + 32 * static_cast<int64_t>(kb0);
  o.act_scales += static_cast<int64_t>(quad) * 4 * op.scale_stride + kb0;
  return fp8_lane(p, o, nullptr, nullptr, r_lo, g, t, min(n - quad * 4, 4));
}

// kScaleStep as in fp8_warp_k. acc[quad] takes group `quad`'s sums (rows g, g + 8 × token t of the group).
template <bool kScaleStep, int kQuads>
__device__ __forceinline__ void tokens_warp_k(const GemvParams& p, const GemvOperands& op, const uint8_t* w_lo,
                                              const uint8_t* w_hi, int64_t r_lo, int g, int t, int n, int first,
                                              int step, int kb_end, float (&acc)[kQuads][2]) {
  constexpr int kU = kUnroll<false>;
  const uint64_t policy = detail::l2_evict_first_policy();
  const int quads = (n + 3) / 4;
  // The weight scale row walks with the runs (kScaleStep) or is indexed from the row's start (fp8_chunk).
  const uint8_t* s_row = op.w_scales + (r_lo / p.block_out) * p.scale_cols;
  for (int kb0 = first; kb0 < kb_end; kb0 += step) {
    const bool full = kb0 + kU <= kb_end;
    const Fp8HeldWeights w = full ? hold_weights<true>(w_lo + 32 * kb0, w_hi + 32 * kb0, kb0, 0, kb_end, t, policy)
                                  : hold_weights<false>(w_lo + 32 * kb0, w_hi + 32 * kb0, kb0, 0, kb_end, t, policy);
#pragma unroll
    for (int quad = 0; quad < kQuads; ++quad) {
      if (quad >= quads) break;
      Fp8Lane c = quad_lane(p, op, r_lo, g, t, quad, n, kb0);
      c.s_row = kScaleStep ? s_row + kb0 : s_row;
      float a4[4] = {acc[quad][0], acc[quad][1], 0.0f, 0.0f};
      if (full)
        fp8_chunk<true, kScaleStep, false>(c, w, kb0, 0, kb_end, p.kb_shift, t, a4);
      else
        fp8_chunk<false, kScaleStep, false>(c, w, kb0, 0, kb_end, p.kb_shift, t, a4);
      acc[quad][0] = a4[0];
      acc[quad][1] = a4[1];
    }
  }
}

// Block (x, z): 16 weight rows × matrix z, the whole K range (no split), all p.n (<= 8 · kTiles) tokens.
template <int kTiles>
__global__ void __launch_bounds__(kGemvWarps * 32, 2) gemv_fp8_tokens_kernel(GemvParams p) {
  constexpr int kU = kUnroll<false>, kQuads = 2 * kTiles;
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
  const uint8_t* w_lo = op.w + r_lo * p.in + t * 16;
  const uint8_t* w_hi = op.w + r_hi * p.in + t * 16;
  detail::pdl_launch_dependents();
  detail::pdl_wait();
  float acc[kQuads][2];
#pragma unroll
  for (int i = 0; i < kQuads; ++i) acc[i][0] = acc[i][1] = 0.0f;
  if (p.kb_shift == 0)
    tokens_warp_k<true, kQuads>(p, op, w_lo, w_hi, r_lo, g, t, p.n, warp * kU, p.warps * kU, n_kb, acc);
  else
    tokens_warp_k<false, kQuads>(p, op, w_lo, w_hi, r_lo, g, t, p.n, warp * kU, p.warps * kU, n_kb, acc);
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    const int n = min(p.n - tile * kTokensPerTile, kTokensPerTile);
    if (n <= 0) break;
    const float a4[4] = {acc[2 * tile][0], acc[2 * tile][1], acc[2 * tile + 1][0], acc[2 * tile + 1][1]};
    fp8_store<true>(partial[warp], a4, g, t);
    GemvOperands o = op;
    o.y += static_cast<int64_t>(tile) * kTokensPerTile * op.y_stride;
    gemv_block_end(p, o, partial, row0, out, n, is_last);  // ksplit 1: every block writes its rows
    __syncthreads();  // the partials are read before the next tile's stores
  }
}

}  // namespace

namespace gemv_detail {
Status launch_gemv_fp8_tokens(const GemvParams& p, dim3 grid, cudaStream_t stream, bool programmatic_launch) {
  if (p.ksplit != 1 || grid.y != 1)
    return make_error("cuda::gemv_fp8_tokens: one K range per block only (ksplit " + std::to_string(p.ksplit) + ")");
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
