// The DeepSeek-V4.1 model on the GPU (issue 8): load (the CPU model's config, plan and bound weights) →
// device weights → device KV → new_sequence → decode_step (one token per sequence, batched, replayed as
// a CUDA graph) / prefill (a chunk of one sequence, exact or CED). The CPU model (model/deepseek_v41.h)
// is the oracle: same layer loop, same block order (single-pass mHC, Engram before the block, the CED
// row split), same per-sequence state, on the device. Host-side C++20 (included from .cpp files).
//
// Kernels (docs/cuda-log.md "CUDA model"): rows <= kGemvMaxRows (decode up to batch 8) run the GEMVs
// (kernels.h, ffn_kernels.h items path for the routed experts); larger calls (prefill chunks, decode at
// batch 64) the tiled GEMMs of gemm_kernels.h (quant_gemm, swiglu_gemm, moe_experts, cuBLASLt for the BF16
// weights when it loads). Everything of a step stays on the device: Engram hashes with a device history
// per sequence, the indexer's top-k and the router's experts never come back to the host, argmax runs on
// the device, and a decode step is one CUDA graph per (batch, context bucket).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/device_kv.h"
#include "backend/cuda/device_weights.h"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/stream.h"
#include "core/status.h"
#include "core/threads.h"
#include "model/deepseek_v41.h"
#include "model/forward_types.h"

