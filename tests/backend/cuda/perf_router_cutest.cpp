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

namespace cedar::cuda {
namespace {

using namespace ffn_testing;
using testing::parity;
using testing::Tolerance;

constexpr double kU = 0x1p-24;  // fp32 unit roundoff

struct Case {
  int64_t n = 0, d = 0, E = 0, K = 0;
  std::vector<float> x, gate, bias, bias_vl;
  std::vector<uint8_t> image;
  MoeParams p;
};

Case make_case(int64_t n, int64_t d, int64_t E, int64_t K, uint32_t seed) {
  Case c;
  c.n = n;
  c.d = d;
  c.E = E;
  c.K = K;
  c.x = random_acts(n * d, seed, 1.0f, -3, 2);
  c.gate = random_bf16(E * d, seed + 1, 0.03f);
  std::mt19937 rng(seed + 2);
  std::normal_distribution<float> nd(0.0f, 0.2f);
  c.bias.resize(E);
  c.bias_vl.resize(E);
  for (auto& b : c.bias) b = nd(rng);
  for (auto& b : c.bias_vl) b = nd(rng);
  c.image.assign(n, 0);
  if (n > 1) c.image[1] = 1;
  c.p.topk = K;
  c.p.route_scale = 1.5;
  return c;
}

MoeWeights weights_of(const Case& c, std::vector<ExpertWeights>& experts) {
  experts.assign(c.E, ExpertWeights{});
  MoeWeights w;
  w.gate = c.gate;
  w.bias = c.bias;
  w.bias_vl = c.bias_vl;
  w.experts = experts;
  return w;
}

// Device state of one case; `with_ws` adds the split-K workspace (counters zeroed once).
struct Dev {
  DeviceBuffer<float> x, bias, bias_vl, logits, scores, weights, part;
  DeviceBuffer<uint16_t> gate;
  DeviceBuffer<uint8_t> image;
  DeviceBuffer<int32_t> experts;
  DeviceBuffer<unsigned> counters;
  RouterArgs args;
};

Dev upload_case(const Case& c, bool with_ws) {
  Dev dv;
  dv.x = upload(c.x);
  dv.gate = upload(bf16_bits(c.gate));
  dv.bias = upload(c.bias);
  dv.bias_vl = upload(c.bias_vl);
  dv.image = upload(c.image);
  dv.logits = alloc<float>(c.n * c.E);
  dv.scores = alloc<float>(c.n * c.E);
  dv.experts = alloc<int32_t>(c.n * c.K);
  dv.weights = alloc<float>(c.n * c.K);
  RouterArgs& a = dv.args;
  a.n = c.n;
  a.d = c.d;
  a.n_experts = c.E;
  a.topk = c.K;
  a.x = dv.x.get();
  a.gate = dv.gate.get();
  a.bias = dv.bias.get();
  a.bias_vl = dv.bias_vl.get();
  a.is_image = dv.image.get();
  a.route_scale = static_cast<float>(c.p.route_scale);
  a.logits = dv.logits.get();
  a.scores = dv.scores.get();
  a.experts = dv.experts.get();
  a.weights = dv.weights.get();
  if (with_ws) {
    const SplitKSize need = router_workspace_size(c.E, c.d);
    dv.part = alloc<float>(need.partial_floats);
    dv.counters = alloc<unsigned>(need.counters);
    EXPECT_TRUE(dv.counters.zero().ok());
    a.splitk = SplitKWorkspace{dv.part.get(), dv.counters.get(), need.partial_floats, need.counters};
  }
  return dv;
}

// Σ|x·w| per logit: the scale of every summation-order bound below.
std::vector<float> abs_dot(const Case& c) {
  std::vector<float> ax(c.x.size()), ag(c.gate.size()), out(c.n * c.E);
  std::transform(c.x.begin(), c.x.end(), ax.begin(), [](float v) { return std::fabs(v); });
  std::transform(c.gate.begin(), c.gate.end(), ag.begin(), [](float v) { return std::fabs(v); });
  const cpu::LinearWeight w{
      .format = WeightFormat::F32, .out = c.E, .in = c.d, .data = reinterpret_cast<const uint8_t*>(ag.data())};
  EXPECT_TRUE(cpu::linear(w, ax, c.n, out, {.bf16_output = false}, nullptr).ok());
  return out;
}

std::vector<float> cpu_logits(const Case& c) {
  std::vector<float> out(c.n * c.E);
  const cpu::LinearWeight w{
      .format = WeightFormat::F32, .out = c.E, .in = c.d, .data = reinterpret_cast<const uint8_t*>(c.gate.data())};
  EXPECT_TRUE(cpu::linear(w, c.x, c.n, out, {.bf16_output = false}, nullptr).ok());
  return out;
}

// With the workspace the gate is split over K (d = 5120: 5 splits × 24 row tiles); the result is
// within the fp32 summation bound of cpu::linear (CPU (d−1)·u; GPU ≤ (23 + ksplit)·u: 8-MMA chains
// at <= 2u per step, 7 warp and ksplit split additions), and a token's logits are the same bits
// whatever else is in the call (n = 70: two passes of 64 + 6; n = 9: two MMA tiles; n = 1).
TEST(CudaRouterFast, SplitLogitsWithinBoundAndIndependentOfTheBatch) {
  CEDAR_REQUIRE_GPU();
  const Case c = make_case(70, 5120, 384, 6, 11);
  Dev dv = upload_case(c, true);
  ASSERT_TRUE(router_logits(dv.args, nullptr).ok());
  const auto all = download(dv.logits);
  const Tolerance tol{.max_nmse = 1e-9, .min_cosine = 0.9999999, .bound_scale = (c.d + 23 + 64) * kU};
  EXPECT_TRUE(parity("router logits split-K 70x384 d=5120", all, cpu_logits(c), tol, abs_dot(c)));

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
  Dev plain = upload_case(c, false);
  ASSERT_TRUE(router_logits(plain.args, nullptr).ok());
  const Tolerance tol_plain{.max_nmse = 1e-9, .min_cosine = 0.9999999, .bound_scale = (c.d + c.d / 64.0 + 8) * kU};
  EXPECT_TRUE(
      parity("router logits unsplit 70x384 d=5120", download(plain.logits), cpu_logits(c), tol_plain, abs_dot(c)));
}

// moe_route with a workspace and n <= 8 is one launch whose last block selects. It must give exactly
// what router_logits + router_select give with the same workspace (same split order, same selection
// arithmetic), twice in a row (the ticket re-arms), and the CPU's experts.
TEST(CudaRouterFast, FusedRouteEqualsTheTwoKernelPathAndTheCpu) {
  CEDAR_REQUIRE_GPU();
  for (const int64_t n : {1, 4, 8}) {
    const Case c = make_case(n, 5120, 384, 6, 40 + static_cast<uint32_t>(n));
    Dev fused = upload_case(c, true), two = upload_case(c, true);
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
    // CPU: random scores have no near-ties at the logits' rounding level, so the experts are identical.
    // Weights (EndToEndMatchesRouteTokens' derivation): Δv <= (d + 23 + ksplit)·u·Σ|x·w| per logit,
    // |Δs| <= s·Δv/2 + 2^-21·s, and a weight moves by <= 2·max_k(Δs_k/s_k) + 8 ulps relative.
    std::vector<ExpertWeights> ew;
    const MoeWeights w = weights_of(c, ew);
    auto r = route_tokens(c.x, c.n, w, c.p, {}, c.image, nullptr);
    ASSERT_TRUE(r.ok()) << r.error().message;
    for (int64_t i = 0; i < n * c.K; ++i) EXPECT_EQ(experts[i], r->experts[i]) << "slot " << i << tag;
    const auto ad = abs_dot(c);
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
  Case c = make_case(5, 512, 64, 6, 77);
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
  const MoeWeights w = weights_of(c, ew);
  auto r = route_tokens(c.x, c.n, w, c.p, {}, c.image, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  for (int64_t t = 0; t < c.n; ++t) {
    const std::vector<int64_t> head(r->experts.begin() + t * c.K, r->experts.begin() + t * c.K + 5);
    ASSERT_EQ(head, (std::vector<int64_t>{3, 10, 7, 20, 30})) << "the test's construction (CPU), token " << t;
  }
  for (const bool ws : {false, true}) {
    Dev dv = upload_case(c, ws);
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
  Case c = make_case(6, 1024, 48, 4, 91);
  c.image.assign(c.n, 0);
  const int64_t vocab = 30;
  std::vector<int64_t> tid2eid(vocab * c.K);
  std::mt19937 rng(5);
  for (auto& e : tid2eid) e = static_cast<int64_t>(rng() % c.E);
  const std::vector<int64_t> ids = {3, 0, 29, 3, 17, 8};
  std::vector<ExpertWeights> ew;
  MoeWeights w = weights_of(c, ew);
  w.tid2eid = tid2eid;
  auto r = route_tokens(c.x, c.n, w, c.p, ids, {}, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  Dev dv = upload_case(c, true);
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
  const Case c = make_case(300, 5120, 384, 6, 123);
  Dev dv = upload_case(c, true);
  auto xb = alloc<uint16_t>(c.n * c.d);
  dv.args.blas = blas->get();
  dv.args.x_bf16 = xb.get();
  dv.args.x_bf16_elems = c.n * c.d;
  ASSERT_TRUE(moe_route(dv.args, nullptr).ok());
  const Tolerance tol{.max_nmse = 1e-9, .min_cosine = 0.9999999, .bound_scale = 2.0 * c.d * kU};
  EXPECT_TRUE(parity("router logits cuBLASLt 300x384 d=5120", download(dv.logits), cpu_logits(c), tol, abs_dot(c)));
  std::vector<ExpertWeights> ew;
  const MoeWeights w = weights_of(c, ew);
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
