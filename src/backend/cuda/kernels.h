// Host entry points of the CUDA decode kernels. Every pointer argument is DEVICE memory; every call is
// asynchronous on `stream` and returns the launch status (argument errors are reported before any
// launch). Numerics follow the CPU oracle (backend/cpu/ops.h, model/mhc.h); tests/backend/cuda/ checks
// each kernel against it. C++17 (included from .cu files).
//
// Activations are fp32 arrays holding bf16-exact values, as in the CPU backend.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace cedar::cuda {

// ---- RMSNorm ----------------------------------------------------------------------------------
// y[r] = bf16(weight ⊙ (x[r] · rsqrt(mean(x[r]²) + eps))) for `rows` rows of `dim`; weight may be null
// (unweighted). y may alias x.
// programmatic_launch (here and below): launched with programmatic stream serialization (PDL, see
// launch.h): the kernel may start while the previous one finishes and waits for it before reading
// its inputs; GEMVs prefetch their first weight lines into L2 before waiting. Same results.
Status rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* y,
                cudaStream_t stream, bool programmatic_launch = false);

// The FP8 block-32 codes of an activation [rows, width] as quantize_act_fp8 writes them (below): codes
// [rows, width], scales [rows, width / 32]. Kernels that produce an activation write them for the next
// GEMV with quantize_act_fp8's arithmetic (act_quant.cuh), so the bits are the same as that launch's.
struct ActQuantOut {
  uint16_t* codes = nullptr;
  float* scales = nullptr;
  bool on() const { return codes != nullptr; }
};
// rms_norm that also writes the codes + scales of y (the same y; dim % 32 == 0; codes and scales both
// set, or neither: plain rms_norm). One launch instead of rms_norm + quantize_act_fp8.
Status rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* y,
                cudaStream_t stream, bool programmatic_launch, const ActQuantOut& quant);

// ---- FP8 activation quantization (§3.1) --------------------------------------------------------
// Per token, per block of 32 channels: amax = max(|x|, 1e-4), s = 2^ceil(log2(amax/448)) (UE8M0),
// codes = e4m3_RNE(clamp(x/s, ±448)). x [n, in] (in % 32 == 0) → codes [n, in], each e4m3 code stored
// as its exact f16 value (bits; the GEMV's MMA operand), scales [n, in/32] (the power of two s as
// fp32). Bit-exact with cedar::quantize_act_block32.
Status quantize_act_fp8(const float* x, int64_t n, int64_t in, uint16_t* codes, float* scales, cudaStream_t stream,
                        bool programmatic_launch = false);

// ---- block-scaled GEMV / skinny GEMM ----------------------------------------------------------
// A linear layer's weight in device memory (logical [out, in], in % 32 == 0).
enum class QuantWeightFormat { FP8Block, MXFP4 };
struct QuantWeightView {
  QuantWeightFormat format = QuantWeightFormat::FP8Block;
  int64_t out = 0, in = 0;
  const uint8_t* data = nullptr;    // FP8Block: e4m3 [out, in]; MXFP4: packed e2m1 [out, in/2] (low nibble first)
  const uint8_t* scales = nullptr;  // FP8Block: ue8m0 [ceil(out/block_out), ceil(in/block_in)]; MXFP4: ue8m0 [out, in/32]
  int64_t block_out = 32, block_in = 32;  // FP8Block only; block_in % 32 == 0 (V4.1: 32×32; V4: 128×128)
};

// Split-K scratch: for weights with few row tiles (e.g. wq_a 1280×5120, the shared expert) the
// kernel splits K over several blocks so the whole GPU streams the weight; their sums meet here.
// Counters must be zero before the first call (the kernel re-arms them: graph-replayable). Without
// it (or when too small) the GEMV runs unsplit — same result, fewer blocks.
struct SplitKWorkspace {
  float* partials = nullptr;
  unsigned* counters = nullptr;
  int64_t partial_floats = 0, counter_count = 0;
};
struct SplitKSize {
  int64_t partial_floats = 0, counters = 0;  // zeros: this weight is never split
};
// For `count` matrices of w's shape launched together (gemv_quantized_grouped).
SplitKSize splitk_workspace_size(const QuantWeightView& w, int64_t count = 1);

