// The pipelined streaming (prefill) mHC kernel (MhcFusedArgs::legacy_stream = false, the default): the
// session-4 streaming kernel (mhc.cu) with its memory and its FMAs overlapped (docs/cuda.md "Session 5
// (s-mhc)").
//
// Why the session-4 kernel stopped at 54 % of copy (8 192 rows; its expand / collapse alone reach 84 %):
// per 32-channel chunk a block waited for the chunk's copies, expanded it (no load in flight), only then
// issued the next chunk's copies and ran the 25 × 128 × 64 FMAs: at most one chunk (40 KB) of loads in
// flight per block, and none during the expand, so the memory time (~470 µs) and the FMA + expand issue
// time (~240 µs) added up (719 µs measured ≈ 468 + 251). Its 640 blocks (2.42 waves of 264) added a
// part-empty third wave.
//
// Here: chunks of 16 channels × 4 streams with a 3-stage cp.async ring (X, y, fn of chunks c + 1 and
// c + 2 in flight while chunk c is expanded and multiplied; the copies of c + 2 are issued before the
// expand of c), 100 KB of shared memory per block (2 blocks per SM), and one wave: splits =
// resident blocks / tiles (e.g. 2 splits × 128 tiles = 256 blocks at 8 192 rows, 8 × 32 at 2 048).
// Expand / collapse have the same expressions (mhc_common.cuh: bit-exact); the 25 sums per token are the
// same FMAs in another order (each warp sums channels ≡ warp (mod 8) of every stream, 16-channel chunks,
// the splits in order by mhc_stream_finish): ~1e-7 relative from the session-4 kernel's sums.
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mhc_common.cuh"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda::mhc_detail {
namespace {

constexpr int kPThreads = 256;
constexpr int kPWarps = kPThreads / 32;
constexpr int kPTokens = 64;                       // per block; FMA phase: lane = tokens lane and lane + 32
constexpr int kPCh = 16;                           // channels per chunk
constexpr int kPValues = kHc * kPCh;               // 64 values (4 streams × 16 channels) per chunk
constexpr int kPStages = 3;                        // the cp.async ring
constexpr int kPXs = kPTokens + 1;                 // row stride of xs [value][token]: conflict-free
constexpr int kPCoef = 2 * kHc + kHc * kHc + kHc;  // post[4], comb[16], cw[4] per token
constexpr int kPCoefStride = kPCoef + 1;           // odd: the half-warps' tokens (16 apart) read distinct banks
constexpr int kPBlocksPerSm = 2;                   // __launch_bounds__ and 100 KB of shared memory per block
constexpr int kPX = kPTokens * kPValues;           // floats of one X stage [token][stream][16]
constexpr int kPY = kPTokens * kPCh;               // one y stage [token][16]
constexpr int kPF = kPValues * kMix;               // one fn stage [value][24]
constexpr int kPStage = kPX + kPY + kPF;
constexpr int kPFloats = kPStages * kPStage + kPValues * kPXs + kPTokens * kPCoefStride;
static_assert(kPX / 4 == 4 * kPThreads && kPY / 4 == kPThreads && kPF == 6 * kPThreads, "prefetch's piece mapping");
static_assert(kPStages * kPStage >= kPWarps * kSlot * 32, "the final reduction reuses the stages");
constexpr size_t kPSmemBytes = sizeof(float) * static_cast<size_t>(kPFloats);  // 102 912 B

struct PipeParams {
  MhcFusedArgs a;  // strides resolved
  int chunks_per_split;
  float* partials;  // [split][n][kSlot]
};

__device__ __forceinline__ void cp16(float* dst, const float* src) {
  asm volatile(
      "cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
      "l"(src)
      : "memory");
}
__device__ __forceinline__ void cp4(float* dst, const float* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Element offsets of this thread's copy rows (32-bit: the host checks n·4d < 2^32), tokens past n
// clamped to the tile's first token (read, never stored).
struct PipeOffsets {
  uint32_t x[4];  // X pieces q: token tid / 16 + 16q, stream (tid / 4) % 4
  uint32_t y;     // y piece: token tid / 4
};

// Chunk ch's X / y / fn into stage buffers (asynchronous; the caller commits). Thread tid copies 16-byte
// quarter tid % 4 of X rows (token, stream) = tid / 4 + 64q and of y row tid / 4, and the fn values
// e = tid + 256q (row r = e / 16 = (i, stream), channel e % 16) transposed to fs[stream·16 + ch][i].
__device__ __forceinline__ void pipe_prefetch(const MhcFusedArgs& a, const PipeOffsets& o, int64_t ch, float* xst,
                                              float* yst, float* fs, int tid) {
  const uint32_t d = static_cast<uint32_t>(a.d), width = kHc * d;
  const uint32_t c0 = static_cast<uint32_t>(ch) * kPCh;
  const int quarter = tid & 3, j = (tid >> 2) & 3;
  const float* xb = a.X + c0 + j * d + 4 * quarter;
#pragma unroll
  for (int q = 0; q < 4; ++q) cp16(xst + (tid / 4 + 64 * q) * kPCh + 4 * quarter, xb + o.x[q]);
  if (a.y) cp16(yst + (tid / 4) * kPCh + 4 * quarter, a.y + o.y + c0 + 4 * quarter);
  const int c = tid & 15;
  const float* fb = a.fn + c0 + c;
#pragma unroll
  for (int q = 0; q < 6; ++q) {
    const int r = tid / 16 + 16 * q, i = r / kHc, jj = r % kHc;
    cp4(fs + (jj * kPCh + c) * kMix + i, fb + i * width + jj * d);
  }
}

// Block (tile x, split y). Iteration k (chunk ch): wait for chunk k's group, barrier, issue chunk
// k + 2's copies into the stage chunk k - 1 used, expand / collapse / store chunk k into xs, barrier,
// FMAs over xs and chunk k's fn. Expand: warp w, lane (h = lane / 16, c = lane % 16) takes token
// w + 8u (u = 4(p / 2) + p % 2 + 2h, passes p = 0..3): the half-warps' tokens differ by 16, so the xs
// stores are conflict-free, and half 1 reads the streams in the order 1, 0, 3, 2 (conflict-free X loads).
__global__ void __launch_bounds__(kPThreads, 2) mhc_stream_pipe_kernel(PipeParams p) {
  const MhcFusedArgs& a = p.a;
  extern __shared__ __align__(16) float smem[];
  float* fs_ring = smem;                     // kPStages × [kPValues][24]
  float* x_ring = fs_ring + kPStages * kPF;  // kPStages × [token][stream][16]
  float* y_ring = x_ring + kPStages * kPX;   // kPStages × [token][16]
  float* xs = y_ring + kPStages * kPY;       // [kPValues][kPXs]
  float* coef = xs + kPValues * kPXs;        // [kPTokens][kPCoefStride]
  detail::pdl_launch_dependents();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t d = a.d, width = kHc * d, n = a.n;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kPTokens;
  const int64_t n_chunks = d / kPCh;
  const int64_t ch_begin = static_cast<int64_t>(blockIdx.y) * p.chunks_per_split;
  const int64_t ch_end = min(n_chunks, ch_begin + p.chunks_per_split);
  const int64_t count = ch_end - ch_begin;
  PipeOffsets off;
  {
    const uint32_t w32 = static_cast<uint32_t>(width), d32 = static_cast<uint32_t>(d);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int64_t t = tid / 16 + 16 * q;
      off.x[q] = static_cast<uint32_t>((t0 + t < n ? t0 + t : t0) * w32);
    }
    const int64_t t = tid / 4;
    off.y = static_cast<uint32_t>((t0 + t < n ? t0 + t : t0) * d32);
  }
  detail::pdl_wait();
#pragma unroll
  for (int k = 0; k < kPStages - 1; ++k) {
    if (k < count) pipe_prefetch(a, off, ch_begin + k, x_ring + k * kPX, y_ring + k * kPY, fs_ring + k * kPF, tid);
    cp_commit();  // (empty groups keep the group count = chunks + 2)
  }
  for (int q = tid; q < kPTokens * kPCoef; q += kPThreads) {
    const int t = q / kPCoef, r = q % kPCoef;
    const int64_t tok = t0 + t < n ? t0 + t : t0;
    float v = 0.0f;
    if (r < kHc)
      v = a.y ? a.post[tok * a.post_stride + r] : 0.0f;
    else if (r < kHc + kHc * kHc)
      v = a.y ? a.comb[tok * a.comb_stride + (r - kHc)] : 0.0f;
    else
      v = a.collapse_w ? a.collapse_w[tok * a.collapse_w_stride + (r - kHc - kHc * kHc)] : 0.0f;
    coef[t * kPCoefStride + r] = v;
  }
  float acc0[kSlot], acc1[kSlot];  // tokens lane and lane + 32
#pragma unroll
  for (int i = 0; i < kSlot; ++i) acc0[i] = acc1[i] = 0.0f;
  const int h = lane >> 4, c = lane & 15;

#pragma unroll 1
  for (int64_t k = 0; k < count; ++k) {
    const int s = static_cast<int>(k % kPStages);
    cp_wait_one();    // chunk k's group (at most the newest one, chunk k + 1's, pending)
    __syncthreads();  // chunk k visible; every warp is done with chunk k - 1 (xs, its stage) and coef is stored
    {
      const int s2 = static_cast<int>((k + 2) % kPStages);
      if (k + 2 < count)
        pipe_prefetch(a, off, ch_begin + k + 2, x_ring + s2 * kPX, y_ring + s2 * kPY, fs_ring + s2 * kPF, tid);
      cp_commit();
    }
    const float* xst = x_ring + s * kPX;
    const float* yst = y_ring + s * kPY;
    const int64_t col = (ch_begin + k) * kPCh + c;
#pragma unroll 2
    for (int pass = 0; pass < 4; ++pass) {
      const int tl = warp + kPWarps * (4 * (pass >> 1) + (pass & 1) + 2 * h);
      const int64_t tok = t0 + tl;
      const bool valid = tok < n;
      const float* cf = coef + tl * kPCoefStride;
      float xr[kHc], x[kHc], v[kHc];
#pragma unroll
      for (int q = 0; q < kHc; ++q) xr[q] = xst[(tl * kHc + (q ^ h)) * kPCh + c];
#pragma unroll
      for (int j = 0; j < kHc; ++j) x[j] = h ? xr[j ^ 1] : xr[j];
      if (a.y) {
        expand_channel(x, yst[tl * kPCh + c], cf, cf + kHc, v);
      } else {
#pragma unroll
        for (int j = 0; j < kHc; ++j) v[j] = x[j];
      }
      if (valid) {
        if (a.y) {
#pragma unroll
          for (int j = 0; j < kHc; ++j) a.X_out[tok * width + j * d + col] = v[j];
        }
        if (a.collapse_w) a.collapsed[tok * d + col] = collapse_channel(v, cf + kHc + kHc * kHc);
      }
#pragma unroll
      for (int j = 0; j < kHc; ++j) xs[(j * kPCh + c) * kPXs + tl] = valid ? v[j] : 0.0f;
    }
    __syncthreads();  // xs complete
    const float* fs = fs_ring + s * kPF;
    // Warp w: values w and w + 8 of each stream (v = w + 8vv), lane: tokens lane and lane + 32.
#pragma unroll 1
    for (int vv = 0; vv < kPValues / kPWarps; ++vv) {
      const int vi = warp + kPWarps * vv;
      const float x0 = xs[vi * kPXs + lane], x1 = xs[vi * kPXs + lane + 32];
      const float4* f4 = reinterpret_cast<const float4*>(fs + vi * kMix);
#pragma unroll
      for (int q = 0; q < kMix / 4; ++q) {
        const float4 f = f4[q];
        acc0[4 * q] = fmaf(f.x, x0, acc0[4 * q]);
        acc0[4 * q + 1] = fmaf(f.y, x0, acc0[4 * q + 1]);
        acc0[4 * q + 2] = fmaf(f.z, x0, acc0[4 * q + 2]);
        acc0[4 * q + 3] = fmaf(f.w, x0, acc0[4 * q + 3]);
        acc1[4 * q] = fmaf(f.x, x1, acc1[4 * q]);
        acc1[4 * q + 1] = fmaf(f.y, x1, acc1[4 * q + 1]);
        acc1[4 * q + 2] = fmaf(f.z, x1, acc1[4 * q + 2]);
        acc1[4 * q + 3] = fmaf(f.w, x1, acc1[4 * q + 3]);
      }
      acc0[kMix] = fmaf(x0, x0, acc0[kMix]);
      acc1[kMix] = fmaf(x1, x1, acc1[kMix]);
    }
  }
  // The 8 warps' sums per (token, slot) in warp order, through the stage ring (no copies pending).
  cp_wait_all();
  __syncthreads();
  float* red = smem;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
    for (int i = 0; i < kSlot; ++i) red[(warp * kSlot + i) * 32 + lane] = hh ? acc1[i] : acc0[i];
    __syncthreads();
    for (int o = tid; o < kSlot * 32; o += kPThreads) {
      const int i = o / 32, tl = o % 32;
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kPWarps; ++w) sum += red[(w * kSlot + i) * 32 + tl];
      const int64_t tok = t0 + 32 * hh + tl;
      if (tok < n) p.partials[(static_cast<int64_t>(blockIdx.y) * n + tok) * kSlot + i] = sum;
    }
    __syncthreads();
  }
}

}  // namespace

