// The FP8 GEMV's stream schedule (gemv_stream.cu): warp-persistent, weights pipelined through shared
// memory. Internal to the GEMV (gemv.cu chooses it from SplitKWorkspace::schedule); include from .cu files.
#pragma once

#include <cstdint>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"

namespace cedar::cuda::gemv_detail {

constexpr int kStreamMinUnits = 2;  // chunks per warp at least (fewer warps than resident for small weights)

struct StreamParams {
  GemvOperands ops[kMaxGroup];   // ops[z].out: the rows of matrix z (always set)
  int32_t tile_end[kMaxGroup];   // row tiles of matrices 0..z
  int count;                     // matrices
  int64_t in;
  int64_t block_out, scale_cols;  // FP8Block scale grid
  int kb_shift;                   // log2(block_in / 32)
  int n;                          // tokens in this tile (1..8)
  bool bf16_output;
  int32_t chunks;       // chunks (4 K blocks) per row
  int32_t units;        // tiles × chunks (< 2^31)
  int32_t warps_total;  // <= units / 2
  int32_t per_warp;     // ⌊units / warps_total⌋
  int32_t extra;        // units mod warps_total: runs 0 .. extra − 1 hold per_warp + 1 units
  int32_t pieces_max;   // partial slots per tile in `partials`
  float* partials;      // [tiles][pieces_max][16 × 8]
  unsigned* counters;   // [tiles], zero between launches
};

struct StreamPlan {
  int chunk_kb = 0;  // K blocks per weight chunk (4, 8, 16: 128, 256, 512 bytes of each of 16 rows)
  int64_t chunks = 0, units = 0, warps_total = 0, pieces_max = 0, blocks = 0;
};
// The schedule for `tiles` row tiles of K = in at chunk width chunk_kb on the current device (the
// workspace and the launch must agree: both call this).
StreamPlan plan_gemv_stream(int64_t tiles, int64_t in, int chunk_kb);
// Partials / counters the stream schedule needs at any chunk width ({} when no tile is ever shared).
SplitKSize stream_workspace_size(int64_t tiles, int64_t in);
// scale_step: one weight scale per K block (block_in 32).
Status launch_gemv_stream(const StreamParams& p, const StreamPlan& plan, bool scale_step, cudaStream_t stream,
                          bool pdl);

}  // namespace cedar::cuda::gemv_detail
