// The cuBLASLt path of the FP8 / MXFP4 prefill GEMMs (gemm_kernels.h: quant_gemm / swiglu_gemm with
// `blas`, dequant_weight_bf16, act_codes_to_bf16, quantize_act_bf16) against the CPU oracle: the
// dequantizations bit for bit (the reference's own formulas), the GEMMs with quant_gemm's tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/gemm_kernels.h"
#include "cuda_test_util.h"
#include "gemm_test_util.h"
#include "model/moe.h"
#include "model/weight_binding.h"

namespace cedar::cuda {
namespace {

using testing::alloc;
using testing::device_view;
using testing::download;
using testing::parity;
using testing::pool;
using testing::QuantWeightHost;
using testing::Tolerance;
using testing::upload;

// The parity checks take testing::kBlockSumTol, quant_gemm's tolerance: every product is exact on both sides;
// here the sums run in cuBLAS's fp32 order instead of per-32 blocks added in K order — a reassociation of exact
// products like split-K.

size_t count_bit_mismatches(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, std::string* first) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (got[i] != want[i] && bad++ == 0 && first)
      *first =
          "element " + std::to_string(i) + ": gpu 0x" + std::to_string(got[i]) + " cpu 0x" + std::to_string(want[i]);
  return got.size() == want.size() ? bad : std::max<size_t>(bad, 1);
}

// The weight dequantization is the reference's own (model/weight_binding.cpp dequantize_fp8_block_to_bf16,
// i.e. f32_to_bf16(e4m3_to_f32(w)·ue8m0_to_f32(s))) bit for bit, special codes and scales included.
TEST(CudaGemmBlas, DequantWeightIsTheReferencesBf16) {
  CEDAR_REQUIRE_GPU();
  for (const int64_t block : {int64_t{32}, int64_t{128}}) {
    QuantWeightHost w = testing::random_fp8_weight(256, 512, block, 1 + static_cast<uint32_t>(block));
    const uint8_t codes[] = {0x00, 0x80, 0x01, 0x81, 0x07, 0x08, 0x7E, 0xFE, 0x7F, 0xFF, 0x38};
    for (size_t i = 0; i < std::size(codes); ++i) w.data[i * 37] = codes[i];
    const uint8_t scales[] = {0, 1, 100, 127, 200, 254, 0xFF};
    for (size_t i = 0; i < std::size(scales) && i < w.scales.size(); ++i) w.scales[i * 3 % w.scales.size()] = scales[i];
    const std::vector<uint16_t> want = dequantize_fp8_block_to_bf16(w.cpu, nullptr);
    auto dd = upload(w.data), ds = upload(w.scales);
    auto dout = alloc<uint16_t>(want.size());
    const Status s = dequant_weight_bf16(device_view(w, dd, ds), dout.get(), nullptr);
    ASSERT_TRUE(s.ok()) << s.error().message;
    std::string first;
    const size_t bad = count_bit_mismatches(download(dout), want, &first);
    std::printf("PARITY %-40s n=%zu bit mismatches=%zu\n", ("dequant fp8 block " + std::to_string(block)).c_str(),
                want.size(), bad);
    EXPECT_EQ(bad, 0u) << first;
  }
  QuantWeightHost w = testing::random_mxfp4_weight(96, 256, 7);
  w.scales[0] = 0;
  w.scales[1] = 254;
  w.scales[2] = 0xFF;
  std::vector<uint16_t> want(96 * 256);
  for (int64_t r = 0; r < 96; ++r)
    for (int64_t k = 0; k < 256; ++k) {
      const uint8_t code = e2m1_get(w.data, static_cast<size_t>(r * 256 + k));
      want[r * 256 + k] = f32_to_bf16(e2m1_to_f32(code) * ue8m0_to_f32(w.scales[r * 8 + k / 32]));
    }
  auto dd = upload(w.data), ds = upload(w.scales);
  auto dout = alloc<uint16_t>(want.size());
  ASSERT_TRUE(dequant_weight_bf16(device_view(w, dd, ds), dout.get(), nullptr).ok());
  std::string first;
  const size_t bad = count_bit_mismatches(download(dout), want, &first);
  std::printf("PARITY %-40s n=%zu bit mismatches=%zu\n", "dequant mxfp4", want.size(), bad);
  EXPECT_EQ(bad, 0u) << first;
}

// The activation side: bf16 of the FP8 values cpu::linear multiplies (code·scale), from x directly and
// from quantize_act_fp8_blocked's codes; bit-exact.
TEST(CudaGemmBlas, ActivationsAreTheQuantizedValues) {
  CEDAR_REQUIRE_GPU();
  for (const int64_t block : {int64_t{32}, int64_t{128}}) {
    const int64_t m = 7, in = 1024;
    auto x = testing::random_acts(static_cast<size_t>(m * in), 31 + static_cast<uint32_t>(block));
    std::fill(x.begin() + 256, x.begin() + 384, 0.0f);  // all-zero blocks: amax clamps to 1e-4
    x[500] = -0.0f;
    const testing::QuantizedRows q = testing::cpu_quantize_rows(x, block);
    std::vector<uint16_t> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = f32_to_bf16(q.codes[i] * q.scales[i / block]);
    auto dx = upload(x);
    auto direct = alloc<uint16_t>(x.size()), via = alloc<uint16_t>(x.size());
    auto dcodes = alloc<uint16_t>(x.size());
    auto dscales = alloc<float>(x.size() / block);
    ASSERT_TRUE(quantize_act_bf16(dx.get(), m, in, block, direct.get(), nullptr).ok());
    ASSERT_TRUE(quantize_act_fp8_blocked(dx.get(), m, in, block, dcodes.get(), dscales.get(), nullptr).ok());
    ASSERT_TRUE(act_codes_to_bf16(dcodes.get(), dscales.get(), m, in, block, via.get(), nullptr).ok());
    for (const auto& [name, buf] :
         {std::pair<const char*, DeviceBuffer<uint16_t>*>{"quantize_act_bf16", &direct}, {"act_codes_to_bf16", &via}}) {
      std::string first;
      const size_t bad = count_bit_mismatches(download(*buf), want, &first);
      std::printf("PARITY %-40s n=%zu bit mismatches=%zu\n", (std::string(name) + " " + std::to_string(block)).c_str(),
                  want.size(), bad);
      EXPECT_EQ(bad, 0u) << name << " block " << block << ": " << first;
    }
  }
  // quantize_act_fp8 takes its 4-values-per-thread kernel for 16-byte aligned x and the one-value
  // kernel otherwise: both give the same codes and scales.
  const int64_t m = 3, in = 512;
  const auto x = testing::random_acts(static_cast<size_t>(m * in), 57);
  std::vector<float> padded(x.size() + 1);
  std::copy(x.begin(), x.end(), padded.begin() + 1);
  auto da = upload(x), du = upload(padded);
  auto ca = alloc<uint16_t>(x.size()), cu = alloc<uint16_t>(x.size());
  auto sa = alloc<float>(x.size() / 32), su = alloc<float>(x.size() / 32);
  ASSERT_TRUE(quantize_act_fp8(da.get(), m, in, ca.get(), sa.get(), nullptr).ok());
  ASSERT_TRUE(quantize_act_fp8(du.get() + 1, m, in, cu.get(), su.get(), nullptr).ok());
  EXPECT_EQ(download(ca), download(cu)) << "quantize_act_fp8: aligned and unaligned kernels differ (codes)";
  EXPECT_EQ(download(sa), download(su)) << "quantize_act_fp8: aligned and unaligned kernels differ (scales)";
}

// quant_gemm through cuBLASLt against cpu::linear (rows `ranges`, all if empty); the weight given
// pre-dequantized must give the same bits as the one dequantized into the scratch.
void check_blas_gemm(BlasContext& blas, const QuantWeightHost& w, int64_t m, int64_t act_block,
                     std::vector<std::pair<int64_t, int64_t>> ranges, uint32_t seed, const std::string& name) {
  const int64_t out = w.cpu.out, in = w.cpu.in;
  if (ranges.empty()) ranges.push_back({0, out});
  const auto x = testing::random_acts(static_cast<size_t>(m * in), seed);
  auto dw = upload(w.data), ds = upload(w.scales);
  auto dx = upload(x);
  auto dcodes = alloc<uint16_t>(static_cast<size_t>(m * in));
  auto dscales = alloc<float>(static_cast<size_t>(m * in / act_block));
  auto dy = alloc<float>(static_cast<size_t>(m * out));
  ASSERT_TRUE(quantize_act_fp8_blocked(dx.get(), m, in, act_block, dcodes.get(), dscales.get(), nullptr).ok());
  const QuantWeightView view = device_view(w, dw, ds);
  const int64_t elems = quant_gemm_blas_elems(view, m, false);
  auto scratch = alloc<uint16_t>(static_cast<size_t>(elems));
  QuantGemmArgs a{.w = view,
                  .act_codes = dcodes.get(),
                  .act_scales = dscales.get(),
                  .m = m,
                  .act_block = act_block,
                  .y = dy.get(),
                  .bf16_output = true};
  a.blas = &blas;
  QuantGemmWorkspace ws;
  ws.bf16 = scratch.get();
  ws.bf16_elems = elems;
  Status s = quant_gemm(a, ws, nullptr);
  ASSERT_TRUE(s.ok()) << s.error().message;
  const auto y = download(dy);
  for (const auto& [r0, count] : ranges) {
    const auto ref = testing::reference_rows(w, x, m, r0, count, act_block, true, &pool());
    const auto got = testing::columns(y, m, out, r0, count);
    const std::string tag = name + " " + std::to_string(out) + "x" + std::to_string(in) + " m=" + std::to_string(m) +
                            " rows[" + std::to_string(r0) + "+" + std::to_string(count) + "] cuBLASLt";
    EXPECT_TRUE(parity(tag, got, ref.want, testing::kBlockSumTol, ref.bound));
    std::printf("EXACT  %-60s %zu / %zu outputs bit-equal to cpu::linear\n", tag.c_str(),
                testing::count_equal(got, ref.want), got.size());
  }
  // The weight dequantized once and kept (w_bf16): same GEMM, same bits.
  auto wb = alloc<uint16_t>(static_cast<size_t>(out * in));
  ASSERT_TRUE(dequant_weight_bf16(view, wb.get(), nullptr).ok());
  a.w_bf16 = wb.get();
  ASSERT_TRUE(dy.zero().ok());
  s = quant_gemm(a, ws, nullptr);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(std::memcmp(download(dy).data(), y.data(), y.size() * sizeof(float)), 0)
      << name << ": pre-dequantized weight gives other bits than the scratch path";
}

TEST(CudaGemmBlas, QuantGemmMatchesCpuLinear) {
  CEDAR_REQUIRE_GPU();
  CEDAR_REQUIRE_BLAS(blas);
  check_blas_gemm(blas, testing::random_fp8_weight(100, 96, 32, 1), 37, 32, {}, 2, "fp8");
  check_blas_gemm(blas, testing::random_fp8_weight(64, 2048, 32, 7), 1, 32, {}, 8, "fp8");
  check_blas_gemm(blas, testing::random_fp8_weight(256, 512, 128, 11), 50, 32, {}, 12, "fp8_b128");
  check_blas_gemm(blas, testing::random_fp8_weight(384, 640, 128, 13), 70, 128, {}, 14, "fp8_b128_a128");
  struct Shape {
    const char* name;
    int64_t out, in;
  };
  const Shape shapes[] = {{"wq_a", 1280, 5120}, {"wq_b", 32768, 1280},     {"wkv", 512, 5120},
                          {"wo_b", 5120, 8192}, {"shared_w2", 5120, 2304}, {"engram_wkv", 25600, 6144},
                          {"wo_a", 8192, 4096}};
  uint32_t seed = 100;
  for (const Shape& sh : shapes) {
    const auto w = testing::random_fp8_weight(sh.out, sh.in, 32, seed++);
    std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 256}, {sh.out - 256, 256}};
    if (sh.out <= 1280) ranges = {};
    check_blas_gemm(blas, w, 300, 32, ranges, seed++, std::string("fp8 ") + sh.name);
  }
  check_blas_gemm(blas, testing::random_mxfp4_weight(200, 96, 23), 33, 32, {}, 24, "mxfp4");
  check_blas_gemm(blas, testing::random_mxfp4_weight(2304, 5120, 25), 130, 32, {{0, 256}, {2048, 256}}, 26,
                  "mxfp4 expert_w1");
  check_blas_gemm(blas, testing::random_mxfp4_weight(5120, 2304, 27), 70, 32, {{0, 512}, {4608, 512}}, 28,
                  "mxfp4 expert_w2");
  check_blas_gemm(blas, testing::random_mxfp4_weight(256, 512, 29), 40, 128, {}, 30, "mxfp4_a128");
}