namespace cedar::cuda {

// Calls of at most this many rows are one GEMV token tile (the weights read once): the concurrent branches, the
// fused multi / staged GEMVs and the one-launch router run up to it.
inline constexpr int64_t kGemvMaxRows = 8;
// Decode batches up to this many rows keep the dense linears, the shared expert and the routed experts on the GEMVs
// (CudaKernelPaths::gemv_max_rows, moe_items_max_rows): the FP8 linears in one launch of up to 64 tokens
// (gemv_fp8_tokens.cu), the routed experts per 8 of an expert's rows. The GEMMs they replace were slower at these sizes: H200,
// s27 run 2, TPOT at batch 16 / 32 was 38.49 / 43.19 ms on the GEMMs and 18.43 / 31.05 with the 8-token tiles; H100,
// s28, batch 64 51.40 ms on the GEMMs and 50.21 with the one-launch FP8 GEMVs (55.62 with the tile loop).
inline constexpr int64_t kDecodeGemvMaxRows = 64;

struct MhcWorkspace;  // kernels.h
struct ActQuantOut;   // kernels.h
struct MoeDispatchArgs;  // ffn_kernels.h

// The layer loop's kernel paths that have a faster variant (docs/cuda-log.md "Performance pass", "phase 3"):
// the defaults are the fast paths; `legacy()` is the loop before them (tests compare the two,
// `cedar bench --device cuda --cuda-options` A/Bs them). Bit-identical to the old path:
// programmatic_launch, mhc_batched below kMhcStreamMinTokens rows (and wo_a_fp8); the others change
// fp32 summation orders (the CPU oracle's bounds apply).
struct CudaKernelPaths {
  // Decode: RMSNorm, activation quantization, the FP8 / MXFP4 / BF16 GEMVs and mHC launch with
  // programmatic dependent launch (launch.h): each starts, and prefetches its weights, while its
  // predecessor finishes (the kernels wait before reading any input: same results).
  bool programmatic_launch = true;
  // moe_route with its split-K workspace: the gate streamed by ~120 blocks and, up to 8 rows, one fused
  // launch (logits + selection); above kRouterBlasMinTokens rows the logits as one cuBLASLt GEMM.
  // Except at decode with concurrent branches (the router beside the shared expert): unsplit there.
  // false: the unsplit kernels.
  bool router_splitk = true;
  // mhc_fused with a sized workspace: every token tile of a call in one launch, the streaming kernel
  // from kMhcStreamMinTokens rows on (prefill). false: the legacy workspace (one 8-token tile per launch).
  bool mhc_batched = true;
  // mhc_fused_cluster (ffn_kernels.h) instead of mhc_fused for 5..127 rows, where supported.
  bool mhc_cluster = false;
  // The sites' input RMSNorm requested from mhc_fused (MhcFusedArgs::normed: fused into the decode
  // kernel's last block up to kMhcNormFuseMaxTokens rows, same bits). false: a separate rms_norm launch.
  bool mhc_fused_norm = true;
  // Calls on the GEMV path (<= gemv_max_rows rows; up to s28 <= kGemvMaxRows): wq_a + wkv (x's codes) and, on
  // index-source layers, wq_b + the indexer's wq_b (qr's codes) as one gemv_quantized_multi launch each.
  // s29 run 1 (H100), above 8 rows against gemv_multi=0: level (batch 16 / 32 / 64 18.44 / 27.00 / 45.52 vs
  // 18.51 / 27.01 / 45.23 ms).
  bool gemv_multi = true;
  // Calls of at least this many rows run the FP8 / MXFP4 linears and the shared expert's SwiGLU GEMM
  // through exact bf16 dequantization + cuBLASLt (gemm_kernels.h "through bf16 cuBLASLt"), when it
  // loads; fewer rows (> kGemvMaxRows) the tiled quant_gemm / swiglu_gemm.
  int64_t blas_min_rows = 256;
  // Routed experts of calls up to this many rows (>= kGemvMaxRows) through the device item tables
  // (tile GEMVs: each expert read once per 8 of its rows), more rows through the grouped GEMMs. The
  // workspace is sized at load for the loaded value; set_paths clamps to it.
  int64_t moe_items_max_rows = kDecodeGemvMaxRows;
  // Calls up to this many rows (>= kGemvMaxRows) run the FP8 linears and the shared expert through the GEMVs
  // (gemv_quantized: FP8 in one launch of up to 64 tokens, the weights read once), more rows through quant_gemm /
  // swiglu_gemm (or cuBLASLt from blas_min_rows). The workspace is sized at load for the loaded value; set_paths clamps to it.
  int64_t gemv_max_rows = kDecodeGemvMaxRows;
  // Decode-shaped attention (sparse_attention_decode): q's RoPE applied by the attention kernel as it
  // loads q (SparseAttnArgs::q_before_rope) instead of a rope_apply launch. Bit-identical.
  bool fused_q_rope = true;
  // Decode-shaped attention: the head-split plan (SparseAttnArgs::decode_head_split: 16 heads per block
  // while rows × key tiles <= 64, so an SWA-only layer at batch 1 runs 16 blocks, not 4; −0.41 ms per step at
  // batch 1 on the H200). Not bit-identical to the
  // 64-head plan (phase A's channel parts summed in another order); same CPU-oracle bounds.
  bool attn_head_split = true;
  // Decode with concurrent branches: a site's mHC split into its critical part (expand + collapse + the
  // input norm, elementwise) on the model's stream and the next site's coefficients (fn GEMV + Sinkhorn)
  // on a third stream, joined at the next site — the coefficients are only read there (single-pass
  // mHC), so they run beside the sublayer. Same kernels and inputs, so the same bits.
  bool mhc_split = true;
  // The critical half of a split site in one launch: expand + collapse + the input norm
  // (mhc_expand_collapse_norm_kernel, up to kMhcNormFuseMaxTokens rows) instead of the elementwise
  // kernel and a separate rms_norm. rms_norm's arithmetic op for op, so the same bits.
  bool mhc_split_norm = true;
  // Decode with concurrent branches: every Engram layer's gather + quantization + wkv GEMV (they read
  // only the step's n-gram hashes, not the streams) on a fourth stream from the step's start, each layer
  // joined right before its engram_update — off the critical path between the layers. Same kernels and
  // inputs (own codes, kv and split-K buffers), so the same bits.
  bool engram_ahead = true;
  // Calls of up to gemv_max_rows rows with wo_a as stored and fp8_fast: o staged as exact f16 blocks with
  // power-of-two scales (stage_act_f16) + the FP8 grouped GEMV over the groups (gemv_fp8_staged: above 8 rows
  // one launch, gemv_fp8_tokens.cu) instead of gemv_bf16's in-register bf16 dequantization. Not bit-identical
  // (the fp32 sums run per 32-block, then scaled); the products are the same exact values, so the CPU
  // oracle's bounds apply. Up to s28 only up to kGemvMaxRows rows; s29 run 1 (H100), TPOT at batch 16 / 32 / 64
  // against wo_a_f16=0: 18.44 / 27.00 / 45.52 vs 18.29 / 28.08 / 45.07 ms.
  bool wo_a_f16 = true;
  // The producers of the activations the FP8 GEMVs read write their codes too (act_quant.cuh: the same
  // bits as quantize_act_fp8), one quantize_act_fp8 launch less each: fused_act_quant = q_norm (qr's
  // codes for wq_b and the indexer's wq_b); site_act_quant = the mHC site norms (every kernel that writes
  // normed: x's codes for wq_a + wkv and for the experts). site_act_quant is off: on the H200 (s8 run 5)
  // the site kernels with codes were slower than site kernel + quantize (10.4 vs 6.9 µs at batch 1) and
  // the step 0.27 ms slower with both switches on than with both off.
  bool fused_act_quant = true;
  bool site_act_quant = false;
  // Decode, split sites up to kMhcNormFuseMaxTokens rows: the critical half as one thread-block cluster
  // (MhcFusedArgs::site_cluster, mhc_site_cluster.cu: every block computes the row's norm from the others'
  // shared memory, no ticket, no one-block tail), which also writes normed's FP8 codes in parallel — so where
  // its kernel runs (mhc_site_cluster_fits: at d = 5120 batch 1) it implies the site codes (fold_act_quant) and
  // the quantize launch after each site is gone. The same bits. On: batch 1 6.867 -> 6.774 ms on the H200
  // (s21 run 1; the site plus its quantize 7.4 -> 5.5 µs in layer 21), batch 8 level (its kernel does not run).
  bool site_cluster = true;
  // Decode with concurrent branches: the SWA ring commit after the sparse attention (nothing later in the
  // layer reads the ring) on the aux stream, joined at the ffn site (before the next layer's
  // swa_kv_encode rewrites the staged records). The same kernel on the same inputs.
  bool swa_commit_aside = true;
  // Decode with concurrent branches: the router (split-K, one launch) and the expert dispatch on the main
  // stream before the routed / shared fork instead of at the head of the routed branch. Off: +0.25..+0.29 ms
  // at batch 1 on the H200 (s9), the router's latency no longer hides the shared expert's GEMVs.
  bool router_ahead = false;
  // The expert dispatch (moe_build_items) built by the last block of the fused split-K router launch
  // (moe_route with a dispatch) instead of a one-block kernel after it: one launch and one PDL hand-off
  // less before w1 / w3 (the s8 timeline: ~7.5 µs from the selection's end to the items' at batch 1). The
  // same device function on the same ids: the same items. On with router_splitk_beside and fork_pdl (s9,
  // docs/cuda-log.md "Session 9": the three together −0.22 ms at batch 1, each alone slower or level).
  bool dispatch_in_router = true;
  // The split-K router (one fused launch; with dispatch_in_router also the items) in the routed branch
  // beside the shared expert too, instead of the unsplit logits + select (+ moe_build_items) that s5 / s6
  // measured faster there before the dispatch moved into the fused launch. On (s9, with the two beside it).
  bool router_splitk_beside = true;
  // The fused router's last block at batch 1: every warp takes the top-k of its experts' keys, then one warp the
  // top-k of theirs (ffn_router.cu select_one_token_block), instead of one warp over all 384. The same ids and
  // weights. s33 (H200): the router alone 12.26 → 10.06 µs, the model level at batch 1 (6.540 / 6.535 vs 6.529 /
  // 6.529 ms: the routed w1/w3 start earlier beside the shared expert and end where they did).
  bool router_one_token = true;
  // Decode with concurrent branches: the main stream's first kernel after a fork keeps its PDL edge (it
  // depends only on its own stream's last kernel; the aux stream's first kernel and the kernel after the
  // join wait on the other stream and stay full edges). The s8 timeline shows the routed branch's first
  // kernel starting 5.6 µs after the kernel before the fork ended. On (s9: −0.16 ms alone at batch 1).
  bool fork_pdl = true;
  // fork_pdl also in the layers whose keys branch runs the compressor. There that branch (compressor,
  // SWA KV; the indexer after the join) is the critical one, and with the query branch's 2 048-block wq_b
  // launched programmatically ahead of it, its first kernels waited for wq_b (s9 run 6, s10 run 1: layer
  // 20 256–261 µs, 222 with full edges in s8). Off: both heads on full edges (s10 run 2: layer 20 247 µs,
  // the step −0.017 ms against fork_pdl_compressor=1).
  bool fork_pdl_compressor = false;
  // Decode, layers whose keys branch would be the SWA KV encode alone (no compressor): q_norm and the encode
  // in one launch (q_norm_swa_kv_encode) on the main stream, no fork. The encode on the aux stream found no
  // free SM until the query branch's wq_b (2 048 blocks, launched under PDL at q_norm's start) drained, and
  // ended ~2 µs after wq_b, ahead of the attention (s21 run 3, layer 21: encode 18.4–24.1 µs, wq_b ends 22.5,
  // the attention starts 24.8; on a programmatic edge across the fork it started when wq_b ended). The same
  // bits, one launch fewer per such layer. On: batch 1 6.845 -> 6.763 ms, batch 8 11.297 -> 11.242 (s21 run 5;
  // the attention now starts as wq_b ends, and q_norm ends 3.9 µs after its input instead of 7.3).
  bool q_norm_kv_encode = true;
  // Decode: the attention's fast merge triggers its dependents at its start (SparseAttnArgs::
  // decode_merge_trigger), so wo_a's blocks are resident when the merge ends; without it the merge
  // triggered at its end and wo_a started ~0.5 µs after it (s21 timeline). The same bits. On: batch 1
  // -0.036 ms (s24 run 2, 6.772 -> 6.736 in one process) and -0.028 ms (run 4, 6.735 -> 6.707).
  bool attn_merge_trigger = true;
  // Decode with concurrent branches: the routed experts' w1 / w3 waits on a full edge for the router
  // instead of a programmatic one. Under PDL its persistent grid (one wave of every SM) becomes resident at
  // the router's start and spins in its wait, so the shared expert's GEMVs on the aux stream find no SM
  // until the routed w1 / w3 ends (s10 run 2, layer 21: the router ends 14.7 µs after its input, the
  // shared w1 / w3 starts 47 µs after the fork). On a full edge the shared expert runs while the router
  // does: −0.160 ms at batch 1 (s10 run 3, A/B routed_full_edge=1 against 8.271 ms).
  bool routed_full_edge = true;
  // Decode: the attention's merge also writes wo_a's exact f16 staging of o (SparseAttnArgs::out_f16_codes:
  // stage_act_f16's bits), so the staged wo_a GEMV (wo_a_f16) follows the merge without the stage launch
  // (the s10 timeline: 2.9 µs from the merge's end to wo_a's start with the ring commit and the stage).
  // −0.031 ms at batch 1 (s10 run 5, A/B attn_stage_wo_a=1 against 8.090 ms).
  bool attn_stage_wo_a = true;
  // Decode with concurrent branches, up to kMhcNormFuseMaxTokens rows: the MoE combine is left to the next
  // layer's attention site, whose expand + collapse + norm kernel combines each channel as it reads y
  // (MhcFusedArgs::y_combine: moe_combine's bits) — the combine launch and its hand-off after the join are
  // gone (the s10 timeline: 2.7 µs + 0.6 µs per layer). −0.015 / −0.035 / −0.058 ms at batch 1 (s11 runs
  // 1–3: A/B site_combine=1 against 8.04–8.05 ms); site_combine=0 +0.035 / +0.068 ms (runs 4, 5).
  bool site_combine = true;
  // Decode: the expert dispatch of up to kMoeWarpBuildPairs pairs (n·topk) built by one warp from match
  // masks (moe_items_build.cuh build_moe_items_warp) instead of the block-wide scans: in the fused router's
  // tail the block builder's ~12 barriers, two scans and three serial pointer-load round trips were the
  // longest stage (s13 stamps: 13 k of 23 k cycles at batch 1). The same items, byte for byte.
  bool warp_items = true;
  // Decode: the routed experts' GEMVs take the scale product as one exponent add (GemvItemsOptions::
  // scale_exp_add; the same bits) where the upload proved every expert scale byte in range
  // (DeviceExperts::scales_checked). s18 run 5: w1/w3 at batch 1 30.72 → 29.91 µs; decode 7.058 → 6.967 ms.
  bool scale_exp_add = true;
  // Decode above kGemvMaxRows rows (up to gemv_max_rows and moe_items_max_rows, where no GEMM workspace is
  // shared): the concurrent branches as below it (CudaModel::branches) — the query beside the keys, the routed
  // experts beside the shared expert, the SWA ring commit aside; the mHC coefficients and the Engram gathers
  // stay one tile only (their scratch). Same bits (each branch's kernels are the same). s28 (H100), the MoE fork
  // alone, TPOT at batch 16 / 32 / 64: 19.68 / 31.11 / 50.03 ms serial, 18.87 / 30.02 / 47.54 forked; s29 run 1
  // (H100), every fork: 19.65 / 28.43 / 48.28 off, 18.44 / 27.00 / 45.52 on.
  bool branches_above_tile = true;
  // The shared expert's GEMVs (w1 / w3, w2) split over K as every FP8 GEMV (choose_ksplit fills a wave). false: one
  // block per 16-row tile (w1 / w3 256 blocks, w2 320 at V4.1's shapes), other sums within the CPU bounds: an
  // experiment (s33, not yet run) for the routed tile grid: 8 K registers a block (768 blocks at batch 1, ~47 K of an
  // SM's 64 K), it ran 37.9 µs after the router beside the shared expert against ~25 alone (H200, layer 21).
  bool shared_splitk = true;
  // Decode: a forced K split of the routed experts' packed GEMVs (GemvItemsOptions::packed_warps: 2..8 warps
  // per block, one K part each — another summation order, other bits); 0 = the default split (4). A benchmark
  // switch: s19 run 3, 2 warps: batch 1 6.960 → 6.810 ms, batch 8 11.341 → 11.669 ms.
  int64_t routed_warps = 0;
  // Decode: the routed experts' GEMVs read the tile layout (Mxfp4Layout::Tiles, gemv_tiles.cu: the balanced
  // packed kernel's arithmetic and bits, the weights streamed into per-warp shared-memory rings by TMA bulk
  // copies, 64 registers and 32 warps per SM instead of 128 and 16) where it was uploaded
  // (CudaModelOptions::tiled_experts). s25 on an H100, one process: batch 1 7.666 → 7.553 ms, batch 8 12.540 →
  // 12.504 (kernel rows: the routed path 61.2 → 53.0 µs at batch 1); on the H200 (s25 run 0) −0.007..−0.025 ms.
  bool routed_tiles = true;
  // Decode at batch 1: the mHC decode kernel (the split site's coefficients beside the sublayer, the fused
  // site otherwise) with one token's registers and shared memory per block instead of an 8-token tile's
  // (MhcFusedArgs::decode_one_token, mhc_decode_one_kernel; the same bits): the split site's coefficients take
  // 64 registers a thread instead of 108 (16 K a 256-thread block instead of 27.6 K on each of 80 SMs, beside the
  // router and the routed w1 / w3: H200 layer 21, s33, 66.5–80.4 µs). An experiment (s34).
  bool mhc_one_token = false;
  // Decode, routed tile GEMVs: the w1 / w3 launch's blocks also request the routed w2's weights into L2 (TMA
  // bulk prefetches of w2's live units, GemvItemsOptions::l2_prefetch; none where they exceed 3/4 of L2, i.e.
  // above a few rows), so that w2 reads them from L2 when it passes its wait. 0 off, 1 before each block's own
  // units, 2 after them (in w1 / w3's tail, where the blocks behind the shared expert still run). At batch 1 the
  // MoE segment reads 2.2 TB/s (H200 layer 21, s33): HBM has room beside w1 / w3. The same bits. s4 asked
  // this of the packed kernel from a side stream (+0.13 ms); the tile kernel streams by TMA. An experiment (s35).
  int64_t routed_w2_prefetch = 0;
  // Decode with the MoE fork, on the GEMV path: the shared expert's w2 waits for the routed w1 / w3 (an event
  // across the branches) and runs beside the routed SwiGLU and w2, instead of beside the routed w1 / w3. In the
  // layer, w1 / w3 take 37 µs beside the shared w2 and the next site's coefficients against ~25 alone (H200
  // layer 21, s33; H100 s29: 39.8 forked, 31.8 on one stream). The shared w1 / w3 + SwiGLU stay beside the
  // router. The same kernels on the same inputs: the same bits. An experiment (s35).
  bool shared_w2_late = false;
  // Decode graphs: one preferred shared-memory carveout (percent, 1..100) set on every kernel node
  // (GraphOptions::smem_carveout), or 0: each kernel's own. An SM changes its L1 / shared split only when
  // idle, so a kernel launched early under PDL, or on a concurrent branch, whose split differs from the
  // resident kernels' cannot start on their SMs (the tile GEMV's rings take ~140 KB per SM, the FP8 GEMVs
  // almost none). s18 / s19 suspected this for the routed GEMVs' slowdown in the model (s29: w1/w3 39.8 µs
  // beside the shared expert, ~30 alone). Measured slower (s32, H100, one process): batch 1 7.510 ms off,
  // 8.097 / 8.229 at 100 / 72; batch 8 12.848 against 14.063 / 13.979. The driver's split per kernel stays.
  int64_t graph_carveout = 0;
  static CudaKernelPaths legacy();
};

struct CudaModelOptions {
  int device = 0;
  DeviceWeightOptions weights;
  DeviceKvOptions kv;
  int64_t max_batch = 64;                       // decode sequences per step (also: logit rows of one call)
  int64_t max_chunk = 2048;                     // prefill rows per call (the activation workspace is sized for it)
  uint64_t headroom_bytes = uint64_t{2} << 30;  // left free: CUDA context, library workspaces
  bool cuda_graphs = true;                      // decode steps replayed as one graph per (batch, context bucket)
  // The routed MXFP4 experts are uploaded as stored (the prefill GEMMs) plus one decode layout: the tiles
  // (paths.routed_tiles). The packed layout (the balanced packed kernel, taken with routed_tiles=0) is a third
  // copy, 11.3 GB on the perf profile: only for comparisons. Without either, the decode GEMVs read the plain bytes.
  bool packed_experts = false;
  bool tiled_experts = true;
  bool use_cublas = true;                       // BF16 prefill GEMMs through cuBLASLt when it loads
  // Decode (GEMV path): independent chains of a layer run on a second stream inside the step's graph
  // (the query path beside the SWA KV path and the compressor; the shared expert beside the routed ones).
  bool concurrent_branches = true;
  // wo_a as stored (FP8 + scales, decided at load): decode reads half its bytes (gemv_bf16 with w_fp8,
  // bit-identical to the BF16 values); calls above 64 rows dequantize it per call for cuBLASLt (the
  // same bf16 values, so the same bits as the BF16 weight). false: the BF16 values are uploaded.
  bool wo_a_fp8 = true;
  CudaKernelPaths paths;             // switchable after load too (CudaModel::set_paths)
  ThreadPool* pool = nullptr;        // host-side load conversions
  std::filesystem::path engram_map;  // as LoadOptions::engram_map
};

// "name=value,name=value" (the CudaKernelPaths fields and wo_a_fp8; values 0/1 or integers) applied to
// `o`: cedar bench's --cuda-options. The error names the unknown name or the bad value.
Status apply_cuda_options(std::string_view spec, CudaModelOptions& o);
// The same names with o's values, e.g. "programmatic_launch=1,router_splitk=1,...".
std::string describe_cuda_options(const CudaModelOptions& o);

// One sequence on the device: its KV slot and tables, its length and prefill mode.
struct CudaSequence {
  DeviceKvSequence kv;
  SequenceOptions options;
  int64_t length = 0;
  int64_t replay_start = 0;  // CED: rows before it run the encoder + boundary only
  bool failed = false;       // a step failed after touching the state: discard the sequence
};

struct CudaStepOutput {
  const float* logits = nullptr;  // device [rows, vocab] fp32, valid until the next call
  int64_t rows = 0;
  std::vector<int64_t> positions;  // absolute position of each logit row
  std::vector<int32_t> argmax;     // greedy token of each logit row (device argmax; −1: no finite logit)
};

// The discrete decisions of the last call (tests: tell a selection flip from a numeric error).
struct CudaSelections {
  int64_t rows = 0;
  int64_t index_topk = 0, experts_per_token = 0;
  std::vector<std::vector<int32_t>> topk;     // per layer: [rows, index_topk] for index sources, else empty
  std::vector<std::vector<int32_t>> experts;  // per layer: [rows, experts_per_token] routed expert ids
};

// Device time of one decode step by stage (events inside the step's graph), summed over layers.
struct StageTime {
  std::string stage;
  double us = 0;
  uint64_t weight_bytes = 0;  // weights the stage reads (batch 1: the top-k experts)
  int64_t calls = 0;          // layers (or sites) that contributed
};

class CudaModel {
 public:
  // Loads the host model (DeepseekV41Model::load with options.engram_map and options.pool), then as below.
  static Result<std::unique_ptr<CudaModel>> load(const std::filesystem::path& path, const CudaModelOptions& options);
  // The device model of an already loaded host model, which it shares (config, plan, Engram hasher; the
  // bound weights are read once, by the upload): `cedar serve|run|chat --device cuda` load the checkpoint
  // once for the tokenizer side and the GPU. options.engram_map is not used (the host model's map is).
  static Result<std::unique_ptr<CudaModel>> load(std::shared_ptr<const DeepseekV41Model> host,
                                                 const CudaModelOptions& options);
  ~CudaModel();

