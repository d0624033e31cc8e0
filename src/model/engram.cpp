// Engram module forward (engram.h): table gather + dequant, wkv FP8 linear, per-(token, stream) gate.
#include "model/engram.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/numeric.h"

namespace cedar {
namespace {

constexpr int64_t kScaleBlock = 32;  // channels per table scale byte

// Sum of squares in index order (fp32), as 1/sqrt(mean + eps).
float rsqrt_mean_square(const float* x, int64_t d, float eps) {
  float ss = x[0] * x[0];
  for (int64_t c = 1; c < d; ++c) ss += x[c] * x[c];
  return 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
}

Status check_forward_args(std::span<float> X, int64_t n, std::span<const int64_t> rows,
                          std::span<const uint8_t> is_image, const EngramWeights& w, const EngramParams& p) {
  auto fail = [](const std::string& m) { return make_error("Engram: " + m); };
  if (p.hc <= 0 || p.dim <= 0 || p.n_cols <= 0 || p.token_block <= 0)
    return fail("bad parameters hc=" + std::to_string(p.hc) + " dim=" + std::to_string(p.dim) +
                " n_cols=" + std::to_string(p.n_cols) + " token_block=" + std::to_string(p.token_block));
  if (w.head_dim <= 0 || w.head_dim % kScaleBlock != 0)
    return fail("head_dim " + std::to_string(w.head_dim) + " is not a positive multiple of 32");
  if (w.rows <= 0 || w.table == nullptr) return fail("no table");
  if (w.table_format != WeightFormat::FP8Rows && w.table_format != WeightFormat::BF16)
    return fail(std::string("table format ") + std::string(weight_format_name(w.table_format)) +
                " is not fp8_rows or bf16");
  if (w.table_format == WeightFormat::FP8Rows && w.table_scale == nullptr) return fail("FP8 table without scales");
  if (n < 0 || static_cast<int64_t>(X.size()) != n * p.hc * p.dim)
    return fail("X has " + std::to_string(X.size()) + " values for " + std::to_string(n) + " tokens × " +
                std::to_string(p.hc) + " × " + std::to_string(p.dim));
  if (static_cast<int64_t>(rows.size()) != n * p.n_cols)
    return fail("rows has " + std::to_string(rows.size()) + " entries, expected " + std::to_string(n * p.n_cols));
  if (!is_image.empty() && static_cast<int64_t>(is_image.size()) != n)
    return fail(std::to_string(is_image.size()) + " image flags for " + std::to_string(n) + " tokens");
  if (w.wkv.in != p.n_cols * w.head_dim || w.wkv.out != (p.hc + 1) * p.dim)
    return fail("wkv is [" + std::to_string(w.wkv.out) + ", " + std::to_string(w.wkv.in) + "], expected [" +
                std::to_string((p.hc + 1) * p.dim) + ", " + std::to_string(p.n_cols * w.head_dim) + "]");
  if (static_cast<int64_t>(w.q_weight.size()) != p.hc * p.dim || static_cast<int64_t>(w.k_weight.size()) != p.hc * p.dim)
    return fail("q_weight / k_weight have " + std::to_string(w.q_weight.size()) + " / " +
                std::to_string(w.k_weight.size()) + " values, expected " + std::to_string(p.hc * p.dim));
  return Status::Ok();
}

}  // namespace

float engram_gate(float dot) {
  const float magnitude = std::sqrt(std::max(std::fabs(dot), 1e-6f));
  const float signed_root = std::copysign(magnitude, dot);  // dot = +0 → +1e-3, −0 → −1e-3
  return 1.0f / (1.0f + std::exp(-signed_root));
}

Status engram_gather(std::span<const int64_t> rows, const EngramWeights& w, std::span<float> E) {
  const int64_t hd = w.head_dim, n_scales = w.head_dim / kScaleBlock;
  if (hd <= 0 || hd % kScaleBlock != 0 || static_cast<int64_t>(E.size()) != static_cast<int64_t>(rows.size()) * hd)
    return make_error("Engram gather: " + std::to_string(E.size()) + " outputs for " + std::to_string(rows.size()) +
                      " rows of head_dim " + std::to_string(hd));
  for (size_t col = 0; col < rows.size(); ++col) {
    const int64_t r = rows[col];
    if (r < 0 || r >= w.rows)
      return make_error("Engram gather: row " + std::to_string(r) + " (column " + std::to_string(col) +
                        ") is outside the table of " + std::to_string(w.rows) + " rows");
    float* out = E.data() + static_cast<int64_t>(col) * hd;
    if (w.table_format == WeightFormat::BF16) {
      const uint8_t* bytes = w.table + r * hd * 2;
      for (int64_t c = 0; c < hd; ++c)
        out[c] = bf16_to_f32(static_cast<uint16_t>(bytes[2 * c] | (bytes[2 * c + 1] << 8)));  // little-endian
      continue;
    }
    if (w.table_scale == nullptr) return make_error("Engram gather: FP8 table without scales");
    const uint8_t* codes = w.table + r * hd;
    const uint8_t* scales = w.table_scale + r * n_scales;
    for (int64_t c = 0; c < hd; ++c) out[c] = round_to_bf16(e4m3_to_f32(codes[c]) * ue8m0_to_f32(scales[c / kScaleBlock]));
  }
  return Status::Ok();
}

Status engram_forward(std::span<float> X, int64_t n, std::span<const int64_t> rows, std::span<const uint8_t> is_image,
                      const EngramWeights& w, const EngramParams& p, ThreadPool* pool) {
  CEDAR_RETURN_IF_ERROR(check_forward_args(X, n, rows, is_image, w, p));
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] < 0 || rows[i] >= w.rows)
      return make_error("Engram: row " + std::to_string(rows[i]) + " of token " + std::to_string(static_cast<int64_t>(i) / p.n_cols) +
                        " is outside the table of " + std::to_string(w.rows) + " rows");

  const int64_t hc = p.hc, d = p.dim, width = hc * d, e_width = p.n_cols * w.head_dim, kv_width = (hc + 1) * d;
  const float eps = static_cast<float>(p.norm_eps);
  const float inv_sqrt_d = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  std::vector<float> qk(static_cast<size_t>(width));  // q_weight ⊙ k_weight, fp32
  for (int64_t i = 0; i < width; ++i) qk[i] = w.q_weight[i] * w.k_weight[i];

  const int64_t block = std::min(p.token_block, std::max<int64_t>(n, 1));
  std::vector<float> E(static_cast<size_t>(block * e_width)), kv(static_cast<size_t>(block * kv_width));
  for (int64_t t0 = 0; t0 < n; t0 += block) {
    const int64_t m = std::min(block, n - t0);
    auto gather = [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t)  // rows were range-checked above
        (void)engram_gather(rows.subspan(static_cast<size_t>((t0 + t) * p.n_cols), static_cast<size_t>(p.n_cols)), w,
                            std::span<float>(E).subspan(static_cast<size_t>(t * e_width), static_cast<size_t>(e_width)));
    };
    if (pool) pool->parallel_for(m, gather);
    else gather(0, m);

    const std::span<float> kv_m(kv.data(), static_cast<size_t>(m * kv_width));
    CEDAR_RETURN_IF_ERROR(cpu::linear(w.wkv, std::span<const float>(E.data(), static_cast<size_t>(m * e_width)), m,
                                      kv_m, cpu::LinearOptions{.bf16_output = true, .act_block = 32}, pool));

    auto update = [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t) {
        const bool image = !is_image.empty() && is_image[t0 + t];
        const float* value = kv.data() + t * kv_width + hc * d;
        for (int64_t k = 0; k < hc; ++k) {
          float* x = X.data() + (t0 + t) * width + k * d;
          const float* key = kv.data() + t * kv_width + k * d;
          const float* wk = qk.data() + k * d;
          float sum = x[0] * wk[0] * key[0];
          for (int64_t c = 1; c < d; ++c) sum += x[c] * wk[c] * key[c];
          const float rstd = rsqrt_mean_square(x, d, eps) * rsqrt_mean_square(key, d, eps);
          const float dot = sum * rstd * inv_sqrt_d;
          const float g = image ? 0.0f : engram_gate(dot);
          for (int64_t c = 0; c < d; ++c) x[c] = round_to_bf16(x[c] + g * value[c]);
        }
      }
    };
    if (pool) pool->parallel_for(m, update);
    else update(0, m);
  }
  return Status::Ok();
}

}  // namespace cedar
