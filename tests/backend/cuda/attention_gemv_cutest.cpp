// Parity of gemv_bf16 (plain, split-K, multi-pass, grouped/strided) with cpu::linear for BF16 weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_cutest_util.h"
#include "backend/cpu/ops.h"

namespace cedar::cuda {
namespace {

using testing::device_alloc;
using testing::device_filled;
using testing::parity;
using testing::to_device;
using testing::to_host;
using testing::Tolerance;

struct GemvCase {
  int64_t out = 0, in = 0, groups = 1, n = 1;
  bool bf16_output = false;
  int64_t x_pad = 0, y_pad = 0;  // extra floats per token row (strided layouts)
  uint32_t seed = 1;
};

// cpu::linear of group g (its slice of every token row) into want/bound, laid out [n, groups·out].
void cpu_reference(const GemvCase& c, const std::vector<float>& w, const std::vector<float>& x, int64_t x_row,
                   std::vector<float>& want, std::vector<float>& bound) {
  want.assign(c.n * c.groups * c.out, 0.0f);
  bound.assign(want.size(), 0.0f);
  for (int64_t g = 0; g < c.groups; ++g) {
    std::vector<float> wg(w.begin() + g * c.out * c.in, w.begin() + (g + 1) * c.out * c.in), xg(c.n * c.in);
    for (int64_t t = 0; t < c.n; ++t) std::copy_n(x.begin() + t * x_row + g * c.in, c.in, xg.begin() + t * c.in);
    std::vector<float> aw(wg.size()), ax(xg.size()), yg(c.n * c.out), bg(c.n * c.out);
    std::transform(wg.begin(), wg.end(), aw.begin(), [](float v) { return std::fabs(v); });
    std::transform(xg.begin(), xg.end(), ax.begin(), [](float v) { return std::fabs(v); });
    const std::vector<uint8_t> wb = testing::bf16_bytes(testing::bf16_bits(wg));
    const std::vector<uint8_t> ab = testing::bf16_bytes(testing::bf16_bits(aw));
    cpu::LinearWeight lw{.format = WeightFormat::BF16, .out = c.out, .in = c.in, .data = wb.data()};
    cpu::LinearWeight la{.format = WeightFormat::BF16, .out = c.out, .in = c.in, .data = ab.data()};
    ASSERT_TRUE(cpu::linear(lw, xg, c.n, yg, {.bf16_output = c.bf16_output}, nullptr).ok());
    ASSERT_TRUE(cpu::linear(la, ax, c.n, bg, {.bf16_output = false}, nullptr).ok());  // Σ|x·w| per output
    for (int64_t t = 0; t < c.n; ++t) {
      std::copy_n(yg.begin() + t * c.out, c.out, want.begin() + (t * c.groups + g) * c.out);
      std::copy_n(bg.begin() + t * c.out, c.out, bound.begin() + (t * c.groups + g) * c.out);
    }
  }
}

void check(const GemvCase& c, bool use_splitk = true) {
  const int64_t x_row = c.groups * c.in + c.x_pad, y_row = c.groups * c.out + c.y_pad;
  // Weights with a per-row power-of-two spread, activations with a per-32-block spread.
  const std::vector<float> w = testing::random_bf16(c.groups * c.out * c.in, c.seed, -6, 0, c.in);
  const std::vector<float> x = testing::random_bf16(c.n * x_row, c.seed + 1, -8, 4, 32);
  std::vector<float> want, bound;
  cpu_reference(c, w, x, x_row, want, bound);

  auto dw = to_device(testing::bf16_bits(w));
  auto dx = to_device(x);
  auto dy = device_filled<float>(c.n * y_row, 0xFF);  // NaN: unwritten outputs and stray writes show
  const SplitKSize split = use_splitk ? gemv_bf16_splitk_size(c.out, c.in, c.groups) : SplitKSize{};
  auto dpart = device_alloc<float>(split.partial_floats);
  auto dcount = device_alloc<unsigned>(split.counters);
  ASSERT_TRUE(dcount.zero().ok());
  Bf16GemvArgs a{.w = dw.get(),
                 .out = c.out,
                 .in = c.in,
                 .groups = c.groups,
                 .x = dx.get(),
                 .x_row_stride = x_row,
                 .y = dy.get(),
                 .y_row_stride = y_row,
                 .n = c.n,
                 .bf16_output = c.bf16_output};
  const SplitKWorkspace ws{dpart.get(), dcount.get(), split.partial_floats, split.counters};

  // bf16 × bf16 products are exact on both sides; only the summation order differs. The CPU's
  // sequential fp32 sum is within (in−1)·2^-24·Σ|x·w| of the exact sum, the GPU's (in/16 MMA
  // accumulations that may truncate, ≤ 2^-23 each, plus ≤ 32 warp/split additions) within
  // (in/8 + 32)·2^-24·Σ|x·w|; a bf16 output can in addition flip one rounding (≤ 2^-7·|y|).
  Tolerance tol{.max_nmse = c.bf16_output ? 1e-5 : 1e-9,
                .min_cosine = 0.99999,
                .rel = c.bf16_output ? 0x1p-7 : 0.0,
                .abs = 0,
                .bound_scale = (static_cast<double>(c.in) * 1.125 + 32) * 0x1p-24};
  std::string tag = "gemv_bf16 " + std::to_string(c.groups) + "x" + testing::shape_str(c.out, c.in) +
                    " n=" + std::to_string(c.n) + (c.bf16_output ? " bf16" : " f32") +
                    (split.counters ? " splitk" : "") + (c.x_pad || c.y_pad ? " strided" : "");
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {  // the second run checks re-armed split-K counters and determinism
    const Status s = gemv_bf16(a, nullptr, ws);
    ASSERT_TRUE(s.ok()) << s.error().message;
    const std::vector<float> y = to_host(dy);
    std::vector<float> got(want.size());
    size_t stray = 0;
    for (int64_t t = 0; t < c.n; ++t) {
      std::copy_n(y.begin() + t * y_row, c.groups * c.out, got.begin() + t * c.groups * c.out);
      for (int64_t i = c.groups * c.out; i < y_row; ++i) stray += !std::isnan(y[t * y_row + i]);
    }
    EXPECT_EQ(stray, 0u) << tag << ": wrote into the padding between output rows";
    EXPECT_TRUE(parity(tag, got, want, tol, bound));
    if (rep == 0) {
      first = got;
    } else {
      EXPECT_TRUE(std::equal(first.begin(), first.end(), got.begin(),
                             [](float p, float q) { return std::memcmp(&p, &q, 4) == 0; }))
          << tag << ": two runs differ (not deterministic)";
    }
  }
}

TEST(CudaGemvBf16, MatchesCpuLinear) {
  CEDAR_REQUIRE_GPU_ATTN();
  check({.out = 4100, .in = 5120, .n = 1, .seed = 11});                       // head-like, partial row tile
  check({.out = 512, .in = 5120, .n = 2, .seed = 12});                        // compressor wkv/wgate: split-K
  check({.out = 512, .in = 5120, .n = 2, .seed = 12}, /*use_splitk=*/false);  // same, unsplit
  check({.out = 32, .in = 5120, .n = 3, .bf16_output = true, .seed = 13});    // indexer weights_proj
  check({.out = 128, .in = 512, .n = 9, .bf16_output = true, .seed = 14});    // indexer wk, two token tiles
  check({.out = 40, .in = 104, .n = 70, .seed = 15});                         // two passes (64 + 6), partial chunk
  check({.out = 48, .in = 256, .n = 33, .bf16_output = true, .seed = 16});    // 5 token tiles in one pass
}

TEST(CudaGemvBf16, GroupedMatchesPerGroupLinear) {
  CEDAR_REQUIRE_GPU_ATTN();
  // wo_a: 8 groups of [1024, 4096] over consecutive 4096-slices of o, bf16 out.
  check({.out = 1024, .in = 4096, .groups = 8, .n = 2, .bf16_output = true, .seed = 21});
  check({.out = 32, .in = 64, .groups = 2, .n = 5, .bf16_output = true, .x_pad = 8, .y_pad = 3, .seed = 22});
  check({.out = 20, .in = 2048, .groups = 3, .n = 12, .x_pad = 4, .seed = 23});  // grouped split-K, 2 tiles
}

TEST(CudaGemvBf16, RejectsBadArguments) {
  CEDAR_REQUIRE_GPU_ATTN();
  auto dw = device_alloc<uint16_t>(64);
  auto dx = device_alloc<float>(64);
  auto dy = device_alloc<float>(64);
  Bf16GemvArgs a{.w = dw.get(), .out = 4, .in = 12, .x = dx.get(), .y = dy.get(), .n = 1};
  Status s = gemv_bf16(a, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("in=12"), std::string::npos) << s.error().message;
  a.in = 8;
  a.x = dx.get() + 1;  // 4-byte aligned only
  s = gemv_bf16(a, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("aligned"), std::string::npos) << s.error().message;
  a.x = dx.get();
  a.groups = 0;
  EXPECT_FALSE(gemv_bf16(a, nullptr).ok());
}

}  // namespace
}  // namespace cedar::cuda
