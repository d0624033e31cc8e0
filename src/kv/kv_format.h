// Record formats of the KV cache (../shared/spec/architecture.md §3.1 QDQ recipes, §3.12 layouts):
// how one cache entry of `width` values becomes bytes and back.
//
// A format is a small descriptor: the quantization recipe, the storage (packed bytes, or the
// recipe's dequantized values kept as fp32 for debugging / reference runs) and the widths. Encoding
// takes the *raw* entry (before quantization), applies the recipe in place — the caller's values
// become exactly what decode gives back — and writes the record. Quantization must see the raw
// values: a record cannot be rebuilt from dequantized values alone (an E4M3 scale in its subnormal
// range re-rounds to a different scale; a UE8M0 block whose largest code is the lowest one of its
// binade has two encodings), so caches quantize on write.
//
// Packed layouts (little-endian bytes, element 2i of an e2m1 pair in the low nibble):
//   Fp4Block16E4m3   V4.1 global KV:  width/2 B e2m1 codes, then width/16 B e4m3 scales (512 → 288 B)
//   Fp4Block32Ue8m0  indexer key:     width/2 B e2m1 codes, then width/32 B ue8m0 scales (128 → 68 B)
//   Fp8Block32Ue8m0  V4.1 SWA slot:   width B e4m3 codes, then width/32 B ue8m0 scales (512 → 528 B)
//   V4Fp8Bf16Rope    V4 FlashMLA row: (width−rope) B e4m3 NoPE codes, rope×2 B bf16 RoPE dims,
//                                     (width−rope)/64 B ue8m0 scales, zero pad to a multiple of 8
//                                     (512 with rope 64 → 448 + 128 + 7 + 1 = 584 B)
//   None             no recipe: values stored as given (fp32), for containers whose writer quantizes.
// The V4 NoPE recipe is the FP8 activation recipe with blocks of 64 (amax ≥ 1e-4, UE8M0 scale
// 2^ceil(log2(amax/448)), e4m3 RNE saturating); the RoPE dims are rounded to bf16.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace cedar {

enum class KvRecipe : uint8_t { None, Fp4Block16E4m3, Fp4Block32Ue8m0, Fp8Block32Ue8m0, V4Fp8Bf16Rope };
enum class KvStorage : uint8_t { Packed, F32 };

std::string_view kv_recipe_name(KvRecipe r);  // "none", "fp4_b16_e4m3", "fp4_b32_ue8m0", "fp8_b32_ue8m0", "v4_fp8_bf16"

struct KvRecordFormat {
  KvRecipe recipe = KvRecipe::None;
  KvStorage storage = KvStorage::F32;
  int64_t width = 0;     // values per entry
  int64_t rope_dim = 0;  // V4Fp8Bf16Rope only: trailing bf16 dims

  // Validated constructor: width positive and a multiple of the recipe's block, Packed needs a recipe.
  static Result<KvRecordFormat> make(KvRecipe recipe, KvStorage storage, int64_t width, int64_t rope_dim = 0);
  // Unvalidated raw-f32 container format (always valid for width > 0).
  static KvRecordFormat raw_f32(int64_t width) { return {KvRecipe::None, KvStorage::F32, width, 0}; }

  int64_t record_bytes() const;
  std::string name() const;  // e.g. "fp4_b16_e4m3/packed[512]: 288 B"

  // Quantizes `values` (width raw values) in place with the recipe and writes the record
  // (record.size() == record_bytes()). Errors on size mismatch; `values` is unchanged then.
  Status encode(std::span<float> values, std::span<uint8_t> record) const;
  // Decodes one record into `out` (width values). Preconditions: sizes match (not checked: hot path).
  void decode(std::span<const uint8_t> record, std::span<float> out) const;
  // Quantize-dequantize only (what encode does to `values`), no record.
  Status quantize(std::span<float> values) const;

  bool operator==(const KvRecordFormat&) const = default;
};

}  // namespace cedar
