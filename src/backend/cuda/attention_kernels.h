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
  // FP8 weight instead of w (wo_a as stored: e4m3 [out, in] bytes, UE8M0 scales [ceil(out/block_out),
  // ceil(in/block_in)] per group): dequantized in registers to bf16(e4m3·2^(s−127)) — the reference's
  // load-time conversion, dequant_weight_bf16 bit for bit — then the same MMAs in the same order, so
  // the result equals gemv_bf16 on the dequantized weight bit for bit, reading half the bytes.
  // w_group_stride counts bytes here; scale_group_stride (0: the packed default) scale bytes.
  // Requires block_in % 32 == 0, w_fp8 8-byte aligned.
  const uint8_t* w_fp8 = nullptr;
  const uint8_t* w_scales = nullptr;
  // The caller vouches that no code is NaN (0x7F / 0xFF) and every scale is in [20, 142]
  // (fp8_weight_fast, checked once at upload): the kernel skips its per-chunk check for the exact
  // fallback. Same bits either way on such a weight.
  bool w_fp8_fast = false;
  int64_t block_out = 32, block_in = 32;
  int64_t scale_group_stride = 0;
  // Programmatic dependent launch (kernels.h): the first weight lines are prefetched into L2 before
  // the kernel waits for the previous one; same results.
  bool programmatic_launch = false;
};
// Host: whether an FP8 weight (e4m3 codes, UE8M0 scale bytes) takes gemv_bf16's register fast path
// everywhere (no NaN code, every scale in [20, 142]) — Bf16GemvArgs::w_fp8_fast.
bool fp8_weight_fast(const uint8_t* codes, int64_t n_codes, const uint8_t* scales, int64_t n_scales);
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
// The query latent's RMSNorm (rms_norm's bits; with quant, its FP8 codes too) and swa_kv_encode of the same
// kv.n rows in one launch (blocks [0, n) the norm, [n, 2n) the encode): decode's q_norm and the layer's SWA
// KV without a second stream. Same results as rms_norm + swa_kv_encode.
struct QNormArgs {
  const float* x = nullptr;       // [n, dim]
  int64_t dim = 0;                // q_lora_rank
  const float* weight = nullptr;  // [dim] (null: unweighted)
  float eps = 1e-6f;
  float* y = nullptr;  // [n, dim]; may alias x
  ActQuantOut quant;   // optional codes / scales of y (dim % 32 == 0)
};
Status q_norm_swa_kv_encode(const QNormArgs& q, const SwaKvArgs& kv, cudaStream_t stream, bool programmatic_launch);
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

// ---- CSA2 compressor and its cache writes (§3.5, §3.6 "Keys", §3.12) ------------------------------
// Device state of one KV source layer for one sequence.
struct KvSourceSeq {
  PagedRecords kv;       // main KV, kv_format Fp4Block16E4m3 records (head_dim/2 + head_dim/16 B: 288 for 512)
  PagedRecords index_k;  // indexer keys, Fp4Block32Ue8m0 records (index_head_dim/2 + /32 B: 68 for 128)
  // ratio > 1: the fp32 projections of the open group's tokens, slot = pos % ratio ([ratio − 1, head_dim]
  // each), kept across calls (compressor_keep_pending writes them, compressor_entries reads them).
  float* pending_kv = nullptr;
  float* pending_gate = nullptr;
};

