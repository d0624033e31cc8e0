// Parity of the prefill MoE on the device (gemm_kernels.h: moe_permute, moe_experts, moe_prefill_combine) with
// the CPU oracle (model/moe.h: route_tokens, expert_forward, moe_forward).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/gemm_kernels.h"
#include "cuda_test_util.h"
#include "gemm_test_util.h"
#include "model/moe.h"

namespace cedar::cuda {
namespace {

using testing::alloc;
using testing::download;
using testing::parity;
using testing::pool;
using testing::QuantWeightHost;
using testing::Tolerance;
using testing::upload;

// The CPU grouping (model/moe.cpp): entries (t, k) per expert in (t, k) order; invalid ids dropped.
struct HostPermutation {
  std::vector<int32_t> row_offsets, tile_offsets, row_token, slot_row;
  std::vector<float> row_weight;
};
HostPermutation host_permutation(const std::vector<int32_t>& ids, const std::vector<float>& w, int64_t n, int64_t k,
                                 int64_t E, int tile_rows) {
  std::vector<std::vector<int64_t>> lists(static_cast<size_t>(E));
  for (int64_t i = 0; i < n * k; ++i)
    if (ids[i] >= 0 && ids[i] < E) lists[ids[i]].push_back(i);
  HostPermutation p;
  p.slot_row.assign(static_cast<size_t>(n * k), -1);
  p.row_token.assign(static_cast<size_t>(n * k), -7);  // rows past the valid ones are not written
  p.row_weight.assign(static_cast<size_t>(n * k), -7.0f);
  int32_t rows = 0, tiles = 0;
  for (int64_t e = 0; e < E; ++e) {
    p.row_offsets.push_back(rows);
    p.tile_offsets.push_back(tiles);
    for (const int64_t i : lists[e]) {
      p.slot_row[i] = rows;
      p.row_token[rows] = static_cast<int32_t>(i / k);
      p.row_weight[rows] = w[i];
      ++rows;
    }
    tiles += static_cast<int32_t>((lists[e].size() + tile_rows - 1) / tile_rows);
  }
  p.row_offsets.push_back(rows);
  p.tile_offsets.push_back(tiles);
  return p;
}

struct DevicePermutation {
  DeviceBuffer<int32_t> hist, row_offsets, tile_offsets, row_token, slot_row;
  DeviceBuffer<float> row_weight;
  MoePermutation view() {
    return MoePermutation{hist.get(),      row_offsets.get(), tile_offsets.get(),
                          row_token.get(), row_weight.get(),  slot_row.get()};
  }
};
DevicePermutation alloc_permutation(int64_t n, int64_t k, int64_t E) {
  const MoePermutationSizes s = moe_permutation_sizes(n, k, E);
  DevicePermutation d;
  d.hist = alloc<int32_t>(static_cast<size_t>(std::max<int64_t>(s.chunk_hist, 1)));
  d.row_offsets = alloc<int32_t>(static_cast<size_t>(s.offsets));
  d.tile_offsets = alloc<int32_t>(static_cast<size_t>(s.offsets));
  d.row_token = alloc<int32_t>(static_cast<size_t>(std::max<int64_t>(s.rows, 1)));
  d.slot_row = alloc<int32_t>(static_cast<size_t>(std::max<int64_t>(s.rows, 1)));
  d.row_weight = alloc<float>(static_cast<size_t>(std::max<int64_t>(s.rows, 1)));
  return d;
}

// Exact: the device permutation is the CPU's grouping, element for element.
void expect_permutation(DevicePermutation& d, const HostPermutation& want, int64_t rows, const std::string& tag) {
  const auto ro = download(d.row_offsets), to = download(d.tile_offsets);
  EXPECT_EQ(ro, want.row_offsets) << tag << ": row_offsets";
  EXPECT_EQ(to, want.tile_offsets) << tag << ": tile_offsets";
  if (rows == 0) return;
  auto rt = download(d.row_token), sr = download(d.slot_row);
  auto rw = download(d.row_weight);
  const int64_t valid = want.row_offsets.back();
  size_t bad = 0;
  for (int64_t i = 0; i < rows; ++i) {
    if (sr[i] != want.slot_row[i] && bad++ == 0)
      ADD_FAILURE() << tag << ": slot_row[" << i << "] gpu " << sr[i] << " cpu " << want.slot_row[i];
    if (i < valid && (rt[i] != want.row_token[i] || rw[i] != want.row_weight[i]) && bad++ == 0)
      ADD_FAILURE() << tag << ": row " << i << " token/weight gpu " << rt[i] << "/" << rw[i] << " cpu "
                    << want.row_token[i] << "/" << want.row_weight[i];
  }
  std::printf("PARITY %-40s entries=%lld rows=%lld mismatches=%zu (exact required)\n", tag.c_str(),
              static_cast<long long>(rows), static_cast<long long>(valid), bad);
  EXPECT_EQ(bad, 0u);
}

TEST(CudaMoePermute, MatchesCpuGrouping) {
  CEDAR_REQUIRE_GPU();
  const int64_t n = 300, k = 6, E = 40;
  std::mt19937 rng(5);
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  std::vector<float> w(ids.size());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = static_cast<int32_t>(rng() % 36);                                 // experts 36..39 get no token
      if (t % 7 == 0 && j == 1) e = ids[t * k];                                     // a repeated expert (V4 hash rows)
      if (t % 11 == 0 && j == 2) e = (t % 22 == 0) ? -1 : static_cast<int32_t>(E);  // invalid ids: dropped
      if (j == 0) e = 3;                                                            // a hot expert: every token
      ids[t * k + j] = e;
      w[t * k + j] = static_cast<float>(rng() % 1000) / 997.0f;
    }
  auto dids = upload(ids);
  auto dw = upload(w);
  for (const int tile_rows : {128, 64, 32}) {
    auto d = alloc_permutation(n, k, E);
    const Status s = moe_permute(MoeRouteView{dids.get(), dw.get(), n, k, E}, tile_rows, d.view(), nullptr);
    ASSERT_TRUE(s.ok()) << s.error().message;
    expect_permutation(d, host_permutation(ids, w, n, k, E, tile_rows), n * k,
                       "moe_permute tile" + std::to_string(tile_rows));
  }
  // No tokens: offsets all zero.
  auto d0 = alloc_permutation(0, k, E);
  ASSERT_TRUE(moe_permute(MoeRouteView{dids.get(), dw.get(), 0, k, E}, 64, d0.view(), nullptr).ok());
  expect_permutation(d0, host_permutation({}, {}, 0, k, E, 64), 0, "moe_permute n=0");
}

// The combine in the CPU's order, operation for operation: bit-exact required. Values are chosen so
// that another order gives other bits (cancellation of large values).
TEST(CudaMoeCombine, SumsInExpertOrder) {
  CEDAR_REQUIRE_GPU();
  const int64_t n = 9, k = 4, d = 64, E = 10;
  std::mt19937 rng(9);
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  for (auto& e : ids) e = static_cast<int32_t>(rng() % E);
  ids[5] = -1;  // dropped slot
  std::vector<float> w(ids.size(), 1.0f);
  auto dids = upload(ids);
  auto dw = upload(w);
  auto perm = alloc_permutation(n, k, E);
  ASSERT_TRUE(moe_permute(MoeRouteView{dids.get(), dw.get(), n, k, E}, 32, perm.view(), nullptr).ok());
  const auto slot_row = download(perm.slot_row);
  std::vector<uint16_t> y_rows(static_cast<size_t>(n * k * d));
  std::vector<float> shared(static_cast<size_t>(n * d));
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  for (auto& v : y_rows) v = f32_to_bf16(ud(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20));
  for (auto& v : shared) v = round_to_bf16(ud(rng));
  auto dy_rows = upload(y_rows);
  auto dshared = upload(shared);
  auto dy = alloc<float>(static_cast<size_t>(n * d));
  const Status s = moe_prefill_combine(
      MoePrefillCombineArgs{dids.get(), perm.slot_row.get(), dy_rows.get(), dshared.get(), n, k, d, E, dy.get()},
      nullptr);
  ASSERT_TRUE(s.ok()) << s.error().message;
  std::vector<float> want(static_cast<size_t>(n * d));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> acc(static_cast<size_t>(d), 0.0f);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t j = 0; j < k; ++j)
        if (ids[t * k + j] == e)
          for (int64_t c = 0; c < d; ++c) acc[c] += bf16_to_f32(y_rows[slot_row[t * k + j] * d + c]);
    for (int64_t c = 0; c < d; ++c) want[t * d + c] = round_to_bf16(acc[c] + shared[t * d + c]);
  }
  EXPECT_TRUE(
      parity("moe_prefill_combine", download(dy), want, Tolerance{.max_nmse = 0, .min_cosine = 0, .rel = 0, .abs = 0}));
}

