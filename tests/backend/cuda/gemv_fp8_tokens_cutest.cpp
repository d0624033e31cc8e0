// The FP8 GEMV of 9..64 tokens per launch (gemv_fp8_tokens.cu, one K block per MMA): the results against
// cpu::linear with the GEMV tolerance, and a token's result independent of the launch's other tokens (a call of n
// tokens bit for bit against the same tokens among n + 9), for one matrix, grouped matrices with strided rows and
// multi launches, V4.1's 32×32 and V4's 128×128 scale blocks, heights that are not whole tiles, n past one launch,
// and shapes that take a K split. (Its sums round at other points than the 8-token tile kernel's, so calls of up to
// 8 tokens are not its bits.)
#include <gtest/gtest.h>

#include <algorithm>
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
using testing::upload;

// The first of a's floats that differs from b's (b may be longer), or "" when they are the same bits.
std::string first_difference(const std::vector<float>& a, const std::vector<float>& b, int64_t out) {
  if (a.size() > b.size()) return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return "token " + std::to_string(i / out) + " row " + std::to_string(i % out) + ": " + std::to_string(a[i]) +
             " (n tokens) vs " + std::to_string(b[i]) + " (among n + 9)";
  return "";
}

enum class Form { kSingle, kGrouped, kMulti };

// Calls `form` over ws for tokens [t0, t0 + n) of the codes (row stride `in` · groups for kGrouped: item i reads
// column slice i, as wo_a's groups do) into ys.
Status call(Form form, const std::vector<QuantWeightHost>& ws, const std::vector<DeviceBuffer<uint8_t>>& data,
            const std::vector<DeviceBuffer<uint8_t>>& scales, const uint16_t* codes, const float* act_scales,
            std::vector<DeviceBuffer<float>>& ys, int64_t t0, int64_t n, const SplitKWorkspace& split) {
  const int64_t in = ws[0].cpu.in, count = static_cast<int64_t>(ws.size());
  const int64_t groups = form == Form::kGrouped ? count : 1;
  std::vector<QuantWeightView> mats;
  std::vector<GemvGroupItem> items;
  for (size_t i = 0; i < ws.size(); ++i) {
    const int64_t out = ws[i].cpu.out;
    const int64_t col = form == Form::kGrouped ? static_cast<int64_t>(i) * in : 0;
    mats.push_back({QuantWeightFormat::FP8Block, out, in, data[i].get(), scales[i].get(), ws[i].cpu.block_out,
                    ws[i].cpu.block_in});
    items.push_back({data[i].get(), scales[i].get(), codes + t0 * groups * in + col,
                     act_scales + (t0 * groups * in + col) / 32, ys[i].get() + t0 * out, groups * in,
                     groups * in / 32, out});
  }
  if (form == Form::kMulti) return gemv_quantized_multi(mats.data(), items.data(), count, n, true, nullptr, split);
  if (form == Form::kGrouped) return gemv_quantized_grouped(mats[0], items.data(), count, n, true, nullptr, split, true);
  return gemv_quantized(mats[0], items[0].act_codes, items[0].act_scales, n, ys[0].get() + t0 * ws[0].cpu.out, true,
                        nullptr, split, true);
}

// The split-K workspace of the call's shape (none where it takes no split); `want_split` says whether it must split.
struct SplitBuffers {
  DeviceBuffer<float> partials;
  DeviceBuffer<unsigned> counters;
  SplitKWorkspace ws;
};
SplitBuffers split_for(Form form, const std::vector<QuantWeightHost>& ws, bool want_split) {
  std::vector<QuantWeightView> mats;
  for (const auto& w : ws)
    mats.push_back({QuantWeightFormat::FP8Block, w.cpu.out, w.cpu.in, nullptr, nullptr, w.cpu.block_out, w.cpu.block_in});
  const int64_t count = static_cast<int64_t>(ws.size());
  const SplitKSize need = form == Form::kMulti ? splitk_workspace_size_multi(mats.data(), count)
                                               : splitk_workspace_size(mats[0], form == Form::kGrouped ? count : 1);
  EXPECT_EQ(need.partial_floats > 0, want_split) << "the shape's K split is not what the case is for";
  SplitBuffers b;
  if (need.partial_floats == 0) return b;
  b.partials = alloc<float>(static_cast<size_t>(need.partial_floats));
  b.counters = alloc<unsigned>(static_cast<size_t>(need.counters));
  EXPECT_EQ(cudaMemset(b.counters.get(), 0, need.counters * sizeof(unsigned)), cudaSuccess);
  b.ws = SplitKWorkspace{b.partials.get(), b.counters.get(), need.partial_floats, need.counters};
  return b;
}

