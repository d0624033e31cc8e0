// The streaming (prefill) mHC in 64-channel chunks (s8-mhcstream; docs/cuda-log.md "mHC stream (s8-mhcstream)").
// Same job as mhc_stream_tc_kernel (mhc.cu): expand + collapse + stores of X_out / collapsed, and the
// 24 dot products + Σ X_new² of every token on the tensor cores (3xTF32), per channel split into
// partials[split][n][25]; a finish kernel adds the splits and runs the coefficients.
//
// What changes against the 32-channel kernel, and why (counted from its SASS, s8):
// * Tiles of 32 tokens × chunks of 64 channels (the same 32 KB of X per chunk): every (token, stream)
//   row is read and written in 256-byte runs instead of 128-byte ones, and a thread expands two
//   adjacent channels (float2 loads / stores: half the address arithmetic, coefficient loads and store
//   instructions per value). The 32-channel kernel issues ~1 640 warp instructions per warp and chunk
//   (~1 090 of them the expand); this one ~900 for the same bytes.
// * X_new is written back in place into the staging buffer it came from (each thread rewrites only the
//   values it read), two staging buffers alternate: no register hoist of X (32 registers) and one
//   barrier less per chunk (two instead of three).
// * fn is not staged: each lane loads its B fragments (6 float4, the warp's own 32 values × 24) straight
//   from L2 into registers one chunk ahead; the MMA's k index is permuted (fragment column t / t + 4 ↔
//   values 4t + 2(s & 1) + {0, 1} of the 16-value half s >> 1) so A and B are read as float4.
// Expand / collapse are the same expand_channel / collapse_channel calls on the same values: X_out and
// collapsed have the bits of every other path. The coefficients' sums run in another blocked order.
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mhc_common.cuh"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda::mhc_detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTok = kC64Tokens;
constexpr int kCh = kC64Channels;
constexpr int kVals = kHc * kCh;  // 256 values per token and chunk, [stream][channel]
// Row stride of a staging buffer (≡ 16 mod 32 words): the A fragments' float4 loads — lanes 4g + t read
// row g, words 4t..4t+3 — fill the 32 banks once per quarter warp; the expand's float2 accesses (lane =
// channel pair) are consecutive.
constexpr int kRow = kVals + 16;
constexpr int kXBuf = kTok * kRow;  // floats per staging buffer
constexpr int kYBuf = kTok * kCh;
constexpr size_t kSmemBytes = sizeof(float) * (2 * kXBuf + 2 * kYBuf + kTok * kCoef);  // 89 088 B
static_assert(2 * (kSmemBytes + 1024) <= 228 * 1024, "2 blocks per SM");
static_assert(kWarps * kTok * kSlot <= 2 * kXBuf, "the block's final reduction fits in the staging buffers");
static_assert(kTok * kHc * kCh / 4 == 8 * kThreads && kTok * kCh / 4 == 2 * kThreads, "the copy piece map");
static_assert(kWarps == 2 * kHc && kTok == 32, "the MMA warp map: warp = (stream, 32-channel half), 2 m16 tiles");
constexpr int64_t kTargetBlocks = 6 * 132;       // as the 32-channel kernel's sweep (s6 run 8)
constexpr int64_t kTargetBlocksSmall = 4 * 132;  // below 128 tiles (4 096 rows)
constexpr int64_t kManyTiles = 128;

struct C64Params {
  MhcFusedArgs a;  // strides resolved
  int chunks_per_split;
  float* partials;  // [split][n][kSlot]
};

using detail::cp_async16;  // cp_async.cuh
using detail::cp_async_commit;
using detail::smem_addr;

// The pair of values of k-step s (0..3) in a lane's two float4 (values 4t..4t+3 and 16+4t..16+4t+3 of
// the warp's 32): fragment column t gets .first, column t + 4 gets .second.
__device__ __forceinline__ float2 kpair(const float4& lo, const float4& hi, int s) {
  const float4& q = s < 2 ? lo : hi;
  return (s & 1) ? make_float2(q.z, q.w) : make_float2(q.x, q.y);
}

