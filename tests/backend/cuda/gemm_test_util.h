// Shared helpers of the prefill-GEMM parity tests (gemm_*_cutest.cpp): device buffers, random
// bf16 activations and quantized weights in the released formats, Σ|terms| error bounds computed by
// the CPU oracle itself (cpu::linear of |W| and |x|), and the shared expert's SwiGLU GEMM check that
// the tiled and the cuBLASLt paths both run.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/gemm_kernels.h"
#include "core/numeric.h"
#include "core/threads.h"
#include "cuda_test_util.h"
#include "model/moe.h"

// Skips (printing why) when cuBLASLt cannot be loaded here; else binds `ctx` to a BlasContext.
#define CEDAR_REQUIRE_BLAS(ctx)                                        \
  auto ctx##_r = BlasContext::create();                                \
  if (!ctx##_r.ok()) {                                                 \
    std::printf("[  SKIP    ] %s\n", ctx##_r.error().message.c_str()); \
    GTEST_SKIP() << ctx##_r.error().message;                           \
  }                                                                    \
  BlasContext& ctx = **ctx##_r

namespace cedar::cuda::testing {

// The CPU oracle's thread pool (all hardware threads), shared by the GEMM tests.
inline ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

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

// The device view of a quantized weight uploaded to `data` / `scales`.
inline QuantWeightView device_view(const QuantWeightHost& w, const DeviceBuffer<uint8_t>& data,
                                   const DeviceBuffer<uint8_t>& scales) {
  return QuantWeightView{
      .format = w.cpu.format == WeightFormat::MXFP4 ? QuantWeightFormat::MXFP4 : QuantWeightFormat::FP8Block,
      .out = w.cpu.out,
      .in = w.cpu.in,
      .data = data.get(),
      .scales = scales.get(),
      .block_out = w.cpu.block_out,
      .block_in = w.cpu.block_in};
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

// The shared expert in prefill: swiglu_gemm (W1, W3, SwiGLU, FP8 quantization of h) then quant_gemm
// (W2), on random weights (FP8 or MXFP4, scales from 2^-15), bf16 activations, optional row weights
// and a clamp limit at the median |g| (about half of the gate values clamp). `swiglu` and `w2`
// complete the calls with the path's own fields and scratch (kept alive by the caller) and launch
// them; `path` names the path in the tag. Three checks: (1) h against the CPU's h (bf16 g/u, clamps,
// silu, weight) quantized the same way — equal except where a bf16 rounding of g/u or the float
// rounding of exp falls the other way (rare; at most 0.1 % of the values may differ, an indexing or
// formula bug changes most of them); (2) W2 of the GPU's h against cpu::linear of the same h
// (`w2_tol`, the path's GEMM tolerance); (3) end to end against expert_forward (NMSE).
struct SwigluShape {
  bool fp4 = false;
  int64_t inter = 0, d = 0, m = 0, act_block = 32;
  bool weighted = false;
  uint32_t seed = 0;
};
inline void check_swiglu_expert(const SwigluShape& s, const std::string& name, const std::string& path,
                                const Tolerance& w2_tol, const std::function<Status(SwigluGemmArgs&)>& swiglu,
                                const std::function<Status(QuantGemmArgs&)>& w2) {
  const int64_t inter = s.inter, d = s.d, m = s.m, act_block = s.act_block;
  auto mk = [&](int64_t out, int64_t in, uint32_t seed) {
    return s.fp4 ? random_mxfp4_weight(out, in, seed, 112)
                 : random_fp8_weight(out, in, act_block == 128 ? 128 : 32, seed, 112);
  };
  const QuantWeightHost w1 = mk(inter, d, s.seed), w3 = mk(inter, d, s.seed + 1), w2w = mk(d, inter, s.seed + 2);
  const auto x = random_acts(static_cast<size_t>(m * d), s.seed + 3, 0x1p-2f);
  std::vector<float> row_w;
  if (s.weighted) {
    std::mt19937 rng(s.seed + 4);
    std::uniform_real_distribution<float> ud(0.05f, 1.5f);
    for (int64_t t = 0; t < m; ++t) row_w.push_back(ud(rng));
  }
  // Clamp limit at the median |g|: about half of the gate values are clamped.
  std::vector<float> g(static_cast<size_t>(m * inter));
  ASSERT_TRUE(cpu::linear(w1.cpu, x, m, g, {.bf16_output = true, .act_block = act_block}, &pool()).ok());
  std::vector<float> ag = abs_values(g);
  std::nth_element(ag.begin(), ag.begin() + ag.size() / 2, ag.end());
  const float limit = round_to_bf16(std::max(ag[ag.size() / 2], 1e-3f));
  const auto h_want = cpu_swiglu_h(w1.cpu, w3.cpu, x, m, act_block, row_w, limit, &pool());

  auto d1 = upload(w1.data), s1 = upload(w1.scales), d3 = upload(w3.data), s3 = upload(w3.scales);
  auto d2 = upload(w2w.data), s2 = upload(w2w.scales);
  auto dx = upload(x);
  auto drw = upload(row_w);
  auto dxc = alloc<uint16_t>(static_cast<size_t>(m * d));
  auto dxs = alloc<float>(static_cast<size_t>(m * d / act_block));
  auto dhc = alloc<uint16_t>(static_cast<size_t>(m * inter));
  auto dhs = alloc<float>(static_cast<size_t>(m * inter / act_block));
  auto dy = alloc<float>(static_cast<size_t>(m * d));
  ASSERT_TRUE(quantize_act_fp8_blocked(dx.get(), m, d, act_block, dxc.get(), dxs.get(), nullptr).ok());
  SwigluGemmArgs a{.w1 = device_view(w1, d1, s1),
                   .w3 = device_view(w3, d3, s3),
                   .act_codes = dxc.get(),
                   .act_scales = dxs.get(),
                   .m = m,
                   .act_block = act_block,
                   .row_weights = s.weighted ? drw.get() : nullptr,
                   .swiglu_limit = limit,
                   .h_codes = dhc.get(),
                   .h_scales = dhs.get()};
  Status st = swiglu(a);
  ASSERT_TRUE(st.ok()) << st.error().message;
  QuantGemmArgs b{.w = device_view(w2w, d2, s2),
                  .act_codes = dhc.get(),
                  .act_scales = dhs.get(),
                  .m = m,
                  .act_block = act_block,
                  .y = dy.get(),
                  .bf16_output = true};
  st = w2(b);
  ASSERT_TRUE(st.ok()) << st.error().message;

  const std::string tag = name + " inter=" + std::to_string(inter) + " d=" + std::to_string(d) +
                          " m=" + std::to_string(m) + " " + path + " L=" + std::to_string(limit);
  const auto hc = download(dhc);
  const auto hs = download(dhs);
  std::string first;
  const size_t bad = quantized_mismatches(hc, hs, h_want, act_block, &first);
  std::printf("PARITY %-60s h: %zu / %zu quantized values differ from the CPU's%s%s\n", tag.c_str(), bad, hc.size(),
              bad ? ", first " : "", first.c_str());
  EXPECT_LE(bad, std::max<size_t>(2, hc.size() / 1000)) << tag << ": first " << first;

  // (2) W2 over the GPU's own h.
  const auto h_gpu = dequantize_rows(hc, hs, act_block);
  const auto ref2 = reference_rows(w2w, h_gpu, m, 0, d, act_block, true, &pool());
  const auto y = download(dy);
  EXPECT_TRUE(parity(tag + " W2", y, ref2.want, w2_tol, ref2.bound));

  // (3) End to end against the CPU expert.
  ExpertWeights e{w1.cpu, w2w.cpu, w3.cpu};
  MoeParams p;
  p.swiglu_limit = limit;
  p.act_block = act_block;
  std::vector<float> want(static_cast<size_t>(m * d));
  ASSERT_TRUE(expert_forward(e, x, m, row_w, p, want, &pool()).ok());
  const Tolerance e2e{.max_nmse = 1e-5, .min_cosine = 0.99999, .rel = 1e30, .abs = 0};  // statistics only
  EXPECT_TRUE(parity(tag + " vs expert_forward", y, want, e2e));
  std::printf("EXACT  %-60s %zu / %zu outputs bit-equal to expert_forward\n", tag.c_str(), count_equal(y, want),
              y.size());
}

}  // namespace cedar::cuda::testing