// The shared expert through cuBLASLt: swiglu_gemm (blas) then quant_gemm (blas), with
// testing::check_swiglu_expert's three checks (those of gemm_quant_cutest.cpp): h vs the CPU's h
// (<= 0.1 % of the quantized values may differ: only a bf16 rounding of g / u or exp's float rounding
// falling the other way changes one), W2 of the GPU's h vs cpu::linear (GEMM tolerance), end to end vs
// expert_forward (NMSE).
void check_blas_swiglu(BlasContext& blas, bool fp4, int64_t inter, int64_t d, int64_t m, int64_t act_block,
                       bool weighted, uint32_t seed, const std::string& name) {
  DeviceBuffer<uint16_t> bscratch, s2b;
  DeviceBuffer<float> gu;
  testing::check_swiglu_expert(
      {.fp4 = fp4, .inter = inter, .d = d, .m = m, .act_block = act_block, .weighted = weighted, .seed = seed}, name,
      "cuBLASLt", testing::kBlockSumTol,
      [&](SwigluGemmArgs& a) {
        const SwigluBlasSizes sz = swiglu_gemm_blas_sizes(a.w1, m, false);
        bscratch = alloc<uint16_t>(static_cast<size_t>(sz.bf16_elems));
        gu = alloc<float>(static_cast<size_t>(sz.floats));
        a.blas = &blas;
        a.bf16_scratch = bscratch.get();
        a.bf16_scratch_elems = sz.bf16_elems;
        a.gu_scratch = gu.get();
        a.gu_scratch_floats = sz.floats;
        return swiglu_gemm(a, nullptr);
      },
      [&](QuantGemmArgs& b) {
        b.blas = &blas;
        const int64_t e2 = quant_gemm_blas_elems(b.w, m, false);
        s2b = alloc<uint16_t>(static_cast<size_t>(e2));
        QuantGemmWorkspace ws;
        ws.bf16 = s2b.get();
        ws.bf16_elems = e2;
        return quant_gemm(b, ws, nullptr);
      });
}

