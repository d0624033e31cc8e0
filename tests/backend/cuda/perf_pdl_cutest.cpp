// Programmatic dependent launch (kernels.h `programmatic_launch`): a decode-like chain of dependent
// kernels — rms_norm → quantize_act_fp8 → gemv_quantized (split-K) → gemv_bf16 over an FP8 weight →
// mhc_fused — launched with PDL, directly and captured in a CUDA graph, must give exactly the bits of
// the same chain without it (each kernel waits for its predecessor before reading its inputs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/stream.h"
#include "cuda_test_util.h"
#include "gemm_test_util.h"

namespace cedar::cuda {
namespace {

using testing::alloc;
using testing::download;
using testing::upload;

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// `chain` (with PDL) captured into a graph (programmatic edges) and replayed twice: each replay must give
// `plain`, the bits of the chain without PDL.
void expect_graph_replays_equal(cudaStream_t s, const std::function<Status()>& chain,
                                const std::function<std::vector<float>()>& results, const std::vector<float>& plain) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status st = chain();
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep) {
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    EXPECT_TRUE(bit_equal(results(), plain)) << "graph replay " << rep << " with programmatic edges changed the results";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

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

  ASSERT_TRUE(chain(false).ok());
  const auto plain = results();
  Status st = chain(true);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_TRUE(bit_equal(results(), plain)) << "PDL launches changed the results";

  expect_graph_replays_equal(s, [&] { return chain(true); }, results, plain);
  std::printf("PARITY %-40s %zu values bit-equal with and without PDL (direct and graph)\n", "PDL chain", plain.size());
}


// The routed-expert chain of a decode step as the model launches it beside the shared expert: router
// logits (unsplit) → router select → moe_build_items → packed w1/w3 items → SwiGLU (+ FP8 codes) →
// packed w2 items, every launch after the first with PDL: the same bits as without, direct and replayed
// from a graph (the item tables are built on the device, so a kernel that read them before its
// predecessor finished would see the previous step's).
TEST(CudaPdl, RoutedExpertChainGivesTheSameBits) {
  CEDAR_REQUIRE_GPU();
  constexpr int64_t n = 2, d = 512, inter = 256, E = 16, K = 4, P = n * K;
  const auto x = testing::random_acts(n * d, 11);
  std::vector<uint16_t> gate(E * d);
  for (int64_t i = 0; i < E * d; ++i)
    gate[i] = f32_to_bf16(0.02f * static_cast<float>(static_cast<int>((i * 7919) % 23) - 11));
  std::vector<float> bias(E);
  for (int64_t e = 0; e < E; ++e) bias[e] = 0.01f * static_cast<float>(e % 5);
  std::vector<testing::QuantWeightHost> w1, w3, w2;
  std::vector<DeviceBuffer<uint8_t>> keep;
  std::vector<const uint8_t*> p1, s1, p3, s3, p2, s2;
  auto packed_upload = [&](const testing::QuantWeightHost& w, int64_t out, int64_t in, std::vector<const uint8_t*>& dp,
                           std::vector<const uint8_t*>& sp) {
    std::vector<uint8_t> pk(w.data.size());
    ASSERT_TRUE(repack_mxfp4(w.data.data(), out, in, pk.data()).ok());
    keep.push_back(upload(pk));
    dp.push_back(keep.back().get());
    keep.push_back(upload(w.scales));
    sp.push_back(keep.back().get());
  };
  for (int64_t e = 0; e < E; ++e) {
    w1.push_back(testing::random_mxfp4_weight(inter, d, 300 + static_cast<uint32_t>(e)));
    w3.push_back(testing::random_mxfp4_weight(inter, d, 400 + static_cast<uint32_t>(e)));
    w2.push_back(testing::random_mxfp4_weight(d, inter, 500 + static_cast<uint32_t>(e)));
    packed_upload(w1.back(), inter, d, p1, s1);
    packed_upload(w3.back(), inter, d, p3, s3);
    packed_upload(w2.back(), d, inter, p2, s2);
  }
  auto dx = upload(x), dbias = upload(bias);
  auto dgate = upload(gate);
  auto dp1 = upload(p1), ds1 = upload(s1), dp3 = upload(p3), ds3 = upload(s3), dp2 = upload(p2), ds2 = upload(s2);
  auto codes = alloc<uint16_t>(n * d);
  auto ascales = alloc<float>(n * d / 32);
  ASSERT_TRUE(quantize_act_fp8(dx.get(), n, d, codes.get(), ascales.get(), nullptr).ok());
  auto logits = alloc<float>(n * E);
  auto experts = alloc<int32_t>(P);
  auto weights = alloc<float>(P);
  auto g = alloc<float>(P * inter), u = alloc<float>(P * inter);
  auto hcodes = alloc<uint16_t>(P * inter);
  auto hscales = alloc<float>(P * inter / 32);
  auto out = alloc<float>(P * d);
  auto items13 = alloc<DeviceGemvItem>(2 * P), items2 = alloc<DeviceGemvItem>(P);
  auto counts = alloc<int32_t>(2);
  auto work = alloc<unsigned>(4);  // with PDL the units also come from work counters (re-armed per launch)
  ASSERT_TRUE(work.zero().ok());
  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok()) << stream.error().message;
  const cudaStream_t s = stream->get();
  const QuantWeightView shape13{QuantWeightFormat::MXFP4, inter, d, nullptr, nullptr, 32, 32};
  const QuantWeightView shape2{QuantWeightFormat::MXFP4, d, inter, nullptr, nullptr, 32, 32};

