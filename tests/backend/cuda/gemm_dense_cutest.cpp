// Parity of the BF16 / F32-weight GEMMs through cuBLASLt (gemm_kernels.h: dense_gemm) with cpu::linear.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/gemm_kernels.h"
#include "cuda_test_util.h"
#include "gemm_test_util.h"

namespace cedar::cuda {
namespace {

using testing::alloc;
using testing::download;
using testing::parity;
using testing::pool;
using testing::Tolerance;
using testing::upload;

struct DenseWeightHost {
  cpu::LinearWeight cpu;
  std::vector<uint8_t> bytes;
};
DenseWeightHost random_dense_weight(DenseWeightType type, int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  DenseWeightHost w;
  w.bytes.resize(static_cast<size_t>(out * in * (type == DenseWeightType::BF16 ? 2 : 4)));
  for (int64_t i = 0; i < out * in; ++i) {
    const float v = round_to_bf16(nd(rng));
    if (type == DenseWeightType::BF16) {
      const uint16_t b = f32_to_bf16(v);
      std::memcpy(w.bytes.data() + 2 * i, &b, 2);
    } else {
      const float f = nd(rng);  // F32 weights need not be bf16 values
      std::memcpy(w.bytes.data() + 4 * i, &f, 4);
    }
  }
  w.cpu = {.format = type == DenseWeightType::BF16 ? WeightFormat::BF16 : WeightFormat::F32,
           .out = out,
           .in = in,
           .data = w.bytes.data()};
  return w;
}

// |W| of a dense weight (sign bits cleared), for the Σ|x·w| bound.
DenseWeightHost abs_dense(const DenseWeightHost& w) {
  DenseWeightHost a = w;
  const bool bf16 = w.cpu.format == WeightFormat::BF16;
  for (size_t i = bf16 ? 1 : 3; i < a.bytes.size(); i += bf16 ? 2 : 4) a.bytes[i] &= 0x7F;
  a.cpu.data = a.bytes.data();
  return a;
}

// Both sides add the same exact (BF16) or fp32-rounded (F32) products in fp32, in different orders:
// each sum's rounding error is at most (K−1)·2^-24·Σ|x·w| (a worst case, typically √K of that), so the
// two differ by at most 2K·2^-24·Σ|x·w|; with bf16 output add one rounding flip (2^-7·|y|).
Tolerance dense_tol(int64_t k, bool bf16_output) {
  return Tolerance{.max_nmse = 1e-6,
                   .min_cosine = 0.999999,
                   .rel = bf16_output ? 0x1p-7 : 0.0,
                   .abs = 0,
                   .bound_scale = 2.0 * static_cast<double>(k) * 0x1p-24};
}

void check_dense(BlasContext& ctx, DenseWeightType type, int64_t out, int64_t in, int64_t n, bool bf16_output,
                 uint32_t seed, const std::string& name) {
  const DenseWeightHost w = random_dense_weight(type, out, in, seed);
  const auto x = testing::random_acts(static_cast<size_t>(n * in), seed + 1);
  std::vector<float> want(static_cast<size_t>(n * out)), bound(want.size());
  ASSERT_TRUE(cpu::linear(w.cpu, x, n, want, {.bf16_output = bf16_output}, &pool()).ok());
  ASSERT_TRUE(cpu::linear(abs_dense(w).cpu, testing::abs_values(x), n, bound, {.bf16_output = false}, &pool()).ok());
  auto dw = upload(w.bytes);
  auto dx = upload(x);
  auto dy = alloc<float>(want.size());
  DenseGemmArgs a{.type = type,
                  .w = dw.get(),
                  .out = out,
                  .in = in,
                  .x = dx.get(),
                  .n = n,
                  .y = dy.get(),
                  .bf16_output = bf16_output};
  const int64_t ws = dense_gemm_workspace_elems(a);
  auto dws = alloc<uint16_t>(static_cast<size_t>(std::max<int64_t>(ws, 1)));
  for (int rep = 0; rep < 2; ++rep) {  // the second call reuses the cached plan
    const Status s = dense_gemm(ctx, a, dws.get(), ws, nullptr);
    ASSERT_TRUE(s.ok()) << s.error().message;
  }
  const std::string tag = name + " " + std::to_string(out) + "x" + std::to_string(in) + " n=" + std::to_string(n);
  EXPECT_TRUE(parity(tag, download(dy), want, dense_tol(in, bf16_output), bound));
}

TEST(CudaDenseGemm, Bf16MatchesCpuLinear) {
  CEDAR_REQUIRE_GPU();
  CEDAR_REQUIRE_BLAS(ctx);
  std::printf("using %s\n", ctx.version().c_str());
  check_dense(ctx, DenseWeightType::BF16, 512, 5120, 100, false, 1, "compressor wkv (fp32 out)");
  check_dense(ctx, DenseWeightType::BF16, 32, 5120, 77, true, 2, "indexer weights_proj");
  check_dense(ctx, DenseWeightType::BF16, 128, 512, 33, true, 3, "indexer wk");
  check_dense(ctx, DenseWeightType::BF16, 1000, 5120, 20, false, 4, "head rows (fp32 logits)");
  check_dense(ctx, DenseWeightType::BF16, 7, 40, 3, true, 5, "odd shape");
}

TEST(CudaDenseGemm, F32MatchesCpuLinear) {
  CEDAR_REQUIRE_GPU();
  CEDAR_REQUIRE_BLAS(ctx);
  check_dense(ctx, DenseWeightType::F32, 64, 256, 10, false, 11, "f32");
  check_dense(ctx, DenseWeightType::F32, 100, 96, 37, true, 12, "f32 bf16-out");
}

// wo_a: 8 groups of o_lora rows of one [groups·o_lora, in_g] weight, group g applied to columns
// [g·in_g, (g+1)·in_g) of o, writing columns [g·o_lora, ...) of u — as attention_output_projection.
TEST(CudaDenseGemm, GroupedWoAMatchesCpu) {
  CEDAR_REQUIRE_GPU();
  CEDAR_REQUIRE_BLAS(ctx);
  const int64_t groups = 8, o_lora = 128, in_g = 256, n = 33;
  const DenseWeightHost w = random_dense_weight(DenseWeightType::BF16, groups * o_lora, in_g, 21);
  const auto o = testing::random_acts(static_cast<size_t>(n * groups * in_g), 22);
  std::vector<float> want(static_cast<size_t>(n * groups * o_lora)), bound(want.size());
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<float> og(static_cast<size_t>(n * in_g)), ug(static_cast<size_t>(n * o_lora)), bg(ug.size());
    for (int64_t t = 0; t < n; ++t) std::copy_n(o.begin() + t * groups * in_g + g * in_g, in_g, og.begin() + t * in_g);
    cpu::LinearWeight wg = w.cpu;
    wg.out = o_lora;
    wg.data = w.bytes.data() + g * o_lora * in_g * 2;
    ASSERT_TRUE(cpu::linear(wg, og, n, ug, {}, &pool()).ok());
    const DenseWeightHost aw = abs_dense(w);
    cpu::LinearWeight awg = aw.cpu;
    awg.out = o_lora;
    awg.data = aw.bytes.data() + g * o_lora * in_g * 2;
    ASSERT_TRUE(cpu::linear(awg, testing::abs_values(og), n, bg, {.bf16_output = false}, &pool()).ok());
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(ug.begin() + t * o_lora, o_lora, want.begin() + (t * groups + g) * o_lora);
      std::copy_n(bg.begin() + t * o_lora, o_lora, bound.begin() + (t * groups + g) * o_lora);
    }
  }
  auto dw = upload(w.bytes);
  auto dx = upload(o);
  auto dy = alloc<float>(want.size());
  DenseGemmArgs a{.type = DenseWeightType::BF16,
                  .w = dw.get(),
                  .out = o_lora,
                  .in = in_g,
                  .x = dx.get(),
                  .n = n,
                  .ldx = groups * in_g,
                  .y = dy.get(),
                  .ldy = groups * o_lora,
                  .bf16_output = true,
                  .batch = groups,
                  .w_stride = o_lora * in_g,
                  .x_stride = in_g,
                  .y_stride = o_lora};
  const int64_t ws = dense_gemm_workspace_elems(a);
  auto dws = alloc<uint16_t>(static_cast<size_t>(ws));
  const Status s = dense_gemm(ctx, a, dws.get(), ws, nullptr);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_TRUE(parity("wo_a grouped 8x(128x256) n=33", download(dy), want, dense_tol(in_g, true), bound));
}

TEST(CudaDenseGemm, RejectsBadArguments) {
  CEDAR_REQUIRE_GPU();
  CEDAR_REQUIRE_BLAS(ctx);
  DenseGemmArgs a{.w = reinterpret_cast<const void*>(256),
                  .out = 8,
                  .in = 16,
                  .x = reinterpret_cast<const float*>(256),
                  .n = 2,
                  .ldx = 8,
                  .y = reinterpret_cast<float*>(256)};
  Status s = dense_gemm(ctx, a, nullptr, 0, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("ldx=8"), std::string::npos) << s.error().message;
  a.ldx = 0;
  s = dense_gemm(ctx, a, nullptr, 0, nullptr);  // BF16 needs the conversion workspace
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("workspace"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace cedar::cuda