  const ModelConfig& config() const { return host_->config(); }
  const LayerPlan& plan() const { return host_->plan(); }
  const DeepseekV41Model& host_model() const { return *host_; }
  const DeviceWeights& weights() const { return weights_; }
  DeviceKvPool& kv_pool() { return kv_; }
  // Weights + KV + workspace, per component (what load checked against the free memory).
  const DeviceMemoryPlan& memory_plan() const { return memory_plan_; }
  cudaStream_t stream() const { return stream_.get(); }
  bool has_cublas() const;
  void use_cuda_graphs(bool on) { options_.cuda_graphs = on; }
  void use_concurrent_branches(bool on) { options_.concurrent_branches = on; }
  // Tests / benchmarks: switch kernel paths after load (moe_items_max_rows clamped to the workspace);
  // drops the captured decode graphs.
  void set_paths(const CudaKernelPaths& p);
  bool wo_a_fp8() const;  // wo_a is on the device as FP8
  // Tests: calls of n rows run every layer's wo_a through gemv_fp8_staged (paths.wo_a_f16, the weight FP8
  // and fp8_fast, whole scale blocks per group, n <= paths.gemv_max_rows, the workspace large enough).
  bool wo_a_f16_active(int64_t n) const;
  const CudaModelOptions& options() const { return options_; }
  // Tests: prefill calls report the CPU model's per-layer tensors (layers.L.attn_in / attn_out / ffn_in /
  // ffn_out / engram_out / out, final_norm is not produced) through `sink` (downloads: slow). Empty: off.
  void set_debug_sink(TensorSink sink) { debug_sink_ = std::move(sink); }
  size_t decode_graph_count() const { return decode_graphs_.size(); }
  // Tests: Engram layers whose projection the last issued call (direct run or graph capture) put on the
  // Engram stream (paths.engram_ahead); 0 when they ran serially.
  int64_t engram_ahead_layers() const { return engram_ahead_layers_; }
  // Tests: layers whose q_norm and SWA KV encode shared one launch in the last issued call (q_norm_kv_encode).
  int64_t q_norm_kv_layers() const { return q_norm_kv_layers_; }
  // Tests: kernel (and copy) nodes of the captured decode graph of `batch` (the largest over context
  // buckets; 0 without one): launches a path removes show here.
  size_t decode_graph_nodes(int64_t batch) const {
    size_t nodes = 0;
    for (const auto& [key, graph] : decode_graphs_)
      if (key.first == batch) nodes = std::max(nodes, graph.nodes());
    return nodes;
  }
  bool has_decode_graph(int64_t batch) const {
    for (const auto& [key, graph] : decode_graphs_)
      if (key.first == batch) return true;
    return false;
  }