// A row at position p completes group j = p / ratio when p % ratio == ratio − 1 (ratio 1: every row);
// its group's tokens are the rows of the call at positions >= chunk_pos0 and the sequence's pending
// state before that. For such a row:
//   ratio 1: latent = RMSNorm(kv_row)                 (kv = bf16(wkv·x): gemv_bf16 with bf16 output)
//   ratio r: pooled[c] = Σ_t softmax_t(gate_t[c])·kv_t[c] in fp32 (kv, gate: fp32 wkv·x, wgate·x),
//            latent = RMSNorm(bf16(pooled))
// and the main KV record j = FP4-QDQ(RoPE(latent, j·ratio)) (block 16, E4M3 scales) is written to
// seqs[seq].kv. latent [n, head_dim] receives the latent at that row and zeros at rows that complete no
// group (so the wk GEMV that follows reads defined values). The softmax, the pooling order, the
// RMSNorm and the QDQ are the CPU's arithmetic in the CPU's order (model/compressor.cpp): given the
// CPU's projections the latents and records are bit-identical (exp: see detail::exp_f32).
struct CompressorArgs {
  int64_t n = 0, head_dim = 0, ratio = 1;  // head_dim % 32 == 0, <= 1024
  const float* kv = nullptr;               // [n, head_dim]
  const float* gate = nullptr;             // [n, head_dim], ratio > 1 only
  const float* norm_weight = nullptr;      // compressor.norm [head_dim]
  float eps = 1e-6f;
  const AttnToken* tokens = nullptr;
  const KvSourceSeq* seqs = nullptr;  // indexed by AttnToken::seq
  RopeTableView rope = {};            // the layer's compress rope
  float* latent = nullptr;            // [n, head_dim]
};
Status compressor_entries(const CompressorArgs& a, cudaStream_t stream);
// ratio > 1, after compressor_entries of the same call: stores the projections of the rows of each
// sequence's open group (positions >= (chunk end / ratio)·ratio) in its pending slots. (A separate
// launch: compressor_entries may still read the slots these rows overwrite.) ratio 1: nothing to do.
Status compressor_keep_pending(const CompressorArgs& a, cudaStream_t stream);

// Indexer keys of the rows that complete a group (as above): record j of seqs[seq].index_k =
// FP4-QDQ(RoPE(RMSNorm_k(k_row), j·ratio)) (block 32, UE8M0), k = bf16(indexer.wk · latent) from
// gemv_bf16 (bf16 output). Bit-exact with append_cache_entries given the same k.
struct IndexKeyArgs {
  int64_t n = 0, index_head_dim = 0, ratio = 1;  // index_head_dim % 32 == 0, <= 1024
  const float* k = nullptr;                      // [n, index_head_dim]
  const float* norm_weight = nullptr;            // indexer.k_norm
  float eps = 1e-6f;
  const AttnToken* tokens = nullptr;
  const KvSourceSeq* seqs = nullptr;
  RopeTableView rope = {};
};
Status indexer_keys_store(const IndexKeyArgs& a, cudaStream_t stream);

CEDAR_ATTN_HD inline int64_t main_kv_record_bytes(int64_t head_dim) { return head_dim / 2 + head_dim / 16; }
CEDAR_ATTN_HD inline int64_t index_key_record_bytes(int64_t index_head_dim) {
  return index_head_dim / 2 + index_head_dim / 32;
}

// ---- Indexer (§3.6): queries, scores, candidate blocks, top-k -------------------------------------
// Queries of an index source layer: q = FP4-QDQ(RoPE(qi, pos)) per head (block 32, UE8M0), with
// qi = indexer.wq_b·qr (linear_quantized, bf16 output) [n, heads·head_dim], and the head weights
// from w_raw = bf16(weights_proj·x) (gemv_bf16, bf16 output) [n, heads]:
//   reference precision: w = bf16(w_raw · fp32(head_dim^-0.5 · heads^-0.5));  fp32: w = w_raw · fp32(heads^-0.5)
// (indexer.cpp index_queries, bit-exact). Outputs: the QDQ values (IndexQueries::q), and the MMA form
// of the scoring kernel: each value's e2m1 code as its f16 value plus one fp32 scale per 32.
struct IndexQueryArgs {
  int64_t n = 0, heads = 0, head_dim = 0;  // head_dim % 32 == 0, <= 512; heads <= 64
  const float* qi = nullptr;               // [n, heads·head_dim]
  const float* w_raw = nullptr;            // [n, heads]
  const AttnToken* tokens = nullptr;
  RopeTableView rope = {};
  bool reference_precision = true;  // IndexScorePrecision::Reference (else Fp32)
  float* q = nullptr;               // optional [n, heads·head_dim] QDQ values
  uint16_t* q_codes = nullptr;      // [n, heads·head_dim] f16 bits of the e2m1 code values
  float* q_scales = nullptr;        // [n, heads·head_dim/32]
  float* w = nullptr;               // [n, heads]
};
Status indexer_queries(const IndexQueryArgs& a, cudaStream_t stream);

