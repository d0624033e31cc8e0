// Probe: what ptxas makes of an FP8 (e4m3) mma.sync on sm_90a. Run `tools/sass/sass.sh
// tools/sass/probes/mma_e4m3_sm90.cu` and read .dev/sass/mma_e4m3_sm90.sass: the one m16n8k32 e4m3 MMA
// becomes 12 F2FP.F16.E4M3.UNPACK_B conversions and two HMMA.16816.F32 (f16) — Hopper has FP8 only in
// wgmma. So an e4m3 mma.sync for the MXFP4 experts would issue as many HMMAs as the packed GEMV does now,
// plus conversions its f16 placement of the e2m1 codes avoids, and its products are summed as exactly
// as the f16 path's (docs/cuda.md "Next").
#include <cstdint>

__global__ void mma_e4m3_probe(const uint32_t* a, const uint32_t* b, float* d) {
  uint32_t A[4], B[2];
  for (int i = 0; i < 4; ++i) A[i] = a[threadIdx.x * 4 + i];
  for (int i = 0; i < 2; ++i) B[i] = b[threadIdx.x * 2 + i];
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B[0]), "r"(B[1]));
  for (int i = 0; i < 4; ++i) d[threadIdx.x * 4 + i] = c[i];
}
