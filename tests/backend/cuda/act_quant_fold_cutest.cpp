// Activation quantization in its producers (s8-quantfold): rms_norm and every mHC kernel that writes the
// site norm (MhcFusedArgs::normed_quant) also write the FP8 block-32 codes + scales of their output.
// Each fused output must equal the separate launches bit for bit — the float output of the kernel without
// codes, and quantize_act_fp8 of that output (codes and scales) — and the codes must be the CPU recipe's
// (quantize_act_block32, core/numeric.h) of the float output. The first mismatch is printed.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "core/numeric.h"
#include "cuda_test_util.h"
#include "ffn_test_util.h"

namespace cedar::cuda {
namespace {

using namespace ffn_testing;

constexpr int64_t kHc = 4, kMix = 24;

// Bitwise equality of two arrays; on a mismatch one failure naming the first differing element.
template <typename T>
size_t expect_same_bits(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  EXPECT_EQ(got.size(), want.size()) << what << ": sizes differ";
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ == 0) first = i;
  if (bad) {
    double g = 0, w = 0;
    if constexpr (sizeof(T) == 2) {
      g = half_bits_to_float(static_cast<uint16_t>(got[first]));
      w = half_bits_to_float(static_cast<uint16_t>(want[first]));
    } else {
      g = static_cast<double>(got[first]);
      w = static_cast<double>(want[first]);
    }
    ADD_FAILURE() << what << ": " << bad << " of " << got.size() << " elements differ; first at " << first << ": " << g
                  << " vs " << w;
  }
  return bad;
}

// Codes and scales of `y` [rows, width] by the CPU recipe, in the GEMV's layout (f16 values, fp32 scales).
struct HostCodes {
  std::vector<uint16_t> codes;
  std::vector<float> scales;
};
uint16_t f16_bits_of(float v) {  // exact for e4m3 values (normal in f16, or zero)
  if (v == 0.0f) return std::signbit(v) ? 0x8000 : 0;
  int e = 0;
  const float m = std::frexp(std::fabs(v), &e);                          // v = m · 2^e, m in [0.5, 1)
  const uint32_t man = static_cast<uint32_t>(std::ldexp(m, 11)) - 1024;  // 10 fraction bits
  return static_cast<uint16_t>((std::signbit(v) ? 0x8000 : 0) | ((e - 1 + 15) << 10) | man);
}
HostCodes cpu_codes(const std::vector<float>& y) {
  HostCodes h;
  h.codes.resize(y.size());
  h.scales.resize(y.size() / 32);
  for (size_t b = 0; b < y.size() / 32; ++b) {
    std::array<uint8_t, 32> c{};
    h.scales[b] = ue8m0_to_f32(quantize_act_block32(std::span<const float, 32>(y.data() + 32 * b, 32), c));
    for (int i = 0; i < 32; ++i) h.codes[32 * b + i] = f16_bits_of(e4m3_to_f32(c[i]));
  }
  return h;
}

// quantize_act_fp8 of device rows (the separate launch the fused kernels replace).
HostCodes gpu_quantize(const std::vector<float>& y, int64_t rows, int64_t width) {
  auto dy = upload(y);
  auto dc = alloc<uint16_t>(y.size());
  auto ds = alloc<float>(y.size() / 32);
  const Status st = quantize_act_fp8(dy.get(), rows, width, dc.get(), ds.get(), nullptr);
  EXPECT_TRUE(st.ok()) << st.error().message;
  return HostCodes{download(dc), download(ds)};
}

// Every check of one fused run: float output, codes and scales against the separate launches and the
// CPU recipe.
void expect_fused_equal(const std::string& tag, const std::vector<float>& y_fused, const HostCodes& fused,
                        const std::vector<float>& y_plain, int64_t rows, int64_t width) {
  expect_same_bits(tag + " float output (fused vs plain)", y_fused, y_plain);
  const HostCodes sep = gpu_quantize(y_plain, rows, width);
  const size_t bad_codes = expect_same_bits(tag + " codes (fused vs quantize_act_fp8)", fused.codes, sep.codes);
  const size_t bad_scales = expect_same_bits(tag + " scales (fused vs quantize_act_fp8)", fused.scales, sep.scales);
  const HostCodes cpu = cpu_codes(y_plain);
  expect_same_bits(tag + " codes (fused vs quantize_act_block32)", fused.codes, cpu.codes);
  expect_same_bits(tag + " scales (fused vs quantize_act_block32)", fused.scales, cpu.scales);
  std::printf("PARITY %-58s codes %zu / %zu scales %zu / %zu differ (bit-exact required)\n", tag.c_str(), bad_codes,
              fused.codes.size(), bad_scales, fused.scales.size());
}

// Activations with blocks of very different magnitudes, an all-zero block (the 1e-4 clamp after the
// norm) and a large outlier per row.
std::vector<float> norm_input(int64_t rows, int64_t dim, uint32_t seed) {
  std::vector<float> x = random_acts(rows * dim, seed);
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x.data() + r * dim;
    if (dim >= 64) std::fill(xr + 32, xr + 64, 0.0f);
    xr[dim - 1] = round_to_bf16(3000.0f * static_cast<float>(r + 1));
  }
  return x;
}

