// The router's fast paths (ffn_kernels.h: split-K logits with a workspace, moe_route fused into one
// launch for n <= 8, the cuBLASLt prefill logits) against the CPU oracle (route_tokens, cpu::linear)
// and against each other: a token's logits must not depend on the batch, and the fused launch must
// give the same bits as router_logits + router_select.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/gemm_kernels.h"
#include "core/numeric.h"
#include "cuda_test_util.h"
#include "ffn_test_util.h"
#include "model/moe.h"
#include "router_test_util.h"

namespace cedar::cuda {
namespace {

using namespace ffn_testing;
using testing::parity;
using testing::Tolerance;

constexpr double kU = 0x1p-24;  // fp32 unit roundoff

// With the workspace the gate is split over K (d = 5120: 5 splits × 24 row tiles); the result is
// within the fp32 summation bound of cpu::linear (CPU (d−1)·u; GPU ≤ (23 + ksplit)·u: 8-MMA chains
// at <= 2u per step, 7 warp and ksplit split additions), and a token's logits are the same bits
// whatever else is in the call (n = 70: two passes of 64 + 6; n = 9: two MMA tiles; n = 1).
TEST(CudaRouterFast, SplitLogitsWithinBoundAndIndependentOfTheBatch) {
  CEDAR_REQUIRE_GPU();
  const RouterCase c = make_router_case(70, 5120, 384, 6, 11);
  RouterDevice dv = upload_router(c, true);
  ASSERT_TRUE(router_logits(dv.args, nullptr).ok());
  const auto all = download(dv.logits);
  const Tolerance tol{.max_nmse = 1e-9, .min_cosine = 0.9999999, .bound_scale = (c.d + 23 + 64) * kU};
  EXPECT_TRUE(parity("router logits split-K 70x384 d=5120", all, router_cpu_logits(c), tol, router_abs_dot(c)));

  auto sub = [&](int64_t t0, int64_t n) {
    RouterArgs a = dv.args;
    a.n = n;
    a.x = dv.x.get() + t0 * c.d;
    EXPECT_TRUE(router_logits(a, nullptr).ok());
    const auto got = download(dv.logits);
    for (int64_t i = 0; i < n * c.E; ++i)
      if (got[i] != all[t0 * c.E + i]) {
        ADD_FAILURE() << "token " << t0 + i / c.E << " expert " << i % c.E << ": n=" << n << " gives " << got[i]
                      << ", n=70 gives " << all[t0 * c.E + i] << " (a token's logits must not depend on the batch)";
        return;
      }
    std::printf("PARITY %-40s n=%lld bit-equal to the n=70 call\n",
                ("router logits tokens " + std::to_string(t0) + "..").c_str(), static_cast<long long>(n));
  };
  sub(0, 1);
  sub(5, 1);
  sub(64, 1);
  sub(69, 1);
  sub(0, 9);
  sub(60, 8);
  // Without the workspace the logits run unsplit (another order): within the same kind of bound.
  RouterDevice plain = upload_router(c, false);
  ASSERT_TRUE(router_logits(plain.args, nullptr).ok());
  const Tolerance tol_plain{.max_nmse = 1e-9, .min_cosine = 0.9999999, .bound_scale = (c.d + c.d / 64.0 + 8) * kU};
  EXPECT_TRUE(parity("router logits unsplit 70x384 d=5120", download(plain.logits), router_cpu_logits(c), tol_plain,
                     router_abs_dot(c)));
}

// moe_route with a workspace and n <= 8 is one launch whose last block selects. It must give exactly
// what router_logits + router_select give with the same workspace (same split order, same selection
// arithmetic), twice in a row (the ticket re-arms), and the CPU's experts.
TEST(CudaRouterFast, FusedRouteEqualsTheTwoKernelPathAndTheCpu) {
  CEDAR_REQUIRE_GPU();
  for (const int64_t n : {1, 4, 8}) {
    const RouterCase c = make_router_case(n, 5120, 384, 6, 40 + static_cast<uint32_t>(n));
    RouterDevice fused = upload_router(c, true), two = upload_router(c, true);
    ASSERT_TRUE(moe_route(fused.args, nullptr).ok());
    ASSERT_TRUE(router_logits(two.args, nullptr).ok());
    ASSERT_TRUE(router_select(two.args, nullptr).ok());
    const Tolerance exact{.max_nmse = 0, .min_cosine = 0, .rel = 0, .abs = 0};
    const std::string tag = " n=" + std::to_string(n);
    EXPECT_TRUE(parity("fused route logits vs 2 kernels" + tag, download(fused.logits), download(two.logits), exact));
    EXPECT_TRUE(parity("fused route scores vs 2 kernels" + tag, download(fused.scores), download(two.scores), exact));
    EXPECT_TRUE(
        parity("fused route weights vs 2 kernels" + tag, download(fused.weights), download(two.weights), exact));
    const auto experts = download(fused.experts);
    EXPECT_EQ(experts, download(two.experts)) << "fused selection differs from router_select" << tag;
    // Replay: the ticket counter must have been re-armed.
    ASSERT_TRUE(cudaMemset(fused.experts.get(), 0xFF, fused.experts.bytes()) == cudaSuccess);
    ASSERT_TRUE(moe_route(fused.args, nullptr).ok());
    EXPECT_EQ(download(fused.experts), experts) << "second fused launch (counter not re-armed?)" << tag;
    // With the diagnostic stamps: the same bits, and every block's stamps in order (entry <= after the wait
    // <= partials stored <= ticket <= the last block's end; its tail clocks ascending).
    const int64_t blocks = router_fused_blocks(c.E, c.d);
    auto stamps = alloc<unsigned long long>(blocks * kRouterStampsPerBlock + kRouterTailStamps);
    {
      const std::string v = tag + " with stamps";
      RouterArgs a = fused.args;
      a.stamps = stamps.get();
      ASSERT_TRUE(stamps.zero().ok());
      ASSERT_TRUE(moe_route(a, nullptr).ok());
      EXPECT_EQ(download(fused.experts), experts) << v;
      EXPECT_TRUE(parity("fused route weights" + v, download(fused.weights), download(two.weights), exact));
      EXPECT_TRUE(parity("fused route logits" + v, download(fused.logits), download(two.logits), exact));
      const auto st = download(stamps);
      const unsigned long long* tail = st.data() + blocks * kRouterStampsPerBlock;
      for (int64_t b = 0; b < blocks; ++b) {
        const unsigned long long* s = st.data() + b * kRouterStampsPerBlock;
        EXPECT_TRUE(s[0] > 0 && s[0] <= s[1] && s[1] <= s[2] && s[2] <= s[3] && s[3] <= tail[4])
            << v << ": block " << b << " stamps " << s[0] << " " << s[1] << " " << s[2] << " " << s[3] << ", end "
            << tail[4];
      }
      EXPECT_TRUE(tail[0] <= tail[1] && tail[1] <= tail[2] && tail[2] <= tail[3] && tail[3] > 0)
          << v << ": tail clocks " << tail[0] << " " << tail[1] << " " << tail[2] << " " << tail[3];
    }
    // CPU: random scores have no near-ties at the logits' rounding level, so the experts are identical.
    // Weights (EndToEndMatchesRouteTokens' derivation): Δv <= (d + 23 + ksplit)·u·Σ|x·w| per logit,
    // |Δs| <= s·Δv/2 + 2^-21·s, and a weight moves by <= 2·max_k(Δs_k/s_k) + 8 ulps relative.
    std::vector<ExpertWeights> ew;
    const MoeWeights w = router_weights(c, ew);
    auto r = route_tokens(c.x, c.n, w, c.p, {}, c.image, nullptr);
    ASSERT_TRUE(r.ok()) << r.error().message;
    for (int64_t i = 0; i < n * c.K; ++i) EXPECT_EQ(experts[i], r->experts[i]) << "slot " << i << tag;
    const auto ad = router_abs_dot(c);
    std::vector<float> wbound(n * c.K);
    for (int64_t t = 0; t < n; ++t) {
      double rel = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const int64_t e = r->experts[t * c.K + k];
        rel = std::max(rel, 0.5 * (c.d + 23 + 64) * kU * ad[t * c.E + e] + 0x1p-21);
      }
      for (int64_t k = 0; k < c.K; ++k)
        wbound[t * c.K + k] = static_cast<float>(r->weights[t * c.K + k] * (2 * rel + 8 * kU));
    }
    const Tolerance wtol{.max_nmse = 1e-9, .min_cosine = 0.9999999, .bound_scale = 1.0};
    EXPECT_TRUE(parity("fused route weights vs cpu" + tag, download(fused.weights), r->weights, wtol, wbound));
  }
}

// Selection corner cases through the whole path, fused and not: gate rows that make logits NaN
// (experts 3 and 10: a NaN weight), +inf (7: +inf weight on a positive channel), −inf (11) and an
// exact tie lifted by a large bias (20 and 30: identical rows and biases). The CPU's order: NaN first
// in id order, then +inf, then the tie in id order, then the largest regular value.
TEST(CudaRouterFast, NanInfAndTiesFollowTheCpuOrder) {
  CEDAR_REQUIRE_GPU();
  RouterCase c = make_router_case(5, 512, 64, 6, 77);
  c.image.assign(c.n, 0);
  for (int64_t t = 0; t < c.n; ++t) c.x[t * c.d] = 1.0f;  // channel 0 positive in every token
  const float nan = std::nanf(""), inf = INFINITY;
  c.gate[3 * c.d + 5] = nan;
  c.gate[10 * c.d + 100] = nan;
  c.gate[7 * c.d] = inf;
  c.gate[11 * c.d] = -inf;
  std::copy_n(c.gate.begin() + 20 * c.d, c.d, c.gate.begin() + 30 * c.d);
  c.bias[20] = c.bias[30] = 50.0f;
  std::vector<ExpertWeights> ew;
  const MoeWeights w = router_weights(c, ew);
  auto r = route_tokens(c.x, c.n, w, c.p, {}, c.image, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  for (int64_t t = 0; t < c.n; ++t) {
    const std::vector<int64_t> head(r->experts.begin() + t * c.K, r->experts.begin() + t * c.K + 5);
    ASSERT_EQ(head, (std::vector<int64_t>{3, 10, 7, 20, 30})) << "the test's construction (CPU), token " << t;
  }
  for (const bool ws : {false, true}) {
    RouterDevice dv = upload_router(c, ws);
    ASSERT_TRUE(moe_route(dv.args, nullptr).ok());
    const auto got = download(dv.experts);
    for (int64_t i = 0; i < c.n * c.K; ++i)
      EXPECT_EQ(got[i], r->experts[i]) << (ws ? "fused" : "two-kernel") << " path, token " << i / c.K << " slot "
                                       << i % c.K;
  }
}

// Hash routing (tid2eid) through the fused launch: the ids are copied, the weights come from the scores.
TEST(CudaRouterFast, FusedHashRouting) {
  CEDAR_REQUIRE_GPU();
  RouterCase c = make_router_case(6, 1024, 48, 4, 91);
  c.image.assign(c.n, 0);
  const int64_t vocab = 30;
  std::vector<int64_t> tid2eid(vocab * c.K);
  std::mt19937 rng(5);
  for (auto& e : tid2eid) e = static_cast<int64_t>(rng() % c.E);
  const std::vector<int64_t> ids = {3, 0, 29, 3, 17, 8};
  std::vector<ExpertWeights> ew;
  MoeWeights w = router_weights(c, ew);
  w.tid2eid = tid2eid;
  auto r = route_tokens(c.x, c.n, w, c.p, ids, {}, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  RouterDevice dv = upload_router(c, true);
  std::vector<int32_t> t32(tid2eid.begin(), tid2eid.end()), ids32(ids.begin(), ids.end());
  auto dt = upload(t32);
  auto dids = upload(ids32);
  dv.args.tid2eid = dt.get();
  dv.args.token_ids = dids.get();
  dv.args.tid2eid_vocab = vocab;
  dv.args.is_image = nullptr;
  ASSERT_TRUE(moe_route(dv.args, nullptr).ok());
  const auto got = download(dv.experts);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], r->experts[i]) << "slot " << i;
  const Tolerance wtol{.max_nmse = 1e-9, .min_cosine = 0.9999999, .rel = 1e-5};
  EXPECT_TRUE(parity("fused router weights (tid2eid)", download(dv.weights), r->weights, wtol));
}

// Prefill logits through cuBLASLt (n > kRouterBlasMinTokens with `blas`): fp32 accumulation of exact
// products in cuBLAS's order, so CPU (d−1)·u and GPU <= d·u: bound 2d·u·Σ|x·w|. The selection on
// them is the CPU's (no near-ties in random data).
TEST(CudaRouterFast, PrefillLogitsThroughCublas) {
  CEDAR_REQUIRE_GPU();
  auto blas = BlasContext::create();
  if (!blas.ok()) {
    std::printf("[  SKIP    ] %s\n", blas.error().message.c_str());
    GTEST_SKIP() << blas.error().message;
  }
  const RouterCase c = make_router_case(300, 5120, 384, 6, 123);
  RouterDevice dv = upload_router(c, true);
  auto xb = alloc<uint16_t>(c.n * c.d);
  dv.args.blas = blas->get();
  dv.args.x_bf16 = xb.get();
  dv.args.x_bf16_elems = c.n * c.d;
  ASSERT_TRUE(moe_route(dv.args, nullptr).ok());
  const Tolerance tol{.max_nmse = 1e-9, .min_cosine = 0.9999999, .bound_scale = 2.0 * c.d * kU};
  EXPECT_TRUE(parity("router logits cuBLASLt 300x384 d=5120", download(dv.logits), router_cpu_logits(c), tol,
                     router_abs_dot(c)));
  std::vector<ExpertWeights> ew;
  const MoeWeights w = router_weights(c, ew);
  auto r = route_tokens(c.x, c.n, w, c.p, {}, c.image, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const auto got = download(dv.experts);
  int64_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += got[i] != r->experts[i];
  std::printf("PARITY %-40s slots=%zu differing=%lld\n", "router selection (cuBLASLt logits)", got.size(),
              static_cast<long long>(differ));
  EXPECT_EQ(differ, 0) << "random scores have no near-ties at the logits' rounding level";
}

}  // namespace
}  // namespace cedar::cuda