// Block (tile x = 32 tokens, split y = a channel range). Per chunk: wait for its copies, barrier (the
// chunk is visible; every warp is past the previous chunk's MMAs, so the other buffers are free), issue
// the next chunk's X / y copies into the other buffers (in flight during this chunk's expand and
// MMAs), expand / collapse / store with X_new written in place, barrier, MMAs, then the next chunk's
// fn fragments into registers (in flight during the next barrier and expand).
// No mbarrier or spin-wait: cp.async.wait_all and __syncthreads only, every thread runs the same
// chunk loop (its bounds depend on blockIdx only), so the kernel cannot wait on something never issued.
template <bool kSplitA>
__global__ void __launch_bounds__(kThreads, 2) mhc_stream_c64_kernel(C64Params p) {
  const MhcFusedArgs& a = p.a;
  extern __shared__ __align__(16) float smem[];
  float* xbuf = smem;              // 2 × [kTok][kRow]: X of the chunk, then X_new in place
  float* ybuf = xbuf + 2 * kXBuf;  // 2 × [kTok][kCh]
  float* coef = ybuf + 2 * kYBuf;  // [kTok][kCoef]: post[4], comb[16], collapse_w[4]
  detail::pdl_launch_dependents();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;              // fragment row / column group of this lane
  const int js = warp >> 1;                           // MMA: the stream of this warp's k slice
  const int vb = js * kCh + 32 * (warp & 1) + 4 * t;  // this lane's first A value in a token row
  const int64_t d = a.d, width = kHc * d, n = a.n;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTok;
  const int64_t n_chunks = d / kCh;
  const int64_t ch_begin = static_cast<int64_t>(blockIdx.y) * p.chunks_per_split;
  const int64_t ch_end = min(n_chunks, ch_begin + p.chunks_per_split);
  const int last = static_cast<int>(n - t0 < kTok ? n - t0 : kTok) - 1;  // tokens past n read token t0

  // Chunk ch's X rows (thread: 16-byte piece tid % 16 of rows tid / 16 + 16q, row = token · 4 + stream,
  // i.e. token tid / 64 + 4q, stream (tid / 16) % 4) and y rows (token tid / 16 + 16q) into buffer b.
  // Shared addresses as one 32-bit base plus constants; global ones as 32-bit element offsets (the host
  // checks n · 4d < 2^32).
  const uint32_t s_x = smem_addr(xbuf) +
                       4 * ((tid >> 6) * kRow + ((tid >> 4) & 3) * kCh + 4 * (tid & 15));
  const uint32_t s_y = smem_addr(ybuf) + 4 * ((tid >> 4) * kCh + 4 * (tid & 15));
  auto prefetch = [&](int64_t ch, int b) {
    const uint32_t d32 = static_cast<uint32_t>(d), w32 = kHc * d32;
    const uint32_t c = static_cast<uint32_t>(ch) * kCh + 4 * (tid & 15);
    const float* xsrc = a.X + (((tid >> 4) & 3) * d32 + c);
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const int tl = (tid >> 6) + 4 * q;
      const uint32_t tok = static_cast<uint32_t>(t0) + (tl <= last ? tl : 0);
      cp_async16(s_x + 4 * (b * kXBuf + 4 * q * kRow), xsrc + tok * w32);
    }
    if (a.y) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int tl = (tid >> 4) + 16 * q;
        const uint32_t tok = static_cast<uint32_t>(t0) + (tl <= last ? tl : 0);
        cp_async16(s_y + 4 * (b * kYBuf + 16 * q * kCh), a.y + (tok * d32 + c));
      }
    }
    cp_async_commit();
  };
  // This lane's B fragments of chunk ch: fn rows 8ni + g, values vb..vb+3 and vb+16..vb+19 of the chunk.
  auto load_fn = [&](int64_t ch, float4(&f)[3][2]) {
    const float* fb = a.fn + js * d + ch * kCh + 32 * (warp & 1) + 4 * t;
#pragma unroll
    for (int ni = 0; ni < 3; ++ni) {
      const float4* row = reinterpret_cast<const float4*>(fb + (8 * ni + g) * width);
      f[ni][0] = __ldg(row);
      f[ni][1] = __ldg(row + 4);
    }
  };

  detail::pdl_wait();
  prefetch(ch_begin, 0);
  for (int q = tid; q < kTok * kCoef; q += kThreads) {
    const int tl = q / kCoef;
    coef[q] = mix_coefficient(a, t0 + (tl <= last ? tl : 0), q % kCoef);
  }
  float4 f[3][2];
  load_fn(ch_begin, f);
  float acc[2][3][4];  // rows 16mi + g (+8), slots 8ni + 2t (+1)
  float sq[2][2];      // Σ x² of rows 16mi + g and + 8 (this lane's values)
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
    sq[mi][0] = sq[mi][1] = 0.0f;
