// Parity of the CUDA kernels with the CPU oracle (backend/cpu/ops.h, core/numeric.h, model/mhc.h).
// Each tolerance states why the GPU may differ from the CPU at all.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "core/numeric.h"
#include "cuda_test_util.h"
#include "model/mhc.h"

namespace cedar::cuda {
namespace {

using testing::parity;
using testing::Tolerance;

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& v) {
  auto b = DeviceBuffer<T>::from_host(v);
  EXPECT_TRUE(b.ok()) << b.error().message;
  return b.ok() ? std::move(*b) : DeviceBuffer<T>();
}
template <typename T>
std::vector<T> download(const DeviceBuffer<T>& b) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto v = b.to_host();
  EXPECT_TRUE(v.ok()) << v.error().message;
  return v.ok() ? *v : std::vector<T>();
}
template <typename T>
DeviceBuffer<T> alloc(size_t n) {
  auto b = DeviceBuffer<T>::allocate(n);
  EXPECT_TRUE(b.ok()) << b.error().message;
  return b.ok() ? std::move(*b) : DeviceBuffer<T>();
}

// bf16 activations with a per-32-block magnitude spread (exercises many activation scales).
std::vector<float> random_acts(size_t n, uint32_t seed, float base = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-12, 8);
  std::vector<float> v(n);
  float scale = base;
  for (size_t i = 0; i < n; ++i) {
    if (i % 32 == 0) scale = base * std::ldexp(1.0f, ex(rng));
    v[i] = round_to_bf16(nd(rng) * scale);
  }
  return v;
}

// ---- RMSNorm ---------------------------------------------------------------------------------

void check_rms_norm(int64_t rows, int64_t dim, bool weighted, uint32_t seed) {
  auto x = random_acts(rows * dim, seed);
  std::vector<float> w = weighted ? random_acts(dim, seed + 1) : std::vector<float>{};
  std::vector<float> want(x.size());
  cpu::rms_norm(x, dim, w, 1e-20, want);
  auto dx = upload(x);
  auto dw = upload(w);
  auto dy = alloc<float>(x.size());
  ASSERT_TRUE(rms_norm(dx.get(), rows, dim, weighted ? dw.get() : nullptr, 1e-20f, dy.get(), nullptr).ok());
  // The sum of squares is summed in another order: rsqrt differs by a few fp32 ulps, which can move
  // a bf16 rounding by one bf16 ulp (<= 2^-7 relative) and nothing more.
  Tolerance tol{.max_nmse = 1e-5, .min_cosine = 0.99999, .rel = 0x1p-7};
  EXPECT_TRUE(parity("rms_norm " + std::to_string(rows) + "x" + std::to_string(dim) + (weighted ? " w" : ""),
                     download(dy), want, tol));
}

TEST(CudaRmsNorm, MatchesCpu) {
  CEDAR_REQUIRE_GPU();
  check_rms_norm(3, 5120, true, 11);
  check_rms_norm(2, 1280, true, 12);
  check_rms_norm(4, 512, false, 13);
  check_rms_norm(1, 100, true, 14);   // dim not a multiple of the block
  check_rms_norm(2, 7168, true, 15);  // past 256 threads x 20 loads: the two-pass path of norm_row
}

// ---- FP8 activation quantization -----------------------------------------------------------------

// IEEE binary16 bits → float (exact; the GPU stores each e4m3 code as its f16 value).
float half_bits_to_float(uint16_t h) {
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -24);
  if (exp == 31) return man ? std::numeric_limits<float>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(man + 1024), exp - 25);
}

