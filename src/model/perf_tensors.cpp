// Values of the perf profile (tiny_config.cpp): every tensor expected_weights() lists, as streamed
// tensors (io::StreamedTensor) so a ~24 GB checkpoint is generated and written in parallel, chunk by
// chunk, without holding a tensor in memory.
//
// Speed comes from tables: each tensor's values are offset + scale · z with z from a fixed quantile
// table of an approximately normal variable; the table is mapped once per (format, role, scale) to the
// stored codes (e4m3 bytes, packed e2m1 pairs, bf16 or f32 bits), so generating a value is a table
// lookup indexed by 16 random bits (8 for e2m1). Quantized weights use one UE8M0 scale per tensor: the
// power of two the released quantizer would choose for a block holding the table's largest value, so
// codes span the format's range, never saturate and are never NaN (0x7F / 0xFF). Each row's random
// stream is seeded by (seed, tensor name, row): the bytes do not depend on the thread count or on how
// rows are split into chunks.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/numeric.h"
#include "model/tiny_checkpoint.h"
#include "model/tiny_roles.h"
#include "model/weights.h"

namespace cedar {
namespace {

using namespace tiny_detail;  // NOLINT(google-build-using-namespace): the shared role rules

// Quantiles of S = a + b + c + d for four independent uniform bytes (Irwin–Hall of order 4 on the
// lattice 0..1020), spread uniformly within each lattice step and standardized. Integer arithmetic
// plus exactly rounded double operations only, so every IEEE-754 machine gets the same values.
// Support ≈ ±3.4 at 16-bit resolution (tails lighter than a normal's, which keeps every code finite).
class LatticeNormal {
 public:
  LatticeNormal() {
    std::vector<uint64_t> one(256, 1);
    const std::vector<uint64_t> two = convolve(one, one);
    counts_ = convolve(two, two);  // 1021 entries summing to 2^32
    cdf_.assign(counts_.size() + 1, 0);
    for (size_t s = 0; s < counts_.size(); ++s) cdf_[s + 1] = cdf_[s] + counts_[s];
  }
  // The quantile at probability (2i + 1) / (2n), i < n, n a power of two <= 2^31.
  double at(uint64_t i, uint64_t n) const {
    const uint64_t target = (2 * i + 1) * ((uint64_t{1} << 31) / n);  // probability × 2^32, exact
    const size_t s = static_cast<size_t>(std::upper_bound(cdf_.begin(), cdf_.end(), target) - cdf_.begin()) - 1;
    const double frac = static_cast<double>(target - cdf_[s]) / static_cast<double>(counts_[s]);
    const double x = static_cast<double>(s) + frac - 0.5;  // lattice value s spread over [s - ½, s + ½)
    return (x - 510.0) / std::sqrt(21845.0 + 1.0 / 12.0);  // mean 510, variance 4·(256²−1)/12 + 1/12
  }

