// Parity of the FP8 / MXFP4 prefill GEMMs (gemm_kernels.h: quant_gemm, swiglu_gemm,
// quantize_act_fp8_blocked) with the CPU oracle (cpu::linear, model/moe.h expert_forward).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/gemm_kernels.h"
#include "cuda_test_util.h"
#include "gemm_test_util.h"
#include "model/moe.h"

namespace cedar::cuda {
namespace {

using testing::alloc;
using testing::device_view;
using testing::download;
using testing::parity;
using testing::pool;
using testing::QuantWeightHost;
using testing::Tolerance;
using testing::upload;

// Every product q_a·q_w is exact on both sides and, unsplit, the K blocks are added in the same
// (ascending) order; what differs is the tensor core's fp32 block sum (fewer guard bits than IEEE:
// ~2^-13 of Σ|terms| at worst, and exact whenever the exact sum fits in fp32), for split-K also the
// order of the partial sums, and for 128-wide activation blocks (V4) the per-32 promotion inside a
// block. Per element: one bf16 rounding flip (2^-7·|y|) plus 2^-12·Σ|terms| — the GEMV's tolerance,
// testing::kBlockSumTol.

struct Plan {
  int tile_m = 0, splits = 0;  // 0: automatic
};
std::string plan_str(const Plan& p) {
  return p.tile_m == 0 && p.splits == 0 ? std::string("auto")
                                        : "tile" + std::to_string(p.tile_m) + "/split" + std::to_string(p.splits);
}

// quant_gemm on m random tokens against cpu::linear for output rows in `ranges` (all rows if empty),
// for each plan; the first plan also runs twice to check the result is bit-identical.
void check_quant_gemm(const QuantWeightHost& w, int64_t m, int64_t act_block,
                      std::vector<std::pair<int64_t, int64_t>> ranges, const std::vector<Plan>& plans, uint32_t seed,
                      const std::string& name) {
  const int64_t out = w.cpu.out, in = w.cpu.in;
  if (ranges.empty()) ranges.push_back({0, out});
  const auto x = testing::random_acts(static_cast<size_t>(m * in), seed);
  std::vector<testing::RowsReference> refs;
  for (const auto& [r0, count] : ranges)
    refs.push_back(testing::reference_rows(w, x, m, r0, count, act_block, true, &pool()));

  auto dw = upload(w.data);
  auto ds = upload(w.scales);
  auto dx = upload(x);
  auto dcodes = alloc<uint16_t>(static_cast<size_t>(m * in));
  auto dscales = alloc<float>(static_cast<size_t>(m * in / act_block));
  auto dy = alloc<float>(static_cast<size_t>(m * out));
  ASSERT_TRUE(quantize_act_fp8_blocked(dx.get(), m, in, act_block, dcodes.get(), dscales.get(), nullptr).ok());
  const QuantWeightView view = device_view(w, dw, ds);
  int64_t ws_floats = quant_gemm_workspace_floats(view, m);
  for (const Plan& p : plans) ws_floats = std::max<int64_t>(ws_floats, p.splits * m * out);
  auto dpart = alloc<float>(static_cast<size_t>(ws_floats));
  const QuantGemmPlan automatic = quant_gemm_plan(view, m, true);
  std::vector<float> first_result;
  for (size_t pi = 0; pi < plans.size(); ++pi) {
    const Plan& p = plans[pi];
    QuantGemmArgs a{.w = view,
                    .act_codes = dcodes.get(),
                    .act_scales = dscales.get(),
                    .m = m,
                    .act_block = act_block,
                    .y = dy.get(),
                    .ldy = 0,
                    .bf16_output = true,
                    .force_tile_m = p.tile_m,
                    .force_splits = p.splits};
    const int reps = pi == 0 ? 2 : 1;
    for (int rep = 0; rep < reps; ++rep) {
      ASSERT_TRUE(dy.zero().ok());
      const Status s = quant_gemm(a, QuantGemmWorkspace{dpart.get(), ws_floats}, nullptr);
      ASSERT_TRUE(s.ok()) << s.error().message;
      const auto y = download(dy);
      if (pi == 0 && rep == 0) first_result = y;
      if (pi == 0 && rep == 1) {
        EXPECT_EQ(std::memcmp(y.data(), first_result.data(), y.size() * sizeof(float)), 0)
            << name << ": two identical launches differ (non-deterministic)";
        continue;
      }
      for (const auto& ref : refs) {
        const auto got = testing::columns(y, m, out, ref.r0, ref.count);
        const std::string tag =
            name + " " + std::to_string(out) + "x" + std::to_string(in) + " m=" + std::to_string(m) + " rows[" +
            std::to_string(ref.r0) + "+" + std::to_string(ref.count) + "] " +
            (p.tile_m == 0 && p.splits == 0
                 ? "auto(tile" + std::to_string(automatic.tile_m) + "/split" + std::to_string(automatic.splits) + ")"
                 : plan_str(p));
        EXPECT_TRUE(parity(tag, got, ref.want, testing::kBlockSumTol, ref.bound));
        std::printf("EXACT  %-60s %zu / %zu outputs bit-equal to cpu::linear\n", tag.c_str(),
                    testing::count_equal(got, ref.want), got.size());
      }
    }
  }
}

const std::vector<Plan> kAllPlans = {{0, 0}, {128, 1}, {64, 1}, {32, 1}, {128, 2}, {64, 3}, {32, 2}};
const std::vector<Plan> kAuto = {{0, 0}};

TEST(CudaQuantGemm, Fp8SmallShapesEveryTilePlan) {
  CEDAR_REQUIRE_GPU();
  // Ragged everything: out % 256, m % tile, K = 3 blocks (the last stage holds one block).
  check_quant_gemm(testing::random_fp8_weight(100, 96, 32, 1), 37, 32, {}, kAllPlans, 2, "fp8");
  check_quant_gemm(testing::random_fp8_weight(256, 128, 32, 3), 128, 32, {}, kAllPlans, 4, "fp8");
  check_quant_gemm(testing::random_fp8_weight(300, 1280, 32, 5), 200, 32, {}, kAllPlans, 6, "fp8");
  check_quant_gemm(testing::random_fp8_weight(64, 2048, 32, 7), 1, 32, {}, kAllPlans, 8, "fp8");  // one token
}

TEST(CudaQuantGemm, Fp8V4Blocks) {
  CEDAR_REQUIRE_GPU();
  // V4: 128×128 weight blocks with 32-wide (GEMV convention) and 128-wide (V4 model) activation blocks.
  check_quant_gemm(testing::random_fp8_weight(256, 512, 128, 11), 50, 32, {}, kAllPlans, 12, "fp8_b128");
  check_quant_gemm(testing::random_fp8_weight(384, 640, 128, 13), 70, 128, {}, kAllPlans, 14, "fp8_b128_a128");
}

TEST(CudaQuantGemm, Fp8ReleasedShapes) {
  CEDAR_REQUIRE_GPU();
  struct Shape {
    const char* name;
    int64_t out, in;
  };
  // m = 130: two row tiles of 128 (one ragged), or four of 32/64, as the plan chooses.
  const Shape shapes[] = {{"wq_a", 1280, 5120},        {"wq_b", 32768, 1280},       {"wkv", 512, 5120},
                          {"wo_b", 5120, 8192},        {"shared_w1", 2304, 5120},   {"shared_w2", 5120, 2304},
                          {"engram_wkv", 25600, 6144}, {"indexer_wq_b", 4096, 1280}};
  uint32_t seed = 100;
  for (const Shape& s : shapes) {
    const auto w = testing::random_fp8_weight(s.out, s.in, 32, seed++);
    std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 256}, {s.out - 256, 256}};
    if (s.out <= 1280) ranges = {};
    check_quant_gemm(w, 130, 32, ranges, {{0, 0}, {128, 1}}, seed++, std::string("fp8 ") + s.name);
  }
  // wkv at 256 tokens: 4 tiles on 132 SMs, the plan splits K (and the unsplit plan is checked too).
  check_quant_gemm(testing::random_fp8_weight(512, 5120, 32, 150), 256, 32, {}, {{0, 0}, {128, 1}, {64, 4}}, 151,
                   "fp8 wkv");
}

