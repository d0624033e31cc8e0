// The staged (cp.async ring) GEMV kernels against the register kernels they replace: same compute,
// same group order per warp, same summation order, so the outputs must be equal bit for bit for
// the same schedule. Model shapes (V4.1: w1/w3 2048×5120, w2 5120×2048; released w1/w3 2304×5120),
// both the device-item path (moe_build_items, the routed experts of a decode step) and the host-item
// path. The CPU-oracle tests (ffn_moe_cutest.cpp) run the staged default against cpu::linear.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/ffn_kernels.h"
#include "cuda_test_util.h"
#include "ffn_test_util.h"

namespace cedar::cuda {
namespace {

using namespace ffn_testing;

// Random MXFP4 bytes (any byte is a valid pair of e2m1 codes) and UE8M0 scales in [118, 125]: finite
// results with many scale values. The layout (plain or packed) does not matter: both kernels read the
// same bytes.
struct RandomExperts {
  std::vector<DeviceBuffer<uint8_t>> data, scales;
  std::vector<const uint8_t*> data_ptr, scale_ptr;
};
RandomExperts random_experts(int64_t count, int64_t out, int64_t in, uint32_t seed) {
  RandomExperts r;
  std::mt19937 rng(seed);
  for (int64_t e = 0; e < count; ++e) {
    std::vector<uint8_t> w(out * in / 2), s(out * in / 32);
    for (auto& b : w) b = static_cast<uint8_t>(rng());
    for (auto& b : s) b = static_cast<uint8_t>(118 + rng() % 8);
    r.data.push_back(upload(w));
    r.scales.push_back(upload(s));
    r.data_ptr.push_back(r.data.back().get());
    r.scale_ptr.push_back(r.scales.back().get());
  }
  return r;
}

// Bitwise equality; the message names the case, the first differing element and the count.
::testing::AssertionResult same_bits(const std::string& what, const std::vector<float>& got,
                                     const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " vs " << want.size() << " values";
  size_t first = got.size(), bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      if (bad++ == 0) first = i;
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  char buf[256];
  std::snprintf(buf, sizeof buf, ": %zu of %zu values differ; first at %zu: staged %.9g, register kernel %.9g", bad,
                got.size(), first, got[first], want[first]);
  return ::testing::AssertionFailure() << what << buf;
}

QuantWeightView mxfp4_shape(int64_t out, int64_t in) {
  return QuantWeightView{.format = QuantWeightFormat::MXFP4, .out = out, .in = in, .block_out = 32, .block_in = 32};
}

// The routed experts of n tokens × top-K over E experts: w1+w3 (one item table, 2 matrices) from the
// tokens' codes and w2 from per-pair codes, staged vs register kernel for both packed schedules.
void check_items(int64_t inter, int64_t d, int64_t n, int64_t K, int64_t E, uint32_t seed) {
  const auto w1 = random_experts(E, inter, d, seed), w3 = random_experts(E, inter, d, seed + 1);
  const auto w2 = random_experts(E, d, inter, seed + 2);
  const int64_t P = n * K;
  std::vector<int32_t> experts(P);
  std::mt19937 rng(seed + 3);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < K; ++k) experts[t * K + k] = static_cast<int32_t>((t * 5 + k * 3 + rng() % 2) % E);
  auto dx = upload(random_acts(n * d, seed + 4));
  auto xc = alloc<uint16_t>(n * d);
  auto xs = alloc<float>(n * d / 32);
  ASSERT_TRUE(quantize_act_fp8(dx.get(), n, d, xc.get(), xs.get(), nullptr).ok());
  auto dh = upload(random_acts(P * inter, seed + 5));
  auto hc = alloc<uint16_t>(P * inter);
  auto hs = alloc<float>(P * inter / 32);
  ASSERT_TRUE(quantize_act_fp8(dh.get(), P, inter, hc.get(), hs.get(), nullptr).ok());
  auto dexp = upload(experts);
  auto t1 = upload(w1.data_ptr), u1 = upload(w1.scale_ptr), t3 = upload(w3.data_ptr), u3 = upload(w3.scale_ptr);
  auto t2 = upload(w2.data_ptr), u2 = upload(w2.scale_ptr);
  auto items13 = alloc<DeviceGemvItem>(2 * P);
  auto items2 = alloc<DeviceGemvItem>(P);
  auto counts = alloc<int32_t>(2);
  auto g = alloc<float>(P * inter), u = alloc<float>(P * inter), y2 = alloc<float>(P * d);
  MoeDispatchArgs a;
  a.experts = dexp.get();
  a.n = n;
  a.topk = K;
  a.n_experts = E;
  a.n_tables = 2;
  a.tables[0] = MoeItemTable{2,
                             {{t1.get(), u1.get()}, {t3.get(), u3.get()}},
                             {g.get(), u.get()},
                             xc.get(),
                             xs.get(),
                             false,
                             items13.get(),
                             counts.get(),
                             2 * P};
  a.tables[1] = MoeItemTable{
      1, {{t2.get(), u2.get()}, {}}, {y2.get(), nullptr}, hc.get(), hs.get(), true, items2.get(), counts.get() + 1, P};
  ASSERT_TRUE(moe_build_items(a, nullptr).ok());
  const QuantWeightView s13 = mxfp4_shape(inter, d), s2 = mxfp4_shape(d, inter);
  for (const Mxfp4Layout layout : {Mxfp4Layout::Packed, Mxfp4Layout::PackedBalanced}) {
    const std::string tag = std::string(layout == Mxfp4Layout::Packed ? "packed" : "packed-balanced") +
                            " items n=" + std::to_string(n) + " K=" + std::to_string(K) + " E=" + std::to_string(E);
    std::vector<float> want_g, want_u, want_y, got_g, got_u, got_y;
    for (const bool staged : {false, true}) {
      ASSERT_TRUE(g.zero().ok() && u.zero().ok() && y2.zero().ok());
      Status s = gemv_quantized_items(s13, layout, items13.get(), counts.get(), 2 * P, true, nullptr, staged);
      ASSERT_TRUE(s.ok()) << s.error().message;
      s = gemv_quantized_items(s2, layout, items2.get(), counts.get() + 1, P, true, nullptr, staged);
      ASSERT_TRUE(s.ok()) << s.error().message;
      (staged ? got_g : want_g) = download(g);
      (staged ? got_u : want_u) = download(u);
      (staged ? got_y : want_y) = download(y2);
    }
    const std::string w13 = " w1/w3 " + std::to_string(inter) + "x" + std::to_string(d);
    EXPECT_TRUE(same_bits(tag + w13 + " (w1)", got_g, want_g));
    EXPECT_TRUE(same_bits(tag + w13 + " (w3)", got_u, want_u));
    EXPECT_TRUE(same_bits(tag + " w2 " + std::to_string(d) + "x" + std::to_string(inter), got_y, want_y));
  }
}

TEST(CudaGemvStaged, PackedItemsEqualRegisterKernelBitForBit) {
  CEDAR_REQUIRE_GPU();
  for (const int64_t n : {1, 2, 8}) check_items(2048, 5120, n, 6, 8, 300 + static_cast<uint32_t>(n));  // V4.1
  check_items(2304, 5120, 2, 6, 8, 310);  // released shape: w2 has 18 groups (balanced: 6 warps)
}

// Host items (gemv_mxfp4_packed_grouped): `count` matrices on the same codes, several token tiles.
void check_grouped(int64_t count, int64_t out, int64_t in, int64_t n, bool balanced, uint32_t seed) {
  const auto w = random_experts(count, out, in, seed);
  auto dx = upload(random_acts(n * in, seed + 1));
  auto codes = alloc<uint16_t>(n * in);
  auto scales = alloc<float>(n * in / 32);
  ASSERT_TRUE(quantize_act_fp8(dx.get(), n, in, codes.get(), scales.get(), nullptr).ok());
  auto y = alloc<float>(count * n * out);
  std::vector<GemvGroupItem> items;
  for (int64_t i = 0; i < count; ++i)
    items.push_back(GemvGroupItem{w.data_ptr[i], w.scale_ptr[i], codes.get(), scales.get(), y.get() + i * n * out});
  std::vector<float> want, got;
  for (const bool staged : {false, true}) {
    ASSERT_TRUE(y.zero().ok());
    const Status s =
        gemv_mxfp4_packed_grouped(mxfp4_shape(out, in), items.data(), count, n, true, nullptr, balanced, staged);
    ASSERT_TRUE(s.ok()) << s.error().message;
    (staged ? got : want) = download(y);
  }
  EXPECT_TRUE(same_bits(std::string(balanced ? "packed-balanced" : "packed") + " grouped x" + std::to_string(count) +
                            " " + std::to_string(out) + "x" + std::to_string(in) + " n=" + std::to_string(n),
                        got, want));
}

TEST(CudaGemvStaged, PackedGroupedEqualsRegisterKernelBitForBit) {
  CEDAR_REQUIRE_GPU();
  for (const bool balanced : {false, true}) {
    for (const int64_t n : {1, 2, 8}) {
      check_grouped(6, 4096, 5120, n, balanced, 400 + static_cast<uint32_t>(n));  // w1+w3 rows of 3 experts
      check_grouped(6, 5120, 2048, n, balanced, 410 + static_cast<uint32_t>(n));  // w2 of top-6
    }
    check_grouped(18, 40, 384, 11, balanced, 420);   // > 16 matrices, two token tiles, partial row tile, odd groups
    check_grouped(1, 5120, 2304, 3, balanced, 421);  // 18 groups (balanced: 6 warps)
  }
}

// ---- gemv_quantized (FP8 and plain MXFP4) ----------------------------------------------------------

// A random weight: FP8 e4m3 codes without the NaN pattern, or MXFP4 bytes; UE8M0 scales in [118, 125]
// over the format's scale grid.
struct RandomWeight {
  QuantWeightView view;
  DeviceBuffer<uint8_t> data, scales;
};
RandomWeight random_weight(QuantWeightFormat format, int64_t out, int64_t in, int64_t block, uint32_t seed) {
  const bool fp4 = format == QuantWeightFormat::MXFP4;
  std::mt19937 rng(seed);
  std::vector<uint8_t> w(fp4 ? out * in / 2 : out * in);
  for (auto& b : w) {
    b = static_cast<uint8_t>(rng());
    if (!fp4 && (b & 0x7F) == 0x7F) b ^= 1;  // e4m3 NaN → the largest finite magnitude
  }
  const int64_t scale_count = fp4 ? out * in / 32 : ((out + block - 1) / block) * ((in + block - 1) / block);
  std::vector<uint8_t> s(scale_count);
  for (auto& b : s) b = static_cast<uint8_t>(118 + rng() % 8);
  RandomWeight r{QuantWeightView{format, out, in, nullptr, nullptr, fp4 ? 32 : block, fp4 ? 32 : block}, upload(w),
                 upload(s)};
  r.view.data = r.data.get();
  r.view.scales = r.scales.get();
  return r;
}

std::string shape_tag(const QuantWeightView& v, int64_t n, bool splitk) {
  return std::string(v.format == QuantWeightFormat::MXFP4 ? "mxfp4 " : "fp8 ") + std::to_string(v.out) + "x" +
         std::to_string(v.in) + " block " + std::to_string(v.block_out) + " n=" + std::to_string(n) +
         (splitk ? " split-K" : " unsplit");
}

void check_gemv(QuantWeightFormat format, int64_t out, int64_t in, int64_t block, int64_t n, uint32_t seed) {
  const RandomWeight w = random_weight(format, out, in, block, seed);
  auto dx = upload(random_acts(n * in, seed + 1));
  auto codes = alloc<uint16_t>(n * in);
  auto scales = alloc<float>(n * in / 32);
  ASSERT_TRUE(quantize_act_fp8(dx.get(), n, in, codes.get(), scales.get(), nullptr).ok());
  const SplitKSize need = splitk_workspace_size(w.view);
  auto part = alloc<float>(std::max<int64_t>(need.partial_floats, 1));
  auto cnt = alloc<unsigned>(std::max<int64_t>(need.counters, 1));
  ASSERT_TRUE(cnt.zero().ok());
  auto y = alloc<float>(n * out);
  for (const bool splitk : {false, true}) {
    if (splitk && need.partial_floats == 0) continue;  // this shape never splits (the unsplit case covers it)
    const SplitKWorkspace ws =
        splitk ? SplitKWorkspace{part.get(), cnt.get(), need.partial_floats, need.counters} : SplitKWorkspace{};
    std::vector<float> want, got;
    for (const bool staged : {false, true}) {
      ASSERT_TRUE(y.zero().ok());
      const Status s = gemv_quantized(w.view, codes.get(), scales.get(), n, y.get(), true, nullptr, ws, false, staged);
      ASSERT_TRUE(s.ok()) << s.error().message;
      (staged ? got : want) = download(y);
    }
    EXPECT_TRUE(same_bits(shape_tag(w.view, n, splitk), got, want));
  }
}

TEST(CudaGemvStaged, QuantizedEqualsRegisterKernelBitForBit) {
  CEDAR_REQUIRE_GPU();
  for (const int64_t n : {1, 8}) {
    check_gemv(QuantWeightFormat::FP8Block, 5120, 8192, 32, n, 500);   // wo_b (V4.1 blocks)
    check_gemv(QuantWeightFormat::FP8Block, 5120, 8192, 128, n, 501);  // wo_b (V4 blocks)
    check_gemv(QuantWeightFormat::FP8Block, 32768, 1280, 32, n, 502);  // wq_b
    check_gemv(QuantWeightFormat::FP8Block, 2304, 5120, 32, n, 503);   // shared expert w1
    check_gemv(QuantWeightFormat::FP8Block, 1280, 5120, 32, n, 504);   // wq_a (split-K)
    check_gemv(QuantWeightFormat::MXFP4, 2304, 5120, 32, n, 505);      // plain-layout expert w1
  }
  check_gemv(QuantWeightFormat::FP8Block, 48, 96, 32, 11, 506);  // K past the last whole chunk, two token tiles
  check_gemv(QuantWeightFormat::MXFP4, 40, 160, 32, 3, 507);     // MXFP4 partial chunk
}

// wq_a + wkv as one gemv_quantized_multi launch (the model's decode path), with its split-K plan.
TEST(CudaGemvStaged, MultiEqualsRegisterKernelBitForBit) {
  CEDAR_REQUIRE_GPU();
  for (const int64_t n : {1, 8}) {
    const RandomWeight a = random_weight(QuantWeightFormat::FP8Block, 1280, 5120, 32, 600);
    const RandomWeight b = random_weight(QuantWeightFormat::FP8Block, 512, 5120, 32, 601);
    auto dx = upload(random_acts(n * 5120, 602));
    auto codes = alloc<uint16_t>(n * 5120);
    auto scales = alloc<float>(n * 5120 / 32);
    ASSERT_TRUE(quantize_act_fp8(dx.get(), n, 5120, codes.get(), scales.get(), nullptr).ok());
    const QuantWeightView mats[2] = {a.view, b.view};
    const SplitKSize need = splitk_workspace_size_multi(mats, 2);
    auto part = alloc<float>(std::max<int64_t>(need.partial_floats, 1));
    auto cnt = alloc<unsigned>(std::max<int64_t>(need.counters, 1));
    ASSERT_TRUE(cnt.zero().ok());
    auto ya = alloc<float>(n * 1280), yb = alloc<float>(n * 512);
    const GemvGroupItem items[2] = {{a.view.data, a.view.scales, codes.get(), scales.get(), ya.get()},
                                    {b.view.data, b.view.scales, codes.get(), scales.get(), yb.get()}};
    const SplitKWorkspace ws{part.get(), cnt.get(), need.partial_floats, need.counters};
    std::vector<float> want_a, want_b, got_a, got_b;
    for (const bool staged : {false, true}) {
      ASSERT_TRUE(ya.zero().ok() && yb.zero().ok());
      const Status s = gemv_quantized_multi(mats, items, 2, n, true, nullptr, ws, false, staged);
      ASSERT_TRUE(s.ok()) << s.error().message;
      (staged ? got_a : want_a) = download(ya);
      (staged ? got_b : want_b) = download(yb);
    }
    EXPECT_TRUE(same_bits("multi wq_a 1280x5120 n=" + std::to_string(n), got_a, want_a));
    EXPECT_TRUE(same_bits("multi wkv 512x5120 n=" + std::to_string(n), got_b, want_b));
  }
}

}  // namespace
}  // namespace cedar::cuda
