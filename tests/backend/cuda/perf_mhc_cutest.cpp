// The fused mHC's paths (kernels.h mhc_fused): decode tiles in one launch with a sized workspace, the
// streaming prefill path, the fn == null mode (expand / collapse only, and with the RMSNorm in the same
// launch), mix rows read and written with a stride, programmatic launch, graph replay — each against
// the CPU oracle (model/mhc.h) with mhc_fused's tolerances, and the paths against each other where
// their arithmetic is the same.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/stream.h"
#include "core/numeric.h"
#include "cuda_test_util.h"
#include "ffn_test_util.h"
#include "model/mhc.h"

namespace cedar::cuda {
namespace {

using namespace ffn_testing;
using testing::parity;
using testing::Tolerance;

constexpr int64_t kHc = 4, kMix = 24;
const Tolerance kExact{.max_nmse = 0, .min_cosine = 0.0, .rel = 0, .abs = 0};
// As mhc_fused: the 24 dot products over 4·d channels and the sum of squares are summed in another
// (blocked) order, ~1e-6 relative; the Sinkhorn multiplies by correctly rounded reciprocals (<= 1 ulp
// per normalization, contracted by the next); sigmoid / softmax / Sinkhorn are smooth and contracting.
const Tolerance kCoeff{.max_nmse = 1e-9, .min_cosine = 0.9999999, .rel = 2e-5, .abs = 2e-5};

// One site's inputs. The previous site's coefficients come as mix rows [n, 24] (pre, post, comb), the
// layout the kernel writes, so the strided mode can read them in place.
struct Site {
  int64_t n = 0, d = 0;
  std::vector<float> X, y, fn, base, scale, prev_mix;
};

Site make_site(int64_t n, int64_t d, uint32_t seed) {
  Site s;
  s.n = n;
  s.d = d;
  const int64_t width = kHc * d;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.1f, 1.0f);
  s.X = random_acts(n * width, seed + 1);
  s.y = random_acts(n * d, seed + 2);
  s.fn.resize(kMix * width);
  s.base.resize(kMix);
  s.scale.resize(3);
  s.prev_mix.resize(n * kMix);
  for (auto& v : s.fn) v = nd(rng) * 0.02f;
  for (auto& v : s.base) v = nd(rng);
  for (auto& v : s.scale) v = ud(rng);
  for (int64_t t = 0; t < n; ++t) {
    float* m = s.prev_mix.data() + t * kMix;
    for (int k = 0; k < 4; ++k) m[k] = ud(rng);          // pre (the collapse weights)
    for (int k = 4; k < 8; ++k) m[k] = 2.0f * ud(rng);   // post
    for (int k = 8; k < 24; ++k) m[k] = ud(rng) / 2.0f;  // comb
  }
  return s;
}

struct Want {
  std::vector<float> X_new, collapsed, mix;
};
Want cpu_site(const Site& s, bool expand, bool collapse, bool coefficients) {
  const int64_t d = s.d, width = kHc * d;
  const HcWeights hw{s.fn, s.base, s.scale};
  const HcParams hp{.hc = kHc, .dim = d, .sinkhorn_iters = 20, .hc_eps = 1e-6, .norm_eps = 1e-20};
  Want w;
  w.X_new = s.X;
  w.collapsed.resize(s.n * d);
  for (int64_t t = 0; t < s.n; ++t) {
    std::span<float> xt(w.X_new.data() + t * width, width);
    const float* pm = s.prev_mix.data() + t * kMix;
    if (expand) {
      HcMix m;
      m.post.assign(pm + 4, pm + 8);
      m.comb.assign(pm + 8, pm + 24);
      hc_expand(std::span<const float>(s.y.data() + t * d, d), xt, m, kHc, d, xt);
    }
    if (collapse)
      hc_collapse(xt, std::span<const float>(pm, 4), kHc, d, std::span<float>(w.collapsed.data() + t * d, d));
    if (coefficients) {
      const HcMix mix = hc_mix(xt, hw, hp);
      w.mix.insert(w.mix.end(), mix.pre.begin(), mix.pre.end());
      w.mix.insert(w.mix.end(), mix.post.begin(), mix.post.end());
      w.mix.insert(w.mix.end(), mix.comb.begin(), mix.comb.end());
    }
  }
  return w;
}

enum class Ws { Legacy, Sized };

struct GpuRun {
  std::vector<float> X_out, collapsed, mix;
};

// Runs one site on the GPU: mix rows in place (strided, mix_stride = 24) or copied to packed arrays;
// mix_out written with stride `mix_stride` (the gaps must stay untouched).
// Which streaming kernel and finish kernel run (MhcFusedArgs::legacy_stream / stream_c32 /
// stream_serial_finish); the default is the s8 path (64-channel chunks, one lane per token's finish).
struct StreamKind {
  bool legacy = false, c32 = false, serial_finish = false;
};
GpuRun gpu_site(const Site& s, bool expand, bool collapse, bool coefficients, bool in_place, Ws ws_kind, bool strided,
                int64_t mix_stride = 0, bool pdl = false, bool legacy_stream = false, StreamKind kind = {}) {
  const int64_t n = s.n, d = s.d, ms = mix_stride ? mix_stride : kMix;
  std::vector<float> post(n * 4), comb(n * 16), cw(n * 4);
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(s.prev_mix.begin() + t * kMix, 4, cw.begin() + t * 4);
    std::copy_n(s.prev_mix.begin() + t * kMix + 4, 4, post.begin() + t * 4);
    std::copy_n(s.prev_mix.begin() + t * kMix + 8, 16, comb.begin() + t * 16);
  }
  auto dX = upload(s.X), dy = upload(s.y), dfn = upload(s.fn), dbase = upload(s.base), dscale = upload(s.scale);
  auto dprev = upload(s.prev_mix), dpost = upload(post), dcomb = upload(comb), dcw = upload(cw);
  auto dXo = alloc<float>(s.X.size());
  auto dcol = alloc<float>(n * d);
  auto dmix = upload(std::vector<float>(n * ms, -7.0f));
  const int64_t floats = mhc_workspace_floats(n, d), counters = mhc_workspace_counters(n);
  auto dpart = alloc<float>(floats);
  auto dcnt = alloc<unsigned>(counters);
  EXPECT_TRUE(dcnt.zero().ok());
  MhcFusedArgs a;
  a.n = n;
  a.hc = kHc;
  a.d = d;
  a.X = dX.get();
  a.y = expand ? dy.get() : nullptr;
  a.post = strided ? dprev.get() + 4 : dpost.get();
  a.comb = strided ? dprev.get() + 8 : dcomb.get();
  a.X_out = in_place ? dX.get() : dXo.get();
  a.collapse_w = collapse ? (strided ? dprev.get() : dcw.get()) : nullptr;
  a.collapsed = dcol.get();
  a.fn = coefficients ? dfn.get() : nullptr;
  a.base = dbase.get();
  a.scale = dscale.get();
  a.mix_out = dmix.get();
  if (strided) a.post_stride = a.comb_stride = a.collapse_w_stride = kMix;
  a.mix_stride = mix_stride;
  a.programmatic_launch = pdl;
  a.legacy_stream = legacy_stream || kind.legacy;
  a.stream_c32 = kind.c32;
  a.stream_serial_finish = kind.serial_finish;
  MhcWorkspace ws{dpart.get(), dcnt.get()};
  if (ws_kind == Ws::Sized) {
    ws.partial_floats = floats;
    ws.counter_count = counters;
  }
  for (int rep = 0; rep < 2; ++rep) {  // the second launch checks that the kernels re-armed their counters
    if (in_place && rep == 1) {
      EXPECT_TRUE(dX.upload(s.X.data(), s.X.size()).ok());
    }
    const Status st = mhc_fused(a, ws, nullptr);
    EXPECT_TRUE(st.ok()) << st.error().message;
  }
  GpuRun r;
  r.X_out = download(in_place ? dX : dXo);
  r.collapsed = download(dcol);
  const auto mix = download(dmix);
  for (int64_t t = 0; t < n; ++t) {
    r.mix.insert(r.mix.end(), mix.begin() + t * ms, mix.begin() + t * ms + kMix);
    for (int64_t q = kMix; q < ms; ++q)
      EXPECT_EQ(mix[t * ms + q], -7.0f) << "mix_out gap of token " << t << " written (stride " << ms << ")";
  }
  return r;
}

