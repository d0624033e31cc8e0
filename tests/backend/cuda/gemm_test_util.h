// Shared helpers of the prefill-GEMM parity tests (gemm_*_cutest.cpp): device buffers, random
// bf16 activations and quantized weights in the released formats, and Σ|terms| error bounds computed by
// the CPU oracle itself (cpu::linear of |W| and |x|).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/device_buffer.h"
#include "core/numeric.h"

namespace cedar::cuda::testing {

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& v) {
  auto b = DeviceBuffer<T>::from_host(v);
  EXPECT_TRUE(b.ok()) << b.error().message;
  return b.ok() ? std::move(*b) : DeviceBuffer<T>();
}
template <typename T>
std::vector<T> download(const DeviceBuffer<T>& b) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto v = b.to_host();
  EXPECT_TRUE(v.ok()) << v.error().message;
  return v.ok() ? *v : std::vector<T>();
}
template <typename T>
DeviceBuffer<T> alloc(size_t n) {
  auto b = DeviceBuffer<T>::allocate(n);
  EXPECT_TRUE(b.ok()) << b.error().message;
  return b.ok() ? std::move(*b) : DeviceBuffer<T>();
}

// bf16 activations with a per-32-block magnitude spread (exercises many activation scales).
inline std::vector<float> random_acts(size_t n, uint32_t seed, float base = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-12, 8);
  std::vector<float> v(n);
  float scale = base;
  for (size_t i = 0; i < n; ++i) {
    if (i % 32 == 0) scale = base * std::ldexp(1.0f, ex(rng));
    v[i] = round_to_bf16(nd(rng) * scale);
  }
  return v;
}

// Fast deterministic bytes (weights of released shapes are hundreds of MB).
struct FastRng {
  uint64_t x;
  explicit FastRng(uint64_t seed) : x(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint32_t operator()() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return static_cast<uint32_t>(x >> 24);
  }
};

struct QuantWeightHost {
  cpu::LinearWeight cpu;
  std::vector<uint8_t> data, scales;
};

// scale_lo: smallest UE8M0 byte (scales 2^(scale_lo−127) .. 2^(scale_lo−120)).
inline QuantWeightHost random_fp8_weight(int64_t out, int64_t in, int64_t block, uint32_t seed,
                                         uint8_t scale_lo = 118) {
  FastRng rng(seed);
  QuantWeightHost w;
  w.data.resize(static_cast<size_t>(out * in));
  for (auto& c : w.data) {
    c = static_cast<uint8_t>(rng());
    if ((c & 0x7F) == 0x7F) c ^= 1;  // no NaN codes
  }
  const int64_t sr = (out + block - 1) / block, sc = (in + block - 1) / block;
  w.scales.resize(static_cast<size_t>(sr * sc));
  for (auto& s : w.scales) s = static_cast<uint8_t>(scale_lo + rng() % 8);
  w.cpu = {.format = WeightFormat::FP8Block,
           .out = out,
           .in = in,
           .data = w.data.data(),
           .scale = w.scales.data(),
           .block_out = block,
           .block_in = block};
  return w;
}

inline QuantWeightHost random_mxfp4_weight(int64_t out, int64_t in, uint32_t seed, uint8_t scale_lo = 118) {
  FastRng rng(seed);
  QuantWeightHost w;
  w.data.resize(static_cast<size_t>(out * in / 2));
  for (auto& c : w.data) c = static_cast<uint8_t>(rng());
  w.scales.resize(static_cast<size_t>(out * in / 32));
  for (auto& s : w.scales) s = static_cast<uint8_t>(scale_lo + rng() % 8);
  w.cpu = {.format = WeightFormat::MXFP4, .out = out, .in = in, .data = w.data.data(), .scale = w.scales.data()};
  return w;
}

// |W| of a quantized weight: sign bits cleared (e4m3 bit 7; e2m1 bit 3 of each nibble).
inline QuantWeightHost abs_weight(const QuantWeightHost& w) {
  QuantWeightHost a = w;
  for (auto& c : a.data) c &= (w.cpu.format == WeightFormat::MXFP4) ? 0x77 : 0x7F;
  a.cpu.data = a.data.data();
  a.cpu.scale = a.scales.data();
  return a;
}

// Rows [r0, r0 + count) of a quantized weight as a CPU view (r0 a multiple of the FP8 block_out).
inline cpu::LinearWeight weight_rows(const QuantWeightHost& w, int64_t r0, int64_t count) {
  cpu::LinearWeight v = w.cpu;
  v.out = count;
  if (w.cpu.format == WeightFormat::MXFP4) {
    v.data = w.data.data() + r0 * w.cpu.in / 2;
    v.scale = w.scales.data() + r0 * w.cpu.in / 32;
  } else {
    const int64_t cols = (w.cpu.in + w.cpu.block_in - 1) / w.cpu.block_in;
    v.data = w.data.data() + r0 * w.cpu.in;
    v.scale = w.scales.data() + (r0 / w.cpu.block_out) * cols;
  }
  return v;
}

inline std::vector<float> abs_values(const std::vector<float>& x) {
  std::vector<float> a(x.size());
  std::transform(x.begin(), x.end(), a.begin(), [](float v) { return std::fabs(v); });
  return a;
}

