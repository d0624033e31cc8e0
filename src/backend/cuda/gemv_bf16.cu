// BF16 GEMV / skinny GEMM on the tensor cores (attention_kernels.h).
//
// Per 32-wide K chunk, thread (g = lane/4, t = lane%4) of a warp loads the 8 consecutive bf16 values
// 8t..8t+7 of weight rows g and g+8 (one 16-byte load each) and of token g's activations, and two
// mma.sync m16n8k16 consume them: the first takes values 8t+{0,1} in k slots 2t, 2t+1 and 8t+{2,3} in
// 2t+8, 2t+9, the second values 8t+{4..7} alike (any permutation of k works when A and B share it; this
// one makes every load contiguous). bf16 × bf16 products are exact in fp32, so the result differs from
// cpu::linear's sequential fp32 sum only in the summation order. A block is 16 rows; its 8 warps split
// K (chunk c goes to warp c % 8), each keeping 16 rows × 8·kTiles tokens of accumulators, and the
// warps' partial sums are added in warp order. With few row tiles K is also split across blocks
// (split-K, same ticket scheme as gemv.cu: deterministic and graph-replayable).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"

namespace cedar::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16;          // the MMA's M
constexpr int kTokensPerTile = 8;  // the MMA's N
constexpr int kMaxTiles = 8;       // tokens per pass: up to 64
constexpr int kPassTokens = kTokensPerTile * kMaxTiles;
constexpr int kChunk = 32;  // K values per chunk (two k16 MMAs)
constexpr int kMinChunksPerSplit = 16;
constexpr int kBlocksPerSm = 4;  // for the split-K wave estimate (132 SMs on an H200)

struct Bf16Params {
  const uint16_t* w;
  int64_t out, in;
  int64_t w_group_stride;
  const float* x;
  int64_t x_row_stride, x_group_stride;
  float* y;
  int64_t y_row_stride, y_group_stride;
  int n;  // tokens of this pass (1..64)
  bool bf16_output;
  int ksplit;  // gridDim.y
  int chunks_per_split;
  float* split_partials;     // [groups][ksplit][64][out]
  unsigned* split_counters;  // [groups][row tiles]
};

__device__ __forceinline__ void mma_bf16(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values → bf16x2 (low half = first), RNE (exact for bf16-valued inputs).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return static_cast<uint32_t>(__bfloat16_as_ushort(h.x)) | (static_cast<uint32_t>(__bfloat16_as_ushort(h.y)) << 16);
}

template <int kTiles>
constexpr int kUnroll = kTiles >= 4 ? 1 : (kTiles == 2 ? 2 : 4);