const int64_t kWidths[] = {32, 64, 256, 512, 1280, 1536, 5120, 6144};

TEST(CudaActQuantFold, RmsNormCodesEqualQuantizeOfItsOutput) {
  CEDAR_REQUIRE_GPU();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> ud(0.25f, 2.0f);
  for (const int64_t rows : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{8}}) {
    for (const int64_t dim : kWidths) {
      std::vector<float> w(dim);
      for (auto& v : w) v = round_to_bf16(ud(rng));
      const std::vector<float> x = norm_input(rows, dim, 100 + static_cast<uint32_t>(rows * 31 + dim));
      auto dw = upload(w);
      for (const bool weighted : {true, false}) {
        for (const bool in_place : {false, true}) {  // q_norm runs in place
          const bool pdl = rows == 2;
          const std::string tag = "rms_norm+codes rows=" + std::to_string(rows) + " dim=" + std::to_string(dim) +
                                  (weighted ? "" : " unweighted") + (in_place ? " in-place" : "") + (pdl ? " pdl" : "");
          const float* wp = weighted ? dw.get() : nullptr;
          auto dx = upload(x);
          auto dy = upload(std::vector<float>(x.size(), -3.0f));
          ASSERT_TRUE(rms_norm(dx.get(), rows, dim, wp, 1e-6f, dy.get(), nullptr, false).ok());
          const std::vector<float> plain = download(dy);
          auto fx = upload(x);
          auto fy = upload(std::vector<float>(x.size(), -3.0f));
          auto fc = upload(std::vector<uint16_t>(x.size(), 0x7E00));  // f16 NaN: every code must be written
          auto fs = upload(std::vector<float>(x.size() / 32, -1.0f));
          float* out = in_place ? fx.get() : fy.get();
          const Status st =
              rms_norm(fx.get(), rows, dim, wp, 1e-6f, out, nullptr, pdl, ActQuantOut{fc.get(), fs.get()});
          ASSERT_TRUE(st.ok()) << tag << ": " << st.error().message;
          expect_fused_equal(tag, download(in_place ? fx : fy), HostCodes{download(fc), download(fs)}, plain, rows,
                             dim);
        }
      }
    }
  }
}

// ---- mHC site norms -------------------------------------------------------------------------------