// Scores I(j) = Σ_h w_h·ReLU(q_h·k_j) of each row's scan list against the KV source's indexer keys
// (68-B records of seqs[seq].index_k), in indexer.cpp's arithmetic (index_score, both precisions):
//   full scan: slots s < V = (pos+1)/ratio are the visible entries j = s;
//   restricted (Reindex, candidate_blocks given): slot s is entry blocks[s / B]·B + s % B of the row's
//   kept blocks (B = candidate_block_size), −inf where the block is −1 or the entry is not visible.
// scores [n, max_slots]: slot s of row r at r·max_slots + s; slots past the row's count are not written.
// The q·k dots run on the tensor cores on the e2m1 codes (products exact, each 32-channel block sum
// exact), scaled per block by the two UE8M0 scales and added in block order; this equals the CPU's
// sequential fp32 dot whenever that sum is exact, i.e. whenever the partial sums fit in 24 bits
// (the block scales of q·k within ~2^10 of each other and no product below 2^-126) — every realistic
// input; the head sum is the CPU's loop, in head order. So scores are bit-identical in that regime.
struct IndexerScoreArgs {
  int64_t n = 0, heads = 0, head_dim = 0, ratio = 1;
  const uint16_t* q_codes = nullptr;  // indexer_queries outputs
  const float* q_scales = nullptr;
  const float* w = nullptr;
  const AttnToken* tokens = nullptr;
  const KvSourceSeq* seqs = nullptr;  // the KV source's state (index_k streams)
  bool reference_precision = true;
  float relu_scale = 0.0f;                    // fp32 precision only: fp32(head_dim^-0.5)
  const int32_t* candidate_blocks = nullptr;  // restricted rows: [n, candidate_topk_blocks]; null: full scan
  int64_t candidate_topk_blocks = 0, candidate_block_size = 0;
  int64_t max_slots = 0;    // >= every row's slot count (full: max V; restricted: blocks·B)
  float* scores = nullptr;  // [n, max_slots]
};
Status indexer_scores(const IndexerScoreArgs& a, cudaStream_t stream);

// Selection from the scores (indexer.cpp select_topk / select_candidate_blocks, same sets and order):
//   top-k: among slots with a score > −inf, the index_topk best (score descending, entry id ascending
//   on ties), written as entry ids ascending, padded with −1;
//   candidate blocks (blocks_out given; full-scan rows): block score = max of its entries, the newest
//   visible block ((V−1)/B) pinned at +inf, the candidate_topk_blocks best with a score > −inf, block
//   ids ascending, padded with −1.
// Exact: a radix select of the k-th best key (4 digit passes over order-preserving keys) and an
// ordered compaction; a row longer than one segment (8192 values) selects per segment first and then
// among the segments' winners (the union holds the global top-k). Deterministic.
struct IndexerSelectArgs {
  int64_t n = 0, ratio = 1;
  const AttnToken* tokens = nullptr;
  const float* scores = nullptr;  // indexer_scores output
  int64_t max_slots = 0;
  const int32_t* candidate_blocks = nullptr;  // restricted rows: the slot → entry mapping, as above
  int64_t candidate_topk_blocks = 0, candidate_block_size = 0;
  int64_t topk = 0;
  int32_t* topk_out = nullptr;    // [n, topk]
  int32_t* blocks_out = nullptr;  // optional (candidate source): [n, candidate_topk_blocks]
  void* workspace = nullptr;      // indexer_select_workspace_bytes
  int64_t workspace_bytes = 0;
  // Warp-aggregated radix histogram (one shared atomic per bin and warp; same selection). Measured slower
  // than the per-value histogram on the H200 (s4-run3: 21.9 vs 16.2 us at 4096 keys + blocks, n = 1), so
  // off by default; kept for the bench comparison.
  bool warp_aggregated_histogram = false;
};
int64_t indexer_select_workspace_bytes(int64_t n, int64_t max_slots, int64_t topk, int64_t candidate_topk_blocks,
                                       int64_t candidate_block_size);
Status indexer_select(const IndexerSelectArgs& a, cudaStream_t stream);

