#include "model/mhc.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/numeric.h"

namespace cedar {
namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// comb /= (Σ over the normalized axis + eps); rows: Σ_k for each j, else columns: Σ_j for each k.
void normalize(std::vector<float>& comb, int64_t hc, float eps, bool rows) {
  for (int64_t a = 0; a < hc; ++a) {
    auto at = [&](int64_t b) -> float& { return rows ? comb[a * hc + b] : comb[b * hc + a]; };
    float sum = at(0);
    for (int64_t b = 1; b < hc; ++b) sum += at(b);
    const float denom = sum + eps;
    for (int64_t b = 0; b < hc; ++b) at(b) = at(b) / denom;
  }
}

}  // namespace

Status check_hc_weights(const HcWeights& w, const HcParams& p) {
  if (p.hc <= 0 || p.dim <= 0) return make_error("mHC: hc=" + std::to_string(p.hc) + ", dim=" + std::to_string(p.dim));
  if (p.sinkhorn_iters < 1) return make_error("mHC: sinkhorn_iters must be >= 1, got " + std::to_string(p.sinkhorn_iters));
  const int64_t mix = (2 + p.hc) * p.hc;
  auto bad = [](const char* what, size_t got, int64_t want) {
    return make_error(std::string("mHC: ") + what + " has " + std::to_string(got) + " values, expected " +
                      std::to_string(want));
  };
  if (static_cast<int64_t>(w.fn.size()) != mix * p.hc * p.dim) return bad("fn", w.fn.size(), mix * p.hc * p.dim);
  if (static_cast<int64_t>(w.base.size()) != mix) return bad("base", w.base.size(), mix);
  if (w.scale.size() != 3) return bad("scale", w.scale.size(), 3);
  return Status::Ok();
}

HcMix hc_mix(std::span<const float> X, const HcWeights& w, const HcParams& p) {
  const int64_t hc = p.hc, width = p.hc * p.dim, n_mix = (2 + hc) * hc;
  const float hc_eps = static_cast<float>(p.hc_eps);

  // Step 1–2: one rsqrt(mean square) over the flattened streams, applied after the GEMV.
  float ss = 0.0f;
  for (int64_t c = 0; c < width; ++c) ss += X[c] * X[c];
  const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(width) + static_cast<float>(p.norm_eps));
  std::vector<float> m(static_cast<size_t>(n_mix));
  for (int64_t i = 0; i < n_mix; ++i) {
    const float* row = w.fn.data() + i * width;
    float acc = 0.0f;
    for (int64_t c = 0; c < width; ++c) acc += row[c] * X[c];
    m[i] = acc * rstd;
  }

  HcMix out;
  out.pre.resize(static_cast<size_t>(hc));
  out.post.resize(static_cast<size_t>(hc));
  out.comb.resize(static_cast<size_t>(hc * hc));
  for (int64_t k = 0; k < hc; ++k) {
    out.pre[k] = sigmoid(m[k] * w.scale[0] + w.base[k]) + hc_eps;                   // step 3
    out.post[k] = 2.0f * sigmoid(m[hc + k] * w.scale[1] + w.base[hc + k]);         // step 4
  }
  // Step 5: softmax over k for each row j, + eps; then Sinkhorn (column first, column last).
  for (int64_t j = 0; j < hc; ++j) {
    float* row = out.comb.data() + j * hc;
    for (int64_t k = 0; k < hc; ++k) row[k] = m[2 * hc + j * hc + k] * w.scale[2] + w.base[2 * hc + j * hc + k];
    float mx = row[0];
    for (int64_t k = 1; k < hc; ++k) mx = std::max(mx, row[k]);
    float sum = 0.0f;
    for (int64_t k = 0; k < hc; ++k) {
      row[k] = std::exp(row[k] - mx);
      sum += row[k];
    }
    for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / sum + hc_eps;
  }
  normalize(out.comb, hc, hc_eps, /*rows=*/false);
  for (int64_t it = 1; it < p.sinkhorn_iters; ++it) {
    normalize(out.comb, hc, hc_eps, /*rows=*/true);
    normalize(out.comb, hc, hc_eps, /*rows=*/false);
  }
  return out;
}

