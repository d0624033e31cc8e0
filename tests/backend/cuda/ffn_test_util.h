// Helpers of the cuda-ffn parity tests: device buffers from host vectors, random bf16 activations
// and quantized weights in the released formats, |W| views for rounding bounds.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/ffn_kernels.h"
#include "core/numeric.h"
#include "cuda_test_util.h"

namespace cedar::cuda::ffn_testing {

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& v) {
  auto b = DeviceBuffer<T>::from_host(v);
  EXPECT_TRUE(b.ok()) << b.error().message;
  return b.ok() ? std::move(*b) : DeviceBuffer<T>();
}
template <typename T>
std::vector<T> download(const DeviceBuffer<T>& b) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
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

// bf16 activations with a per-32-block magnitude spread (many activation scales).
inline std::vector<float> random_acts(size_t n, uint32_t seed, float base = 1.0f, int ex_lo = -12, int ex_hi = 8) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(ex_lo, ex_hi);
  std::vector<float> v(n);
  float scale = base;
  for (size_t i = 0; i < n; ++i) {
    if (i % 32 == 0) scale = base * std::ldexp(1.0f, ex(rng));
    v[i] = round_to_bf16(nd(rng) * scale);
  }
  return v;
}

// bf16 values N(0, sigma) as fp32 and as bits.
inline std::vector<float> random_bf16(size_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = round_to_bf16(nd(rng));
  return v;
}
inline std::vector<uint16_t> bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  std::transform(v.begin(), v.end(), b.begin(), [](float x) { return f32_to_bf16(x); });
  return b;
}

struct QuantWeightHost {
  cpu::LinearWeight cpu;
  std::vector<uint8_t> data, scales;
  // Rebinds cpu.data / cpu.scale after a copy or move.
  void bind() {
    cpu.data = data.data();
    cpu.scale = scales.data();
  }
};

// scale_lo..scale_lo+7 exponent bytes (118: 2^-9).
inline QuantWeightHost random_fp8_weight(int64_t out, int64_t in, uint32_t seed, uint8_t scale_lo = 118) {
  std::mt19937 rng(seed);
  QuantWeightHost w;
  w.data.resize(out * in);
  for (auto& c : w.data) {
    c = static_cast<uint8_t>(rng());
    if ((c & 0x7F) == 0x7F) c ^= 1;  // no NaN codes
  }
  w.scales.resize(((out + 31) / 32) * ((in + 31) / 32));
  for (auto& s : w.scales) s = static_cast<uint8_t>(scale_lo + rng() % 8);
  w.cpu = {.format = WeightFormat::FP8Block, .out = out, .in = in, .block_out = 32, .block_in = 32};
  w.bind();
  return w;
}

inline QuantWeightHost random_mxfp4_weight(int64_t out, int64_t in, uint32_t seed, uint8_t scale_lo = 118) {
  std::mt19937 rng(seed);
  QuantWeightHost w;
  w.data.resize(out * in / 2);
  for (auto& c : w.data) c = static_cast<uint8_t>(rng());
  w.scales.resize(out * in / 32);
  for (auto& s : w.scales) s = static_cast<uint8_t>(scale_lo + rng() % 8);
  w.cpu = {.format = WeightFormat::MXFP4, .out = out, .in = in};
  w.bind();
  return w;
}

// |W|: sign bits cleared (e4m3 bit 7; e2m1 bit 3 of each nibble).
inline QuantWeightHost abs_weight(const QuantWeightHost& w) {
  QuantWeightHost a = w;
  for (auto& c : a.data) c &= (w.cpu.format == WeightFormat::MXFP4) ? 0x77 : 0x7F;
  a.bind();
  return a;
}

// Σ|q_a·q_w|·s_a·s_w per output of a quantized linear (the CPU linear of |W| and |x|: the FP8 recipe is
// symmetric, so |x| quantizes to the magnitudes of x's codes with the same scales).
inline std::vector<float> abs_bound(const QuantWeightHost& w, const std::vector<float>& x, int64_t n) {
  std::vector<float> ax(x.size()), out(n * w.cpu.out);
  std::transform(x.begin(), x.end(), ax.begin(), [](float v) { return std::fabs(v); });
  const QuantWeightHost aw = abs_weight(w);
  EXPECT_TRUE(cpu::linear(aw.cpu, ax, n, out, {.bf16_output = false}, nullptr).ok());
  return out;
}

inline QuantWeightView view_of(const QuantWeightHost& w, const uint8_t* data, const uint8_t* scales) {
  return QuantWeightView{
      .format = w.cpu.format == WeightFormat::MXFP4 ? QuantWeightFormat::MXFP4 : QuantWeightFormat::FP8Block,
      .out = w.cpu.out,
      .in = w.cpu.in,
      .data = data,
      .scales = scales,
      .block_out = w.cpu.block_out,
      .block_in = w.cpu.block_in};
}

// IEEE binary16 bits → float (exact; the GPU stores each e4m3 activation code as its f16 value).
inline float half_bits_to_float(uint16_t h) {
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -24);
  if (exp == 31) return man ? NAN : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(man + 1024), exp - 25);
}

// Number of positions where two float vectors differ as values (−0 == +0; NaN never equal).
inline size_t count_unequal(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += a[i] == b[i] ? 0 : 1;
  return bad;
}

}  // namespace cedar::cuda::ffn_testing
