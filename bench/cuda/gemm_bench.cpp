// Prefill GEMM benchmark (run on a GPU machine): TFLOP/s of the FP8 block-scaled GEMM (quant_gemm) at
// the released V4.1 shapes for 1k / 8k / 32k tokens, next to cuBLASLt bf16 at the same shape (bf16
// activations given, fp32 output), the MXFP4 expert shapes as plain GEMMs, and the grouped routed-expert
// pipeline (permute + W1/W3 + SwiGLU + W2 + combine) for 384 experts / top-6. The bf16 peak reference
// (cuBLASLt 8192³) is measured in the same run.
//
// Timing: CUDA events around `reps` back-to-back launches after one warm-up launch (each call is
// ≥ 10 µs, so launch overhead is noise); FLOPs = 2·M·N·K. Activations are random bf16 values; weights
// random bytes (no NaN codes) with scales that keep values finite.
//
// usage: gemm_bench [--json FILE] [--quick]   (--quick: M = 1k only)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/gemm_kernels.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/stream.h"

namespace cedar::cuda {
namespace {

template <typename T>
DeviceBuffer<T> must(Result<DeviceBuffer<T>> r) {
  if (!r.ok()) {
    std::fprintf(stderr, "gemm_bench: %s\n", r.error().message.c_str());
    std::exit(1);
  }
  return std::move(*r);
}
void must(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "gemm_bench: %s\n", s.error().message.c_str());
    std::exit(1);
  }
}

struct Rng {
  uint64_t x;
  explicit Rng(uint64_t seed) : x(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint32_t next() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return static_cast<uint32_t>(x >> 24);
  }
};

// lo + r % span per byte, or r & mask when span is 0.
DeviceBuffer<uint8_t> random_bytes(size_t n, uint64_t seed, uint8_t lo, uint8_t span, uint8_t mask = 0xFF) {
  std::vector<uint8_t> h(n);
  Rng rng(seed);
  for (auto& b : h) {
    const uint32_t r = rng.next();
    b = span ? static_cast<uint8_t>(lo + r % span) : static_cast<uint8_t>(r & mask);
  }
  return must(DeviceBuffer<uint8_t>::from_host(h));
}
// bf16 values in [-1, 1) as floats and as bf16 bits.
void random_bf16(size_t n, uint64_t seed, DeviceBuffer<float>* f32, DeviceBuffer<uint16_t>* bits) {
  std::vector<float> hf(f32 ? n : 0);
  std::vector<uint16_t> hb(bits ? n : 0);
  Rng rng(seed);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t r = rng.next();
    float v = static_cast<float>(static_cast<int32_t>(r & 0xFFFF) - 32768) / 32768.0f;
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u &= 0xFFFF0000u;  // truncate to a bf16 value
    std::memcpy(&v, &u, 4);
    if (f32) hf[i] = v;
    if (bits) hb[i] = static_cast<uint16_t>(u >> 16);
  }
  if (f32) *f32 = must(DeviceBuffer<float>::from_host(hf));
  if (bits) *bits = must(DeviceBuffer<uint16_t>::from_host(hb));
}