TEST(CudaQuantGemm, Mxfp4MatchesCpuLinear) {
  CEDAR_REQUIRE_GPU();
  check_quant_gemm(testing::random_mxfp4_weight(48, 64, 21), 9, 32, {}, kAllPlans, 22, "mxfp4");
  check_quant_gemm(testing::random_mxfp4_weight(200, 96, 23), 33, 32, {}, kAllPlans, 24, "mxfp4");
  check_quant_gemm(testing::random_mxfp4_weight(2304, 5120, 25), 130, 32, {{0, 256}, {2048, 256}},
                   {{0, 0}, {128, 1}, {64, 1}}, 26, "mxfp4 expert_w1");
  check_quant_gemm(testing::random_mxfp4_weight(5120, 2304, 27), 70, 32, {{0, 512}, {4608, 512}}, {{0, 0}, {32, 1}}, 28,
                   "mxfp4 expert_w2");
  // V4 experts: 128-wide activation blocks over per-32 weight scales.
  check_quant_gemm(testing::random_mxfp4_weight(256, 512, 29), 40, 128, {}, kAllPlans, 30, "mxfp4_a128");
}

TEST(CudaQuantGemm, ActQuant128BitExact) {
  CEDAR_REQUIRE_GPU();
  const int64_t n = 5, in = 1024;
  auto x = testing::random_acts(static_cast<size_t>(n * in), 41);
  std::fill(x.begin() + 128, x.begin() + 256, 0.0f);  // all-zero block: amax clamps to 1e-4
  x[300] = 448.0f * 4;                                // exact power-of-two ratio
  auto dx = upload(x);
  auto dcodes = alloc<uint16_t>(x.size());
  auto dscales = alloc<float>(x.size() / 128);
  ASSERT_TRUE(quantize_act_fp8_blocked(dx.get(), n, in, 128, dcodes.get(), dscales.get(), nullptr).ok());
  const auto codes = download(dcodes);
  const auto scales = download(dscales);
  const testing::QuantizedRows want = testing::cpu_quantize_rows(x, 128);
  size_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float got = testing::half_bits_to_float(codes[i]);
    if ((got != want.codes[i] || std::signbit(got) != std::signbit(want.codes[i])) && bad++ == 0)
      ADD_FAILURE() << "first mismatch: value " << i << " (x=" << x[i] << ") code gpu " << got << " cpu "
                    << want.codes[i];
  }
  for (size_t b = 0; b < scales.size(); ++b)
    if (scales[b] != want.scales[b] && bad++ == 0)
      ADD_FAILURE() << "first mismatch: block " << b << " scale gpu " << scales[b] << " cpu " << want.scales[b];
  std::printf("PARITY %-40s n=%zu mismatches=%zu (bit-exact required)\n", "quantize_act_fp8_blocked 128", x.size(),
              bad);
  EXPECT_EQ(bad, 0u);
}

