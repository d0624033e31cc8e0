// CUDA kernel benchmark (run on a GPU machine): achieved GB/s of the FP8 / MXFP4 GEMV at real V4.1
// shapes and of the fused mHC kernel, against the device copy bandwidth measured in the same run.
//
// Weights rotate through enough copies (>= 256 MiB) that every call reads them from HBM, not L2;
// each measurement replays a CUDA graph of one launch per copy (decode runs from graphs, so launch
// overhead is measured as a graph node, as in decode). Bytes counted: weights + scales + activations
// read + outputs written. Plain timed binary (CUDA events), not Google Benchmark: GPU time is what matters.
//
// usage: cuda_kernels_bench [--json FILE] [--once]   (--once: every kernel launched once, for ncu)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/stream.h"

namespace cedar::cuda {
namespace {

constexpr size_t kRotateBytes = size_t{256} << 20;
constexpr int kReplays = 20;

template <typename T>
DeviceBuffer<T> must(Result<DeviceBuffer<T>> r) {
  if (!r.ok()) {
    std::fprintf(stderr, "bench: %s\n", r.error().message.c_str());
    std::exit(1);
  }
  return std::move(*r);
}
void must(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench: %s\n", s.error().message.c_str());
    std::exit(1);
  }
}

// Fast pseudo-random bytes (xorshift64; hundreds of MiB per shape): lo + (r % span), or r & mask when span is 0.
DeviceBuffer<uint8_t> random_bytes(size_t n, uint64_t seed, uint8_t lo, uint8_t span, uint8_t mask = 0xFF) {
  std::vector<uint8_t> h(n);
  uint64_t x = 0x9E3779B97F4A7C15ull ^ seed;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const auto r = static_cast<uint8_t>(x >> 24);
    h[i] = span ? static_cast<uint8_t>(lo + r % span) : static_cast<uint8_t>(r & mask);
  }
  return must(DeviceBuffer<uint8_t>::from_host(h));
}
DeviceBuffer<float> random_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> h(n);
  for (auto& v : h) v = nd(rng);
  return must(DeviceBuffer<float>::from_host(h));
}

// Mean time of one launch (µs): `launch(i)` enqueues call i (i < count) on the stream; captured once
// into a graph, replayed kReplays times after a warm-up replay.
// --once (for Nsight Compute): each measurement launches call 0 once, eagerly, and reports nothing useful.
bool g_once = false;

