// bf16 tensor-core helpers shared by the skinny-GEMM kernels (router logits, FP8-weight GEMV) and the
// sparse attention kernels: mma.sync m16n8k16 bf16 × bf16 → f32, ldmatrix of shared-memory fragments and
// the exact fp32 → bf16x2 packing of bf16-valued inputs.
//
// Fragment convention (the one gemv_bf16.cu documents): per 32-wide K chunk, thread (g = lane/4,
// t = lane%4) holds the 8 consecutive values 8t..8t+7 of weight rows g and g+8 and of token g; the
// first MMA takes values 8t+{0,1} in k slots 2t, 2t+1 and 8t+{2,3} in 2t+8, 2t+9, the second MMA
// values 8t+{4..7} alike (any permutation of k works when A and B share it). The accumulator holds
// (row g, tokens 2t, 2t+1) in d[0], d[1] and (row g+8, tokens 2t, 2t+1) in d[2], d[3].
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cp_async.cuh"

namespace cedar::cuda::detail {

__device__ __forceinline__ void mma_bf16_16816(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldmatrix (.trans: transposed) of 8×8 b16 matrices from shared memory; lane l gives the row address
// of matrix l / 8 (x2: lanes 0..15).
__device__ __forceinline__ void ldmatrix_x4(const void* p, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  const uint32_t a = smem_addr(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(const void* p, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  const uint32_t a = smem_addr(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x2_trans(const void* p, uint32_t& r0, uint32_t& r1) {
  const uint32_t a = smem_addr(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(a));
}

// Two fp32 values → bf16x2 (low half = first), RNE (exact for bf16-valued inputs).
__device__ __forceinline__ uint32_t pack_bf16x2_rn(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return static_cast<uint32_t>(__bfloat16_as_ushort(h.x)) | (static_cast<uint32_t>(__bfloat16_as_ushort(h.y)) << 16);
}

// Programmatic dependent launch (sm_90): let the next kernel of the stream start its prologue now
// (a no-op unless that kernel was launched with programmatic stream serialization; it still waits
// for this grid's completion at its own griddepcontrol.wait).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Wait until the preceding kernel of the stream has completed and its writes are visible (a no-op
// without programmatic serialization, where the stream order already guarantees it).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Ask L2 for the line holding `p` (no register written, nothing waits on it).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// Weight loads of the decode GEMVs and the router: read once per step, ~300 MB per layer through a 50 MB
// L2. The read-only path with an L2 evict-first policy (createpolicy + ld.global.nc.L2::cache_hint), so the
// weights leave L2 first and do not evict what the next kernels reuse: their code (each runs once per
// layer; instructions are fetched through L2), activations, pointer tables, norm weights and scales.
// Measured on the H200 (s14): decode batch 1 7.734 -> 7.592 ms (ld.global.cs, evict-first in L1 too and
// off the read-only path: 7.644); alone the packed expert GEMVs gain ~5 %. Same values: a cache hint only.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t p;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint32_t ld_weight(const uint32_t* a) {
  uint32_t v;
  asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(v) : "l"(a), "l"(l2_evict_first_policy()));
  return v;
}
// The 16-byte form with the policy from the caller: the FP8 GEMV creates it once per warp, since with
// the policy created inside each load's asm ptxas rebuilt it in uniform registers per load there (s17).
__device__ __forceinline__ uint4 ld_weight(const uint4* a, uint64_t policy) {
  uint4 v;
  asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(a), "l"(policy));
  return v;
}
__device__ __forceinline__ uint4 ld_weight(const uint4* a) { return ld_weight(a, l2_evict_first_policy()); }

}  // namespace cedar::cuda::detail
