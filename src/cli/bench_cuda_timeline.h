// `cedar bench --device cuda --timeline STEPS` (bench_cuda_timeline.cpp): the decode step's kernel timeline
// from CUPTI records (backend/cuda/kernel_timeline.h) — per step wall / busy / idle / overlap, per kernel name
// total and exposed time, and one middle layer's kernel sequence. docs/cuda-log.md "Kernel timeline".
#pragma once

#ifdef CEDAR_HAVE_CUDA
#include <cstdint>
#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_model.h"

namespace cedar::cli {

struct DecodeTimelineOptions {
  int64_t batch = 1;
  int64_t steps = 8;           // recorded graph replays, after two warm-up steps
  double untraced_step_s = 0;  // the decode row's TPOT, printed next to the traced step (0: unknown)
  int64_t top_kernels = 40;    // rows of the printed per-name table (the JSON holds every name)
};

// Records `steps` decode steps of `batch` forks of `base` and prints the analysis on stderr; the JSON of it.
// Never fails the bench: an error (CUPTI missing or failing, a step failing) is printed as one line and is
// the JSON's "error".
nlohmann::ordered_json bench_decode_timeline(cuda::CudaModel& m, const cuda::CudaSequence& base,
                                             const DecodeTimelineOptions& o);

}  // namespace cedar::cli
#endif
