#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "core/numeric.h"

namespace cedar::cpu {
namespace {

// Per-token FP8 activation quantization of one block (§3.1): UE8M0 scale from the clamped amax,
// e4m3 codes of x/s. Returns the scale exponent byte; writes decoded code values (exact floats).
uint8_t quantize_act_block(std::span<const float> x, std::span<float> q_values) {
  float amax = 1e-4f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const uint8_t sbits = ue8m0_ceil_pow2(amax * (1.0f / 448.0f));
  const float s = ue8m0_to_f32(sbits);
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = std::clamp(x[i] / s, -448.0f, 448.0f);
    q_values[i] = e4m3_to_f32(f32_to_e4m3(v));
  }
  return sbits;
}

// A row narrower than the activation block is one block (tiny V4 models: d = 64 < 128; the
// reference itself requires in % block == 0, so this never changes a released-size GEMM).
int64_t act_block_of(const LinearWeight& w, const LinearOptions& opt) { return std::min(opt.act_block, w.in); }

Status check_shapes(const LinearWeight& w, std::span<const float> x, int64_t n, std::span<float> y,
                    const LinearOptions& opt_in) {
  LinearOptions opt = opt_in;
  opt.act_block = act_block_of(w, opt_in);
  if (w.out <= 0 || w.in <= 0 || w.data == nullptr) return make_error("linear: empty weight");
  if (static_cast<int64_t>(x.size()) != n * w.in)
    return make_error("linear: input has " + std::to_string(x.size()) + " values, expected " + std::to_string(n) +
                      "×" + std::to_string(w.in));
  if (static_cast<int64_t>(y.size()) != n * w.out)
    return make_error("linear: output has " + std::to_string(y.size()) + " values, expected " +
                      std::to_string(n) + "×" + std::to_string(w.out));
  if (w.format == WeightFormat::FP8Block || w.format == WeightFormat::MXFP4) {
    if (w.scale == nullptr) return make_error("linear: quantized weight without scale");
    if (opt.act_block <= 0 || w.in % opt.act_block != 0)
      return make_error("linear: in=" + std::to_string(w.in) + " is not a multiple of the activation block " +
                        std::to_string(opt.act_block));
    if (w.format == WeightFormat::FP8Block && (w.block_in % opt.act_block != 0 || w.block_out <= 0))
      return make_error("linear: weight block " + std::to_string(w.block_in) +
                        " is not a multiple of the activation block " + std::to_string(opt.act_block));
    if (w.format == WeightFormat::MXFP4 && (w.in % 32 != 0 || opt.act_block % 32 != 0))
      return make_error("linear: MXFP4 needs in and the activation block to be multiples of 32");
  } else if (w.format != WeightFormat::BF16 && w.format != WeightFormat::F32) {
    return make_error(std::string("linear: unsupported weight format ") + std::string(weight_format_name(w.format)));
  }
  return Status::Ok();
}

// Decodes one weight row to exact fp32 code values (quantized formats: without the block scale).
void load_row(const LinearWeight& w, int64_t r, std::vector<float>& row) {
  row.resize(static_cast<size_t>(w.in));
  switch (w.format) {
    case WeightFormat::BF16: {
      const auto* p = w.data + 2 * r * w.in;
      for (int64_t c = 0; c < w.in; ++c) row[c] = bf16_to_f32(static_cast<uint16_t>(p[2 * c] | (p[2 * c + 1] << 8)));
      break;
    }
    case WeightFormat::F32: {
      const auto* p = reinterpret_cast<const float*>(w.data) + r * w.in;
      std::copy(p, p + w.in, row.begin());
      break;
    }
    case WeightFormat::FP8Block: {
      const auto* p = w.data + r * w.in;
      for (int64_t c = 0; c < w.in; ++c) row[c] = e4m3_to_f32(p[c]);
      break;
    }
    case WeightFormat::MXFP4: {
      const std::span<const uint8_t> packed(w.data + r * (w.in / 2), static_cast<size_t>(w.in / 2));
      for (int64_t c = 0; c < w.in; ++c) row[c] = e2m1_to_f32(e2m1_get(packed, static_cast<size_t>(c)));
      break;
    }
    default:
      break;
  }
}

// Scale of weight row r for the activation block starting at column k0.
float weight_scale(const LinearWeight& w, int64_t r, int64_t k0) {
  if (w.format == WeightFormat::FP8Block) {
    const int64_t cols = (w.in + w.block_in - 1) / w.block_in;
    return ue8m0_to_f32(w.scale[(r / w.block_out) * cols + k0 / w.block_in]);
  }
  return ue8m0_to_f32(w.scale[r * (w.in / 32) + k0 / 32]);  // MXFP4: one scale per 32 along K
}

}  // namespace

