// GemvPrefetch::Slab (session 4): the block-scaled GEMVs ask L2 for their weight rows ahead of their own
// loads. The change is timing only, so every kernel family must give bit-identical results with
// FirstLines (the previous kernels) and Slab: plain FP8 / MXFP4 (with and without split-K, long K for
// the rolling prefetch, ragged tiles), grouped, multi, the device-item GEMVs (plain, packed, packed
// balanced; enough units that blocks loop and prefetch their next unit) and the packed grouped GEMV.
// The CPU-oracle parity of these kernels is covered by their own tests (which run the default, Slab).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/kernels.h"
#include "cuda_test_util.h"
#include "ffn_test_util.h"

namespace cedar::cuda {
namespace {

using namespace ffn_testing;

// Bit equality (memcmp semantics) with the first differing element named.
::testing::AssertionResult same_bits(const std::string& what, const std::vector<float>& slab,
                                     const std::vector<float>& lines) {
  if (slab.size() != lines.size())
    return ::testing::AssertionFailure() << what << ": sizes " << slab.size() << " vs " << lines.size();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < slab.size(); ++i) {
    if (std::memcmp(&slab[i], &lines[i], sizeof(float)) != 0) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": Slab prefetch differs from FirstLines at " << bad << " of "
                                       << slab.size() << " outputs (first at " << first << ": " << slab[first] << " vs "
                                       << lines[first] << "); a prefetch must not change results";
}

struct Acts {
  std::vector<float> x;
  DeviceBuffer<float> dx;
  DeviceBuffer<uint16_t> codes;
  DeviceBuffer<float> scales;
};

Acts quantized_acts(int64_t n, int64_t in, uint32_t seed) {
  Acts a;
  a.x = random_acts(n * in, seed);
  a.dx = upload(a.x);
  a.codes = alloc<uint16_t>(n * in);
  a.scales = alloc<float>(n * in / 32);
  EXPECT_TRUE(quantize_act_fp8(a.dx.get(), n, in, a.codes.get(), a.scales.get(), nullptr).ok());
  return a;
}

// gemv_quantized_grouped over `count` random matrices of one shape, both prefetch modes.
void check_grouped(bool fp4, int64_t count, int64_t out, int64_t in, int64_t n, bool splitk, uint32_t seed) {
  const Acts a = quantized_acts(n, in, seed);
  std::vector<QuantWeightHost> w;
  std::vector<DeviceBuffer<uint8_t>> dw, ds;
  for (int64_t i = 0; i < count; ++i) {
    w.push_back(fp4 ? random_mxfp4_weight(out, in, seed + 3 * i) : random_fp8_weight(out, in, seed + 3 * i));
    dw.push_back(upload(w[i].data));
    ds.push_back(upload(w[i].scales));
  }
  const QuantWeightView shape = view_of(w[0], dw[0].get(), ds[0].get());
  const SplitKSize need = splitk ? splitk_workspace_size(shape, count) : SplitKSize{};
  auto part = alloc<float>(std::max<int64_t>(need.partial_floats, 1));
  auto cnt = alloc<unsigned>(std::max<int64_t>(need.counters, 1));
  ASSERT_TRUE(cnt.zero().ok());
  const SplitKWorkspace wsk{part.get(), cnt.get(), need.partial_floats, need.counters};
  std::vector<float> result[2];
  for (int mode = 0; mode < 2; ++mode) {
    auto y = alloc<float>(count * n * out);
    ASSERT_TRUE(y.zero().ok());
    std::vector<GemvGroupItem> items;
    for (int64_t i = 0; i < count; ++i)
      items.push_back({dw[i].get(), ds[i].get(), a.codes.get(), a.scales.get(), y.get() + i * n * out});
    const Status s = gemv_quantized_grouped(shape, items.data(), count, n, true, nullptr, wsk, false,
                                            mode == 0 ? GemvPrefetch::FirstLines : GemvPrefetch::Slab);
    ASSERT_TRUE(s.ok()) << s.error().message;
    result[mode] = download(y);
  }
  EXPECT_TRUE(same_bits(std::string(fp4 ? "mxfp4" : "fp8") + " gemv x" + std::to_string(count) + " " +
                            std::to_string(out) + "x" + std::to_string(in) + " n=" + std::to_string(n) +
                            (need.counters ? " split-K" : ""),
                        result[1], result[0]));
}

TEST(CudaGemvPrefetch, PlainAndGroupedSlabEqualsFirstLines) {
  CEDAR_REQUIRE_GPU();
  check_grouped(false, 1, 1280, 5120, 1, true, 301);  // wq_a: split-K ×4
  check_grouped(false, 1, 512, 8192, 1, false, 302);  // long K unsplit: 8 chunk rounds (rolling prefetch)
  check_grouped(false, 1, 512, 8192, 4, true, 303);   // long K, split-K
  check_grouped(false, 1, 40, 96, 11, false, 304);    // partial tile, 3 K blocks, two token tiles
  check_grouped(false, 3, 256, 2048, 3, true, 305);   // grouped, split-K
  check_grouped(true, 1, 2304, 5120, 1, true, 306);   // MXFP4 plain, split-K
  check_grouped(true, 1, 256, 16384, 2, false, 307);  // MXFP4 long K unsplit (rolling, scale lines)
  check_grouped(true, 1, 48, 64, 9, false, 308);      // MXFP4 tiny
}

TEST(CudaGemvPrefetch, MultiSlabEqualsFirstLines) {
  CEDAR_REQUIRE_GPU();
  const int64_t in = 5120, n = 1;
  const Acts a = quantized_acts(n, in, 311);
  const std::vector<QuantWeightHost> w = {random_fp8_weight(1280, in, 312), random_fp8_weight(512, in, 313)};
  std::vector<DeviceBuffer<uint8_t>> dw, ds;
  std::vector<QuantWeightView> mats;
  for (const auto& m : w) {
    dw.push_back(upload(m.data));
    ds.push_back(upload(m.scales));
    mats.push_back(view_of(m, nullptr, nullptr));
  }
  const SplitKSize need = splitk_workspace_size_multi(mats.data(), 2);
  auto part = alloc<float>(std::max<int64_t>(need.partial_floats, 1));
  auto cnt = alloc<unsigned>(std::max<int64_t>(need.counters, 1));
  ASSERT_TRUE(cnt.zero().ok());
  const SplitKWorkspace wsk{part.get(), cnt.get(), need.partial_floats, need.counters};
  std::vector<float> result[2][2];
  for (int mode = 0; mode < 2; ++mode) {
    auto y0 = alloc<float>(n * 1280), y1 = alloc<float>(n * 512);
    const GemvGroupItem items[2] = {{dw[0].get(), ds[0].get(), a.codes.get(), a.scales.get(), y0.get()},
                                    {dw[1].get(), ds[1].get(), a.codes.get(), a.scales.get(), y1.get()}};
    const Status s = gemv_quantized_multi(mats.data(), items, 2, n, true, nullptr, wsk, false,
                                          mode == 0 ? GemvPrefetch::FirstLines : GemvPrefetch::Slab);
    ASSERT_TRUE(s.ok()) << s.error().message;
    result[mode][0] = download(y0);
    result[mode][1] = download(y1);
  }
  EXPECT_TRUE(same_bits("fp8 multi wq_a 1280x5120", result[1][0], result[0][0]));
  EXPECT_TRUE(same_bits("fp8 multi wkv 512x5120", result[1][1], result[0][1]));
}

// Device item tables built on the host: `items` items over E experts, item i with rows_of(i) token
// rows (activation rows and scattered output rows), run in both prefetch modes.
void check_items(bool fp4, Mxfp4Layout layout, int64_t out, int64_t in, int64_t n_tokens, int64_t n_items, int64_t E,
                 uint32_t seed) {
  const bool packed = layout != Mxfp4Layout::Plain;
  const Acts a = quantized_acts(n_tokens, in, seed);
  std::vector<QuantWeightHost> w;
  std::vector<DeviceBuffer<uint8_t>> dw, ds;
  for (int64_t e = 0; e < E; ++e) {
    w.push_back(fp4 ? random_mxfp4_weight(out, in, seed + e) : random_fp8_weight(out, in, seed + e));
    std::vector<uint8_t> bytes = w[e].data;
    if (packed) {
      ASSERT_TRUE(repack_mxfp4(w[e].data.data(), out, in, bytes.data()).ok());
    }
    dw.push_back(upload(bytes));
    ds.push_back(upload(w[e].scales));
  }
  std::mt19937 rng(seed);
  std::vector<float> result[2];
  int64_t y_rows = 0;
  std::vector<DeviceGemvItem> host(n_items);
  for (int64_t i = 0; i < n_items; ++i) {
    DeviceGemvItem& it = host[i];
    const int64_t e = static_cast<int64_t>(rng() % E);
    it.data = dw[e].get();
    it.scales = ds[e].get();
    it.act_codes = a.codes.get();
    it.act_scales = a.scales.get();
    it.n = static_cast<int32_t>(1 + rng() % std::min<int64_t>(n_tokens, kGemvItemRows));
    for (int j = 0; j < it.n; ++j) {
      it.act_row[j] = static_cast<int32_t>(rng() % n_tokens);
      it.y_row[j] = static_cast<int32_t>(y_rows++);
    }
  }
  for (int mode = 0; mode < 2; ++mode) {
    auto y = alloc<float>(y_rows * out);
    ASSERT_TRUE(y.zero().ok());
    for (auto& it : host) it.y = y.get();
    auto ditems = upload(host);
    auto dcount = upload(std::vector<int32_t>{static_cast<int32_t>(n_items)});
    const Status s = gemv_quantized_items(view_of(w[0], nullptr, nullptr), layout, ditems.get(), dcount.get(), n_items,
                                          true, nullptr, mode == 0 ? GemvPrefetch::FirstLines : GemvPrefetch::Slab);
    ASSERT_TRUE(s.ok()) << s.error().message;
    result[mode] = download(y);
  }
  const char* lname = layout == Mxfp4Layout::PackedBalanced ? "mxfp4-packed-balanced"
                      : packed                              ? "mxfp4-packed"
                      : fp4                                 ? "mxfp4"
                                                            : "fp8";
  EXPECT_TRUE(same_bits(
      std::string(lname) + " items " + std::to_string(n_items) + " x " + std::to_string(out) + "x" + std::to_string(in),
      result[1], result[0]));
}

TEST(CudaGemvPrefetch, ItemsSlabEqualsFirstLines) {
  CEDAR_REQUIRE_GPU();
  check_items(false, Mxfp4Layout::Plain, 72, 512, 10, 5, 2, 321);              // FP8, partial tile
  check_items(true, Mxfp4Layout::Plain, 256, 1024, 3, 9, 5, 322);              // MXFP4 plain
  check_items(true, Mxfp4Layout::Packed, 2304, 5120, 1, 12, 6, 323);           // w1/w3 of top-6: 864 units
  check_items(true, Mxfp4Layout::Packed, 5120, 2304, 2, 6, 8, 324);            // w2 of top-6: 960 units
  check_items(true, Mxfp4Layout::PackedBalanced, 2304, 5120, 8, 24, 30, 325);  // batch 8, rows 1..8 per item
  check_items(true, Mxfp4Layout::PackedBalanced, 5120, 2304, 1, 6, 6, 326);    // 6 warps × 3 groups
  check_items(true, Mxfp4Layout::PackedBalanced, 40, 384, 9, 7, 3, 327);       // 3 groups, partial tile
}

TEST(CudaGemvPrefetch, PackedGroupedSlabEqualsFirstLines) {
  CEDAR_REQUIRE_GPU();
  for (const bool balanced : {false, true}) {
    for (const auto& [count, out, in, n] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
             {12, 256, 1024, 1}, {1, 2304, 5120, 4}, {2, 128, 16384, 1}}) {
      const Acts a = quantized_acts(n, in, 331);
      std::vector<DeviceBuffer<uint8_t>> dw, ds;
      for (int64_t i = 0; i < count; ++i) {
        const QuantWeightHost w = random_mxfp4_weight(out, in, 332 + i);
        std::vector<uint8_t> pk(w.data.size());
        ASSERT_TRUE(repack_mxfp4(w.data.data(), out, in, pk.data()).ok());
        dw.push_back(upload(pk));
        ds.push_back(upload(w.scales));
      }
      std::vector<float> result[2];
      for (int mode = 0; mode < 2; ++mode) {
        auto y = alloc<float>(count * n * out);
        ASSERT_TRUE(y.zero().ok());
        std::vector<GemvGroupItem> items;
        for (int64_t i = 0; i < count; ++i)
          items.push_back({dw[i].get(), ds[i].get(), a.codes.get(), a.scales.get(), y.get() + i * n * out});
        const QuantWeightView shape{.format = QuantWeightFormat::MXFP4, .out = out, .in = in};
        const Status s = gemv_mxfp4_packed_grouped(shape, items.data(), count, n, true, nullptr, balanced,
                                                   mode == 0 ? GemvPrefetch::FirstLines : GemvPrefetch::Slab);
        ASSERT_TRUE(s.ok()) << s.error().message;
        result[mode] = download(y);
      }
      EXPECT_TRUE(same_bits(std::string(balanced ? "mxfp4-packed-balanced" : "mxfp4-packed") + " grouped x" +
                                std::to_string(count) + " " + std::to_string(out) + "x" + std::to_string(in) +
                                " n=" + std::to_string(n),
                            result[1], result[0]));
    }
  }
}

}  // namespace
}  // namespace cedar::cuda
