#include "kv/kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/numeric.h"

namespace cedar {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

constexpr int64_t kV4NopeBlock = 64;

int64_t block_of(KvRecipe r) {
  switch (r) {
    case KvRecipe::None: return 1;
    case KvRecipe::Fp4Block16E4m3: return 16;
    case KvRecipe::Fp4Block32Ue8m0: return 32;
    case KvRecipe::Fp8Block32Ue8m0: return 32;
    case KvRecipe::V4Fp8Bf16Rope: return kV4NopeBlock;
  }
  return 1;
}

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// V4 NoPE recipe: the FP8 activation recipe with blocks of 64 (numeric.h rules, incl. poisoning).
void qdq_v4_nope_block(std::span<float> x, uint8_t* codes, uint8_t* scale) {
  float amax = 0.0f;
  bool finite = true;
  for (float v : x) {
    finite &= std::isfinite(v);
    amax = std::max(amax, std::fabs(v));
  }
  if (!finite) {
    std::fill(x.begin(), x.end(), std::nanf(""));
    if (codes != nullptr) std::fill(codes, codes + x.size(), uint8_t{0x7F});
    if (scale != nullptr) *scale = 0xFF;
    return;
  }
  const uint8_t sb = ue8m0_ceil_pow2(std::max(amax, 1e-4f) * (1.0f / 448.0f));
  const float s = ue8m0_to_f32(sb);
  for (size_t i = 0; i < x.size(); ++i) {
    const uint8_t q = f32_to_e4m3(std::clamp(x[i] / s, -448.0f, 448.0f));
    if (codes != nullptr) codes[i] = q;
    x[i] = e4m3_to_f32(q) * s;
  }
  if (scale != nullptr) *scale = sb;
}

// V4: NoPE dims FP8 (blocks of 64), RoPE dims bf16. codes/scales/rope may be null (QDQ only).
void qdq_v4(std::span<float> x, int64_t rope_dim, uint8_t* codes, uint8_t* rope, uint8_t* scales) {
  const int64_t nope = static_cast<int64_t>(x.size()) - rope_dim;
  for (int64_t b = 0; b < nope / kV4NopeBlock; ++b)
    qdq_v4_nope_block(x.subspan(static_cast<size_t>(b * kV4NopeBlock), kV4NopeBlock),
                      codes ? codes + b * kV4NopeBlock : nullptr, scales ? scales + b : nullptr);
  for (int64_t i = nope; i < static_cast<int64_t>(x.size()); ++i) {
    const uint16_t h = f32_to_bf16(x[static_cast<size_t>(i)]);
    x[static_cast<size_t>(i)] = bf16_to_f32(h);
    if (rope != nullptr) std::memcpy(rope + (i - nope) * 2, &h, 2);  // little-endian host (x86/arm64)
  }
}

}  // namespace

std::string_view kv_recipe_name(KvRecipe r) {
  switch (r) {
    case KvRecipe::None: return "none";
    case KvRecipe::Fp4Block16E4m3: return "fp4_b16_e4m3";
    case KvRecipe::Fp4Block32Ue8m0: return "fp4_b32_ue8m0";
    case KvRecipe::Fp8Block32Ue8m0: return "fp8_b32_ue8m0";
    case KvRecipe::V4Fp8Bf16Rope: return "v4_fp8_bf16";
  }
  return "?";
}

Result<KvRecordFormat> KvRecordFormat::make(KvRecipe recipe, KvStorage storage, int64_t width, int64_t rope_dim) {
  const std::string what = "KV record format " + std::string(kv_recipe_name(recipe)) + ": ";
  if (width <= 0) return make_error(what + "width " + str(width) + " must be positive");
  if (recipe == KvRecipe::None && storage == KvStorage::Packed)
    return make_error(what + "packed storage needs a quantization recipe");
  if (recipe == KvRecipe::V4Fp8Bf16Rope) {
    if (rope_dim < 0 || rope_dim >= width || (width - rope_dim) % kV4NopeBlock != 0)
      return make_error(what + "width " + str(width) + " − rope_dim " + str(rope_dim) +
                        " must be a positive multiple of " + str(kV4NopeBlock));
  } else {
    if (rope_dim != 0) return make_error(what + "rope_dim is only used by the V4 record");
    if (width % block_of(recipe) != 0)
      return make_error(what + "width " + str(width) + " is not a multiple of the block " + str(block_of(recipe)));
  }
  return KvRecordFormat{recipe, storage, width, rope_dim};
}

