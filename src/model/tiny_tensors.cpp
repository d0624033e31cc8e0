// Values of a tiny checkpoint: every tensor expected_weights() lists, drawn from a stream seeded by
// (seed, tensor name) and stored in the tensor's released format (§2.1).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/numeric.h"
#include "model/tiny_checkpoint.h"
#include "model/tiny_roles.h"
#include "model/weights.h"

namespace cedar {
namespace {

using namespace tiny_detail;  // NOLINT(google-build-using-namespace): the shared role rules

// One tensor's random stream. Values use integer arithmetic plus exactly rounded double operations
// only (no libm), so the bytes are the same on every IEEE-754 machine.
class ValueStream {
 public:
  ValueStream(uint64_t seed, std::string_view name) : state_(seed) {
    uint64_t mix = fnv1a(name);
    state_ ^= splitmix64(mix);
  }
  [[gnu::always_inline]] uint64_t next() { return splitmix64(state_); }
  // Approximately N(0, 1): Irwin–Hall sum of four 16-bit uniforms, rescaled to unit variance.
  [[gnu::always_inline]] float normal() {
    const uint64_t r = next();
    const int64_t sum = static_cast<int64_t>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
    // Each uniform is (k + 0.5) / 65536: mean 2 for the sum, variance 4/12 (to 2^-32).
    const double centered = (static_cast<double>(sum) + 2.0 - 131072.0) / 65536.0;
    return static_cast<float>(centered * 1.7320508075688772);
  }
  uint64_t below(uint64_t n) { return next() % n; }  // bias irrelevant for tiny n

