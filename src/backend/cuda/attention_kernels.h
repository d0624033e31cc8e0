// Host entry points of the CUDA attention path (owner: cuda-attn): the BF16 GEMV / skinny GEMM,
// RoPE/YaRN, the SWA KV path, the CSA2 compressor and its cache writes, the indexer (scores,
// candidate blocks, top-k) and the sparse attention with the sink. Every pointer argument is DEVICE
// memory unless stated; every call is asynchronous on `stream`, validates its arguments before any
// launch and returns the launch status. Kernels are deterministic (no order-dependent atomics) and
// graph-capturable (no host sync, no allocation). The CPU oracle modules are backend/cpu/ops.h,
// model/{compressor,indexer,sparse_attention,attention}.h, core/numeric.h and kv/kv_format.h;
// tests/backend/cuda/attention_*_cutest.cpp check each kernel against them. C++17 (included from .cu
// files).
//
// Activations are fp32 arrays holding bf16-exact values, row-major [tokens, width], as on the CPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/status.h"

// Small helpers callable from host and device code.
#if defined(__CUDACC__)
#define CEDAR_ATTN_HD __host__ __device__
#else
#define CEDAR_ATTN_HD
#endif

namespace cedar::cuda {

// ---- BF16 GEMV / skinny GEMM ------------------------------------------------------------------
// y[t, r] = Σ_c x[t, c] · W[r, c] for a bf16 weight W [out, in] (row-major, bf16 bits) and n tokens of
// fp32 activations holding bf16 values (cpu::linear for BF16 weights: fp32 products and accumulation,
// no activation quantization). bf16_output rounds y to bf16 (what the reference's bf16 linear
// returns); otherwise y is fp32 (the fp32 head, the ratio-2 compressor projections).
//
// `groups` matrices of one shape run in one launch (grid.z): group g uses the weight at
// w + g·w_group_stride and the activations / outputs at the given strides, so wo_a (8 groups of
// [o_lora, in_g] applied to consecutive slices of o) is one call with the default strides:
//   x of token t, group g: x + t·x_row_stride + g·x_group_stride   (defaults: groups·in, in)
//   y of token t, group g: y + t·y_row_stride + g·y_group_stride   (defaults: groups·out, out)
// Requirements: in % 8 == 0; w and x 16-byte aligned, strides of w multiples of 8 elements and of x
// multiples of 4; y must not overlap x. Values of x that are not bf16-exact are rounded to bf16.
//
// Design: tensor cores (mma.sync m16n8k16 bf16 × bf16 → f32; the products are exact, as on the CPU)
// with 16 weight rows per block and 16-byte weight loads, K split over the block's 8 warps, and up to
// 64 tokens per pass (more tokens: several passes). Small `out` splits K across blocks through the
// split-K workspace (deterministic: the last block of a row tile adds the partials in split order).
// Only the summation order differs from the CPU's sequential sum.
struct Bf16GemvArgs {
  const uint16_t* w = nullptr;
  int64_t out = 0, in = 0;
  int64_t groups = 1;
  int64_t w_group_stride = 0;  // elements; 0 = out·in
  const float* x = nullptr;
  int64_t x_row_stride = 0;    // 0 = groups·in
  int64_t x_group_stride = 0;  // 0 = in
  float* y = nullptr;
  int64_t y_row_stride = 0;    // 0 = groups·out
  int64_t y_group_stride = 0;  // 0 = out
  int64_t n = 1;               // tokens (0: nothing to do)
  bool bf16_output = false;
};
// Workspace a split-K launch of this shape can use (zeros: never split). Counters must be zero before
// the first call; the kernel re-arms them.
SplitKSize gemv_bf16_splitk_size(int64_t out, int64_t in, int64_t groups = 1);
Status gemv_bf16(const Bf16GemvArgs& a, cudaStream_t stream, const SplitKWorkspace& splitk = {});

// ---- descriptors shared by the attention kernels -------------------------------------------------
// One row (query token) of a call, in a device array with one entry per row. A call holds rows of one
// or several sequences; the rows of one sequence are consecutive and at consecutive positions (a
// prefill chunk, or one decode token), so batched decode (one row per sequence) and a prefill chunk
// of one sequence run the same kernels.
struct AttnToken {
  int32_t seq = 0;         // index into the per-sequence descriptor arrays of the call
  int32_t chunk_len = 1;   // rows of this sequence in the call
  int64_t pos = 0;         // absolute position of this row
  int64_t chunk_pos0 = 0;  // position of the sequence's first row in the call
  int64_t chunk_row0 = 0;  // row index of that first row
  int64_t swa_start = 0;   // SWA keys are [max(swa_start, pos − window + 1), pos] (bounded replay); 0 = exact
};
// Host helper: appends the rows of `n` tokens of sequence `seq` at positions [pos0, pos0 + n), the
// first of them at row out.size().
inline void append_chunk_tokens(std::vector<AttnToken>& out, int32_t seq, int64_t pos0, int64_t n,
                                int64_t swa_start = 0) {
  const int64_t row0 = static_cast<int64_t>(out.size());
  for (int64_t i = 0; i < n; ++i)
    out.push_back(AttnToken{seq, static_cast<int32_t>(n), pos0 + i, pos0, row0, swa_start});
}

// One paged KV stream of one sequence (kv_format.h records, §3.12): record j lives at
// pool + block_table[j / entries_per_block]·block_bytes + (j % entries_per_block)·record_bytes, as on
// the host (BlockTable), so blocks copy between host pool, device pool and the SSD tier byte for byte.
struct PagedRecords {
  uint8_t* pool = nullptr;
  const int32_t* block_table = nullptr;  // device array of block ids
  int64_t block_bytes = 0;
  int64_t entries_per_block = 0;
  int64_t record_bytes = 0;
};

// ---- RoPE / YaRN (§3.1) ------------------------------------------------------------------------
// The rotation angles come from a host table so they are bit-identical to cpu::RopeTable: entry
// [pos][i] = (cos, sin) of fp32(pos)·inv_freq[i] evaluated by the host libm exactly as
// RopeTable::apply does. The device applies (bf16(e·c − o·s), bf16(e·s + o·c)) to the interleaved
// pairs of the last rope_dim channels (s negated for the inverse). A position outside the table
// rotates to NaN (impossible to miss) rather than reading out of bounds.
struct RopeTableView {
  const float* cos_sin = nullptr;  // [positions][rope_dim/2][2]
  int64_t positions = 0;
  int64_t rope_dim = 0;
};
// Host: the table for positions [0, positions) of the frequencies inv_freq[0 .. rope_dim/2)
// (cpu::RopeTable::inv_freq()); positions · rope_dim floats (V4.1: 256 B per position). Upload it once.
std::vector<float> rope_cos_sin_table(const float* inv_freq, int64_t rope_dim, int64_t positions);

// In-place rotation of `n_vec` vectors of `width` per row (the last rope_dim channels of each) at the
// row's position tokens[r].pos; rows are row_stride floats apart (0 = n_vec·width).
struct RopeApplyArgs {
  float* x = nullptr;
  int64_t rows = 0, n_vec = 1, width = 0, row_stride = 0;
  const AttnToken* tokens = nullptr;
  bool inverse = false;
};
Status rope_apply(const RopeTableView& table, const RopeApplyArgs& a, cudaStream_t stream);

// ---- SWA KV (§3.4, §3.7, §3.12) ------------------------------------------------------------------
// Per row: kv = FP8-QDQ(RoPE(RMSNorm_kv(wkv·x), pos)) (block 32, UE8M0), written as the SWA record
// (kv_format Fp8Block32Ue8m0: head_dim e4m3 codes, then head_dim/32 ue8m0 scales; 528 B for 512) into a
// staging array, plus optionally the record's dequantized values. The RMSNorm is bit-exact with
// cpu::rms_norm (its sequential sum of squares, one thread per row), so the records are byte-identical
// to the host's for the same projection. The staged records are what the attention reads for the
// call's own window keys; swa_ring_commit moves them into the ring after the attention (the CPU
// writes the ring after attending, and a chunk's writes may overwrite keys its own queries read).
struct SwaKvArgs {
  const float* kv = nullptr;           // [n, head_dim]: wkv·x (bf16 values), before RMSNorm_kv
  const float* norm_weight = nullptr;  // kv_norm [head_dim] (null: unweighted)
  float eps = 1e-6f;                   // fp32(rms_norm_eps), as cpu::rms_norm uses it
  int64_t n = 0, head_dim = 0;         // head_dim % 32 == 0, <= 1024
  const AttnToken* tokens = nullptr;
  RopeTableView rope = {};
  uint8_t* records = nullptr;  // [n, head_dim·33/32] staged records
  float* values = nullptr;     // optional [n, head_dim]
};
Status swa_kv_encode(const SwaKvArgs& a, cudaStream_t stream);
// Bytes of one SWA record of width head_dim.
CEDAR_ATTN_HD inline int64_t swa_record_bytes(int64_t head_dim) { return head_dim + head_dim / 32; }

// One layer's SWA ring of one sequence: `slots` records (slot = pos % slots) and the position each slot
// holds (-1 = empty), as SwaRing on the host.
struct SwaRingDesc {
  uint8_t* records = nullptr;    // [slots, record_bytes]
  int64_t* positions = nullptr;  // [slots]
};
// Copies the staged records of rows with pos >= chunk_pos0 + chunk_len − slots (the last `slots`
// positions of each sequence's chunk: the others would be overwritten) into their ring slots and sets
// the slots' positions. rings: one per sequence (indexed by AttnToken::seq).
struct SwaRingCommitArgs {
  const uint8_t* records = nullptr;  // [n, record_bytes] (swa_kv_encode)
  int64_t n = 0, record_bytes = 0;
  const AttnToken* tokens = nullptr;
  const SwaRingDesc* rings = nullptr;
  int64_t slots = 0;
};
Status swa_ring_commit(const SwaRingCommitArgs& a, cudaStream_t stream);

// ---- catalog -----------------------------------------------------------------------------------
// The attention kernels of this build (for kernel_catalog / cedar doctor) and their loadability.
std::vector<KernelInfo> attention_kernel_catalog();
Status check_attention_kernels_loadable();

}  // namespace cedar::cuda