// The shared expert in prefill through the tiled kernels (swiglu_gemm with `tile_m`, quant_gemm with its
// split-K workspace): testing::check_swiglu_expert's three checks, W2 with the GEMM tolerance.
void check_swiglu(bool fp4, int64_t inter, int64_t d, int64_t m, int64_t act_block, bool weighted, int tile_m,
                  uint32_t seed, const std::string& name) {
  DeviceBuffer<float> dpart;
  testing::check_swiglu_expert(
      {.fp4 = fp4, .inter = inter, .d = d, .m = m, .act_block = act_block, .weighted = weighted, .seed = seed}, name,
      "tile" + std::to_string(tile_m), testing::kBlockSumTol,
      [&](SwigluGemmArgs& a) {
        a.force_tile_m = tile_m;
        return swiglu_gemm(a, nullptr);
      },
      [&](QuantGemmArgs& b) {
        const int64_t wsf = quant_gemm_workspace_floats(b.w, m);
        dpart = alloc<float>(static_cast<size_t>(wsf));
        return quant_gemm(b, QuantGemmWorkspace{dpart.get(), wsf}, nullptr);
      });
}

TEST(CudaSwigluGemm, SharedExpertMatchesCpu) {
  CEDAR_REQUIRE_GPU();
  check_swiglu(false, 2304, 5120, 70, 32, false, 0, 61, "swiglu fp8 shared");  // released shape
  check_swiglu(false, 96, 256, 37, 32, false, 32, 62, "swiglu fp8");           // inter < one tile
  check_swiglu(false, 256, 384, 130, 128, false, 128, 63, "swiglu fp8 b128");  // V4 blocks
}

TEST(CudaSwigluGemm, WeightedMxfp4MatchesCpu) {
  CEDAR_REQUIRE_GPU();
  check_swiglu(true, 384, 512, 77, 32, true, 64, 71, "swiglu mxfp4 weighted");
  check_swiglu(true, 256, 256, 33, 128, true, 32, 72, "swiglu mxfp4 a128");
}

TEST(CudaQuantGemm, RejectsBadArguments) {
  CEDAR_REQUIRE_GPU();
  const auto* fake = reinterpret_cast<const uint8_t*>(256);
  QuantGemmArgs a{.w = {.format = QuantWeightFormat::FP8Block, .out = 16, .in = 40, .data = fake, .scales = fake},
                  .m = 1};
  Status s = quant_gemm(a, {}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("in=40"), std::string::npos) << s.error().message;
  a.w.in = 64;
  a.act_block = 64;
  s = quant_gemm(a, {}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("act_block=64"), std::string::npos) << s.error().message;
  a.act_block = 32;
  a.w.block_out = 16;
  s = quant_gemm(a, {}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("FP8 block 16x32"), std::string::npos) << s.error().message;
  a.w.block_out = 32;
  s = quant_gemm(a, {}, nullptr);  // null activations for m = 1
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("null"), std::string::npos) << s.error().message;
  a.act_codes = reinterpret_cast<const uint16_t*>(256);
  a.act_scales = reinterpret_cast<const float*>(256);
  a.y = reinterpret_cast<float*>(256);
  a.force_splits = 2;
  s = quant_gemm(a, {}, nullptr);  // a forced split without workspace
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("workspace"), std::string::npos) << s.error().message;
  SwigluGemmArgs b{.w1 = a.w, .w3 = a.w, .m = 1};
  b.w3.out = 32;
  s = swiglu_gemm(b, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("differ"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace cedar::cuda