// y[t, out] = Σ_kblocks (Σ q_a·q_w) · s_a · s_w for n tokens of quantized activations (quantize_act_fp8);
// bf16_output rounds y to bf16 (what the reference's linear() returns). Any n ≥ 1 (tiles of 8 tokens).
// Deterministic: split-K partials are added in a fixed order.
Status gemv_quantized(const QuantWeightView& w, const uint16_t* act_codes, const float* act_scales, int64_t n,
                      float* y, bool bf16_output, cudaStream_t stream, const SplitKWorkspace& splitk = {},
                      bool programmatic_launch = false);

// Several matrices of one shape and format in one launch (grid.z): e.g. the w1/w3 of a token's routed
// experts (12 × 2304×5120 MXFP4 for top-6), whose per-matrix launches would each pay the fixed
// latency of a small kernel. Item i computes y_i = W_i · act_i as gemv_quantized does; `shape` gives
// out, in, format and the FP8 block (its data/scales are ignored).
struct GemvGroupItem {
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
  const uint16_t* act_codes = nullptr;  // quantize_act_fp8 output (f16 values of e4m3 codes)
  const float* act_scales = nullptr;
  float* y = nullptr;
  // Elements between consecutive tokens' rows (0: contiguous [n, in] codes, [n, in/32] scales, [n, out]
  // y): an item may read a column slice of wider activation rows and write one of wider output rows
  // (wo_a's group g: columns [g·in, (g+1)·in) of [n, groups·in]). act_row_stride must be a multiple of 8;
  // none may be smaller than the row it spans. FP8 / plain MXFP4 only (not the packed layout).
  int64_t act_row_stride = 0, act_scale_row_stride = 0, y_row_stride = 0;
};
Status gemv_quantized_grouped(const QuantWeightView& shape, const GemvGroupItem* items, int64_t count, int64_t n,
                              bool bf16_output, cudaStream_t stream, const SplitKWorkspace& splitk = {},
                              bool programmatic_launch = false);

// Matrices of one format, `in` and FP8 block but different heights (`out`) that read the same kind of
// input, in one launch: e.g. wq_a [1280, 5120] and wkv [512, 5120] of the attention input (one fixed
// kernel latency instead of two). Item i: y_i [n, mats[i].out] = W_i · act_i, as gemv_quantized
// computes it (a split-K plan chosen for all row tiles together, so the bits may differ from separate
// calls by the K split, within the GEMV's summation bound). mats[i].data / scales are ignored (items').
SplitKSize splitk_workspace_size_multi(const QuantWeightView* mats, int64_t count);
Status gemv_quantized_multi(const QuantWeightView* mats, const GemvGroupItem* items, int64_t count, int64_t n,
                            bool bf16_output, cudaStream_t stream, const SplitKWorkspace& splitk = {},
                            bool programmatic_launch = false);

// Workspace for linear_quantized: codes [n·in] f16 + scales [n·in/32] floats (+ optional split-K).
struct ActWorkspace {
  uint16_t* codes = nullptr;
  float* scales = nullptr;
  int64_t capacity_values = 0;  // n·in the workspace can hold
  SplitKWorkspace splitk;
};
// quantize_act_fp8 + gemv_quantized: the FP8 / MXFP4 `linear()` of the reference (cpu::linear).
Status linear_quantized(const QuantWeightView& w, const float* x, int64_t n, const ActWorkspace& ws, float* y,
                        bool bf16_output, cudaStream_t stream, bool programmatic_launch = false);