// One site as the model runs it: X in place, the previous site's mix rows read by stride.
struct Site {
  int64_t n = 0, d = 0;
  std::vector<float> X, y, fn, base, scale, prev_mix, w;
};
Site make_site(int64_t n, int64_t d, uint32_t seed) {
  Site s;
  s.n = n;
  s.d = d;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.1f, 1.0f);
  s.X = random_acts(n * kHc * d, seed + 1);
  s.y = random_acts(n * d, seed + 2);
  s.fn.resize(kMix * kHc * d);
  for (auto& v : s.fn) v = nd(rng) * 0.02f;
  s.base.resize(kMix);
  for (auto& v : s.base) v = nd(rng);
  s.scale = {ud(rng), ud(rng), ud(rng)};
  s.prev_mix.resize(n * kMix);
  for (int64_t t = 0; t < n; ++t) {
    float* m = s.prev_mix.data() + t * kMix;
    for (int k = 0; k < 4; ++k) m[k] = ud(rng);
    for (int k = 4; k < 8; ++k) m[k] = 2.0f * ud(rng);
    for (int k = 8; k < 24; ++k) m[k] = ud(rng) / 2.0f;
  }
  s.w.resize(d);
  for (auto& v : s.w) v = round_to_bf16(0.5f + ud(rng));
  return s;
}

enum class SiteKernel {
  SplitNorm,     // fn = null, the workspace's norm_counter: expand + collapse + norm in one launch up to 4 rows
  SplitCluster,  // the same with site_cluster: one thread-block cluster where the shape fits, the ticket kernel else
  SplitTwo,      // fn = null without norm_counter: the elementwise kernel, then rms_norm
  Decode,        // fn set: the decode kernel's last block normalizes up to 4 rows, rms_norm after above
  LegacyDecode,  // fn set, the session-3 decode kernel: rms_norm after
};
const char* kernel_name(SiteKernel k) {
  switch (k) {
    case SiteKernel::SplitNorm:
      return "split+norm";
    case SiteKernel::SplitCluster:
      return "split+norm, cluster";
    case SiteKernel::SplitTwo:
      return "split, two launches";
    case SiteKernel::Decode:
      return "decode";
    case SiteKernel::LegacyDecode:
      return "legacy decode";
  }
  return "?";
}

struct SiteRun {
  std::vector<float> X, collapsed, normed, mix;
  HostCodes codes;
};

// mhc_fused on one site, launched twice (X re-uploaded, normed and the codes poisoned in between: a ticket
// left armed or a code not rewritten shows). quant: with normed_quant.
SiteRun run_site(const Site& s, SiteKernel k, bool quant) {
  const int64_t n = s.n, d = s.d;
  auto dX = upload(s.X), dy = upload(s.y), dfn = upload(s.fn), dbase = upload(s.base), dscale = upload(s.scale);
  auto dprev = upload(s.prev_mix), dw = upload(s.w);
  auto dcol = upload(std::vector<float>(n * d, -4.0f));
  auto dnormed = alloc<float>(n * d);
  auto dmix = upload(std::vector<float>(n * kMix, -7.0f));
  auto dcodes = alloc<uint16_t>(n * d);
  auto dscales = alloc<float>(n * d / 32);
  auto dpart = alloc<float>(mhc_workspace_floats(n, d));
  auto dcnt = alloc<unsigned>(mhc_workspace_counters(n));
  auto dnorm_cnt = alloc<unsigned>(kMhcNormCounters);
  EXPECT_TRUE(dcnt.zero().ok());
  EXPECT_TRUE(dnorm_cnt.zero().ok());
  const bool coefficients = k == SiteKernel::Decode || k == SiteKernel::LegacyDecode;
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
  a.fn = coefficients ? dfn.get() : nullptr;
  a.base = dbase.get();
  a.scale = dscale.get();
  a.mix_out = coefficients ? dmix.get() : nullptr;
  a.mix_stride = kMix;
  a.norm_weight = dw.get();
  a.normed = dnormed.get();
  a.normed_eps = 1e-6f;
  a.legacy_decode = k == SiteKernel::LegacyDecode;
  if (quant) a.normed_quant = ActQuantOut{dcodes.get(), dscales.get()};
  MhcWorkspace ws{dpart.get(), dcnt.get(), mhc_workspace_floats(n, d), mhc_workspace_counters(n)};
  if (k == SiteKernel::SplitNorm || k == SiteKernel::SplitCluster) ws.norm_counter = dnorm_cnt.get();
  a.site_cluster = k == SiteKernel::SplitCluster;
  for (int rep = 0; rep < 2; ++rep) {
    EXPECT_TRUE(dX.upload(s.X.data(), s.X.size()).ok());
    const std::vector<float> poison(n * d, -3.0f);
    EXPECT_TRUE(dnormed.upload(poison.data(), poison.size()).ok());
    const std::vector<uint16_t> nan_codes(n * d, 0x7E00);
    EXPECT_TRUE(dcodes.upload(nan_codes.data(), nan_codes.size()).ok());
    const std::vector<float> bad_scales(n * d / 32, -1.0f);
    EXPECT_TRUE(dscales.upload(bad_scales.data(), bad_scales.size()).ok());
    const Status st = mhc_fused(a, ws, nullptr);
    EXPECT_TRUE(st.ok()) << st.error().message;
  }
  EXPECT_EQ(download(dnorm_cnt), std::vector<unsigned>(kMhcNormCounters, 0u)) << "norm ticket not re-armed";
  EXPECT_EQ(download(dcnt), std::vector<unsigned>(mhc_workspace_counters(n), 0u)) << "ticket not re-armed";
  SiteRun r{download(dX), download(dcol), download(dnormed), download(dmix), {}};
  if (quant) r.codes = HostCodes{download(dcodes), download(dscales)};
  return r;
}