#pragma unroll
    for (int ni = 0; ni < 3; ++ni)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.0f;
  }

#pragma unroll 1
  for (int64_t ch = ch_begin; ch < ch_end; ++ch) {
    const int b = static_cast<int>((ch - ch_begin) & 1);
    float* xs = xbuf + b * kXBuf;
    const float* ys = ybuf + b * kYBuf;
    cp_async_wait_all();
    __syncthreads();  // chunk ch (and coef) visible; every warp is past chunk ch − 1's MMAs on buffer b ^ 1
    if (ch + 1 < ch_end) prefetch(ch + 1, b ^ 1);
    // Expand / collapse / stores: warp w, tokens w + 8u, lane = channels 2·lane, 2·lane + 1 of the chunk.
    // kSplitA == !a.y (the dispatch): the expand is a compile-time branch. 32-bit element offsets.
    const uint32_t c = static_cast<uint32_t>(ch) * kCh + 2 * lane;
#pragma unroll 2
    for (int u = 0; u < kTok / kWarps; ++u) {
      const int tl = warp + kWarps * u;
      const uint32_t tok = static_cast<uint32_t>(t0) + tl;
      const bool valid = tl <= last;
      float* xr = xs + tl * kRow + 2 * lane;
      const float* cf = coef + tl * kCoef;
      float x0[kHc], x1[kHc], v0[kHc], v1[kHc];
#pragma unroll
      for (int j = 0; j < kHc; ++j) {
        const float2 xv = *reinterpret_cast<const float2*>(xr + j * kCh);
        x0[j] = xv.x;
        x1[j] = xv.y;
      }
      if constexpr (!kSplitA) {
        const float2 yv = *reinterpret_cast<const float2*>(ys + tl * kCh + 2 * lane);
        expand_channel(x0, yv.x, cf, cf + kHc, v0);
        expand_channel(x1, yv.y, cf, cf + kHc, v1);
      } else {
#pragma unroll
        for (int j = 0; j < kHc; ++j) {
          v0[j] = x0[j];
          v1[j] = x1[j];
        }
      }
      if (valid) {
        if constexpr (!kSplitA) {
          float* xo = a.X_out + (tok * static_cast<uint32_t>(width) + c);
#pragma unroll
          for (int j = 0; j < kHc; ++j) *reinterpret_cast<float2*>(xo + j * d) = make_float2(v0[j], v1[j]);
        }
        if (a.collapse_w) {
          const float* cw = cf + kHc + kHc * kHc;
          *reinterpret_cast<float2*>(a.collapsed + (tok * static_cast<uint32_t>(d) + c)) =
              make_float2(collapse_channel(v0, cw), collapse_channel(v1, cw));
        }
      }
#pragma unroll
      for (int j = 0; j < kHc; ++j)
        *reinterpret_cast<float2*>(xr + j * kCh) = valid ? make_float2(v0[j], v1[j]) : make_float2(0.0f, 0.0f);
    }
    __syncthreads();  // X_new of the chunk complete
    // D[32 tokens][24] += X_new[32][256] · fn^T[256][24]: warp = (stream js, channel half), its 32 values
    // in 4 k-steps, 2 m16 tiles × 3 n8 tiles. Each chunk's MMAs start from zero and are added (RN) into
    // acc: the tensor cores' truncating accumulation never chains beyond one chunk.
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const float* r0 = xs + (16 * mi + g) * kRow + vb;
      const float* r1 = r0 + 8 * kRow;
      const float4 a0lo = *reinterpret_cast<const float4*>(r0), a0hi = *reinterpret_cast<const float4*>(r0 + 16);
      const float4 a1lo = *reinterpret_cast<const float4*>(r1), a1hi = *reinterpret_cast<const float4*>(r1 + 16);
      float s0 = sq[mi][0], s1 = sq[mi][1];
      s0 = fmaf(a0lo.x, a0lo.x, s0), s0 = fmaf(a0lo.y, a0lo.y, s0), s0 = fmaf(a0lo.z, a0lo.z, s0);
      s0 = fmaf(a0lo.w, a0lo.w, s0), s0 = fmaf(a0hi.x, a0hi.x, s0), s0 = fmaf(a0hi.y, a0hi.y, s0);
      s0 = fmaf(a0hi.z, a0hi.z, s0), s0 = fmaf(a0hi.w, a0hi.w, s0);
      s1 = fmaf(a1lo.x, a1lo.x, s1), s1 = fmaf(a1lo.y, a1lo.y, s1), s1 = fmaf(a1lo.z, a1lo.z, s1);
      s1 = fmaf(a1lo.w, a1lo.w, s1), s1 = fmaf(a1hi.x, a1hi.x, s1), s1 = fmaf(a1hi.y, a1hi.y, s1);
      s1 = fmaf(a1hi.z, a1hi.z, s1), s1 = fmaf(a1hi.w, a1hi.w, s1);
      sq[mi][0] = s0;
      sq[mi][1] = s1;
      float loc[3][4];
#pragma unroll
      for (int ni = 0; ni < 3; ++ni)
#pragma unroll
        for (int r = 0; r < 4; ++r) loc[ni][r] = 0.0f;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const float2 p0 = kpair(a0lo, a0hi, s), p1 = kpair(a1lo, a1hi, s);
        const float x[4] = {p0.x, p1.x, p0.y, p1.y};  // (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
        uint32_t ab[4], as[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if constexpr (kSplitA) {
            split_tf32(x[r], ab[r], as[r]);
          } else {
            ab[r] = __float_as_uint(x[r]);  // bf16 values (expand): exact in TF32
            as[r] = 0;
          }
        }
#pragma unroll
        for (int ni = 0; ni < 3; ++ni) {
          const float2 fp = kpair(f[ni][0], f[ni][1], s);
          uint32_t bb0, bs0, bb1, bs1;
          split_tf32(fp.x, bb0, bs0);
          split_tf32(fp.y, bb1, bs1);
          mma_tf32(loc[ni], ab, bs0, bs1);
          if constexpr (kSplitA) mma_tf32(loc[ni], as, bb0, bb1);
          mma_tf32(loc[ni], ab, bb0, bb1);
        }
      }
