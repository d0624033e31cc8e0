// KV record formats (kv/kv_format.h) against the spec (architecture.md §3.1 recipes, §3.12 layouts):
// record sizes, hand-built byte layouts, decode(encode(x)) == the numeric.h QDQ recipe of x bit for
// bit (the recipes themselves are checked against numpy/ml_dtypes in test_numeric_formats.py; the
// packed bytes against a numpy packing in tests/python/test_kv_format.py).
#include "kv/kv_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/numeric.h"

namespace cedar {
namespace {

KvRecordFormat fmt(KvRecipe r, int64_t width, KvStorage s = KvStorage::Packed, int64_t rope = 0) {
  auto f = KvRecordFormat::make(r, s, width, rope);
  EXPECT_TRUE(f.ok()) << f.error().message;
  return f.ok() ? *f : KvRecordFormat{};
}

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// bf16-valued random entries with per-block amplitudes spanning many binades (incl. tiny blocks whose
// E4M3 scale is subnormal), signed zeros and exact ties.
std::vector<float> random_entry(std::mt19937& rng, int64_t width) {
  std::vector<float> x(static_cast<size_t>(width));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-24, 8);
  for (int64_t b = 0; b < width; b += 16) {
    const float amp = std::ldexp(1.0f, exp(rng));
    for (int64_t i = b; i < b + 16; ++i) x[static_cast<size_t>(i)] = round_to_bf16(normal(rng) * amp);
  }
  x[1] = -0.0f;
  return x;
}

TEST(KvFormat, RecordSizesOfSpec312) {
  EXPECT_EQ(fmt(KvRecipe::Fp4Block16E4m3, 512).record_bytes(), 288);   // V4.1 global KV
  EXPECT_EQ(fmt(KvRecipe::Fp4Block32Ue8m0, 128).record_bytes(), 68);   // indexer key
  EXPECT_EQ(fmt(KvRecipe::Fp8Block32Ue8m0, 512).record_bytes(), 528);  // V4.1 SWA slot
  EXPECT_EQ(fmt(KvRecipe::V4Fp8Bf16Rope, 512, KvStorage::Packed, 64).record_bytes(), 584);  // 448+128+7+1
  EXPECT_EQ(fmt(KvRecipe::Fp4Block16E4m3, 512, KvStorage::F32).record_bytes(), 2048);
  EXPECT_EQ(KvRecordFormat::raw_f32(7).record_bytes(), 28);
}

TEST(KvFormat, InvalidDescriptorsAreErrors) {
  EXPECT_FALSE(KvRecordFormat::make(KvRecipe::Fp4Block16E4m3, KvStorage::Packed, 24).ok());
  EXPECT_FALSE(KvRecordFormat::make(KvRecipe::Fp8Block32Ue8m0, KvStorage::Packed, 0).ok());
  EXPECT_FALSE(KvRecordFormat::make(KvRecipe::None, KvStorage::Packed, 32).ok());
  EXPECT_FALSE(KvRecordFormat::make(KvRecipe::V4Fp8Bf16Rope, KvStorage::Packed, 512, 60).ok());
  const auto f = fmt(KvRecipe::Fp4Block32Ue8m0, 128);
  std::vector<float> x(64);
  std::vector<uint8_t> rec(68);
  const Status s = f.encode(x, rec);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("64 values"), std::string::npos) << s.error().message;
}