Status hc_mix_rows(std::span<const float> X, int64_t n, const HcWeights& w, const HcParams& p, std::span<HcMix> out,
                   ThreadPool* pool) {
  CEDAR_RETURN_IF_ERROR(check_hc_weights(w, p));
  const int64_t width = p.hc * p.dim;
  if (n < 0 || static_cast<int64_t>(X.size()) != n * width || static_cast<int64_t>(out.size()) != n)
    return make_error("mHC: " + std::to_string(X.size()) + " stream values and " + std::to_string(out.size()) +
                      " outputs for " + std::to_string(n) + " tokens of width " + std::to_string(width));
  auto run = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) out[t] = hc_mix(X.subspan(t * width, width), w, p);
  };
  if (pool) pool->parallel_for(n, run);
  else run(0, n);
  return Status::Ok();
}

void hc_collapse(std::span<const float> X, std::span<const float> a, int64_t hc, int64_t d, std::span<float> out) {
  for (int64_t c = 0; c < d; ++c) {
    float acc = a[0] * X[c];
    for (int64_t k = 1; k < hc; ++k) acc += a[k] * X[k * d + c];
    out[c] = round_to_bf16(acc);
  }
}

void hc_expand(std::span<const float> y, std::span<const float> X, const HcMix& m, int64_t hc, int64_t d,
               std::span<float> X_out) {
  std::vector<float> channel(static_cast<size_t>(hc));
  for (int64_t c = 0; c < d; ++c) {
    for (int64_t k = 0; k < hc; ++k) {
      float mixed = m.comb[k] * X[c];  // j = 0
      for (int64_t j = 1; j < hc; ++j) mixed += m.comb[j * hc + k] * X[j * d + c];
      channel[k] = round_to_bf16(m.post[k] * y[c] + mixed);
    }
    for (int64_t k = 0; k < hc; ++k) X_out[k * d + c] = channel[k];
  }
}

Status check_hc_head_weights(const HcHeadWeights& w, const HcParams& p) {
  if (p.hc <= 0 || p.dim <= 0)
    return make_error("hc_head: hc=" + std::to_string(p.hc) + ", dim=" + std::to_string(p.dim));
  if (static_cast<int64_t>(w.fn.size()) != p.hc * p.hc * p.dim || static_cast<int64_t>(w.base.size()) != p.hc ||
      w.scale.size() != 1)
    return make_error("hc_head: fn/base/scale have " + std::to_string(w.fn.size()) + "/" +
                      std::to_string(w.base.size()) + "/" + std::to_string(w.scale.size()) + " values, expected " +
                      std::to_string(p.hc * p.hc * p.dim) + "/" + std::to_string(p.hc) + "/1");
  return Status::Ok();
}

void hc_head_collapse(std::span<const float> X, const HcHeadWeights& w, const HcParams& p, std::span<float> out) {
  const int64_t hc = p.hc, width = p.hc * p.dim;
  float ss = 0.0f;
  for (int64_t c = 0; c < width; ++c) ss += X[c] * X[c];
  const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(width) + static_cast<float>(p.norm_eps));
  std::vector<float> pre(static_cast<size_t>(hc));
  for (int64_t k = 0; k < hc; ++k) {
    const float* row = w.fn.data() + k * width;
    float acc = 0.0f;
    for (int64_t c = 0; c < width; ++c) acc += row[c] * X[c];
    pre[k] = sigmoid(acc * rstd * w.scale[0] + w.base[k]) + static_cast<float>(p.hc_eps);
  }
  hc_collapse(X, pre, hc, p.dim, out);
}

}  // namespace cedar