TEST(CudaActQuant, BitExactWithCpuRecipe) {
  CEDAR_REQUIRE_GPU();
  const int64_t n = 5, in = 1024;
  auto x = random_acts(n * in, 21);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // all-zero block: amax clamps to 1e-4
  x[200] = 448.0f * 3;                               // exact power-of-two ratio: scale without +1
  x[300] = 3.0e-5f;
  auto dx = upload(x);
  auto dcodes = alloc<uint16_t>(x.size());
  auto dscales = alloc<float>(x.size() / 32);
  ASSERT_TRUE(quantize_act_fp8(dx.get(), n, in, dcodes.get(), dscales.get(), nullptr).ok());
  const auto codes = download(dcodes);
  const auto scales = download(dscales);
  size_t bad = 0;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    std::array<uint8_t, 32> want{};
    const uint8_t sb = quantize_act_block32(std::span<const float, 32>(x.data() + 32 * b, 32), want);
    if (scales[b] != ue8m0_to_f32(sb) && bad++ == 0)
      ADD_FAILURE() << "first mismatch: block " << b << " scale gpu " << scales[b] << " cpu " << ue8m0_to_f32(sb);
    for (int i = 0; i < 32; ++i) {
      // The stored f16 must be the e4m3 code's value, sign of zero included.
      const float got = half_bits_to_float(codes[32 * b + i]), expect = e4m3_to_f32(want[i]);
      if ((got != expect || std::signbit(got) != std::signbit(expect)) && bad++ == 0)
        ADD_FAILURE() << "first mismatch: value " << 32 * b + i << " (x=" << x[32 * b + i] << ") code gpu "
                      << got << " cpu " << expect << " (e4m3 0x" << std::hex << int(want[i]) << ")";
    }
  }
  std::printf("PARITY %-40s n=%zu mismatches=%zu (bit-exact required)\n", "quantize_act_fp8", x.size(), bad);
  EXPECT_EQ(bad, 0u);
}

// ---- block-scaled GEMV ---------------------------------------------------------------------------

struct QuantWeightHost {
  cpu::LinearWeight cpu;
  std::vector<uint8_t> data, scales;
};

QuantWeightHost random_fp8_weight(int64_t out, int64_t in, int64_t block, uint32_t seed, int64_t block_out = 0) {
  block_out = block_out > 0 ? block_out : block;
  std::mt19937 rng(seed);
  QuantWeightHost w;
  w.data.resize(out * in);
  for (auto& c : w.data) {
    c = static_cast<uint8_t>(rng());
    if ((c & 0x7F) == 0x7F) c ^= 1;  // no NaN codes
  }
  const int64_t sr = (out + block_out - 1) / block_out, sc = (in + block - 1) / block;
  w.scales.resize(sr * sc);
  for (auto& s : w.scales) s = static_cast<uint8_t>(118 + rng() % 8);  // 2^-9 .. 2^-2
  w.cpu = {.format = WeightFormat::FP8Block, .out = out, .in = in, .data = w.data.data(),
           .scale = w.scales.data(), .block_out = block_out, .block_in = block};
  return w;
}

QuantWeightHost random_mxfp4_weight(int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  QuantWeightHost w;
  w.data.resize(out * in / 2);
  for (auto& c : w.data) c = static_cast<uint8_t>(rng());
  w.scales.resize(out * in / 32);
  for (auto& s : w.scales) s = static_cast<uint8_t>(118 + rng() % 8);
  w.cpu = {.format = WeightFormat::MXFP4, .out = out, .in = in, .data = w.data.data(), .scale = w.scales.data()};
  return w;
}

// |W| of a quantized weight: sign bits cleared (e4m3 bit 7; e2m1 bit 3 of each nibble).
QuantWeightHost abs_weight(const QuantWeightHost& w) {
  QuantWeightHost a = w;
  for (auto& c : a.data) c &= (w.cpu.format == WeightFormat::MXFP4) ? 0x77 : 0x7F;
  a.cpu.data = a.data.data();
  a.cpu.scale = a.scales.data();
  return a;
}