void check_site(const Site& s, bool expand, bool collapse, bool coefficients, bool in_place, Ws ws, bool strided,
                const std::string& tag, int64_t mix_stride = 0) {
  const Want w = cpu_site(s, expand, collapse, coefficients);
  const GpuRun g = gpu_site(s, expand, collapse, coefficients, in_place, ws, strided, mix_stride);
  if (expand) {
    EXPECT_TRUE(parity("mhc expand " + tag, g.X_out, w.X_new, kExact));
  }
  if (collapse) {
    EXPECT_TRUE(parity("mhc collapse " + tag, g.collapsed, w.collapsed, kExact));
  }
  if (coefficients) {
    EXPECT_TRUE(parity("mhc coefficients " + tag, g.mix, w.mix, kCoeff));
  }
}

// Decode batches with the sized workspace: every tile of 8 tokens in one launch.
TEST(CudaMhcPaths, DecodeTilesInOneLaunch) {
  CEDAR_REQUIRE_GPU();
  check_site(make_site(1, 5120, 61), true, true, true, false, Ws::Sized, false, "decode n=1 d=5120");
  check_site(make_site(9, 5120, 62), true, true, true, true, Ws::Sized, true, "decode n=9 in-place strided");
  check_site(make_site(64, 5120, 63), true, true, true, false, Ws::Sized, true, "decode n=64 strided", 32);
  check_site(make_site(20, 96, 64), true, true, true, false, Ws::Sized, false, "decode n=20 d=96 (half block)");
  check_site(make_site(3, 512, 65), false, true, true, false, Ws::Sized, false, "decode n=3 no-expand");
}

// The legacy workspace runs the same kernel one tile per launch: the same bits as all tiles at once.
TEST(CudaMhcPaths, LegacyWorkspaceGivesTheSameBits) {
  CEDAR_REQUIRE_GPU();
  const Site s = make_site(20, 5120, 71);
  const GpuRun legacy = gpu_site(s, true, true, true, false, Ws::Legacy, false);
  const GpuRun sized = gpu_site(s, true, true, true, false, Ws::Sized, false);
  EXPECT_TRUE(parity("mhc n=20 legacy vs one launch: X", legacy.X_out, sized.X_out, kExact));
  EXPECT_TRUE(parity("mhc n=20 legacy vs one launch: mix", legacy.mix, sized.mix, kExact));
}

// Prefill sizes on the streaming path (n >= kMhcStreamMinTokens with the sized workspace): partial tiles,
// in place, without expand, strided mix rows, small d (many splits of one chunk).
TEST(CudaMhcPaths, StreamingPrefill) {
  CEDAR_REQUIRE_GPU();
  check_site(make_site(kMhcStreamMinTokens, 5120, 81), true, true, true, false, Ws::Sized, false,
             "stream n=128 d=5120");
  check_site(make_site(200, 5120, 82), true, true, true, true, Ws::Sized, true, "stream n=200 in-place strided");
  check_site(make_site(1000, 1024, 83), true, true, true, false, Ws::Sized, false, "stream n=1000 d=1024");
  check_site(make_site(300, 256, 84), false, true, true, false, Ws::Sized, false, "stream n=300 d=256 no-expand");
  check_site(make_site(130, 5120, 85), true, false, true, false, Ws::Sized, true, "stream n=130 no-collapse", 40);
}

// The streaming kernel's dot products on tensor cores (3xTF32 MMAs, mhc_stream_tc_kernel) against the
// session-4 FMA kernel (legacy_stream) and both against the CPU oracle, with the max errors printed
// (PARITY lines): X_out / collapsed bit for bit between the kernels (untouched arithmetic), the mix rows
// within kCoeff of the CPU. Cases: 8192 × 5120 (5 splits of 32 chunks: the longest per-thread chains;
// the CPU oracle on every 16th token), 2048 × 5120, a partial tile, and no expand with X not
// representable in bf16 (the A operand split into big + small; the model's X is bf16, so is make_site's).
size_t bits_differ(const std::vector<float>& x, const std::vector<float>& y);