// The site kernels with normed_quant against the same kernels without it + quantize_act_fp8 of normed:
// X, collapsed, normed and the mix rows bit for bit, codes and scales bit for bit (and the CPU recipe's).
// n = 1..8 covers both sides of kMhcNormFuseMaxTokens; d = 5120 (the model), 64 / 512 (tiny widths),
// 96 (one partial block), 6144 (norm_row's two-pass path).
TEST(CudaActQuantFold, MhcSiteNormCodesEqualQuantizeOfNormed) {
  CEDAR_REQUIRE_GPU();
  for (const SiteKernel k :
       {SiteKernel::SplitNorm, SiteKernel::SplitCluster, SiteKernel::SplitTwo, SiteKernel::Decode,
        SiteKernel::LegacyDecode}) {
    for (const int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{8}}) {
      for (const int64_t d : {int64_t{5120}, int64_t{64}, int64_t{512}, int64_t{96}, int64_t{6144}}) {
        const Site s = make_site(n, d, 900 + static_cast<uint32_t>(n * 13 + d));
        const std::string tag =
            std::string("mhc ") + kernel_name(k) + " n=" + std::to_string(n) + " d=" + std::to_string(d);
        const SiteRun fused = run_site(s, k, true);
        const SiteRun plain = run_site(s, k, false);
        expect_same_bits(tag + " X", fused.X, plain.X);
        expect_same_bits(tag + " collapsed", fused.collapsed, plain.collapsed);
        expect_same_bits(tag + " mix rows", fused.mix, plain.mix);
        expect_fused_equal(tag, fused.normed, fused.codes, plain.normed, n, d);
      }
    }
  }
}