  Result<CudaSequence> new_sequence(const SequenceOptions& options);
  // A new sequence in the state `from` has now (KV blocks, rings, compressor and Engram state copied).
  Result<CudaSequence> fork_sequence(const CudaSequence& from);

  // One token per sequence at its current length (batch <= max_batch, distinct sequences); logits of
  // every row. On error before any state was touched the sequences stay usable.
  Status decode_step(std::span<CudaSequence* const> seqs, std::span<const int64_t> tokens, CudaStepOutput& out);
  // The next chunk (<= max_chunk tokens) of one sequence's prompt, in the sequence's mode. Logits exist for
  // rows at or after the CED replay start only (as on the CPU); All needs those rows <= max_batch.
  Status prefill(CudaSequence& seq, std::span<const int64_t> tokens, LogitRows logits, CudaStepOutput& out);

  // The indexer top-k and router experts of the last call's first `rows` rows (device → host).
  Result<CudaSelections> last_selections(int64_t rows) const;

  // One decode step (as decode_step) with an event after every stage, replayed as a graph; per-stage
  // device time summed over layers, sorted by time. The state advances as in decode_step.
  Result<std::vector<StageTime>> profile_decode_step(std::span<CudaSequence* const> seqs,
                                                     std::span<const int64_t> tokens, CudaStepOutput& out,
                                                     double* step_us);

