// Shared helpers of the CUDA tests: a GPU gate that skips (printing why) when no usable device is
// present, and a parity report against the CPU oracle (NMSE, cosine, worst element, first mismatch).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cuda/device_info.h"
#include "backend/cuda/kernels.h"

namespace cedar::cuda::testing {

// Empty when the kernels can run here; otherwise the reason they cannot.
inline std::string gpu_unavailable_reason() {
  static const std::string reason = [] {
    auto rt = query_runtime();
    if (!rt.ok()) return rt.error().message;
    if (rt->devices.empty()) return std::string("no CUDA device visible");
    if (Status s = check_kernels_loadable(); !s.ok())
      return "kernels cannot load on " + rt->devices[0].name + ": " + s.error().message;
    return std::string();
  }();
  return reason;
}

#define CEDAR_REQUIRE_GPU()                                                          \
  do {                                                                               \
    const std::string cedar_reason_ = ::cedar::cuda::testing::gpu_unavailable_reason(); \
    if (!cedar_reason_.empty()) {                                                    \
      std::printf("[  SKIP    ] no usable GPU: %s\n", cedar_reason_.c_str());        \
      GTEST_SKIP() << "no usable GPU: " << cedar_reason_;                            \
    }                                                                                \
  } while (0)

// The Engram token map of the model tests: $CEDAR_ENGRAM_MAP, the source tree's asset, or ./assets (the
// device runs the tests from a copy of the repository root, where the compiled-in source path is absent).
inline std::filesystem::path engram_map_path() {
  if (const char* env = std::getenv("CEDAR_ENGRAM_MAP")) return env;
  const std::filesystem::path rel = std::filesystem::path("assets") / "engram" / "deepseek_v41_token_map.npy";
  if (std::filesystem::exists(std::filesystem::path(CEDAR_SOURCE_DIR) / rel))
    return std::filesystem::path(CEDAR_SOURCE_DIR) / rel;
  return std::filesystem::absolute(rel);
}

struct Tolerance {
  double max_nmse = 1e-5;     // Σ(g−w)² / Σw²
  double min_cosine = 0.99999;
  double rel = 0.0;           // per element: |g − w| <= abs + rel·|w| + bound_scale·bound[i]
  double abs = 0.0;
  double bound_scale = 0.0;   // with a per-element error bound (e.g. Σ|terms| of a dot product)
};

// The block-scaled (FP8 / MXFP4) GEMV and GEMM tolerance. Every product q_a·q_w is exact on both sides; the block
// sums are formed by the tensor core (whose fp32 accumulation keeps fewer bits than IEEE, ~2^-13 relative to
// Σ|terms| at worst) and the blocks are summed in another order (K splits, warps). So per element: one bf16 rounding
// flip (2^-7·|y|) plus 2^-12·Σ|terms| (the bound the references return).
inline constexpr Tolerance kBlockSumTol{.max_nmse = 1e-5, .min_cosine = 0.99999, .rel = 0x1p-7, .abs = 0, .bound_scale = 0x1p-12};

// Compares got (GPU) with want (CPU oracle); prints one PARITY line (the numbers docs/cuda-log.md quotes).
inline ::testing::AssertionResult parity(const std::string& what, const std::vector<float>& got,
                                         const std::vector<float>& want, const Tolerance& tol,
                                         const std::vector<float>& bound = {}) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " values vs " << want.size();
  double err2 = 0, ref2 = 0, dot = 0, got2 = 0, max_abs = 0;
  size_t mismatches = 0, first = got.size(), worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i], e = std::fabs(g - w);
    err2 += (g - w) * (g - w);
    ref2 += w * w;
    got2 += g * g;
    dot += g * w;
    if (e > max_abs || std::isnan(e)) {
      max_abs = e;
      worst = i;
    }
    const double allowed = tol.abs + tol.rel * std::fabs(w) + (bound.empty() ? 0.0 : tol.bound_scale * bound[i]);
    if (!(e <= allowed)) {
      if (mismatches == 0) first = i;
      ++mismatches;
    }
  }
  const double nmse = ref2 > 0 ? err2 / ref2 : err2;
  const double cosine = (ref2 > 0 && got2 > 0) ? dot / std::sqrt(ref2 * got2) : (err2 == 0 ? 1.0 : 0.0);
  std::printf("PARITY %-40s n=%zu nmse=%.3e cosine=%.9f max_abs=%.3e (at %zu: gpu %.9g cpu %.9g) mismatches=%zu\n",
              what.c_str(), got.size(), nmse, cosine, max_abs, worst, got.empty() ? 0.0 : got[worst],
              want.empty() ? 0.0 : want[worst], mismatches);
  if (mismatches > 0 || !(nmse <= tol.max_nmse) || !(cosine >= tol.min_cosine)) {
    auto f = ::testing::AssertionFailure();
    f << what << ": nmse " << nmse << " (max " << tol.max_nmse << "), cosine " << cosine << " (min "
      << tol.min_cosine << "), " << mismatches << " elements out of tolerance";
    if (first < got.size())
      f << "; first mismatch at " << first << ": gpu " << got[first] << " cpu " << want[first];
    return f;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace cedar::cuda::testing
