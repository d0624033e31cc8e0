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
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/gemm_kernels.h"
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

// time_graph_us for launches that may be unsupported (e.g. programmatic dependent launch inside a
// graph): returns a negative time instead of exiting when a launch, the capture or a replay fails.
double try_time_graph_us(cudaStream_t stream, int count, const std::function<Status(int)>& launch) {
  if (g_once) return launch(0).ok() && cudaStreamSynchronize(stream) == cudaSuccess ? 1.0 : -1.0;
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
    const Row r0{fp4 ? "gemv_mxfp4" : "gemv_fp8",
                 std::string(s.name) + " " + std::to_string(s.out) + "x" + std::to_string(s.in), n, 0.0, 0.0};
    // The row of one variant: its name suffix, time and bytes (negative time: the launch was refused, no row).
    auto add = [&](const char* suffix, double t, double b) {
      if (t <= 0) return;
      Row v = r0;
      v.kernel += suffix;
      v.us = t;
      v.bytes = b;
      v.gbps = b / (t * 1e-6) / 1e9;
      v.pct_copy = 100.0 * v.gbps / copy_gbps;
      rows.push_back(v);
    };
    add("", us, bytes);
    // The whole linear(): activation quantization + GEMV (two graph nodes).
    const double us2 = time_graph_us(stream, copies, [&](int i) {
      must(linear_quantized(view(i), x.get(), n, ActWorkspace{codes.get(), ascales.get(), n * s.in, splitk}, y.get(), true,
                            stream));
    });
    add("+quant", us2, bytes + 4.0 * n * s.in);
    if (n == 1) {  // back-to-back with programmatic dependent launch: the next GEMV's launch and first
                   // weight lines overlap the previous one (what a PDL decode graph gets)
      add("_pdl", try_time_graph_us(stream, copies, [&](int i) {
            return gemv_quantized(view(i), codes.get(), ascales.get(), n, y.get(), true, stream, splitk, true);
          }),
          bytes);
      // The same weights every call (L2-resident when they fit, ~50 MB): what a GEMV whose weights were
      // prefetched into L2 beforehand would take — the ceiling of an L2 weight prefetch.
      add("_pdl_l2hot", try_time_graph_us(stream, copies, [&](int) {
            return gemv_quantized(view(0), codes.get(), ascales.get(), n, y.get(), true, stream, splitk, true);
          }),
          bytes);
    }
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
// cluster: mhc_fused_cluster (ffn_kernels.h) instead of mhc_fused.
struct MhcMode {
  bool cluster = false, pdl = false;
  bool sized_ws = false;     // partial_floats / counter_count given: decode tiles in one launch, streaming path
  bool expand = true;        // y given (expand)
  bool coefficients = true;  // fn given
  bool collapse = true;
  bool legacy = false;         // MhcFusedArgs::legacy_decode (the session-3 decode kernel)
  bool legacy_stream = false;  // MhcFusedArgs::legacy_stream (the session-4 streaming kernel: FMA dot products)
  bool stream_c32 = false;     // MhcFusedArgs::stream_c32 (the s6 tensor-core kernel, 32-channel chunks)
  bool serial_finish = false;  // MhcFusedArgs::stream_serial_finish (the s6 finish: one thread per token)
  bool norm = false;           // + the RMSNorm of collapsed (normed): fused, or rms_norm after the legacy kernel
  bool norm_counter = false;   // MhcWorkspace::norm_counter (fn = null + norm: one launch up to 4 rows)
  int64_t stream_blocks = 0;   // MhcFusedArgs::stream_blocks (0: the default plan)
  // With norm, the FP8 codes of normed: 1 = written by the kernel that writes normed (normed_quant),
  // 2 = a quantize_act_fp8 launch after it (the path before s8-quantfold).
  int quant = 0;
  const char* name = nullptr;  // row name override
};
void bench_mhc(int64_t n, int64_t d, int64_t sinkhorn_iters, double copy_gbps, cudaStream_t stream,
               std::vector<Row>& rows, MhcMode mode = {}) {
  if (mode.cluster) {
    if (Status s = mhc_cluster_supported(d); !s.ok()) {
      std::printf("mhc_fused_cluster not benchmarked: %s\n", s.error().message.c_str());
      return;
    }
  }
  const int64_t hc = 4, width = hc * d, mix = (2 + hc) * hc;
  const size_t fn_count = static_cast<size_t>(mix * width);
  const size_t x_bytes = static_cast<size_t>(n * width) * 4;
  // Weights (fn) rotate through HBM-sized copies at decode sizes; at prefill sizes X itself is far
  // larger than L2 and two calls alternate between two X buffers.
  const int copies = static_cast<int>(std::max<size_t>(2, kRotateBytes / (fn_count * 4 + x_bytes) + 1));
  auto fn = random_floats(fn_count * copies, 4, 0.02f);
  auto X = tiled_floats(n * width * (x_bytes > (size_t{64} << 20) ? 2 : 1), 5, 1.0f);
  auto Xo = must(DeviceBuffer<float>::allocate(n * width));
  auto y = tiled_floats(n * d, 6, 1.0f);
  auto coeff = tiled_floats(n * mix, 7, 0.3f);  // post / comb / collapse weights (values irrelevant)
  auto base = random_floats(mix, 8, 1.0f);
  auto scale = random_floats(3, 9, 1.0f);
  auto col = must(DeviceBuffer<float>::allocate(n * d));
  auto mix_out = must(DeviceBuffer<float>::allocate(n * mix));
  auto norm_w = tiled_floats(d, 10, 1.0f);
  auto normed = must(DeviceBuffer<float>::allocate(n * d));
  // A forced block target may split the channels up to d / 32 ways: room for every split.
  const int64_t ws_floats = std::max(mhc_workspace_floats(n, d), mode.stream_blocks > 0 ? (d / 32) * n * 25 : 0);
  const int64_t ws_counters = mhc_workspace_counters(n);
  auto part = must(DeviceBuffer<float>::allocate(ws_floats));
  auto counter = must(DeviceBuffer<unsigned>::allocate(ws_counters));
  must(counter.zero());
  auto norm_counter = must(DeviceBuffer<unsigned>::allocate(kMhcNormCounters));
  must(norm_counter.zero());
  auto codes = must(DeviceBuffer<uint16_t>::allocate(n * d));
  auto code_scales = must(DeviceBuffer<float>::allocate(n * d / 32));
  const bool two_x = x_bytes > (size_t{64} << 20);
  auto launch = [&](int i) {
    MhcFusedArgs a;
    a.n = n;
    a.hc = hc;
    a.d = d;
    a.X = X.get() + (two_x ? (i % 2) * n * width : 0);
    a.y = mode.expand ? y.get() : nullptr;
    a.post = coeff.get();
    a.comb = coeff.get() + n * hc;
    a.X_out = Xo.get();
    a.collapse_w = mode.collapse ? coeff.get() : nullptr;
    a.collapsed = col.get();
    a.fn = mode.coefficients ? fn.get() + (i % copies) * fn_count : nullptr;
    a.base = base.get();
    a.scale = scale.get();
    a.mix_out = mix_out.get();
    a.sinkhorn_iters = sinkhorn_iters;
    a.programmatic_launch = mode.pdl && !mode.cluster;
    a.legacy_decode = mode.legacy;
    a.legacy_stream = mode.legacy_stream;
    a.stream_c32 = mode.stream_c32;
    a.stream_serial_finish = mode.serial_finish;
    a.stream_blocks = mode.stream_blocks;
    if (mode.norm) {
      a.norm_weight = norm_w.get();
      a.normed = normed.get();
      if (mode.quant == 1) a.normed_quant = ActQuantOut{codes.get(), code_scales.get()};
    }
    MhcWorkspace ws{part.get(), counter.get()};
    if (mode.sized_ws) {
      ws.partial_floats = ws_floats;
      ws.counter_count = ws_counters;
    }
    if (mode.norm_counter) ws.norm_counter = norm_counter.get();
    const Status st = mode.cluster ? mhc_fused_cluster(a, stream, mode.pdl) : mhc_fused(a, ws, stream);
    if (!st.ok() || !mode.norm || mode.quant != 2) return st;
    return quantize_act_fp8(normed.get(), n, d, codes.get(), code_scales.get(), stream, a.programmatic_launch);
  };
  // PDL may be unsupported inside graphs on some drivers: that row is skipped instead of ending the run.
  const int calls = two_x ? 2 : copies;
  const double us = mode.pdl ? try_time_graph_us(stream, calls, launch)
                             : time_graph_us(stream, calls, [&](int i) { must(launch(i)); });
  if (us < 0) {
    std::printf("mHC with programmatic dependent launch: not supported here (skipped)\n");
    return;
  }
  // fn + X read + y read + X_out written + collapsed written (+ tiny coefficient traffic).
  const double bytes = 4.0 * ((mode.coefficients ? static_cast<double>(fn_count) : 0.0) + n * width +
                              (mode.expand ? n * d + n * width : 0.0) + (mode.collapse ? n * d : 0.0) +
                              (mode.norm ? d + n * d : 0.0)) +
                       (mode.quant ? 2.0 * n * d + 4.0 * n * d / 32 : 0.0);
  std::string name = mode.name ? mode.name
                     : mode.cluster ? (mode.pdl ? "mhc_fused_cluster_pdl" : "mhc_fused_cluster")
                                    : "mhc_fused";
  Row r{sinkhorn_iters == 20 ? name : name + "_sk" + std::to_string(sinkhorn_iters), "4x" + std::to_string(d), n, us,
        bytes};
  r.gbps = bytes / (us * 1e-6) / 1e9;
  r.pct_copy = 100.0 * r.gbps / copy_gbps;
  rows.push_back(r);
}

// s8-quantfold: rms_norm writing the FP8 codes of its output (rms_norm_q) vs rms_norm + quantize_act_fp8
// (rms_norm+quant), each back to back with PDL (_pdl) and without.
void bench_norm_quant(int64_t n, int64_t dim, double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  auto x = tiled_floats(n * dim, 21, 1.0f);
  auto w = tiled_floats(dim, 22, 1.0f);
  auto y = must(DeviceBuffer<float>::allocate(n * dim));
  auto codes = must(DeviceBuffer<uint16_t>::allocate(n * dim));
  auto scales = must(DeviceBuffer<float>::allocate(n * dim / 32));
  const double bytes = 4.0 * (2.0 * n * dim + dim) + 2.0 * n * dim + 4.0 * n * dim / 32;
  for (const bool pdl : {false, true}) {
    for (const bool fused : {true, false}) {
      const double us = try_time_graph_us(stream, 8, [&](int) {
        if (fused)
          return rms_norm(x.get(), n, dim, w.get(), 1e-6f, y.get(), stream, pdl,
                          ActQuantOut{codes.get(), scales.get()});
        const Status st = rms_norm(x.get(), n, dim, w.get(), 1e-6f, y.get(), stream, pdl);
        return st.ok() ? quantize_act_fp8(y.get(), n, dim, codes.get(), scales.get(), stream, pdl) : st;
      });
      if (us < 0) {
        std::printf("rms_norm rows with programmatic dependent launch: not supported here (skipped)\n");
        continue;
      }
      Row r{std::string(fused ? "rms_norm_q" : "rms_norm+quant") + (pdl ? "_pdl" : ""), std::to_string(dim), n, us,
            bytes};
      r.gbps = bytes / (us * 1e-6) / 1e9;
      r.pct_copy = 100.0 * r.gbps / copy_gbps;
      rows.push_back(r);
    }
  }
}

// ---- cuda-ffn kernels -------------------------------------------------------------------------------

Row make_row(const std::string& kernel, const std::string& shape, int64_t n, double us, double bytes,
             double copy_gbps) {
  Row r{kernel, shape, n, us, bytes};
  r.gbps = bytes / (us * 1e-6) / 1e9;
  r.pct_copy = 100.0 * r.gbps / copy_gbps;
  return r;
}

// Packed-layout MXFP4 GEMV next to the plain rows above (same shapes, same byte accounting). Weight
// values do not change the timing; the packed kernel reads the same bytes in another order.
void bench_packed(const GemvShape& s, int count, int64_t n, double copy_gbps, cudaStream_t stream,
                  std::vector<Row>& rows, bool balanced = false) {
  const size_t w_bytes = s.out * s.in / 2, s_bytes = s.out * s.in / 32;
  const size_t group_bytes = (w_bytes + s_bytes) * count;
  const int copies = static_cast<int>(std::max<size_t>(2, kRotateBytes / group_bytes + 1));
  auto w = random_bytes(w_bytes * count * copies, 21, 0, 0, 0xFF);
  auto sc = random_bytes(s_bytes * count * copies, 22, 118, 8);
  auto x = random_floats(n * s.in, 23, 1.0f);
  auto codes = must(DeviceBuffer<uint16_t>::allocate(n * s.in));
  auto ascales = must(DeviceBuffer<float>::allocate(n * s.in / 32));
  auto y = must(DeviceBuffer<float>::allocate(n * s.out * count));
  must(quantize_act_fp8(x.get(), n, s.in, codes.get(), ascales.get(), stream));
  const QuantWeightView shape{QuantWeightFormat::MXFP4, s.out, s.in, w.get(), sc.get(), 32, 32};
  std::vector<GemvGroupItem> items(count);
  const double us = time_graph_us(stream, copies, [&](int c) {
    for (int i = 0; i < count; ++i)
      items[i] = GemvGroupItem{w.get() + (static_cast<size_t>(c) * count + i) * w_bytes,
                               sc.get() + (static_cast<size_t>(c) * count + i) * s_bytes, codes.get(), ascales.get(),
                               y.get() + static_cast<size_t>(i) * n * s.out};
    must(gemv_mxfp4_packed_grouped(shape, items.data(), count, n, true, stream, balanced));
  });
  const double bytes = static_cast<double>(group_bytes) + static_cast<double>(n * s.in) * (2.0 + 4.0 / 32.0) +
                       4.0 * n * s.out * count;
  rows.push_back(make_row(std::string(balanced ? "gemv_mxfp4_packbal" : "gemv_mxfp4_packed") +
                              (count > 1 ? " x" + std::to_string(count) : ""),
                          std::string(s.name) + " " + std::to_string(s.out) + "x" + std::to_string(s.in), n, us, bytes,
                          copy_gbps));
}

// The routed experts of a decode step as the CUDA model runs them: n tokens × top-6 of 384 experts
// (random routing per graph node, so weights come from HBM), device item tables, one launch for w1+w3
// and one for w2; plain and packed layouts; and the whole routed path (items + w1/w3 + SwiGLU + w2).
// Bytes: the distinct experts' weights and scales + activations + outputs.
// `pool` holds the 384 experts' weights (7.2 GB), allocated by the first call.
void bench_moe_items(int64_t n, DeviceBuffer<uint8_t>& pool, double copy_gbps, cudaStream_t stream,
                     std::vector<Row>& rows) {
  constexpr int64_t E = 384, K = 6, d = 5120, inter = 2304;
  constexpr int kSteps = 8;  // routings in the graph
  const size_t w13 = inter * d / 2, s13 = inter * d / 32, w2 = d * inter / 2, s2 = d * inter / 32;
  const size_t per_expert = 2 * (w13 + s13) + w2 + s2;
  if (pool.empty()) {
    pool = must(DeviceBuffer<uint8_t>::allocate(per_expert * E));
    must(cuda_status(cudaMemset(pool.get(), 0x3B, pool.bytes()), "cudaMemset(experts)"));  // finite codes and scales
  }
  std::vector<const uint8_t*> p1(E), q1(E), p3(E), q3(E), p2(E), q2(E);
  for (int64_t e = 0; e < E; ++e) {
    const uint8_t* b = pool.get() + e * per_expert;
    p1[e] = b;
    q1[e] = b + w13;
    p3[e] = b + w13 + s13;
    q3[e] = p3[e] + w13;
    p2[e] = q3[e] + s13;
    q2[e] = p2[e] + w2;
  }
  auto t1 = must(DeviceBuffer<const uint8_t*>::from_host(p1)), u1 = must(DeviceBuffer<const uint8_t*>::from_host(q1));
  auto t3 = must(DeviceBuffer<const uint8_t*>::from_host(p3)), u3 = must(DeviceBuffer<const uint8_t*>::from_host(q3));
  auto t2 = must(DeviceBuffer<const uint8_t*>::from_host(p2)), u2 = must(DeviceBuffer<const uint8_t*>::from_host(q2));
  const int64_t P = n * K;
  std::mt19937 rng(static_cast<uint32_t>(n));
  std::vector<int32_t> routing(kSteps * P);
  std::vector<int64_t> distinct(kSteps);
  for (int c = 0; c < kSteps; ++c) {
    std::vector<int32_t> used;
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int32_t> sel;
      while (static_cast<int64_t>(sel.size()) < K) {
        const auto e = static_cast<int32_t>(rng() % E);
        if (std::find(sel.begin(), sel.end(), e) == sel.end()) sel.push_back(e);
      }
      for (int64_t k = 0; k < K; ++k) routing[c * P + t * K + k] = sel[k];
      used.insert(used.end(), sel.begin(), sel.end());
    }
    std::sort(used.begin(), used.end());
    distinct[c] = std::unique(used.begin(), used.end()) - used.begin();
  }
  double mean_distinct = 0;
  for (int64_t v : distinct) mean_distinct += static_cast<double>(v) / kSteps;
  auto experts = must(DeviceBuffer<int32_t>::from_host(routing));
  auto x = random_floats(n * d, 31, 1.0f);
  auto xc = must(DeviceBuffer<uint16_t>::allocate(n * d));
  auto xs = must(DeviceBuffer<float>::allocate(n * d / 32));
  must(quantize_act_fp8(x.get(), n, d, xc.get(), xs.get(), stream));
  auto g = must(DeviceBuffer<float>::allocate(P * inter)), u = must(DeviceBuffer<float>::allocate(P * inter));
  auto hcodes = must(DeviceBuffer<uint16_t>::allocate(P * inter));
  auto hscales = must(DeviceBuffer<float>::allocate(P * inter / 32));
  auto out = must(DeviceBuffer<float>::allocate(P * d));
  auto weights = random_floats(P, 32, 0.3f);
  auto items13 = must(DeviceBuffer<DeviceGemvItem>::allocate(kSteps * 2 * P));
  auto items2 = must(DeviceBuffer<DeviceGemvItem>::allocate(kSteps * P));
  auto counts = must(DeviceBuffer<int32_t>::allocate(kSteps * 2));
  auto dispatch = [&](int c) {
    MoeDispatchArgs a;
    a.experts = experts.get() + c * P;
    a.n = n;
    a.topk = K;
    a.n_experts = E;
    a.n_tables = 2;
    a.tables[0] = MoeItemTable{2, {{t1.get(), u1.get()}, {t3.get(), u3.get()}}, {g.get(), u.get()}, xc.get(), xs.get(),
                               false, items13.get() + c * 2 * P, counts.get() + 2 * c, 2 * P};
    a.tables[1] = MoeItemTable{1, {{t2.get(), u2.get()}, {}}, {out.get(), nullptr}, hcodes.get(), hscales.get(), true,
                               items2.get() + c * P, counts.get() + 2 * c + 1, P};
    must(moe_build_items(a, stream));
  };
  for (int c = 0; c < kSteps; ++c) dispatch(c);
  must(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  const QuantWeightView shape13{QuantWeightFormat::MXFP4, inter, d, nullptr, nullptr, 32, 32};
  const QuantWeightView shape2{QuantWeightFormat::MXFP4, d, inter, nullptr, nullptr, 32, 32};
  const double act13 = static_cast<double>(n * d) * (2.0 + 4.0 / 32.0), act2 = static_cast<double>(P * inter) * (2.0 + 4.0 / 32.0);
  const double bytes13 = mean_distinct * 2 * (w13 + s13) + act13 + 4.0 * 2 * P * inter;
  const double bytes2 = mean_distinct * (w2 + s2) + act2 + 4.0 * P * d;
  const std::string shape = "top6/384 n=" + std::to_string(n) + " (" + std::to_string(static_cast<int>(mean_distinct + 0.5)) +
                            " experts)";
  for (const Mxfp4Layout packed : {Mxfp4Layout::Plain, Mxfp4Layout::Packed, Mxfp4Layout::PackedBalanced}) {
    const std::string tag = packed == Mxfp4Layout::Plain ? "" : packed == Mxfp4Layout::Packed ? "_packed" : "_packbal";
    double us = time_graph_us(stream, kSteps, [&](int c) {
      must(gemv_quantized_items(shape13, packed, items13.get() + c * 2 * P, counts.get() + 2 * c, 2 * P, true, stream));
    });
    rows.push_back(make_row("moe_items_w13" + tag, shape, n, us, bytes13, copy_gbps));
    us = time_graph_us(stream, kSteps, [&](int c) {
      must(gemv_quantized_items(shape2, packed, items2.get() + c * P, counts.get() + 2 * c + 1, P, true, stream));
    });
    rows.push_back(make_row("moe_items_w2" + tag, shape, n, us, bytes2, copy_gbps));
    // The routed path of one layer: dispatch + w1/w3 + SwiGLU/quant + w2 (4 graph nodes).
    us = time_graph_us(stream, kSteps, [&](int c) {
      dispatch(c);
      must(gemv_quantized_items(shape13, packed, items13.get() + c * 2 * P, counts.get() + 2 * c, 2 * P, true, stream));
      must(swiglu(SwigluArgs{P, inter, g.get(), u.get(), weights.get(), 10.0f, nullptr, hcodes.get(), hscales.get()}, stream));
      must(gemv_quantized_items(shape2, packed, items2.get() + c * P, counts.get() + 2 * c + 1, P, true, stream));
    });
    rows.push_back(make_row("moe_routed_path" + tag, shape, n, us, bytes13 + bytes2, copy_gbps));
  }
  // The model's chain: the same 4 nodes with programmatic (PDL) edges after the dispatch, and the GEMVs'
  // units taken from work counters; at the default split and forced to 2 and 4 warps (`routed_warps`).
  for (const int warps : {0, 2, 4}) {
    auto work = must(DeviceBuffer<unsigned>::allocate(4));
    must(work.zero());
    const double us = time_graph_us(stream, kSteps, [&](int c) {
      dispatch(c);
      const Mxfp4Layout bal = Mxfp4Layout::PackedBalanced;
      must(gemv_quantized_items(shape13, bal, items13.get() + c * 2 * P, counts.get() + 2 * c, 2 * P, true, stream,
                                {.programmatic_launch = true, .work = work.get(), .packed_warps = warps}));
      SwigluArgs sw{P, inter, g.get(), u.get(), weights.get(), 10.0f, nullptr, hcodes.get(), hscales.get()};
      sw.programmatic_launch = true;
      must(swiglu(sw, stream));
      must(gemv_quantized_items(shape2, bal, items2.get() + c * P, counts.get() + 2 * c + 1, P, true, stream,
                                {.programmatic_launch = true, .work = work.get() + 2, .packed_warps = warps}));
    });
    const std::string tag = warps == 0 ? "" : "_w" + std::to_string(warps);
    rows.push_back(make_row("moe_routed_path_packbal_pdl" + tag, shape, n, us, bytes13 + bytes2, copy_gbps));
  }
  // The balanced packed kernel at every forced split (2..8 warps per block, a wave of resident blocks
  // each): the sweep behind gemv_quantized_items' default split (4 warps).
  if (n <= 8) {
    // w1/w3 and w2 rows of the balanced packed kernel under `opt`, named moe_items_w13 / _w2 + tag.
    auto balanced_rows = [&](const std::string& tag, const GemvItemsOptions& opt) {
      double us = time_graph_us(stream, kSteps, [&](int c) {
        must(gemv_quantized_items(shape13, Mxfp4Layout::PackedBalanced, items13.get() + c * 2 * P, counts.get() + 2 * c,
                                  2 * P, true, stream, opt));
      });
      rows.push_back(make_row("moe_items_w13" + tag, shape, n, us, bytes13, copy_gbps));
      us = time_graph_us(stream, kSteps, [&](int c) {
        must(gemv_quantized_items(shape2, Mxfp4Layout::PackedBalanced, items2.get() + c * P, counts.get() + 2 * c + 1, P,
                                  true, stream, opt));
      });
      rows.push_back(make_row("moe_items_w2" + tag, shape, n, us, bytes2, copy_gbps));
    };
    for (int warps = 2; warps <= 8; ++warps) balanced_rows("_packbal_w" + std::to_string(warps), {.packed_warps = warps});
    // The model's option: the scale product as an exponent add (GemvItemsOptions::scale_exp_add). The bench's
    // random scale bytes are not range-checked: the rows time the kernel, their values are not used.
    balanced_rows("_packbal_expadd", {.scale_exp_add = true});
    // The same experts every call (w2: 38 MB at n = 1, L2-resident): the ceiling of an L2 weight prefetch.
    const double us = time_graph_us(stream, kSteps, [&](int) {
      must(gemv_quantized_items(shape2, Mxfp4Layout::PackedBalanced, items2.get(), counts.get() + 1, P, true, stream));
    });
    rows.push_back(make_row("moe_items_w2_packbal_l2hot", shape, n, us, bytes2, copy_gbps));
  }
}

// The router rows' V4.1 gate (copies rotated so every call reads it from HBM), bias and split-K workspace.
struct RouterBenchGate {
  static constexpr int64_t d = 5120, E = 384, K = 6;
  static constexpr size_t gate_bytes = E * d * 2;
  int copies = static_cast<int>(kRotateBytes / gate_bytes + 1);
  DeviceBuffer<uint8_t> gate = random_bytes(gate_bytes * copies, 41, 0x30, 16);  // small bf16 values
  DeviceBuffer<float> bias = random_floats(E, 42, 0.1f);
  SplitKSize rws = router_workspace_size(E, d);
  DeviceBuffer<float> part = must(DeviceBuffer<float>::allocate(rws.partial_floats));
  DeviceBuffer<unsigned> cnt = must(DeviceBuffer<unsigned>::allocate(rws.counters));
  RouterBenchGate() { must(cnt.zero()); }

  // Call c's arguments for n tokens (with the split-K workspace when `splitk`).
  RouterArgs args(int64_t n, int c, const float* x, float* logits, int32_t* experts, float* weights, bool splitk) {
    RouterArgs a;
    a.n = n;
    a.d = d;
    a.n_experts = E;
    a.topk = K;
    a.x = x;
    a.gate = reinterpret_cast<const uint16_t*>(gate.get() + (c % copies) * gate_bytes);
    a.bias = bias.get();
    a.route_scale = 1.5f;
    a.logits = logits;
    a.experts = experts;
    a.weights = weights;
    if (splitk) a.splitk = SplitKWorkspace{part.get(), cnt.get(), rws.partial_floats, rws.counters};
    return a;
  }
};

// The fused router as the model's decode runs it (moe_route with the expert dispatch: 2 item tables over
// 384 experts' pointer tables); then where one launch's time goes, from its stamps (RouterArgs::stamps;
// eager launches, medians).
void bench_router_tail(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  RouterBenchGate g;
  constexpr int64_t d = RouterBenchGate::d, E = RouterBenchGate::E, K = RouterBenchGate::K;
  const int copies = g.copies;
  // Pointer tables per layer copy (as the model's: one per layer, cold in L2 at each call); the pointers
  // name a dummy buffer (the items are written, never used).
  auto dummy = must(DeviceBuffer<uint8_t>::allocate(4096));
  const std::vector<const uint8_t*> names(E, dummy.get());
  std::vector<DeviceBuffer<const uint8_t*>> tables;
  for (int c = 0; c < copies * 6; ++c) tables.push_back(must(DeviceBuffer<const uint8_t*>::from_host(names)));
  const int64_t blocks = router_fused_blocks(E, d);
  auto stamps = must(DeviceBuffer<unsigned long long>::allocate(blocks * kRouterStampsPerBlock + kRouterTailStamps));
  for (const int64_t n : {1, 8}) {
    const int64_t P = n * K;
    auto x = random_floats(n * d, 43, 1.0f);
    auto logits = must(DeviceBuffer<float>::allocate(n * E));
    auto ex = must(DeviceBuffer<int32_t>::allocate(P));
    auto wt = must(DeviceBuffer<float>::allocate(P));
    auto items13 = must(DeviceBuffer<DeviceGemvItem>::allocate(2 * P));
    auto items2 = must(DeviceBuffer<DeviceGemvItem>::allocate(P));
    auto counts = must(DeviceBuffer<int32_t>::allocate(2));
    auto fp = must(DeviceBuffer<float>::allocate(P * d));
    auto codes = must(DeviceBuffer<uint16_t>::allocate(P * d));
    auto args = [&](int c, unsigned long long* st, bool block_build) {
      RouterArgs a = g.args(n, c, x.get(), logits.get(), ex.get(), wt.get(), true);
      a.stamps = st;
      MoeDispatchArgs m;
      m.block_build = block_build;
      m.experts = ex.get();
      m.n = n;
      m.topk = K;
      m.n_experts = E;
      m.n_tables = 2;
      const auto t = [&](int i) { return tables[static_cast<size_t>((c % copies) * 6 + i)].get(); };
      m.tables[0] = MoeItemTable{2, {{t(0), t(1)}, {t(2), t(3)}}, {fp.get(), fp.get()}, codes.get(), fp.get(), false,
                                 items13.get(), counts.get(), 2 * P};
      m.tables[1] = MoeItemTable{1, {{t(4), t(5)}, {}}, {fp.get(), nullptr}, codes.get(), fp.get(), true,
                                 items2.get(), counts.get() + 1, P};
      return std::make_pair(a, m);
    };
    // The decode's dispatch (one warp builds up to kMoeWarpBuildPairs pairs) and the block-wide builder.
    for (const bool block_build : {false, true}) {
      const double us = time_graph_us(stream, copies, [&](int c) {
        const auto [a, m] = args(c, nullptr, block_build);
        must(moe_route(a, stream, &m));
      });
      rows.push_back(make_row(block_build ? "moe_route_ws_items_block" : "moe_route_ws_items", "384x5120 bf16 gate",
                              n, us, g.gate_bytes + 4.0 * n * d, copy_gbps));
      if (g_once || n != 1) continue;
      // Stamps of 32 eager launches (each after a sync: no overlap), in µs from the first block's entry.
      constexpr int kRuns = 32;
      std::vector<double> spread, stored, ticket, tail_us, sums, select, build;
      for (int r = 0; r < kRuns; ++r) {
        must(stamps.zero());
        const auto [a, m] = args(r, stamps.get(), block_build);
        must(moe_route(a, stream, &m));
        must(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
        std::vector<unsigned long long> st(static_cast<size_t>(blocks * kRouterStampsPerBlock + kRouterTailStamps));
        must(cuda_status(cudaMemcpy(st.data(), stamps.get(), st.size() * sizeof(st[0]), cudaMemcpyDeviceToHost),
                         "cudaMemcpy(stamps)"));
        unsigned long long first = ~0ull, last_entry = 0, last_stored = 0, last_ticket = 0;
        for (int64_t b = 0; b < blocks; ++b) {
          const unsigned long long* v = st.data() + b * kRouterStampsPerBlock;
          first = std::min(first, v[0]);
          last_entry = std::max(last_entry, v[0]);
          last_stored = std::max(last_stored, v[2]);
          last_ticket = std::max(last_ticket, v[3]);
        }
        const unsigned long long* t = st.data() + blocks * kRouterStampsPerBlock;
        spread.push_back((last_entry - first) * 1e-3);
        stored.push_back((last_stored - first) * 1e-3);
        ticket.push_back((last_ticket - first) * 1e-3);
        tail_us.push_back((t[4] - last_ticket) * 1e-3);
        sums.push_back(static_cast<double>(t[1] - t[0]));
        select.push_back(static_cast<double>(t[2] - t[1]));
        build.push_back(static_cast<double>(t[3] - t[2]));
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      std::printf(
          "router stamps n=1 %s items (%lld blocks, medians of %d launches): last block entry +%.2f us, all "
          "partials stored +%.2f, last ticket +%.2f, tail %.2f us (sums + scores %.0f cycles, selection %.0f, items "
          "%.0f)\n",
          block_build ? "block" : "warp", static_cast<long long>(blocks), kRuns, median(spread),
          median(stored), median(ticket), median(tail_us), median(sums), median(select), median(build));
    }
  }
}

// Router (logits + select) on the V4.1 gate, Engram gather (device and host-mapped table), the Engram
// update, the final head and the samplers: the small per-layer / per-step kernels and their latency.
void bench_ffn_small(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  constexpr int64_t d = 5120, E = 384, K = 6;
  {  // router: without a workspace (what callers that pass none get), with one (n <= 8: one fused
     // launch), and prefill sizes through cuBLASLt when it loads
    RouterBenchGate g;
    const int copies = g.copies;
    auto blas = BlasContext::create();
    if (!blas.ok()) std::printf("moe_route_blas not benchmarked: %s\n", blas.error().message.c_str());
    enum class Mode { Plain, Workspace, Blas };
    // select_only: router_select alone on given logits (the fused launch's selection tail, separately).
    auto route_rows = [&](int64_t n, Mode mode, bool logits_only, bool select_only = false) {
      auto x = random_floats(n * d, 43, 1.0f);
      auto xb = must(DeviceBuffer<uint16_t>::allocate(n * d));
      auto logits = random_floats(n * E, 44, 2.0f);
      auto ex = must(DeviceBuffer<int32_t>::allocate(n * K));
      auto wt = must(DeviceBuffer<float>::allocate(n * K));
      const int reps = n >= 1024 ? 4 : copies;
      const double us = time_graph_us(stream, reps, [&](int c) {
        RouterArgs a = g.args(n, c, x.get(), logits.get(), ex.get(), wt.get(), mode != Mode::Plain);
        if (mode == Mode::Blas) {
          a.blas = blas->get();
          a.x_bf16 = xb.get();
          a.x_bf16_elems = n * d;
        }
        must(select_only ? router_select(a, stream) : logits_only ? router_logits(a, stream) : moe_route(a, stream));
      });
      const char* name = select_only   ? "router_select"
                         : logits_only ? "router_logits_ws"
                         : mode == Mode::Plain ? "moe_route"
                         : mode == Mode::Workspace ? "moe_route_ws"
                                                   : "moe_route_blas";
      rows.push_back(make_row(name, "384x5120 bf16 gate", n, us, g.gate_bytes + 4.0 * n * d, copy_gbps));
    };
    for (int64_t n : {1, 8, 64}) route_rows(n, Mode::Plain, false);
    for (int64_t n : {1, 2, 8, 64, 1024}) route_rows(n, Mode::Workspace, false);
    route_rows(1, Mode::Workspace, true);
    for (int64_t n : {1, 8}) route_rows(n, Mode::Workspace, false, true);
    if (blas.ok())
      for (int64_t n : {1024, 8192}) route_rows(n, Mode::Blas, false);
  }
  {  // p-mhc: moe_combine (6 routed rows + the shared one per token; model stage moe.combine ~10 us before)
    for (int64_t n : {1, 8}) {
      std::vector<int32_t> ids(n * K);
      for (int64_t i = 0; i < n * K; ++i) ids[i] = static_cast<int32_t>((i * 37) % E);
      auto experts = must(DeviceBuffer<int32_t>::from_host(ids));
      auto routed = tiled_floats(n * K * d, 51, 1.0f);
      auto shared = tiled_floats(n * d, 52, 1.0f);
      auto y = must(DeviceBuffer<float>::allocate(n * d));
      const double us = time_graph_us(stream, 8, [&](int) {
        must(moe_combine(MoeCombineArgs{n, K, d, experts.get(), routed.get(), shared.get(), y.get()}, stream));
      });
      rows.push_back(make_row("moe_combine", "top6 x5120 + shared", n, us, 4.0 * n * d * (K + 2), copy_gbps));
    }
  }
  {  // Engram gather: 24 rows of 256 + 8 bytes per token from a 2 GiB table (device) or host-mapped
    constexpr int64_t cols = 24, hd = 256, table_rows = int64_t{1} << 23;  // 8 Mi rows
    auto table = must(DeviceBuffer<uint8_t>::allocate(table_rows * hd));
    auto tscale = must(DeviceBuffer<uint8_t>::allocate(table_rows * hd / 32));
    must(cuda_status(cudaMemset(table.get(), 0x30, table.bytes()), "cudaMemset(table)"));
    must(cuda_status(cudaMemset(tscale.get(), 118, tscale.bytes()), "cudaMemset(table scales)"));
    constexpr int64_t host_rows = int64_t{1} << 20;  // 256 MiB pinned
    uint8_t* host = nullptr;
    uint8_t* host_scale = nullptr;
    must(cuda_status(cudaHostAlloc(reinterpret_cast<void**>(&host), host_rows * hd, cudaHostAllocMapped), "cudaHostAlloc"));
    must(cuda_status(cudaHostAlloc(reinterpret_cast<void**>(&host_scale), host_rows * hd / 32, cudaHostAllocMapped),
                     "cudaHostAlloc"));
    std::memset(host, 0x30, host_rows * hd);
    std::memset(host_scale, 118, host_rows * hd / 32);
    uint8_t* host_dev = nullptr;
    uint8_t* host_scale_dev = nullptr;
    must(cuda_status(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_dev), host, 0), "cudaHostGetDevicePointer"));
    must(cuda_status(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_scale_dev), host_scale, 0),
                     "cudaHostGetDevicePointer"));
    constexpr int kSteps = 16;
    for (int64_t n : {1, 64}) {
      for (const bool mapped : {false, true}) {
        const int64_t nrows = mapped ? host_rows : table_rows;
        std::mt19937_64 rng(51);
        std::vector<int64_t> r(kSteps * n * cols);
        for (auto& v : r) v = static_cast<int64_t>(rng() % nrows);
        auto drows = must(DeviceBuffer<int64_t>::from_host(r));
        auto codes = must(DeviceBuffer<uint16_t>::allocate(n * cols * hd));
        auto scales = must(DeviceBuffer<float>::allocate(n * cols * hd / 32));
        const double us = time_graph_us(stream, kSteps, [&](int c) {
          EngramGatherArgs a;
          a.n = n;
          a.cols = cols;
          a.head_dim = hd;
          a.rows = drows.get() + c * n * cols;
          a.table_rows = nrows;
          a.table = mapped ? host_dev : table.get();
          a.table_scale = mapped ? host_scale_dev : tscale.get();
          a.codes = codes.get();
          a.scales = scales.get();
          must(engram_gather_quant(a, stream));
        });
        const double bytes = static_cast<double>(n * cols) * (hd + hd / 32) + n * cols * hd * (2.0 + 4.0 / 32);
        rows.push_back(make_row(mapped ? "engram_gather_hostmap" : "engram_gather", "24 rows x 256 fp8", n, us, bytes,
                                copy_gbps));
      }
    }
    cudaFreeHost(host);
    cudaFreeHost(host_scale);
  }
  {  // Engram wkv (the largest GEMV of the model: 25600×6144 FP8, 157 MB) and the gated update
    const GemvShape wkv{"engram_wkv", QuantWeightFormat::FP8Block, 25600, 6144};
    bench_gemv(wkv, {1}, copy_gbps, stream, rows);
    for (int64_t n : {1, 8}) {
      auto X = random_floats(n * 4 * d, 61, 1.0f);
      auto kv = random_floats(n * 5 * d, 62, 1.0f);
      auto qk = random_floats(4 * d, 63, 1.0f);
      const double us = time_graph_us(stream, 8, [&](int) {
        EngramUpdateArgs a;
        a.n = n;
        a.hc = 4;
        a.d = d;
        a.X = X.get();
        a.kv = kv.get();
        a.qk = qk.get();
        must(engram_update(a, stream));
      });
      rows.push_back(make_row("engram_update", "4x5120", n, us, 4.0 * (2.0 * n * 4 * d + n * 5 * d + 4 * d), copy_gbps));
    }
  }
  {  // final collapse + RMSNorm + fp32 head (129280×5120 bf16, 1.3 GB: HBM every call)
    constexpr int64_t vocab = 129280;
    auto head = must(DeviceBuffer<uint16_t>::allocate(vocab * d));
    must(cuda_status(cudaMemset(head.get(), 0x3C, head.bytes()), "cudaMemset(head)"));
    auto normw = random_floats(d, 71, 1.0f);
    const SplitKSize split = gemv_bf16_splitk_size(vocab, d);
    auto part = must(DeviceBuffer<float>::allocate(split.partial_floats));
    auto cnt = must(DeviceBuffer<unsigned>::allocate(split.counters));
    must(cnt.zero());
    for (int64_t n : {1, 8}) {
      auto X = random_floats(n * 4 * d, 72, 1.0f);
      auto pre = random_floats(n * 4, 73, 0.5f);
      auto x = must(DeviceBuffer<float>::allocate(n * d));
      auto logits = must(DeviceBuffer<float>::allocate(n * vocab));
      auto tok = must(DeviceBuffer<int32_t>::allocate(n));
      const double us = time_graph_us(stream, 1, [&](int) {
        FinalHeadArgs a;
        a.n = n;
        a.d = d;
        a.vocab = vocab;
        a.X = X.get();
        a.pre = pre.get();
        a.norm_weight = normw.get();
        a.head = head.get();
        a.x = x.get();
        a.logits = logits.get();
        a.splitk = SplitKWorkspace{part.get(), cnt.get(), split.partial_floats, split.counters};
        must(final_head(a, stream));
      });
      rows.push_back(make_row("final_head", "129280x5120 bf16", n, us, 2.0 * vocab * d + 4.0 * n * (vocab + 5 * d), copy_gbps));
      const double us2 = time_graph_us(stream, 4, [&](int) { must(argmax_rows(logits.get(), n, vocab, tok.get(), stream)); });
      rows.push_back(make_row("argmax", "129280", n, us2, 4.0 * n * vocab, copy_gbps));
    }
  }
  {  // sampler: temperature only, top-k 50, top-p 0.9 (the radix passes), batch 1 and 64
    constexpr int64_t vocab = 129280;
    for (int64_t n : {1, 64}) {
      auto logits = random_floats(n * vocab, 81, 2.5f);
      auto ws = must(DeviceBuffer<double>::allocate(2 * n * vocab));
      auto tok = must(DeviceBuffer<int32_t>::allocate(n));
      auto rng = must(DeviceBuffer<Pcg32State>::from_host(std::vector<Pcg32State>(n, pcg32_seeded(1, kSamplerRngStream))));
      auto bias = must(DeviceBuffer<LogitBiasEntry>::allocate(1));
      auto pen = must(DeviceBuffer<PenaltyEntry>::allocate(1));
      struct Variant {
        const char* name;
        double temperature, top_p;
        int64_t top_k;
      };
      for (const Variant& v : {Variant{"sample_T0.8", 0.8, 1.0, 0}, Variant{"sample_topk50", 1.0, 1.0, 50},
                               Variant{"sample_topp0.9", 0.7, 0.9, 0}}) {
        std::vector<SamplingRowParams> p(n);
        for (auto& q : p) {
          q.temperature = v.temperature;
          q.top_p = v.top_p;
          q.top_k = v.top_k;
        }
        auto dp = must(DeviceBuffer<SamplingRowParams>::from_host(p));
        const double us = time_graph_us(stream, 4, [&](int) {
          must(sample_rows(SampleArgs{n, vocab, logits.get(), dp.get(), bias.get(), pen.get(), rng.get(), ws.get(), tok.get()},
                           stream));
        });
        rows.push_back(make_row(v.name, "129280", n, us, 4.0 * n * vocab, copy_gbps));
      }
    }
  }
}