StreamSplit stream_pipe_plan(int64_t n, int64_t d, int64_t resident_blocks, int64_t max_splits) {
  StreamSplit s;
  s.tiles = (n + kPTokens - 1) / kPTokens;
  const int64_t chunks = d / kPCh;
  const int64_t want = std::clamp<int64_t>(std::min(resident_blocks / std::max<int64_t>(s.tiles, 1), max_splits), 1,
                                           std::max<int64_t>(chunks, 1));
  s.chunks_per_split = (chunks + want - 1) / want;
  s.splits = (chunks + s.chunks_per_split - 1) / s.chunks_per_split;  // no empty splits, <= want
  return s;
}

Status mhc_stream_pipe(const MhcFusedArgs& a, float* partials, int64_t max_splits, cudaStream_t stream) {
  static_assert(kPSmemBytes <= 113 * 1024, "two blocks per SM");
  CEDAR_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(mhc_stream_pipe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(kPSmemBytes)));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(mhc_stream_pipe_kernel,
                                                  cudaFuncAttributePreferredSharedMemoryCarveout,
                                                  static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  int device = 0, sms = 0;
  CEDAR_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const StreamSplit sp = stream_pipe_plan(a.n, a.d, int64_t{std::max(sms, 1)} * kPBlocksPerSm, max_splits);
  if (sp.tiles > 0x7FFFFFFF || sp.splits > 65535)
    return make_error("cuda::mhc_fused: n=" + std::to_string(a.n) + " too large for the streaming kernel");
  PipeParams p{a, static_cast<int>(sp.chunks_per_split), partials};
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(sp.tiles), static_cast<unsigned>(sp.splits));
  cfg.blockDim = dim3(kPThreads);
  cfg.dynamicSmemBytes = kPSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = a.programmatic_launch ? 1 : 0;
  CEDAR_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, mhc_stream_pipe_kernel, p));
  CEDAR_RETURN_IF_ERROR(launch_status("mhc_stream_pipe_kernel"));
  return mhc_stream_finish(a, partials, static_cast<int>(sp.splits), stream);
}

const void* mhc_stream_pipe_kernel_ptr() { return reinterpret_cast<const void*>(&mhc_stream_pipe_kernel); }

}  // namespace cedar::cuda::mhc_detail