TEST(CudaMhcPaths, StreamTensorCoresMatchTheFmaKernelAndTheCpu) {
  CEDAR_REQUIRE_GPU();
  struct Case {
    int64_t n, d;
    bool expand;
    bool fp32_x;     // X with full fp32 mantissas (no expand: the kernel's A operand is X itself)
    int64_t sample;  // the CPU checks tokens t % sample == 0
  };
  for (const Case c :
       {Case{8192, 5120, true, false, 16}, Case{2048, 5120, true, false, 1}, Case{333, 5120, true, false, 1},
        Case{1000, 1024, false, true, 1}, Case{4096, 5120, false, true, 8}}) {
    Site s = make_site(c.n, c.d, 131 + static_cast<uint32_t>(c.n));
    if (c.fp32_x) {
      std::mt19937 rng(7 + static_cast<uint32_t>(c.n));
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (auto& v : s.X) v = nd(rng);
    }
    const std::string tag = " n=" + std::to_string(c.n) + " d=" + std::to_string(c.d) + (c.expand ? "" : " no-expand") +
                            (c.fp32_x ? " fp32 X" : "");
    const GpuRun tc = gpu_site(s, c.expand, true, true, false, Ws::Sized, false, 0, false, false,
                               StreamKind{.c32 = true, .serial_finish = true});  // the s6 tensor-core path
    const GpuRun fma = gpu_site(s, c.expand, true, true, false, Ws::Sized, false, 0, false, true);
    if (c.expand) {
      EXPECT_TRUE(parity("mhc stream tensor vs fma kernel: X" + tag, tc.X_out, fma.X_out, kExact));
    }
    EXPECT_TRUE(parity("mhc stream tensor vs fma kernel: collapsed" + tag, tc.collapsed, fma.collapsed, kExact));
    // The CPU oracle on the sampled tokens (a site of those rows: every token is independent).
    Site sub;
    sub.d = s.d;
    sub.fn = s.fn;
    sub.base = s.base;
    sub.scale = s.scale;
    const int64_t width = kHc * s.d;
    std::vector<float> tc_mix, fma_mix;
    for (int64_t t = 0; t < s.n; t += c.sample) {
      ++sub.n;
      sub.X.insert(sub.X.end(), s.X.begin() + t * width, s.X.begin() + (t + 1) * width);
      sub.y.insert(sub.y.end(), s.y.begin() + t * s.d, s.y.begin() + (t + 1) * s.d);
      sub.prev_mix.insert(sub.prev_mix.end(), s.prev_mix.begin() + t * kMix, s.prev_mix.begin() + (t + 1) * kMix);
      tc_mix.insert(tc_mix.end(), tc.mix.begin() + t * kMix, tc.mix.begin() + (t + 1) * kMix);
      fma_mix.insert(fma_mix.end(), fma.mix.begin() + t * kMix, fma.mix.begin() + (t + 1) * kMix);
    }
    const Want w = cpu_site(sub, c.expand, true, true);
    EXPECT_TRUE(parity("mhc stream tensor kernel vs cpu: mix" + tag, tc_mix, w.mix, kCoeff));
    EXPECT_TRUE(parity("mhc stream fma kernel vs cpu: mix" + tag, fma_mix, w.mix, kCoeff));
    EXPECT_TRUE(parity("mhc stream tensor vs fma kernel: mix" + tag, tc.mix, fma.mix, kCoeff));
    std::printf("mhc stream tensor vs fma kernel%s: %zu of %zu mix values differ in their bits\n", tag.c_str(),
                bits_differ(tc.mix, fma.mix), tc.mix.size());
  }
}

