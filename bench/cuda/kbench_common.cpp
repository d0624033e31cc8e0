// The timing harness and random data of cuda_kernels_bench (kbench_common.h).
#include "kbench_common.h"

namespace cedar::cuda::kbench {
namespace {
bool g_launch_once = false;
}  // namespace

void set_launch_once(bool once) { g_launch_once = once; }
bool launch_once() { return g_launch_once; }

void must(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench: %s\n", s.error().message.c_str());
    std::exit(1);
  }
}

// Fast pseudo-random bytes (xorshift64; hundreds of MiB per shape): lo + (r % span), or r & mask when span is 0.
DeviceBuffer<uint8_t> random_bytes(size_t n, uint64_t seed, uint8_t lo, uint8_t span, uint8_t mask) {
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

// Large buffers for timing only: a 4 Mi-float random pattern repeated on the device (fast to make).
DeviceBuffer<float> tiled_floats(size_t n, uint32_t seed, float scale) {
  const size_t tile = std::min<size_t>(n, size_t{1} << 22);
  auto pattern = random_floats(tile, seed, scale);
  auto out = must(DeviceBuffer<float>::allocate(n));
  for (size_t off = 0; off < n; off += tile)
    must(cuda_status(cudaMemcpy(out.get() + off, pattern.get(), std::min(tile, n - off) * sizeof(float),
                                cudaMemcpyDeviceToDevice),
                     "cudaMemcpy(tiled)"));
  return out;
}

// Mean time of one launch (µs): `launch(i)` enqueues call i (i < count) on the stream; captured once
// into a graph, replayed kReplays times after a warm-up replay.
// --once (for Nsight Compute): each measurement launches call 0 once, eagerly, and reports nothing useful.

double time_graph_us(cudaStream_t stream, int count, const std::function<void(int)>& launch) {
  if (launch_once()) {
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

// time_graph_us for launches that may be unsupported (e.g. programmatic dependent launch inside a
// graph): returns a negative time instead of exiting when a launch, the capture or a replay fails.
double try_time_graph_us(cudaStream_t stream, int count, const std::function<Status(int)>& launch) {
  if (launch_once()) return launch(0).ok() && cudaStreamSynchronize(stream) == cudaSuccess ? 1.0 : -1.0;
  for (int i = 0; i < count; ++i)  // eager first: a launch error is reported without a broken capture
    if (!launch(i).ok()) return -1.0;
  if (cudaStreamSynchronize(stream) != cudaSuccess) return -1.0;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return -1.0;
  bool ok = true;
  for (int i = 0; i < count; ++i) ok = launch(i).ok() && ok;
  if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || !ok) {
    cudaGetLastError();
    return -1.0;
  }
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    cudaGraphDestroy(graph);
    cudaGetLastError();
    return -1.0;
  }
  double us = -1.0;
  EventTimer timer;
  if (cudaGraphLaunch(exec, stream) == cudaSuccess && cudaStreamSynchronize(stream) == cudaSuccess && timer.init().ok() &&
      timer.start(stream).ok()) {
    for (int r = 0; r < kReplays; ++r) ok = cudaGraphLaunch(exec, stream) == cudaSuccess && ok;
    auto ms = timer.stop_ms(stream);
    if (ok && ms.ok()) us = static_cast<double>(*ms) * 1e3 / (static_cast<double>(kReplays) * count);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaGetLastError();
  return us;
}

double launch_floor_us() {
  auto f = measure_launch_floor_us(100, 20);
  must(f.ok() ? Status::Ok() : Status(f.error()));
  return *f;
}

GroupedGemvInputs grouped_gemv_inputs(const GemvShape& s, int count, int64_t n, uint32_t seed, cudaStream_t stream) {
  const bool fp4 = s.format == QuantWeightFormat::MXFP4;
  GroupedGemvInputs g;
  g.count = count;
  g.n = n;
  g.out = s.out;
  g.in = s.in;
  g.w_bytes = fp4 ? s.out * s.in / 2 : s.out * s.in;
  g.s_bytes = fp4 ? s.out * s.in / 32 : ((s.out + 31) / 32) * (s.in / 32);
  g.group_bytes = (g.w_bytes + g.s_bytes) * count;
  g.copies = static_cast<int>(std::max<size_t>(2, kRotateBytes / g.group_bytes + 1));
  g.w = random_bytes(g.w_bytes * count * g.copies, seed, 0, 0, fp4 ? 0xFF : 0x7E);
  g.sc = random_bytes(g.s_bytes * count * g.copies, seed + 1, 118, 8);
  g.x = random_floats(n * s.in, seed + 2, 1.0f);
  g.codes = must(DeviceBuffer<uint16_t>::allocate(n * s.in));
  g.ascales = must(DeviceBuffer<float>::allocate(n * s.in / 32));
  g.y = must(DeviceBuffer<float>::allocate(n * s.out * count));
  must(quantize_act_fp8(g.x.get(), n, s.in, g.codes.get(), g.ascales.get(), stream));
  g.items.resize(count);
  return g;
}

const GemvGroupItem* GroupedGemvInputs::items_of(int c) {
  for (int i = 0; i < count; ++i)
    items[i] = GemvGroupItem{w.get() + (static_cast<size_t>(c) * count + i) * w_bytes,
                             sc.get() + (static_cast<size_t>(c) * count + i) * s_bytes, codes.get(), ascales.get(),
                             y.get() + static_cast<size_t>(i) * n * out};
  return items.data();
}

double GroupedGemvInputs::bytes() const {
  return static_cast<double>(group_bytes) + static_cast<double>(n * in) * (2.0 + 4.0 / 32.0) + 4.0 * n * out * count;
}

Row make_row(const std::string& kernel, const std::string& shape, int64_t n, double us, double bytes,
             double copy_gbps) {
  Row r{kernel, shape, n, us, bytes};
  r.gbps = bytes / (us * 1e-6) / 1e9;
  r.pct_copy = 100.0 * r.gbps / copy_gbps;
  return r;
}

}  // namespace cedar::cuda::kbench