Status linear(const LinearWeight& w, std::span<const float> x, int64_t n, std::span<float> y,
              const LinearOptions& opt, ThreadPool* pool) {
  CEDAR_RETURN_IF_ERROR(check_shapes(w, x, n, y, opt));
  const bool quantized = w.format == WeightFormat::FP8Block || w.format == WeightFormat::MXFP4;
  // Quantized formats: activation codes (as exact floats) and one scale per (token, block).
  const int64_t ab = quantized ? act_block_of(w, opt) : w.in;
  const int64_t n_blocks = w.in / ab;
  std::vector<float> xq(x.begin(), x.end());
  std::vector<float> xs(static_cast<size_t>(n * n_blocks), 1.0f);
  if (quantized) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t b = 0; b < n_blocks; ++b) {
        const size_t off = static_cast<size_t>(t * w.in + b * ab);
        xs[static_cast<size_t>(t * n_blocks + b)] = ue8m0_to_f32(quantize_act_block(
            x.subspan(off, static_cast<size_t>(ab)), std::span<float>(xq).subspan(off, static_cast<size_t>(ab))));
      }
  }
  auto rows = [&](int64_t r0, int64_t r1) {
    std::vector<float> row;
    for (int64_t r = r0; r < r1; ++r) {
      load_row(w, r, row);
      for (int64_t t = 0; t < n; ++t) {
        const float* xt = xq.data() + t * w.in;
        float acc = 0.0f;
        if (!quantized) {
          for (int64_t c = 0; c < w.in; ++c) acc += xt[c] * row[c];
        } else {
          for (int64_t b = 0; b < n_blocks; ++b) {
            float partial = 0.0f;
            for (int64_t c = b * ab; c < (b + 1) * ab; ++c) partial += xt[c] * row[c];
            // Within an activation block the weight scale is constant (checked: block_in % ab == 0
            // for FP8; MXFP4 scales per 32 and ab % 32 == 0 means sub-blocks: handle generally).
            if (w.format == WeightFormat::MXFP4 && ab != 32) {
              partial = 0.0f;
              for (int64_t c0 = b * ab; c0 < (b + 1) * ab; c0 += 32) {
                float sub = 0.0f;
                for (int64_t c = c0; c < c0 + 32; ++c) sub += xt[c] * row[c];
                partial += sub * weight_scale(w, r, c0);
              }
              acc += partial * xs[static_cast<size_t>(t * n_blocks + b)];
            } else {
              acc += partial * xs[static_cast<size_t>(t * n_blocks + b)] * weight_scale(w, r, b * ab);
            }
          }
        }
        y[static_cast<size_t>(t * w.out + r)] = opt.bf16_output ? round_to_bf16(acc) : acc;
      }
    }
  };
  if (pool) pool->parallel_for(w.out, rows, 16);
  else rows(0, w.out);
  return Status::Ok();
}

void rms_norm(std::span<const float> x, int64_t dim, std::span<const float> weight, double eps, std::span<float> y) {
  const int64_t n = static_cast<int64_t>(x.size()) / dim;
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x.data() + t * dim;
    float ss = 0.0f;
    for (int64_t c = 0; c < dim; ++c) ss += xt[c] * xt[c];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(dim) + static_cast<float>(eps));
    for (int64_t c = 0; c < dim; ++c) {
      const float v = xt[c] * r;
      y[static_cast<size_t>(t * dim + c)] = round_to_bf16(weight.empty() ? v : weight[c] * v);
    }
  }
}

RopeTable::RopeTable(const RopeConfig& cfg) : rope_dim_(cfg.rope_dim) {
  const int64_t half = cfg.rope_dim / 2;
  inv_freq_.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq_[i] = 1.0f / std::pow(static_cast<float>(cfg.base), static_cast<float>(2 * i) / static_cast<float>(cfg.rope_dim));
  if (cfg.original_max_position > 0 && cfg.yarn_factor != 1.0) {
    // YaRN (§3.1): f ← f/factor·ramp + f·(1−ramp), ramp rising from 0 at index `low` (fast
    // rotations keep their frequency) to 1 at `high` (slow ones are interpolated). No mscale.
    const double dim = static_cast<double>(cfg.rope_dim);
    auto corr = [&](double rotations) {
      return dim * std::log(static_cast<double>(cfg.original_max_position) / (rotations * 2.0 * std::numbers::pi)) /
             (2.0 * std::log(cfg.base));
    };
    const double low = std::max(std::floor(corr(cfg.beta_fast)), 0.0);
    const double high = std::min(std::ceil(corr(cfg.beta_slow)), dim - 1.0);
    const double span = std::max(high - low, 1e-3);
    for (int64_t i = 0; i < half; ++i) {
      const float ramp = static_cast<float>(std::clamp((static_cast<double>(i) - low) / span, 0.0, 1.0));
      const float f = inv_freq_[i];
      inv_freq_[i] = f / static_cast<float>(cfg.yarn_factor) * ramp + f * (1.0f - ramp);
    }
  }
}

void RopeTable::apply(std::span<float> x, int64_t n_vec, int64_t width, int64_t pos, bool inverse) const {
  const int64_t half = rope_dim_ / 2;
  const int64_t start = width - rope_dim_;
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq_[i];
    const float c = std::cos(angle);
    const float s = inverse ? -std::sin(angle) : std::sin(angle);
    for (int64_t v = 0; v < n_vec; ++v) {
      float* p = x.data() + v * width + start + 2 * i;
      const float e = p[0], o = p[1];
      p[0] = round_to_bf16(e * c - o * s);
      p[1] = round_to_bf16(e * s + o * c);
    }
  }
}

void round_bf16(std::span<float> x) {
  for (float& v : x) v = round_to_bf16(v);
}

}  // namespace cedar::cpu