// ---- Sparse attention with the sink, inverse RoPE, output projection (§3.4, §3.7) ------------------
// Per row at position p and per head h, over the keys (K = V) in the CPU's order:
//   window: positions [max(swa_start, p − window + 1), p] — the call's own rows from the staged SWA
//           records (swa_kv_encode; positions >= chunk_pos0), earlier ones from the ring (before
//           swa_ring_commit; a slot that does not hold the position is skipped);
//   compressed (topk given): the entries topk[row][0..) up to the first −1 (ascending ids, as
//           indexer_select writes them), decoded from the KV source's 288-B main-KV records;
//   s_j = fp32(q_h·k_j)·scale, M = max_j s_j, p_j = exp(s_j − M),
//   o_h = bf16( Σ_j p'_j·k_j / (Σ_j p_j + exp(sink_h − M)) ), p'_j = bf16(p_j) (bf16_probabilities) or p_j,
// then the inverse RoPE at p on each head's last rope_dim channels (sparse_attention.h + attention.cpp).
// A block handles 16 heads of one row (and, when there are too few rows to fill the GPU, a range of the
// keys: a first launch finds M over all ranges, the second forms the partial sums with the exact M and
// the last block of the row adds them in range order — so p_j and bf16(p_j) are those of the single
// pass). Keys are dequantized into shared memory as bf16 (exact: FP8 and FP4·E4M3 values have <= 6
// significant bits), q·k and P·V run on mma.sync bf16 tensor cores (exact products; fp32 p is split
// into three bf16 parts), exp is detail::exp_f32. Only the summation orders differ from the CPU.
struct SparseAttnWorkspace {  // the key-split partial sums; null / too small: no key split
  float* floats = nullptr;
  unsigned* counters = nullptr;  // zero before the first call; the kernel re-arms them
  int64_t float_count = 0, counter_count = 0;
};
struct SparseAttnArgs {
  int64_t n = 0, heads = 0, head_dim = 0;  // head_dim in {32, 64, 128, 256, 512}
  int64_t window = 0;                      // SWA window = ring slots
  const float* q = nullptr;                // [n, heads·head_dim] after RoPE (bf16 values)
  const float* sink = nullptr;             // attn_sink [heads]
  float scale = 0.0f;                      // fp32(head_dim^-0.5)
  bool bf16_probabilities = true;
  const AttnToken* tokens = nullptr;
  const uint8_t* chunk_records = nullptr;  // [n, swa_record_bytes(head_dim)]
  const SwaRingDesc* rings = nullptr;      // per sequence (this layer's rings)
  const int32_t* topk = nullptr;           // [n, topk_width] or null (SWA-only layer)
  int64_t topk_width = 0;
  const KvSourceSeq* kv_seqs = nullptr;  // the KV source's state (main KV streams), with topk
  RopeTableView rope = {};               // the layer's rope (inverse at p on the output)
  float* out = nullptr;                  // [n, heads·head_dim]
  // Decode kernel only: the first merge (serial loads, plain launch) instead of the prefetching one
  // launched with PDL. Same arithmetic, bit-identical output; kept for the parity test and bench rows.
  bool legacy_decode_merge = false;
  // Decode kernel only: q is given before RoPE and the kernel applies rope_apply's forward rotation (at
  // the row's position, last rope_dim channels of each head) as it loads q — bit-identical to calling
  // rope_apply first, one launch fewer. The tiled kernels refuse it.
  bool q_before_rope = false;
  // Decode kernel only: the head-split plan — 16 or 32 heads per block at batch 1..8 (an SWA-only layer
  // at batch 1: 16 blocks instead of 4), key ranges balanced; each block dequantizes its key tiles once
  // for its heads. false: the legacy plan (64 heads per block). Other summation order in phase A (parts
  // of head_dim / 16 or / 8 channels): not bit-identical to the legacy plan, same CPU-oracle bounds.
  bool decode_head_split = false;
  // With decode_head_split: heads per block forced to 16 (head_dim >= 256), 32 or 64; 0: the plan picks.
  int decode_heads_per_block = 0;
  // Decode kernel only: at most this many key ranges (0: the plan's; ranges still hold <= 16 key tiles).
  // 1: every block finishes its heads itself and the merge launch is gone (an SWA-only layer's 128 keys:
  // 4 tiles per block instead of 1). Other range maxima than the plan's: the same CPU-oracle bounds.
  int decode_max_splits = 0;
  // Optional: out's exact f16 staging for an f16-activation GEMV (stage_act_f16(out, n, heads·head_dim)'s
  // bits: wo_a through gemv_fp8_staged with codes_staged), [n, heads·head_dim] codes and [n, heads·head_dim
  // / 32] scales. The decode kernel's merge writes them with out (one launch less before wo_a); launches
  // without a merge (one key range, the legacy merge, the tiled kernel) run stage_act_f16 after.
  uint16_t* out_f16_codes = nullptr;
  float* out_f16_scales = nullptr;
  // Decode kernel only: the fast merge lets the launch after it (PDL) start at the merge's start instead of
  // its end, so that launch's blocks are resident (waiting in griddepcontrol.wait) when the merge ends.
  // What either reads and writes is unchanged: the same bits.
  bool decode_merge_trigger = false;
};
// Workspace that lets a launch of `n` rows split its keys (zeros: this shape never splits); covers both
// kernels sparse_attention may pick for n rows.
struct SparseAttnWorkspaceSize {
  int64_t floats = 0, counters = 0;
};
SparseAttnWorkspaceSize sparse_attention_workspace_size(int64_t n, int64_t heads, int64_t head_dim, int64_t window,
                                                        int64_t topk_width);
