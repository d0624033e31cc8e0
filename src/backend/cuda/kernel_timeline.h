// A kernel timeline of the GPU through CUPTI's activity API (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL): every
// kernel's start / end / stream, CUDA graph nodes included, without serializing concurrent kernels — the view
// Nsight Systems would give, for `cedar bench --device cuda --timeline N` (docs/cuda-log.md "Kernel timeline").
//
// CUPTI is opened with dlopen on first use ($CEDAR_CUPTI if set, else libcupti.so.13 / libcupti.so on the
// loader's path, then the toolkit's lib64 / lib folders); only its headers are used at build time, so a binary
// starts on a machine without it and only the timeline fails, saying which paths it tried.
//
// Process-wide state, forced by CUPTI: its buffer callbacks are plain C functions without a user pointer, and
// the library attaches to the driver (it is never unloaded). Both live in one guarded place in
// kernel_timeline.cpp; at most one KernelTimeline records at a time (start() refuses a second).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/kernel_timeline_stats.h"
#include "core/status.h"

namespace cedar::cuda {

class KernelTimeline {
 public:
  // Loads CUPTI (once per process), registers the record buffers and enables kernel records. Errors: the
  // library not found (every path tried), a missing entry point, CUPTI's own error string, another timeline
  // already recording.
  static Result<KernelTimeline> start();

  KernelTimeline(KernelTimeline&&) noexcept;
  KernelTimeline& operator=(KernelTimeline&&) noexcept;
  ~KernelTimeline();  // stops recording (records discarded) if stop_and_collect was not called

  // Waits for the device (cudaDeviceSynchronize), then CUPTI's timestamp — the clock of the records: kernels
  // launched after the call start after the stamp. Bench / tests stamp between steps (split_steps).
  Result<uint64_t> synchronize_and_stamp() const;

  // Waits for the device, disables the records, flushes CUPTI's buffers and returns every kernel recorded
  // since start(), sorted by start. Errors name the CUPTI call; records CUPTI dropped (buffers full) are an
  // error too (the timeline would have holes).
  Result<std::vector<KernelRecord>> stop_and_collect();

  struct Collector;  // the records of one recording (kernel_timeline.cpp)

 private:
  KernelTimeline() = default;
  std::unique_ptr<Collector> collector_;
};

// The CUPTI library's version (cuptiGetVersion), loading it if needed; errors as KernelTimeline::start.
// Needs no GPU.
Result<uint32_t> cupti_version();

}  // namespace cedar::cuda