// Block (x, y, z): rows [16x, 16x+16) of group z, K chunks of split y; tokens [0, n) of this pass.
template <int kTiles>
__global__ void __launch_bounds__(kWarps * 32) gemv_bf16_kernel(Bf16Params p) {
  constexpr int kTok = kTiles * kTokensPerTile;
  constexpr int kU = kUnroll<kTiles>;
  __shared__ float partial[kWarps][kRows][kTok];
  __shared__ bool is_last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t group = blockIdx.z;
  // Rows past `out` and tokens past `n` read row 0 / token 0 (valid memory); their outputs are never
  // written (an MMA row or column only feeds its own outputs).
  const int64_t r_lo = row0 + g < p.out ? row0 + g : 0;
  const int64_t r_hi = row0 + g + 8 < p.out ? row0 + g + 8 : 0;
  const uint16_t* wg = p.w + group * p.w_group_stride;
  const uint16_t* w_lo = wg + r_lo * p.in + 8 * t;
  const uint16_t* w_hi = wg + r_hi * p.in + 8 * t;
  const float* x_tile[kTiles];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int tok = i * kTokensPerTile + g;
    x_tile[i] = p.x + static_cast<int64_t>(tok < p.n ? tok : 0) * p.x_row_stride + group * p.x_group_stride + 8 * t;
  }
  const int n_chunks = static_cast<int>((p.in + kChunk - 1) / kChunk);
  const int c_begin = static_cast<int>(blockIdx.y) * p.chunks_per_split;
  const int c_end = min(n_chunks, c_begin + p.chunks_per_split);

  float acc[kTiles][4];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

  for (int c0 = c_begin + warp; c0 < c_end; c0 += kWarps * kU) {
    uint4 wl[kU], wh[kU];
    bool ok[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + u * kWarps;
      const int64_t k = static_cast<int64_t>(c) * kChunk + 8 * t;
      ok[u] = c < c_end && k < p.in;  // in % 8 == 0: a thread's 8 values are all inside or all outside
      wl[u] = ok[u] ? __ldg(reinterpret_cast<const uint4*>(w_lo + static_cast<int64_t>(c) * kChunk))
                    : make_uint4(0, 0, 0, 0);
      wh[u] = ok[u] ? __ldg(reinterpret_cast<const uint4*>(w_hi + static_cast<int64_t>(c) * kChunk))
                    : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + u * kWarps;
      const uint32_t a1[4] = {wl[u].x, wh[u].x, wl[u].y, wh[u].y};
      const uint32_t a2[4] = {wl[u].z, wh[u].z, wl[u].w, wh[u].w};
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
        if (ok[u]) {
          const float* xp = x_tile[i] + static_cast<int64_t>(c) * kChunk;
          x0 = __ldg(reinterpret_cast<const float4*>(xp));
          x1 = __ldg(reinterpret_cast<const float4*>(xp + 4));
        }
        mma_bf16(a1, pack_bf16x2(x0.x, x0.y), pack_bf16x2(x0.z, x0.w), acc[i]);
        mma_bf16(a2, pack_bf16x2(x1.x, x1.y), pack_bf16x2(x1.z, x1.w), acc[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int tok0 = i * kTokensPerTile + 2 * t;
    partial[warp][g][tok0] = acc[i][0];
    partial[warp][g][tok0 + 1] = acc[i][1];
    partial[warp][g + 8][tok0] = acc[i][2];
    partial[warp][g + 8][tok0 + 1] = acc[i][3];
  }
  __syncthreads();

  // Each thread owns outputs (row, tok) = (e / kTok, e % kTok) for e = threadIdx.x + j·256.
  constexpr int kOutputs = kRows * kTok;
  constexpr int kPerThread = (kOutputs + kWarps * 32 - 1) / (kWarps * 32);
  float sum[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int e = threadIdx.x + j * kWarps * 32;
    sum[j] = 0.0f;
    if (e < kOutputs) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum[j] += partial[w][e / kTok][e % kTok];
    }
  }
  auto writer = [&](int e) { return e < kOutputs && (e % kTok) < p.n && row0 + e / kTok < p.out; };
  if (p.ksplit > 1) {
    float* parts = p.split_partials + group * p.ksplit * kPassTokens * p.out;
    unsigned* counters = p.split_counters + group * gridDim.x;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int e = threadIdx.x + j * kWarps * 32;
      if (writer(e))
        parts[(static_cast<int64_t>(blockIdx.y) * kPassTokens + e % kTok) * p.out + row0 + e / kTok] = sum[j];
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(counters + blockIdx.x, 1u) == static_cast<unsigned>(p.ksplit - 1);
    __syncthreads();
    if (!is_last) return;
    __threadfence();
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int e = threadIdx.x + j * kWarps * 32;
      sum[j] = 0.0f;
      if (writer(e))
        for (int z = 0; z < p.ksplit; ++z)
          sum[j] += __ldcg(parts + (static_cast<int64_t>(z) * kPassTokens + e % kTok) * p.out + row0 + e / kTok);
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0;  // re-armed for the next launch / graph replay
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int e = threadIdx.x + j * kWarps * 32;
    if (writer(e)) {
      float* yp = p.y + static_cast<int64_t>(e % kTok) * p.y_row_stride + group * p.y_group_stride + row0 + e / kTok;
      *yp = p.bf16_output ? detail::round_bf16(sum[j]) : sum[j];
    }
  }
}

int64_t row_tiles(int64_t out) { return (out + kRows - 1) / kRows; }

int64_t choose_ksplit(int64_t out, int64_t in, int64_t groups) {
  const int64_t tiles = row_tiles(out) * groups;
  const int64_t wave = int64_t{kBlocksPerSm} * 132;
  const int64_t chunks = (in + kChunk - 1) / kChunk;
  const int64_t most = std::max<int64_t>(1, chunks / kMinChunksPerSplit);
  return std::max<int64_t>(1, std::min(wave / std::max<int64_t>(tiles, 1), most));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <int kTiles>
Status launch(const Bf16Params& p, dim3 grid, cudaStream_t stream) {
  gemv_bf16_kernel<kTiles><<<grid, kWarps * 32, 0, stream>>>(p);
  return launch_status("gemv_bf16_kernel");
}

}  // namespace

SplitKSize gemv_bf16_splitk_size(int64_t out, int64_t in, int64_t groups) {
  if (out <= 0 || in <= 0 || groups <= 0) return {};
  const int64_t ksplit = choose_ksplit(out, in, groups);
  if (ksplit <= 1) return {};
  return SplitKSize{groups * ksplit * kPassTokens * out, groups * row_tiles(out)};
}

Status gemv_bf16(const Bf16GemvArgs& a, cudaStream_t stream, const SplitKWorkspace& splitk) {
  const std::string shape = "[" + std::to_string(a.out) + ", " + std::to_string(a.in) + "]";
  auto fail = [&](const std::string& what) { return make_error("cuda::gemv_bf16 " + shape + ": " + what); };
  if (a.out <= 0 || a.in <= 0) return fail("empty weight");
  if (a.in % 8 != 0) return fail("in=" + std::to_string(a.in) + " is not a multiple of 8 (16-byte weight loads)");
  if (a.groups < 1 || a.groups > 65535) return fail("groups=" + std::to_string(a.groups) + " (1..65535)");
  if (a.n < 0) return fail("n=" + std::to_string(a.n));
  if (a.n == 0) return Status::Ok();
  if (a.w == nullptr || a.x == nullptr || a.y == nullptr) return fail("null weight, input or output");
  if (row_tiles(a.out) > 0x7FFFFFFF || a.in / kChunk > 0x3FFFFFFF) return fail("too large");
  Bf16Params p{};
  p.w = a.w;
  p.out = a.out;
  p.in = a.in;
  p.w_group_stride = a.w_group_stride != 0 ? a.w_group_stride : a.out * a.in;
  p.x = a.x;
  p.x_row_stride = a.x_row_stride != 0 ? a.x_row_stride : a.groups * a.in;
  p.x_group_stride = a.x_group_stride != 0 ? a.x_group_stride : a.in;
  p.y = a.y;
  p.y_row_stride = a.y_row_stride != 0 ? a.y_row_stride : a.groups * a.out;
  p.y_group_stride = a.y_group_stride != 0 ? a.y_group_stride : a.out;
  if (!aligned16(a.w) || p.w_group_stride % 8 != 0)
    return fail("weight must be 16-byte aligned with a group stride that is a multiple of 8 elements");
  if (!aligned16(a.x) || p.x_row_stride % 4 != 0 || p.x_group_stride % 4 != 0)
    return fail("input must be 16-byte aligned with strides that are multiples of 4 floats");
  p.bf16_output = a.bf16_output;

  int64_t ksplit = choose_ksplit(a.out, a.in, a.groups);
  const SplitKSize need = gemv_bf16_splitk_size(a.out, a.in, a.groups);
  if (ksplit > 1 && (splitk.partials == nullptr || splitk.counters == nullptr ||
                     splitk.partial_floats < need.partial_floats || splitk.counter_count < need.counters))
    ksplit = 1;  // no (or too small a) workspace: one block per row tile
  const int64_t chunks = (a.in + kChunk - 1) / kChunk;
  p.ksplit = static_cast<int>(ksplit);
  p.chunks_per_split = static_cast<int>((chunks + ksplit - 1) / ksplit);
  p.split_partials = splitk.partials;
  p.split_counters = splitk.counters;
  const dim3 grid(static_cast<unsigned>(row_tiles(a.out)), static_cast<unsigned>(ksplit),
                  static_cast<unsigned>(a.groups));
  for (int64_t t0 = 0; t0 < a.n; t0 += kPassTokens) {
    const int64_t nt = std::min<int64_t>(kPassTokens, a.n - t0);
    Bf16Params q = p;
    q.x = a.x + t0 * p.x_row_stride;
    q.y = a.y + t0 * p.y_row_stride;
    q.n = static_cast<int>(nt);
    const int64_t tiles = (nt + kTokensPerTile - 1) / kTokensPerTile;
    Status s = tiles <= 1   ? launch<1>(q, grid, stream)
               : tiles <= 2 ? launch<2>(q, grid, stream)
               : tiles <= 4 ? launch<4>(q, grid, stream)
                            : launch<8>(q, grid, stream);
    CEDAR_RETURN_IF_ERROR(s);
  }
  return Status::Ok();
}

// For the catalog's loadability check.
const void* gemv_bf16_kernel_ptr() { return reinterpret_cast<const void*>(&gemv_bf16_kernel<1>); }

}  // namespace cedar::cuda
