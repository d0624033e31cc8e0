// The work split of the wide mHC decode kernel's last block (mhc.cu wide_tail) as plain index maps,
// callable from the host too: a CPU-side test (perf_mhc_cutest.cpp WideTailSplitCoversEveryOutputOnce)
// checks that every (token, slot) sum, every partial block and every normed channel is taken exactly once.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CEDAR_MHC_HD __host__ __device__
#else
#define CEDAR_MHC_HD
#endif

namespace cedar::cuda::mhc_split {

constexpr int kThreads = 256;  // the decode kernel's block
constexpr int kWarps = kThreads / 32;
constexpr int kSlotsPerWarp = 4;   // (token, slot) sums per warp and round
constexpr int kBlocksPerLane = 4;  // partial blocks per lane: G <= 32 · 4
constexpr int kNormBatch = 20;     // normed channels per thread: d <= 256 · 20
constexpr int kNormRows = 4;       // rows the wide tail holds in registers (kMhcNormFuseMaxTokens)
constexpr int kSlot = 25;          // 24 dot products + the sum of squares per token
constexpr int kRounds = (kNormRows * kSlot + kWarps * kSlotsPerWarp - 1) / (kWarps * kSlotsPerWarp);

// Round rd of warp w sums slots slot0 .. slot0 + 3 (those below nt · 25; a warp whose slot0 is past
// the end skips the round).
CEDAR_MHC_HD constexpr int tail_slot0(int warp, int round) {
  return warp * kSlotsPerWarp + kWarps * kSlotsPerWarp * round;
}
// Lane l's r-th partial block (those below G).
CEDAR_MHC_HD constexpr int64_t tail_block(int lane, int r) { return lane + int64_t{32} * r; }
// Thread t's q-th channel of a normed row (those below d).
CEDAR_MHC_HD constexpr int64_t tail_norm_channel(int tid, int q) { return tid + int64_t{kThreads} * q; }

}  // namespace cedar::cuda::mhc_split
