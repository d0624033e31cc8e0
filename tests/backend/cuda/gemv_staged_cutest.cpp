// wo_a through the FP8 GEMV (kernels.h stage_act_f16 + gemv_fp8_staged): the device staging against the
// host rule of f16_stage.h (itself checked against double-precision references in f16_stage_test.cpp),
// the grouped GEMV's row strides against contiguous items, and the whole path against cpu::linear over
// the reference's bf16 weight (the CPU model's wo_a: dequantized to bf16 at load, bf16 activations).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/f16_stage.h"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/kernels.h"
#include "core/numeric.h"
#include "cuda_test_util.h"
#include "gemm_test_util.h"
#include "model/weight_binding.h"

namespace cedar::cuda {
namespace {

using testing::alloc;
using testing::download;
using testing::parity;
using testing::QuantWeightHost;
using testing::Tolerance;
using testing::upload;

uint32_t bits(float v) { return std::bit_cast<uint32_t>(v); }

// 32-value blocks that reach every branch of the rule: powers of two, the top mantissa, the f16
// subnormal range and below it, zeros, negative zeros, bf16 subnormals, huge values, inf / NaN, and
// values that are not bf16 (the kernel rounds x to bf16 first, as gemv_bf16 does).
std::vector<float> edge_blocks() {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> blocks = {
      {1.0f, -0.5f, 0.25f},
      {65280.0f, -1.0f, 0x1p-17f, 0x1p-18f, 0x1p-25f, 0x3p-25f},
      {std::ldexp(1.0f, -100), std::ldexp(-3.0f, -130), std::ldexp(1.0f, -133)},
      {std::ldexp(2.0f - 0x1p-7f, 127), -1e38f, 1.0f, 1e-20f},
      {},  // zeros
      {-0.0f, -0.0f, 0.0f, -0.0f},
      {inf, 0.75f, -inf, nan, -3.0f, 1e-9f},
      {nan, inf},
      {1.0f + 0x1p-9f, 3.14159265f, -2.718281828f, 1e-3f, 123456.789f},  // not bf16: RNE to bf16 first
  };
  for (int k = -130; k <= 120; k += 10) {
    std::vector<float> b;
    for (int d = 0; d < 32; ++d) b.push_back(std::ldexp(d % 3 ? 1.0f + d * 0x1p-6f : -1.0f, k - d));
    blocks.push_back(b);
  }
  std::vector<float> x;
  for (auto& b : blocks) {
    b.resize(32, 0.0f);
    x.insert(x.end(), b.begin(), b.end());
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-60, 60);
  while (x.size() % (3 * 32 * 32) != 0) {  // 3 tokens of a multiple of 32 blocks
    const float s = std::ldexp(1.0f, ex(rng));
    for (int i = 0; i < 32; ++i) x.push_back(nd(rng) * s);
  }
  return x;
}

TEST(CudaStageActF16, MatchesTheHostRuleBitForBit) {
  CEDAR_REQUIRE_GPU();
  const std::vector<float> x = edge_blocks();
  const int64_t n = 3, in = static_cast<int64_t>(x.size()) / n;
  auto dx = upload(x);
  auto codes = alloc<uint16_t>(x.size());
  auto scales = alloc<float>(x.size() / 32);
  for (const bool pdl : {false, true}) {
    const Status s = stage_act_f16(dx.get(), n, in, codes.get(), scales.get(), nullptr, pdl);
    ASSERT_TRUE(s.ok()) << s.error().message;
    const auto got = download(codes);
    const auto got_s = download(scales);
    size_t exact = 0, rounded = 0;
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float v[32];
      float amax = 0;
      for (int i = 0; i < 32; ++i) {
        v[i] = round_to_bf16(x[b * 32 + i]);
        if (std::isfinite(v[i])) amax = std::max(amax, std::fabs(v[i]));
      }
      const int j = f16_stage_exponent(bits(amax));
      ASSERT_EQ(bits(got_s[b]), bits(std::ldexp(1.0f, j))) << "block " << b << ": scale must be 2^" << j;
      for (int i = 0; i < 32; ++i) {
        const uint16_t want = f16_stage_code(bits(v[i]), j), have = got[b * 32 + i];
        const bool want_nan = (want & 0x7C00) == 0x7C00 && (want & 0x3FF),
                   have_nan = (have & 0x7C00) == 0x7C00 && (have & 0x3FF);
        if (want_nan || have_nan) {
          ASSERT_TRUE(want_nan && have_nan) << "block " << b << " value " << i << ": NaN must stay NaN";
          continue;
        }
        ASSERT_EQ(have, want) << "block " << b << " value " << i << " (x " << x[b * 32 + i] << ", bf16 " << v[i]
                              << ", J " << j << ", pdl " << pdl << ")";
        const bool in_range = std::isfinite(v[i]) && v[i] != 0 && std::fabs(std::ldexp(double(v[i]), -j)) >= 0x1p-17;
        (in_range ? exact : rounded) += 1;
      }
    }
    std::printf(
        "STAGE f16 %zu blocks (pdl %d): codes and scales equal the host rule; %zu values in the exact range, "
        "%zu rounded below it\n",
        x.size() / 32, pdl ? 1 : 0, exact, rounded);
  }
}

TEST(CudaStageActF16, RejectsBadArguments) {
  CEDAR_REQUIRE_GPU();
  auto dx = alloc<float>(64);
  auto codes = alloc<uint16_t>(64);
  auto scales = alloc<float>(2);
  Status s = stage_act_f16(dx.get(), 1, 48, codes.get(), scales.get(), nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("in=48"), std::string::npos) << s.error().message;
  s = stage_act_f16(dx.get(), 2, 32, nullptr, scales.get(), nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("codes"), std::string::npos) << s.error().message;
  EXPECT_TRUE(stage_act_f16(dx.get(), 0, 32, nullptr, nullptr, nullptr).ok()) << "n = 0 is nothing to do";
}

// Row strides of gemv_quantized_grouped (GemvGroupItem::*_row_stride): items reading column slices of
// wider activation rows and writing slices of wider output rows equal the same items on contiguous
// copies, bit for bit (the same kernel, the same operands).
TEST(CudaGemvGrouped, RowStridesEqualContiguousItems) {
  CEDAR_REQUIRE_GPU();
  constexpr int64_t groups = 3, out = 64, in = 256, n = 5;
  const QuantWeightHost w = testing::random_fp8_weight(groups * out, in, 32, 71, 112);
  const auto x = testing::random_acts(static_cast<size_t>(n * groups * in), 72);
  auto dw = upload(w.data), ds = upload(w.scales);
  auto dx = upload(x);
  auto codes = alloc<uint16_t>(x.size());
  auto ascales = alloc<float>(x.size() / 32);
  ASSERT_TRUE(quantize_act_fp8(dx.get(), n, groups * in, codes.get(), ascales.get(), nullptr).ok());
  // Contiguous copies of each group's slices (quantization is per 32-block: the same codes).
  std::vector<float> xg(x.size());
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t t = 0; t < n; ++t) std::copy_n(x.begin() + (t * groups + g) * in, in, xg.begin() + (g * n + t) * in);
  auto dxg = upload(xg);
  auto gcodes = alloc<uint16_t>(x.size());
  auto gscales = alloc<float>(x.size() / 32);
  ASSERT_TRUE(quantize_act_fp8(dxg.get(), groups * n, in, gcodes.get(), gscales.get(), nullptr).ok());
  auto y_strided = alloc<float>(static_cast<size_t>(n * groups * out));
  auto y_contig = alloc<float>(static_cast<size_t>(n * groups * out));
  std::vector<GemvGroupItem> strided(groups), contig(groups);
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* wd = dw.get() + g * out * in;
    const uint8_t* wsc = ds.get() + g * (out / 32) * (in / 32);
    strided[g] = GemvGroupItem{wd,
                               wsc,
                               codes.get() + g * in,
                               ascales.get() + g * in / 32,
                               y_strided.get() + g * out,
                               groups * in,
                               groups * in / 32,
                               groups * out};
    contig[g] = GemvGroupItem{wd, wsc, gcodes.get() + g * n * in, gscales.get() + g * n * in / 32,
                              y_contig.get() + g * n * out};
  }
  const QuantWeightView shape{QuantWeightFormat::FP8Block, out, in, nullptr, nullptr, 32, 32};
  ASSERT_TRUE(gemv_quantized_grouped(shape, strided.data(), groups, n, true, nullptr).ok());
  ASSERT_TRUE(gemv_quantized_grouped(shape, contig.data(), groups, n, true, nullptr).ok());
  const auto ys = download(y_strided), yc = download(y_contig);
  size_t differ = 0;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < out; ++r)
        differ += std::memcmp(&ys[(t * groups + g) * out + r], &yc[(g * n + t) * out + r], 4) != 0;
  std::printf("PARITY gemv_quantized_grouped row strides vs contiguous items: %zu of %zu differ\n", differ, ys.size());
  EXPECT_EQ(differ, 0u);
  // Bad strides are errors naming the field; the packed MXFP4 layout takes none.
  GemvGroupItem bad = strided[0];
  bad.act_row_stride = groups * in + 4;
  Status s = gemv_quantized_grouped(shape, &bad, 1, n, true, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("act_row_stride"), std::string::npos) << s.error().message;
  bad = strided[0];
  bad.y_row_stride = out - 1;
  s = gemv_quantized_grouped(shape, &bad, 1, n, true, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("y_row_stride"), std::string::npos) << s.error().message;
  const QuantWeightView fp4{QuantWeightFormat::MXFP4, out, in, nullptr, nullptr, 32, 32};
  auto w4 = alloc<uint8_t>(static_cast<size_t>(out * in));
  bad = strided[0];
  bad.data = bad.scales = w4.get();
  s = gemv_mxfp4_packed_grouped(fp4, &bad, 1, n, true, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("row strides"), std::string::npos) << s.error().message;
}