// wq_a [1280, 5120] and wkv [512, 5120] (FP8) read the same normed input: two gemv_quantized calls
// (two graph nodes) next to one gemv_quantized_multi launch.
void bench_attn_input(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  constexpr int64_t in = 5120, outs[2] = {1280, 512};
  size_t wb[2], sb[2];
  for (int i = 0; i < 2; ++i) {
    wb[i] = outs[i] * in;
    sb[i] = (outs[i] / 32) * (in / 32);
  }
  const size_t pair = wb[0] + sb[0] + wb[1] + sb[1];
  const int copies = static_cast<int>(kRotateBytes / pair + 1);
  auto w = random_bytes(pair * copies, 95, 0, 0, 0x7E);  // scale bytes are random too: finite values
  auto x = random_floats(in, 96, 1.0f);
  auto codes = must(DeviceBuffer<uint16_t>::allocate(in));
  auto ascales = must(DeviceBuffer<float>::allocate(in / 32));
  must(quantize_act_fp8(x.get(), 1, in, codes.get(), ascales.get(), stream));
  auto y0 = must(DeviceBuffer<float>::allocate(outs[0])), y1 = must(DeviceBuffer<float>::allocate(outs[1]));
  auto base = [&](int c, int i) { return w.get() + c * pair + (i == 0 ? 0 : wb[0] + sb[0]); };
  QuantWeightView mats[2];
  for (int i = 0; i < 2; ++i) mats[i] = QuantWeightView{QuantWeightFormat::FP8Block, outs[i], in, nullptr, nullptr, 32, 32};
  SplitKSize need = splitk_workspace_size_multi(mats, 2);
  for (int i = 0; i < 2; ++i) {
    const SplitKSize one = splitk_workspace_size(mats[i]);
    need.partial_floats = std::max(need.partial_floats, one.partial_floats);
    need.counters = std::max(need.counters, one.counters);
  }
  auto part = must(DeviceBuffer<float>::allocate(std::max<int64_t>(need.partial_floats, 1)));
  auto cnt = must(DeviceBuffer<unsigned>::allocate(std::max<int64_t>(need.counters, 1)));
  must(cnt.zero());
  const SplitKWorkspace ws{part.get(), cnt.get(), need.partial_floats, need.counters};
  const double bytes = static_cast<double>(pair) + in * (2.0 + 4.0 / 32) + 4.0 * (outs[0] + outs[1]);
  double us = time_graph_us(stream, copies, [&](int c) {
    for (int i = 0; i < 2; ++i) {
      QuantWeightView v = mats[i];
      v.data = base(c, i);
      v.scales = base(c, i) + wb[i];
      must(gemv_quantized(v, codes.get(), ascales.get(), 1, i == 0 ? y0.get() : y1.get(), true, stream, ws));
    }
  });
  rows.push_back(make_row("gemv_fp8 wq_a, wkv", "1280+512 x5120 (2 calls)", 1, us, bytes, copy_gbps));
  us = time_graph_us(stream, copies, [&](int c) {
    GemvGroupItem items[2];
    for (int i = 0; i < 2; ++i)
      items[i] = GemvGroupItem{base(c, i), base(c, i) + wb[i], codes.get(), ascales.get(), i == 0 ? y0.get() : y1.get()};
    must(gemv_quantized_multi(mats, items, 2, 1, true, stream, ws));
  });
  rows.push_back(make_row("gemv_fp8_multi wq_a+wkv", "1280+512 x5120 (1 launch)", 1, us, bytes, copy_gbps));
}