  const SplitKSize router_ws = router_workspace_size(E, d);
  auto partials = alloc<float>(router_ws.partial_floats);
  auto tickets = alloc<unsigned>(router_ws.counters);
  ASSERT_TRUE(tickets.zero().ok());
  // split: the split-K router's one fused launch (router_ahead); in_router: the items built by its last
  // block (dispatch_in_router) instead of moe_build_items.
  auto chain = [&](bool pdl, bool split = false, bool in_router = false) -> Status {
    MoeDispatchArgs da;
    da.experts = experts.get();
    da.n = n;
    da.topk = K;
    da.n_experts = E;
    da.n_tables = 2;
    da.tables[0] = MoeItemTable{2, {{dp1.get(), ds1.get()}, {dp3.get(), ds3.get()}}, {g.get(), u.get()}, codes.get(),
                                ascales.get(), false, items13.get(), counts.get(), 2 * P};
    da.tables[1] = MoeItemTable{1, {{dp2.get(), ds2.get()}, {}}, {out.get(), nullptr}, hcodes.get(), hscales.get(), true,
                                items2.get(), counts.get() + 1, P};
    RouterArgs ra;
    ra.n = n;
    ra.d = d;
    ra.n_experts = E;
    ra.topk = K;
    ra.x = dx.get();
    ra.gate = dgate.get();
    ra.bias = dbias.get();
    ra.logits = logits.get();
    ra.experts = experts.get();
    ra.weights = weights.get();
    if (split) {
      ra.splitk = SplitKWorkspace{partials.get(), tickets.get(), router_ws.partial_floats, router_ws.counters};
      CEDAR_RETURN_IF_ERROR(moe_route(ra, s, in_router ? &da : nullptr));  // first of the chain: no PDL
    } else {
      CEDAR_RETURN_IF_ERROR(router_logits(ra, s));  // first of the branch: no PDL, as in the model
      ra.programmatic_launch = pdl;
      CEDAR_RETURN_IF_ERROR(router_select(ra, s));
    }
    if (!in_router) {
      da.programmatic_launch = pdl;
      CEDAR_RETURN_IF_ERROR(moe_build_items(da, s));
    }
    const Mxfp4Layout bal = Mxfp4Layout::PackedBalanced;
    CEDAR_RETURN_IF_ERROR(gemv_quantized_items(shape13, bal, items13.get(), counts.get(), 2 * P, true, s,
                                               {.programmatic_launch = pdl, .work = pdl ? work.get() : nullptr}));
    SwigluArgs sw{P, inter, g.get(), u.get(), weights.get(), 10.0f, nullptr, hcodes.get(), hscales.get()};
    sw.programmatic_launch = pdl;
    CEDAR_RETURN_IF_ERROR(swiglu(sw, s));
    return gemv_quantized_items(shape2, bal, items2.get(), counts.get() + 1, P, true, s,
                                {.programmatic_launch = pdl, .work = pdl ? work.get() + 2 : nullptr});
  };
  auto results = [&] {
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<float> r = download(out);
    const auto wv = download(weights);
    r.insert(r.end(), wv.begin(), wv.end());
    for (int32_t e : download(experts)) r.push_back(static_cast<float>(e));
    return r;
  };
  ASSERT_TRUE(chain(false).ok());
  const auto plain = results();
  // Not a vacuous comparison: the experts' outputs are not all zero.
  double mass = 0;
  for (int64_t i = 0; i < P * d; ++i) mass += std::fabs(plain[static_cast<size_t>(i)]);
  ASSERT_GT(mass, 0.0) << "the routed outputs are all zero";
  Status st = chain(true);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_TRUE(bit_equal(results(), plain)) << "PDL launches changed the routed outputs";

  ASSERT_TRUE(out.zero().ok());
  expect_graph_replays_equal(s, [&] { return chain(true); }, results, plain);
  std::printf("PARITY %-40s %zu values bit-equal with and without PDL (direct and graph)\n", "PDL routed chain",
              plain.size());

  // The split-K router with the items from its last block, under PDL: the bits of the split-K router +
  // moe_build_items without PDL (the split sums differ from the unsplit ones, so not `plain`'s).
  ASSERT_TRUE(chain(false, true, false).ok());
  const auto split_plain = results();
  ASSERT_TRUE(out.zero().ok());
  st = chain(true, true, true);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_TRUE(bit_equal(results(), split_plain)) << "the items built in the router's launch changed the outputs";
  ASSERT_TRUE(out.zero().ok());
  expect_graph_replays_equal(s, [&] { return chain(true, true, true); }, results, split_plain);
  std::printf("PARITY %-40s %zu values bit-equal (direct and graph)\n", "PDL routed chain, items in the router",
              split_plain.size());
}

}  // namespace
}  // namespace cedar::cuda
