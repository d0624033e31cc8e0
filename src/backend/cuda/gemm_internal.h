// Internal to the prefill GEMM files (gemm_quant.cu, gemm_moe.cu): the one tiled tensor-core kernel's
// problem description and launcher. C++17.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace cedar::cuda::gemm_detail {

// What the epilogue does with a finished 256-row × tile_m-token tile.
enum class Epilogue : int {
  kF32 = 0,       // y[row, col] fp32 (optionally bf16-rounded)
  kPartial = 1,   // split-K partial sums: y + split·m·ldy, never rounded
  kBf16Bits = 2,  // y_bf16[row, col] bf16 bits (MoE W2 rows)
  kSwiglu = 3,    // the tile's halves are W1 / W3 rows: SwiGLU + FP8 quantization → h codes / scales
};

// One launch of the tile kernel. The CTA's 256 weight rows are two halves of 128: for a plain GEMM rows
// [n0, n0+256) of one matrix; for `dual` rows [n0, n0+128) of W1 (half 0) and of W3 (half 1).
struct Problem {
  bool fp4 = false;
  // activations (the MMA's B operand)
  const uint16_t* act = nullptr;      // codes [act rows, K]
  const float* act_scales = nullptr;  // [act rows, K >> (5 + act_shift)]
  const int32_t* gather = nullptr;    // row → act row (grouped W1/W3), null: identity
  int64_t K = 0;
  int act_shift = 0;  // log2(act_block / 32)
  // rows (tokens): plain [0, m); grouped: expert e owns [row_offsets[e], row_offsets[e+1])
  int64_t m = 0;
  const int32_t* row_offsets = nullptr;  // null: plain
  const int32_t* tile_offsets = nullptr;
  int n_experts = 0;
  // weights
  const uint8_t* w[2] = {nullptr, nullptr};  // plain: per half
  const uint8_t* ws[2] = {nullptr, nullptr};
  const uint8_t* const* ew[2] = {nullptr, nullptr};  // grouped: device arrays [n_experts] per half
  const uint8_t* const* ews[2] = {nullptr, nullptr};
  int64_t N = 0;  // rows of each weight matrix
  bool dual = false;
  int64_t block_out = 32, scale_cols = 0;  // FP8 scale grid
  int kb_shift = 0;                        // FP8: log2(block_in / 32)
  int kb_per_split = 0;                    // K blocks per blockIdx.z
  // epilogue
  Epilogue epilogue = Epilogue::kF32;
  float* y = nullptr;
  int64_t ldy = 0;
  bool bf16_round = true;
  uint16_t* y_bf16 = nullptr;
  const float* row_weights = nullptr;  // kSwiglu: [rows] or null
  float swiglu_limit = 0.0f;
  uint16_t* h_codes = nullptr;  // kSwiglu: [rows, N]
  float* h_scales = nullptr;    // [rows, N >> (5 + h_act_shift)]
  int h_act_shift = 0;
};

// Tokens per CTA the configurations support.
constexpr bool valid_tile_m(int tile_m) { return tile_m == 128 || tile_m == 64 || tile_m == 32; }

// Launches the kernel over `m_tiles` row tiles (plain: ceil(m / tile_m); grouped: an upper bound of
// the schedule's tiles — CTAs past the schedule's end return at once) × the weight's column tiles ×
// `splits` K ranges.
Status launch(const Problem& p, int tile_m, int64_t m_tiles, int splits, cudaStream_t stream);

// Column tiles of a problem (256 rows per tile, or 128 per matrix when dual).
__host__ __device__ inline int64_t n_tiles(const Problem& p) { return p.dual ? (p.N + 127) / 128 : (p.N + 255) / 256; }

}  // namespace cedar::cuda::gemm_detail
