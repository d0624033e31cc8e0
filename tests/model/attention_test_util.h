// Test helpers for the attention module: random bf16 data, FP8 / BF16 LinearWeights built with the
// core/numeric.h quantizers, and a tiny V4.1 configuration with every CSA2 mode.
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/numeric.h"
#include "io/config.h"
#include "model/attention.h"
#include "model/layer_plan.h"

namespace cedar::test {

inline std::vector<float> random_bf16(size_t n, uint32_t seed, float stddev = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = round_to_bf16(d(rng));
  return v;
}

// Owns the bytes behind LinearWeights and norm vectors (deque: stable addresses).
class WeightStore {
 public:
  // Block-FP8 weight (32×32 blocks, UE8M0 scales) from random N(0, stddev) values.
  cpu::LinearWeight fp8(int64_t out, int64_t in, uint32_t seed, float stddev) {
    const auto w = random_bf16(static_cast<size_t>(out * in), seed, stddev);
    const int64_t sr = (out + 31) / 32, sc = (in + 31) / 32;
    auto& codes = bytes_.emplace_back(static_cast<size_t>(out * in));
    auto& scales = bytes_.emplace_back(static_cast<size_t>(sr * sc));
    for (int64_t br = 0; br < sr; ++br)
      for (int64_t bc = 0; bc < sc; ++bc) {
        float amax = 0.0f;
        for (int64_t r = br * 32; r < std::min(out, br * 32 + 32); ++r)
          for (int64_t c = bc * 32; c < std::min(in, bc * 32 + 32); ++c) amax = std::max(amax, std::fabs(w[r * in + c]));
        const uint8_t sb = ue8m0_ceil_pow2(std::max(amax, 1e-30f) / 448.0f);
        scales[static_cast<size_t>(br * sc + bc)] = sb;
        const float s = ue8m0_to_f32(sb);
        for (int64_t r = br * 32; r < std::min(out, br * 32 + 32); ++r)
          for (int64_t c = bc * 32; c < std::min(in, bc * 32 + 32); ++c)
            codes[static_cast<size_t>(r * in + c)] = f32_to_e4m3(w[r * in + c] / s);
      }
    return {.format = WeightFormat::FP8Block, .out = out, .in = in, .data = codes.data(), .scale = scales.data()};
  }
  // BF16 weight from random N(0, stddev) values.
  cpu::LinearWeight bf16(int64_t out, int64_t in, uint32_t seed, float stddev) {
    const auto w = random_bf16(static_cast<size_t>(out * in), seed, stddev);
    auto& b = bytes_.emplace_back(w.size() * 2);
    for (size_t i = 0; i < w.size(); ++i) {
      const uint16_t v = f32_to_bf16(w[i]);
      b[2 * i] = static_cast<uint8_t>(v & 0xFF);
      b[2 * i + 1] = static_cast<uint8_t>(v >> 8);
    }
    return {.format = WeightFormat::BF16, .out = out, .in = in, .data = b.data()};
  }
  std::span<const float> vec(size_t n, uint32_t seed, float stddev, float mean) {
    return floats_.emplace_back(random_bf16(n, seed, stddev, mean));
  }

 private:
  std::deque<std::vector<uint8_t>> bytes_;
  std::deque<std::vector<float>> floats_;
};

// Dequantized [out, in] values of a LinearWeight (BF16 / F32 / FP8Block).
inline std::vector<double> dequantize(const cpu::LinearWeight& w) {
  std::vector<double> v(static_cast<size_t>(w.out * w.in));
  for (int64_t r = 0; r < w.out; ++r)
    for (int64_t c = 0; c < w.in; ++c) {
      const size_t i = static_cast<size_t>(r * w.in + c);
      switch (w.format) {
        case WeightFormat::BF16: v[i] = bf16_to_f32(static_cast<uint16_t>(w.data[2 * i] | (w.data[2 * i + 1] << 8))); break;
        case WeightFormat::F32: v[i] = reinterpret_cast<const float*>(w.data)[i]; break;
        case WeightFormat::FP8Block: {
          const int64_t cols = (w.in + w.block_in - 1) / w.block_in;
          v[i] = double(e4m3_to_f32(w.data[i])) * ue8m0_to_f32(w.scale[(r / w.block_out) * cols + c / w.block_in]);
          break;
        }
        default: v[i] = NAN;
      }
    }
  return v;
}

// tests/data/configs/tiny_v41 with a small window / top-k so that rings wrap and selections bite:
// layers 0–1 SWA only, 2 Full (ratio 2), 3–4 Reuse, 5 Full (ratio 1, candidate source), 6 Reuse,
// 7 Reindex (restricted to 5's candidate blocks).
inline ModelConfig tiny_config() {
  auto c = load_model_config(std::string(CEDAR_TEST_DATA_DIR) + "/configs/tiny_v41");
  if (!c.ok()) return {};
  ModelConfig cfg = *c;
  cfg.sliding_window = 8;
  cfg.index_topk = 4;
  cfg.candidate_block_size = 2;
  cfg.candidate_topk_blocks = 3;
  return cfg;
}

// Random attention weights of one layer, shaped for its role.
inline AttentionWeights random_layer_weights(WeightStore& ws, const AttentionParams& p, const LayerRole& role,
                                             uint32_t seed) {
  const auto s = [&](int k) { return seed * 100u + static_cast<uint32_t>(k); };
  const float rd = 1.0f / std::sqrt(static_cast<float>(p.dim));
  AttentionWeights w;
  w.wq_a = ws.fp8(p.q_lora, p.dim, s(1), rd);
  w.wq_b = ws.fp8(p.n_heads * p.head_dim, p.q_lora, s(2), 1.0f / std::sqrt(static_cast<float>(p.q_lora)));
  w.wkv = ws.fp8(p.head_dim, p.dim, s(3), rd);
  const int64_t in_g = p.n_heads * p.head_dim / p.o_groups;
  w.wo_a = ws.bf16(p.o_groups * p.o_lora, in_g, s(4), 1.0f / std::sqrt(static_cast<float>(in_g)));
  w.wo_b = ws.fp8(p.dim, p.o_groups * p.o_lora, s(5), 1.0f / std::sqrt(static_cast<float>(p.o_groups * p.o_lora)));
  w.q_norm = ws.vec(static_cast<size_t>(p.q_lora), s(6), 0.1f, 1.0f);
  w.kv_norm = ws.vec(static_cast<size_t>(p.head_dim), s(7), 0.1f, 1.0f);
  w.attn_sink = ws.vec(static_cast<size_t>(p.n_heads), s(8), 1.0f, 0.0f);
  if (role.owns_compressor) {
    w.wkv_c = ws.bf16(p.head_dim, p.dim, s(9), rd);
    if (role.compressor_has_gate) w.wgate_c = ws.bf16(p.head_dim, p.dim, s(10), rd);
    w.norm_c = ws.vec(static_cast<size_t>(p.head_dim), s(11), 0.1f, 1.0f);
  }
  if (role.owns_indexer_keys) {
    w.wk = ws.bf16(p.index_head_dim, p.head_dim, s(12), 1.0f / std::sqrt(static_cast<float>(p.head_dim)));
    w.k_norm = ws.vec(static_cast<size_t>(p.index_head_dim), s(13), 0.1f, 1.0f);
  }
  if (role.owns_indexer) {
    w.wq_b_i = ws.fp8(p.index_heads * p.index_head_dim, p.q_lora, s(14), 1.0f / std::sqrt(static_cast<float>(p.q_lora)));
    w.weights_proj = ws.bf16(p.index_heads, p.dim, s(15), rd);
  }
  return w;
}

}  // namespace cedar::test
