// The cluster variant of the fused mHC (mhc_fused_cluster) against the CPU oracle (model/mhc.h) with
// the tolerances of the mhc_fused test, and against mhc_fused itself (expand / collapse bit-equal).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/kernels.h"
#include "cuda_test_util.h"
#include "ffn_test_util.h"
#include "model/mhc.h"

namespace cedar::cuda {
namespace {

using namespace ffn_testing;
using testing::parity;
using testing::Tolerance;

void check_mhc_cluster(int64_t n, int64_t d, bool with_expand, bool in_place, uint32_t seed) {
  const int64_t hc = 4, width = hc * d, n_mix = (2 + hc) * hc;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.1f, 1.0f);
  auto X = random_acts(n * width, seed + 1);
  auto y = random_acts(n * d, seed + 2);
  std::vector<float> fn(n_mix * width), base(n_mix), scale(3), post(n * hc), comb(n * hc * hc), cw(n * hc);
  for (auto& v : fn) v = nd(rng) * 0.02f;
  for (auto& v : base) v = nd(rng);
  for (auto& v : scale) v = ud(rng);
  for (auto& v : post) v = 2.0f * ud(rng);
  for (auto& v : comb) v = ud(rng) / 2.0f;
  for (auto& v : cw) v = ud(rng);
  const HcWeights hw{fn, base, scale};
  const HcParams hp{.hc = hc, .dim = d, .sinkhorn_iters = 20, .hc_eps = 1e-6, .norm_eps = 1e-20};
  std::vector<float> X_new = X, collapsed(n * d), mix_want;
  for (int64_t t = 0; t < n; ++t) {
    std::span<float> xt(X_new.data() + t * width, width);
    if (with_expand) {
      HcMix m;
      m.post.assign(post.begin() + t * hc, post.begin() + (t + 1) * hc);
      m.comb.assign(comb.begin() + t * hc * hc, comb.begin() + (t + 1) * hc * hc);
      hc_expand(std::span<const float>(y.data() + t * d, d), xt, m, hc, d, xt);
    }
    hc_collapse(xt, std::span<const float>(cw.data() + t * hc, hc), hc, d,
                std::span<float>(collapsed.data() + t * d, d));
    const HcMix mix = hc_mix(xt, hw, hp);
    mix_want.insert(mix_want.end(), mix.pre.begin(), mix.pre.end());
    mix_want.insert(mix_want.end(), mix.post.begin(), mix.post.end());
    mix_want.insert(mix_want.end(), mix.comb.begin(), mix.comb.end());
  }
  auto dX = upload(X), dy = upload(y), dpost = upload(post), dcomb = upload(comb), dcw = upload(cw);
  auto dfn = upload(fn), dbase = upload(base), dscale = upload(scale);
  auto dXo = alloc<float>(X.size());
  auto dcol = alloc<float>(collapsed.size());
  auto dmix = alloc<float>(n * n_mix);
  MhcFusedArgs a{.n = n,
                 .hc = hc,
                 .d = d,
                 .X = dX.get(),
                 .y = with_expand ? dy.get() : nullptr,
                 .post = dpost.get(),
                 .comb = dcomb.get(),
                 .X_out = in_place ? dX.get() : dXo.get(),
                 .collapse_w = dcw.get(),
                 .collapsed = dcol.get(),
                 .fn = dfn.get(),
                 .base = dbase.get(),
                 .scale = dscale.get(),
                 .mix_out = dmix.get()};
  const Status s = mhc_fused_cluster(a, nullptr);
  ASSERT_TRUE(s.ok()) << s.error().message;
  const std::string tag =
      std::to_string(n) + "x4x" + std::to_string(d) + (with_expand ? "" : " no-expand") + (in_place ? " in-place" : "");
  const Tolerance exact{.max_nmse = 0, .min_cosine = 0.0, .rel = 0, .abs = 0};
  if (with_expand) {
    EXPECT_TRUE(parity("mhc cluster expand " + tag, download(in_place ? dX : dXo), X_new, exact));
  }
  EXPECT_TRUE(parity("mhc cluster collapse " + tag, download(dcol), collapsed, exact));
  // As mhc_fused: the 24 dot products and the sum of squares are summed in another order (~1e-6
  // relative); the Sinkhorn divides by multiplying with a correctly rounded reciprocal (<= 1 ulp per
  // normalization, contracted by the next one); sigmoid / softmax / Sinkhorn are smooth and contracting.
  const Tolerance coeff{.max_nmse = 1e-9, .min_cosine = 0.9999999, .rel = 2e-5, .abs = 2e-5};
  EXPECT_TRUE(parity("mhc cluster coefficients " + tag, download(dmix), mix_want, coeff));
}

TEST(CudaMhcCluster, MatchesCpuSinglePass) {
  CEDAR_REQUIRE_GPU();
  const Status sup = mhc_cluster_supported(5120);
  ASSERT_TRUE(sup.ok()) << "the cluster mHC cannot run on this device: " << sup.error().message;
  check_mhc_cluster(1, 5120, true, false, 51);   // V4.1 decode
  check_mhc_cluster(3, 256, true, false, 52);    // fewer chunks than blocks
  check_mhc_cluster(9, 128, true, true, 53);     // two token tiles (two clusters), X updated in place
  check_mhc_cluster(2, 512, false, false, 54);   // first site: no expand
  check_mhc_cluster(20, 5120, true, false, 55);  // batched decode: three clusters
}

// Two dependent steps (the second reads the first's X_out) with programmatic dependent launch: the
// same bits as without it (the wait orders the second step after the first).
TEST(CudaMhcCluster, ProgrammaticLaunchKeepsTheDependency) {
  CEDAR_REQUIRE_GPU();
  const int64_t n = 2, d = 5120, hc = 4, width = hc * d, n_mix = 24;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> fn(n_mix * width), base(n_mix), scale(3, 0.5f), post(n * hc, 1.0f), comb(n * hc * hc, 0.25f),
      cw(n * hc, 0.5f);
  for (auto& v : fn) v = nd(rng) * 0.02f;
  for (auto& v : base) v = nd(rng);
  const auto X = random_acts(n * width, 8), y = random_acts(n * d, 9);
  std::vector<std::vector<float>> results;
  for (const bool pdl : {false, true}) {
    auto dX = upload(X), dy = upload(y), dpost = upload(post), dcomb = upload(comb), dcw = upload(cw);
    auto dfn = upload(fn), dbase = upload(base), dscale = upload(scale);
    auto dX1 = alloc<float>(X.size()), dX2 = alloc<float>(X.size()), dcol = alloc<float>(n * d),
         dmix = alloc<float>(n * n_mix);
    MhcFusedArgs a{.n = n,
                   .hc = hc,
                   .d = d,
                   .X = dX.get(),
                   .y = dy.get(),
                   .post = dpost.get(),
                   .comb = dcomb.get(),
                   .X_out = dX1.get(),
                   .collapse_w = dcw.get(),
                   .collapsed = dcol.get(),
                   .fn = dfn.get(),
                   .base = dbase.get(),
                   .scale = dscale.get(),
                   .mix_out = dmix.get()};
    ASSERT_TRUE(mhc_fused_cluster(a, nullptr, pdl).ok());
    a.X = dX1.get();
    a.X_out = dX2.get();
    const Status s = mhc_fused_cluster(a, nullptr, pdl);
    ASSERT_TRUE(s.ok()) << s.error().message;
    results.push_back(download(dX2));
    const auto mix = download(dmix);
    results.back().insert(results.back().end(), mix.begin(), mix.end());
  }
  const Tolerance exact{.max_nmse = 0, .min_cosine = 0.0, .rel = 0, .abs = 0};
  EXPECT_TRUE(parity("mhc cluster 2 steps, PDL vs plain launch", results[1], results[0], exact));
}

TEST(CudaMhcCluster, RejectsUnsupportedShapes) {
  CEDAR_REQUIRE_GPU();
  MhcFusedArgs a{.n = 1, .hc = 4, .d = 100};
  const Status s = mhc_fused_cluster(a, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("d=100"), std::string::npos) << s.error().message;
  EXPECT_FALSE(mhc_cluster_supported(1 << 20).ok()) << "a d whose fn slice exceeds shared memory";
}

}  // namespace
}  // namespace cedar::cuda