// The cluster site kernel (site_cluster, mhc_site_cluster.cu) against the ticket kernel it replaces: X,
// collapsed, normed, codes and scales bit for bit, with and without codes. Shapes it fits (mhc_site_cluster_fits:
// d = 5120 and 6144 at one row — 640 / 768 threads per row —, 512 and 256 up to 4 rows) and shapes that fall
// back to the ticket kernel (those d at 2..4 rows, d = 64 and 96, n = 5 and 8: the two launches), each launched
// twice (SiteClusterShapes: which shapes take the cluster kernel).
TEST(CudaActQuantFold, SiteClusterEqualsTheTicketKernel) {
  CEDAR_REQUIRE_GPU();
  for (const int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{8}}) {
    for (const int64_t d : {int64_t{5120}, int64_t{512}, int64_t{6144}, int64_t{256}, int64_t{64}, int64_t{96}}) {
      const Site s = make_site(n, d, 1300 + static_cast<uint32_t>(n * 17 + d));
      for (const bool quant : {true, false}) {
        const std::string tag = "cluster vs ticket n=" + std::to_string(n) + " d=" + std::to_string(d) +
                                (quant ? " with codes" : "");
        const SiteRun cluster = run_site(s, SiteKernel::SplitCluster, quant);
        const SiteRun ticket = run_site(s, SiteKernel::SplitNorm, quant);
        expect_same_bits(tag + " X", cluster.X, ticket.X);
        expect_same_bits(tag + " collapsed", cluster.collapsed, ticket.collapsed);
        expect_same_bits(tag + " normed", cluster.normed, ticket.normed);
        if (quant) {
          expect_same_bits(tag + " codes", cluster.codes.codes, ticket.codes.codes);
          expect_same_bits(tag + " scales", cluster.codes.scales, ticket.codes.scales);
        }
      }
    }
  }
}

// ---- argument checks (no launch: they run without a GPU too) ----------------------------------------

// The shapes the cluster site kernel takes (host arithmetic: runs without a GPU).
TEST(CudaActQuantFold, SiteClusterShapes) {
  EXPECT_TRUE(mhc_site_cluster_fits(1, 5120));   // 640 threads per row
  EXPECT_TRUE(mhc_site_cluster_fits(1, 6144));   // 768
  EXPECT_FALSE(mhc_site_cluster_fits(2, 5120));  // 1 280 threads
  EXPECT_TRUE(mhc_site_cluster_fits(4, 512));    // 256 per row: norm_row's order needs no fewer
  EXPECT_TRUE(mhc_site_cluster_fits(4, 256));
  EXPECT_FALSE(mhc_site_cluster_fits(5, 512));   // above kMhcNormFuseMaxTokens
  EXPECT_FALSE(mhc_site_cluster_fits(1, 64));    // a slice of 8 channels: not a 32-channel block
  EXPECT_FALSE(mhc_site_cluster_fits(1, 96));
  EXPECT_FALSE(mhc_site_cluster_fits(0, 512));
}

TEST(CudaActQuantFold, RmsNormCodesNeedScalesAndWholeBlocks) {
  const auto* x = reinterpret_cast<const float*>(256);
  auto* y = reinterpret_cast<float*>(256);
  auto* codes = reinterpret_cast<uint16_t*>(256);
  auto* scales = reinterpret_cast<float*>(256);
  Status st = rms_norm(x, 1, 64, nullptr, 1e-6f, y, nullptr, false, ActQuantOut{codes, nullptr});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("codes and scales"), std::string::npos) << st.error().message;
  st = rms_norm(x, 1, 48, nullptr, 1e-6f, y, nullptr, false, ActQuantOut{codes, scales});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("dim=48"), std::string::npos) << st.error().message;
}

TEST(CudaActQuantFold, MhcNormedQuantNeedsNormedAndScales) {
  MhcFusedArgs a;
  a.n = 1;
  a.d = 128;
  a.X = reinterpret_cast<const float*>(256);
  a.normed_quant = ActQuantOut{reinterpret_cast<uint16_t*>(256), reinterpret_cast<float*>(256)};
  Status st = mhc_fused(a, MhcWorkspace{}, nullptr);  // no normed
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("normed_quant"), std::string::npos) << st.error().message;
  a.collapse_w = reinterpret_cast<const float*>(256);
  a.collapsed = reinterpret_cast<float*>(256);
  a.normed = reinterpret_cast<float*>(256);
  a.normed_quant.scales = nullptr;
  st = mhc_fused(a, MhcWorkspace{}, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("normed_quant"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace cedar::cuda