int64_t KvRecordFormat::record_bytes() const {
  if (storage == KvStorage::F32) return width * 4;
  switch (recipe) {
    case KvRecipe::None: return width * 4;
    case KvRecipe::Fp4Block16E4m3: return width / 2 + width / 16;
    case KvRecipe::Fp4Block32Ue8m0: return width / 2 + width / 32;
    case KvRecipe::Fp8Block32Ue8m0: return width + width / 32;
    case KvRecipe::V4Fp8Bf16Rope: {
      const int64_t nope = width - rope_dim;
      return round_up(nope + 2 * rope_dim + nope / kV4NopeBlock, 8);
    }
  }
  return 0;
}

std::string KvRecordFormat::name() const {
  return std::string(kv_recipe_name(recipe)) + (storage == KvStorage::Packed ? "/packed[" : "/f32[") + str(width) +
         "]: " + str(record_bytes()) + " B";
}

Status KvRecordFormat::quantize(std::span<float> values) const {
  if (static_cast<int64_t>(values.size()) != width)
    return make_error(name() + ": entry has " + str(static_cast<int64_t>(values.size())) + " values");
  switch (recipe) {
    case KvRecipe::None: return Status::Ok();
    case KvRecipe::Fp4Block16E4m3: return qdq_fp4_block16_e4m3(values);
    case KvRecipe::Fp4Block32Ue8m0: return qdq_fp4_block32_ue8m0(values);
    case KvRecipe::Fp8Block32Ue8m0: return qdq_fp8_block32_ue8m0(values);
    case KvRecipe::V4Fp8Bf16Rope: qdq_v4(values, rope_dim, nullptr, nullptr, nullptr); return Status::Ok();
  }
  return Status::Ok();
}

Status KvRecordFormat::encode(std::span<float> values, std::span<uint8_t> record) const {
  if (static_cast<int64_t>(record.size()) != record_bytes())
    return make_error(name() + ": record has " + str(static_cast<int64_t>(record.size())) + " bytes");
  if (static_cast<int64_t>(values.size()) != width)
    return make_error(name() + ": entry has " + str(static_cast<int64_t>(values.size())) + " values");
  if (storage == KvStorage::F32) {
    CEDAR_RETURN_IF_ERROR(quantize(values));
    std::memcpy(record.data(), values.data(), values.size() * sizeof(float));
    return Status::Ok();
  }
  const size_t w = static_cast<size_t>(width);
  switch (recipe) {
    case KvRecipe::None: break;  // rejected by make()
    case KvRecipe::Fp4Block16E4m3:
      return qdq_fp4_block16_e4m3(values, record.first(w / 2), record.subspan(w / 2, w / 16));
    case KvRecipe::Fp4Block32Ue8m0:
      return qdq_fp4_block32_ue8m0(values, record.first(w / 2), record.subspan(w / 2, w / 32));
    case KvRecipe::Fp8Block32Ue8m0:
      return qdq_fp8_block32_ue8m0(values, record.first(w), record.subspan(w, w / 32));
    case KvRecipe::V4Fp8Bf16Rope: {
      const size_t nope = w - static_cast<size_t>(rope_dim);
      std::fill(record.begin(), record.end(), uint8_t{0});
      qdq_v4(values, rope_dim, record.data(), record.data() + nope, record.data() + nope + 2 * rope_dim);
      return Status::Ok();
    }
  }
  return make_error(name() + ": cannot pack without a recipe");
}

void KvRecordFormat::decode(std::span<const uint8_t> record, std::span<float> out) const {
  const size_t w = static_cast<size_t>(width);
  if (storage == KvStorage::F32) {
    std::memcpy(out.data(), record.data(), w * sizeof(float));
    return;
  }
  // Sizes are fixed by the format, so the numeric.h size checks cannot fail here.
  switch (recipe) {
    case KvRecipe::None: break;
    case KvRecipe::Fp4Block16E4m3:
      (void)dequant_fp4_block16_e4m3(record.first(w / 2), record.subspan(w / 2, w / 16), out);
      break;
    case KvRecipe::Fp4Block32Ue8m0:
      (void)dequant_fp4_block32_ue8m0(record.first(w / 2), record.subspan(w / 2, w / 32), out);
      break;
    case KvRecipe::Fp8Block32Ue8m0:
      (void)dequant_fp8_block32_ue8m0(record.first(w), record.subspan(w, w / 32), out);
      break;
    case KvRecipe::V4Fp8Bf16Rope: {
      const size_t nope = w - static_cast<size_t>(rope_dim);
      const uint8_t* scales = record.data() + nope + 2 * static_cast<size_t>(rope_dim);
      for (size_t i = 0; i < nope; ++i)
        out[i] = e4m3_to_f32(record[i]) * ue8m0_to_f32(scales[i / static_cast<size_t>(kV4NopeBlock)]);
      for (size_t i = nope; i < w; ++i) {
        uint16_t h = 0;
        std::memcpy(&h, record.data() + nope + 2 * (i - nope), 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    }
  }
}

}  // namespace cedar