// Hand-built layout: codes first (element 2i in the low nibble), then one scale byte per block.
TEST(KvFormat, GlobalKvLayoutByHand) {
  const auto f = fmt(KvRecipe::Fp4Block16E4m3, 32);
  std::vector<float> x(32, 0.0f);
  for (int i = 0; i < 16; ++i) x[i] = (i % 2 == 0) ? 3.0f : -3.0f;  // amax 3: s = e4m3(0.5) = 0x30, q = ±6
  x[16] = 0.25f;  // block 1: s = e4m3(0.25/6 = 0.041667) = 1.375·2^-5 (0x13; neighbours 0.0391, 0.0430)
  std::vector<uint8_t> rec(static_cast<size_t>(f.record_bytes()));
  ASSERT_EQ(rec.size(), 16u + 2u);
  ASSERT_TRUE(f.encode(x, rec).ok());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(rec[i], 0xF7) << i;  // +6 (0x7) low, -6 (0xF) high
  EXPECT_EQ(rec[16], 0x30);
  EXPECT_EQ(rec[17], 0x13);
  EXPECT_EQ(rec[8], 0x07);  // 0.25 / 0.04297 = 5.82 → 6 (code 7); element 17 is 0
  for (int i = 9; i < 16; ++i) EXPECT_EQ(rec[i], 0x00) << i;
  EXPECT_EQ(x[0], 3.0f);
  EXPECT_EQ(x[16], 6.0f * 0.04296875f);
}

TEST(KvFormat, IndexerAndSwaLayoutsByHand) {
  const auto ik = fmt(KvRecipe::Fp4Block32Ue8m0, 64);
  std::vector<float> x(64, 1.0f);  // amax 1: s = 2^ceil(log2(1/6)) = 2^-2 (ue8m0 125), q = 4 (code 6)
  x[33] = -0.5f;                   // block 1 amax 1 too; -0.5/0.25 = -2 → code 0xC
  std::vector<uint8_t> rec(static_cast<size_t>(ik.record_bytes()));
  ASSERT_EQ(rec.size(), 34u);
  ASSERT_TRUE(ik.encode(x, rec).ok());
  EXPECT_EQ(rec[0], 0x66);
  EXPECT_EQ(rec[16], 0xC6);  // elements 32 (low) and 33 (high)
  EXPECT_EQ(rec[32], 125);
  EXPECT_EQ(rec[33], 125);

  const auto swa = fmt(KvRecipe::Fp8Block32Ue8m0, 32);
  std::vector<float> y(32, 0.0f);
  y[0] = 448.0f;  // s = 1 (ue8m0 127), code 0x7E
  y[1] = -1.0f;   // e4m3 -1 = 0xB8
  std::vector<uint8_t> r2(static_cast<size_t>(swa.record_bytes()));
  ASSERT_TRUE(swa.encode(y, r2).ok());
  EXPECT_EQ(r2[0], 0x7E);
  EXPECT_EQ(r2[1], 0xB8);
  EXPECT_EQ(r2[2], 0x00);
  EXPECT_EQ(r2[32], 127);
}

TEST(KvFormat, V4RecordLayoutByHand) {
  const auto f = fmt(KvRecipe::V4Fp8Bf16Rope, 128 + 8, KvStorage::Packed, 8);  // 2 NoPE blocks + 8 RoPE dims
  ASSERT_EQ(f.record_bytes(), 128 + 16 + 2 + 6);  // 152: padded to a multiple of 8
  std::vector<float> x(136, 0.0f);
  x[0] = 448.0f;     // block 0: s = 1
  x[64] = 2.0f;      // block 1: amax 2 → s = 2^ceil(log2(2/448)) = 2^-7 (ue8m0 120), 2/2^-7 = 256 = 0x78
  x[128] = 1.0f + 1.0f / 256.0f;  // bf16 rounds 1.00390625 to 1.0 (tie to even) → 0x3F80
  x[129] = -2.0f;                  // 0xC000
  std::vector<uint8_t> rec(static_cast<size_t>(f.record_bytes()), 0xAA);
  ASSERT_TRUE(f.encode(x, rec).ok());
  EXPECT_EQ(rec[0], 0x7E);
  EXPECT_EQ(rec[64], 0x78);
  EXPECT_EQ(rec[128], 0x80);
  EXPECT_EQ(rec[129], 0x3F);
  EXPECT_EQ(rec[130], 0x00);
  EXPECT_EQ(rec[131], 0xC0);
  EXPECT_EQ(rec[144], 127);
  EXPECT_EQ(rec[145], 120);
  for (size_t i = 146; i < rec.size(); ++i) EXPECT_EQ(rec[i], 0) << "pad byte " << i;
  EXPECT_EQ(x[128], 1.0f);
  std::vector<float> back(136);
  f.decode(rec, back);
  for (size_t i = 0; i < back.size(); ++i) EXPECT_EQ(bits(back[i]), bits(x[i])) << i;
}

