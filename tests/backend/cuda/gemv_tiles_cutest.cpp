// The routed experts' GEMV over the MXFP4 tile layout (gemv_tiles.cu): bit for bit against the balanced
// packed kernel it re-implements (same K partition, same order), on device item tables built from random
// routing, with and without the exponent-add scale path, with the work counters or a fixed stride; and
// against the CPU oracle.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
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

struct TilesCase {
  int64_t out, in, n, K, E;
  uint32_t seed;
};

// One item table per layout (same routing, same activations): packed words for the balanced kernel, tile
// chunks for the tile kernel.
void check_tiles_gemv(const TilesCase& c) {
  std::vector<QuantWeightHost> w;
  std::vector<DeviceBuffer<uint8_t>> packed, tiles, scales;
  std::vector<const uint8_t*> packed_ptr, tiles_ptr, scale_ptr;
  bool exp_add_ok = true;
  for (int64_t e = 0; e < c.E; ++e) {
    w.push_back(random_mxfp4_weight(c.out, c.in, c.seed + e));
    std::vector<uint8_t> pk(w[e].data.size()), tl(mxfp4_tiles_bytes(c.out, c.in));
    ASSERT_TRUE(repack_mxfp4(w[e].data.data(), c.out, c.in, pk.data()).ok());
    const Status st = repack_mxfp4_tiles(w[e].data.data(), w[e].scales.data(), c.out, c.in, tl.data());
    ASSERT_TRUE(st.ok()) << st.error().message;
    exp_add_ok = exp_add_ok && mxfp4_scales_allow_exp_add(w[e].scales.data(), w[e].scales.size());
    packed.push_back(upload(pk));
    tiles.push_back(upload(tl));
    scales.push_back(upload(w[e].scales));
    packed_ptr.push_back(packed.back().get());
    tiles_ptr.push_back(tiles.back().get());
    scale_ptr.push_back(scales.back().get());
  }
  const int64_t P = c.n * c.K;
  std::vector<int32_t> experts(P);
  std::mt19937 rng(c.seed);
  for (auto& e : experts) e = static_cast<int32_t>(rng() % c.E);
  const auto x = random_acts(c.n * c.in, c.seed + 100);
  auto dx = upload(x);
  auto codes = alloc<uint16_t>(c.n * c.in);
  auto act_scales = alloc<float>(c.n * c.in / 32);
  ASSERT_TRUE(quantize_act_fp8(dx.get(), c.n, c.in, codes.get(), act_scales.get(), nullptr).ok());
  auto dexp = upload(experts);
  auto dpk = upload(packed_ptr), dtl = upload(tiles_ptr), dsc = upload(scale_ptr);
  auto items_packed = alloc<DeviceGemvItem>(P), items_tiles = alloc<DeviceGemvItem>(P);
  auto count = alloc<int32_t>(2);
  auto y_packed = alloc<float>(P * c.out), y_tiles = alloc<float>(P * c.out);
  MoeDispatchArgs a;
  a.experts = dexp.get();
  a.n = c.n;
  a.topk = c.K;
  a.n_experts = c.E;
  a.n_tables = 2;
  a.tables[0] = MoeItemTable{1,     {{dpk.get(), dsc.get()}, {}}, {y_packed.get(), nullptr}, codes.get(), act_scales.get(),
                             false, items_packed.get(),           count.get(),               P};
  a.tables[1] = MoeItemTable{1,     {{dtl.get(), dsc.get()}, {}}, {y_tiles.get(), nullptr}, codes.get(), act_scales.get(),
                             false, items_tiles.get(),            count.get() + 1,          P};
  ASSERT_TRUE(moe_build_items(a, nullptr).ok());
  const QuantWeightView shape = view_of(w[0], nullptr, nullptr);
  auto work = alloc<unsigned>(4);
  ASSERT_TRUE(work.zero().ok());
  const std::string tag = "tiles " + std::to_string(c.out) + "x" + std::to_string(c.in) + " n=" + std::to_string(c.n) +
                          " K=" + std::to_string(c.K);
  const Tolerance exact{.max_nmse = 0, .min_cosine = 0, .rel = 0, .abs = 0};
  for (const bool exp_add : {false, true}) {
    if (exp_add && !exp_add_ok) {
      std::printf("[ SKIPPED  ] %s exp_add: the random scale bytes leave 9..127\n", tag.c_str());
      continue;
    }
    ASSERT_TRUE(gemv_quantized_items(shape, Mxfp4Layout::PackedBalanced, items_packed.get(), count.get(), P, true,
                                     nullptr, {.work = work.get(), .scale_exp_add = exp_add})
                    .ok());
    const auto want = download(y_packed);
    // With the counters or a fixed stride; with no L2 prefetch, or the table's own weights requested into L2
    // before or after each block's units (a hint: the same bits).
    for (const bool counters : {true, false})
      for (const int prefetch : {0, 1, 2}) {
        ASSERT_TRUE(y_tiles.zero().ok());
        GemvItemsOptions o{.work = counters ? work.get() + 2 : nullptr, .scale_exp_add = exp_add};
        if (prefetch > 0)
          o.l2_prefetch = TilesL2Prefetch{.items = items_tiles.get(),
                                          .count = count.get() + 1,
                                          .capacity = P,
                                          .out = c.out,
                                          .in = c.in,
                                          .after_units = prefetch == 2};
        const Status s = gemv_quantized_items(shape, Mxfp4Layout::Tiles, items_tiles.get(), count.get() + 1, P, true,
                                              nullptr, o);
        ASSERT_TRUE(s.ok()) << s.error().message;
        const std::string what = tag + (counters ? " counters" : " stride") + (exp_add ? " exp_add" : "") +
                                 (prefetch ? prefetch == 1 ? " l2 prefetch before" : " l2 prefetch after" : "") +
                                 " vs packed balanced";
        EXPECT_TRUE(parity(what, download(y_tiles), want, exact));
      }
    const auto w_after = download(work);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(w_after[i], 0u) << "work counter " << i << " not re-armed";
  }
  // And the oracle: as the balanced packed kernel (its K partition), within the GEMV bound of the CPU.
  const auto got = download(y_tiles);
  const Tolerance& tol = testing::kBlockSumTol;
  std::vector<float> want(P * c.out), bound(P * c.out);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t t = p / c.K, e = experts[p];
    const std::vector<float> xt(x.begin() + t * c.in, x.begin() + (t + 1) * c.in);
    std::vector<float> yc(c.out);
    ASSERT_TRUE(cpu::linear(w[e].cpu, xt, 1, yc, {.bf16_output = true}, nullptr).ok());
    std::copy(yc.begin(), yc.end(), want.begin() + p * c.out);
    const auto b = abs_bound(w[e], xt, 1);
    std::copy(b.begin(), b.end(), bound.begin() + p * c.out);
  }
  EXPECT_TRUE(parity(tag + " vs cpu", got, want, tol, bound));
}

