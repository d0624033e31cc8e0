// The routed experts' decode GEMV (device items over the packed MXFP4 layout, balanced schedule): a token's
// result bits do not depend on the batch it decodes in (the K partition and the summation order depend
// neither on the item count nor on the item's rows), and the scale product taken as an exponent add
// (GemvItemsOptions::scale_exp_add) gives the float product's bits over the range its upload check admits.
// (The items' arithmetic is checked against the CPU in ffn_moe_cutest.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

struct ExpertSet {
  std::vector<DeviceBuffer<uint8_t>> keep;
  DeviceBuffer<const uint8_t*> data, scales;
};

// E random experts, repacked; range_ends: some scale bytes at the ends of the exponent-add range (9, 127).
ExpertSet packed_experts(int64_t E, int64_t out, int64_t in, uint32_t seed, bool range_ends = false) {
  ExpertSet s;
  std::vector<const uint8_t*> d, sc;
  for (int64_t e = 0; e < E; ++e) {
    QuantWeightHost w = random_mxfp4_weight(out, in, seed + static_cast<uint32_t>(e), 118);  // bytes 118..125
    if (range_ends)
      for (size_t i = 0; i < w.scales.size(); i += 7) w.scales[i] = i % 2 ? 9 : 127;
    EXPECT_TRUE(mxfp4_scales_allow_exp_add(w.scales.data(), w.scales.size()));
    std::vector<uint8_t> packed(w.data.size());
    EXPECT_TRUE(repack_mxfp4(w.data.data(), out, in, packed.data()).ok());
    s.keep.push_back(upload(packed));
    d.push_back(s.keep.back().get());
    s.keep.push_back(upload(w.scales));
    sc.push_back(s.keep.back().get());
  }
  s.data = upload(d);
  s.scales = upload(sc);
  return s;
}

// y [n·K, out] of the n tokens whose expert ids, FP8 codes and scales start at the given pointers.
std::vector<float> routed_rows(const ExpertSet& w, int64_t E, int64_t out, int64_t in, int64_t n, int64_t K,
                               const int32_t* experts, const uint16_t* codes, const float* scales,
                               bool scale_exp_add = false) {
  const int64_t P = n * K;
  auto items = alloc<DeviceGemvItem>(P);
  auto count = alloc<int32_t>(1);
  auto work = alloc<unsigned>(2);
  auto y = alloc<float>(P * out);
  EXPECT_TRUE(work.zero().ok());
  MoeDispatchArgs a;
  a.experts = experts;
  a.n = n;
  a.topk = K;
  a.n_experts = E;
  a.tables[0] = MoeItemTable{
      1, {{w.data.get(), w.scales.get()}, {}}, {y.get(), nullptr}, codes, scales, false, items.get(), count.get(), P};
  EXPECT_TRUE(moe_build_items(a, nullptr).ok());
  const QuantWeightView shape{.format = QuantWeightFormat::MXFP4, .out = out, .in = in};
  const Status s = gemv_quantized_items(shape, Mxfp4Layout::PackedBalanced, items.get(), count.get(), P, true, nullptr,
                                        {.work = work.get(), .scale_exp_add = scale_exp_add});
  EXPECT_TRUE(s.ok()) << s.error().message;
  return download(y);
}

// got[i] == want[offset + i] bit for bit over got's rows (`out` wide); one PARITY line.
void expect_same_rows(const std::string& tag, const std::vector<float>& got, const std::vector<float>& want,
                      size_t offset, int64_t out) {
  ASSERT_LE(offset + got.size(), want.size()) << tag;
  size_t bad = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[offset + i], sizeof(float)) != 0) first = bad++ == 0 ? i : first;
  std::printf("PARITY %-50s n=%zu mismatches=%zu (bit-exact required)\n", tag.c_str(), got.size(), bad);
  EXPECT_EQ(bad, 0u) << tag << ": first mismatch at pair " << first / out << " row " << first % out;
}