// The s8 streaming kernel (mhc_stream_c64_kernel: 32-token tiles, 64-channel chunks, in-place X_new, fn
// fragments from L2) against today's s6 path (stream_c32 + stream_serial_finish): X_out / collapsed bit
// for bit (the same expand / collapse arithmetic), the mix rows within kCoeff of the CPU oracle (another
// blocked order of the sums). And the one-lane-per-token finish against the serial one behind the same
// c32 kernel: the same bits (the same sums in the same order; reciprocals4 == __frcp_rn in range).
// Cases as StreamTensorCoresMatchTheFmaKernelAndTheCpu plus ragged tails (n % 32 != 0 and n % 64 != 0)
// and many splits of one chunk (d = 1024 at n = 130: 16 splits); parity prints the first mismatch.
TEST(CudaMhcPaths, StreamC64MatchesTheC32KernelAndTheCpu) {
  CEDAR_REQUIRE_GPU();
  struct Case {
    int64_t n, d;
    bool expand, fp32_x, in_place;
    int64_t sample;  // the CPU checks tokens t % sample == 0
  };
  for (const Case c : {Case{8192, 5120, true, false, false, 16}, Case{2048, 5120, true, false, true, 1},
                       Case{333, 5120, true, false, false, 1}, Case{130, 1024, true, false, true, 1},
                       Case{1000, 1024, false, true, false, 1}, Case{4096, 5120, false, true, false, 8},
                       Case{161, 5120, false, false, false, 1}}) {
    Site s = make_site(c.n, c.d, 171 + static_cast<uint32_t>(c.n));
    if (c.fp32_x) {
      std::mt19937 rng(9 + static_cast<uint32_t>(c.n));
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (auto& v : s.X) v = nd(rng);
    }
    const std::string tag = " n=" + std::to_string(c.n) + " d=" + std::to_string(c.d) + (c.expand ? "" : " no-expand") +
                            (c.fp32_x ? " fp32 X" : "") + (c.in_place ? " in place" : "");
    const GpuRun c64 = gpu_site(s, c.expand, true, true, c.in_place, Ws::Sized, true);
    const GpuRun c32 = gpu_site(s, c.expand, true, true, c.in_place, Ws::Sized, true, 0, false, false,
                                StreamKind{.c32 = true, .serial_finish = true});
    const GpuRun c32_lanes =
        gpu_site(s, c.expand, true, true, c.in_place, Ws::Sized, true, 0, false, false, StreamKind{.c32 = true});
    if (c.expand) {
      EXPECT_TRUE(parity("mhc stream c64 vs c32: X" + tag, c64.X_out, c32.X_out, kExact));
    }
    EXPECT_TRUE(parity("mhc stream c64 vs c32: collapsed" + tag, c64.collapsed, c32.collapsed, kExact));
    EXPECT_EQ(bits_differ(c32_lanes.mix, c32.mix), 0u) << "lane finish vs serial finish" << tag;
    EXPECT_TRUE(parity("mhc stream lane vs serial finish: mix" + tag, c32_lanes.mix, c32.mix, kExact));
    Site sub;
    sub.d = s.d;
    sub.fn = s.fn;
    sub.base = s.base;
    sub.scale = s.scale;
    const int64_t width = kHc * s.d;
    std::vector<float> c64_mix, c32_mix;
    for (int64_t t = 0; t < s.n; t += c.sample) {
      ++sub.n;
      sub.X.insert(sub.X.end(), s.X.begin() + t * width, s.X.begin() + (t + 1) * width);
      sub.y.insert(sub.y.end(), s.y.begin() + t * s.d, s.y.begin() + (t + 1) * s.d);
      sub.prev_mix.insert(sub.prev_mix.end(), s.prev_mix.begin() + t * kMix, s.prev_mix.begin() + (t + 1) * kMix);
      c64_mix.insert(c64_mix.end(), c64.mix.begin() + t * kMix, c64.mix.begin() + (t + 1) * kMix);
      c32_mix.insert(c32_mix.end(), c32.mix.begin() + t * kMix, c32.mix.begin() + (t + 1) * kMix);
    }
    const Want w = cpu_site(sub, c.expand, true, true);
    EXPECT_TRUE(parity("mhc stream c64 kernel vs cpu: mix" + tag, c64_mix, w.mix, kCoeff));
    EXPECT_TRUE(parity("mhc stream c32 kernel vs cpu: mix" + tag, c32_mix, w.mix, kCoeff));
    EXPECT_TRUE(parity("mhc stream c64 vs c32 kernel: mix" + tag, c64.mix, c32.mix, kCoeff));
    std::printf("mhc stream c64 vs c32 kernel%s: %zu of %zu mix values differ in their bits\n", tag.c_str(),
                bits_differ(c64.mix, c32.mix), c64.mix.size());
  }
}

// fn == null: expand and/or collapse only (the final collapse; the expand before Engram), any n.
TEST(CudaMhcPaths, ExpandCollapseOnly) {
  CEDAR_REQUIRE_GPU();
  check_site(make_site(1, 5120, 91), true, true, false, false, Ws::Sized, true, "no-coefficients n=1");
  check_site(make_site(300, 512, 92), true, false, false, true, Ws::Legacy, false, "expand only n=300 in-place");
  check_site(make_site(5, 512, 93), false, true, false, false, Ws::Legacy, true, "collapse only n=5 strided");
}

// Two dependent steps with programmatic dependent launch give the bits of plain launches.
TEST(CudaMhcPaths, ProgrammaticLaunchKeepsTheOrder) {
  CEDAR_REQUIRE_GPU();
  for (const int64_t n : {int64_t{2}, kMhcStreamMinTokens + 5}) {
    const Site s = make_site(n, 5120, 101);
    const GpuRun plain = gpu_site(s, true, true, true, true, Ws::Sized, true, 0, false);
    const GpuRun pdl = gpu_site(s, true, true, true, true, Ws::Sized, true, 0, true);
    const std::string tag = " n=" + std::to_string(n);
    EXPECT_TRUE(parity("mhc PDL vs plain: X" + tag, pdl.X_out, plain.X_out, kExact));
    EXPECT_TRUE(parity("mhc PDL vs plain: mix" + tag, pdl.mix, plain.mix, kExact));
  }
}

// ---- the current decode kernel against the session-3 one, and the fused RMSNorm ------------------

struct DecodeRun {
  std::vector<float> X_out, collapsed, mix, normed;
  std::vector<uint16_t> codes;  // normed's FP8 codes (DecodeOpts::quant)
  std::vector<float> scales;
};
struct DecodeOpts {
  bool legacy = false;   // MhcFusedArgs::legacy_decode
  bool norm = false;     // normed requested
  bool weighted = true;  // norm_weight given
  bool pdl = false;
  int64_t sinkhorn_iters = 20;
  bool one_token = false;  // MhcFusedArgs::decode_one_token
  bool quant = false;      // with norm: normed's FP8 codes too (MhcFusedArgs::normed_quant)
  bool coef_only = false;  // no expand, no collapse (the split site's coefficient launch)
};
// One site (expand + collapse + coefficients, strided mix rows, in place) with a sized workspace.
DecodeRun run_decode(const Site& s, const std::vector<float>& norm_w, const DecodeOpts& o) {
  const int64_t n = s.n, d = s.d;
  auto dX = upload(s.X), dy = upload(s.y), dfn = upload(s.fn), dbase = upload(s.base), dscale = upload(s.scale);
  auto dprev = upload(s.prev_mix), dw = upload(norm_w);
  auto dcol = upload(std::vector<float>(n * d, -4.0f));
  auto dnormed = upload(std::vector<float>(n * d, -3.0f));
  auto dmix = upload(std::vector<float>(n * kMix, -7.0f));
  auto dcodes = upload(std::vector<uint16_t>(n * d, 0xFFFF));
  auto dscales = upload(std::vector<float>(n * (d / 32), -1.0f));
  const int64_t floats = mhc_workspace_floats(n, d), counters = mhc_workspace_counters(n);
  auto dpart = alloc<float>(floats);
  auto dcnt = alloc<unsigned>(counters);
  EXPECT_TRUE(dcnt.zero().ok());
  MhcFusedArgs a;
  a.n = n;
  a.d = d;
  a.X = dX.get();
  a.X_out = dX.get();
  a.y = dy.get();
  a.post = dprev.get() + 4;
  a.comb = dprev.get() + 8;
  a.collapse_w = dprev.get();
  a.post_stride = a.comb_stride = a.collapse_w_stride = kMix;
  a.collapsed = dcol.get();
  a.fn = dfn.get();
  a.base = dbase.get();
  a.scale = dscale.get();
  a.mix_out = dmix.get();
  a.sinkhorn_iters = o.sinkhorn_iters;
  a.programmatic_launch = o.pdl;
  a.legacy_decode = o.legacy;
  a.decode_one_token = o.one_token;
  if (o.coef_only) {
    a.y = a.post = a.comb = a.collapse_w = nullptr;
    a.collapsed = nullptr;
  }
  if (o.norm) {
    a.normed = dnormed.get();
    a.norm_weight = o.weighted ? dw.get() : nullptr;
    a.normed_eps = 1e-6f;
    if (o.quant) a.normed_quant = ActQuantOut{dcodes.get(), dscales.get()};
  }
  const MhcWorkspace ws{dpart.get(), dcnt.get(), floats, counters};
  for (int rep = 0; rep < 2; ++rep) {  // the second launch checks that the counters were re-armed
    if (rep == 1) {
      EXPECT_TRUE(dX.upload(s.X.data(), s.X.size()).ok());
    }
    const Status st = mhc_fused(a, ws, nullptr);
    EXPECT_TRUE(st.ok()) << st.error().message;
  }
  return DecodeRun{download(dX), download(dcol), download(dmix), download(dnormed), download(dcodes), download(dscales)};
}