void check_gemv(const QuantWeightHost& w, int64_t n, uint32_t seed, const std::string& name) {
  const int64_t out = w.cpu.out, in = w.cpu.in;
  auto x = random_acts(n * in, seed);
  std::vector<float> want(n * out), bound(n * out);
  ASSERT_TRUE(cpu::linear(w.cpu, x, n, want, {.bf16_output = true}, nullptr).ok());
  // Σ |q_a·q_w|·s_a·s_w per output: the CPU linear of |W| and |x| (the FP8 recipe is symmetric, so
  // |x| quantizes to the magnitudes of x's codes with the same scales).
  std::vector<float> ax(x.size());
  std::transform(x.begin(), x.end(), ax.begin(), [](float v) { return std::fabs(v); });
  const QuantWeightHost aw = abs_weight(w);
  ASSERT_TRUE(cpu::linear(aw.cpu, ax, n, bound, {.bf16_output = false}, nullptr).ok());

  auto dw = upload(w.data);
  auto ds = upload(w.scales);
  auto dx = upload(x);
  auto dcodes = alloc<uint16_t>(x.size());
  auto dscales = alloc<float>(x.size() / 32);
  auto dy = alloc<float>(n * out);
  QuantWeightView view{.format = w.cpu.format == WeightFormat::MXFP4 ? QuantWeightFormat::MXFP4
                                                                     : QuantWeightFormat::FP8Block,
                       .out = out, .in = in, .data = dw.get(), .scales = ds.get(),
                       .block_out = w.cpu.block_out, .block_in = w.cpu.block_in};
  const SplitKSize split = splitk_workspace_size(view);
  auto dpart = alloc<float>(split.partial_floats);
  auto dcount = alloc<unsigned>(split.counters);
  ASSERT_TRUE(dcount.zero().ok());
  ActWorkspace ws{dcodes.get(), dscales.get(), n * in,
                  SplitKWorkspace{dpart.get(), dcount.get(), split.partial_floats, split.counters}};
  // Exact products, tensor-core block sums, another order of the blocks (cuda_test_util.h kBlockSumTol).
  const Tolerance& tol = testing::kBlockSumTol;
  const std::string tag = name + " " + std::to_string(out) + "x" + std::to_string(in) + " n=" + std::to_string(n);
  for (int rep = 0; rep < 2; ++rep) {  // the second run checks that split-K re-armed its counters
    const Status s = linear_quantized(view, dx.get(), n, ws, dy.get(), true, nullptr);
    ASSERT_TRUE(s.ok()) << s.error().message;
    EXPECT_TRUE(parity(tag + (split.counters ? " splitk" : ""), download(dy), want, tol, bound));
  }
  if (split.counters) {  // the same weight without the split-K workspace: one block per row tile
    ASSERT_TRUE(dy.zero().ok());
    const Status s = gemv_quantized(view, dcodes.get(), dscales.get(), n, dy.get(), true, nullptr);
    ASSERT_TRUE(s.ok()) << s.error().message;
    EXPECT_TRUE(parity(tag + " unsplit", download(dy), want, tol, bound));
  }
}

TEST(CudaGemvFp8, MatchesCpuLinear) {
  CEDAR_REQUIRE_GPU();
  check_gemv(random_fp8_weight(1280, 5120, 32, 31), 1, 32, "gemv_fp8");   // wq_a
  check_gemv(random_fp8_weight(512, 4096, 32, 33), 3, 34, "gemv_fp8");
  check_gemv(random_fp8_weight(100, 256, 32, 35), 8, 36, "gemv_fp8");     // out % 16 != 0, full tile
  check_gemv(random_fp8_weight(40, 96, 32, 37), 11, 38, "gemv_fp8");      // n > 8: two token tiles
  check_gemv(random_fp8_weight(64, 2048, 32, 47), 10, 48, "gemv_fp8");    // split-K with two token tiles
  check_gemv(random_fp8_weight(256, 512, 128, 39), 2, 40, "gemv_fp8_b128");  // V4: 128×128 blocks
  // gemv_warps: wq_b's K (40 blocks = 10 chunks: 5 warps); shared w2's K (18 chunks: 6 warps unsplit,
  // 9 per split: 5 warps).
  check_gemv(random_fp8_weight(256, 1280, 32, 49), 1, 50, "gemv_fp8");
  check_gemv(random_fp8_weight(64, 2304, 32, 51), 2, 52, "gemv_fp8");
  // 16-row scale blocks (block_out 16, block_in 32): a scale row per row tile.
  check_gemv(random_fp8_weight(48, 256, 32, 53, 16), 3, 54, "gemv_fp8_b16x32");
  check_gemv(random_fp8_weight(1040, 2048, 32, 55, 16), 1, 56, "gemv_fp8_b16x32");
}