// CPU reference for output rows [r0, r0 + count) of every token, and Σ|q_a·q_w|·s_a·s_w for each
// (the FP8 recipe is symmetric, so |x| quantizes to the magnitudes of x's codes with the same scales).
struct RowsReference {
  int64_t r0 = 0, count = 0;
  std::vector<float> want, bound;  // [n, count]
};
inline RowsReference reference_rows(const QuantWeightHost& w, const std::vector<float>& x, int64_t n, int64_t r0,
                                    int64_t count, int64_t act_block, bool bf16_output, ThreadPool* pool) {
  RowsReference ref{r0, count, std::vector<float>(static_cast<size_t>(n * count)),
                    std::vector<float>(static_cast<size_t>(n * count))};
  const cpu::LinearOptions opt{.bf16_output = bf16_output, .act_block = act_block};
  EXPECT_TRUE(cpu::linear(weight_rows(w, r0, count), x, n, ref.want, opt, pool).ok());
  const QuantWeightHost aw = abs_weight(w);
  const cpu::LinearOptions raw{.bf16_output = false, .act_block = act_block};
  EXPECT_TRUE(cpu::linear(weight_rows(aw, r0, count), abs_values(x), n, ref.bound, raw, pool).ok());
  return ref;
}

// Columns [r0, r0 + count) of a row-major [n, ld] GPU output.
inline std::vector<float> columns(const std::vector<float>& y, int64_t n, int64_t ld, int64_t r0, int64_t count) {
  std::vector<float> out(static_cast<size_t>(n * count));
  for (int64_t t = 0; t < n; ++t) std::copy_n(y.begin() + t * ld + r0, count, out.begin() + t * count);
  return out;
}

inline size_t count_equal(const std::vector<float>& a, const std::vector<float>& b) {
  size_t same = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) same += a[i] == b[i];
  return same;
}

// IEEE binary16 bits → float (exact; the GPU stores each e4m3 code as its f16 value).
inline float half_bits_to_float(uint16_t h) {
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -24);
  if (exp == 31) return man ? NAN : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(man + 1024), exp - 25);
}

// cpu::linear's activation quantization of rows [n, width] in blocks of `block`: code values and
// scales (the values a GEMM multiplies).
struct QuantizedRows {
  std::vector<float> codes, scales;
};
inline QuantizedRows cpu_quantize_rows(const std::vector<float>& x, int64_t block) {
  QuantizedRows q{std::vector<float>(x.size()), std::vector<float>(x.size() / static_cast<size_t>(block))};
  for (size_t b = 0; b < q.scales.size(); ++b) {
    float amax = 1e-4f;
    for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b * block + i]));
    const float s = ue8m0_to_f32(ue8m0_ceil_pow2(amax * (1.0f / 448.0f)));
    q.scales[b] = s;
    for (int64_t i = 0; i < block; ++i)
      q.codes[b * block + i] = e4m3_to_f32(f32_to_e4m3(std::clamp(x[b * block + i] / s, -448.0f, 448.0f)));
  }
  return q;
}
// GPU codes (f16 bits) and scales → dequantized values code·scale.
inline std::vector<float> dequantize_rows(const std::vector<uint16_t>& codes, const std::vector<float>& scales,
                                          int64_t block) {
  std::vector<float> out(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) out[i] = half_bits_to_float(codes[i]) * scales[i / block];
  return out;
}

// model/moe.cpp's SwiGLU for rows x [m, d]: h = bf16(w · silu(min(g, L)) · clamp(u, ±L)), g/u the bf16
// outputs of the FP8/MXFP4 linears; row_weights empty: no weight.
inline std::vector<float> cpu_swiglu_h(const cpu::LinearWeight& w1, const cpu::LinearWeight& w3,
                                       const std::vector<float>& x, int64_t m, int64_t act_block,
                                       const std::vector<float>& row_weights, float limit, ThreadPool* pool) {
  const int64_t inter = w1.out;
  std::vector<float> g(static_cast<size_t>(m * inter)), u(g.size());
  const cpu::LinearOptions opt{.bf16_output = true, .act_block = act_block};
  EXPECT_TRUE(cpu::linear(w1, x, m, g, opt, pool).ok());
  EXPECT_TRUE(cpu::linear(w3, x, m, u, opt, pool).ok());
  for (int64_t t = 0; t < m; ++t)
    for (int64_t i = 0; i < inter; ++i) {
      const size_t at = static_cast<size_t>(t * inter + i);
      float gv = g[at], uv = u[at];
      if (limit > 0.0f) {
        gv = gv > limit ? limit : gv;
        uv = uv > limit ? limit : (uv < -limit ? -limit : uv);
      }
      float h = gv / (1.0f + std::exp(-gv)) * uv;
      if (!row_weights.empty()) h = row_weights[static_cast<size_t>(t)] * h;
      g[at] = round_to_bf16(h);
    }
  return g;
}

// Compares GPU-quantized rows (codes, scales) with the CPU's quantization of want_h; returns the
// number of values whose dequantized value differs.
inline size_t quantized_mismatches(const std::vector<uint16_t>& codes, const std::vector<float>& scales,
                                   const std::vector<float>& want_h, int64_t block, std::string* first) {
  const QuantizedRows q = cpu_quantize_rows(want_h, block);
  size_t bad = 0;
  for (size_t i = 0; i < codes.size(); ++i) {
    const float got = half_bits_to_float(codes[i]) * scales[i / block], want = q.codes[i] * q.scales[i / block];
    if (got != want && !(std::isnan(got) && std::isnan(want))) {
      if (bad++ == 0 && first)
        *first = "value " + std::to_string(i) + ": gpu " + std::to_string(got) + " cpu " + std::to_string(want) +
                 " (h " + std::to_string(want_h[i]) + ")";
    }
  }
  return bad;
}

}  // namespace cedar::cuda::testing