size_t bits_differ(const std::vector<float>& x, const std::vector<float>& y) {
  size_t n = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) n += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
  return n;
}

// The warp-per-token coefficients (finish_mix_warp: the same operations as finish_mix, the reciprocals
// through rcp.approx + one Newton FMA step instead of __frcp_rn's call) against the session-3 kernel
// (one thread per token): X and collapsed bit for bit (untouched arithmetic), the mix rows within
// 1 ulp-level bounds (expected bit for bit: the inline reciprocal is rcp.rn's own fast path), and both
// against the CPU oracle (check_site) with mhc_fused's tolerances.
TEST(CudaMhcPaths, WarpCoefficientsMatchTheSessionThreeKernel) {
  CEDAR_REQUIRE_GPU();
  const Tolerance kUlps{.max_nmse = 1e-12, .min_cosine = 0.0, .rel = 1e-6, .abs = 1e-7};
  for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{20}}) {
    const Site s = make_site(n, 5120, 111 + static_cast<uint32_t>(n));
    const std::vector<float> w(5120, 1.0f);
    for (const int64_t iters : {int64_t{1}, int64_t{20}}) {
      const DecodeRun now = run_decode(s, w, DecodeOpts{.sinkhorn_iters = iters});
      const DecodeRun old = run_decode(s, w, DecodeOpts{.legacy = true, .sinkhorn_iters = iters});
      const std::string tag = " n=" + std::to_string(n) + " sinkhorn=" + std::to_string(iters);
      EXPECT_TRUE(parity("mhc warp vs legacy kernel: X" + tag, now.X_out, old.X_out, kExact));
      EXPECT_TRUE(parity("mhc warp vs legacy kernel: collapsed" + tag, now.collapsed, old.collapsed, kExact));
      EXPECT_TRUE(parity("mhc warp vs legacy kernel: mix (1-ulp bounds)" + tag, now.mix, old.mix, kUlps));
      const size_t differ = bits_differ(now.mix, old.mix);
      std::printf("mhc warp vs legacy kernel%s: %zu of %zu mix values differ in their bits\n", tag.c_str(), differ,
                  now.mix.size());
    }
    check_site(s, true, true, true, true, Ws::Sized, true, "warp coefficients n=" + std::to_string(n));
  }
}

// decode_one_token: a one-row launch takes mhc_decode_one_kernel (one token's registers and shared memory, a
// register bound) — every output bit for bit as the 8-token kernel, with and without the fused norm and its FP8
// codes, and with the coefficients alone (no expand, no collapse: the split site's launch). Rows > 1 ignore it.
TEST(CudaMhcPaths, OneTokenKernelGivesTheSameBits) {
  CEDAR_REQUIRE_GPU();
  for (const int64_t n : {int64_t{1}, int64_t{3}}) {
    for (const int64_t d : {int64_t{5120}, int64_t{96}}) {
      const Site s = make_site(n, d, 151 + static_cast<uint32_t>(n + d));
      const std::vector<float> w(d, 1.25f);
      for (const int mode : {0, 1, 2, 3}) {  // expand / collapse + coefficients; + norm; + norm and codes; coefficients
        const DecodeOpts base{.norm = mode == 1 || mode == 2, .quant = mode == 2, .coef_only = mode == 3};
        DecodeOpts one = base;
        one.one_token = true;
        const DecodeRun want = run_decode(s, w, base), got = run_decode(s, w, one);
        const std::string tag = " n=" + std::to_string(n) + " d=" + std::to_string(d) + " mode " + std::to_string(mode);
        EXPECT_TRUE(parity("mhc one-token kernel: X" + tag, got.X_out, want.X_out, kExact));
        EXPECT_TRUE(parity("mhc one-token kernel: collapsed" + tag, got.collapsed, want.collapsed, kExact));
        EXPECT_TRUE(parity("mhc one-token kernel: mix" + tag, got.mix, want.mix, kExact));
        EXPECT_TRUE(parity("mhc one-token kernel: normed" + tag, got.normed, want.normed, kExact));
        EXPECT_EQ(got.codes, want.codes) << tag;
        EXPECT_TRUE(parity("mhc one-token kernel: scales" + tag, got.scales, want.scales, kExact));
      }
    }
  }
}

