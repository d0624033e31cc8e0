// Programmatic dependent launch (kernels.h `programmatic_launch`): a decode-like chain of dependent
// kernels — rms_norm → quantize_act_fp8 → gemv_quantized (split-K) → gemv_bf16 over an FP8 weight →
// mhc_fused — launched with PDL, directly and captured in a CUDA graph, must give exactly the bits of
// the same chain without it (each kernel waits for its predecessor before reading its inputs).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/stream.h"
#include "cuda_test_util.h"
#include "gemm_test_util.h"

namespace cedar::cuda {
namespace {

using testing::alloc;
using testing::download;
using testing::upload;

TEST(CudaPdl, DependentChainGivesTheSameBits) {
  CEDAR_REQUIRE_GPU();
  constexpr int64_t n = 2, d = 1024, out1 = 1280, out2 = 256, hc = 4;
  const auto x = testing::random_acts(n * d, 1);
  std::vector<float> norm_w(d, 1.0f);
  for (int64_t i = 0; i < d; ++i) norm_w[i] = round_to_bf16(1.0f + 0.001f * static_cast<float>(i % 17));
  const auto w1 = testing::random_fp8_weight(out1, d, 32, 2, 112);     // FP8 GEMV, split-K
  const auto w2 = testing::random_fp8_weight(out2, out1, 32, 3, 112);  // gemv_bf16 over FP8 (wo_a-like)
  const auto X = testing::random_acts(n * hc * out2, 4);
  std::vector<float> fn(24 * hc * out2), base(24, 0.1f), scale(3, 0.5f), coef(n * 24, 0.3f);
  for (size_t i = 0; i < fn.size(); ++i) fn[i] = 0.01f * static_cast<float>(static_cast<int>(i % 13) - 6);
  auto dx = upload(x), dnw = upload(norm_w), dX = upload(X), dfn = upload(fn), dbase = upload(base),
       dscale = upload(scale), dcoef = upload(coef);
  auto dw1 = upload(w1.data), ds1 = upload(w1.scales), dw2 = upload(w2.data), ds2 = upload(w2.scales);
  auto xn = alloc<float>(n * d);
  auto codes = alloc<uint16_t>(n * d);
  auto ascales = alloc<float>(n * d / 32);
  auto y1 = alloc<float>(n * out1), y2 = alloc<float>(n * out2);
  auto Xo = alloc<float>(n * hc * out2), col = alloc<float>(n * out2), mix = alloc<float>(n * 24);
  const QuantWeightView v1{QuantWeightFormat::FP8Block, out1, d, dw1.get(), ds1.get(), 32, 32};
  const SplitKSize split = splitk_workspace_size(v1);
  auto part = alloc<float>(std::max<int64_t>(split.partial_floats, 1));
  auto cnt = alloc<unsigned>(std::max<int64_t>(split.counters, 1));
  ASSERT_TRUE(cnt.zero().ok());
  const int64_t mf = mhc_workspace_floats(n, out2), mc = mhc_workspace_counters(n);
  auto mpart = alloc<float>(mf);
  auto mcnt = alloc<unsigned>(mc);
  ASSERT_TRUE(mcnt.zero().ok());
  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok()) << stream.error().message;
  const cudaStream_t s = stream->get();

  auto chain = [&](bool pdl) -> Status {
    CEDAR_RETURN_IF_ERROR(rms_norm(dx.get(), n, d, dnw.get(), 1e-6f, xn.get(), s, pdl));
    CEDAR_RETURN_IF_ERROR(quantize_act_fp8(xn.get(), n, d, codes.get(), ascales.get(), s, pdl));
    CEDAR_RETURN_IF_ERROR(gemv_quantized(v1, codes.get(), ascales.get(), n, y1.get(), true, s,
                                         SplitKWorkspace{part.get(), cnt.get(), split.partial_floats, split.counters},
                                         pdl));
    Bf16GemvArgs g;
    g.w_fp8 = dw2.get();
    g.w_scales = ds2.get();
    g.out = out2;
    g.in = out1;
    g.x = y1.get();
    g.y = y2.get();
    g.n = n;
    g.bf16_output = true;
    g.programmatic_launch = pdl;
    CEDAR_RETURN_IF_ERROR(gemv_bf16(g, s));
    MhcFusedArgs m;
    m.n = n;
    m.d = out2;
    m.X = dX.get();
    m.y = y2.get();
    m.post = dcoef.get() + 4;
    m.comb = dcoef.get() + 8;
    m.post_stride = m.comb_stride = m.collapse_w_stride = 24;
    m.X_out = Xo.get();
    m.collapse_w = dcoef.get();
    m.collapsed = col.get();
    m.fn = dfn.get();
    m.base = dbase.get();
    m.scale = dscale.get();
    m.mix_out = mix.get();
    m.programmatic_launch = pdl;
    return mhc_fused(m, MhcWorkspace{mpart.get(), mcnt.get(), mf, mc}, s);
  };
  auto results = [&] {
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<float> r = download(y1);
    for (const auto* b : {&y2, &Xo, &col, &mix}) {
      const auto v = download(*b);
      r.insert(r.end(), v.begin(), v.end());
    }
    return r;
  };
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };

  ASSERT_TRUE(chain(false).ok());
  const auto plain = results();
  Status st = chain(true);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_TRUE(same(results(), plain)) << "PDL launches changed the results";

  // The same chain captured into a graph (programmatic edges) and replayed twice.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  st = chain(true);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep) {
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    EXPECT_TRUE(same(results(), plain)) << "graph replay " << rep << " with programmatic edges changed the results";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::printf("PARITY %-40s %zu values bit-equal with and without PDL (direct and graph)\n", "PDL chain", plain.size());
}

}  // namespace
}  // namespace cedar::cuda
