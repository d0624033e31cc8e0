// Parity of the routed experts' GEMVs with the CPU oracle (backend/cpu/ops.h): over device-built item
// tables (plain and packed MXFP4 layouts, every forced warp split) and the packed grouped GEMV, plus the
// repack's permutation. Split from ffn_moe_cutest.cpp. Each tolerance says why the GPU may differ at all.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/ffn_kernels.h"
#include "cuda_test_util.h"
#include "ffn_test_util.h"

namespace cedar::cuda {
namespace {

using namespace ffn_testing;
using testing::parity;
using testing::Tolerance;

// ---- GEMVs over device items and the packed layout -----------------------------------------------

// Items built from random routing over E experts: every pair's output against gemv_quantized of that
// expert on that token (bit-equal: same kernel arithmetic) and against cpu::linear.
void check_items_gemv(bool fp4, Mxfp4Layout layout, int64_t out, int64_t in, int64_t n, int64_t K, int64_t E,
                      uint32_t seed, int packed_warps = 0) {
  const bool packed = layout != Mxfp4Layout::Plain;
  std::vector<QuantWeightHost> w;
  for (int64_t e = 0; e < E; ++e)
    w.push_back(fp4 ? random_mxfp4_weight(out, in, seed + e) : random_fp8_weight(out, in, seed + e));
  std::vector<DeviceBuffer<uint8_t>> dw, dwp, ds;
  std::vector<const uint8_t*> wptr, sptr;
  for (int64_t e = 0; e < E; ++e) {
    dw.push_back(upload(w[e].data));
    ds.push_back(upload(w[e].scales));
    if (packed) {
      std::vector<uint8_t> pk(w[e].data.size());
      ASSERT_TRUE(repack_mxfp4(w[e].data.data(), out, in, pk.data()).ok());
      dwp.push_back(upload(pk));
    }
    wptr.push_back(packed ? dwp.back().get() : dw.back().get());
    sptr.push_back(ds.back().get());
  }
  const int64_t P = n * K;
  std::vector<int32_t> experts(P);
  std::mt19937 rng(seed);
  for (auto& e : experts) e = static_cast<int32_t>(rng() % E);
  const auto x = random_acts(n * in, seed + 100);
  auto dx = upload(x);
  auto codes = alloc<uint16_t>(n * in);
  auto scales = alloc<float>(n * in / 32);
  ASSERT_TRUE(quantize_act_fp8(dx.get(), n, in, codes.get(), scales.get(), nullptr).ok());
  auto dexp = upload(experts);
  auto dwt = upload(wptr), dst = upload(sptr);
  auto items = alloc<DeviceGemvItem>(P);
  auto count = alloc<int32_t>(1);
  auto y = alloc<float>(P * out);
  MoeDispatchArgs a;
  a.experts = dexp.get();
  a.n = n;
  a.topk = K;
  a.n_experts = E;
  a.tables[0] = MoeItemTable{
      1, {{dwt.get(), dst.get()}, {}}, {y.get(), nullptr}, codes.get(), scales.get(), false, items.get(), count.get(),
      P};
  ASSERT_TRUE(moe_build_items(a, nullptr).ok());
  const QuantWeightView shape = view_of(w[0], nullptr, nullptr);
  // Packed layouts: units from work counters (twice: the kernel re-arms them) and by the fixed stride,
  // the same bits every time.
  auto work = alloc<unsigned>(2);
  ASSERT_TRUE(work.zero().ok());
  const GemvItemsOptions opt{.work = packed ? work.get() : nullptr, .packed_warps = packed_warps};
  Status s = gemv_quantized_items(shape, layout, items.get(), count.get(), P, true, nullptr, opt);
  ASSERT_TRUE(s.ok()) << s.error().message;
  const auto got = download(y);
  if (packed) {
    for (const bool counters : {true, false}) {
      ASSERT_TRUE(y.zero().ok());
      GemvItemsOptions again = opt;
      again.work = counters ? work.get() : nullptr;
      s = gemv_quantized_items(shape, layout, items.get(), count.get(), P, true, nullptr, again);
      ASSERT_TRUE(s.ok()) << s.error().message;
      const auto rerun = download(y);
      ASSERT_EQ(rerun.size(), got.size());
      EXPECT_EQ(std::memcmp(rerun.data(), got.data(), got.size() * sizeof(float)), 0)
          << (counters ? "a second launch on the re-armed work counters" : "the fixed-stride schedule")
          << " changed the result bits";
    }
    const auto w_after = download(work);
    EXPECT_EQ(w_after[0], 0u) << "work counters not re-armed";
    EXPECT_EQ(w_after[1], 0u) << "work counters not re-armed";
  }
  // Reference 1: the plain GEMV per pair on the GPU (no split-K): the same arithmetic, bit-equal.
  auto yref = alloc<float>(out);
  std::vector<float> plain(P * out), want(P * out), bound(P * out);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t t = p / K, e = experts[p];
    ASSERT_TRUE(gemv_quantized(view_of(w[e], dw[e].get(), ds[e].get()), codes.get() + t * in,
                               scales.get() + t * (in / 32), 1, yref.get(), true, nullptr)
                    .ok());
    const auto row = download(yref);
    std::copy(row.begin(), row.end(), plain.begin() + p * out);
    const std::vector<float> xt(x.begin() + t * in, x.begin() + (t + 1) * in);
    std::vector<float> yc(out);
    ASSERT_TRUE(cpu::linear(w[e].cpu, xt, 1, yc, {.bf16_output = true}, nullptr).ok());
    std::copy(yc.begin(), yc.end(), want.begin() + p * out);
    const auto b = abs_bound(w[e], xt, 1);
    std::copy(b.begin(), b.end(), bound.begin() + p * out);
  }
  const char* lname = layout == Mxfp4Layout::PackedBalanced ? "mxfp4-packed-balanced"
                      : packed                              ? "mxfp4-packed"
                                                            : "mxfp4";
  const std::string tag = std::string(fp4 ? lname : "fp8") + " items " + std::to_string(out) + "x" +
                          std::to_string(in) + " n=" + std::to_string(n) + " K=" + std::to_string(K) +
                          (packed_warps ? " warps=" + std::to_string(packed_warps) : "");
  // vs the CPU: as the GEMV tests (one bf16 flip + tensor-core block sums, 2^-12·Σ|terms|).
  const Tolerance& tol = testing::kBlockSumTol;
  if (layout == Mxfp4Layout::PackedBalanced) {
    // Another K partition: the block sums meet in another order, within the same bound of the plain result.
    EXPECT_TRUE(parity("gemv " + tag + " vs plain gemv", got, plain, tol, bound));
  } else {
    const Tolerance exact{.max_nmse = 0, .min_cosine = 0, .rel = 0, .abs = 0};
    EXPECT_TRUE(parity("gemv " + tag + " vs plain gemv", got, plain, exact));
  }
  EXPECT_TRUE(parity("gemv " + tag + " vs cpu", got, want, tol, bound));
}

TEST(CudaGemvItems, PlainLayoutsMatchGemvAndCpu) {
  CEDAR_REQUIRE_GPU();
  check_items_gemv(true, Mxfp4Layout::Plain, 256, 1024, 3, 6, 5, 201);  // MXFP4, experts shared by tokens
  check_items_gemv(false, Mxfp4Layout::Plain, 72, 512, 10, 2, 2, 202);  // FP8, > 8 pairs per expert, partial tile
  check_items_gemv(true, Mxfp4Layout::Plain, 48, 96, 2, 3, 4, 203);     // MXFP4 K not a multiple of 128 (tiny)
}

TEST(CudaGemvItems, PackedLayoutMatchesPlainBitForBit) {
  CEDAR_REQUIRE_GPU();
  check_items_gemv(true, Mxfp4Layout::Packed, 2304, 5120, 1, 6, 6, 211);  // released w1/w3 shape, batch 1
  check_items_gemv(true, Mxfp4Layout::Packed, 5120, 2304, 2, 6, 8, 212);  // released w2 shape (9 runs of 8)
  check_items_gemv(true, Mxfp4Layout::Packed, 40, 384, 9, 2, 3, 213);     // half run at the end of K, partial tile
}

TEST(CudaGemvItems, PackedBalancedMatchesCpu) {
  CEDAR_REQUIRE_GPU();
  check_items_gemv(true, Mxfp4Layout::PackedBalanced, 2304, 5120, 1, 6, 6, 214);  // 40 groups: 10 per warp
  check_items_gemv(true, Mxfp4Layout::PackedBalanced, 5120, 2304, 2, 6, 8, 215);  // 18 groups: 4 or 5 per warp
  check_items_gemv(true, Mxfp4Layout::PackedBalanced, 40, 384, 9, 2, 3, 216);     // 3 groups: fewer than the warps
}

// Every forced split (2..8 warps per block; fewer warps: more resident blocks, so a larger grid) on the
// released shapes: the K partition changes, the result stays within the GEMV bound of the CPU.
TEST(CudaGemvItems, PackedBalancedEverySplitMatchesCpu) {
  CEDAR_REQUIRE_GPU();
  for (int warps = 2; warps <= 8; ++warps) {
    check_items_gemv(true, Mxfp4Layout::PackedBalanced, 2304, 5120, 1, 6, 6, 217, warps);
    check_items_gemv(true, Mxfp4Layout::PackedBalanced, 5120, 2304, 2, 6, 8, 218, warps);
    check_items_gemv(true, Mxfp4Layout::PackedBalanced, 40, 384, 9, 2, 3, 219, warps);
  }
}

TEST(CudaGemvItems, ForcedSplitIsRejectedOutsideTheBalancedLayout) {
  CEDAR_REQUIRE_GPU();
  const QuantWeightView shape{QuantWeightFormat::MXFP4, 64, 256, nullptr, nullptr, 32, 32};
  auto items = alloc<DeviceGemvItem>(1);
  auto count = alloc<int32_t>(1);
  for (const auto& [layout, warps] : {std::pair{Mxfp4Layout::Plain, 4}, std::pair{Mxfp4Layout::Packed, 4},
                                      std::pair{Mxfp4Layout::PackedBalanced, 1},
                                      std::pair{Mxfp4Layout::PackedBalanced, 9}}) {
    const Status s = gemv_quantized_items(shape, layout, items.get(), count.get(), 1, true, nullptr, {.packed_warps = warps});
    ASSERT_FALSE(s.ok()) << "warps=" << warps;
    EXPECT_NE(s.error().message.find("warps"), std::string::npos) << s.error().message;
  }
}

void check_packed_grouped(int64_t count, int64_t out, int64_t in, int64_t n, uint32_t seed, bool balanced = false) {
  std::vector<QuantWeightHost> w;
  std::vector<DeviceBuffer<uint8_t>> dw, dwp, ds;
  std::vector<DeviceBuffer<float>> y, yp;
  std::vector<GemvGroupItem> plain_items, packed_items;
  const auto x = random_acts(n * in, seed + 7);
  auto dx = upload(x);
  auto codes = alloc<uint16_t>(n * in);
  auto scales = alloc<float>(n * in / 32);
  ASSERT_TRUE(quantize_act_fp8(dx.get(), n, in, codes.get(), scales.get(), nullptr).ok());
  for (int64_t i = 0; i < count; ++i) {
    w.push_back(random_mxfp4_weight(out, in, seed + 11 * i));
    std::vector<uint8_t> pk(w[i].data.size());
    ASSERT_TRUE(repack_mxfp4(w[i].data.data(), out, in, pk.data()).ok());
    dw.push_back(upload(w[i].data));
    dwp.push_back(upload(pk));
    ds.push_back(upload(w[i].scales));
    y.push_back(alloc<float>(n * out));
    yp.push_back(alloc<float>(n * out));
    plain_items.push_back(GemvGroupItem{dw[i].get(), ds[i].get(), codes.get(), scales.get(), y[i].get()});
    packed_items.push_back(GemvGroupItem{dwp[i].get(), ds[i].get(), codes.get(), scales.get(), yp[i].get()});
  }
  const QuantWeightView shape{.format = QuantWeightFormat::MXFP4, .out = out, .in = in};
  ASSERT_TRUE(gemv_quantized_grouped(shape, plain_items.data(), count, n, true, nullptr).ok());  // no split-K
  const Status s = gemv_mxfp4_packed_grouped(shape, packed_items.data(), count, n, true, nullptr, balanced);
  ASSERT_TRUE(s.ok()) << s.error().message;
  const Tolerance exact{.max_nmse = 0, .min_cosine = 0, .rel = 0, .abs = 0};
  const Tolerance& tol = testing::kBlockSumTol;
  for (int64_t i = 0; i < count; ++i) {
    const std::string tag = std::string(balanced ? "mxfp4-packed-balanced" : "mxfp4-packed") + " grouped " +
                            std::to_string(i) + "/" + std::to_string(count) + " " + std::to_string(out) + "x" +
                            std::to_string(in) + " n=" + std::to_string(n);
    const auto got = download(yp[i]);
    const auto bound = abs_bound(w[i], x, n);
    // Plain schedule: bit-equal; balanced: the same block sums added in another order (GEMV bound).
    EXPECT_TRUE(parity(tag + " vs plain", got, download(y[i]), balanced ? tol : exact, bound));
    std::vector<float> want(n * out);
    ASSERT_TRUE(cpu::linear(w[i].cpu, x, n, want, {.bf16_output = true}, nullptr).ok());
    EXPECT_TRUE(parity(tag + " vs cpu", got, want, tol, bound));
  }
}

TEST(CudaGemvPacked, GroupedEqualsPlainBitForBit) {
  CEDAR_REQUIRE_GPU();
  check_packed_grouped(12, 256, 1024, 1, 221);  // w1/w3 of 6 experts, one launch
  check_packed_grouped(18, 32, 128, 11, 222);   // > 16 matrices (two launches), two token tiles
  check_packed_grouped(1, 2304, 5120, 4, 223);  // released expert w1
}

TEST(CudaGemvPacked, BalancedGroupedMatchesCpu) {
  CEDAR_REQUIRE_GPU();
  check_packed_grouped(6, 5120, 2304, 1, 224, true);  // released w2 of top-6: 6 warps × 3 groups
  check_packed_grouped(2, 256, 640, 10, 225, true);   // 5 groups: 5 warps, two token tiles
}

TEST(CudaGemvPacked, RepackIsTheDocumentedPermutationAndRejectsOddShapes) {
  // Host-only: no GPU needed. Thread t's 16 bytes of group q hold its 4 bytes (values 8t .. 8t + 7,
  // low nibble first) of blocks 4q..4q+3, one 32-bit word per block in the f16 placement: byte k has
  // value k's magnitude at bits 1..3 and sign at 7, value 4 + k's at bits 4..6 and 0.
  const int64_t out = 3, in = 256;
  std::vector<uint8_t> plain(out * in / 2), packed(plain.size());
  std::mt19937 rng(7);
  for (uint8_t& b : plain) b = static_cast<uint8_t>(rng());
  ASSERT_TRUE(repack_mxfp4(plain.data(), out, in, packed.data()).ok());
  for (int64_t r = 0; r < out; ++r)
    for (int64_t kb = 0; kb < in / 32; ++kb)
      for (int t = 0; t < 4; ++t)
        for (int v = 0; v < 8; ++v) {
          const uint8_t src = plain[r * in / 2 + kb * 16 + 4 * t + v / 2];
          const int code = v % 2 ? src >> 4 : src & 15;
          const uint8_t byte = packed[r * in / 2 + (kb / 4) * 64 + 16 * t + 4 * (kb % 4) + v % 4];
          const int mag = v < 4 ? (byte >> 1) & 7 : (byte >> 4) & 7, sign = v < 4 ? byte >> 7 : byte & 1;
          ASSERT_EQ(mag | (sign << 3), code) << "row " << r << " block " << kb << " thread " << t << " value " << v;
        }
  EXPECT_FALSE(repack_mxfp4(plain.data(), 3, 96, packed.data()).ok());
  EXPECT_FALSE(mxfp4_packable(16, 96));
  EXPECT_TRUE(mxfp4_packable(2304, 5120));
  EXPECT_TRUE(mxfp4_packable(5120, 2304));
}

}  // namespace
}  // namespace cedar::cuda