TEST(CudaGemmBlas, SwigluMatchesCpu) {
  CEDAR_REQUIRE_GPU();
  CEDAR_REQUIRE_BLAS(blas);
  check_blas_swiglu(blas, false, 2304, 5120, 300, 32, false, 61, "swiglu fp8 shared");  // released shape
  check_blas_swiglu(blas, false, 256, 384, 130, 128, false, 63, "swiglu fp8 b128");     // V4 blocks
  check_blas_swiglu(blas, true, 384, 512, 77, 32, true, 71, "swiglu mxfp4 weighted");
}

TEST(CudaGemmBlas, RejectsMissingScratch) {
  CEDAR_REQUIRE_GPU();
  CEDAR_REQUIRE_BLAS(blas);
  const auto* fake = reinterpret_cast<const uint8_t*>(256);
  QuantGemmArgs a{.w = {.format = QuantWeightFormat::FP8Block, .out = 64, .in = 64, .data = fake, .scales = fake},
                  .act_codes = reinterpret_cast<const uint16_t*>(256),
                  .act_scales = reinterpret_cast<const float*>(256),
                  .m = 4,
                  .y = reinterpret_cast<float*>(256)};
  a.blas = &blas;
  const Status s = quant_gemm(a, {}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("scratch"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace cedar::cuda