// wo_a (8 groups of [1024, 4096] over o's slices): gemv_bf16 on the BF16 weight (67 MB, the reference's
// dequantized values) next to the same GEMV reading the weight as stored (FP8 + UE8M0 32×32: 34 MB),
// dequantized in registers — the same results bit for bit; at n <= 8 also the staged FP8 GEMV
// (stage_act_f16 + gemv_fp8_staged: the same exact products, summed per 32-block).
void bench_wo_a(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  constexpr int64_t groups = 8, out = 1024, in = 4096, total = groups * out;
  const size_t w8 = total * in, s8 = (total / 32) * (in / 32), w16 = 2 * w8;
  const int copies8 = static_cast<int>(kRotateBytes / (w8 + s8) + 1), copies16 = static_cast<int>(kRotateBytes / w16 + 1);
  auto wfp8 = random_bytes(w8 * copies8, 91, 0, 0, 0x7E);
  auto sfp8 = random_bytes(s8 * copies8, 92, 112, 8);
  auto wbf = random_bytes(w16 * copies16, 93, 0x30, 16);
  for (int64_t n : {1, 8, 64}) {
    auto x = random_floats(n * groups * in, 94, 1.0f);
    auto y = must(DeviceBuffer<float>::allocate(n * total));
    const double act = 4.0 * n * (groups * in + total);
    double us = time_graph_us(stream, copies16, [&](int c) {
      Bf16GemvArgs a;
      a.w = reinterpret_cast<const uint16_t*>(wbf.get() + c * w16);
      a.out = out;
      a.in = in;
      a.groups = groups;
      a.x = x.get();
      a.y = y.get();
      a.n = n;
      a.bf16_output = true;
      must(gemv_bf16(a, stream));
    });
    rows.push_back(make_row("gemv_bf16 wo_a", "8x1024x4096 bf16", n, us, w16 + act, copy_gbps));
    // The weight as stored; `fast`: checked at upload as the model does (Bf16GemvArgs::w_fp8_fast, no
    // per-chunk check; the timing does not depend on the bytes).
    auto fp8w = [&](int c, bool pdl, bool fast) {
      Bf16GemvArgs a;
      a.w_fp8 = wfp8.get() + c * w8;
      a.w_scales = sfp8.get() + c * s8;
      a.w_fp8_fast = fast;
      a.out = out;
      a.in = in;
      a.groups = groups;
      a.x = x.get();
      a.y = y.get();
      a.n = n;
      a.bf16_output = true;
      a.programmatic_launch = pdl;
      return a;
    };
    us = time_graph_us(stream, copies8, [&](int c) { must(gemv_bf16(fp8w(c, false, false), stream)); });
    rows.push_back(make_row("gemv_fp8w wo_a", "8x1024x4096 fp8", n, us, w8 + s8 + act, copy_gbps));
    for (const bool fast : {false, true}) {
      us = try_time_graph_us(stream, copies8, [&](int c) { return gemv_bf16(fp8w(c, true, fast), stream); });
      if (us > 0)
        rows.push_back(make_row(fast ? "gemv_fp8w_fast_pdl wo_a" : "gemv_fp8w_pdl wo_a", "8x1024x4096 fp8", n, us,
                                w8 + s8 + act, copy_gbps));
    }
    if (n > 8) continue;
    // paths.wo_a_f16 (s8-woa16): o staged as exact f16 blocks (stage_act_f16) + the FP8 grouped GEMV
    // (gemv_fp8_staged, two launches), and the GEMV alone on already staged codes — the model's decode
    // path at n <= 8. Bytes as above (the staging's own codes round trip is not counted).
    auto codes = must(DeviceBuffer<uint16_t>::allocate(n * groups * in));
    auto cscales = must(DeviceBuffer<float>::allocate(n * groups * in / 32));
    auto staged = [&](int c) {
      StagedGemvArgs a;
      a.w = QuantWeightView{QuantWeightFormat::FP8Block, total, in, wfp8.get() + c * w8, sfp8.get() + c * s8, 32, 32};
      a.groups = groups;
      a.x = x.get();
      a.y = y.get();
      a.n = n;
      a.codes = codes.get();
      a.scales = cscales.get();
      a.capacity_values = n * groups * in;
      a.programmatic_launch = true;
      return a;
    };
    us = try_time_graph_us(stream, copies8, [&](int c) { return gemv_fp8_staged(staged(c), stream); });
    if (us > 0)
      rows.push_back(make_row("stage_f16+gemv_fp8_pdl wo_a", "8x1024x4096 fp8", n, us, w8 + s8 + act, copy_gbps));
    must(stage_act_f16(x.get(), n, groups * in, codes.get(), cscales.get(), stream));
    us = try_time_graph_us(stream, copies8, [&](int c) {
      const StagedGemvArgs a = staged(c);
      std::vector<GemvGroupItem> items(groups);
      for (int64_t g = 0; g < groups; ++g)
        items[g] = GemvGroupItem{a.w.data + g * out * in, a.w.scales + g * (out / 32) * (in / 32),
                                 codes.get() + g * in,    cscales.get() + g * in / 32,
                                 y.get() + g * out,       groups * in,
                                 groups * in / 32,        groups * out};
      const QuantWeightView shape{QuantWeightFormat::FP8Block, out, in, nullptr, nullptr, 32, 32};
      return gemv_quantized_grouped(shape, items.data(), groups, n, true, stream, {}, true);
    });
    if (us > 0)
      rows.push_back(make_row("gemv_fp8_f16act_pdl wo_a", "8x1024x4096 fp8 (staged)", n, us,
                              w8 + s8 + n * groups * in * (2.0 + 4.0 / 32) + 4.0 * n * total, copy_gbps));
    us = try_time_graph_us(stream, copies8, [&](int) {
      return stage_act_f16(x.get(), n, groups * in, codes.get(), cscales.get(), stream, true);
    });
    if (us > 0)
      rows.push_back(
          make_row("stage_act_f16_pdl wo_a", "8x4096", n, us, n * groups * in * (4.0 + 2.0 + 4.0 / 32), copy_gbps));
  }
}

