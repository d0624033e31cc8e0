// Helpers shared by the attention parity tests (attention_*_cutest.cpp): device transfers, random
// bf16 data, bf16 weight bits, and the GPU gate extended by the attention kernels' loadability.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/device_buffer.h"
#include "core/numeric.h"
#include "cuda_test_util.h"

namespace cedar::cuda::testing {

// CEDAR_REQUIRE_GPU, then a hard failure (not a skip) if the attention kernels cannot load.
#define CEDAR_REQUIRE_GPU_ATTN()                                                                \
  do {                                                                                          \
    CEDAR_REQUIRE_GPU();                                                                        \
    const ::cedar::Status cedar_attn_load_ = ::cedar::cuda::check_attention_kernels_loadable(); \
    ASSERT_TRUE(cedar_attn_load_.ok()) << cedar_attn_load_.error().message;                     \
  } while (0)

template <typename T>
DeviceBuffer<T> to_device(const std::vector<T>& v) {
  auto b = DeviceBuffer<T>::from_host(v);
  EXPECT_TRUE(b.ok()) << b.error().message;
  return b.ok() ? std::move(*b) : DeviceBuffer<T>();
}
// Synchronizes the device first (surfacing asynchronous faults as a test failure).
template <typename T>
std::vector<T> to_host(const DeviceBuffer<T>& b) {
  const cudaError_t err = cudaDeviceSynchronize();
  EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
  auto v = b.to_host();
  EXPECT_TRUE(v.ok()) << v.error().message;
  return v.ok() ? *v : std::vector<T>();
}
template <typename T>
DeviceBuffer<T> device_alloc(size_t n) {
  auto b = DeviceBuffer<T>::allocate(n);
  EXPECT_TRUE(b.ok()) << b.error().message;
  return b.ok() ? std::move(*b) : DeviceBuffer<T>();
}
// A buffer filled with `value` bytes (e.g. 0xFF: NaN floats, so unwritten outputs are caught).
template <typename T>
DeviceBuffer<T> device_filled(size_t n, uint8_t value) {
  auto b = device_alloc<T>(n);
  if (n > 0) {
    EXPECT_EQ(cudaMemset(b.get(), value, n * sizeof(T)), cudaSuccess);
  }
  return b;
}

// bf16 values, normal(0, 1) times a per-`block` power of two in [2^lo, 2^hi] (block 0: one scale).
inline std::vector<float> random_bf16(size_t n, uint32_t seed, int lo = 0, int hi = 0, size_t block = 32) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(lo, hi);
  std::vector<float> v(n);
  float scale = std::ldexp(1.0f, ex(rng));
  for (size_t i = 0; i < n; ++i) {
    if (block > 0 && i % block == 0) scale = std::ldexp(1.0f, ex(rng));
    v[i] = round_to_bf16(nd(rng) * scale);
  }
  return v;
}

// bf16 bits of bf16-exact floats, and the little-endian bytes cpu::LinearWeight expects.
inline std::vector<uint16_t> bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}
inline std::vector<uint8_t> bf16_bytes(const std::vector<uint16_t>& bits) {
  std::vector<uint8_t> b(bits.size() * 2);
  std::memcpy(b.data(), bits.data(), b.size());  // little-endian host
  return b;
}

// The released V4.1 ropes (§3.1): compress rope (θ = 160000 + YaRN) and main rope (θ = 10000).
inline cpu::RopeConfig compress_rope_config(int64_t rope_dim) {
  return cpu::RopeConfig{.rope_dim = rope_dim,
                         .base = 160000.0,
                         .yarn_factor = 16.0,
                         .beta_fast = 32.0,
                         .beta_slow = 1.0,
                         .original_max_position = 65536};
}
inline cpu::RopeConfig main_rope_config(int64_t rope_dim) { return cpu::RopeConfig{.rope_dim = rope_dim}; }

// A RopeTable's cos/sin table for positions [0, positions) on the device.
struct DeviceRope {
  DeviceBuffer<float> table;
  RopeTableView view;
};
inline DeviceRope device_rope(const cpu::RopeTable& t, int64_t positions) {
  DeviceRope r;
  r.table = to_device(rope_cos_sin_table(t.inv_freq().data(), t.rope_dim(), positions));
  r.view = RopeTableView{r.table.get(), positions, t.rope_dim()};
  return r;
}

inline std::string shape_str(int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); }

}  // namespace cedar::cuda::testing