#pragma unroll
      for (int ni = 0; ni < 3; ++ni)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mi][ni][r] = __fadd_rn(acc[mi][ni][r], loc[ni][r]);
    }
    if (ch + 1 < ch_end) load_fn(ch + 1, f);
  }
  // Per (warp, token, slot) into the staging buffers, then the 8 warps in order.
  cp_async_wait_all();  // nothing is in flight here (no split is empty); kept so that can never race
  __syncthreads();      // every warp's last MMAs have read the staging buffers
  float* red = xbuf;    // [kWarps][kTok][kSlot]
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 3; ++ni)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int tl = 16 * mi + g + (r >= 2 ? 8 : 0), slot = 8 * ni + 2 * t + (r & 1);
        red[(warp * kTok + tl) * kSlot + slot] = acc[mi][ni][r];
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float s = sq[mi][h];
      s += __shfl_xor_sync(detail::kFullMask, s, 1);
      s += __shfl_xor_sync(detail::kFullMask, s, 2);
      if (t == 0) red[(warp * kTok + 16 * mi + g + 8 * h) * kSlot + kMix] = s;
    }
  }
  __syncthreads();
  for (int o = tid; o < kTok * kSlot; o += kThreads) {
    float s = red[o];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) s += red[w * kTok * kSlot + o];
    if (o / kSlot <= last) p.partials[(static_cast<int64_t>(blockIdx.y) * n + t0) * kSlot + o] = s;
  }
}