// Sparse attention at the released decode shape (64 heads × 512, window 128 + top-k 512 = 640 keys per
// row, sink, inverse RoPE on 64 channels): the tiled kernel (16 heads per block) against the decode
// kernel (split-K, 64 heads per block; _hsplit: its head-split plan, SparseAttnArgs::decode_head_split),
// and an SWA-only layer's 128 keys (decode kernel, both plans). Rows are distinct sequences; bytes =
// the rows' key records (528-B SWA + 288-B main KV), q and out. The records of one call (≤ 14 MB) stay in L2 across replays, as a
// layer's would not: read the GB/s as a latency figure, not an HBM rate.
void bench_sparse_attention(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  constexpr int64_t H = 64, hd = 512, W = 128, K = 512, rope_dim = 64, entries = 8192, epb = 64;
  const int64_t rb = swa_record_bytes(hd), mb = main_kv_record_bytes(hd), positions = entries + 256;
  std::mt19937 rng(7);
  auto rope = random_floats(positions * rope_dim, 101, 0.5f);
  auto sink = random_floats(H, 102, 1.0f);
  // One KV pool for every sequence (valid FP4 codes, e4m3 scales without NaN), identity block table.
  std::vector<uint8_t> pool(entries * mb);
  for (int64_t j = 0; j < entries; ++j) {
    uint8_t* r = pool.data() + j * mb;
    for (int64_t i = 0; i < hd / 2; ++i) r[i] = static_cast<uint8_t>(rng());
    for (int64_t i = 0; i < hd / 16; ++i) r[hd / 2 + i] = static_cast<uint8_t>(40 + rng() % 16);
  }
  auto dpool = must(DeviceBuffer<uint8_t>::from_host(pool));
  std::vector<int32_t> table(entries / epb);
  for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(b);
  auto dtable = must(DeviceBuffer<int32_t>::from_host(table));
  auto swa_bytes = [&](int64_t count) {
    std::vector<uint8_t> v(count * rb);
    for (int64_t r = 0; r < count; ++r) {
      for (int64_t i = 0; i < hd; ++i) {
        uint8_t b = static_cast<uint8_t>(rng());
        v[r * rb + i] = (b & 0x7F) == 0x7F ? static_cast<uint8_t>(b ^ 1) : b;
      }
      for (int64_t i = 0; i < hd / 32; ++i) v[r * rb + hd + i] = static_cast<uint8_t>(118 + rng() % 8);
    }
    return v;
  };
  for (int64_t n : {1, 8, 64}) {
    std::vector<AttnToken> tokens;
    std::vector<SwaRingDesc> rings;
    std::vector<KvSourceSeq> seqs;
    std::vector<int32_t> topk(n * K);
    std::vector<DeviceBuffer<uint8_t>> ring_rec;
    std::vector<DeviceBuffer<int64_t>> ring_pos;
    for (int64_t s = 0; s < n; ++s) {
      const int64_t pos = 6000 + 13 * s;
      append_chunk_tokens(tokens, static_cast<int32_t>(s), pos, 1);
      std::vector<int64_t> rp(W);
      for (int64_t k = pos - W; k < pos; ++k) rp[k % W] = k;
      ring_rec.push_back(must(DeviceBuffer<uint8_t>::from_host(swa_bytes(W))));
      ring_pos.push_back(must(DeviceBuffer<int64_t>::from_host(rp)));
      rings.push_back(SwaRingDesc{ring_rec.back().get(), ring_pos.back().get()});
      seqs.push_back(KvSourceSeq{PagedRecords{dpool.get(), dtable.get(), epb * mb, epb, mb}, {}});
      std::vector<int32_t> ids(entries);
      for (int64_t j = 0; j < entries; ++j) ids[j] = static_cast<int32_t>(j);
      std::shuffle(ids.begin(), ids.end(), rng);
      std::sort(ids.begin(), ids.begin() + K);
      std::copy_n(ids.begin(), K, topk.begin() + s * K);
    }
    auto dtok = must(DeviceBuffer<AttnToken>::from_host(tokens));
    auto drings = must(DeviceBuffer<SwaRingDesc>::from_host(rings));
    auto dseqs = must(DeviceBuffer<KvSourceSeq>::from_host(seqs));
    auto dtopk = must(DeviceBuffer<int32_t>::from_host(topk));
    auto dchunk = must(DeviceBuffer<uint8_t>::from_host(swa_bytes(n)));
    auto q = random_floats(n * H * hd, 103, 1.0f);
    auto out = must(DeviceBuffer<float>::allocate(n * H * hd));
    const SparseAttnWorkspaceSize wsz = sparse_attention_workspace_size(n, H, hd, W, K);
    auto wf = must(DeviceBuffer<float>::allocate(std::max<int64_t>(1, wsz.floats)));
    auto wc = must(DeviceBuffer<unsigned>::allocate(std::max<int64_t>(1, wsz.counters)));
    must(cuda_status(cudaMemset(wc.get(), 0, sizeof(unsigned) * std::max<int64_t>(1, wsz.counters)), "cudaMemset"));
    const SparseAttnWorkspace ws{wf.get(), wc.get(), wsz.floats, wsz.counters};
    SparseAttnArgs a;
    a.n = n;
    a.heads = H;
    a.head_dim = hd;
    a.window = W;
    a.q = q.get();
    a.sink = sink.get();
    a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    a.tokens = dtok.get();
    a.chunk_records = dchunk.get();
    a.rings = drings.get();
    a.topk = dtopk.get();
    a.topk_width = K;
    a.kv_seqs = dseqs.get();
    a.rope = RopeTableView{rope.get(), positions, rope_dim};
    a.out = out.get();
    const double bytes = n * (W * rb + K * mb + 2.0 * 4 * H * hd);
    const double old_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_tiled(a, stream, ws)); });
    rows.push_back(make_row("sparse_attn_tiled", "64x512 640 keys", n, old_us, bytes, copy_gbps));
    const double new_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_decode(a, stream, ws)); });
    rows.push_back(make_row("sparse_attn_decode", "64x512 640 keys", n, new_us, bytes, copy_gbps));
    SparseAttnArgs la = a;  // the first merge (serial loads, plain launch): the session-4 run's row
    la.legacy_decode_merge = true;
    const double leg_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_decode(la, stream, ws)); });
    rows.push_back(make_row("sparse_attn_decode_oldmerge", "64x512 640 keys", n, leg_us, bytes, copy_gbps));
    SparseAttnArgs ha = a;  // the head-split plan (16 heads per block at b1/b8; b64: 64, balanced ranges)
    ha.decode_head_split = true;
    const double hs_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_decode(ha, stream, ws)); });
    rows.push_back(make_row("sparse_attn_decode_hsplit", "64x512 640 keys", n, hs_us, bytes, copy_gbps));
    // An SWA-only layer (window 128, no compressed entries): 4 ranges at b1 in the legacy plan (4 blocks),
    // 4 ranges × 4 head groups in the head-split plan. (Its workspace is within the 640-key one's.)
    SparseAttnArgs sa = a;
    sa.topk = nullptr;
    sa.topk_width = 0;
    sa.kv_seqs = nullptr;
    const double swa_bytes_total = n * (W * rb + 2.0 * 4 * H * hd);
    const double swa_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_decode(sa, stream, ws)); });
    rows.push_back(make_row("sparse_attn_decode", "64x512 swa 128 keys", n, swa_us, swa_bytes_total, copy_gbps));
    sa.decode_head_split = true;
    const double swa_hs_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_decode(sa, stream, ws)); });
    rows.push_back(
        make_row("sparse_attn_decode_hsplit", "64x512 swa 128 keys", n, swa_hs_us, swa_bytes_total, copy_gbps));
    sa.decode_max_splits = 1;  // one key range per head group: no merge launch (attn_swa_one_range)
    const double swa_one_us = time_graph_us(stream, 1, [&](int) { must(sparse_attention_decode(sa, stream, ws)); });
    rows.push_back(
        make_row("sparse_attn_decode_hsplit_1r", "64x512 swa 128 keys", n, swa_one_us, swa_bytes_total, copy_gbps));
  }
}