// The whole routed + shared MoE of a chunk against moe_forward, with the intermediate results checked
// on the way (see check_swiglu in gemm_quant_cutest.cpp for the reasoning of each tolerance).
struct MoeCase {
  std::string name;
  int64_t n, d, inter, E, topk, act_block;
  float swiglu_limit;
  int tile_rows;  // 0: moe_tile_rows
};

void check_moe(const MoeCase& c, uint32_t seed) {
  const int64_t n = c.n, d = c.d, inter = c.inter, E = c.E, K = c.topk, ab = c.act_block;
  // Weights: MXFP4 routed experts, FP8 shared expert; gate with biases that starve experts 1 and E-1 and
  // send every token to expert 2.
  std::vector<QuantWeightHost> w1, w2, w3;
  for (int64_t e = 0; e < E; ++e) {
    w1.push_back(testing::random_mxfp4_weight(inter, d, seed + 10 * e, 112));
    w3.push_back(testing::random_mxfp4_weight(inter, d, seed + 10 * e + 1, 112));
    w2.push_back(testing::random_mxfp4_weight(d, inter, seed + 10 * e + 2, 112));
  }
  const int64_t sb = ab == 128 ? 128 : 32;
  const QuantWeightHost s1 = testing::random_fp8_weight(inter, d, sb, seed + 1001, 112);
  const QuantWeightHost s3 = testing::random_fp8_weight(inter, d, sb, seed + 1002, 112);
  const QuantWeightHost s2 = testing::random_fp8_weight(d, inter, sb, seed + 1003, 112);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> gate(static_cast<size_t>(E * d)), bias(static_cast<size_t>(E));
  for (auto& v : gate) v = round_to_bf16(nd(rng) * 0.05f);
  for (auto& v : bias) v = nd(rng) * 0.1f;
  bias[1] = bias[E - 1] = -1e3f;
  bias[2] = 1e3f;
  MoeWeights mw;
  mw.gate = gate;
  mw.bias = bias;
  for (int64_t e = 0; e < E; ++e) mw.experts.push_back(ExpertWeights{w1[e].cpu, w2[e].cpu, w3[e].cpu});
  mw.shared = ExpertWeights{s1.cpu, s2.cpu, s3.cpu};
  MoeParams p;
  p.topk = K;
  p.route_scale = 1.5;
  p.swiglu_limit = c.swiglu_limit;
  p.act_block = ab;
  const auto x = testing::random_acts(static_cast<size_t>(n * d), seed + 7, 0x1p-2f);

  auto routing = route_tokens(x, n, mw, p, {}, {}, &pool());
  ASSERT_TRUE(routing.ok()) << routing.error().message;
  std::vector<float> y_want(static_cast<size_t>(n * d));
  ASSERT_TRUE(moe_forward(x, n, mw, p, {}, {}, y_want, &pool()).ok());
  std::vector<int32_t> ids(routing->experts.begin(), routing->experts.end());
  const int tile_rows = c.tile_rows ? c.tile_rows : moe_tile_rows(n, K, E);
  const std::string tag = c.name + " n=" + std::to_string(n) + " E=" + std::to_string(E) + " top" + std::to_string(K) +
                          " tile" + std::to_string(tile_rows);

  // ---- device ----
  std::vector<DeviceBuffer<uint8_t>> keep;
  std::vector<const uint8_t*> p1d, p1s, p3d, p3s, p2d, p2s;
  auto push = [&](const QuantWeightHost& w, std::vector<const uint8_t*>& dp, std::vector<const uint8_t*>& sp) {
    keep.push_back(upload(w.data));
    dp.push_back(keep.back().get());
    keep.push_back(upload(w.scales));
    sp.push_back(keep.back().get());
  };
  for (int64_t e = 0; e < E; ++e) {
    push(w1[e], p1d, p1s);
    push(w3[e], p3d, p3s);
    push(w2[e], p2d, p2s);
  }
  auto t1d = upload(p1d), t1s = upload(p1s), t3d = upload(p3d), t3s = upload(p3s), t2d = upload(p2d), t2s = upload(p2s);
  auto dx = upload(x);
  auto dids = upload(ids);
  auto dw = upload(routing->weights);
  auto dxc = alloc<uint16_t>(static_cast<size_t>(n * d));
  auto dxs = alloc<float>(static_cast<size_t>(n * d / ab));
  ASSERT_TRUE(quantize_act_fp8_blocked(dx.get(), n, d, ab, dxc.get(), dxs.get(), nullptr).ok());
  auto perm = alloc_permutation(n, K, E);
  const MoeRouteView route{dids.get(), dw.get(), n, K, E};
  Status st = moe_permute(route, tile_rows, perm.view(), nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto dhc = alloc<uint16_t>(static_cast<size_t>(n * K * inter));
  auto dhs = alloc<float>(static_cast<size_t>(n * K * inter / ab));
  auto dyr = alloc<uint16_t>(static_cast<size_t>(n * K * d));
  MoeExpertArgs a;
  a.experts = MoeExpertTable{
      QuantWeightFormat::MXFP4, d, inter, 32, 32, t1d.get(), t1s.get(), t3d.get(), t3s.get(), t2d.get(), t2s.get()};
  a.route = route;
  a.perm = perm.view();
  a.tile_rows = tile_rows;
  a.x_codes = dxc.get();
  a.x_scales = dxs.get();
  a.act_block = ab;
  a.swiglu_limit = c.swiglu_limit;
  a.h_codes = dhc.get();
  a.h_scales = dhs.get();
  a.y_rows = dyr.get();
  st = moe_experts(a, nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  // Shared expert: swiglu_gemm + quant_gemm.
  auto ds1 = upload(s1.data), ss1 = upload(s1.scales), ds3 = upload(s3.data), ss3 = upload(s3.scales);
  auto ds2 = upload(s2.data), ss2 = upload(s2.scales);
  auto dshc = alloc<uint16_t>(static_cast<size_t>(n * inter));
  auto dshs = alloc<float>(static_cast<size_t>(n * inter / ab));
  auto dshared = alloc<float>(static_cast<size_t>(n * d));
  st = swiglu_gemm(SwigluGemmArgs{.w1 = testing::device_view(s1, ds1, ss1),
                                  .w3 = testing::device_view(s3, ds3, ss3),
                                  .act_codes = dxc.get(),
                                  .act_scales = dxs.get(),
                                  .m = n,
                                  .act_block = ab,
                                  .row_weights = nullptr,
                                  .swiglu_limit = c.swiglu_limit,
                                  .h_codes = dshc.get(),
                                  .h_scales = dshs.get()},
                   nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  st = quant_gemm(QuantGemmArgs{.w = testing::device_view(s2, ds2, ss2),
                                .act_codes = dshc.get(),
                                .act_scales = dshs.get(),
                                .m = n,
                                .act_block = ab,
                                .y = dshared.get(),
                                .bf16_output = true},
                  {}, nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto dy = alloc<float>(static_cast<size_t>(n * d));
  st = moe_prefill_combine(
      MoePrefillCombineArgs{dids.get(), perm.slot_row.get(), dyr.get(), dshared.get(), n, K, d, E, dy.get()}, nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;

  // (1) The permutation is the CPU's grouping.
  const HostPermutation hp = host_permutation(ids, routing->weights, n, K, E, tile_rows);
  expect_permutation(perm, hp, n * K, tag + " permutation");

  // (2) h and (3) y_rows per expert, against the CPU on the same rows.
  const auto hc = download(dhc);
  const auto hs = download(dhs);
  const auto yr = download(dyr);
  size_t h_bad = 0, h_total = 0;
  std::string first;
  std::vector<float> y_rows_f(yr.size());
  for (size_t i = 0; i < yr.size(); ++i) y_rows_f[i] = bf16_to_f32(yr[i]);
  const Tolerance& gemm_tol = testing::kBlockSumTol;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = hp.row_offsets[e], m = hp.row_offsets[e + 1] - r0;
    if (m == 0) continue;
    std::vector<float> xe(static_cast<size_t>(m * d)), we(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) {
      std::copy_n(x.begin() + hp.row_token[r0 + i] * d, d, xe.begin() + i * d);
      we[i] = hp.row_weight[r0 + i];
    }
    const auto h_want = testing::cpu_swiglu_h(w1[e].cpu, w3[e].cpu, xe, m, ab, we, c.swiglu_limit, &pool());
    const std::vector<uint16_t> hce(hc.begin() + r0 * inter, hc.begin() + (r0 + m) * inter);
    const std::vector<float> hse(hs.begin() + r0 * inter / ab, hs.begin() + (r0 + m) * inter / ab);
    std::string f;
    const size_t bad = testing::quantized_mismatches(hce, hse, h_want, ab, &f);
    if (bad && first.empty()) first = "expert " + std::to_string(e) + " " + f;
    h_bad += bad;
    h_total += hce.size();
    const auto h_gpu = testing::dequantize_rows(hce, hse, ab);
    const auto ref = testing::reference_rows(w2[e], h_gpu, m, 0, d, ab, true, &pool());
    const std::vector<float> got(y_rows_f.begin() + r0 * d, y_rows_f.begin() + (r0 + m) * d);
    EXPECT_TRUE(parity(tag + " W2 expert " + std::to_string(e) + " rows=" + std::to_string(m), got, ref.want, gemm_tol,
                       ref.bound));
  }
  std::printf("PARITY %-60s h: %zu / %zu quantized values differ from the CPU's%s%s\n", tag.c_str(), h_bad, h_total,
              h_bad ? ", first " : "", first.c_str());
  EXPECT_LE(h_bad, std::max<size_t>(2, h_total / 1000)) << tag << ": first " << first;

  // (4) The combine of the GPU's expert rows and shared output, in the CPU's order: bit-exact.
  const auto shared = download(dshared);
  std::vector<float> y_comb(static_cast<size_t>(n * d));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> acc(static_cast<size_t>(d), 0.0f);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t j = 0; j < K; ++j)
        if (ids[t * K + j] == e)
          for (int64_t col = 0; col < d; ++col) acc[col] += y_rows_f[hp.slot_row[t * K + j] * d + col];
    for (int64_t col = 0; col < d; ++col) y_comb[t * d + col] = round_to_bf16(acc[col] + shared[t * d + col]);
  }
  const auto y = download(dy);
  EXPECT_TRUE(parity(tag + " combine", y, y_comb, Tolerance{.max_nmse = 0, .min_cosine = 0, .rel = 0, .abs = 0}));
  // (5) End to end against moe_forward (statistics; the per-stage checks above carry the bounds).
  EXPECT_TRUE(
      parity(tag + " vs moe_forward", y, y_want, Tolerance{.max_nmse = 1e-5, .min_cosine = 0.99999, .rel = 1e30}));
  std::printf("EXACT  %-60s %zu / %zu outputs bit-equal to moe_forward\n", tag.c_str(), testing::count_equal(y, y_want),
              y.size());
}

TEST(CudaMoeExperts, MatchesMoeForward) {
  CEDAR_REQUIRE_GPU();
  check_moe({"moe", 150, 512, 256, 16, 4, 32, 10.0f, 0}, 201);
  check_moe({"moe", 150, 512, 256, 16, 4, 32, 10.0f, 128}, 202);
  check_moe({"moe", 150, 512, 256, 16, 4, 32, 0.0f, 32}, 203);     // no clamps
  check_moe({"moe", 100, 1024, 384, 12, 6, 32, 10.0f, 64}, 204);   // top-6, 3 column tiles of W1/W3
  check_moe({"moe_v4", 90, 512, 256, 10, 6, 128, 10.0f, 0}, 205);  // V4: 128-wide activation blocks
}

TEST(CudaMoeExperts, RejectsBadArguments) {
  CEDAR_REQUIRE_GPU();
  MoeExpertArgs a;
  a.route = MoeRouteView{
      nullptr, nullptr, 4, 6, 2000,
  };
  Status s = moe_experts(a, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("n_experts=2000"), std::string::npos) << s.error().message;
  a.route.n_experts = 8;
  a.tile_rows = 48;
  s = moe_experts(a, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("tile_rows=48"), std::string::npos) << s.error().message;
  a.tile_rows = 64;
  a.experts.d = 100;
  a.experts.inter = 64;
  s = moe_experts(a, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("d=100"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace cedar::cuda
