// Test-only double-precision reference of the MoE FFN (architecture.md §3.8), written from the spec
// without cedar's numeric helpers: its own weight decoders (E2M1 / E4M3 / UE8M0 / BF16 bit layouts),
// its own bf16 and e4m3 round-to-nearest-even (via frexp/nearbyint on doubles) and its own FP8
// activation quantization. Every GEMM accumulates in double; the spec's rounding points (bf16 GEMM
// outputs, bf16 SwiGLU output, bf16 result) are applied to the double values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/ops.h"
#include "model/moe.h"

namespace cedar::moe_ref {

// Round to the nearest value with `bits` significant bits whose exponent is at least min_exp (the
// smallest normal's frexp exponent; below it the spacing stays fixed: subnormals), ties to even.
inline double round_sig(double v, int bits, int min_exp) {
  if (v == 0.0 || !std::isfinite(v)) return v;
  int e = 0;
  std::frexp(v, &e);  // v = m·2^e, 0.5 <= |m| < 1
  const double ulp = std::ldexp(1.0, std::max(e, min_exp) - bits);
  return std::nearbyint(v / ulp) * ulp;  // default rounding mode: ties to even
}
inline double bf16(double v) { return round_sig(v, 8, -125); }                      // 8 significant bits
inline double e4m3(double v) { return std::clamp(round_sig(v, 4, -5), -448.0, 448.0); }  // normals >= 2^-6

inline double dec_bf16(const uint8_t* p) {
  const uint32_t bits = static_cast<uint32_t>(p[0] | (p[1] << 8)) << 16;
  float f = 0;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline double dec_e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}
inline double dec_e2m1(uint8_t code) {
  static const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}
inline double dec_ue8m0(uint8_t b) { return std::ldexp(1.0, static_cast<int>(b) - 127); }

struct Dense {
  int64_t out = 0, in = 0;
  bool quantized = false;  // FP8/MXFP4: activations are FP8-quantized before the product
  std::vector<double> w;   // [out, in]
};

inline Dense dequantize(const cpu::LinearWeight& lw) {
  Dense d{lw.out, lw.in, false, std::vector<double>(static_cast<size_t>(lw.out * lw.in))};
  for (int64_t r = 0; r < lw.out; ++r)
    for (int64_t c = 0; c < lw.in; ++c) {
      double v = 0;
      switch (lw.format) {
        case WeightFormat::BF16: v = dec_bf16(lw.data + 2 * (r * lw.in + c)); break;
        case WeightFormat::F32: v = reinterpret_cast<const float*>(lw.data)[r * lw.in + c]; break;
        case WeightFormat::MXFP4: {
          const uint8_t byte = lw.data[r * (lw.in / 2) + c / 2];
          v = dec_e2m1(c % 2 == 0 ? byte & 0xF : byte >> 4) * dec_ue8m0(lw.scale[r * (lw.in / 32) + c / 32]);
          d.quantized = true;
          break;
        }
        case WeightFormat::FP8Block: {
          const int64_t cols = (lw.in + lw.block_in - 1) / lw.block_in;
          v = dec_e4m3(lw.data[r * lw.in + c]) * dec_ue8m0(lw.scale[(r / lw.block_out) * cols + c / lw.block_in]);
          d.quantized = true;
          break;
        }
        default: break;
      }
      d.w[static_cast<size_t>(r * lw.in + c)] = v;
    }
  return d;
}

// FP8 activation quantization of one row (§3.1): per block, s = 2^ceil(log2(fp32(amax)·fp32(1/448)))
// with amax clamped at 1e-4, value = e4m3(clamp(x/s, ±448))·s.
inline std::vector<double> act_quant(const std::vector<double>& x, int64_t block) {
  std::vector<double> q(x.size());
  for (size_t b0 = 0; b0 < x.size(); b0 += static_cast<size_t>(block)) {
    double amax = 1e-4;
    for (size_t i = b0; i < b0 + block; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float t = static_cast<float>(amax) * (1.0f / 448.0f);
    const double s = std::exp2(std::ceil(std::log2(static_cast<double>(t))));
    for (size_t i = b0; i < b0 + block; ++i) q[i] = e4m3(std::clamp(x[i] / s, -448.0, 448.0)) * s;
  }
  return q;
}

// One token row through a linear layer; bf16-rounded like the reference's `linear`.
inline std::vector<double> linear_row(const Dense& w, const std::vector<double>& x, int64_t act_block) {
  const std::vector<double> xq = w.quantized ? act_quant(x, act_block) : x;
  std::vector<double> y(static_cast<size_t>(w.out));
  for (int64_t r = 0; r < w.out; ++r) {
    double acc = 0;
    for (int64_t c = 0; c < w.in; ++c) acc += xq[c] * w.w[static_cast<size_t>(r * w.in + c)];
    y[r] = bf16(acc);
  }
  return y;
}

struct Expert {
  Dense w1, w2, w3;
};
inline Expert dequantize(const ExpertWeights& e) { return {dequantize(e.w1), dequantize(e.w2), dequantize(e.w3)}; }

// SwiGLU element (§3.8): bf16(w · silu(min(g, L)) · clamp(u, −L, L)); no clamps when L <= 0.
inline double swiglu(double g, double u, double w, double limit) {
  if (limit > 0) {
    g = std::min(g, limit);
    u = std::clamp(u, -limit, limit);
  }
  return bf16(w * (g / (1.0 + std::exp(-g))) * u);
}

inline std::vector<double> expert_row(const Expert& e, const std::vector<double>& x, double w, double limit,
                                      int64_t act_block) {
  const auto g = linear_row(e.w1, x, act_block), u = linear_row(e.w3, x, act_block);
  std::vector<double> h(g.size());
  for (size_t i = 0; i < g.size(); ++i) h[i] = swiglu(g[i], u[i], w, limit);
  return linear_row(e.w2, h, act_block);
}

struct Route {
  std::vector<double> scores;    // [E]
  std::vector<int64_t> experts;  // [K]
  std::vector<double> weights;   // [K]
  double margin = INFINITY;      // biased-score gap between the k-th and (k+1)-th candidate
};

struct RouterSpec {
  std::vector<double> gate;  // [E, d]
  std::vector<double> bias;  // [E] (empty: none)
  int64_t topk = 0;
  double route_scale = 1, gate_temp = 1;
  bool norm = true;
};

// Selection by biased score (descending; lower id first on exact ties), or a fixed hash row.
inline Route route(const RouterSpec& r, const std::vector<double>& x, const int64_t* hash_row = nullptr) {
  const auto E = static_cast<int64_t>(r.gate.size() / x.size());
  const auto d = static_cast<int64_t>(x.size());
  Route out;
  out.scores.resize(static_cast<size_t>(E));
  std::vector<double> biased(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    double l = 0;
    for (int64_t c = 0; c < d; ++c) l += x[c] * r.gate[static_cast<size_t>(e * d + c)];
    l /= r.gate_temp;
    out.scores[e] = std::sqrt(l > 20 ? l : std::log1p(std::exp(l)));
    biased[e] = out.scores[e] + (r.bias.empty() ? 0.0 : r.bias[e]);
  }
  if (hash_row != nullptr) {
    out.experts.assign(hash_row, hash_row + r.topk);
  } else {
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return biased[a] > biased[b]; });
    out.experts.assign(order.begin(), order.begin() + r.topk);
    if (r.topk < E) out.margin = biased[order[r.topk - 1]] - biased[order[r.topk]];
  }
  double sum = 0;
  for (int64_t e : out.experts) sum += out.scores[e];
  for (int64_t e : out.experts)
    out.weights.push_back((r.norm ? out.scores[e] / (sum + 1e-20) : out.scores[e]) * r.route_scale);
  return out;
}

struct Layer {
  RouterSpec router;
  std::vector<double> bias_vl;  // [E] or empty
  std::vector<Expert> experts;
  Expert shared;
  double limit = 0;
  int64_t act_block = 32;
};

// y (bf16 values) for one token; `margin` receives the router's selection margin.
inline std::vector<double> moe_row(const Layer& L, const std::vector<double>& x, bool image, const int64_t* hash_row,
                                   double* margin = nullptr) {
  RouterSpec r = L.router;
  if (image) r.bias = L.bias_vl;
  const Route rt = route(r, x, hash_row);
  if (margin) *margin = rt.margin;
  std::vector<double> y(x.size(), 0.0);
  for (size_t k = 0; k < rt.experts.size(); ++k) {
    const auto ye = expert_row(L.experts[rt.experts[k]], x, rt.weights[k], L.limit, L.act_block);
    for (size_t c = 0; c < y.size(); ++c) y[c] += ye[c];
  }
  const auto ys = expert_row(L.shared, x, 1.0, L.limit, L.act_block);
  for (size_t c = 0; c < y.size(); ++c) y[c] = bf16(y[c] + ys[c]);
  return y;
}

}  // namespace cedar::moe_ref
