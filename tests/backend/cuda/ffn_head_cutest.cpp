// The end of the forward on the device (final collapse, RMSNorm, fp32 head, argmax) against the CPU
// model's finish_rows steps: hc_collapse, cpu::rms_norm, cpu::linear with the BF16 head (fp32 out).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/ffn_kernels.h"
#include "cuda_test_util.h"
#include "ffn_test_util.h"
#include "model/mhc.h"

namespace cedar::cuda {
namespace {

using namespace ffn_testing;
using testing::parity;
using testing::Tolerance;

TEST(CudaFinalHead, CollapseNormHeadArgmaxMatchCpu) {
  CEDAR_REQUIRE_GPU();
  const int64_t n = 3, hc = 4, d = 5120, vocab = 4100;  // vocab: a partial row tile
  const auto X = random_acts(n * hc * d, 1, 1.0f, -3, 3);
  std::vector<float> pre(n * hc);
  std::mt19937 rng(2);
  for (auto& v : pre) v = std::uniform_real_distribution<float>(0.2f, 1.2f)(rng);
  auto norm_w = random_bf16(d, 3, 0.3f);
  for (auto& v : norm_w) v = round_to_bf16(1.0f + v);
  const auto head = random_bf16(vocab * d, 4, 0.02f);
  const auto head_bits = bf16_bits(head);

  // CPU: DeepseekV41Model::finish_rows.
  std::vector<float> x(n * d), xn(n * d), want(n * vocab);
  for (int64_t t = 0; t < n; ++t)
    hc_collapse(std::span<const float>(X.data() + t * hc * d, hc * d), std::span<const float>(pre.data() + t * hc, hc),
                hc, d, std::span<float>(x.data() + t * d, d));
  cpu::rms_norm(x, d, norm_w, 1e-20, xn);
  const cpu::LinearWeight hw{
      .format = WeightFormat::BF16, .out = vocab, .in = d, .data = reinterpret_cast<const uint8_t*>(head_bits.data())};
  ASSERT_TRUE(cpu::linear(hw, xn, n, want, {.bf16_output = false}, nullptr).ok());

  auto dX = upload(X), dpre = upload(pre), dw = upload(norm_w);
  auto dhead = upload(head_bits);
  auto dx = alloc<float>(n * d), dcol = alloc<float>(n * d);
  auto dlogits = alloc<float>(n * vocab);
  const SplitKSize split = gemv_bf16_splitk_size(vocab, d);
  auto dpart = alloc<float>(split.partial_floats);
  auto dcnt = alloc<unsigned>(split.counters);
  ASSERT_TRUE(dcnt.zero().ok());
  ASSERT_TRUE(hc_collapse_rows(dX.get(), dpre.get(), n, hc, d, dcol.get(), nullptr).ok());
  FinalHeadArgs a;
  a.n = n;
  a.hc = hc;
  a.d = d;
  a.vocab = vocab;
  a.X = dX.get();
  a.pre = dpre.get();
  a.norm_weight = dw.get();
  a.head = dhead.get();
  a.x = dx.get();
  a.logits = dlogits.get();
  a.splitk = SplitKWorkspace{dpart.get(), dcnt.get(), split.partial_floats, split.counters};
  const Status s = final_head(a, nullptr);
  ASSERT_TRUE(s.ok()) << s.error().message;

  const Tolerance exact{.max_nmse = 0, .min_cosine = 0, .rel = 0, .abs = 0};
  EXPECT_TRUE(parity("final collapse 3x4x5120", download(dcol), x, exact));  // same ops, same order
  // rms_norm: the sum of squares in another order can flip one bf16 rounding (kernels.h).
  const auto xn_gpu = download(dx);
  const Tolerance norm_tol{.max_nmse = 1e-5, .min_cosine = 0.99999, .rel = 0x1p-7};
  EXPECT_TRUE(parity("final norm 3x5120", xn_gpu, xn, norm_tol));
  // The head on the GPU's own normed rows: only the summation order differs (the gemv_bf16 bound:
  // (in·1.125 + 32)·2^-24·Σ|x·w| covers both sides' sums).
  std::vector<float> want_own(n * vocab), bound(n * vocab), ax(xn_gpu.size()), ah(head.size());
  ASSERT_TRUE(cpu::linear(hw, xn_gpu, n, want_own, {.bf16_output = false}, nullptr).ok());
  std::transform(xn_gpu.begin(), xn_gpu.end(), ax.begin(), [](float v) { return std::fabs(v); });
  std::transform(head.begin(), head.end(), ah.begin(), [](float v) { return std::fabs(v); });
  const auto ah_bits = bf16_bits(ah);
  const cpu::LinearWeight ahw{
      .format = WeightFormat::BF16, .out = vocab, .in = d, .data = reinterpret_cast<const uint8_t*>(ah_bits.data())};
  ASSERT_TRUE(cpu::linear(ahw, ax, n, bound, {.bf16_output = false}, nullptr).ok());
  const auto logits = download(dlogits);
  const Tolerance head_tol{.max_nmse = 1e-9, .min_cosine = 0.9999999, .bound_scale = (d * 1.125 + 32) * 0x1p-24};
  EXPECT_TRUE(parity("fp32 head 3x4100x5120 (gpu-normed rows)", logits, want_own, head_tol, bound));
  // Against the whole CPU chain: in addition each flipped normed value moves a logit by <= 2^-7·|x_j·w_j|.
  const Tolerance chain_tol{
      .max_nmse = 1e-6, .min_cosine = 0.999999, .bound_scale = 0x1p-7 + (d * 1.125 + 32) * 0x1p-24};
  EXPECT_TRUE(parity("fp32 head vs cpu chain", logits, want, chain_tol, bound));

  // Greedy token: the device argmax of the device logits is the CPU's unless the CPU's top two
  // logits are closer than the error bound.
  auto dtok = alloc<int32_t>(n);
  ASSERT_TRUE(argmax_rows(dlogits.get(), n, vocab, dtok.get(), nullptr).ok());
  const auto tok = download(dtok);
  for (int64_t t = 0; t < n; ++t) {
    const auto row = want.begin() + t * vocab;
    const int64_t best = std::max_element(row, row + vocab) - row;
    float second = -INFINITY;
    for (int64_t i = 0; i < vocab; ++i)
      if (i != best) second = std::max(second, row[i]);
    const double margin = row[best] - second, err = chain_tol.bound_scale * bound[t * vocab + best] * 2;
    if (margin > err) {
      EXPECT_EQ(tok[t], best) << "token " << t << " (top-2 margin " << margin << " > error bound " << err << ")";
    } else {
      std::printf("[  NOTE    ] token %lld: top-2 margin %.3g within the error bound %.3g, argmax not compared\n",
                  static_cast<long long>(t), margin, err);
    }
  }
}

}  // namespace
}  // namespace cedar::cuda
