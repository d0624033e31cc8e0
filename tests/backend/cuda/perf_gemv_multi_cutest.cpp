// gemv_quantized_multi (kernels.h): matrices of different heights over the same input in one launch
// (wq_a + wkv of the attention input), each against cpu::linear with the GEMV's tolerance, with and
// without the split-K workspace, and two launches bit-identical (re-armed counters, deterministic).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "cuda_test_util.h"
#include "gemm_test_util.h"

namespace cedar::cuda {
namespace {

using testing::alloc;
using testing::download;
using testing::parity;
using testing::QuantWeightHost;
using testing::Tolerance;
using testing::upload;


void check_multi(const std::vector<QuantWeightHost>& ws, int64_t n, bool splitk, const std::string& name) {
  const int64_t in = ws[0].cpu.in;
  const auto x = testing::random_acts(static_cast<size_t>(n * in), 5);
  auto dx = upload(x);
  auto codes = alloc<uint16_t>(static_cast<size_t>(n * in));
  auto scales = alloc<float>(static_cast<size_t>(n * in / 32));
  ASSERT_TRUE(quantize_act_fp8(dx.get(), n, in, codes.get(), scales.get(), nullptr).ok());
  std::vector<DeviceBuffer<uint8_t>> data, sc;
  std::vector<DeviceBuffer<float>> ys;
  std::vector<QuantWeightView> mats;
  std::vector<GemvGroupItem> items;
  for (const auto& w : ws) {
    data.push_back(upload(w.data));
    sc.push_back(upload(w.scales));
    ys.push_back(alloc<float>(static_cast<size_t>(n * w.cpu.out)));
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    const bool fp4 = ws[i].cpu.format == WeightFormat::MXFP4;
    mats.push_back({fp4 ? QuantWeightFormat::MXFP4 : QuantWeightFormat::FP8Block, ws[i].cpu.out, in, nullptr, nullptr,
                    ws[i].cpu.block_out, ws[i].cpu.block_in});
    items.push_back({data[i].get(), sc[i].get(), codes.get(), scales.get(), ys[i].get()});
  }
  const SplitKSize need =
      splitk ? splitk_workspace_size_multi(mats.data(), static_cast<int64_t>(mats.size())) : SplitKSize{};
  auto part = alloc<float>(static_cast<size_t>(std::max<int64_t>(need.partial_floats, 1)));
  auto cnt = alloc<unsigned>(static_cast<size_t>(std::max<int64_t>(need.counters, 1)));
  ASSERT_TRUE(cnt.zero().ok());
  const SplitKWorkspace wsk{part.get(), cnt.get(), need.partial_floats, need.counters};
  std::vector<std::vector<float>> first;
  for (int rep = 0; rep < 2; ++rep) {
    const Status s =
        gemv_quantized_multi(mats.data(), items.data(), static_cast<int64_t>(mats.size()), n, true, nullptr, wsk);
    ASSERT_TRUE(s.ok()) << s.error().message;
    for (size_t i = 0; i < ws.size(); ++i) {
      const auto y = download(ys[i]);
      if (rep == 0) {
        first.push_back(y);
        const auto ref = testing::reference_rows(ws[i], x, n, 0, ws[i].cpu.out, 32, true, nullptr);
        EXPECT_TRUE(parity(name + " matrix " + std::to_string(i) + " " + std::to_string(ws[i].cpu.out) + "x" +
                               std::to_string(in) + " n=" + std::to_string(n) + (need.counters ? " splitk" : ""),
                           y, ref.want, testing::kBlockSumTol, ref.bound));
      } else {
        EXPECT_EQ(std::memcmp(y.data(), first[i].data(), y.size() * sizeof(float)), 0)
            << name << ": matrix " << i << " differs between two launches";
      }
    }
  }
}

TEST(CudaGemvMulti, DifferentHeightsOneLaunch) {
  CEDAR_REQUIRE_GPU();
  const std::vector<QuantWeightHost> attn = {testing::random_fp8_weight(1280, 5120, 32, 1),  // wq_a
                                             testing::random_fp8_weight(512, 5120, 32, 2)};  // wkv
  for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{9}}) {
    check_multi(attn, n, true, "gemv multi wq_a+wkv");
    check_multi(attn, n, false, "gemv multi wq_a+wkv");
  }
  check_multi({testing::random_mxfp4_weight(64, 256, 3), testing::random_mxfp4_weight(96, 256, 4),
               testing::random_mxfp4_weight(16, 256, 5)},
              5, true, "gemv multi mxfp4");
}

TEST(CudaGemvMulti, RejectsMismatchedMatrices) {
  CEDAR_REQUIRE_GPU();
  const auto* fake = reinterpret_cast<const uint8_t*>(256);
  const QuantWeightView mats[2] = {{QuantWeightFormat::FP8Block, 64, 256, nullptr, nullptr, 32, 32},
                                   {QuantWeightFormat::FP8Block, 64, 512, nullptr, nullptr, 32, 32}};
  const GemvGroupItem items[2] = {{fake, fake, nullptr, nullptr, nullptr}, {fake, fake, nullptr, nullptr, nullptr}};
  const Status s = gemv_quantized_multi(mats, items, 2, 1, true, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("only out may differ"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace cedar::cuda