// ---- bf16 activations through the FP8 GEMV: exact f16 staging (wo_a at decode) ---------------
// Per token, per block of 32 channels: v = bf16(x) (RNE, as gemv_bf16 rounds its input), amax = the
// largest finite |v|, J = ⌊log2 amax⌋ − 15 (0 for a zero block), codes = f16(v·2^−J) (bits),
// scales = 2^J (fp32) — the layout of quantize_act_fp8, so gemv_quantized takes it as is. Every
// |v| >= 2^(⌊log2 amax⌋−32) is staged exactly (f16_stage.h has the rule and the argument); smaller
// values round to the f16 subnormal grid; ±inf / NaN stay ±inf / NaN (as gemv_bf16 feeds them to its
// MMAs). x [n, in] (in % 32 == 0) → codes [n, in], scales [n, in/32].
Status stage_act_f16(const float* x, int64_t n, int64_t in, uint16_t* codes, float* scales, cudaStream_t stream,
                     bool programmatic_launch = false);

// y = W_g · x_g per group through stage_act_f16 + gemv_quantized_grouped: the reference's grouped bf16
// projection (wo_a: its FP8 weight dequantized to bf16 at load, bf16 activations, no activation
// quantization) up to the fp32 summation order — every product e4m3(w)·f16(v·2^−J) is exact, and the
// power-of-two scales s_w·2^J multiply each 32-block's sum exactly. Two launches; reads the FP8 weight
// as stored (half the bf16 bytes) with the FP8 GEMV's one-cvt-per-pair dequantization.
struct StagedGemvArgs {
  QuantWeightView w;  // FP8Block, the groups stacked: [groups·out, in]; (out = w.out / groups) % block_out == 0
  int64_t groups = 1;
  const float* x = nullptr;  // [n, groups·in]: group g reads columns [g·in, (g+1)·in)
  float* y = nullptr;        // [n, groups·out]: group g writes columns [g·out, (g+1)·out)
  int64_t n = 1;             // tokens (0: nothing to do; tiles of 8 re-read the weight)
  bool bf16_output = true;
  uint16_t* codes = nullptr;  // workspace: n·groups·in f16 codes
  float* scales = nullptr;    // n·groups·in/32 floats
  int64_t capacity_values = 0;
  bool programmatic_launch = false;  // both launches
  // codes / scales already hold stage_act_f16(x) (written by x's producer, e.g. the attention's merge:
  // SparseAttnArgs::out_f16_codes): the GEMV launch only.
  bool codes_staged = false;
};
Status gemv_fp8_staged(const StagedGemvArgs& a, cudaStream_t stream, const SplitKWorkspace& splitk = {});