// A token's FP8 GEMV result must not depend on the tokens beside it (batch invariance: a decode row is
// computed as for the row alone). The kernel forms tokens 0..3 in one MMA pass and 4..7 in a second
// over the same weights, each (token, K block) sum in the same k slots; the warp and split-K layout do
// not depend on n. So every token of an n-token call equals the same token alone (n = 1), bit for bit.
void check_gemv_fp8_tokens_alone(int64_t out, int64_t in, int64_t n, uint32_t seed) {
  const QuantWeightHost w = random_fp8_weight(out, in, 32, seed);
  const auto x = random_acts(static_cast<size_t>(n * in), seed + 1);
  auto dw = upload(w.data);
  auto ds = upload(w.scales);
  auto dx = upload(x);
  auto dcodes = alloc<uint16_t>(x.size());
  auto dscales = alloc<float>(x.size() / 32);
  ASSERT_TRUE(quantize_act_fp8(dx.get(), n, in, dcodes.get(), dscales.get(), nullptr).ok());
  const QuantWeightView view{.format = QuantWeightFormat::FP8Block, .out = out, .in = in, .data = dw.get(),
                             .scales = ds.get(), .block_out = 32, .block_in = 32};
  const SplitKSize split = splitk_workspace_size(view);
  auto dpart = alloc<float>(split.partial_floats);
  auto dcount = alloc<unsigned>(split.counters);
  ASSERT_TRUE(dcount.zero().ok());
  const SplitKWorkspace ws{dpart.get(), dcount.get(), split.partial_floats, split.counters};
  auto dy = alloc<float>(static_cast<size_t>(n * out));
  ASSERT_TRUE(gemv_quantized(view, dcodes.get(), dscales.get(), n, dy.get(), false, nullptr, ws).ok());
  const auto together = download(dy);
  auto d1 = alloc<float>(static_cast<size_t>(out));
  int64_t differ = 0;
  for (int64_t j = 0; j < n; ++j) {
    ASSERT_TRUE(gemv_quantized(view, dcodes.get() + j * in, dscales.get() + j * (in / 32), 1, d1.get(), false,
                               nullptr, ws).ok());
    const auto alone = download(d1);
    for (int64_t r = 0; r < out; ++r)
      if (std::memcmp(&alone[r], &together[j * out + r], sizeof(float)) != 0 && differ++ == 0)
        ADD_FAILURE() << "first difference: token " << j << " row " << r << ": alone " << alone[r] << ", among " << n
                      << " tokens " << together[j * out + r];
  }
  std::printf("PARITY gemv_fp8 %lldx%lld n=%lld%s tokens alone vs together: %lld of %lld differ (bit-exact required)\n",
              static_cast<long long>(out), static_cast<long long>(in), static_cast<long long>(n),
              split.counters ? " splitk" : "", static_cast<long long>(differ), static_cast<long long>(n * out));
  EXPECT_EQ(differ, 0);
}

TEST(CudaGemvFp8, TokenResultsDoNotDependOnTheBatch) {
  CEDAR_REQUIRE_GPU();
  check_gemv_fp8_tokens_alone(256, 1280, 8, 81);  // wq_b's K: 40 blocks, both passes
  check_gemv_fp8_tokens_alone(64, 2048, 6, 82);   // split-K, a partial second pass
  check_gemv_fp8_tokens_alone(100, 96, 3, 83);    // odd K blocks (a pair half past the end), partial tile
}

TEST(CudaGemvMxfp4, MatchesCpuLinear) {
  CEDAR_REQUIRE_GPU();
  check_gemv(random_mxfp4_weight(2304, 5120, 41), 1, 42, "gemv_mxfp4");  // expert w1/w3
  check_gemv(random_mxfp4_weight(5120, 2304, 43), 2, 44, "gemv_mxfp4");  // expert w2
  check_gemv(random_mxfp4_weight(48, 64, 45), 9, 46, "gemv_mxfp4");
}