// normed = rms_norm(collapsed): fused into the last block up to kMhcNormFuseMaxTokens rows, a second
// launch above (more tiles, the streaming path) and with the legacy kernel — always rms_norm's bits
// (the fused copy repeats its arithmetic op for op), and rms_norm itself against cpu::rms_norm.
TEST(CudaMhcPaths, NormedIsTheRmsNormOfCollapsed) {
  CEDAR_REQUIRE_GPU();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> ud(0.5f, 1.5f);
  for (const int64_t n : {int64_t{1}, int64_t{2}, kMhcNormFuseMaxTokens, kMhcNormFuseMaxTokens + 1, int64_t{9},
                          kMhcStreamMinTokens + 3}) {
    for (const int64_t d : {int64_t{5120}, int64_t{96}}) {
      const Site s = make_site(n, d, 131 + static_cast<uint32_t>(n + d));
      std::vector<float> w(d);
      for (auto& v : w) v = round_to_bf16(ud(rng));
      for (const bool weighted : {true, false}) {
        for (const bool legacy : {false, true}) {
          const DecodeRun r =
              run_decode(s, w, DecodeOpts{.legacy = legacy, .norm = true, .weighted = weighted, .pdl = n == 2});
          const std::string tag = " n=" + std::to_string(n) + " d=" + std::to_string(d) +
                                  (weighted ? " weighted" : " unweighted") + (legacy ? " legacy" : "");
          // rms_norm on the same collapsed rows.
          auto dcol = upload(r.collapsed), dw = upload(w);
          auto dref = alloc<float>(n * d);
          const Status st =
              rms_norm(dcol.get(), n, d, weighted ? dw.get() : nullptr, 1e-6f, dref.get(), nullptr, false);
          ASSERT_TRUE(st.ok()) << st.error().message;
          const auto ref = download(dref);
          EXPECT_TRUE(parity("mhc normed vs rms_norm kernel" + tag, r.normed, ref, kExact));
          // and the CPU oracle of the norm (rms_norm's own tolerance: blocked sum of squares).
          std::vector<float> cpu_out(n * d);
          const std::vector<float> ones(d, 1.0f);
          for (int64_t t = 0; t < n; ++t)
            cpu::rms_norm(std::span<const float>(r.collapsed.data() + t * d, d), d, weighted ? w : ones, 1e-6,
                          std::span<float>(cpu_out.data() + t * d, d));
          EXPECT_TRUE(parity("mhc normed vs cpu::rms_norm" + tag, r.normed, cpu_out,
                             Tolerance{.max_nmse = 1e-6, .min_cosine = 0.99999, .rel = 1e-2, .abs = 1e-6}));
        }
      }
    }
  }
}

// ---- the critical half of a split decode site: expand + collapse + the RMSNorm in one launch --------

struct NormSiteRun {
  std::vector<float> X_out, collapsed, normed;
};
struct NormSiteOpts {
  bool fused = true;  // the workspace's norm_counter (else elementwise + rms_norm: the reference)
  bool expand = true;
  bool in_place = false;  // X_out = X
  bool strided = false;   // post / comb / collapse_w read in place from the mix rows (stride 24)
  bool weighted = true;
  bool pdl = false;
};
struct NormSiteBuffers {
  DeviceBuffer<float> X, y, prev, post, comb, cw, w, X_out, collapsed, normed;
  DeviceBuffer<unsigned> norm_counter, coef_counter;
};
// Device copies of a site; outputs poisoned (X_out −5, collapsed −4, normed −3); the norm counter
// zero, the coefficient kernel's counter 7 (the fused path must not touch it).
NormSiteBuffers norm_site_buffers(const Site& s, const std::vector<float>& w) {
  const int64_t n = s.n, d = s.d;
  std::vector<float> post(n * 4), comb(n * 16), cw(n * 4);
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(s.prev_mix.begin() + t * kMix, 4, cw.begin() + t * 4);
    std::copy_n(s.prev_mix.begin() + t * kMix + 4, 4, post.begin() + t * 4);
    std::copy_n(s.prev_mix.begin() + t * kMix + 8, 16, comb.begin() + t * 16);
  }
  return NormSiteBuffers{upload(s.X),
                         upload(s.y),
                         upload(s.prev_mix),
                         upload(post),
                         upload(comb),
                         upload(cw),
                         upload(w),
                         upload(std::vector<float>(s.X.size(), -5.0f)),
                         upload(std::vector<float>(n * d, -4.0f)),
                         upload(std::vector<float>(n * d, -3.0f)),
                         upload(std::vector<unsigned>(kMhcNormCounters, 0u)),
                         upload(std::vector<unsigned>{7u})};
}
MhcFusedArgs norm_site_args(const Site& s, NormSiteBuffers& b, const NormSiteOpts& o) {
  MhcFusedArgs a;
  a.n = s.n;
  a.d = s.d;
  a.X = b.X.get();
  a.X_out = o.in_place ? b.X.get() : b.X_out.get();
  a.y = o.expand ? b.y.get() : nullptr;
  a.post = o.strided ? b.prev.get() + 4 : b.post.get();
  a.comb = o.strided ? b.prev.get() + 8 : b.comb.get();
  a.collapse_w = o.strided ? b.prev.get() : b.cw.get();
  if (o.strided) a.post_stride = a.comb_stride = a.collapse_w_stride = kMix;
  a.collapsed = b.collapsed.get();
  a.normed = b.normed.get();
  a.norm_weight = o.weighted ? b.w.get() : nullptr;
  a.normed_eps = 1e-6f;
  a.programmatic_launch = o.pdl;
  return a;  // fn = null: no coefficients
}
MhcWorkspace norm_site_ws(NormSiteBuffers& b, bool fused) {
  MhcWorkspace ws{nullptr, b.coef_counter.get()};
  ws.norm_counter = fused ? b.norm_counter.get() : nullptr;
  return ws;
}