// ---- fused single-pass mHC (§3.3) -------------------------------------------------------------
// One kernel per mHC site and step, for n tokens with hc = 4 streams of width d (d % 32 == 0):
//   1. X_new = expand(y, X, post, comb)      (skipped when y is null: X_new = X)
//   2. collapsed = collapse(X_new, collapse_w) (skipped when collapse_w is null)
//   3. mix_out = H(X_new; fn, base, scale)    (coefficients + Sinkhorn of the next site; skipped when
//                                              fn is null: the final collapse, the expand before Engram)
// i.e. the expand of one sublayer, the input of the next sublayer (single pass: it uses the previous
// site's pre) and the next site's coefficients, in one pass over the streams and fn. Expand and
// collapse reproduce model/mhc.h bit-exactly (same products and sums in the same order, no FMA
// contraction); H sums in a different (blocked, deterministic) order.
//
// Decode can take H off the critical path: call it once with fn = null (expand + collapse: the
// sublayer's input is ready after one short kernel) and once with y = collapse_w = null (H only) on a
// forked graph branch that joins before the next site — H then overlaps the sublayer.
// The sublayer output y of an mHC site still to be combined from the MoE's rows (moe_combine's inputs; y
// points to `y`, where the combine is stored).
struct MhcYCombine {
  const int32_t* experts = nullptr;  // [n, topk]
  const float* routed = nullptr;     // [n·topk, d]
  const float* shared = nullptr;     // [n, d] or null
  int64_t topk = 0;
  float* y = nullptr;  // [n, d]
  bool on() const { return routed != nullptr; }
};
constexpr int64_t kMhcCombineMaxTopk = 8;  // the site kernel's combine holds a channel's routed values in registers
struct MhcFusedArgs {
  int64_t n = 1, hc = 4, d = 0;
  const float* X = nullptr;           // [n, hc, d]
  const float* y = nullptr;           // [n, d] sublayer output, or null
  const float* post = nullptr;        // [n, hc]   of the site that produced y
  const float* comb = nullptr;        // [n, hc*hc] comb[j*hc + k]: stream j → stream k
  float* X_out = nullptr;             // [n, hc, d] (may alias X)
  const float* collapse_w = nullptr;  // [n, hc] or null
  float* collapsed = nullptr;         // [n, d]
  const float* fn = nullptr;          // [(2+hc)*hc, hc*d], or null (no coefficients)
  const float* base = nullptr;        // [(2+hc)*hc]
  const float* scale = nullptr;       // [3]
  int64_t sinkhorn_iters = 20;
  float hc_eps = 1e-6f, norm_eps = 1e-20f;
  float* mix_out = nullptr;           // [n, 2hc + hc*hc]: pre[hc], post[hc], comb[hc*hc]
  // Row strides in floats between consecutive tokens (0: packed, i.e. hc, hc*hc, hc, (2+hc)*hc).
  // post / comb / collapse_w may point into the previous site's mix_out rows (collapse_w = mix,
  // post = mix + hc, comb = mix + 2hc, all with stride (2+hc)*hc): no copies between sites.
  int64_t post_stride = 0, comb_stride = 0, collapse_w_stride = 0, mix_stride = 0;
  // Launch with programmatic stream serialization (PDL): the kernel starts and streams fn while the
  // previous kernel finishes, and waits for it (griddepcontrol.wait) before reading X, y or the
  // coefficients. Inside a graph this becomes a programmatic edge.
  bool programmatic_launch = false;
  // Optional: normed = rms_norm(collapsed, n, d, norm_weight, normed_eps) (the next sublayer's input
  // norm, rms_norm's bits). Up to kMhcNormFuseMaxTokens rows it is computed in the same launch: by the
  // decode kernel's last block, or with fn = null (expand / collapse only) by the expand + collapse +
  // norm kernel when the workspace has its norm_counter; otherwise mhc_fused launches rms_norm after.
  const float* norm_weight = nullptr;  // [d] or null (unweighted)
  float* normed = nullptr;             // [n, d] or null
  float normed_eps = 1e-6f;
  // The session-3 decode kernel (coefficients by one thread per token, no fused norm): for the parity
  // test and the bench rows only.
  bool legacy_decode = false;
  // The session-4 streaming kernel (the 24 dot products with CUDA-core FMAs instead of 3xTF32 MMAs):
  // for the parity test and the bench rows only.
  bool legacy_stream = false;
  // The s6 streaming kernel (mhc_stream_tc_kernel: 64-token tiles, 32-channel chunks) instead of the
  // s8 one (mhc_stream_c64_kernel: 32-token tiles, 64-channel chunks); the c64 kernel also needs d % 64
  // == 0, fn 16-byte and X_out / collapsed 8-byte aligned, else the c32 kernel runs. A/B and parity only.
  bool stream_c32 = false;
  // The s6 finish kernel (one thread per token, a warp each, __frcp_rn) instead of one lane per token
  // (the same bits). Today's (s6) streaming path is stream_c32 + stream_serial_finish. A/B only.
  bool stream_serial_finish = false;
  // The streaming kernel's target block count (0: the default plan's, 4 or 6 per SM); bench sweeps only.
  int64_t stream_blocks = 0;
  // Optional with normed: its FP8 codes + scales for the next GEMVs, written by whichever kernel writes
  // normed (the decode kernel's last block, the expand + collapse + norm kernel, or rms_norm after) —
  // quantize_act_fp8(normed)'s bits. (Last: the other fields keep their parameter offsets.)
  ActQuantOut normed_quant = {};
  // Optional with y: y is the MoE's output still to be combined (y_combine.y == y). The expand + collapse +
  // norm kernel (topk <= 8) combines each channel as it reads it — moe_combine's bits — and stores it to y;
  // every other launch runs moe_combine first.
  MhcYCombine y_combine = {};
  // With fn = null and normed (the critical half of a split site, up to kMhcNormFuseMaxTokens rows): one
  // thread-block cluster per launch instead of the ticket kernel — every block computes the row's sum of
  // squares from the others' shared memory, then normalizes (and quantizes) its own channels. The same bits;
  // shapes it does not fit (mhc_site_cluster.cu) take the ticket kernel.
  bool site_cluster = false;
  // The decode kernel of a one-row launch with one token's registers per thread instead of a tile's (the same
  // arithmetic and bits; fewer registers, so more of an SM for the kernels beside it). CudaKernelPaths::
  // mhc_one_token.
  bool decode_one_token = false;
};
// Device scratch of the cross-block reduction; counters must be zero before the first call (the
// kernels reset them, so the same workspace can be replayed in a CUDA graph).
//   legacy (partial_floats == 0): `partials` holds the old contract's min(n, 8)·25·(d/32) floats and
//     one counter; token tiles of 8 run one launch after another.
//   sized (partial_floats = mhc_workspace_floats(n, d), counter_count = mhc_workspace_counters(n)):
//     every tile of a decode batch in one launch, and n >= kMhcStreamMinTokens on the streaming
//     (prefill) path.
//   norm_counter (kMhcNormCounters, zero before the first call): the ticket of the fn = null kernel that
//     also computes `normed` (one launch instead of expand / collapse + rms_norm). Its own counter: the
//     coefficient half of a split site may use `counter` on another stream at the same time. Null: the
//     two launches.
struct MhcWorkspace {
  float* partials = nullptr;
  unsigned* counter = nullptr;
  int64_t partial_floats = 0;
  int64_t counter_count = 1;
  unsigned* norm_counter = nullptr;
};
constexpr int64_t kMhcStreamMinTokens = 128;
constexpr int64_t kMhcNormFuseMaxTokens = 4;
constexpr int64_t kMhcNormCounters = 1;
int64_t mhc_workspace_floats(int64_t n, int64_t d);
// Whether the cluster site kernel (MhcFusedArgs::site_cluster) takes n rows of width d: n <= kMhcNormFuseMaxTokens,
// d a multiple of 256, n·max(256, d / 8) <= 1024 threads (d = 5120: one row; the small profile's 512: up to 4).
bool mhc_site_cluster_fits(int64_t n, int64_t d);
int64_t mhc_workspace_counters(int64_t n);
Status mhc_fused(const MhcFusedArgs& a, const MhcWorkspace& ws, cudaStream_t stream);
// a.y_combine's moe_combine into y, and a.y_combine cleared (nothing to do without one): for the paths that
// read y as given.
Status mhc_combine_y(MhcFusedArgs& a, cudaStream_t stream);

// ---- device copy bandwidth (the roofline reference) --------------------------------------------
struct CopyBandwidth {
  size_t bytes = 0;          // size of the copied buffer
  double memcpy_gbps = 0;    // cudaMemcpyAsync D2D, (read + write) bytes / s / 1e9
  double kernel_gbps = 0;    // a vectorized grid-stride copy kernel, same accounting
};
Result<CopyBandwidth> measure_copy_bandwidth(size_t bytes, int iterations);
// Mean time of one empty kernel node in a CUDA graph of `nodes` nodes (µs): the floor every small
// decode kernel pays even inside a graph.
Result<double> measure_launch_floor_us(int nodes, int replays);

// ---- catalog -----------------------------------------------------------------------------------
struct KernelInfo {
  std::string name;
  std::string what;
};
std::vector<KernelInfo> kernel_catalog();
// Checks that every catalogued kernel has code loadable on the current device (fails, naming the
// kernel, when the binary lacks code for its compute capability).
Status check_kernels_loadable();

}  // namespace cedar::cuda