TEST(CudaGemvTiles, MatchesPackedBalancedBitForBitAndCpu) {
  CEDAR_REQUIRE_GPU();
  check_tiles_gemv({2304, 5120, 1, 6, 6, 231});  // released w1/w3, batch 1: 10 groups per warp
  check_tiles_gemv({5120, 2304, 2, 6, 8, 232});  // released w2: 4 or 5 groups per warp
  check_tiles_gemv({64, 384, 9, 2, 3, 233});     // 3 groups: a warp with none; tokens over 8 per expert
  check_tiles_gemv({96, 1024, 8, 6, 2, 234});    // an item of 8 tokens per expert
  // ~30 experts × 64 row tiles ≈ 1 900 units over a grid of at most 8 blocks per SM (1 056 on 132 SMs): blocks
  // take a second unit, from the counter or the stride (batch 8 on the perf model: 45 experts, ~6 500 units).
  check_tiles_gemv({2048, 256, 8, 6, 48, 235});
}

TEST(CudaGemvTiles, RejectsShapesAndOptionsItCannotRun) {
  CEDAR_REQUIRE_GPU();
  auto items = alloc<DeviceGemvItem>(1);
  auto count = alloc<int32_t>(1);
  const QuantWeightView odd{QuantWeightFormat::MXFP4, 40, 256, nullptr, nullptr, 32, 32};
  Status s = gemv_quantized_items(odd, Mxfp4Layout::Tiles, items.get(), count.get(), 1, true, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("40"), std::string::npos) << s.error().message;
  const QuantWeightView shape{QuantWeightFormat::MXFP4, 64, 256, nullptr, nullptr, 32, 32};
  s = gemv_quantized_items(shape, Mxfp4Layout::Tiles, items.get(), count.get(), 1, true, nullptr, {.packed_warps = 2});
  ASSERT_FALSE(s.ok());
  // An L2 prefetch table needs a count, a capacity and a tile shape, and only the tile kernel takes one.
  const TilesL2Prefetch good{.items = items.get(), .count = count.get(), .capacity = 1, .out = 64, .in = 256};
  TilesL2Prefetch no_count = good, odd_shape = good, no_capacity = good;
  no_count.count = nullptr;
  odd_shape.out = 40;
  no_capacity.capacity = 0;
  for (const TilesL2Prefetch& bad : {no_count, odd_shape, no_capacity}) {
    s = gemv_quantized_items(shape, Mxfp4Layout::Tiles, items.get(), count.get(), 1, true, nullptr,
                             {.l2_prefetch = bad});
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("l2_prefetch"), std::string::npos) << s.error().message;
  }
  s = gemv_quantized_items(shape, Mxfp4Layout::PackedBalanced, items.get(), count.get(), 1, true, nullptr,
                           {.l2_prefetch = good});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("l2_prefetch"), std::string::npos) << s.error().message;
}

