// Host entry points of the CUDA FFN-side kernels (owner: cuda-ffn): embedding gather, MoE router and
// dispatch, SwiGLU, MoE combine, Engram (hash, gather + dequant, gated stream update), argmax and
// sampling, the MXFP4 "packed" expert layout with its GEMV, and the cluster variant of the fused mHC.
//
// Conventions (as kernels.h): every pointer is DEVICE memory unless stated (Engram tables may be
// mapped pinned host memory), every call is asynchronous on `stream`, argument errors are reported
// before any launch, kernels are deterministic (no order-dependent atomics) and graph-capturable (no
// host synchronization, no allocation, no host-side dependence on device data). Activations are fp32
// arrays holding bf16-exact values. Token ids, expert ids and item counts on the device are int32.
// Numerics follow the CPU oracle (model/moe.h, model/engram.h, engine/sampler.h); each launcher says
// where it is bit-exact and where (and why) it is not. C++17 (included from .cu files).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/status.h"

namespace cedar {
class EngramLayout;
}

namespace cedar::cuda {

// ---- embedding and stream expansion (§3.2) ------------------------------------------------------
// x[t] = bf16 row tokens[t] of the table (exact), X[t, k] = x[t] for every stream k, pre_prev[t] =
// one-hot(0). Any output may be null. A token outside [0, vocab) gives zero rows and sets *bad_token
// (if given) to at least 1 + its index (atomicMax: the caller zeroes it; read it after the step).
struct EmbedGatherArgs {
  const uint16_t* table = nullptr;  // bf16 bits [vocab, d]
  int64_t vocab = 0, d = 0, hc = 4;
  const int32_t* tokens = nullptr;  // [n]
  int64_t n = 0;
  float* x = nullptr;         // [n, d]
  float* X = nullptr;         // [n, hc, d]
  float* pre_prev = nullptr;  // [n, hc]
  int32_t* bad_token = nullptr;
};
Status embed_gather(const EmbedGatherArgs& a, cudaStream_t stream);

// ---- MoE router (§3.8) ----------------------------------------------------------------------------
// logits = fp32(x)·fp32(gate)ᵀ (the gate's bf16 values; products exact, fp32 sums in a fixed blocked
// order — the CPU sums in index order, so logits differ by fp32 rounding. GPU side (bf16 tensor-core
// MMAs, 2^-23 per accumulation step as gemv_bf16): ≤ (d/64 + 8)·2^-24·Σ|x·w| without a workspace,
// ≤ (23 + ksplit)·2^-24·Σ|x·w| with one (16-MMA chains, 8 warps, ksplit ≤ 64 splits in order); with
// `blas` (prefill, n > kRouterBlasMinTokens) cuBLASLt's order, ≤ d·2^-24·Σ|x·w|). A token's logits do
// not depend on the other tokens of the call (same bits at n = 1, 8, 64 on the MMA path).
// s = sqrt(softplus(logits / gate_temp)) (expf / log1pf evaluated in double and rounded to fp32 step
// by step as the CPU's float calls round: the correctly rounded results, which glibc returns in all
// but rare cases); selection = top-k of s + b (b = bias_vl for image tokens, else bias) in the CPU's
// strict order (larger first, NaN above every number, lower id on ties) or tid2eid[token] (V4 hash
// layers); weights = s[sel] / (Σ_k s[sel_k] + 1e-20) · route_scale with the Σ in slot order (bit-exact
// given the scores).
//
// Speed: pass `splitk` (router_workspace_size) — the gate is then streamed by ~120 blocks (d = 5120,
// E = 384) and, for n <= 8, moe_route is ONE launch (the last block selects: same bits as
// router_logits + router_select with the same workspace). Without it the logits run unsplit (24
// blocks). Prefill: pass `blas` and the bf16 scratch for x (dense_gemm_workspace_elems of an
// [n, d] input) to run the logits of n > kRouterBlasMinTokens tokens as one cuBLASLt GEMM.
class BlasContext;  // gemm_kernels.h
constexpr int64_t kRouterBlasMinTokens = 64;
struct RouterArgs {
  int64_t n = 0, d = 0, n_experts = 0, topk = 0;
  const float* x = nullptr;            // [n, d]
  const uint16_t* gate = nullptr;      // bf16 bits [n_experts, d] (16-byte aligned; d % 8 == 0)
  const float* bias = nullptr;         // [n_experts]; unused with tid2eid
  const float* bias_vl = nullptr;      // [n_experts] or null
  const uint8_t* is_image = nullptr;   // [n] or null (needs bias_vl when a flag is set)
  const int32_t* tid2eid = nullptr;    // [vocab, topk] or null
  const int32_t* token_ids = nullptr;  // [n], with tid2eid (ids clamp into [0, vocab))
  int64_t tid2eid_vocab = 0;
  float gate_temp = 1.0f, route_scale = 1.0f;
  bool norm_topk_prob = true;
  float* logits = nullptr;     // [n, n_experts]: router_logits writes, router_select reads
  float* scores = nullptr;     // [n, n_experts] unbiased scores, or null
  int32_t* experts = nullptr;  // [n, topk]
  float* weights = nullptr;    // [n, topk]
  // Optional (see above). Counters must be zero before the first call (the kernels re-arm them).
  SplitKWorkspace splitk;
  BlasContext* blas = nullptr;
  uint16_t* x_bf16 = nullptr;  // [n, d] bf16 scratch for the cuBLASLt path
  int64_t x_bf16_elems = 0;
  bool programmatic_launch = false;  // PDL (launch.h) for this call's kernels (not the cuBLASLt GEMM)
  // The fused launch at one token: every warp of its last block selects (CudaKernelPaths::router_one_token);
  // false: one warp, as for more tokens. The same ids and weights.
  bool one_token_select = true;
  // Diagnostics (the kernel bench's router breakdown), null in the model: the fused launch writes
  // kRouterStampsPerBlock %globaltimer ns per block (entry, after the PDL wait, partials stored, ticket
  // taken: block b at [b·4]), then kRouterTailStamps for its last block at [blocks·4] (clock64 at the
  // tail's start, after the sums and scores, after the selection, after the items; then %globaltimer).
  unsigned long long* stamps = nullptr;
};
constexpr int kRouterStampsPerBlock = 4;
constexpr int kRouterTailStamps = 5;
// The fused launch's blocks for this gate shape (RouterArgs::stamps holds blocks·4 + 5 values).
int64_t router_fused_blocks(int64_t n_experts, int64_t d);
// Split-K partials and tickets router_logits / moe_route use for this gate shape (any n).
SplitKSize router_workspace_size(int64_t n_experts, int64_t d);
Status router_logits(const RouterArgs& a, cudaStream_t stream);
Status router_select(const RouterArgs& a, cudaStream_t stream);
// router_logits + router_select (one fused launch for n <= 8 with a workspace and n·E <= 5120). With
// `dispatch` (its experts, n, topk and n_experts those of `a`) also moe_build_items: inside the fused
// launch (its last block builds the items right after the selection, n_experts <= 1024), else as the
// kernel after the selection.
struct MoeDispatchArgs;
Status moe_route(const RouterArgs& a, cudaStream_t stream, const MoeDispatchArgs* dispatch = nullptr);

// ---- MoE dispatch: device-side grouped-GEMV items ---------------------------------------------------
// One item = one weight matrix applied to up to 8 activation rows (gathered) writing up to 8 output
// rows (scattered): a GEMV of gemv_quantized_items. Built on the device from the router's expert ids,
// so the routed experts run without a host round trip (and the whole layer can be one CUDA graph).
struct DeviceGemvItem {
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
  const uint16_t* act_codes = nullptr;  // base of [rows, in] (quantize_act_fp8 layout)
  const float* act_scales = nullptr;    // base of [rows, in/32]
  float* y = nullptr;                   // base of [rows, out]
  int32_t n = 0;                        // rows of this item, 1..8
  int32_t act_row[8] = {};              // activation row of item row j
  int32_t y_row[8] = {};                // output row of item row j
  int32_t reserved = 0;                 // the tail padding, named: every byte of an item is defined
};
constexpr int kGemvItemRows = 8;

// Per-expert weight pointers of one matrix kind (e.g. all w1): device arrays [n_experts].
struct ExpertWeightTable {
  const uint8_t* const* data = nullptr;
  const uint8_t* const* scales = nullptr;
};
// One item table. Pairs p = t·topk + k (token t, slot k) are grouped by expert (ascending id, pairs
// in order) and cut into items of <= 8 pairs; each such group gives n_mats items (matrix m: weights of
// mats[m], output y[m]). Activation row of pair p: t (act_by_pair false: the token's input) or p
// (true: e.g. the SwiGLU output feeding w2); output row: p. *count = items written (<= capacity).
struct MoeItemTable {
  int n_mats = 1;  // 1 or 2 (w1 and w3 share a launch)
  ExpertWeightTable mats[2];
  float* y[2] = {nullptr, nullptr};
  const uint16_t* act_codes = nullptr;
  const float* act_scales = nullptr;
  bool act_by_pair = false;
  DeviceGemvItem* items = nullptr;
  int32_t* count = nullptr;
  int64_t capacity = 0;  // items; n·topk·n_mats always suffices
};
struct MoeDispatchArgs {
  const int32_t* experts = nullptr;  // [n, topk] (router output); ids outside [0, n_experts) are skipped
  int64_t n = 0, topk = 0, n_experts = 0;
  MoeItemTable tables[2];
  int n_tables = 1;
  bool programmatic_launch = false;  // PDL (launch.h): may start while the previous kernel runs
  // Up to kMoeWarpBuildPairs pairs one warp builds the tables (moe_items_build.cuh); true: the
  // block-wide builder at every size (tests compare the two; A/B rows).
  bool block_build = false;
};
constexpr int64_t kMoeWarpBuildPairs = 32;
constexpr int64_t kMoeMaxPairs = 8192;  // n·topk per dispatch (one block)
constexpr int64_t kMoeMaxExperts = 4096;
Status moe_build_items(const MoeDispatchArgs& a, cudaStream_t stream);
Status check_moe_dispatch(const MoeDispatchArgs& a);  // moe_build_items' argument checks

// Device layout of MXFP4 weights for the item / packed GEMVs (see "MXFP4 packed expert layout").
// Packed: the plain kernel's K schedule (runs of 8 K blocks strided over 8 warps): bit-equal to the
// plain layout. PackedBalanced: the same packed bytes, K split evenly into one contiguous range of groups
// per warp over 4 warps at 4 blocks per SM (gemv_packed.cu kItemsWarps; w1/w3 5120: 10 groups of 4 K
// blocks per warp, w2 2304: 4 or 5), where the plain schedule leaves warps idle (2304: 9 runs over 8
// warps); it differs from the plain result by summation order only, and not with the batch.
// Tiles: the balanced schedule's arithmetic and bits over the tile layout ("MXFP4 tile layout" below; the
// item's data points at it, its scales are not read), streamed through shared memory by TMA bulk copies.
enum class Mxfp4Layout { Plain, Packed, PackedBalanced, Tiles };

// GEMVs of a device item table: item i computes y[y_row[j]] = W_i · act[act_row[j]] for its rows, as
// gemv_quantized does (same arithmetic, bit-equal to it for Plain / Packed). `shape` gives out, in, the
// format and the FP8 block; `layout` the MXFP4 layout (Plain for FP8). `capacity` bounds *count (the grid
// is sized from it; blocks loop over the live items). No split-K.
// The warps per block a forced split of the packed item GEMV may take (GemvItemsOptions::packed_warps).
inline constexpr int kForcedSplitMinWarps = 2, kForcedSplitMaxWarps = 8;
// Tiles: a second item table (tile layout) whose weight bytes the kernel's blocks request into L2 with TMA
// bulk prefetches: a hint that changes no result. The routed w2 while w1 / w3 streams
// (CudaKernelPaths::routed_w2_prefetch). The table must be readable when the kernel passes its PDL wait.
struct TilesL2Prefetch {
  const DeviceGemvItem* items = nullptr;  // null: no prefetch
  const int32_t* count = nullptr;         // live items, clamped to [0, capacity]
  int64_t capacity = 0;
  int64_t out = 0, in = 0;  // the table's matrices (out % 32 == 0, in % 128 == 0)
  // No prefetch where the live units' bytes exceed this (0: 3/4 of the device's L2), so that at larger
  // batches the prefetched lines do not evict each other before they are read.
  int64_t max_bytes = 0;
  bool after_units = false;  // each block after its own units (in the kernel's tail); else before them
};
struct GemvItemsOptions {
  bool programmatic_launch = false;  // PDL (launch.h): the kernels wait before reading the table
  // Packed layouts: 2 counters, zero before the first launch (the kernel re-arms them). Blocks then take
  // the (item, row tile) units in order from an atomic counter instead of a fixed stride, so blocks that
  // start late (SMs still held by a concurrent kernel) take fewer units. Same bits either way.
  unsigned* work = nullptr;
  // PackedBalanced: 0 = the default split (4 warps), kForcedSplitMinWarps..kForcedSplitMaxWarps = forced
  // (another summation order: other bits).
  int packed_warps = 0;
  // Packed layouts: the weight × activation scale product as one exponent add (gemv_packed.cu
  // compute_group): the same bits, valid when every item's weight scale byte passes
  // mxfp4_scales_allow_exp_add (the caller checks) and the activation scales come from cedar's quantizers.
  bool scale_exp_add = false;
  TilesL2Prefetch l2_prefetch{};  // Tiles only
};
Status gemv_quantized_items(const QuantWeightView& shape, Mxfp4Layout layout, const DeviceGemvItem* items,
                            const int32_t* count, int64_t capacity, bool bf16_output, cudaStream_t stream,
                            const GemvItemsOptions& options = {});

// ---- SwiGLU (§3.8) ------------------------------------------------------------------------------------
// h = bf16(w_row · silu(min(g, L)) · clamp(u, ±L)) per row (clamps only if limit > 0; NaN passes as in
// torch.clamp), silu(g) = g / (1 + exp(−g)) with the CPU's fp32 rounding steps (exp as in the router).
// Outputs: h (fp32 holding bf16) and/or its FP8 activation quantization (codes + scales, exactly
// quantize_act_fp8's) for the W2 GEMV. row_weights null: no multiplication (shared expert).
struct SwigluArgs {
  int64_t rows = 0, inter = 0;         // inter % 32 == 0
  const float* g = nullptr;            // [rows, inter]
  const float* u = nullptr;            // [rows, inter]
  const float* row_weights = nullptr;  // [rows] or null
  float limit = 0.0f;
  float* h = nullptr;         // [rows, inter] or null
  uint16_t* codes = nullptr;  // [rows, inter] or null
  float* scales = nullptr;    // [rows, inter/32] (with codes)
  bool programmatic_launch = false;  // PDL (launch.h)
};
Status swiglu(const SwigluArgs& a, cudaStream_t stream);

// ---- MoE combine ---------------------------------------------------------------------------------------
// y[t] = bf16(Σ routed + shared[t]): the routed rows of token t (pairs t·topk + k) summed in fp32 in
// ascending expert id (equal ids in slot order), from 0.0f, then + shared — the CPU's order: bit-exact.
// shared may be null (no shared expert).
struct MoeCombineArgs {
  int64_t n = 0, topk = 0, d = 0;
  const int32_t* experts = nullptr;  // [n, topk]
  const float* routed = nullptr;     // [n·topk, d]
  const float* shared = nullptr;     // [n, d] or null
  float* y = nullptr;                // [n, d]
};
Status moe_combine(const MoeCombineArgs& a, cudaStream_t stream);

// ---- MXFP4 packed expert layout ---------------------------------------------------------------------
// Device layout "MXFP4 packed" (in % 128 == 0): the plain [out, in/2] bytes with every 64-byte group
// of a row (4 K blocks of 32 values) permuted so that packed[64q + 16t + 4u + j] = plain[64q + 16u +
// 4t + j] (t, u, j in 0..3): the 16 bytes a GEMV thread t needs from 4 consecutive K blocks are one
// aligned 16-byte load. Each such 4-byte word is also re-encoded in the "f16 placement" (byte k: value
// k's magnitude at bits 1..3 and sign at 7, value 4 + k's at bits 4..6 and 0; gemv_common.cuh
// e2m1_f16_word), so the GEMV builds f16 operands without conversions. Scales keep the plain
// [out, in/32] layout. Same size as the plain layout.
bool mxfp4_packable(int64_t out, int64_t in);
// Whether MXFP4 scale bytes (ue8m0) allow GemvItemsOptions::scale_exp_add: every byte in 9..127 (2^-118 ..
// 1), so that with an activation scale in [2^-22, 2^113] the product 2^(b−127)·2^14·s_a is a normal float.
// Host-side (load time).
bool mxfp4_scales_allow_exp_add(const uint8_t* scales, size_t count);
// Host-side repack (load time); `plain` and `packed` are host arrays of out·in/2 bytes (not aliased).
Status repack_mxfp4(const uint8_t* plain, int64_t out, int64_t in, uint8_t* packed);
// gemv_quantized / gemv_quantized_grouped for packed MXFP4 weights (view.format must be MXFP4):
// 32 rows per warp (two m16 tiles share each activation fragment), 16-byte weight loads. balanced =
// false: the plain kernel's K partition and summation order without split-K (bit-equal to it); true:
// the balanced schedule of Mxfp4Layout::PackedBalanced.

// ---- MXFP4 tile layout ----------------------------------------------------------------------------------
// Device layout "MXFP4 tiles" (out % 32 == 0, in % 128 == 0; mxfp4_tiles_bytes = data + scales bytes): for
// each 32-row tile and each group q of 4 K blocks, one contiguous 2 176-byte chunk — the tile's packed
// words (the packed layout's words, f16 placement) as [u 4][lane 32][i 4] (lane = 4g + t: thread t's word
// of K block 4q + u of row 32·tile + g + 8i), then its scale bytes as [u 4][g 8][i 4]. A warp's chunk is
// one bulk copy, and a lane reads its 4 rows' words of a K block as one 16-byte shared load.
bool mxfp4_tileable(int64_t out, int64_t in);
uint64_t mxfp4_tiles_bytes(int64_t out, int64_t in);
// Host-side (load time): the plain [out, in/2] codes and [out, in/32] scale bytes → the tile layout.
Status repack_mxfp4_tiles(const uint8_t* plain, const uint8_t* scales, int64_t out, int64_t in, uint8_t* tiles);

Status gemv_mxfp4_packed(const QuantWeightView& w, const uint16_t* act_codes, const float* act_scales, int64_t n,
                         float* y, bool bf16_output, cudaStream_t stream, bool balanced = false);
Status gemv_mxfp4_packed_grouped(const QuantWeightView& shape, const GemvGroupItem* items, int64_t count, int64_t n,
                                 bool bf16_output, cudaStream_t stream, bool balanced = false);

// ---- Engram (§3.9) ---------------------------------------------------------------------------------
// Hash on the device, so decode needs no host round trip for the next token's rows (the sampled token
// stays on the device). Integer arithmetic: bit-exact with EngramHasher. Layout tables come from
// engram_hash_tables(layout) (host, C++20 side), uploaded as one int64 array by the caller.
struct EngramHashTables {
  int64_t n_slots = 0, max_ngram = 0, n_heads = 0;  // cols = (max_ngram − 1)·n_heads
  const int64_t* table = nullptr;  // device: [n_slots·max_ngram multipliers][n_slots·cols primes][n_slots·cols offsets]
};
// The host array behind EngramHashTables::table and its shape (table left null).
struct EngramHashTablesHost {
  EngramHashTables view;
  std::vector<int64_t> values;
};
EngramHashTablesHost engram_hash_tables(const EngramLayout& layout);

// Per-sequence history on the device: next_pos[s] and the compressed ids (−1 = image/DEAD) of the last
// max_ngram − 1 positions in a ring, recent[s·(N−1) + pos % (N−1)] (entries below position 0 unused).
// A fresh sequence: next_pos 0. Tokens of one sequence must be consecutive in the launch with
// consecutive positions starting at that sequence's next_pos (a prefill chunk, or one decode token).
struct EngramHashArgs {
  EngramHashTables layout;
  const int32_t* token_map = nullptr;  // [map_size] raw id → compressed id
  int64_t map_size = 0;
  int32_t pad = 0;  // T[engram_pad_id]
  int64_t n = 0;
  const int32_t* tokens = nullptr;    // [n] (ids clamp into the map)
  const uint8_t* is_image = nullptr;  // [n] or null
  const int32_t* seq = nullptr;       // [n] sequence index of each token
  const int64_t* pos = nullptr;       // [n] absolute position of each token
  int32_t* recent = nullptr;          // [n_seqs, N−1], updated
  int64_t* next_pos = nullptr;        // [n_seqs], updated
  int64_t* rows = nullptr;            // [n_slots, n, cols] (EngramHasher::hash_chunk layout)
};
Status engram_hash(const EngramHashArgs& a, cudaStream_t stream);

// Gathers each token's cols table rows and dequantizes them exactly as engram_gather (bf16(e4m3 ·
// 2^(s−127)), or the bf16 row), writing E and/or its FP8 activation quantization (codes + scales of
// quantize_act_fp8) for the wkv GEMV — the E round trip and one launch saved. The table may be device
// memory or mapped pinned host memory (cudaHostAlloc(..., cudaHostAllocMapped) / cudaHostRegister with
// cudaHostRegisterMapped; pass the device pointer): a token reads cols·(head_dim + head_dim/32) bytes,
// so a 98 GB table needs no device memory. Rows outside [0, table_rows) give zeros and set *bad_row (if
// given) to at least 1 + the flat index (caller zeroes it).
struct EngramGatherArgs {
  int64_t n = 0, cols = 0, head_dim = 0;  // head_dim % 32 == 0
  const int64_t* rows = nullptr;          // [n, cols] (one layer slot of engram_hash's output)
  int64_t table_rows = 0;
  bool bf16_table = false;  // false: F8_E4M3 rows + F8_E8M0 scales [rows, head_dim/32]
  const uint8_t* table = nullptr;
  const uint8_t* table_scale = nullptr;
  float* E = nullptr;         // [n, cols·head_dim] or null
  uint16_t* codes = nullptr;  // [n, cols·head_dim] or null
  float* scales = nullptr;    // [n, cols·head_dim/32] (with codes)
  int32_t* bad_row = nullptr;
};
Status engram_gather_quant(const EngramGatherArgs& a, cudaStream_t stream);

// The gated stream update after kv = wkv·E (bf16, [n, (hc+1)·d]): per (token, stream k)
//   dot = Σ_c X_k·qk_k·key_k · rsqrt(mean X_k² + eps) · rsqrt(mean key_k² + eps) · d^-1/2
//   g = sigmoid(copysign(sqrt(max(|dot|, 1e-6)), dot)) (0 for image tokens),  X_k ← bf16(X_k + g·value)
// The three sums are blocked fixed-order fp32 reductions (the CPU sums in index order): g differs from
// the CPU's by the rounding of those sums; the update is the CPU's (no FMA contraction).
struct EngramUpdateArgs {
  int64_t n = 0, hc = 4, d = 0;
  float* X = nullptr;         // [n, hc, d], updated in place
  const float* kv = nullptr;  // [n, (hc+1)·d]
  const float* qk = nullptr;  // [hc, d] = q_weight ⊙ k_weight in fp32 (exact products of bf16 values)
  const uint8_t* is_image = nullptr;
  float norm_eps = 1e-20f;
  float* gates = nullptr;  // [n, hc] or null
};
Status engram_update(const EngramUpdateArgs& a, cudaStream_t stream);

// ---- final collapse, RMSNorm and fp32 head (§3.3, §2.3) --------------------------------------------
// out[t] = bf16(Σ_k w[t, k]·X[t, k]) in stream order: model/mhc.h hc_collapse, bit-exact.
Status hc_collapse_rows(const float* X, const float* weights, int64_t n, int64_t hc, int64_t d, float* out,
                        cudaStream_t stream);
// logits[t] = head · rms_norm(hc_collapse(X[t], pre[t]), norm_weight) in fp32 (the reference holds the
// bf16 head as fp32: here the bf16 values themselves, same products), via gemv_bf16 (cuda-attn). The
// collapse is bit-exact, rms_norm within one bf16 ulp (kernels.h), the head differs from cpu::linear by
// its summation order only. Three launches; x is the scratch for the normed row.
struct FinalHeadArgs {
  int64_t n = 0, hc = 4, d = 0, vocab = 0;
  const float* X = nullptr;            // [n, hc, d] streams after the last layer
  const float* pre = nullptr;          // [n, hc] the last ffn site's pre
  const float* norm_weight = nullptr;  // [d] final RMSNorm weight (bf16 values)
  float norm_eps = 1e-20f;
  const uint16_t* head = nullptr;  // bf16 bits [vocab, d], 16-byte aligned
  float* x = nullptr;              // [n, d] scratch (16-byte aligned)
  float* logits = nullptr;         // [n, vocab]
  SplitKWorkspace splitk;          // optional: gemv_bf16_splitk_size(vocab, d)
};
Status final_head(const FinalHeadArgs& a, cudaStream_t stream);

// ---- argmax and sampling (engine/sampler.h semantics) ----------------------------------------------
// Greedy without logit processing: tokens[r] = the first index of the largest logit of row r (ties to
// the lowest id, NaNs never chosen); −1 when logit 0 is NaN or the maximum is not finite (the CPU
// sampler's "no finite logit"). Bit-exact.
Status argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* tokens, cudaStream_t stream);

