// Hopper warpgroup MMA (wgmma, sm_90a) for the skinny decode GEMVs: the weights are the A operand in
// registers (64 rows per warpgroup), the ≤ 8 tokens the B operand in shared memory (N = 8).
//
// Why wgmma: on sm_90 the FP8 tensor cores are reachable only through wgmma — ptxas lowers
// mma.sync m16n8k32 e4m3 to e4m3 → f16 conversions and f16 HMMAs — and the decode GEMVs are bound by
// their instruction stream (docs/cuda.md, "Session 5 on the H200"). One m64n8k32 e4m3 wgmma takes the
// weights' bytes as they are stored and replaces 4 HMMAs and their 16 conversions per thread.
//
// Fragment layouts (PTX ISA, "Register fragments and shared memory matrix layouts" for wgmma .m64nNk32
// with 8-bit A; the same per warp as mma.sync m16n8k32): warp w of the warpgroup owns rows 16w..16w+15;
// lane (g = lane / 4, t = lane % 4) holds
//   A: a0 = row g, k 4t..4t+3;  a1 = row g + 8, k 4t..4t+3;  a2 = row g, k 16+4t..;  a3 = row g + 8, k 16+4t..
//   D: d0, d1 = row g, columns 2t, 2t+1;  d2, d3 = row g + 8, columns 2t, 2t+1.
// A dot product does not change when the same permutation of k is applied to A and B, so a kernel may
// give each thread any 8 bytes of a row's 32-k block as long as it stages B in the matching order
// (gemv_wgmma.cu does: the weights stay in their stored layout).
//
// B, K-major without swizzle: "core matrices" of 8 rows (tokens) × 16 bytes, stored contiguously (128 B);
// the descriptor's leading byte offset is the distance between the two core matrices along K (k 0..15
// and 16..31), the stride byte offset the distance between core matrices along N (unused at N = 8).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cedar::cuda::wgmma {

// Shared-memory matrix descriptor: start address, leading / stride byte offsets (16-byte units, 14
// bits each), no swizzle (bits 62..63 = 0), base offset 0.
__device__ __forceinline__ uint64_t smem_desc(const void* smem, uint32_t leading_bytes, uint32_t stride_bytes) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((addr >> 4) & 0x3FFFu) | (static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFFu) << 32);
}

// The descriptor of a matrix `bytes` further on (the start address field is in 16-byte units; stays
// inside the 14-bit field for offsets within one block's shared memory).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// Orders this thread's register writes (A fragments, accumulators) before the next wgmma reads them.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups are pending (their accumulators may then be read and their
// A registers reused).
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// d = A·B (accumulate = false) or d += A·B, m64n8k32, e4m3 × e4m3 → f32; A in registers, B through
// `desc_b`. Warpgroup-collective: all 128 threads execute it with the same descriptor.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate ? 1 : 0));
}

// d = A·B or d += A·B, m64n8k16, bf16 × bf16 → f32; A in registers (a0 = row g, k 2t..2t+1; a1 = row g + 8;
// a2 = row g, k 8+2t..; a3 = row g + 8, k 8+2t..), B K-major through `desc_b` (core matrices of 8 tokens ×
// 8 bf16; the last immediate 0 = B not transposed).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate ? 1 : 0));
}

}  // namespace cedar::cuda::wgmma