// Several matrices in one launch (the routed experts of a token): each item against cpu::linear.
void check_grouped(bool fp4, int64_t count, int64_t out, int64_t in, int64_t n, bool with_splitk, uint32_t seed) {
  std::vector<QuantWeightHost> hw;
  std::vector<std::vector<float>> xs, want(count), bound(count);
  for (int64_t i = 0; i < count; ++i) {
    hw.push_back(fp4 ? random_mxfp4_weight(out, in, seed + 10 * i) : random_fp8_weight(out, in, 32, seed + 10 * i));
    xs.push_back(random_acts(n * in, seed + 10 * i + 1));
    want[i].resize(n * out);
    bound[i].resize(n * out);
    ASSERT_TRUE(cpu::linear(hw[i].cpu, xs[i], n, want[i], {.bf16_output = true}, nullptr).ok());
    std::vector<float> ax(xs[i].size());
    std::transform(xs[i].begin(), xs[i].end(), ax.begin(), [](float v) { return std::fabs(v); });
    ASSERT_TRUE(cpu::linear(abs_weight(hw[i]).cpu, ax, n, bound[i], {.bf16_output = false}, nullptr).ok());
  }
  std::vector<DeviceBuffer<uint8_t>> dw, ds;
  std::vector<DeviceBuffer<uint16_t>> dcodes;
  std::vector<DeviceBuffer<float>> dx, dscales, dy;
  std::vector<GemvGroupItem> items;
  for (int64_t i = 0; i < count; ++i) {
    dw.push_back(upload(hw[i].data));
    ds.push_back(upload(hw[i].scales));
    dx.push_back(upload(xs[i]));
    dcodes.push_back(alloc<uint16_t>(n * in));
    dscales.push_back(alloc<float>(n * in / 32));
    dy.push_back(alloc<float>(n * out));
    ASSERT_TRUE(quantize_act_fp8(dx[i].get(), n, in, dcodes[i].get(), dscales[i].get(), nullptr).ok());
    items.push_back(GemvGroupItem{dw[i].get(), ds[i].get(), dcodes[i].get(), dscales[i].get(), dy[i].get()});
  }
  const QuantWeightView shape{.format = fp4 ? QuantWeightFormat::MXFP4 : QuantWeightFormat::FP8Block, .out = out, .in = in};
  const SplitKSize split = with_splitk ? splitk_workspace_size(shape, count) : SplitKSize{};
  if (with_splitk) {
    ASSERT_GT(split.counters, 0) << "this shape was meant to exercise split-K";
  }
  auto dpart = alloc<float>(split.partial_floats);
  auto dcount = alloc<unsigned>(split.counters);
  ASSERT_TRUE(dcount.zero().ok());
  const Status s = gemv_quantized_grouped(shape, items.data(), count, n, true, nullptr,
                                          SplitKWorkspace{dpart.get(), dcount.get(), split.partial_floats, split.counters});
  ASSERT_TRUE(s.ok()) << s.error().message;
  // Same tolerance and reasons as check_gemv.
  const Tolerance& tol = testing::kBlockSumTol;
  for (int64_t i = 0; i < count; ++i)
    EXPECT_TRUE(parity(std::string(fp4 ? "gemv_mxfp4" : "gemv_fp8") + " grouped " + std::to_string(i) + "/" +
                           std::to_string(count) + " " + std::to_string(out) + "x" + std::to_string(in) +
                           " n=" + std::to_string(n) + (with_splitk ? " splitk" : ""),
                       download(dy[i]), want[i], tol, bound[i]));
}

TEST(CudaGemvGrouped, MatchesCpuPerMatrix) {
  CEDAR_REQUIRE_GPU();
  check_grouped(true, 3, 128, 2048, 3, true, 61);   // MXFP4 experts, split-K per group member
  check_grouped(false, 2, 72, 1024, 1, false, 62);  // FP8, partial row tile
  check_grouped(true, 18, 32, 64, 9, false, 63);    // more than one launch of 16, two token tiles
}