// One token per warp: Σ over the splits as mhc_stream_finish_kernel (lane l takes splits l, l+32, ...,
// then warp_sum: the same bits of the 25 sums), then lane l of warp 0 finishes token l of the block with
// the Sinkhorn in registers (finish_mix<true>). The serial kernel ran 32 times more warps, each with one
// active lane, issuing ~3 700 instructions per token (a call per reciprocal): ~60 warps per SM at 8 192
// rows, issue-bound for tens of µs.
constexpr int kFinTokens = 32;
__global__ void __launch_bounds__(32 * kFinTokens)
    mhc_stream_finish_lanes_kernel(MhcFusedArgs a, const float* partials, int splits) {
  __shared__ float ms[kFinTokens][kSlot];  // odd row stride: lane l reading row l is conflict-free
  detail::pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kFinTokens;
  const int64_t tok = t0 + warp;
  if (tok < a.n) {  // whole warps
    float m[kSlot];
    sum_token_splits(partials, a.n, tok, splits, lane, m);
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < kSlot; ++i) ms[warp][i] = m[i];
    }
  }
  __syncthreads();
  if (warp == 0 && t0 + lane < a.n) {
    float m[kSlot];
#pragma unroll
    for (int i = 0; i < kSlot; ++i) m[i] = ms[lane][i];
    finish_mix<true>(m, a, a.mix_out + (t0 + lane) * a.mix_stride);
  }
}

}  // namespace

bool stream64_supported(const MhcFusedArgs& a) {
  auto aligned = [](const void* p, uintptr_t m) { return (reinterpret_cast<uintptr_t>(p) & (m - 1)) == 0; };
  return a.d % kCh == 0 && aligned(a.X, 16) && aligned(a.y, 16) && aligned(a.fn, 16) && aligned(a.X_out, 8) &&
         aligned(a.collapsed, 8);
}

Stream64Plan stream64_plan(int64_t n, int64_t d, int64_t target) {
  Stream64Plan s;
  s.tiles = (n + kTok - 1) / kTok;
  if (target <= 0) target = s.tiles >= kManyTiles ? kTargetBlocks : kTargetBlocksSmall;
  const int64_t chunks = std::max<int64_t>(1, d / kCh);
  const int64_t want = std::clamp<int64_t>((target + s.tiles - 1) / s.tiles, 1, chunks);
  s.chunks_per_split = (chunks + want - 1) / want;
  s.splits = (chunks + s.chunks_per_split - 1) / s.chunks_per_split;  // no empty splits
  return s;
}

Status launch_stream64(const MhcFusedArgs& a, const Stream64Plan& plan, float* partials, cudaStream_t stream) {
  if (plan.tiles > 0x7FFFFFFF || plan.splits > 65535)
    return make_error("cuda::mhc_fused: n=" + std::to_string(a.n) + " too large for mhc_stream_c64_kernel");
  // A_small is zero when X_new is expanded (bf16), so kSplitA = !y.
  auto kernel = a.y ? mhc_stream_c64_kernel<false> : mhc_stream_c64_kernel<true>;
  CEDAR_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes)));
  const C64Params p{a, static_cast<int>(plan.chunks_per_split), partials};
  return launch_kernel(kernel, dim3(static_cast<unsigned>(plan.tiles), static_cast<unsigned>(plan.splits)),
                       dim3(kThreads), kSmemBytes, stream, a.programmatic_launch, "mhc_stream_c64_kernel", p);
}

Status launch_stream_finish_lanes(const MhcFusedArgs& a, const float* partials, int64_t splits, cudaStream_t stream) {
  const auto grid = static_cast<unsigned>((a.n + kFinTokens - 1) / kFinTokens);
  mhc_stream_finish_lanes_kernel<<<grid, 32 * kFinTokens, 0, stream>>>(a, partials, static_cast<int>(splits));
  return launch_status("mhc_stream_finish_lanes_kernel");
}

}  // namespace cedar::cuda::mhc_detail

namespace cedar::cuda {
const void* mhc_stream_c64_kernel_ptr() {
  return reinterpret_cast<const void*>(&mhc_detail::mhc_stream_c64_kernel<false>);
}
const void* mhc_stream_finish_lanes_kernel_ptr() {
  return reinterpret_cast<const void*>(&mhc_detail::mhc_stream_finish_lanes_kernel);
}
}  // namespace cedar::cuda