// Indexer selection at decode (top-512 of a row's scores, the perf profile's shapes): the full scan of a
// candidate source at 4096 visible entries (+ top-2048 blocks of 8), and a restricted layer's 16384
// candidate slots (two select segments). Scores of one binade range, as the indexer's are (most share
// the sign and exponent). indexer_select = one shared atomic per value (the default); _warpagg = one per
// bin and warp (warp_aggregated_histogram), measured slower; same selection.
void bench_indexer_select(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows) {
  struct Shape {
    const char* name;
    int64_t visible;
    bool blocks;
  };
  for (const Shape sh : {Shape{"4096 +blocks", 4096, true}, Shape{"16384", 16384, false}}) {
    for (int64_t n : {1, 8}) {
      std::vector<AttnToken> tokens;
      for (int64_t r = 0; r < n; ++r) append_chunk_tokens(tokens, static_cast<int32_t>(r), sh.visible - 1, 1);
      auto dtok = must(DeviceBuffer<AttnToken>::from_host(tokens));
      std::mt19937 rng(11);
      std::vector<float> sc(n * sh.visible);
      for (auto& v : sc) v = 1.0f + static_cast<float>(rng() % 65536) / 65536.0f;  // one binade
      auto dsc = must(DeviceBuffer<float>::from_host(sc));
      const int64_t topk = 512, ctopk = 2048, bs = 8;
      const int64_t wsb = indexer_select_workspace_bytes(n, sh.visible, topk, sh.blocks ? ctopk : 0, bs);
      auto dws = must(DeviceBuffer<uint8_t>::allocate(std::max<int64_t>(1, wsb)));
      auto dout = must(DeviceBuffer<int32_t>::allocate(n * topk));
      auto dblk = must(DeviceBuffer<int32_t>::allocate(n * ctopk));
      IndexerSelectArgs a;
      a.n = n;
      a.ratio = 1;
      a.tokens = dtok.get();
      a.scores = dsc.get();
      a.max_slots = sh.visible;
      a.candidate_topk_blocks = ctopk;
      a.candidate_block_size = bs;
      a.topk = topk;
      a.topk_out = dout.get();
      a.blocks_out = sh.blocks ? dblk.get() : nullptr;
      a.workspace = dws.get();
      a.workspace_bytes = wsb;
      const double bytes = 4.0 * n * sh.visible;
      IndexerSelectArgs agg = a;
      agg.warp_aggregated_histogram = true;
      const double agg_us = time_graph_us(stream, 1, [&](int) { must(indexer_select(agg, stream)); });
      rows.push_back(make_row("indexer_select_warpagg", sh.name, n, agg_us, bytes, copy_gbps));
      const double def_us = time_graph_us(stream, 1, [&](int) { must(indexer_select(a, stream)); });
      rows.push_back(make_row("indexer_select", sh.name, n, def_us, bytes, copy_gbps));
    }
  }
}