double time_us(cudaStream_t stream, int reps, const std::function<void()>& launch) {
  launch();
  must(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  EventTimer timer;
  must(timer.init());
  must(timer.start(stream));
  for (int r = 0; r < reps; ++r) launch();
  auto ms = timer.stop_ms(stream);
  must(ms.ok() ? Status::Ok() : Status(ms.error()));
  return static_cast<double>(*ms) * 1e3 / reps;
}
int reps_for(double flops) { return std::clamp(static_cast<int>(2e13 / std::max(flops, 1.0)), 3, 50); }

struct Row {
  std::string kernel, shape, plan;
  int64_t m = 0;
  double us = 0, tflops = 0, blas_us = 0, blas_tflops = 0, quant_us = 0;
};

void print_row(const Row& r) {
  std::printf("%-14s %-22s m=%-6lld %-13s %9.1f us %7.1f TFLOP/s", r.kernel.c_str(), r.shape.c_str(),
              static_cast<long long>(r.m), r.plan.c_str(), r.us, r.tflops);
  if (r.blas_us > 0)
    std::printf(" | cuBLAS bf16 %9.1f us %7.1f TFLOP/s | ratio %.2f", r.blas_us, r.blas_tflops,
                r.tflops / r.blas_tflops);
  if (r.quant_us > 0) std::printf(" | +act quant %.1f us", r.quant_us);
  std::printf("\n");
}

struct Shape {
  const char* name;
  int64_t out, in;
};

void bench_quant(BlasContext* blas, QuantWeightFormat fmt, const Shape& s, const std::vector<int64_t>& ms,
                 const DeviceBuffer<float>& x_f32, const DeviceBuffer<uint16_t>& x_bf16, cudaStream_t stream,
                 std::vector<Row>& rows) {
  const bool fp4 = fmt == QuantWeightFormat::MXFP4;
  const size_t w_bytes = fp4 ? s.out * s.in / 2 : s.out * s.in;
  const size_t s_bytes = fp4 ? s.out * s.in / 32 : ((s.out + 31) / 32) * (s.in / 32);
  auto w = random_bytes(w_bytes, 1, 0, 0, fp4 ? 0xFF : 0x7E);  // & 0x7E: no NaN codes
  auto sc = random_bytes(s_bytes, 2, 112, 8);
  const QuantWeightView view{fmt, s.out, s.in, w.get(), sc.get(), 32, 32};
  DeviceBuffer<uint16_t> wb;
  if (blas) random_bf16(static_cast<size_t>(s.out * s.in), 3, nullptr, &wb);
  for (const int64_t m : ms) {
    auto codes = must(DeviceBuffer<uint16_t>::allocate(m * s.in));
    auto scales = must(DeviceBuffer<float>::allocate(m * s.in / 32));
    auto y = must(DeviceBuffer<float>::allocate(m * s.out));
    const int64_t wsf = quant_gemm_workspace_floats(view, m);
    auto part = must(DeviceBuffer<float>::allocate(wsf));
    const double flops = 2.0 * m * s.out * s.in;
    const int reps = reps_for(flops);
    Row r{fp4 ? "mxfp4_gemm" : "fp8_gemm",
          std::string(s.name) + " " + std::to_string(s.out) + "x" + std::to_string(s.in), "", m};
    r.quant_us =
        time_us(stream, reps, [&] { must(quantize_act_fp8(x_f32.get(), m, s.in, codes.get(), scales.get(), stream)); });
    const QuantGemmPlan plan = quant_gemm_plan(view, m, true);
    r.plan = "tile" + std::to_string(plan.tile_m) + "/split" + std::to_string(plan.splits);
    QuantGemmArgs a{.w = view,
                    .act_codes = codes.get(),
                    .act_scales = scales.get(),
                    .m = m,
                    .act_block = 32,
                    .y = y.get(),
                    .bf16_output = true};
    r.us = time_us(stream, reps, [&] { must(quant_gemm(a, QuantGemmWorkspace{part.get(), wsf}, stream)); });
    r.tflops = flops / (r.us * 1e-6) / 1e12;
    if (blas) {
      DenseGemmArgs b{.type = DenseWeightType::BF16,
                      .w = wb.get(),
                      .out = s.out,
                      .in = s.in,
                      .x = nullptr,
                      .n = m,
                      .y = y.get(),
                      .bf16_output = false,
                      .x_bf16 = x_bf16.get()};
      r.blas_us = time_us(stream, reps, [&] { must(dense_gemm(*blas, b, nullptr, 0, stream)); });
      r.blas_tflops = flops / (r.blas_us * 1e-6) / 1e12;
    }
    print_row(r);
    rows.push_back(r);
    if (blas) {
      // quant_gemm's cuBLASLt path (exact bf16 dequantization): "_blas" dequantizes the weight into
      // scratch every call (dequant + act to bf16 + GEMM + bf16 rounding), "_blas_w" takes it
      // dequantized once (w_bf16) and the activations from quantize_act_bf16 (its time in the last
      // column, instead of quantize_act_fp8's).
      const int64_t elems = quant_gemm_blas_elems(view, m, false);
      auto scratch = must(DeviceBuffer<uint16_t>::allocate(elems));
      auto xq = must(DeviceBuffer<uint16_t>::allocate(m * s.in));
      auto wbf = must(DeviceBuffer<uint16_t>::allocate(s.out * s.in));
      must(dequant_weight_bf16(view, wbf.get(), stream));
      QuantGemmArgs c = a;
      c.blas = blas;
      QuantGemmWorkspace cws;
      cws.bf16 = scratch.get();
      cws.bf16_elems = elems;
      Row rb{r.kernel + "_blas", r.shape, "dequant/call", m};
      rb.us = time_us(stream, reps, [&] { must(quant_gemm(c, cws, stream)); });
      rb.tflops = flops / (rb.us * 1e-6) / 1e12;
      rb.quant_us = r.quant_us;
      print_row(rb);
      rows.push_back(rb);
      QuantGemmArgs cw = c;
      cw.w_bf16 = wbf.get();
      cw.act_bf16 = xq.get();
      Row rw{r.kernel + "_blas_w", r.shape, "w_bf16 kept", m};
      rw.quant_us = time_us(stream, reps, [&] { must(quantize_act_bf16(x_f32.get(), m, s.in, 32, xq.get(), stream)); });
      rw.us = time_us(stream, reps, [&] { must(quant_gemm(cw, QuantGemmWorkspace{}, stream)); });
      rw.tflops = flops / (rw.us * 1e-6) / 1e12;
      print_row(rw);
      rows.push_back(rw);
      if (m == ms.front()) {  // the weight's dequantization alone (once per matrix and chunk, or at load)
        Row rd{fp4 ? "mxfp4_dequant" : "fp8_dequant", r.shape, "bf16", 0};
        rd.us = time_us(stream, 10, [&] { must(dequant_weight_bf16(view, wbf.get(), stream)); });
        print_row(rd);
        rows.push_back(rd);
      }
    }
  }
}

// Routed experts of n tokens: 384 experts, top-6, uniformly random distinct experts per token; expert
// weights are 16 distinct copies shared round-robin by pointer (272 MB, beyond L2).
void bench_moe(int64_t n, cudaStream_t stream, std::vector<Row>& rows) {
  const int64_t E = 384, K = 6, d = 5120, inter = 2304, copies = 16;
  std::vector<DeviceBuffer<uint8_t>> keep;
  std::vector<const uint8_t*> p1d, p1s, p3d, p3s, p2d, p2s;
  for (int64_t c = 0; c < copies; ++c) {
    for (int mat = 0; mat < 3; ++mat) {
      const int64_t out = mat == 2 ? d : inter, in = mat == 2 ? inter : d;
      keep.push_back(random_bytes(out * in / 2, 10 + 3 * c + mat, 0, 0));
      keep.push_back(random_bytes(out * in / 32, 100 + 3 * c + mat, 112, 8));
    }
  }
  for (int64_t e = 0; e < E; ++e) {
    const size_t base = static_cast<size_t>(e % copies) * 6;
    p1d.push_back(keep[base + 0].get());
    p1s.push_back(keep[base + 1].get());
    p3d.push_back(keep[base + 2].get());
    p3s.push_back(keep[base + 3].get());
    p2d.push_back(keep[base + 4].get());
    p2s.push_back(keep[base + 5].get());
  }
  auto up = [](const std::vector<const uint8_t*>& v) { return must(DeviceBuffer<const uint8_t*>::from_host(v)); };
  auto t1d = up(p1d), t1s = up(p1s), t3d = up(p3d), t3s = up(p3s), t2d = up(p2d), t2s = up(p2s);
  std::vector<int32_t> ids(static_cast<size_t>(n * K));
  std::vector<float> wts(ids.size(), 0.25f);
  Rng rng(7);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < K; ++k) {
      int32_t e;
      bool dup;
      do {
        e = static_cast<int32_t>(rng.next() % E);
        dup = false;
        for (int64_t j = 0; j < k; ++j) dup |= ids[t * K + j] == e;
      } while (dup);
      ids[t * K + k] = e;
    }
  auto dids = must(DeviceBuffer<int32_t>::from_host(ids));
  auto dw = must(DeviceBuffer<float>::from_host(wts));
  DeviceBuffer<float> x;
  random_bf16(static_cast<size_t>(n * d), 9, &x, nullptr);
  auto xc = must(DeviceBuffer<uint16_t>::allocate(n * d));
  auto xs = must(DeviceBuffer<float>::allocate(n * d / 32));
  must(quantize_act_fp8(x.get(), n, d, xc.get(), xs.get(), stream));
  const MoePermutationSizes ps = moe_permutation_sizes(n, K, E);
  auto hist = must(DeviceBuffer<int32_t>::allocate(ps.chunk_hist));
  auto ro = must(DeviceBuffer<int32_t>::allocate(ps.offsets));
  auto to = must(DeviceBuffer<int32_t>::allocate(ps.offsets));
  auto rt = must(DeviceBuffer<int32_t>::allocate(ps.rows));
  auto sr = must(DeviceBuffer<int32_t>::allocate(ps.rows));
  auto rw = must(DeviceBuffer<float>::allocate(ps.rows));
  auto hc = must(DeviceBuffer<uint16_t>::allocate(n * K * inter));
  auto hs = must(DeviceBuffer<float>::allocate(n * K * inter / 32));
  auto yr = must(DeviceBuffer<uint16_t>::allocate(n * K * d));
  auto y = must(DeviceBuffer<float>::allocate(n * d));
  const int tile_rows = moe_tile_rows(n, K, E);
  const MoeRouteView route{dids.get(), dw.get(), n, K, E};
  const MoePermutation perm{hist.get(), ro.get(), to.get(), rt.get(), rw.get(), sr.get()};
  MoeExpertArgs a;
  a.experts = MoeExpertTable{
      QuantWeightFormat::MXFP4, d, inter, 32, 32, t1d.get(), t1s.get(), t3d.get(), t3s.get(), t2d.get(), t2s.get()};
  a.route = route;
  a.perm = perm;
  a.tile_rows = tile_rows;
  a.x_codes = xc.get();
  a.x_scales = xs.get();
  a.swiglu_limit = 10.0f;
  a.h_codes = hc.get();
  a.h_scales = hs.get();
  a.y_rows = yr.get();
  const double flops = 2.0 * n * K * 3 * inter * d;
  const int reps = std::max(3, reps_for(flops) / 2);
  Row r{"moe_mxfp4", "E384 top6 5120/2304", "tile" + std::to_string(tile_rows), n};
  r.us = time_us(stream, reps, [&] {
    must(moe_permute(route, tile_rows, perm, stream));
    must(moe_experts(a, stream));
    must(moe_prefill_combine(MoePrefillCombineArgs{dids.get(), sr.get(), yr.get(), nullptr, n, K, d, E, y.get()}, stream));
  });
  r.tflops = flops / (r.us * 1e-6) / 1e12;
  print_row(r);
  rows.push_back(r);
}

