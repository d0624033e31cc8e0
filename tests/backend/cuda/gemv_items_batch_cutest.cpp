// The routed experts' decode GEMV (device items over the packed MXFP4 layout, balanced schedule, the default
// split) gives a token the same result bits whatever batch it decodes in: the K partition and the
// summation order depend neither on the item count nor on the item's rows. Each token of a batch of 8
// (experts shared by tokens: items of several rows) against the same token decoded alone, at the released
// w1 / w3 and w2 widths. (The items' arithmetic is checked against the CPU in ffn_moe_cutest.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
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

ExpertSet packed_experts(int64_t E, int64_t out, int64_t in, uint32_t seed) {
  ExpertSet s;
  std::vector<const uint8_t*> d, sc;
  for (int64_t e = 0; e < E; ++e) {
    const QuantWeightHost w = random_mxfp4_weight(out, in, seed + static_cast<uint32_t>(e), 121);
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
                               const int32_t* experts, const uint16_t* codes, const float* scales) {
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
                                        {.work = work.get()});
  EXPECT_TRUE(s.ok()) << s.error().message;
  return download(y);
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
    size_t bad = 0, first = alone.size();
    for (size_t i = 0; i < alone.size(); ++i)
      if (std::memcmp(&alone[i], &batched[t * K * out + i], sizeof(float)) != 0) first = bad++ == 0 ? i : first;
    const std::string tag =
        std::to_string(out) + "x" + std::to_string(in) + " token " + std::to_string(t) + " alone vs in a batch of 8";
    std::printf("PARITY %-50s n=%zu mismatches=%zu (bit-exact required)\n", tag.c_str(), alone.size(), bad);
    EXPECT_EQ(bad, 0u) << tag << ": first mismatch at pair " << first / out << " row " << first % out;
  }
}

TEST(CudaGemvItems, PackedBalancedRowsDoNotDependOnTheBatch) {
  CEDAR_REQUIRE_GPU();
  check_rows_independent_of_batch(2304, 5120, 701);  // w1 / w3
  check_rows_independent_of_batch(5120, 2304, 702);  // w2
}

}  // namespace
}  // namespace cedar::cuda