void check(const std::string& name, Form form, const std::vector<QuantWeightHost>& ws, int64_t n, bool split = false) {
  SCOPED_TRACE(name + " n=" + std::to_string(n));
  const SplitBuffers sb = split_for(form, ws, split);
  const int64_t in = ws[0].cpu.in, groups = form == Form::kGrouped ? static_cast<int64_t>(ws.size()) : 1;
  const int64_t wide = n + 9;  // the same first n tokens among 9 more: one launch while wide <= 64
  const auto x = testing::random_acts(static_cast<size_t>(wide * groups * in), 13);
  auto dx = upload(x);
  auto codes = alloc<uint16_t>(static_cast<size_t>(wide * groups * in));
  auto act_scales = alloc<float>(static_cast<size_t>(wide * groups * in / 32));
  ASSERT_TRUE(quantize_act_fp8(dx.get(), wide, groups * in, codes.get(), act_scales.get(), nullptr).ok());
  std::vector<DeviceBuffer<uint8_t>> data, scales;
  std::vector<DeviceBuffer<float>> one, tiled;
  for (const auto& w : ws) {
    data.push_back(upload(w.data));
    scales.push_back(upload(w.scales));
    one.push_back(alloc<float>(static_cast<size_t>(n * w.cpu.out)));
    tiled.push_back(alloc<float>(static_cast<size_t>(wide * w.cpu.out)));
  }
  Status s = call(form, ws, data, scales, codes.get(), act_scales.get(), one, 0, n, sb.ws);
  ASSERT_TRUE(s.ok()) << s.error().message;
  const bool one_launch = wide <= 64;
  if (one_launch) {
    s = call(form, ws, data, scales, codes.get(), act_scales.get(), tiled, 0, wide, sb.ws);
    ASSERT_TRUE(s.ok()) << s.error().message;
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t i = 0; i < ws.size(); ++i) {
    const auto a = download(one[i]), b = download(tiled[i]);
    if (one_launch) {
      EXPECT_EQ(first_difference(a, b, ws[i].cpu.out), "") << "matrix " << i;
    }
    // The CPU reference of matrix i over its slice of each token's activations.
    std::vector<float> xi(static_cast<size_t>(n * in));
    for (int64_t tok = 0; tok < n; ++tok)
      std::copy_n(x.begin() + (tok * groups + (form == Form::kGrouped ? static_cast<int64_t>(i) : 0)) * in, in,
                  xi.begin() + tok * in);
    const auto ref = testing::reference_rows(ws[i], xi, n, 0, ws[i].cpu.out, 32, true, &testing::pool());
    EXPECT_TRUE(parity(name + " matrix " + std::to_string(i) + " n=" + std::to_string(n), a, ref.want,
                       testing::kBlockSumTol, ref.bound));
  }
}

TEST(CudaGemvFp8Tokens, MatchesCpuAndATokenDoesNotDependOnTheOthers) {
  CEDAR_REQUIRE_GPU();
  using testing::random_fp8_weight;
  for (const int64_t n : {int64_t{9}, int64_t{16}, int64_t{20}, int64_t{33}, int64_t{64}, int64_t{70}}) {
    check("wq_b-like", Form::kSingle, {random_fp8_weight(2048, 1280, 32, 1)}, n);
    check("wo_a-like groups", Form::kGrouped, {random_fp8_weight(256, 512, 32, 2), random_fp8_weight(256, 512, 32, 3)},
          n);
  }
  // Two heights in one launch (no K split at these sizes), a height that is not whole tiles, V4's blocks.
  check("multi", Form::kMulti, {random_fp8_weight(2048, 1280, 32, 4), random_fp8_weight(512, 1280, 32, 5)}, 24);
  check("ragged height", Form::kSingle, {random_fp8_weight(200, 256, 32, 6)}, 13);
  check("v4 blocks", Form::kSingle, {random_fp8_weight(512, 1024, 128, 7)}, 40);
}

// Shapes with few row tiles and a long K take a K split (choose_ksplit): the splits meet in the workspace and are
// added in split order, so a token's bits still do not depend on the others. wq_a / the shared expert's w1 / w3.
TEST(CudaGemvFp8Tokens, KSplitMatchesCpuAndATokenDoesNotDependOnTheOthers) {
  CEDAR_REQUIRE_GPU();
  using testing::random_fp8_weight;
  for (const int64_t n : {int64_t{9}, int64_t{20}, int64_t{40}, int64_t{64}, int64_t{70}}) {
    check("split", Form::kSingle, {random_fp8_weight(256, 4096, 32, 11)}, n, true);
    check("split groups", Form::kGrouped, {random_fp8_weight(256, 2048, 32, 12), random_fp8_weight(256, 2048, 32, 13)},
          n, true);
  }
  check("split multi", Form::kMulti, {random_fp8_weight(512, 2048, 32, 14), random_fp8_weight(256, 2048, 32, 15)}, 33,
        true);
  check("split ragged", Form::kSingle, {random_fp8_weight(200, 4096, 32, 16)}, 17, true);
  check("split v4 blocks", Form::kSingle, {random_fp8_weight(256, 4096, 128, 17)}, 24, true);
}

}  // namespace
}  // namespace cedar::cuda
