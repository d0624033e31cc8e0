// Shared pieces of cuda_kernels_bench (cuda_kernels_bench.cpp): the timing harness (a CUDA graph of one
// launch per weight copy, replayed), random device data, the result row, and the benchmark groups, one
// file each: kbench_gemv_mhc.cpp (FP8 / MXFP4 GEMVs, mHC, norms, wq_a + wkv, wo_a), kbench_ffn.cpp (packed
// experts, the routed path, router, Engram, head, samplers), kbench_attention.cpp (sparse attention, indexer).
#pragma once

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

namespace cedar::cuda::kbench {

// Weights rotate through at least this many bytes of copies, so every call reads them from HBM, not L2.
inline constexpr size_t kRotateBytes = size_t{256} << 20;
inline constexpr int kReplays = 20;

// Exit the benchmark with the error (a bench has nothing to recover).
template <typename T>
DeviceBuffer<T> must(Result<DeviceBuffer<T>> r) {
  if (!r.ok()) {
    std::fprintf(stderr, "bench: %s\n", r.error().message.c_str());
    std::exit(1);
  }
  return std::move(*r);
}
void must(const Status& s);

// --once (for Nsight Compute): every measurement launches call 0 once, eagerly; no timing.
void set_launch_once(bool once);
bool launch_once();

DeviceBuffer<uint8_t> random_bytes(size_t n, uint64_t seed, uint8_t lo, uint8_t span, uint8_t mask = 0xFF);
DeviceBuffer<float> random_floats(size_t n, uint32_t seed, float scale);
DeviceBuffer<float> tiled_floats(size_t n, uint32_t seed, float scale);

// Mean time of one launch (µs): `launch(i)` enqueues call i (i < count); captured once into a graph,
// replayed kReplays times after a warm-up replay.
double time_graph_us(cudaStream_t stream, int count, const std::function<void(int)>& launch);
// The same for launches that may be unsupported: a negative time instead of exiting on a failure.
double try_time_graph_us(cudaStream_t stream, int count, const std::function<Status(int)>& launch);

struct Row {
  std::string kernel, shape;
  int64_t n = 1;
  double us = 0, bytes = 0, gbps = 0, pct_copy = 0;
};

Row make_row(const std::string& kernel, const std::string& shape, int64_t n, double us, double bytes,
             double copy_gbps);
double launch_floor_us();

struct GemvShape {
  const char* name;
  QuantWeightFormat format;
  int64_t out, in;
};

// The operands of a grouped GEMV row: `count` matrices of shape s in enough copies to rotate through
// kRotateBytes (every graph node reads its weights from HBM), a random x as FP8 codes, and the outputs.
// Seeds: seed (weights), seed + 1 (scales), seed + 2 (x).
struct GroupedGemvInputs {
  int count = 0;
  int64_t n = 0, out = 0, in = 0;
  size_t w_bytes = 0, s_bytes = 0, group_bytes = 0;
  int copies = 0;
  DeviceBuffer<uint8_t> w, sc;
  DeviceBuffer<float> x;
  DeviceBuffer<uint16_t> codes;
  DeviceBuffer<float> ascales, y;
  std::vector<GemvGroupItem> items;
  // Copy c's items: matrix i writes y rows [i·n, (i + 1)·n).
  const GemvGroupItem* items_of(int c);
  // Bytes a launch moves: the weights and scales, the codes and their scales, the outputs.
  double bytes() const;
};
GroupedGemvInputs grouped_gemv_inputs(const GemvShape& s, int count, int64_t n, uint32_t seed, cudaStream_t stream);

// kbench_gemv_mhc.cpp
void bench_gemv(const GemvShape& s, const std::vector<int64_t>& ns, double copy_gbps, cudaStream_t stream,
                std::vector<Row>& rows);
void bench_grouped(const GemvShape& s, int count, int64_t n, double copy_gbps, cudaStream_t stream,
                   std::vector<Row>& rows);
void bench_mhc_all(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows);  // the mhc section
void bench_attn_input(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows);
void bench_wo_a(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows);
// kbench_ffn.cpp
void bench_packed(const GemvShape& s, int count, int64_t n, double copy_gbps, cudaStream_t stream,
                  std::vector<Row>& rows, bool balanced = false);
void bench_moe_items(int64_t n, DeviceBuffer<uint8_t>& pool, double copy_gbps, cudaStream_t stream,
                     std::vector<Row>& rows);
void bench_router_tail(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows);
void bench_ffn_small(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows);
// kbench_attention.cpp
void bench_sparse_attention(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows);
void bench_indexer_select(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows);
void bench_q_norm_kv(double copy_gbps, cudaStream_t stream, std::vector<Row>& rows);

}  // namespace cedar::cuda::kbench