int run(int argc, char** argv) {
  std::string json_path;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc)
      json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else {
      std::fprintf(stderr, "usage: gemm_bench [--json FILE] [--quick]\n");
      return 2;
    }
  }
  auto rt = query_runtime();
  if (!rt.ok() || rt->devices.empty()) {
    std::fprintf(stderr, "gemm_bench: no GPU: %s\n", rt.ok() ? "no device" : rt.error().message.c_str());
    return 1;
  }
  std::printf("device: %s, %d SMs\n", rt->devices[0].name.c_str(), rt->devices[0].multiprocessors);
  auto stream_r = Stream::create();
  must(stream_r.ok() ? Status::Ok() : Status(stream_r.error()));
  const cudaStream_t stream = stream_r->get();
  auto blas_r = BlasContext::create();
  BlasContext* blas = blas_r.ok() ? blas_r->get() : nullptr;
  if (!blas) std::printf("cuBLAS columns skipped: %s\n", blas_r.error().message.c_str());
  const std::vector<int64_t> ms = quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 8192, 32768};
  const int64_t max_m = ms.back(), max_k = 8192;
  DeviceBuffer<float> x_f32;
  DeviceBuffer<uint16_t> x_bf16;
  random_bf16(static_cast<size_t>(max_m * max_k), 5, &x_f32, &x_bf16);

  std::vector<Row> rows;
  nlohmann::json peak = nlohmann::json::object();
  if (blas) {
    const int64_t s = 8192;
    DeviceBuffer<uint16_t> wb;
    random_bf16(static_cast<size_t>(s * s), 6, nullptr, &wb);
    auto y = must(DeviceBuffer<float>::allocate(s * s));
    DenseGemmArgs b{.type = DenseWeightType::BF16,
                    .w = wb.get(),
                    .out = s,
                    .in = s,
                    .x = nullptr,
                    .n = s,
                    .y = y.get(),
                    .bf16_output = false,
                    .x_bf16 = x_bf16.get()};
    const double us = time_us(stream, 10, [&] { must(dense_gemm(*blas, b, nullptr, 0, stream)); });
    const double tf = 2.0 * s * s * s / (us * 1e-6) / 1e12;
    std::printf("peak reference: cuBLASLt bf16 8192^3 %.1f us = %.1f TFLOP/s (%s)\n", us, tf, blas->version().c_str());
    peak = {{"cublas_bf16_8192_tflops", tf}, {"version", blas->version()}};
  }
  const Shape fp8_shapes[] = {{"wq_a", 1280, 5120},        {"wq_b", 32768, 1280},       {"wkv", 512, 5120},
                              {"wo_b", 5120, 8192},        {"shared_w1", 2304, 5120},   {"shared_w2", 5120, 2304},
                              {"engram_wkv", 25600, 6144}, {"indexer_wq_b", 4096, 1280}};
  for (const Shape& s : fp8_shapes) bench_quant(blas, QuantWeightFormat::FP8Block, s, ms, x_f32, x_bf16, stream, rows);
  const Shape fp4_shapes[] = {{"expert_w1", 2304, 5120}, {"expert_w2", 5120, 2304}};
  for (const Shape& s : fp4_shapes) bench_quant(blas, QuantWeightFormat::MXFP4, s, ms, x_f32, x_bf16, stream, rows);
  for (const int64_t n : quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 8192})
    bench_moe(n, stream, rows);

  if (!json_path.empty()) {
    nlohmann::json j;
    j["device"] = rt->devices[0].name;
    j["peak"] = peak;
    for (const Row& r : rows)
      j["rows"].push_back({{"kernel", r.kernel},
                           {"shape", r.shape},
                           {"m", r.m},
                           {"plan", r.plan},
                           {"us", r.us},
                           {"tflops", r.tflops},
                           {"cublas_bf16_us", r.blas_us},
                           {"cublas_bf16_tflops", r.blas_tflops},
                           {"act_quant_us", r.quant_us}});
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "gemm_bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
    std::fputs(j.dump(2).c_str(), f);
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace cedar::cuda

int main(int argc, char** argv) { return cedar::cuda::run(argc, argv); }
