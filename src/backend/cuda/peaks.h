// Peak throughputs of the current GPU, measured in the same run as a benchmark so its achieved GB/s
// and TFLOP/s are ratios to what this device delivers now (clocks, power, driver): cuBLASLt GEMMs at
// a large square shape in bf16 and in FP8 e4m3 (the copy bandwidth is measure_copy_bandwidth,
// kernels.h). C++17 (included from .cu files).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace cedar::cuda {

struct GemmPeak {
  std::string dtype;  // "bf16" or "fp8_e4m3"
  int64_t m = 0, n = 0, k = 0;
  int iterations = 0;
  double ms_per_gemm = 0;  // mean over the timed iterations (after warm-up)
  double tflops = 0;       // 2·m·n·k / time
  std::string error;       // non-empty: this GEMM could not run here (e.g. no FP8 algorithm); the rest is 0
};

struct GemmPeaks {
  GemmPeak bf16, fp8;
};

// D[m, n] (bf16) = Aᵀ·B, A [k, m] and B [k, n] column-major ("TN", the layout cuBLASLt's FP8 path
// requires), fp32 accumulation, operands filled with pseudo-random finite values (data-dependent
// power makes all-zero operands unrepresentatively fast). m = n = k = `size` (a multiple of 16).
// Errors: allocation or a failing bf16 GEMM; an FP8 failure is reported in fp8.error instead.
Result<GemmPeaks> measure_gemm_peaks(int64_t size, int iterations);

}  // namespace cedar::cuda