// One site with fn = null and normed, launched twice: before the second launch X is re-uploaded (in
// place) and normed poisoned again, so a ticket that was not re-armed leaves normed at −3.
NormSiteRun run_norm_site(const Site& s, const std::vector<float>& w, const NormSiteOpts& o) {
  NormSiteBuffers b = norm_site_buffers(s, w);
  const MhcFusedArgs a = norm_site_args(s, b, o);
  const MhcWorkspace ws = norm_site_ws(b, o.fused);
  for (int rep = 0; rep < 2; ++rep) {
    if (rep == 1) {
      EXPECT_TRUE(b.X.upload(s.X.data(), s.X.size()).ok());
      const std::vector<float> poison(s.n * s.d, -3.0f);
      EXPECT_TRUE(b.normed.upload(poison.data(), poison.size()).ok());
    }
    const Status st = mhc_fused(a, ws, nullptr);
    EXPECT_TRUE(st.ok()) << st.error().message;
  }
  EXPECT_EQ(download(b.norm_counter), std::vector<unsigned>(kMhcNormCounters, 0u)) << "norm ticket not re-armed";
  EXPECT_EQ(download(b.coef_counter), std::vector<unsigned>{7u}) << "the coefficient kernel's counter was used";
  return NormSiteRun{download(o.in_place ? b.X : b.X_out), download(b.collapsed), download(b.normed)};
}

// Expands, collapses and normalizes like cpu_site + cpu::rms_norm: the references of one run.
void check_norm_site_against_cpu(const Site& s, const std::vector<float>& w, const NormSiteOpts& o,
                                 const NormSiteRun& g, const std::string& tag) {
  const Want want = cpu_site(s, o.expand, true, false);
  if (o.expand) {
    EXPECT_TRUE(parity("mhc+norm expand vs cpu" + tag, g.X_out, want.X_new, kExact));
  }
  EXPECT_TRUE(parity("mhc+norm collapse vs cpu" + tag, g.collapsed, want.collapsed, kExact));
  std::vector<float> cpu_out(s.n * s.d);
  const std::vector<float> ones(s.d, 1.0f);
  for (int64_t t = 0; t < s.n; ++t)
    cpu::rms_norm(std::span<const float>(g.collapsed.data() + t * s.d, s.d), s.d, o.weighted ? w : ones, 1e-6,
                  std::span<float>(cpu_out.data() + t * s.d, s.d));
  EXPECT_TRUE(parity("mhc+norm normed vs cpu::rms_norm" + tag, g.normed, cpu_out,
                     Tolerance{.max_nmse = 1e-6, .min_cosine = 0.99999, .rel = 1e-2, .abs = 1e-6}));
}

// fn = null with normed (the critical half of a split decode site): up to kMhcNormFuseMaxTokens rows
// one launch (mhc_expand_collapse_norm_kernel), above it the two launches — X_out, collapsed and normed
// bit for bit those of mhc_elementwise_kernel + rms_norm (the workspace without norm_counter), and
// against the CPU oracle. n = 1..8; d = 5120, 96 (one block, 96 of 256 channels live), 288 (a second
// block of 32 channels), 6144 (norm_row's batched two-pass path: d > 256·20); with and without
// expand, in place, strided mix rows, unweighted, PDL.
TEST(CudaMhcPaths, ExpandCollapseNormInOneLaunch) {
  CEDAR_REQUIRE_GPU();
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> ud(0.5f, 1.5f);
  const NormSiteOpts kinds[] = {
      NormSiteOpts{},
      NormSiteOpts{.in_place = true, .strided = true},
      NormSiteOpts{.expand = false, .strided = true, .weighted = false},
      NormSiteOpts{.in_place = true, .strided = true, .pdl = true},
  };
  for (int64_t n = 1; n <= 8; ++n) {
    for (const int64_t d : {int64_t{5120}, int64_t{96}, int64_t{288}, int64_t{6144}}) {
      const Site s = make_site(n, d, 211 + static_cast<uint32_t>(n * 7 + d));
      std::vector<float> w(d);
      for (auto& v : w) v = round_to_bf16(ud(rng));
      for (size_t k = 0; k < std::size(kinds); ++k) {
        NormSiteOpts o = kinds[k];
        const std::string tag = " n=" + std::to_string(n) + " d=" + std::to_string(d) + (o.expand ? "" : " no-expand") +
                                (o.in_place ? " in-place" : "") + (o.strided ? " strided" : "") +
                                (o.weighted ? "" : " unweighted") + (o.pdl ? " pdl" : "");
        const NormSiteRun fused = run_norm_site(s, w, o);
        o.fused = false;
        const NormSiteRun two = run_norm_site(s, w, o);
        if (o.expand) {
          EXPECT_EQ(bits_differ(fused.X_out, two.X_out), 0u) << "X_out" << tag;
        }
        EXPECT_EQ(bits_differ(fused.collapsed, two.collapsed), 0u) << "collapsed" << tag;
        EXPECT_EQ(bits_differ(fused.normed, two.normed), 0u) << "normed" << tag;
        EXPECT_TRUE(
            parity("mhc+norm one launch vs elementwise + rms_norm: normed" + tag, fused.normed, two.normed, kExact));
        check_norm_site_against_cpu(s, w, o, fused, tag);
      }
    }
  }
}