 private:
  uint64_t state_;
};

std::vector<float> draw_values(const WeightSpec& w, uint64_t seed) {
  const Logical l = logical_shape(w);
  const Affine a = affine_of(role_of(w), static_cast<double>(l.cols));
  ValueStream s(seed, w.name);
  std::vector<float> v(static_cast<size_t>(l.rows * l.cols));
  float* out = v.data();
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(a.offset + a.scale * s.normal());
  return v;
}

// Stores `value` little-endian at element `i` of `out` (cedar targets little-endian hosts, as
// safetensors is).
template <typename T>
[[gnu::always_inline]] inline void store_le(std::vector<uint8_t>& out, size_t i, T value) {
  std::memcpy(out.data() + i * sizeof(T), &value, sizeof(T));
}

struct Encoded {
  std::vector<uint8_t> weight;
  std::vector<uint8_t> scale;        // empty for unquantized formats
  std::vector<int64_t> scale_shape;
};

// Power-of-two scale of a block: the smallest 2^k with amax / 2^k <= qmax (exponent byte, §3.1).
uint8_t block_scale(float amax, float qmax) { return ue8m0_ceil_pow2(amax / qmax); }

// Block-quantizes a [rows, cols] matrix with (br x bc) blocks; `fp4` selects E2M1 codes (packed) over
// E4M3. Scales are exponent bytes, [ceil(rows/br), ceil(cols/bc)].
Encoded quantize_blocks(const std::vector<float>& v, Logical l, int64_t br, int64_t bc, bool fp4) {
  Encoded e;
  const int64_t sr = (l.rows + br - 1) / br, sc = (l.cols + bc - 1) / bc;
  e.scale_shape = {sr, sc};
  e.scale.assign(static_cast<size_t>(sr * sc), 0);
  e.weight.assign(static_cast<size_t>(fp4 ? l.rows * l.cols / 2 : l.rows * l.cols), 0);
  const float qmax = fp4 ? 6.0f : 448.0f;
  for (int64_t bi = 0; bi < sr; ++bi) {
    for (int64_t bj = 0; bj < sc; ++bj) {
      const int64_t r1 = std::min(l.rows, (bi + 1) * br), c1 = std::min(l.cols, (bj + 1) * bc);
      float amax = 0.0f;
      for (int64_t r = bi * br; r < r1; ++r)
        for (int64_t c = bj * bc; c < c1; ++c) amax = std::max(amax, std::fabs(v[static_cast<size_t>(r * l.cols + c)]));
      const uint8_t sbyte = block_scale(amax, qmax);
      e.scale[static_cast<size_t>(bi * sc + bj)] = sbyte;
      const float scale = ue8m0_to_f32(sbyte);
      for (int64_t r = bi * br; r < r1; ++r) {
        for (int64_t c = bj * bc; c < c1; ++c) {
          const size_t i = static_cast<size_t>(r * l.cols + c);
          const float q = v[i] / scale;  // exact: scale is a power of two
          if (fp4) e2m1_set(e.weight, i, f32_to_e2m1(q));
          else e.weight[i] = f32_to_e4m3(q);
        }
      }
    }
  }
  return e;
}

Result<std::vector<uint8_t>> scale_bytes_as(const std::vector<uint8_t>& exponents, DType dtype, const std::string& name) {
  if (dtype == DType::F8_E8M0) return exponents;
  if (dtype != DType::F32 && dtype != DType::BF16)
    return make_error(name + ": cannot store a power-of-two scale as " + std::string(dtype_name(dtype)));
  std::vector<uint8_t> out(exponents.size() * dtype_size(dtype));
  for (size_t i = 0; i < exponents.size(); ++i) {
    const float s = ue8m0_to_f32(exponents[i]);
    if (dtype == DType::F32) store_le(out, i, s);
    else store_le(out, i, f32_to_bf16(s));  // powers of two are bf16-exact
  }
  return out;
}

Result<std::vector<uint8_t>> encode_plain(const WeightSpec& w, const std::vector<float>& v) {
  if (w.dtype == DType::F32) {
    std::vector<uint8_t> out(v.size() * sizeof(float));
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  if (w.dtype != DType::BF16)
    return make_error(w.name + ": no value generator for dtype " + std::string(dtype_name(w.dtype)));
  std::vector<uint16_t> bits(v.size());
  const float* in = v.data();
  uint16_t* b = bits.data();
  for (size_t i = 0; i < bits.size(); ++i) b[i] = f32_to_bf16(in[i]);
  std::vector<uint8_t> out(bits.size() * sizeof(uint16_t));
  std::memcpy(out.data(), bits.data(), out.size());
  return out;
}

// V4 hash routing table [vocab, k]: k distinct expert ids per token.
Result<std::vector<uint8_t>> encode_expert_ids(const WeightSpec& w, const ModelConfig& c, uint64_t seed) {
  if (w.shape.size() != 2 || w.shape[1] > c.n_routed_experts)
    return make_error(w.name + ": expected [tokens, k <= n_routed_experts] for an expert-id table");
  ValueStream s(seed, w.name);
  std::vector<int64_t> experts(static_cast<size_t>(c.n_routed_experts));
  const size_t k_per_token = static_cast<size_t>(w.shape[1]);
  std::vector<uint8_t> out(static_cast<size_t>(w.shape[0]) * k_per_token * dtype_size(w.dtype));
  for (size_t t = 0; t < static_cast<size_t>(w.shape[0]); ++t) {
    for (size_t i = 0; i < experts.size(); ++i) experts[i] = static_cast<int64_t>(i);
    for (size_t k = 0; k < k_per_token; ++k) {  // partial Fisher–Yates
      std::swap(experts[k], experts[k + s.below(experts.size() - k)]);
      if (w.dtype == DType::I32) store_le(out, t * k_per_token + k, static_cast<int32_t>(experts[k]));
      else store_le(out, t * k_per_token + k, experts[k]);
    }
  }
  return out;
}

std::string scale_name_of(const std::string& weight_name) {
  const std::string_view suffix = ".weight";
  if (ends_with(weight_name, suffix)) return weight_name.substr(0, weight_name.size() - suffix.size()) + ".scale";
  return weight_name + ".scale";
}

Result<Encoded> encode(const WeightSpec& w, const ModelConfig& c, uint64_t seed) {
  if (role_of(w) == Role::ExpertIds) {
    CEDAR_ASSIGN_OR_RETURN(auto ids, encode_expert_ids(w, c, seed));
    return Encoded{std::move(ids), {}, {}};
  }
  const std::vector<float> v = draw_values(w, seed);
  const Logical l = logical_shape(w);
  switch (w.format) {
    case WeightFormat::FP8Block:
      if (c.quant.weight_block_rows <= 0 || c.quant.weight_block_cols <= 0)
        return make_error(w.name + ": FP8 block weight but the config has no weight_block_size");
      return quantize_blocks(v, l, c.quant.weight_block_rows, c.quant.weight_block_cols, false);
    case WeightFormat::FP8Rows: return quantize_blocks(v, l, 1, 32, false);
    case WeightFormat::MXFP4: return quantize_blocks(v, l, 1, 32, true);
    case WeightFormat::BF16:
    case WeightFormat::F32:
    case WeightFormat::Other: {
      CEDAR_ASSIGN_OR_RETURN(auto bytes, encode_plain(w, v));
      return Encoded{std::move(bytes), {}, {}};
    }
    case WeightFormat::Scale: break;
  }
  return make_error(w.name + ": a scale is produced with its weight, not on its own");
}

}  // namespace

Result<io::SafetensorsWriter> tiny_tensors(const ModelConfig& c, const LayerPlan& plan, uint64_t seed) {
  CEDAR_ASSIGN_OR_RETURN(const std::vector<WeightSpec> specs, expected_weights(c, plan));
  std::map<std::string, const WeightSpec*> by_name;
  for (const auto& w : specs) by_name[w.name] = &w;

  // Quantized weights produce their scales; scales are added where the list puts them.
  std::map<std::string, std::vector<uint8_t>> bytes;
  for (const auto& w : specs) {
    if (w.format == WeightFormat::Scale) continue;
    CEDAR_ASSIGN_OR_RETURN(Encoded e, encode(w, c, seed));
    if (!e.scale_shape.empty()) {
      const std::string sname = scale_name_of(w.name);
      auto it = by_name.find(sname);
      if (it == by_name.end() || it->second->format != WeightFormat::Scale)
        return make_error("expected_weights lists quantized " + w.name + " without its scale " + sname);
      if (it->second->shape != e.scale_shape)
        return make_error(sname + ": listed shape differs from the block layout of " + w.name);
      CEDAR_ASSIGN_OR_RETURN(bytes[sname], scale_bytes_as(e.scale, it->second->dtype, sname));
    }
    bytes[w.name] = std::move(e.weight);
  }

  io::SafetensorsWriter writer;
  for (const auto& w : specs) {
    auto it = bytes.find(w.name);
    if (it == bytes.end()) return make_error("expected_weights lists " + w.name + " without a quantized weight");
    std::vector<uint8_t> data = std::move(it->second);
    CEDAR_RETURN_IF_ERROR(writer.add(w.name, w.dtype, w.shape, std::move(data)));
  }
  return writer;
}

}  // namespace cedar
