// Analysis of a recorded GPU kernel timeline (docs/cuda-log.md "Kernel timeline (s8-timeline)"): given the kernel
// intervals of one step, where the wall time goes — busy (the union of the intervals), idle, time with two or
// more kernels running, and per kernel name its calls, total and "exposed" time (when it is the only kernel
// running: the most that shortening it can save). Host-only and free of CUDA: the records come from
// backend/cuda/kernel_timeline.h (CUPTI) on a GPU build, and the CPU suite tests this with hand-made intervals.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace cedar {

// One kernel execution. Intervals are half-open [start_ns, end_ns) on one clock (CUPTI's timestamps).
struct KernelRecord {
  std::string name;  // demangled and tidied (tidy_kernel_name)
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t stream_id = 0;   // the stream CUPTI reports (for graph nodes: as CUPTI maps the branch)
  uint32_t channel_id = 0;  // the hardware channel the kernel ran on
  uint32_t correlation_id = 0;
  uint32_t graph_id = 0;       // 0: not launched from a graph
  uint64_t graph_node_id = 0;  // 0: not launched from a graph
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
  uint32_t registers = 0;
  int32_t shared_bytes = 0;  // static + dynamic
};

struct KernelNameStats {
  std::string name;
  int64_t calls = 0;
  int64_t total_ns = 0;    // sum of the durations (overlapping calls count twice)
  int64_t exposed_ns = 0;  // time when this name's kernel is the only one running
};

struct StreamBusy {
  uint32_t stream_id = 0;
  int64_t kernels = 0;
  int64_t busy_ns = 0;  // union of this stream's intervals
};

struct TimelineStats {
  int64_t kernels = 0;
  int64_t skipped = 0;  // records without timestamps (start = end = 0) or with end < start
  uint64_t first_start_ns = 0, last_end_ns = 0;
  int64_t wall_ns = 0;                   // first start -> last end
  int64_t busy_ns = 0;                   // union of all intervals
  int64_t idle_ns = 0;                   // wall - busy
  int64_t overlap_ns = 0;                // time with >= 2 kernels running
  std::vector<KernelNameStats> by_name;  // total_ns descending, then name
  std::vector<StreamBusy> streams;       // by stream_id
};

// One sweep over the interval ends; O(n log n). Zero-length intervals count as calls with no time.
TimelineStats analyze_timeline(std::span<const KernelRecord> records);

// The mean of several steps' stats: every time per step, calls per step; names / streams missing from a
// step count as 0 there.
struct MeanKernelStats {
  std::string name;
  double calls = 0, total_ns = 0, exposed_ns = 0;  // per step
  double mean_ns() const { return calls > 0 ? total_ns / calls : 0; }
};
struct MeanStreamBusy {
  uint32_t stream_id = 0;
  double kernels = 0, busy_ns = 0;  // per step
};
struct MeanTimelineStats {
  int64_t steps = 0;
  double kernels = 0, wall_ns = 0, busy_ns = 0, idle_ns = 0, overlap_ns = 0;
  std::vector<MeanKernelStats> by_name;  // total_ns descending, then name
  std::vector<MeanStreamBusy> streams;   // by stream_id
};
MeanTimelineStats average_timelines(std::span<const TimelineStats> steps);

// Records split by host stamps taken between steps: step i holds the records starting in
// [stamps[i], stamps[i + 1]), each sorted by start; stamps must be non-decreasing (error otherwise).
// Records outside every window are dropped.
Result<std::vector<std::vector<KernelRecord>>> split_steps(std::span<const KernelRecord> records,
                                                           std::span<const uint64_t> stamps);

// One layer cut out of a step. The anchor is a kernel name that runs exactly `layers` times in the step —
// of those, the one whose first call starts earliest (ties: the name); layer k is every record starting in
// [k-th anchor start, (k+1)-th anchor start), the last layer up to the step's end, sorted by start.
// `heads`: the kernels that open a layer where layers open with different kernels (one of them per layer);
// when their calls number exactly `layers` they are the anchor (named "a | b"), else the rule above.
struct LayerCut {
  std::string anchor;
  int64_t layer = 0;
  std::vector<KernelRecord> records;
};
Result<LayerCut> cut_layer(std::span<const KernelRecord> step, int64_t layers, int64_t layer,
                           std::span<const std::string> heads = {});

// A CUDA kernel's symbol as a short readable name: demangled (Itanium ABI; a name that does not demangle is
// kept), then tidy_kernel_name.
std::string demangle_kernel_name(const char* symbol);
// Drops the return type ("void "), the parameter list, and the "cedar::cuda::", "cedar::" and
// "(anonymous namespace)::" qualifiers; template arguments stay (they tell instantiations apart).
std::string tidy_kernel_name(std::string demangled);

}  // namespace cedar