double time_graph_us(cudaStream_t stream, int count, const std::function<void(int)>& launch) {
  if (g_once) {
    launch(0);
    must(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    return 1.0;
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  must(cuda_status(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture"));
  for (int i = 0; i < count; ++i) launch(i);
  must(cuda_status(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture"));
  must(cuda_status(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate"));
  must(cuda_status(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"));
  must(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  EventTimer timer;
  must(timer.init());
  must(timer.start(stream));
  for (int r = 0; r < kReplays; ++r) must(cuda_status(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"));
  auto ms = timer.stop_ms(stream);
  must(ms.ok() ? Status::Ok() : Status(ms.error()));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return static_cast<double>(*ms) * 1e3 / (static_cast<double>(kReplays) * count);
}

struct Row {
  std::string kernel, shape;
  int64_t n = 1;
  double us = 0, bytes = 0, gbps = 0, pct_copy = 0;
};

double launch_floor_us() {
  auto f = measure_launch_floor_us(100, 20);
  must(f.ok() ? Status::Ok() : Status(f.error()));
  return *f;
}

struct GemvShape {
  const char* name;
  QuantWeightFormat format;
  int64_t out, in;
};

void bench_gemv(const GemvShape& s, const std::vector<int64_t>& ns, double copy_gbps, cudaStream_t stream,
                std::vector<Row>& rows) {
  const bool fp4 = s.format == QuantWeightFormat::MXFP4;
  const size_t w_bytes = fp4 ? s.out * s.in / 2 : s.out * s.in;
  const size_t s_bytes = fp4 ? s.out * s.in / 32 : ((s.out + 31) / 32) * (s.in / 32);
  const int copies = static_cast<int>(std::max<size_t>(2, kRotateBytes / (w_bytes + s_bytes) + 1));
  auto w = random_bytes(w_bytes * copies, 1, 0, 0, fp4 ? 0xFF : 0x7E);  // & 0x7E: no NaN codes
  auto sc = random_bytes(s_bytes * copies, 2, 118, 8);
  auto view = [&](int i) {
    return QuantWeightView{s.format, s.out, s.in, w.get() + i * w_bytes, sc.get() + i * s_bytes, 32, 32};
  };
  for (const int64_t n : ns) {
    auto x = random_floats(n * s.in, 3, 1.0f);
    auto codes = must(DeviceBuffer<uint16_t>::allocate(n * s.in));
    auto ascales = must(DeviceBuffer<float>::allocate(n * s.in / 32));
    auto y = must(DeviceBuffer<float>::allocate(n * s.out));
    const SplitKSize split = splitk_workspace_size(view(0));
    auto part = must(DeviceBuffer<float>::allocate(split.partial_floats));
    auto counters = must(DeviceBuffer<unsigned>::allocate(split.counters));
    must(counters.zero());
    const SplitKWorkspace splitk{part.get(), counters.get(), split.partial_floats, split.counters};
    must(quantize_act_fp8(x.get(), n, s.in, codes.get(), ascales.get(), stream));
    const double act_bytes = static_cast<double>(n * s.in) * (2.0 + 4.0 / 32.0);
    const double bytes = static_cast<double>(w_bytes + s_bytes) + act_bytes + 4.0 * n * s.out;
    const double us = time_graph_us(stream, copies, [&](int i) {
      must(gemv_quantized(view(i), codes.get(), ascales.get(), n, y.get(), true, stream, splitk));
    });
    Row r{fp4 ? "gemv_mxfp4" : "gemv_fp8", std::string(s.name) + " " + std::to_string(s.out) + "x" + std::to_string(s.in), n,
          us, bytes};
    r.gbps = bytes / (us * 1e-6) / 1e9;
    r.pct_copy = 100.0 * r.gbps / copy_gbps;
    rows.push_back(r);
    // The whole linear(): activation quantization + GEMV (two graph nodes).
    const double us2 = time_graph_us(stream, copies, [&](int i) {
      must(linear_quantized(view(i), x.get(), n, ActWorkspace{codes.get(), ascales.get(), n * s.in, splitk}, y.get(), true,
                            stream));
    });
    Row r2 = r;
    r2.kernel += "+quant";
    r2.us = us2;
    r2.bytes = bytes + 4.0 * n * s.in;
    r2.gbps = r2.bytes / (us2 * 1e-6) / 1e9;
    r2.pct_copy = 100.0 * r2.gbps / copy_gbps;
    rows.push_back(r2);
  }
}

// One launch for `count` matrices of one shape (a token's routed experts): weights rotate as above.
void bench_grouped(const GemvShape& s, int count, int64_t n, double copy_gbps, cudaStream_t stream,
                   std::vector<Row>& rows) {
  const bool fp4 = s.format == QuantWeightFormat::MXFP4;
  const size_t w_bytes = fp4 ? s.out * s.in / 2 : s.out * s.in;
  const size_t s_bytes = fp4 ? s.out * s.in / 32 : ((s.out + 31) / 32) * (s.in / 32);
  const size_t group_bytes = (w_bytes + s_bytes) * count;
  const int copies = static_cast<int>(std::max<size_t>(2, kRotateBytes / group_bytes + 1));
  auto w = random_bytes(w_bytes * count * copies, 11, 0, 0, fp4 ? 0xFF : 0x7E);
  auto sc = random_bytes(s_bytes * count * copies, 12, 118, 8);
  auto x = random_floats(n * s.in, 13, 1.0f);
  auto codes = must(DeviceBuffer<uint16_t>::allocate(n * s.in));
  auto ascales = must(DeviceBuffer<float>::allocate(n * s.in / 32));
  auto y = must(DeviceBuffer<float>::allocate(n * s.out * count));
  must(quantize_act_fp8(x.get(), n, s.in, codes.get(), ascales.get(), stream));
  const QuantWeightView shape{s.format, s.out, s.in, w.get(), sc.get(), 32, 32};
  const SplitKSize split = splitk_workspace_size(shape, count);
  auto part = must(DeviceBuffer<float>::allocate(split.partial_floats));
  auto counters = must(DeviceBuffer<unsigned>::allocate(split.counters));
  must(counters.zero());
  std::vector<GemvGroupItem> items(count);
  const double us = time_graph_us(stream, copies, [&](int c) {
    for (int i = 0; i < count; ++i)
      items[i] = GemvGroupItem{w.get() + (static_cast<size_t>(c) * count + i) * w_bytes,
                               sc.get() + (static_cast<size_t>(c) * count + i) * s_bytes, codes.get(), ascales.get(),
                               y.get() + static_cast<size_t>(i) * n * s.out};
    must(gemv_quantized_grouped(shape, items.data(), count, n, true, stream,
                                SplitKWorkspace{part.get(), counters.get(), split.partial_floats, split.counters}));
  });
  const double bytes = static_cast<double>(group_bytes) + static_cast<double>(n * s.in) * (2.0 + 4.0 / 32.0) +
                       4.0 * n * s.out * count;
  Row r{std::string(fp4 ? "gemv_mxfp4" : "gemv_fp8") + " x" + std::to_string(count),
        std::string(s.name) + " " + std::to_string(s.out) + "x" + std::to_string(s.in), n, us, bytes};
  r.gbps = bytes / (us * 1e-6) / 1e9;
  r.pct_copy = 100.0 * r.gbps / copy_gbps;
  rows.push_back(r);
}

// sinkhorn_iters = 20 is the model's; 1 isolates how much of the time the serial Sinkhorn tail costs.
void bench_mhc(int64_t n, int64_t d, int64_t sinkhorn_iters, double copy_gbps, cudaStream_t stream,
               std::vector<Row>& rows) {
  const int64_t hc = 4, width = hc * d, mix = (2 + hc) * hc;
  const size_t fn_count = static_cast<size_t>(mix * width);
  const int copies = static_cast<int>(std::max<size_t>(2, kRotateBytes / (fn_count * 4) + 1));
  auto fn = random_floats(fn_count * copies, 4, 0.02f);
  auto X = random_floats(n * width, 5, 1.0f);
  auto Xo = must(DeviceBuffer<float>::allocate(n * width));
  auto y = random_floats(n * d, 6, 1.0f);
  auto coeff = random_floats(n * mix, 7, 0.3f);  // post / comb / collapse weights (values irrelevant)
  auto base = random_floats(mix, 8, 1.0f);
  auto scale = random_floats(3, 9, 1.0f);
  auto col = must(DeviceBuffer<float>::allocate(n * d));
  auto mix_out = must(DeviceBuffer<float>::allocate(n * mix));
  auto part = must(DeviceBuffer<float>::allocate(mhc_workspace_floats(n, d)));
  auto counter = must(DeviceBuffer<unsigned>::allocate(1));
  must(counter.zero());
  const double us = time_graph_us(stream, copies, [&](int i) {
    MhcFusedArgs a;
    a.n = n;
    a.hc = hc;
    a.d = d;
    a.X = X.get();
    a.y = y.get();
    a.post = coeff.get();
    a.comb = coeff.get() + n * hc;
    a.X_out = Xo.get();
    a.collapse_w = coeff.get();
    a.collapsed = col.get();
    a.fn = fn.get() + i * fn_count;
    a.base = base.get();
    a.scale = scale.get();
    a.mix_out = mix_out.get();
    a.sinkhorn_iters = sinkhorn_iters;
    must(mhc_fused(a, MhcWorkspace{part.get(), counter.get()}, stream));
  });
  // fn + X read + y read + X_out written + collapsed written (+ tiny coefficient traffic).
  const double bytes = 4.0 * (static_cast<double>(fn_count) + n * width + n * d + n * width + n * d);
  Row r{sinkhorn_iters == 20 ? "mhc_fused" : "mhc_fused_sk" + std::to_string(sinkhorn_iters), "4x" + std::to_string(d),
        n, us, bytes};
  r.gbps = bytes / (us * 1e-6) / 1e9;
  r.pct_copy = 100.0 * r.gbps / copy_gbps;
  rows.push_back(r);
}

int run(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
    else if (std::strcmp(argv[i], "--once") == 0) g_once = true;
  auto rt = query_runtime();
  if (!rt.ok() || rt->devices.empty()) {
    std::fprintf(stderr, "cuda_kernels_bench: no GPU: %s\n", rt.ok() ? "no device" : rt.error().message.c_str());
    return 1;
  }
  auto stream = Stream::create();
  must(stream.ok() ? Status::Ok() : Status(stream.error()));
  auto bw = measure_copy_bandwidth(size_t{1} << 30, 20);
  must(bw.ok() ? Status::Ok() : Status(bw.error()));
  const double copy_gbps = std::max(bw->memcpy_gbps, bw->kernel_gbps);
  std::printf("device: %s; copy bandwidth (1 GiB, read+write): cudaMemcpy D2D %.0f GB/s, copy kernel %.0f GB/s\n",
              rt->devices[0].name.c_str(), bw->memcpy_gbps, bw->kernel_gbps);

  const double floor_us = launch_floor_us();
  std::printf("launch floor (empty kernel node in a graph): %.2f us\n", floor_us);
  const GemvShape shapes[] = {
      {"wq_a", QuantWeightFormat::FP8Block, 1280, 5120},
      {"wq_b", QuantWeightFormat::FP8Block, 32768, 1280},
      {"wo_b", QuantWeightFormat::FP8Block, 5120, 8192},
      {"shared_w1", QuantWeightFormat::FP8Block, 2304, 5120},
      {"shared_w2", QuantWeightFormat::FP8Block, 5120, 2304},
      {"expert_w1", QuantWeightFormat::MXFP4, 2304, 5120},
      {"expert_w2", QuantWeightFormat::MXFP4, 5120, 2304},
      // Streaming efficiency without the launch floor: a weight far larger than one layer's.
      {"big_fp8", QuantWeightFormat::FP8Block, 16384, 16384},
      {"big_mxfp4", QuantWeightFormat::MXFP4, 16384, 16384},
  };
  std::vector<Row> rows;
  for (const auto& s : shapes) bench_gemv(s, {1, 4, 8}, copy_gbps, stream->get(), rows);
  // Routed experts of one token, top-6: w1 and w3 of 6 experts (12 matrices) in one launch, then w2 ×6.
  for (int64_t n : {1, 4}) {
    bench_grouped(shapes[5], 12, n, copy_gbps, stream->get(), rows);
    bench_grouped(shapes[6], 6, n, copy_gbps, stream->get(), rows);
  }
  for (int64_t n : {1, 4, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows);
  bench_mhc(1, 5120, 1, copy_gbps, stream->get(), rows);

  std::printf("%-18s %-24s %3s %10s %12s %8s %7s %12s\n", "kernel", "shape", "n", "us/call", "bytes", "GB/s", "%copy",
              "%copy-floor");
  for (const auto& r : rows) {
    const double net = r.us > floor_us ? r.bytes / ((r.us - floor_us) * 1e-6) / 1e9 : 0.0;
    std::printf("%-18s %-24s %3lld %10.2f %12.0f %8.0f %6.1f%% %11.1f%%\n", r.kernel.c_str(), r.shape.c_str(),
                static_cast<long long>(r.n), r.us, r.bytes, r.gbps, r.pct_copy, 100.0 * net / copy_gbps);
  }
  if (!json_path.empty()) {
    nlohmann::ordered_json j;
    j["device"] = rt->devices[0].name;
    j["copy_memcpy_gbps"] = bw->memcpy_gbps;
    j["copy_kernel_gbps"] = bw->kernel_gbps;
    j["launch_floor_us"] = floor_us;
    for (const auto& r : rows)
      j["rows"].push_back({{"kernel", r.kernel}, {"shape", r.shape}, {"n", r.n}, {"us", r.us}, {"bytes", r.bytes},
                           {"gbps", r.gbps}, {"pct_copy", r.pct_copy}});
    if (FILE* f = std::fopen(json_path.c_str(), "w")) {
      std::fprintf(f, "%s\n", j.dump(2).c_str());
      std::fclose(f);
    }
  }
  return 0;
}

}  // namespace
}  // namespace cedar::cuda

int main(int argc, char** argv) { return cedar::cuda::run(argc, argv); }