struct Case {
  int64_t out = 0, in = 0, groups = 1, n = 1, block = 32;
  bool bf16_output = true, tiny_blocks = false;
  uint32_t seed = 1;
};

// The staged path against cpu::linear over the reference's bf16 weight, group by group (the CPU
// model's attention_output_projection), with gemv_bf16's tolerance: the products are the same exact
// values, only the fp32 summation order differs (per 32-block sums scaled, vs one running sum), plus a
// bf16 rounding flip of the output. Also against today's kernel (gemv_bf16 over the FP8 weight).
void check(const Case& c) {
  const int64_t rows = c.out * c.groups;
  const QuantWeightHost w = testing::random_fp8_weight(rows, c.in, c.block, c.seed, 112);
  std::vector<float> x = testing::random_acts(static_cast<size_t>(c.n * c.groups * c.in), c.seed + 1);
  if (c.tiny_blocks) {  // zero blocks, blocks of tiny values (2^-100), and within-block ranges past 2^32
    for (size_t b = 0; b < x.size() / 32; ++b) {
      if (b % 11 == 3) std::fill_n(x.begin() + b * 32, 32, b % 2 ? -0.0f : 0.0f);
      if (b % 13 == 5)
        for (int i = 0; i < 32; ++i) x[b * 32 + i] = round_to_bf16(x[b * 32 + i] * 0x1p-100f);
      if (b % 7 == 2) x[b * 32 + b % 32] = round_to_bf16(x[b * 32 + b % 32] * 0x1p40f);
    }
  }
  auto dw = upload(w.data), ds = upload(w.scales);
  auto dx = upload(x);
  const QuantWeightView view{QuantWeightFormat::FP8Block, rows, c.in, dw.get(), ds.get(), c.block, c.block};
  auto codes = alloc<uint16_t>(x.size());
  auto scales = alloc<float>(x.size() / 32);
  auto y = alloc<float>(static_cast<size_t>(c.n * rows));
  StagedGemvArgs a;
  a.w = view;
  a.groups = c.groups;
  a.x = dx.get();
  a.y = y.get();
  a.n = c.n;
  a.bf16_output = c.bf16_output;
  a.codes = codes.get();
  a.scales = scales.get();
  a.capacity_values = static_cast<int64_t>(x.size());
  const std::string tag = "gemv_fp8_staged " + std::to_string(c.groups) + "x" + std::to_string(c.out) + "x" +
                          std::to_string(c.in) + " n=" + std::to_string(c.n) + " b" + std::to_string(c.block) +
                          (c.bf16_output ? "" : " f32") + (c.tiny_blocks ? " tiny" : "");
  std::vector<float> got;
  for (const bool pdl : {false, true}) {  // PDL changes when the kernels start, never their results
    a.programmatic_launch = pdl;
    const Status s = gemv_fp8_staged(a, nullptr);
    ASSERT_TRUE(s.ok()) << s.error().message;
    const auto r = download(y);
    if (pdl) {
      EXPECT_EQ(std::memcmp(r.data(), got.data(), got.size() * sizeof(float)), 0) << tag << ": PDL changed bits";
    } else {
      got = r;
    }
  }
  // The reference: cpu::linear over the bf16 weight per group, Σ|w|·|x| as the per-element bound.
  const std::vector<uint16_t> wcpu = dequantize_fp8_block_to_bf16(w.cpu, nullptr);
  std::vector<float> want(got.size()), bound(got.size());
  for (int64_t g = 0; g < c.groups; ++g) {
    std::vector<uint8_t> wg(reinterpret_cast<const uint8_t*>(wcpu.data() + g * c.out * c.in),
                            reinterpret_cast<const uint8_t*>(wcpu.data() + (g + 1) * c.out * c.in));
    std::vector<uint8_t> ag = wg;
    for (size_t i = 1; i < ag.size(); i += 2) ag[i] &= 0x7F;  // |w|: clear the bf16 sign bits
    std::vector<float> xg(static_cast<size_t>(c.n * c.in)), axg(xg.size());
    for (int64_t t = 0; t < c.n; ++t) std::copy_n(x.begin() + (t * c.groups + g) * c.in, c.in, xg.begin() + t * c.in);
    for (size_t i = 0; i < xg.size(); ++i) axg[i] = std::fabs(xg[i]);
    // The staging's own error: a value below 2^-32 of its block's |max| may round on the f16 grid, by
    // at most amax·2^-40 (f16_stage.h), so Σ_k |w_k|·amax_block(k)·2^-40 is added to the bound (it matters
    // only where a block spans more than 2^32, e.g. a huge value whose weight is zero).
    std::vector<float> amx(xg.size());
    for (size_t b0 = 0; b0 < axg.size(); b0 += 32) {
      const float m = *std::max_element(axg.begin() + b0, axg.begin() + b0 + 32);
      std::fill_n(amx.begin() + b0, 32, m);
    }
    std::vector<float> yg(static_cast<size_t>(c.n * c.out)), bg(yg.size()), sg(yg.size());
    const cpu::LinearWeight lw{.format = WeightFormat::BF16, .out = c.out, .in = c.in, .data = wg.data()};
    const cpu::LinearWeight la{.format = WeightFormat::BF16, .out = c.out, .in = c.in, .data = ag.data()};
    ASSERT_TRUE(cpu::linear(lw, xg, c.n, yg, {.bf16_output = c.bf16_output}, &testing::pool()).ok());
    ASSERT_TRUE(cpu::linear(la, axg, c.n, bg, {.bf16_output = false}, &testing::pool()).ok());
    ASSERT_TRUE(cpu::linear(la, amx, c.n, sg, {.bf16_output = false}, &testing::pool()).ok());
    const double bound_scale = (static_cast<double>(c.in) * 1.125 + 32) * 0x1p-24;
    for (size_t i = 0; i < bg.size(); ++i) bg[i] += static_cast<float>(sg[i] * 0x1p-40 / bound_scale);
    for (int64_t t = 0; t < c.n; ++t) {
      std::copy_n(yg.begin() + t * c.out, c.out, want.begin() + (t * c.groups + g) * c.out);
      std::copy_n(bg.begin() + t * c.out, c.out, bound.begin() + (t * c.groups + g) * c.out);
    }
  }
  const Tolerance tol{.max_nmse = c.bf16_output ? 1e-5 : 1e-9,
                      .min_cosine = 0.99999,
                      .rel = c.bf16_output ? 0x1p-7 : 0.0,
                      .abs = 0,
                      .bound_scale = (static_cast<double>(c.in) * 1.125 + 32) * 0x1p-24};
  EXPECT_TRUE(parity(tag + " vs cpu::linear", got, want, tol, bound));
  // Today's kernel on the same weight (gemv_bf16 with w_fp8, fast path): the same tolerance between the
  // two GPU paths; the count of differing bits is informational (summation order).
  Bf16GemvArgs b;
  b.w_fp8 = dw.get();
  b.w_scales = ds.get();
  b.w_fp8_fast = true;
  b.block_out = b.block_in = c.block;
  b.out = c.out;
  b.in = c.in;
  b.groups = c.groups;
  b.x = dx.get();
  auto yb = alloc<float>(got.size());
  b.y = yb.get();
  b.n = c.n;
  b.bf16_output = c.bf16_output;
  ASSERT_TRUE(gemv_bf16(b, nullptr).ok());
  const auto old = download(yb);
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &old[i], 4) != 0;
  std::printf("PARITY %-48s %zu of %zu outputs differ in bits from gemv_bf16 (fp8 weight)\n", tag.c_str(), differ,
              got.size());
  EXPECT_TRUE(parity(tag + " vs gemv_bf16", got, old, tol, bound));
}