  // One prefill chunk (exact or the sequence's mode) with an event after every stage (direct launches).
  Result<std::vector<StageTime>> profile_prefill(CudaSequence& seq, std::span<const int64_t> tokens, double* total_us);

  struct Workspace;  // activation buffers (cuda_model_internal.h)
  struct Tables;     // per-layer descriptor tables, RoPE tables, Engram tables
  struct Profiler;

 private:
  CudaModel(std::shared_ptr<const DeepseekV41Model> host, const CudaModelOptions& options, Stream stream,
            DeviceWeights weights, DeviceKvPool kv, std::unique_ptr<Workspace> ws, std::unique_ptr<Tables> tables,
            DeviceMemoryPlan plan);

  // Rows of one forward call that run the same layers (the CED split, as in the CPU model). Per-row
  // data (token, position, slot, attention rows) is in one of the step-input regions, so a captured
  // decode graph stays valid from step to step.
  struct Rows {
    int64_t first = 0;  // offset of these rows in the step inputs
    int64_t n = 0;
    bool tail = true;     // false: rows before the CED replay start (encoder + boundary layer)
    bool decode = false;  // the decode region (one row per sequence)
    LogitRows logits = LogitRows::All;
    int64_t context = 0;                   // > every row's position: sizes the indexer scans (bucketed in decode)
    bool global_kv_only_boundary = false;  // CedBoundary::GlobalKvOnly (prefill of one sequence)
    int64_t pos0 = 0;                      // position of the first row (prefill; debug sink only)
  };
  struct RowSpan;  // one sequence's rows in a call (staging)
  Status stage_rows(bool decode, std::span<const RowSpan> spans, int64_t n);
  Status run_rows(const Rows& r);    // run_layers, then the coefficient stream joined
  Status run_layers(const Rows& r);
  Status run_step(const Rows& r, CudaStepOutput& out);  // graph / direct + argmax download
  Status embed(const Rows& r);
  Status engram(int64_t layer, const Rows& r);
  // paths.engram_ahead: at the step's start (after the hashes), every Engram layer's gather + wkv on the
  // Engram stream into its own kv buffer; join_engram(slot) before that layer's update, join_engram(-1)
  // every layer still pending (run_rows: after errors too, so a capture in progress ends merged).
  bool engram_ahead_on(const Rows& r) const;
  Status fork_engram(const Rows& r);
  Status join_engram(int64_t slot);
  Status attention_site(int64_t layer, const Rows& r);
  Status attention(int64_t layer, const Rows& r);
  Status compressor(int64_t layer, const Rows& r);
  Status indexer(int64_t layer, const Rows& r, bool qi_ready);  // qi_ready: wq_b_i ran with wq_b
  Status ffn_site(int64_t layer, const Rows& r);
  Status moe(int64_t layer, const Rows& r);
  // Router logits + top-k into the layer's expert ids; beside_shared: in the routed branch next to the
  // shared expert (the unsplit logits).
  // The router; with `dispatch` also the expert items (moe_build_items, or inside the fused router's launch
  // with paths.dispatch_in_router).
  Status route(int64_t layer, const Rows& r, bool beside_shared, MoeDispatchArgs* dispatch = nullptr);
  Status moe_gemv(int64_t layer, const Rows& r);
  Status moe_gemm(int64_t layer, const Rows& r);
  // The shared expert: GEMVs up to paths.gemv_max_rows rows, else the GEMMs. On the GEMV path the two halves
  // can be launched apart (paths.shared_w2_late): Up = w1 / w3 + SwiGLU, Down = w2.
  enum class SharedPart { All, Up, Down };
  Status shared_expert(int64_t layer, const Rows& r, SharedPart part = SharedPart::All);
  Status finish(const Rows& r);
  // y = W·x for quantized weights (FP8 / MXFP4) from already quantized activations: GEMV or GEMM by rows.
  Status qlinear(const DeviceMatrix& w, const uint16_t* codes, const float* scales, int64_t n, float* y,
                 bool bf16_output = true);
  Status quantize(const float* x, int64_t n, int64_t in, uint16_t* codes, float* scales);
  // RMSNorm (model eps); with quant (not null) also the FP8 codes of y.
  Status norm(const float* x, int64_t n, int64_t dim, const DeviceVector& weight, float* y,
              const ActQuantOut* quant = nullptr);
  // paths.site_act_quant (site: the mHC site norms) / paths.fused_act_quant (q_norm) for an activation
  // [n, width] of the act_a / act_b buffers: its producer writes the codes and the quantize launch is
  // skipped. One predicate for both sides.
  bool fold_act_quant(int64_t n, int64_t width, bool site) const;
  // paths.swa_commit_aside: the ring commit on the aux stream and the wait for it (ffn_site, run_rows).
  Status join_swa_commit();
  // BF16 weights (groups of one shape as in gemv_bf16): gemv_bf16, or cuBLASLt for large calls.
  struct DenseCall;
  Status dense(const DenseCall& c);
  // paths.wo_a_f16 takes this FP8 grouped weight for a call of n rows (gemv_fp8_staged's conditions).
  bool staged_wo_a(const DeviceMatrix& w, int64_t n, int64_t groups, int64_t out, int64_t in) const;
  Status mhc(const void* args_ptr, const Rows& r);
  Status site_norm(void* args_ptr, const Rows& r, const DeviceVector& weight);  // mhc + the site's input norm
  // paths.mhc_split: the coefficients of a site on the coefficient stream (after the critical kernels),
  // and the wait for them before anything reads their mix rows or writes the streams again.
  Status fork_coefficients(const void* args_ptr);
  Status join_coefficients();
  // paths.site_combine: the pending MoE combine for the site that reads y (and none left), or its launch.
  MhcYCombine take_combine();
  Status flush_combine();
  // Programmatic dependent launch for the next PDL-capable kernel on the current stream: decode only, not
  // while profiling (event nodes between stages), and not for the first kernel after a fork or join
  // (its predecessors are on two streams) or a cuBLASLt call.
  bool pdl();
  void pdl_barrier();  // the current stream's next kernel follows a fork / join / library call
  bool blas_rows(int64_t n) const { return tables_blas() && n >= options_.paths.blas_min_rows; }
  const MhcWorkspace& mhc_ws() const;
  bool tables_blas() const;
  Status mark(const char* stage, uint64_t weight_bytes = 0);
  Result<std::vector<StageTime>> collect_profile(double* total_us);
  // The stream the layer loop launches on (the aux stream inside a branch) and its split-K scratch.
  cudaStream_t cs() const { return cur_ ? cur_ : stream_.get(); }
  const SplitKWorkspace& splitk() const;
  bool branches(const Rows& r) const;
  GraphOptions graph_options() const { return GraphOptions{static_cast<int>(options_.paths.graph_carveout)}; }
  // main() on the model's stream while aux() runs on the second stream (fork / join events); serial when off.
  // main_critical: main() is the longer branch, so its first kernel may keep a programmatic edge
  // (paths.fork_pdl) and start ahead of the aux branch's.
  template <typename Main, typename Aux>
  Status parallel(bool on, Main&& main, Aux&& aux, bool main_critical = true);
  Status debug(const std::string& name, const Rows& r, const float* data, int64_t width);

