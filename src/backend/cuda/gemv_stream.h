// The FP8 GEMV's stream schedule (gemv_stream.cu): warp-persistent, weights pipelined through shared
// memory. Internal to the GEMV (gemv.cu chooses it from SplitKWorkspace::schedule); include from .cu files.
#pragma once

#include <cstdint>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"

namespace cedar::cuda::gemv_detail {

constexpr int kStreamItemsPerWarp = 4;  // items (chunk runs of a tile) per resident warp, about

struct StreamParams {
  GemvOperands ops[kMaxGroup];   // ops[z].out: the rows of matrix z (always set)
  int32_t tile_end[kMaxGroup];   // row tiles of matrices 0..z
  int count;                     // matrices
  int64_t in;
  int64_t block_out, scale_cols;  // FP8Block scale grid
  int kb_shift;                   // log2(block_in / 32)
  int n;                          // tokens in this tile (1..8)
  bool bf16_output;
  int32_t chunks;       // chunks (8 K blocks) per row
  int32_t item_chunks;  // chunks per item
  int32_t ksplit;       // items per row tile (⌈chunks / item_chunks⌉)
  int32_t items;        // tiles × ksplit (< 2^31)
  int32_t warps_total;  // <= items
  float* partials;      // [tiles][ksplit][16 × 8]
  unsigned* counters;   // [tiles], zero between launches
};

struct StreamPlan {
  int64_t chunks = 0, item_chunks = 0, ksplit = 0, items = 0, warps_total = 0, blocks = 0;
};
// The schedule for `tiles` row tiles of K = in for a token tile of n tokens (the one-token kernel has
// smaller stages, more blocks per SM) on the current device: the workspace and the launch both call it.
StreamPlan plan_gemv_stream(int64_t tiles, int64_t in, int64_t n);
// Partials / counters the stream schedule needs at any token count ({} when no tile is ever shared).
SplitKSize stream_workspace_size(int64_t tiles, int64_t in);
// scale_step: one weight scale per K block (block_in 32), staged with the chunk; otherwise read per block.
Status launch_gemv_stream(const StreamParams& p, const StreamPlan& plan, bool scale_step, cudaStream_t stream,
                          bool pdl);

}  // namespace cedar::cuda::gemv_detail