TEST(CudaGemvTiles, RepackPlacesEveryWordAndScale) {
  // Host-only. Chunk (tile, q): word [u][4g + t][i] is the packed layout's word of row 32·tile + g + 8i,
  // thread t, K block 4q + u; scale byte [u][g][i] that row's scale of block 4q + u.
  const int64_t out = 64, in = 256, n_kb = in / 32, groups = in / 128;
  std::vector<uint8_t> plain(out * in / 2), sc(out * n_kb), packed(plain.size()), tiles(mxfp4_tiles_bytes(out, in));
  std::mt19937 rng(9);
  for (uint8_t& b : plain) b = static_cast<uint8_t>(rng());
  for (uint8_t& b : sc) b = static_cast<uint8_t>(rng());
  ASSERT_TRUE(repack_mxfp4(plain.data(), out, in, packed.data()).ok());
  ASSERT_TRUE(repack_mxfp4_tiles(plain.data(), sc.data(), out, in, tiles.data()).ok());
  ASSERT_EQ(tiles.size(), plain.size() + sc.size());
  for (int64_t tile = 0; tile < out / 32; ++tile)
    for (int64_t q = 0; q < groups; ++q) {
      const uint8_t* chunk = tiles.data() + (tile * groups + q) * 2176;
      for (int u = 0; u < 4; ++u)
        for (int g = 0; g < 8; ++g)
          for (int i = 0; i < 4; ++i) {
            const int64_t r = tile * 32 + g + 8 * i;
            ASSERT_EQ(chunk[2048 + u * 32 + g * 4 + i], sc[r * n_kb + 4 * q + u]) << "row " << r << " block " << 4 * q + u;
            for (int t = 0; t < 4; ++t)
              ASSERT_EQ(std::memcmp(chunk + u * 512 + (4 * g + t) * 16 + 4 * i,
                                    packed.data() + r * in / 2 + 64 * q + 16 * t + 4 * u, 4),
                        0)
                  << "row " << r << " block " << 4 * q + u << " thread " << t;
          }
    }
  EXPECT_FALSE(repack_mxfp4_tiles(plain.data(), sc.data(), 40, 256, tiles.data()).ok());
  EXPECT_FALSE(repack_mxfp4_tiles(plain.data(), nullptr, out, in, tiles.data()).ok());
  EXPECT_FALSE(mxfp4_tileable(40, 256));
  EXPECT_TRUE(mxfp4_tileable(2304, 5120));
  EXPECT_TRUE(mxfp4_tileable(5120, 2304));
}

}  // namespace
}  // namespace cedar::cuda
