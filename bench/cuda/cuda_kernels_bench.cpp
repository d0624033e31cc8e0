// CUDA kernel benchmark (run on a GPU machine): achieved GB/s of the FP8 / MXFP4 GEMV at real V4.1
// shapes and of the fused mHC kernel, against the device copy bandwidth measured in the same run.
//
// Weights rotate through enough copies (>= 256 MiB) that every call reads them from HBM, not L2;
// each measurement replays a CUDA graph of one launch per copy (decode runs from graphs, so launch
// overhead is measured as a graph node, as in decode). Bytes counted: weights + scales + activations
// read + outputs written. Plain timed binary (CUDA events), not Google Benchmark: GPU time is what matters.
//
// usage: cuda_kernels_bench [--json FILE] [--once]   (--once: every kernel launched once, for ncu)
//
// The groups of rows live in kbench_*.cpp (kbench_common.h).

#include "kbench_common.h"

namespace cedar::cuda::kbench {
namespace {

int run(int argc, char** argv) {
  std::string json_path, sections;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
    else if (std::strcmp(argv[i], "--once") == 0) set_launch_once(true);
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
    // FP8 above 8 tokens: one launch for up to 64 (gemv_fp8_tokens.cu) where the shape takes no K split.
    for (const auto& s : shapes)
      bench_gemv(s, s.format == QuantWeightFormat::FP8Block ? std::vector<int64_t>{1, 4, 8, 16, 32, 64}
                                                           : std::vector<int64_t>{1, 4, 8},
                 copy_gbps, stream->get(), rows);
    // Routed experts of one token, top-6: w1 and w3 of 6 experts (12 matrices) in one launch, then w2 ×6.
    for (int64_t n : {1, 4}) {
      bench_grouped(shapes[5], 12, n, copy_gbps, stream->get(), rows);
      bench_grouped(shapes[6], 6, n, copy_gbps, stream->get(), rows);
    }
    // The shared expert's w1 and w3 as the model launches them at decode (one grouped launch of 2): s29 put its
    // chain beside the router on the critical path of the routed w1/w3 (docs/cuda.md "Next").
    for (int64_t n : {1, 8}) bench_grouped(shapes[3], 2, n, copy_gbps, stream->get(), rows);
  }
  if (want("mhc")) bench_mhc_all(copy_gbps, stream->get(), rows);
  if (want("packed")) {
    for (const bool balanced : {false, true}) {  // the packed layout, then its balanced form
      if (!balanced) {
        bench_packed(shapes[5], 1, 1, copy_gbps, stream->get(), rows);
        bench_packed(shapes[6], 1, 1, copy_gbps, stream->get(), rows);
      }
      for (int64_t n : {1, 4}) {
        bench_packed(shapes[5], 12, n, copy_gbps, stream->get(), rows, balanced);
        bench_packed(shapes[6], 6, n, copy_gbps, stream->get(), rows, balanced);
      }
      bench_packed(shapes[8], 1, 1, copy_gbps, stream->get(), rows, balanced);
    }
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
    bench_q_norm_kv(copy_gbps, stream->get(), rows);
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
}  // namespace cedar::cuda::kbench

int main(int argc, char** argv) { return cedar::cuda::kbench::run(argc, argv); }