// PCG32 stream state (engine::Pcg32); pcg32_seeded gives the state Pcg32(seed, stream) starts from.
struct Pcg32State {
  uint64_t state = 0, inc = 0;
};
inline Pcg32State pcg32_seeded(uint64_t seed, uint64_t stream) {
  Pcg32State s;
  s.inc = (stream << 1u) | 1u;
  s.state = s.state * 6364136223846793005ULL + s.inc;
  s.state += seed;
  s.state = s.state * 6364136223846793005ULL + s.inc;
  return s;
}
constexpr uint64_t kSamplerRngStream = 0xCEDA5u;  // the stream engine::Sampler uses

struct LogitBiasEntry {
  int32_t token = 0;
  double bias = 0;
};
// One per token id that the penalties touch: in the prompt and/or produced output_count times.
struct PenaltyEntry {
  int32_t token = 0;
  int32_t output_count = 0;
  int32_t in_prompt = 0;
};
// Per-row sampling parameters (device array). Entry lists index the shared bias / penalty arrays;
// token ids within one list must be distinct (as the sampler's maps are).
struct SamplingRowParams {
  double temperature = 1.0, top_p = 1.0, min_p = 0.0;
  double repetition_penalty = 1.0, presence_penalty = 0.0, frequency_penalty = 0.0;
  int64_t top_k = 0;
  int32_t bias_begin = 0, bias_count = 0;
  int32_t penalty_begin = 0, penalty_count = 0;
};
// Sampler::sample for `rows` rows (one 1024-thread block per row): logit bias → repetition penalty →
// frequency/presence → temperature 0: argmax → softmax(x/T) → min-p → top-k (ties at the k-th value
// kept) → renormalize → top-p (descending p, lower id first, keep while the mass before < top_p) →
// renormalize → inverse-CDF draw in id order with u = next_double() of the row's PCG32 (state advanced
// in place; no draw at temperature 0). Double arithmetic as the CPU, but the sums run in a fixed blocked
// order (the CPU's is sequential) and exp is CUDA's (≤ 1 ulp): the distribution agrees to ~1e-15
// relative and the token is the CPU's unless u·total falls within that of a CDF boundary. Top-p masses
// are compared in 2^-62 fixed point (deterministic). tokens[r] = −1: no finite logit.
// Workspace: 2·rows·vocab doubles (x, then the final distribution p, left there for inspection).
struct SampleArgs {
  int64_t rows = 0, vocab = 0;
  const float* logits = nullptr;              // [rows, vocab]
  const SamplingRowParams* params = nullptr;  // [rows]
  const LogitBiasEntry* bias = nullptr;
  const PenaltyEntry* penalties = nullptr;
  Pcg32State* rng = nullptr;    // [rows]
  double* workspace = nullptr;  // [rows, 2, vocab]
  int32_t* tokens = nullptr;    // [rows]
};
Status sample_rows(const SampleArgs& a, cudaStream_t stream);