// Picks the kernel by rows: sparse_attention_decode when sparse_attention_picks_decode (few rows,
// head_dim 128/256/512, its workspace given when it splits), else sparse_attention_tiled. Same results
// contract either way (the tolerances of docs/cuda-log.md "Tolerances (why the GPU may differ at all)"); the two kernels differ in summation order.
Status sparse_attention(const SparseAttnArgs& a, cudaStream_t stream, const SparseAttnWorkspace& ws = {});
// The prefill kernel: 16 heads of one row per block (described above), any row count.
Status sparse_attention_tiled(const SparseAttnArgs& a, cudaStream_t stream, const SparseAttnWorkspace& ws = {});
SparseAttnWorkspaceSize sparse_attention_tiled_workspace_size(int64_t n, int64_t heads, int64_t head_dim,
                                                              int64_t window, int64_t topk_width);

// The decode kernel (split-K / flash-decoding; sparse_attention_decode.cu): blocks of (key range, row,
// 64 heads), each key dequantized once per row into shared memory, scores and P·V on bf16 mma.sync for
// all 64 heads, p = exp(s − m_z) with the range's max m_z, and a merge launch that combines the ranges
// in range order with the sink (o = Σ_z w_z·O_z / (Σ_z w_z·l_z + exp(sink − M)), w_z = exp(m_z − M)),
// then bf16 and the inverse RoPE. Up to kSparseDecodeMaxRows rows; the split count depends on the row
// count (≈ one wave of 132 blocks), so a row's result is independent of the batch only while the split
// is (e.g. window + top-k ≤ 32·floor(132 / n) keys). Workspace: floats only (no counters).
constexpr int64_t kSparseDecodeMaxRows = 64;
bool sparse_attention_decode_supported(int64_t n, int64_t head_dim);
SparseAttnWorkspaceSize sparse_attention_decode_workspace_size(int64_t n, int64_t heads, int64_t head_dim,
                                                               int64_t window, int64_t topk_width);
// Whether sparse_attention runs the decode kernel for a.
bool sparse_attention_picks_decode(const SparseAttnArgs& a, const SparseAttnWorkspace& ws);
// The same decision from the shape alone (topk_width 0: SWA-only), for callers that must know it before
// the arguments exist (the model skips rope_apply on q when the decode kernel will rotate it).
bool sparse_attention_decode_fits(int64_t n, int64_t heads, int64_t head_dim, int64_t window, int64_t topk_width,
                                  const SparseAttnWorkspace& ws);
Status sparse_attention_decode(const SparseAttnArgs& a, cudaStream_t stream, const SparseAttnWorkspace& ws = {});

// The attention output projection (attention_output_projection): u = wo_a grouped (gemv_bf16, bf16 out)
// over o's `groups` slices, then out = wo_b·u (linear_quantized, FP8, bf16 out).
struct AttnOutputArgs {
  int64_t n = 0;
  const float* o = nullptr;        // [n, heads·head_dim]
  const uint16_t* wo_a = nullptr;  // bf16 [groups·o_lora, heads·head_dim/groups]
  int64_t groups = 0, o_lora = 0, in_per_group = 0;
  float* u = nullptr;                 // [n, groups·o_lora] scratch
  QuantWeightView wo_b = {};          // [dim, groups·o_lora] FP8
  const ActWorkspace* act = nullptr;  // for wo_b's activation quantization (and split-K)
  float* out = nullptr;               // [n, dim]
  SplitKWorkspace wo_a_splitk = {};
};
Status attention_output(const AttnOutputArgs& a, cudaStream_t stream);

// ---- catalog -----------------------------------------------------------------------------------
// The attention kernels of this build (for kernel_catalog / cedar doctor) and their loadability.
std::vector<KernelInfo> attention_kernel_catalog();
Status check_attention_kernels_loadable();

}  // namespace cedar::cuda