void check_rows_independent_of_batch(int64_t out, int64_t in, uint32_t seed) {
  const int64_t n = 8, K = 6, E = 10;
  const ExpertSet w = packed_experts(E, out, in, seed);
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < n; ++t) {  // K distinct experts per token, as the router selects
    std::vector<int32_t> sel;
    while (static_cast<int64_t>(sel.size()) < K) {
      const auto e = static_cast<int32_t>(rng() % E);
      if (std::find(sel.begin(), sel.end(), e) == sel.end()) sel.push_back(e);
    }
    ids.insert(ids.end(), sel.begin(), sel.end());
  }
  auto dids = upload(ids);
  auto dx = upload(random_acts(n * in, seed + 1, 1.0f, -3, 2));
  auto codes = alloc<uint16_t>(n * in);
  auto scales = alloc<float>(n * in / 32);
  ASSERT_TRUE(quantize_act_fp8(dx.get(), n, in, codes.get(), scales.get(), nullptr).ok());  // per row
  const auto batched = routed_rows(w, E, out, in, n, K, dids.get(), codes.get(), scales.get());
  for (int64_t t = 0; t < n; ++t) {
    const auto alone =
        routed_rows(w, E, out, in, 1, K, dids.get() + t * K, codes.get() + t * in, scales.get() + t * (in / 32));
    ASSERT_EQ(alone.size(), static_cast<size_t>(K * out));
    expect_same_rows(std::to_string(out) + "x" + std::to_string(in) + " token " + std::to_string(t) +
                         " alone vs in a batch of 8",
                     alone, batched, static_cast<size_t>(t * K * out), out);
  }
}

TEST(CudaGemvItems, PackedBalancedRowsDoNotDependOnTheBatch) {
  CEDAR_REQUIRE_GPU();
  check_rows_independent_of_batch(2304, 5120, 701);  // w1 / w3
  check_rows_independent_of_batch(5120, 2304, 702);  // w2
}

// Every weight scale byte in 9..127 and activations from 2^-30 to 2^118 (act scales from the 2^-22 floor to
// 2^110): the exponent add and the float product give the same rows, at one token (the kOne path) and at 8.
void check_exp_add(int64_t out, int64_t in, uint32_t seed) {
  const int64_t n = 8, K = 6, E = 10;
  const ExpertSet w = packed_experts(E, out, in, seed, true);
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n * K);
  for (auto& e : ids) e = static_cast<int32_t>(rng() % E);
  auto dids = upload(ids);
  auto x = random_acts(n * in, seed + 1, 1.0f, -30, 30);
  for (size_t b = 0; b < x.size() / 32; b += 13) x[32 * b] = std::ldexp(1.5f, 118);  // act scale 2^110
  auto dx = upload(x);
  auto codes = alloc<uint16_t>(n * in);
  auto scales = alloc<float>(n * in / 32);
  ASSERT_TRUE(quantize_act_fp8(dx.get(), n, in, codes.get(), scales.get(), nullptr).ok());
  for (const int64_t tokens : {int64_t{1}, n}) {
    const auto want = routed_rows(w, E, out, in, tokens, K, dids.get(), codes.get(), scales.get(), false);
    const auto got = routed_rows(w, E, out, in, tokens, K, dids.get(), codes.get(), scales.get(), true);
    ASSERT_EQ(got.size(), want.size());
    expect_same_rows(std::to_string(out) + "x" + std::to_string(in) + " n=" + std::to_string(tokens) +
                         " scale exponent add vs float product",
                     got, want, 0, out);
  }
}

TEST(CudaGemvItems, ScaleExponentAddEqualsTheFloatProduct) {
  CEDAR_REQUIRE_GPU();
  check_exp_add(2304, 5120, 711);  // w1 / w3
  check_exp_add(5120, 2304, 712);  // w2
}

// The upload check: bytes 9..127 (2^-118 .. 1) admit the exponent add, anything else does not.
TEST(CudaGemvItems, ScaleExponentAddRangeCheck) {
  std::vector<uint8_t> ok(256);
  for (size_t i = 0; i < ok.size(); ++i) ok[i] = static_cast<uint8_t>(9 + i % 119);  // 9 .. 127
  EXPECT_TRUE(mxfp4_scales_allow_exp_add(ok.data(), ok.size()));
  for (const uint8_t bad : {uint8_t{0}, uint8_t{8}, uint8_t{128}, uint8_t{254}, uint8_t{255}}) {
    std::vector<uint8_t> v = ok;
    v[100] = bad;
    EXPECT_FALSE(mxfp4_scales_allow_exp_add(v.data(), v.size())) << "byte " << int(bad);
  }
  EXPECT_FALSE(mxfp4_scales_allow_exp_add(nullptr, 4));
  EXPECT_TRUE(mxfp4_scales_allow_exp_add(ok.data(), 0));  // no scales: nothing out of range
}

}  // namespace
}  // namespace cedar::cuda
