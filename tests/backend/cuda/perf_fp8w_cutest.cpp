// gemv_bf16 over an FP8 weight (attention_kernels.h Bf16GemvArgs::w_fp8 — wo_a as stored) against
// gemv_bf16 over the same weight dequantized by dequant_weight_bf16 (the reference's bf16 values,
// gemm_blas_cutest.cpp checks them bit for bit): the same operands, MMAs and order, so the outputs must
// be bit-identical, on the register fast path and on the exact fallback (NaN codes, extreme scales);
// and the finite case against cpu::linear with gemv_bf16's tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/gemm_kernels.h"
#include "cuda_test_util.h"
#include "gemm_test_util.h"
#include "model/weight_binding.h"

namespace cedar::cuda {
namespace {

using testing::alloc;
using testing::download;
using testing::parity;
using testing::QuantWeightHost;
using testing::Tolerance;
using testing::upload;

struct Case {
  int64_t out = 0, in = 0, groups = 1, n = 1, block = 32;
  bool bf16_output = true, specials = false, splitk = false;
  uint32_t seed = 1;
};

void check(const Case& c) {
  const int64_t rows = c.out * c.groups;
  QuantWeightHost w = testing::random_fp8_weight(rows, c.in, c.block, c.seed, 112);
  if (c.specials) {  // the exact fallback: NaN codes, zeros, subnormals, scales outside [20, 142]
    const uint8_t codes[] = {0x7F, 0xFF, 0x00, 0x80, 0x01, 0x87};
    for (size_t i = 0; i < std::size(codes); ++i) w.data[(i * 7919) % w.data.size()] = codes[i];
    const uint8_t scales[] = {0, 5, 19, 143, 200, 254, 0xFF};
    for (size_t i = 0; i < std::size(scales); ++i) w.scales[(i * 31 + 3) % w.scales.size()] = scales[i];
  }
  const auto x = testing::random_acts(static_cast<size_t>(c.n * c.groups * c.in), c.seed + 1);
  auto dw = upload(w.data), ds = upload(w.scales);
  auto dx = upload(x);
  const QuantWeightView view{QuantWeightFormat::FP8Block, rows, c.in, dw.get(), ds.get(), c.block, c.block};
  auto wb = alloc<uint16_t>(static_cast<size_t>(rows * c.in));
  ASSERT_TRUE(dequant_weight_bf16(view, wb.get(), nullptr).ok());
  const SplitKSize split = c.splitk ? gemv_bf16_splitk_size(c.out, c.in, c.groups) : SplitKSize{};
  auto part = alloc<float>(static_cast<size_t>(std::max<int64_t>(split.partial_floats, 1)));
  auto cnt = alloc<unsigned>(static_cast<size_t>(std::max<int64_t>(split.counters, 1)));
  ASSERT_TRUE(cnt.zero().ok());
  const SplitKWorkspace ws{part.get(), cnt.get(), split.partial_floats, split.counters};
  auto y8 = alloc<float>(static_cast<size_t>(c.n * rows)), y16 = alloc<float>(static_cast<size_t>(c.n * rows));
  Bf16GemvArgs a;
  a.out = c.out;
  a.in = c.in;
  a.groups = c.groups;
  a.x = dx.get();
  a.n = c.n;
  a.bf16_output = c.bf16_output;
  a.w = wb.get();
  a.y = y16.get();
  Status s = gemv_bf16(a, nullptr, ws);
  ASSERT_TRUE(s.ok()) << s.error().message;
  a.w = nullptr;
  a.w_fp8 = dw.get();
  a.w_scales = ds.get();
  a.block_out = a.block_in = c.block;
  a.y = y8.get();
  for (int rep = 0; rep < 2; ++rep) {
    s = gemv_bf16(a, nullptr, ws);
    ASSERT_TRUE(s.ok()) << s.error().message;
  }
  const auto got = download(y8), ref = download(y16);
  // The upload-time check: the specials (NaN codes, scales outside [20, 142]) must fail it; a random
  // weight passes, and the kernel without its per-chunk check gives the same bits.
  const bool fast = fp8_weight_fast(w.data.data(), static_cast<int64_t>(w.data.size()), w.scales.data(),
                                    static_cast<int64_t>(w.scales.size()));
  EXPECT_EQ(fast, !c.specials);
  if (fast) {
    a.w_fp8_fast = true;
    auto yf = alloc<float>(static_cast<size_t>(c.n * rows));
    a.y = yf.get();
    s = gemv_bf16(a, nullptr, ws);
    ASSERT_TRUE(s.ok()) << s.error().message;
    const auto gotf = download(yf);
    EXPECT_EQ(std::memcmp(gotf.data(), ref.data(), ref.size() * sizeof(float)), 0)
        << "w_fp8_fast: bits differ from gemv_bf16 on the dequantized weight";
  }
  const std::string tag = "gemv fp8w " + std::to_string(c.groups) + "x" + std::to_string(c.out) + "x" +
                          std::to_string(c.in) + " n=" + std::to_string(c.n) + " b" + std::to_string(c.block) +
                          (c.specials ? " specials" : "") + (split.counters ? " splitk" : "");
  size_t differ = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &ref[i], 4) != 0 && differ++ == 0) first = i;
  std::printf("PARITY %-48s n=%zu bit-differences vs gemv_bf16 on the dequantized weight: %zu\n", tag.c_str(),
              got.size(), differ);
  EXPECT_EQ(differ, 0u) << tag << ": first at " << first << ": fp8 " << got[first] << " bf16 " << ref[first];
  if (c.specials) return;
  // The finite case against the CPU: cpu::linear over the reference's bf16 weight, per group (the
  // gemv_bf16 tolerance: only the summation order differs, plus one bf16 rounding flip).
  const std::vector<uint16_t> wcpu = dequantize_fp8_block_to_bf16(w.cpu, nullptr);
  std::vector<float> want(got.size()), bound(got.size());
  for (int64_t g = 0; g < c.groups; ++g) {
    std::vector<uint8_t> wg(reinterpret_cast<const uint8_t*>(wcpu.data() + g * c.out * c.in),
                            reinterpret_cast<const uint8_t*>(wcpu.data() + (g + 1) * c.out * c.in));
    std::vector<uint8_t> ag = wg;
    for (size_t i = 1; i < ag.size(); i += 2) ag[i] &= 0x7F;  // |w|: clear the bf16 sign bits
    std::vector<float> xg(static_cast<size_t>(c.n * c.in)), axg(xg.size());
    for (int64_t t = 0; t < c.n; ++t) std::copy_n(x.begin() + (t * c.groups + g) * c.in, c.in, xg.begin() + t * c.in);
    for (size_t i = 0; i < xg.size(); ++i) axg[i] = std::fabs(xg[i]);
    std::vector<float> yg(static_cast<size_t>(c.n * c.out)), bg(yg.size());
    const cpu::LinearWeight lw{.format = WeightFormat::BF16, .out = c.out, .in = c.in, .data = wg.data()};
    const cpu::LinearWeight la{.format = WeightFormat::BF16, .out = c.out, .in = c.in, .data = ag.data()};
    ASSERT_TRUE(cpu::linear(lw, xg, c.n, yg, {.bf16_output = c.bf16_output}, nullptr).ok());
    ASSERT_TRUE(cpu::linear(la, axg, c.n, bg, {.bf16_output = false}, nullptr).ok());
    for (int64_t t = 0; t < c.n; ++t) {
      std::copy_n(yg.begin() + t * c.out, c.out, want.begin() + (t * c.groups + g) * c.out);
      std::copy_n(bg.begin() + t * c.out, c.out, bound.begin() + (t * c.groups + g) * c.out);
    }
  }
  const Tolerance tol{.max_nmse = c.bf16_output ? 1e-5 : 1e-9,
                      .min_cosine = 0.99999,
                      .rel = c.bf16_output ? 0x1p-7 : 0.0,
                      .abs = 0,
                      .bound_scale = (static_cast<double>(c.in) * 1.125 + 32) * 0x1p-24};
  EXPECT_TRUE(parity(tag + " vs cpu::linear", got, want, tol, bound));
}