 private:
  static std::vector<uint64_t> convolve(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
    std::vector<uint64_t> c(a.size() + b.size() - 1, 0);
    for (size_t i = 0; i < a.size(); ++i)
      for (size_t j = 0; j < b.size(); ++j) c[i + j] += a[i] * b[j];
    return c;
  }
  std::vector<uint64_t> counts_, cdf_;
};

// z values of the 16-bit and 8-bit tables.
struct Quantiles {
  std::vector<double> z16, z8;
  Quantiles() {
    const LatticeNormal q;
    z16.resize(65536);
    for (uint64_t i = 0; i < z16.size(); ++i) z16[i] = q.at(i, 65536);
    z8.resize(256);
    for (uint64_t i = 0; i < z8.size(); ++i) z8[i] = q.at(i, 256);
  }
};

// A tensor's value → stored-bytes table and, for quantized formats, its UE8M0 scale byte.
struct CodeTable {
  WeightFormat format = WeightFormat::F32;
  uint8_t scale_byte = 127;
  std::vector<uint8_t> bytes;  // FP8Block / FP8Rows: e4m3 [65536]; MXFP4: packed pair [65536]
  std::vector<uint16_t> bf16;  // BF16 [65536]
  std::vector<float> f32;      // F32 [65536]
};

double max_abs(const std::vector<double>& z, const Affine& a) {
  double m = 0;
  for (double v : z) m = std::max(m, std::fabs(a.offset + a.scale * v));
  return m;
}

CodeTable make_table(WeightFormat format, const Affine& a, const Quantiles& q) {
  CodeTable t;
  t.format = format;
  switch (format) {
    case WeightFormat::FP8Block:
    case WeightFormat::FP8Rows: {
      t.scale_byte = ue8m0_ceil_pow2(static_cast<float>(max_abs(q.z16, a)) / 448.0f);
      const float s = ue8m0_to_f32(t.scale_byte);
      t.bytes.resize(65536);
      for (size_t i = 0; i < 65536; ++i)
        t.bytes[i] = f32_to_e4m3(static_cast<float>(a.offset + a.scale * q.z16[i]) / s);
      break;
    }
    case WeightFormat::MXFP4: {
      t.scale_byte = ue8m0_ceil_pow2(static_cast<float>(max_abs(q.z8, a)) / 6.0f);
      const float s = ue8m0_to_f32(t.scale_byte);
      std::array<uint8_t, 256> nibble{};
      for (size_t i = 0; i < 256; ++i) nibble[i] = f32_to_e2m1(static_cast<float>(a.offset + a.scale * q.z8[i]) / s);
      t.bytes.resize(65536);  // low byte of the index → low nibble (element 2i), high byte → element 2i+1
      for (size_t i = 0; i < 65536; ++i) t.bytes[i] = static_cast<uint8_t>(nibble[i & 255] | (nibble[i >> 8] << 4));
      break;
    }
    case WeightFormat::BF16:
      t.bf16.resize(65536);
      for (size_t i = 0; i < 65536; ++i) t.bf16[i] = f32_to_bf16(static_cast<float>(a.offset + a.scale * q.z16[i]));
      break;
    default:
      t.f32.resize(65536);
      for (size_t i = 0; i < 65536; ++i) t.f32[i] = static_cast<float>(a.offset + a.scale * q.z16[i]);
      break;
  }
  return t;
}

constexpr uint64_t kRowStride = 0xD1B54A32D192ED03ull;  // odd: rows get distinct, well-mixed states

// Fills `n` elements of `elem_bytes` each: four 16-bit table indices per 64-bit draw.
template <typename T>
void fill_row(uint64_t state, const T* table, size_t n, uint8_t* out) {
  size_t i = 0;
  T v[4];
  for (; i + 4 <= n; i += 4) {
    const uint64_t r = splitmix64(state);
    v[0] = table[r & 0xFFFF];
    v[1] = table[(r >> 16) & 0xFFFF];
    v[2] = table[(r >> 32) & 0xFFFF];
    v[3] = table[r >> 48];
    std::memcpy(out + i * sizeof(T), v, sizeof v);
  }
  if (i < n) {
    const uint64_t r = splitmix64(state);
    for (size_t k = 0; i < n; ++i, ++k) {
      const T x = table[(r >> (16 * k)) & 0xFFFF];
      std::memcpy(out + i * sizeof(T), &x, sizeof x);
    }
  }
}

std::string scale_name_of(const std::string& weight_name) {
  const std::string_view suffix = ".weight";
  if (ends_with(weight_name, suffix)) return weight_name.substr(0, weight_name.size() - suffix.size()) + ".scale";
  return weight_name + ".scale";
}

bool quantized(WeightFormat f) {
  return f == WeightFormat::FP8Block || f == WeightFormat::FP8Rows || f == WeightFormat::MXFP4;
}

}  // namespace

Result<std::vector<io::StreamedTensor>> perf_tensors(const ModelConfig& c, const LayerPlan& plan, uint64_t seed) {
  CEDAR_ASSIGN_OR_RETURN(const std::vector<WeightSpec> specs, expected_weights(c, plan));
  const Quantiles q;
  // Tables shared by every tensor of one (format, role offset, role scale): a few dozen in all.
  std::map<std::tuple<int, double, double>, std::shared_ptr<const CodeTable>> tables;
  std::map<std::string, uint8_t> scale_bytes;  // scale tensor name → its constant UE8M0 byte
  std::vector<std::shared_ptr<const CodeTable>> table_of(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const WeightSpec& w = specs[i];
    if (w.format == WeightFormat::Scale) continue;
    const Role role = role_of(w);
    if (role == Role::ExpertIds || w.format == WeightFormat::Other)
      return make_error(w.name + ": the perf profile has no generator for " +
                        std::string(weight_format_name(w.format)) + " tensors");
    const Affine a = affine_of(role, static_cast<double>(logical_shape(w).cols));
    const WeightFormat f = w.format == WeightFormat::F32 || w.dtype == DType::F32 ? WeightFormat::F32 : w.format;
    auto& slot = tables[{static_cast<int>(f), a.offset, a.scale}];
    if (!slot) slot = std::make_shared<const CodeTable>(make_table(f, a, q));
    table_of[i] = slot;
    if (quantized(w.format)) scale_bytes[scale_name_of(w.name)] = slot->scale_byte;
  }

  std::vector<io::StreamedTensor> out;
  out.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const WeightSpec& w = specs[i];
    io::StreamedTensor t{w.name, w.dtype, w.shape, nullptr};
    const int64_t row_elems = w.shape.empty() ? 1 : w.shape.back();
    const uint64_t base = tensor_stream_state(seed, w.name);
    if (w.format == WeightFormat::Scale) {
      auto it = scale_bytes.find(w.name);
      if (it == scale_bytes.end()) return make_error("expected_weights lists scale " + w.name + " without its weight");
      if (w.dtype != DType::F8_E8M0)
        return make_error(w.name + ": the perf profile writes UE8M0 scales only, the inventory wants " +
                          std::string(dtype_name(w.dtype)));
      const uint8_t byte = it->second;
      t.fill = [byte](int64_t, int64_t, std::span<uint8_t> dst) {
        std::fill(dst.begin(), dst.end(), byte);
        return Status::Ok();
      };
    } else {
      std::shared_ptr<const CodeTable> table = table_of[i];
      const size_t row_bytes = static_cast<size_t>(row_elems) * dtype_size(w.dtype);
      t.fill = [table, base, row_elems, row_bytes](int64_t first_row, int64_t rows, std::span<uint8_t> dst) {
        for (int64_t r = 0; r < rows; ++r) {
          const uint64_t state = base + static_cast<uint64_t>(first_row + r) * kRowStride;
          uint8_t* o = dst.data() + static_cast<size_t>(r) * row_bytes;
          const auto n = static_cast<size_t>(row_elems);
          if (!table->bytes.empty())
            fill_row(state, table->bytes.data(), n, o);  // FP8 codes / packed e2m1 pairs
          else if (!table->bf16.empty())
            fill_row(state, table->bf16.data(), n, o);
          else
            fill_row(state, table->f32.data(), n, o);
        }
        return Status::Ok();
      };
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace cedar