// In a CUDA graph (the decode step): one node up to kMhcNormFuseMaxTokens rows (two above: the
// elementwise kernel + rms_norm), and every replay — new X, y and mix rows uploaded into the same
// buffers, normed poisoned — gives the bits of the two-launch path (a ticket left armed would leave
// normed at −3 from the second replay on). In place with strided mix rows, as the model runs it.
TEST(CudaMhcPaths, ExpandCollapseNormGraphReplays) {
  CEDAR_REQUIRE_GPU();
  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok()) << stream.error().message;
  const NormSiteOpts o{.in_place = true, .strided = true};
  for (const int64_t n : {int64_t{1}, kMhcNormFuseMaxTokens, kMhcNormFuseMaxTokens + 2}) {
    const int64_t d = 5120;
    std::vector<Site> sites;
    for (uint32_t r = 0; r < 3; ++r) sites.push_back(make_site(n, d, 307 + 11 * r + static_cast<uint32_t>(n)));
    std::vector<float> w(d);
    for (int64_t c = 0; c < d; ++c) w[c] = round_to_bf16(0.75f + 0.5f * static_cast<float>(c % 7) / 7.0f);
    NormSiteBuffers b = norm_site_buffers(sites[0], w);
    const MhcFusedArgs a = norm_site_args(sites[0], b, o);
    const MhcWorkspace ws = norm_site_ws(b, true);
    auto g = CudaGraph::capture(stream->get(), [&](cudaStream_t st) { return mhc_fused(a, ws, st); });
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ(g->nodes(), n <= kMhcNormFuseMaxTokens ? 1u : 2u) << "graph nodes at n=" << n;
    for (size_t r = 0; r < sites.size(); ++r) {
      const Site& s = sites[r];
      const std::vector<float> poison(n * d, -3.0f);
      ASSERT_TRUE(b.X.upload(s.X.data(), s.X.size()).ok());
      ASSERT_TRUE(b.y.upload(s.y.data(), s.y.size()).ok());
      ASSERT_TRUE(b.prev.upload(s.prev_mix.data(), s.prev_mix.size()).ok());
      ASSERT_TRUE(b.normed.upload(poison.data(), poison.size()).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_TRUE(g->launch(stream->get()).ok());
      ASSERT_TRUE(stream->synchronize().ok());
      NormSiteOpts ref = o;
      ref.fused = false;
      const NormSiteRun two = run_norm_site(s, w, ref);
      const std::string tag = " n=" + std::to_string(n) + " replay " + std::to_string(r);
      EXPECT_EQ(bits_differ(download(b.X), two.X_out), 0u) << "X_out" << tag;
      EXPECT_EQ(bits_differ(download(b.collapsed), two.collapsed), 0u) << "collapsed" << tag;
      EXPECT_EQ(bits_differ(download(b.normed), two.normed), 0u) << "normed" << tag;
    }
    EXPECT_EQ(download(b.norm_counter), std::vector<unsigned>(kMhcNormCounters, 0u)) << "n=" << n;
    EXPECT_EQ(download(b.coef_counter), std::vector<unsigned>{7u}) << "n=" << n;
  }
}

// y_combine (paths.site_combine): the site kernel combines the MoE rows as it reads y. X_out, collapsed and
// normed bit for bit the site's on moe_combine's y, and y itself stored with moe_combine's bits; duplicate
// expert ids (the stable order), with and without the shared row; n = 5 (above kMhcNormFuseMaxTokens) and
// topk = 9 (above kMhcCombineMaxTopk) take moe_combine first, with the same results. Each with the ticket kernel
// and with site_cluster (the cluster kernel at d = 5120 and 512, n <= 4; the ticket kernel elsewhere).
TEST(CudaMhcPaths, ExpandCollapseNormCombinesTheMoeRows) {
  CEDAR_REQUIRE_GPU();
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> ud(0.5f, 1.5f);
  for (const int64_t n : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{5}})
    for (const int64_t d : {int64_t{5120}, int64_t{512}, int64_t{96}})
      for (const int64_t K : {int64_t{6}, int64_t{8}, int64_t{9}})
        for (const bool with_shared : {true, false}) {
          const uint32_t seed = 401 + static_cast<uint32_t>(n * 31 + d + K * 7 + (with_shared ? 1 : 0));
          const Site s = make_site(n, d, seed);
          std::vector<float> w(d);
          for (auto& v : w) v = round_to_bf16(ud(rng));
          std::vector<int32_t> ids(n * K);
          for (auto& e : ids) e = static_cast<int32_t>(rng() % 5);  // duplicates: the stable order matters
          auto d_ids = upload(ids);
          auto d_routed = upload(random_acts(n * K * d, seed + 5));
          auto d_shared = upload(random_acts(n * d, seed + 6));
          auto y_ref = upload(std::vector<float>(n * d, -9.0f));
          const MoeCombineArgs ca{n, K, d, d_ids.get(), d_routed.get(), with_shared ? d_shared.get() : nullptr,
                                  y_ref.get()};
          ASSERT_TRUE(moe_combine(ca, nullptr).ok());
          Site ref = s;
          ref.y = download(y_ref);
          const NormSiteOpts o{.in_place = true, .strided = true};
          const NormSiteRun want = run_norm_site(ref, w, o);

          for (const bool cluster : {false, true}) {  // the ticket kernel, and the cluster kernel where it fits
            NormSiteBuffers b = norm_site_buffers(s, w);
            const std::vector<float> poison(n * d, -6.0f);
            ASSERT_TRUE(b.y.upload(poison.data(), poison.size()).ok());
            MhcFusedArgs a = norm_site_args(s, b, o);
            a.y_combine =
                MhcYCombine{d_ids.get(), d_routed.get(), with_shared ? d_shared.get() : nullptr, K, b.y.get()};
            a.site_cluster = cluster;
            const Status st = mhc_fused(a, norm_site_ws(b, true), nullptr);
            ASSERT_TRUE(st.ok()) << st.error().message;
            const std::string tag = " n=" + std::to_string(n) + " d=" + std::to_string(d) +
                                    " topk=" + std::to_string(K) + (with_shared ? "" : " no shared") +
                                    (cluster ? " site_cluster" : "");
            EXPECT_EQ(bits_differ(download(b.y), ref.y), 0u) << "y" << tag;
            EXPECT_EQ(bits_differ(download(b.X), want.X_out), 0u) << "X_out" << tag;
            EXPECT_EQ(bits_differ(download(b.collapsed), want.collapsed), 0u) << "collapsed" << tag;
            EXPECT_EQ(bits_differ(download(b.normed), want.normed), 0u) << "normed" << tag;
            EXPECT_EQ(download(b.norm_counter), std::vector<unsigned>(kMhcNormCounters, 0u)) << "norm ticket" << tag;
          }
        }
}

TEST(CudaMhcPaths, NormedNeedsACollapse) {
  CEDAR_REQUIRE_GPU();
  MhcFusedArgs a;
  a.n = 1;
  a.d = 128;
  a.X = reinterpret_cast<const float*>(16);
  a.normed = reinterpret_cast<float*>(16);
  const Status s = mhc_fused(a, MhcWorkspace{}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("normed"), std::string::npos) << s.error().message;
}

TEST(CudaMhcPaths, RejectsBadStrides) {
  CEDAR_REQUIRE_GPU();
  MhcFusedArgs a;
  a.n = 1;
  a.d = 128;
  a.X = reinterpret_cast<const float*>(16);
  a.post_stride = 3;
  const Status s = mhc_fused(a, MhcWorkspace{}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("stride"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace cedar::cuda