TEST(CudaGemvFp8Weight, BitIdenticalToBf16OnTheDequantizedWeight) {
  CEDAR_REQUIRE_GPU();
  // wo_a: 8 groups of [1024, 4096] (FP8 [8192, 4096], 32×32 scales), decode and batched decode.
  for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{64}, int64_t{70}})
    check({.out = 1024, .in = 4096, .groups = 8, .n = n, .seed = 10 + static_cast<uint32_t>(n)});
  check({.out = 1024, .in = 4096, .groups = 8, .n = 2, .specials = true, .seed = 30});
  // Ungrouped, split-K, fp32 out, V4 128×128 blocks, ragged row tiles.
  check({.out = 300, .in = 512, .n = 9, .block = 128, .bf16_output = false, .splitk = true, .seed = 40});
  check({.out = 40, .in = 2080, .n = 5, .specials = true, .splitk = true, .seed = 41});
  check({.out = 96, .in = 256, .groups = 3, .n = 33, .seed = 42});
}

TEST(CudaGemvFp8Weight, RejectsBadArguments) {
  CEDAR_REQUIRE_GPU();
  auto dw = alloc<uint8_t>(1024);
  auto dx = alloc<float>(64);
  auto dy = alloc<float>(64);
  Bf16GemvArgs a;
  a.out = 4;
  a.in = 32;
  a.x = dx.get();
  a.y = dy.get();
  a.w_fp8 = dw.get();
  Status s = gemv_bf16(a, nullptr);  // no scales
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("scales"), std::string::npos) << s.error().message;
  a.w_scales = dw.get();
  a.w = reinterpret_cast<const uint16_t*>(dw.get());  // both weights
  s = gemv_bf16(a, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("exactly one"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace cedar::cuda
