// Single-Pass mHC (manifold-constrained hyper-connections), architecture.md §3.3: the coefficient
// predictor H(X; fn, base, scale) with its Sinkhorn projection, and the collapse / expand of the hc
// residual streams. CPU reference numerics (the oracle for the CUDA kernels): fp32 throughout, sums
// in index order, bf16 rounding only where the reference stores bf16 (collapse and expand outputs).
//
// Op order follows the official reference (R-model `Block.hc_mixes`, R-kernel `hc_split_sinkhorn`):
//   m    = (fn · v) · rsqrt(mean(v²) + norm_eps)          v = flatten(X), stream-major; RMS factor AFTER the GEMV
//   pre  = sigmoid(m[k]·scale[0] + base[k]) + hc_eps
//   post = 2·sigmoid(m[hc+k]·scale[1] + base[hc+k])
//   comb = softmax_k(m[2hc + j·hc + k]·scale[2] + base[...]) + hc_eps, then a column normalization
//          (÷ (Σ_j + hc_eps)), then (sinkhorn_iters − 1) × [row (÷ (Σ_k + hc_eps)), column].
// (HF normalizes v before the GEMV instead: same math, different rounding — §6 item 14.)
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/threads.h"

namespace cedar {

struct HcWeights {
  std::span<const float> fn;     // [(2+hc)*hc, hc*d]  (24 × 20480 for hc = 4, d = 5120)
  std::span<const float> base;   // [(2+hc)*hc]
  std::span<const float> scale;  // [3]
};

struct HcParams {
  int64_t hc = 4;
  int64_t dim = 0;  // d, the width of one stream
  int64_t sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double norm_eps = 1e-20;  // rms_norm_eps of the config (V4.1: 1e-20)
};

// Coefficients of one mHC site for one token.
struct HcMix {
  std::vector<float> pre;   // [hc]: collapse weights (consumed by the NEXT site: single pass)
  std::vector<float> post;  // [hc]: expand weights of the sublayer output
  std::vector<float> comb;  // [hc*hc], comb[j*hc + k]: weight of input stream j in output stream k
};

// Checks the weight shapes against the parameters (call once when binding weights).
Status check_hc_weights(const HcWeights& w, const HcParams& p);

// Per token: X is [hc*d] (stream-major, bf16 values). Returns the site's coefficients (§3.3 steps 1–5).
// Preconditions: check_hc_weights(w, p) passed and X.size() == hc*d.
HcMix hc_mix(std::span<const float> X, const HcWeights& w, const HcParams& p);

// hc_mix for n tokens X [n, hc*d] into out[n], parallel over tokens.
Status hc_mix_rows(std::span<const float> X, int64_t n, const HcWeights& w, const HcParams& p, std::span<HcMix> out,
                   ThreadPool* pool);

// out[d] = bf16(Σ_k a[k]·X_k), fp32 sum in stream order (one token; X [hc*d], a [hc]).
void hc_collapse(std::span<const float> X, std::span<const float> a, int64_t hc, int64_t d, std::span<float> out);

// X_out_k = bf16(post_k·y + Σ_j comb[j,k]·X_j), the Σ in fp32 in stream order (one token; y [d],
// X and X_out [hc*d]; X_out may be X itself: each channel is read fully before it is written).
void hc_expand(std::span<const float> y, std::span<const float> X, const HcMix& m, int64_t hc, int64_t d,
               std::span<float> X_out);

// V4's learned final collapse (`hc_head_*`, official V4 `ParallelHead.hc_head`): with
// m = (fn · v) · rsqrt(mean(v²) + norm_eps) over the flattened streams v (as in hc_mix),
// pre_k = sigmoid(m_k·scale + base_k) + hc_eps and out = bf16(Σ_k pre_k·X_k).
struct HcHeadWeights {
  std::span<const float> fn;     // [hc, hc*d]
  std::span<const float> base;   // [hc]
  std::span<const float> scale;  // [1]
};
Status check_hc_head_weights(const HcHeadWeights& w, const HcParams& p);
// One token: X [hc*d], out [d]. Preconditions: check_hc_head_weights passed.
void hc_head_collapse(std::span<const float> X, const HcHeadWeights& w, const HcParams& p, std::span<float> out);

}  // namespace cedar