// decode(encode(x)) is bit-identical to the numeric.h QDQ recipe of x, packed or fp32-stored.
TEST(KvFormat, RoundTripEqualsRecipeBitForBit) {
  std::mt19937 rng(7);
  struct Case {
    KvRecipe recipe;
    int64_t width;
    Status (*qdq)(std::span<float>, std::span<uint8_t>, std::span<uint8_t>);
  };
  const Case cases[] = {{KvRecipe::Fp4Block16E4m3, 512, qdq_fp4_block16_e4m3},
                        {KvRecipe::Fp4Block32Ue8m0, 128, qdq_fp4_block32_ue8m0},
                        {KvRecipe::Fp8Block32Ue8m0, 512, qdq_fp8_block32_ue8m0}};
  for (const Case& c : cases) {
    for (KvStorage storage : {KvStorage::Packed, KvStorage::F32}) {
      const auto f = fmt(c.recipe, c.width, storage);
      SCOPED_TRACE(f.name());
      std::vector<uint8_t> rec(static_cast<size_t>(f.record_bytes()));
      std::vector<float> back(static_cast<size_t>(c.width));
      for (int trial = 0; trial < 200; ++trial) {
        const std::vector<float> raw = random_entry(rng, c.width);
        std::vector<float> want = raw, got = raw;
        ASSERT_TRUE(c.qdq(want, {}, {}).ok());
        ASSERT_TRUE(f.encode(got, rec).ok());
        f.decode(rec, back);
        for (size_t i = 0; i < raw.size(); ++i) {
          ASSERT_EQ(bits(got[i]), bits(want[i])) << "encode's in-place values, trial " << trial << " i " << i;
          ASSERT_EQ(bits(back[i]), bits(want[i])) << "decoded, trial " << trial << " i " << i;
        }
      }
    }
  }
}

// Why caches quantize raw values: a dequantized FP4/E4M3 block does not always re-quantize to itself.
// amax 9·2^-9: s = e4m3(1.5·2^-9) = 2^-8 (subnormal tie to even), 4.5 → q = 4, value 2^-6; quantizing
// 2^-6 again: s' = e4m3(2^-6/6) = 2^-9, 2^-6/2^-9 = 8 saturates to 6 → 6·2^-9 ≠ 2^-6.
TEST(KvFormat, RequantizingDequantizedValuesIsNotIdempotent) {
  std::vector<float> x(16, 0.0f);
  x[0] = 9.0f * 0x1p-9f;
  ASSERT_TRUE(qdq_fp4_block16_e4m3(x).ok());
  EXPECT_EQ(x[0], 0x1p-6f);
  ASSERT_TRUE(qdq_fp4_block16_e4m3(x).ok());
  EXPECT_EQ(x[0], 6.0f * 0x1p-9f);
}

TEST(KvFormat, PoisonedBlocksDecodeToNan) {
  const auto f = fmt(KvRecipe::Fp4Block16E4m3, 32);
  std::vector<float> x(32, 3.0f);  // 3 = 6 · e4m3(0.5): exact
  x[3] = std::nanf("");
  std::vector<uint8_t> rec(static_cast<size_t>(f.record_bytes()));
  ASSERT_TRUE(f.encode(x, rec).ok());
  std::vector<float> back(32);
  f.decode(rec, back);
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
  for (int i = 16; i < 32; ++i) EXPECT_EQ(back[i], 3.0f) << i;
}

}  // namespace
}  // namespace cedar