TEST(CudaGemvFp8Staged, MatchesCpuLinear) {
  CEDAR_REQUIRE_GPU();
  // wo_a of V4.1 (32×32 blocks) and V4 (128×128): 8 groups of [1024, 4096] over o [n, 8·4096].
  for (const int64_t block : {int64_t{32}, int64_t{128}})
    for (const int64_t n : {int64_t{1}, int64_t{2}, int64_t{8}})
      check({.out = 1024,
             .in = 4096,
             .groups = 8,
             .n = n,
             .block = block,
             .seed = 20 + static_cast<uint32_t>(n + block)});
  // Edge blocks (zeros, tiny values, in-block ranges past 2^32), fp32 output, more than one token tile,
  // an ungrouped weight and a group count that is not a power of two.
  check({.out = 1024, .in = 4096, .groups = 8, .n = 3, .tiny_blocks = true, .seed = 50});
  check({.out = 128,
         .in = 512,
         .groups = 4,
         .n = 8,
         .block = 128,
         .bf16_output = false,
         .tiny_blocks = true,
         .seed = 51});
  check({.out = 96, .in = 256, .groups = 3, .n = 11, .seed = 52});
  check({.out = 320, .in = 2048, .groups = 1, .n = 1, .seed = 53});
}

TEST(CudaGemvFp8Staged, RejectsBadArguments) {
  CEDAR_REQUIRE_GPU();
  auto buf = alloc<uint8_t>(1 << 16);
  auto x = alloc<float>(1024);
  auto y = alloc<float>(1024);
  auto codes = alloc<uint16_t>(1024);
  auto scales = alloc<float>(64);
  StagedGemvArgs a;
  a.w = QuantWeightView{QuantWeightFormat::FP8Block, 64, 128, buf.get(), buf.get(), 32, 32};
  a.groups = 2;
  a.x = x.get();
  a.y = y.get();
  a.n = 2;
  a.codes = codes.get();
  a.scales = scales.get();
  a.capacity_values = 1024;
  ASSERT_TRUE(gemv_fp8_staged(a, nullptr).ok());
  auto expect_error = [&](StagedGemvArgs b, const std::string& needle) {
    const Status s = gemv_fp8_staged(b, nullptr);
    ASSERT_FALSE(s.ok()) << "expected an error naming " << needle;
    EXPECT_NE(s.error().message.find(needle), std::string::npos) << s.error().message;
  };
  StagedGemvArgs b = a;
  b.w.format = QuantWeightFormat::MXFP4;
  expect_error(b, "FP8Block");
  b = a;
  b.groups = 3;
  expect_error(b, "groups");
  b = a;
  b.groups = 4;  // 16 rows per group: not whole 32-row scale blocks
  expect_error(b, "block_out");
  b = a;
  b.capacity_values = 2 * 2 * 128 - 32;
  expect_error(b, "workspace");
  b = a;
  b.x = nullptr;
  expect_error(b, "x and y");
  b = a;
  b.w.in = 100;
  expect_error(b, "in=100");
}

}  // namespace
}  // namespace cedar::cuda