// ---- fused mHC, cluster variant (sm_90) --------------------------------------------------------------
// mhc_fused (kernels.h) without the global workspace and ticket: one thread-block cluster of 16 blocks
// per tile of 8 tokens; each block streams its slice of fn into shared memory with TMA bulk copies,
// the 25 partial sums meet through distributed shared memory (no global atomics, no threadfence), and
// the Sinkhorn runs in registers (one thread per token, reciprocal-multiply instead of division).
// Expand / collapse are bit-exact as mhc_fused; the coefficients agree with the CPU as mhc_fused's do.
// Needs a device that can co-schedule a 16-block cluster with the fn slice in shared memory
// (mhc_cluster_supported); otherwise use mhc_fused. programmatic_launch: launched with programmatic
// stream serialization (PDL), so the blocks start and stream fn while the previous kernel finishes;
// they wait (griddepcontrol.wait) for it before touching X, y or the coefficients.
Status mhc_cluster_supported(int64_t d);
Status mhc_fused_cluster(const MhcFusedArgs& a, cudaStream_t stream, bool programmatic_launch = false);

// ---- catalog -----------------------------------------------------------------------------------------
std::vector<KernelInfo> ffn_kernel_catalog();
Status ffn_check_kernels_loadable();

}  // namespace cedar::cuda