int run(int argc, char** argv) {
  std::string json_path, sections;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
    else if (std::strcmp(argv[i], "--once") == 0) g_once = true;
    else if (std::strcmp(argv[i], "--sections") == 0 && i + 1 < argc) sections = argv[++i];
  // --sections gemv,mhc,packed,moe,small,router,wo_a,attn: only those groups of rows (default: all; small
  // includes router, the fused router with its dispatch and its stamp breakdown).
  auto want = [&](const char* name) {
    return sections.empty() || ("," + sections + ",").find("," + std::string(name) + ",") != std::string::npos;
  };
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
  if (want("gemv")) {
    for (const auto& s : shapes) bench_gemv(s, {1, 4, 8}, copy_gbps, stream->get(), rows);
    // Routed experts of one token, top-6: w1 and w3 of 6 experts (12 matrices) in one launch, then w2 ×6.
    for (int64_t n : {1, 4}) {
      bench_grouped(shapes[5], 12, n, copy_gbps, stream->get(), rows);
      bench_grouped(shapes[6], 6, n, copy_gbps, stream->get(), rows);
    }
  }
  if (want("mhc")) {
  for (int64_t n : {1, 4, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows);
  bench_mhc(1, 5120, 1, copy_gbps, stream->get(), rows);
  {  // cuda-perf: the sized workspace (decode tiles in one launch; streaming path for prefill sizes),
     // PDL back to back, and the split of a decode site: expand + collapse (critical path) and the
     // coefficients alone (which can run on a forked graph branch next to the sublayer)
    MhcMode ws;
    ws.sized_ws = true;
    ws.name = "mhc_fused_ws";
    for (int64_t n : {1, 4, 8, 20, 64}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, ws);
    MhcMode pdl = ws;
    pdl.pdl = true;
    pdl.name = "mhc_fused_ws_pdl";
    for (int64_t n : {1, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, pdl);
    MhcMode ec = ws;
    ec.coefficients = false;
    ec.name = "mhc_expand_collapse";
    for (int64_t n : {1, 8, 8192}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, ec);
    MhcMode co = ws;
    co.expand = co.collapse = false;
    co.name = "mhc_coefficients";
    for (int64_t n : {1, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, co);
    MhcMode st = ws;
    st.name = "mhc_stream";
    for (int64_t n : {128, 1024, 4096, 8192}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, st);
    // s6-mhc3: mhc_stream has its dot products on the tensor cores (3xTF32); _fma is the session-4 kernel.
    // The channel split's block target (c64 default: 6 per SM = 792 from 128 token tiles on, else 528): rows
    // mhc_stream_b<target>.
    static const int64_t kTargets[] = {264, 528, 1584};
    static std::string target_names[std::size(kTargets)];
    for (size_t i = 0; i < std::size(kTargets); ++i) {
      MhcMode sb = st;
      sb.stream_blocks = kTargets[i];
      target_names[i] = "mhc_stream_b" + std::to_string(kTargets[i]);
      sb.name = target_names[i].c_str();
      for (int64_t n : {4096, 8192}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, sb);
    }
    {  // s8-mhcstream: mhc_stream is the c64 kernel + the one-lane-per-token finish; _c32 is the s6 path
       // (the 32-channel tensor-core kernel + the serial finish), _c64_serialfin isolates the finish.
      MhcMode c32 = st;
      c32.stream_c32 = c32.serial_finish = true;
      c32.name = "mhc_stream_c32";
      for (int64_t n : {1024, 4096, 8192}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, c32);
      MhcMode sf = st;
      sf.serial_finish = true;
      sf.name = "mhc_stream_c64_serialfin";
      for (int64_t n : {1024, 4096, 8192}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, sf);
    }
    st.legacy_stream = true;
    st.serial_finish = true;
    st.name = "mhc_stream_fma";
    for (int64_t n : {1024, 8192}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, st);
  }
  {  // p-mhc: the session-3 decode kernel (_legacy: one thread per token's coefficients) vs the current
     // one (a warp per token, inline reciprocals), and a whole site with its RMSNorm: legacy kernel +
     // rms_norm launch vs the norm fused into the last block; _pdl back to back as in the model.
    for (const bool legacy : {true, false}) {
      MhcMode m;
      m.sized_ws = true;
      m.legacy = legacy;
      m.name = legacy ? "mhc_decode_legacy" : "mhc_decode";
      for (int64_t n : {1, 4, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, m);
      bench_mhc(1, 5120, 1, copy_gbps, stream->get(), rows, m);
      m.norm = true;
      m.name = legacy ? "mhc_norm_legacy" : "mhc_norm";
      for (int64_t n : {1, 4, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, m);
      m.pdl = true;
      m.name = legacy ? "mhc_norm_legacy_pdl" : "mhc_norm_pdl";
      for (int64_t n : {1, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, m);
    }
  }
  {  // s6-normfuse: the critical half of a split decode site (paths.mhc_split): expand + collapse + the
     // input RMSNorm in one launch (norm_counter; up to kMhcNormFuseMaxTokens = 4 rows, n = 8 falls
     // back to two) vs mhc_elementwise_kernel + rms_norm (_2l); _pdl back to back as in the model.
    for (const bool one : {true, false}) {
      MhcMode m;
      m.sized_ws = true;
      m.coefficients = false;
      m.norm = true;
      m.norm_counter = one;
      m.name = one ? "mhc_expand_collapse_norm" : "mhc_expand_collapse_norm_2l";
      for (int64_t n : {1, 4, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, m);
      m.pdl = true;
      m.name = one ? "mhc_expand_collapse_norm_pdl" : "mhc_expand_collapse_norm_2l_pdl";
      for (int64_t n : {1, 4}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, m);
    }
  }
  {  // s8-quantfold: the site norm with the FP8 codes of normed — written by the kernel that writes
     // normed (_q) vs a quantize_act_fp8 launch after it (+quant, the path before); the split site's
     // critical kernel (one launch up to 4 rows, elementwise + rms_norm at 8) and the decode kernel's
     // fused norm (the unsplit site); _pdl back to back as in the model.
    static const char* kNames[2][2][2] = {
        {{"mhc_expand_collapse_norm_q", "mhc_expand_collapse_norm+quant"},
         {"mhc_expand_collapse_norm_q_pdl", "mhc_expand_collapse_norm+quant_pdl"}},
        {{"mhc_norm_q", "mhc_norm+quant"}, {"mhc_norm_q_pdl", "mhc_norm+quant_pdl"}}};
    for (const bool split : {true, false}) {
      for (const int quant : {1, 2}) {
        MhcMode m;
        m.sized_ws = true;
        m.coefficients = !split;
        m.norm = true;
        m.norm_counter = split;
        m.quant = quant;
        m.name = kNames[split ? 0 : 1][0][quant - 1];
        for (int64_t n : {1, 4, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, m);
        m.pdl = true;
        m.name = kNames[split ? 0 : 1][1][quant - 1];
        for (int64_t n : {1, 4}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, m);
      }
    }
    // q_norm (q_lora_rank rows of 1280 at the perf profile, 1536 in V4.1-Flash) and a 5120-wide norm.
    for (const int64_t dim : {int64_t{1280}, int64_t{1536}, int64_t{5120}})
      for (const int64_t n : {int64_t{1}, int64_t{8}}) bench_norm_quant(n, dim, copy_gbps, stream->get(), rows);
  }
  // cuda-ffn: the cluster mHC, the packed MXFP4 expert layout, the device-routed experts and the rest.
  MhcMode cl;
  cl.cluster = true;
  for (int64_t n : {1, 4, 8, 20}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, cl);
  bench_mhc(1, 5120, 1, copy_gbps, stream->get(), rows, cl);
  cl.pdl = true;
  for (int64_t n : {1, 8}) bench_mhc(n, 5120, 20, copy_gbps, stream->get(), rows, cl);  // back-to-back, PDL
  }
  if (want("packed")) {
  bench_packed(shapes[5], 1, 1, copy_gbps, stream->get(), rows);
  bench_packed(shapes[6], 1, 1, copy_gbps, stream->get(), rows);
  for (int64_t n : {1, 4}) {
    bench_packed(shapes[5], 12, n, copy_gbps, stream->get(), rows);
    bench_packed(shapes[6], 6, n, copy_gbps, stream->get(), rows);
  }
  bench_packed(shapes[8], 1, 1, copy_gbps, stream->get(), rows);
  for (int64_t n : {1, 4}) {
    bench_packed(shapes[5], 12, n, copy_gbps, stream->get(), rows, true);
    bench_packed(shapes[6], 6, n, copy_gbps, stream->get(), rows, true);
  }
  bench_packed(shapes[8], 1, 1, copy_gbps, stream->get(), rows, true);
  }
  if (want("moe")) {
    DeviceBuffer<uint8_t> expert_pool;
    for (int64_t n : {1, 8, 64}) bench_moe_items(n, expert_pool, copy_gbps, stream->get(), rows);
  }
  if (want("small")) bench_ffn_small(copy_gbps, stream->get(), rows);
  if (want("small") || want("router")) bench_router_tail(copy_gbps, stream->get(), rows);
  if (want("wo_a")) bench_wo_a(copy_gbps, stream->get(), rows);
  if (want("attn")) {
    bench_attn_input(copy_gbps, stream->get(), rows);
    bench_sparse_attention(copy_gbps, stream->get(), rows);
    bench_indexer_select(copy_gbps, stream->get(), rows);
  }

  std::printf("%-24s %-30s %3s %10s %12s %8s %7s %12s\n", "kernel", "shape", "n", "us/call", "bytes", "GB/s", "%copy",
              "%copy-floor");
  for (const auto& r : rows) {
    const double net = r.us > floor_us ? r.bytes / ((r.us - floor_us) * 1e-6) / 1e9 : 0.0;
    std::printf("%-24s %-30s %3lld %10.2f %12.0f %8.0f %6.1f%% %11.1f%%\n", r.kernel.c_str(), r.shape.c_str(),
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