  std::shared_ptr<const DeepseekV41Model> host_;  // never null
  CudaModelOptions options_;
  Stream stream_;
  DeviceWeights weights_;
  DeviceKvPool kv_;
  std::unique_ptr<Workspace> ws_;
  std::unique_ptr<Tables> tables_;
  DeviceMemoryPlan memory_plan_;
  std::map<std::pair<int64_t, int64_t>, CudaGraph> decode_graphs_;  // by (batch, context bucket)
  std::map<std::pair<int64_t, int64_t>, bool> warmed_;              // ran once directly (attributes, heuristics)
  Profiler* profiler_ = nullptr;                                    // set during profile_decode_step
  TensorSink debug_sink_;
  cudaStream_t cur_ = nullptr;          // non-null inside a branch
  bool pdl_rows_ = false;               // the rows of the call in flight may use PDL (decode)
  bool pdl_fresh_[2] = {false, false};  // main / aux stream: the next kernel must not use PDL
  bool coef_pending_ = false;           // a site's coefficients run on the coefficient stream, not joined yet
  bool swa_commit_pending_ = false;     // a layer's ring commit runs on the aux stream, not joined yet
  MoeCombineArgs pending_combine_;      // paths.site_combine: the last MoE's combine, left to the next site
  std::vector<bool> engram_pending_;    // per Engram slot: its projection runs on the Engram stream, not joined
  int64_t engram_ahead_layers_ = 0;
  int64_t q_norm_kv_layers_ = 0;
  int64_t last_rows_ = 0;
  bool state_written_ = false;  // a step has written sequence state (KV rings / caches): errors poison it
};

// The device memory one CudaModel of this config needs besides its weights (KV pools, rings, tables,
// activation workspace), per component — load() checks it against the free memory before allocating.
Result<DeviceMemoryPlan> cuda_model_extra_plan(const ModelConfig& c, const LayerPlan& plan, const CudaModelOptions& o);

}  // namespace cedar::cuda