TEST(CudaGemv, RejectsBadShapes) {
  CEDAR_REQUIRE_GPU();
  QuantWeightView w{.format = QuantWeightFormat::FP8Block, .out = 16, .in = 40,
                    .data = reinterpret_cast<const uint8_t*>(16), .scales = reinterpret_cast<const uint8_t*>(16)};
  const Status s = gemv_quantized(w, nullptr, nullptr, 1, nullptr, true, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("in=40"), std::string::npos) << s.error().message;
  // FP8 rows are read 16 bytes per lane: weight data off a 16-byte boundary is refused before any launch.
  const QuantWeightView odd{.format = QuantWeightFormat::FP8Block, .out = 16, .in = 64,
                            .data = reinterpret_cast<const uint8_t*>(24), .scales = reinterpret_cast<const uint8_t*>(16),
                            .block_out = 16, .block_in = 32};
  const Status a = gemv_quantized(odd, nullptr, nullptr, 1, nullptr, true, nullptr);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("16-byte aligned"), std::string::npos) << a.error().message;
}

// ---- fused mHC -----------------------------------------------------------------------------------

void check_mhc(int64_t n, int64_t d, bool with_expand, uint32_t seed) {
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

  // CPU oracle: expand, collapse with the given weights, then the coefficients of the new streams.
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

  auto dX = upload(X);
  auto dy = upload(y);
  auto dpost = upload(post);
  auto dcomb = upload(comb);
  auto dcw = upload(cw);
  auto dfn = upload(fn);
  auto dbase = upload(base);
  auto dscale = upload(scale);
  auto dXo = alloc<float>(X.size());
  auto dcol = alloc<float>(collapsed.size());
  auto dmix = alloc<float>(n * n_mix);
  auto dpart = alloc<float>(mhc_workspace_floats(n, d));
  auto dcount = alloc<unsigned>(1);
  ASSERT_TRUE(dcount.zero().ok());
  MhcFusedArgs a{.n = n, .hc = hc, .d = d, .X = dX.get(), .y = with_expand ? dy.get() : nullptr,
                 .post = dpost.get(), .comb = dcomb.get(), .X_out = dXo.get(), .collapse_w = dcw.get(),
                 .collapsed = dcol.get(), .fn = dfn.get(), .base = dbase.get(), .scale = dscale.get(),
                 .mix_out = dmix.get()};
  for (int rep = 0; rep < 2; ++rep) {  // the second launch checks that the kernel re-armed its counter
    const Status s = mhc_fused(a, MhcWorkspace{dpart.get(), dcount.get()}, nullptr);
    ASSERT_TRUE(s.ok()) << s.error().message;
  }
  const std::string tag = std::to_string(n) + "x4x" + std::to_string(d) + (with_expand ? "" : " no-expand");
  // Expand and collapse are the same products and sums in the same order without FMA contraction:
  // bit-exact.
  const Tolerance exact{.max_nmse = 0, .min_cosine = 0.0, .rel = 0, .abs = 0};
  if (with_expand) {
    EXPECT_TRUE(parity("mhc expand " + tag, download(dXo), X_new, exact));
  }
  EXPECT_TRUE(parity("mhc collapse " + tag, download(dcol), collapsed, exact));
  // The 24 dot products over 4·d channels and the sum of squares are summed in another order
  // (relative error ~1e-6 of m); sigmoid, softmax and the Sinkhorn normalizations are smooth and
  // contracting, so the coefficients (all in [0, 2]) agree to ~1e-6; 2e-5 leaves headroom.
  const Tolerance coeff{.max_nmse = 1e-9, .min_cosine = 0.9999999, .rel = 2e-5, .abs = 2e-5};
  EXPECT_TRUE(parity("mhc coefficients " + tag, download(dmix), mix_want, coeff));
}

TEST(CudaMhcFused, MatchesCpuSinglePass) {
  CEDAR_REQUIRE_GPU();
  check_mhc(1, 5120, true, 51);   // V4.1 decode
  check_mhc(3, 256, true, 52);
  check_mhc(9, 128, true, 53);    // two token tiles
  check_mhc(2, 512, false, 54);   // first site: no expand
}

TEST(CudaMhcFused, RejectsUnsupportedShapes) {
  CEDAR_REQUIRE_GPU();
  MhcFusedArgs a{.n = 1, .hc = 4, .d = 100};
  const Status s = mhc_fused(a, MhcWorkspace{}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("d=100"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace cedar::cuda
