// CSA2 indexer on the device (attention_kernels.h): queries (RoPE + FP4 QDQ + head weights), scores
// over the visible / candidate entries (tensor-core q·k on the e2m1 codes), candidate blocks and the
// exact top-k selection.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/attention_math.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/gemv_common.cuh"

namespace cedar::cuda {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

constexpr int kMaxHeads = 64;
constexpr int64_t kMaxHeadDim = 512;

// ---- queries ---------------------------------------------------------------------------------------

constexpr int kQueryThreads = 256;

// One block per row; thread k handles channel pairs k, k + 256, ... of the row's heads·head_dim values
// (a 32-block of one head is 16 consecutive pairs: a half warp).
__global__ void __launch_bounds__(kQueryThreads) indexer_queries_kernel(IndexQueryArgs a, float w_scale) {
  const int64_t row = blockIdx.x, hd = a.head_dim, width = a.heads * hd;
  const int64_t pos = a.tokens[row].pos;
  const int64_t rope_start = hd - a.rope.rope_dim;
  const float* qi = a.qi + row * width;
  for (int64_t base = 0; base < width / 2; base += kQueryThreads) {
    const int64_t pr = base + threadIdx.x;
    const bool valid = pr < width / 2;
    const int64_t c = 2 * pr, ch = c % hd;  // channel within the head
    float e = 0.0f, o = 0.0f;
    if (valid) {
      e = qi[c];
      o = qi[c + 1];
      if (ch >= rope_start) detail::rope_pair(a.rope, pos, (ch - rope_start) / 2, false, e, o);
    }
    const bool finite = detail::half_warp_all(isfinite(e) && isfinite(o));
    const float amax = detail::half_warp_max(fmaxf(fabsf(e), fabsf(o)));
    const uint32_t sb = finite ? detail::fp4_b32_scale_byte(amax) : 0xFFu;
    const float s = detail::ue8m0_to_float(sb);
    const uint32_t ce = finite ? detail::fp4_encode(e, s) : 0u;
    const uint32_t co = finite ? detail::fp4_encode(o, s) : 0u;
    if (valid) {
      const float ve = detail::e2m1_to_f32(ce), vo = detail::e2m1_to_f32(co);
      if (a.q != nullptr) {
        a.q[row * width + c] = __fmul_rn(ve, s);
        a.q[row * width + c + 1] = __fmul_rn(vo, s);
      }
      const uint32_t h2 = static_cast<uint32_t>(__half_as_ushort(__float2half_rn(ve))) |
                          (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(vo))) << 16);
      *reinterpret_cast<uint32_t*>(a.q_codes + row * width + c) = h2;
      if ((threadIdx.x & 15) == 0) a.q_scales[row * (width / 32) + c / 32] = s;
    }
  }
  for (int64_t h = threadIdx.x; h < a.heads; h += kQueryThreads) {
    const float v = a.w_raw[row * a.heads + h];
    a.w[row * a.heads + h] = a.reference_precision ? detail::round_bf16(__fmul_rn(v, w_scale)) : __fmul_rn(v, w_scale);
  }
}

// ---- scores --------------------------------------------------------------------------------------------

constexpr int kScoreWarps = 4;
constexpr int kScoreThreads = kScoreWarps * 32;
constexpr int kTileKeys = kScoreWarps * 32;  // one n-tile column of 8 keys per thread group, 32 keys per warp

// The f16 HMMA and the exact e4m3 / e2m1 conversions of the decode GEMVs.
using gemv_detail::e2m1x4_to_e4m3x4;
using gemv_detail::e4m3x2_to_f16x2;
using gemv_detail::e4m3x2_hi_to_f16x2;
using gemv_detail::mma_f16;


__device__ __forceinline__ int64_t visible_entries(const AttnToken& tk, int64_t ratio) {
  return tk.pos < 0 ? 0 : (tk.pos + 1) / ratio;
}

// Entry id of slot s of a row (−1: none), see IndexerScoreArgs.
__device__ __forceinline__ int64_t slot_entry(int64_t s, int64_t visible, const int32_t* blocks, int64_t bs) {
  if (blocks == nullptr) return s < visible ? s : -1;
  const int32_t b = blocks[s / bs];
  if (b < 0) return -1;
  const int64_t id = static_cast<int64_t>(b) * bs + s % bs;
  return id < visible ? id : -1;
}

// Block (tile, row): slots [128·tile, +128) of the row. The tile's key records are staged in shared
// memory; warp w computes the q·k dots of its 32 keys for all heads (m-tiles of 16 heads), per
// 32-channel block two m16n8k16 f16 MMAs on the codes (thread (g, t) holds channels 8t..8t+7 of the
// block: the gemv.cu permutation), scaled by 64·s_q·s_k and added in block order; then one thread
// per key runs the CPU's head loop.
__global__ void __launch_bounds__(kScoreThreads)
    indexer_scores_kernel(IndexerScoreArgs a, int64_t rb_pad, int heads_pad) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int64_t row = blockIdx.y, slot0 = static_cast<int64_t>(blockIdx.x) * kTileKeys;
  const AttnToken tk = a.tokens[row];
  const int64_t visible = visible_entries(tk, a.ratio);
  const bool restricted = a.candidate_blocks != nullptr;
  const int64_t slots = restricted ? a.candidate_topk_blocks * a.candidate_block_size : visible;
  if (slot0 >= slots) return;
  const int64_t hd = a.head_dim, nb = hd / 32, rb = index_key_record_bytes(hd);
  const int dstride = heads_pad + 1;  // odd: the per-key head loop reads without bank conflicts
  uint8_t* rec = smem;
  float* dots = reinterpret_cast<float*>(smem + kTileKeys * rb_pad);
  int64_t* ids = reinterpret_cast<int64_t*>(dots + kTileKeys * dstride);
  const PagedRecords stream = a.seqs[tk.seq].index_k;
  const int32_t* blocks = restricted ? a.candidate_blocks + row * a.candidate_topk_blocks : nullptr;

  // Record pointers resolved once per key (one block-table read each), then the words loaded kStageBatch
  // per thread before any is stored: the staging costs ~2 dependent round trips instead of two per word
  // iteration (17 iterations at head_dim 128). Same bytes staged.
  __shared__ const uint8_t* kptr[kTileKeys];
  const int tid = threadIdx.x;
  {
    const int64_t s = slot0 + tid;
    const int64_t id = s < slots ? slot_entry(s, visible, blocks, a.candidate_block_size) : -1;
    ids[tid] = id;
    kptr[tid] = id >= 0 ? detail::record_ptr(stream, id) : nullptr;
  }
  __syncthreads();
  // Stage the records (zeros for slots without an entry).
  if (rb % 4 == 0) {
    constexpr int kStageBatch = 8;
    const int64_t words = rb / 4, total = kTileKeys * words;
    for (int64_t i0 = tid; i0 < total; i0 += kStageBatch * kScoreThreads) {
      uint32_t v[kStageBatch];
#pragma unroll
      for (int k = 0; k < kStageBatch; ++k) {
        const int64_t i = i0 + k * kScoreThreads;
        v[k] = 0u;
        if (i < total) {
          const uint8_t* r = kptr[i / words];
          if (r != nullptr) v[k] = __ldg(reinterpret_cast<const uint32_t*>(r) + i % words);
        }
      }
#pragma unroll
      for (int k = 0; k < kStageBatch; ++k) {
        const int64_t i = i0 + k * kScoreThreads;
        if (i < total) reinterpret_cast<uint32_t*>(rec + (i / words) * rb_pad)[i % words] = v[k];
      }
    }
  } else {
    for (int64_t i = tid; i < kTileKeys * rb; i += kScoreThreads) {
      const int64_t key = i / rb, bi = i % rb, id = ids[key];
      rec[key * rb_pad + bi] = id >= 0 ? detail::record_ptr(stream, id)[bi] : uint8_t{0};
    }
  }
  __syncthreads();

  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int key_base = warp * 32;
  const uint16_t* qrow = a.q_codes + row * a.heads * hd;
  const float* srow = a.q_scales + row * a.heads * nb;
  for (int mt = 0; mt * 16 < a.heads; ++mt) {
    const int h_lo = mt * 16 + g, h_hi = h_lo + 8;
    const bool lo_ok = h_lo < a.heads, hi_ok = h_hi < a.heads;
    float acc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    // The query fragments of kQBatch channel blocks are loaded before their MMAs (one round trip per
    // kQBatch blocks instead of per block); the accumulation order is unchanged.
    constexpr int kQBatch = 4;
    for (int64_t b0 = 0; b0 < nb; b0 += kQBatch) {
      const uint4 zero = make_uint4(0, 0, 0, 0);
      uint4 ql[kQBatch], qh[kQBatch];
      float sl[kQBatch], sh[kQBatch];
#pragma unroll
      for (int k = 0; k < kQBatch; ++k) {
        const int64_t b = b0 + k;
        const bool in = b < nb;
        ql[k] = in && lo_ok ? __ldg(reinterpret_cast<const uint4*>(qrow + h_lo * hd + 32 * b + 8 * t)) : zero;
        qh[k] = in && hi_ok ? __ldg(reinterpret_cast<const uint4*>(qrow + h_hi * hd + 32 * b + 8 * t)) : zero;
        sl[k] = in && lo_ok ? __ldg(srow + h_lo * nb + b) : 0.0f;
        sh[k] = in && hi_ok ? __ldg(srow + h_hi * nb + b) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kQBatch; ++k) {
        const int64_t b = b0 + k;
        if (b >= nb) break;
        const uint4 qa_lo = ql[k], qa_hi = qh[k];
        const float sq_lo = sl[k], sq_hi = sh[k];
        const uint32_t a1[4] = {qa_lo.x, qa_hi.x, qa_lo.y, qa_hi.y};
        const uint32_t a2[4] = {qa_lo.z, qa_hi.z, qa_lo.w, qa_hi.w};
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int kg = key_base + nt * 8 + g;      // key of this thread's B column
          const int kc = key_base + nt * 8 + 2 * t;  // keys of this thread's accumulator columns
          const uint32_t w = *reinterpret_cast<const uint32_t*>(rec + kg * rb_pad + 16 * b + 4 * t);
          const uint32_t even = e2m1x4_to_e4m3x4(w & 0x0F0F0F0Fu), odd = e2m1x4_to_e4m3x4((w >> 4) & 0x0F0F0F0Fu);
          const uint32_t w0 = __byte_perm(even, odd, 0x5140), w1 = __byte_perm(even, odd, 0x7362);
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma_f16(a1, e4m3x2_to_f16x2(w0), e4m3x2_hi_to_f16x2(w0), d);
          mma_f16(a2, e4m3x2_to_f16x2(w1), e4m3x2_hi_to_f16x2(w1), d);
          const float sk0 = detail::ue8m0_to_float(rec[kc * rb_pad + hd / 2 + b]);
          const float sk1 = detail::ue8m0_to_float(rec[(kc + 1) * rb_pad + hd / 2 + b]);
          // d = 2^-6·Σ q_code·k_code exactly; the scales are powers of two.
          acc[nt][0] = __fadd_rn(acc[nt][0], __fmul_rn(d[0], __fmul_rn(64.0f * sq_lo, sk0)));
          acc[nt][1] = __fadd_rn(acc[nt][1], __fmul_rn(d[1], __fmul_rn(64.0f * sq_lo, sk1)));
          acc[nt][2] = __fadd_rn(acc[nt][2], __fmul_rn(d[2], __fmul_rn(64.0f * sq_hi, sk0)));
          acc[nt][3] = __fadd_rn(acc[nt][3], __fmul_rn(d[3], __fmul_rn(64.0f * sq_hi, sk1)));
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int kc = key_base + nt * 8 + 2 * t;
      dots[kc * dstride + h_lo] = acc[nt][0];
      dots[(kc + 1) * dstride + h_lo] = acc[nt][1];
      dots[kc * dstride + h_hi] = acc[nt][2];
      dots[(kc + 1) * dstride + h_hi] = acc[nt][3];
    }
  }
  __syncthreads();
  const int64_t s = slot0 + tid;
  if (s >= slots) return;
  float score = -INFINITY;
  if (ids[tid] >= 0) {
    const float* wr = a.w + row * a.heads;
    const float* dk = dots + tid * dstride;
    float acc = 0.0f;
    for (int h = 0; h < a.heads; ++h) {
      const float dot = dk[h];
      if (a.reference_precision) {  // bf16 einsum output, ReLU, product with w, head sum (index_score)
        const float rb16 = detail::round_bf16(dot);
        const float relu = rb16 < 0.0f ? 0.0f : rb16;  // std::max(x, 0.0f)
        acc = __fadd_rn(acc, detail::round_bf16(__fmul_rn(relu, wr[h])));
      } else {
        const float relu = dot < 0.0f ? 0.0f : dot;
        acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(relu, a.relu_scale), wr[h]));
      }
    }
    score = a.reference_precision ? detail::round_bf16(acc) : acc;
  }
  a.scores[row * a.max_slots + s] = score;
}

// ---- selection ---------------------------------------------------------------------------------------

constexpr int kSelThreads = 512;
constexpr int kSelWarps = kSelThreads / 32;
constexpr int kSelItems = 8;        // consecutive positions per thread in the compaction
constexpr int64_t kSegment = 8192;  // values per stage-1 block

struct SelectShared {
  unsigned hist[256];
  unsigned warp_tot[kSelWarps];
  unsigned bcast[2];
};

__device__ __forceinline__ bool sel_valid(float v) { return v > -INFINITY; }  // false for NaN
// Order-preserving key (larger value → larger key; −0 and +0 equal).
__device__ __forceinline__ uint32_t order_key(float v) {
  uint32_t b = __float_as_uint(v);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive block scan of one value per thread; returns the exclusive prefix, total via `total`.
__device__ unsigned block_exclusive_scan(unsigned v, unsigned& total, SelectShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned n = __shfl_up_sync(detail::kFullMask, inc, o);
    if (lane >= o) inc += n;
  }
  if (lane == 31) sh.warp_tot[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    unsigned wt = lane < kSelWarps ? sh.warp_tot[lane] : 0u;
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned n = __shfl_up_sync(detail::kFullMask, wt, o);
      if (lane >= o) wt += n;
    }
    if (lane < kSelWarps) sh.warp_tot[lane] = wt;  // inclusive over warps
  }
  __syncthreads();
  const unsigned before = (warp > 0 ? sh.warp_tot[warp - 1] : 0u) + inc - v;
  total = sh.warp_tot[kSelWarps - 1];
  __syncthreads();  // warp_tot is reused by the next scan
  return before;
}

// Selects, among positions [0, count) with val(i) > −inf, the `k` best (value descending, position
// ascending on ties) and writes them ascending to out_pos[0, keep); returns keep (all threads).
template <class F>
__device__ int block_select(const F& val, int64_t count, int64_t k, SelectShared& sh, int32_t* out_pos,
                            bool per_value_atomics) {
  unsigned local = 0;
  for (int64_t i = threadIdx.x; i < count; i += kSelThreads) local += sel_valid(val(i));
  unsigned valid = 0;
  (void)block_exclusive_scan(local, valid, sh);
  const int64_t keep = k < static_cast<int64_t>(valid) ? k : static_cast<int64_t>(valid);
  if (keep <= 0) return 0;
  const bool take_all = keep == static_cast<int64_t>(valid);
  uint32_t thr = 0;   // the keep-th best key
  unsigned need = 0;  // how many entries equal to thr are taken
  if (!take_all) {
    uint32_t prefix = 0;
    need = static_cast<unsigned>(keep);
    for (int shift = 24; shift >= 0; shift -= 8) {
      const uint32_t mask_hi = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
      for (int i = threadIdx.x; i < 256; i += kSelThreads) sh.hist[i] = 0;
      __syncthreads();
      if (per_value_atomics) {  // the first histogram (bench comparison): one shared atomic per value
        for (int64_t i = threadIdx.x; i < count; i += kSelThreads) {
          const float v = val(i);
          if (!sel_valid(v)) continue;
          const uint32_t u = order_key(v);
          if ((u & mask_hi) == prefix) atomicAdd(&sh.hist[(u >> shift) & 255u], 1u);
        }
      } else {
        // Warp-aggregated counts: the scores of a row share their sign and exponent, so in the first
        // pass nearly every value lands in one or two bins, and one shared atomic per value serialized
        // ~count increments on one address (the select's largest cost). Lanes of equal bin add their
        // count once (the loop is block-uniform, so the whole warp takes part in the match). Integer
        // counts: the histogram, hence the selection, is unchanged.
        for (int64_t i0 = 0; i0 < count; i0 += kSelThreads) {
          const int64_t i = i0 + threadIdx.x;
          uint32_t bin = 256u;  // none
          if (i < count) {
            const float v = val(i);
            if (sel_valid(v)) {
              const uint32_t u = order_key(v);
              if ((u & mask_hi) == prefix) bin = (u >> shift) & 255u;
            }
          }
          const unsigned peers = __match_any_sync(detail::kFullMask, bin);
          if (bin < 256u && static_cast<int>(threadIdx.x & 31) == __ffs(peers) - 1)
            atomicAdd(&sh.hist[bin], __popc(peers));
        }
      }
      __syncthreads();
      if (threadIdx.x < 32) {
        // Lane L owns bins 255−8L .. 248−8L (descending); find the bin where the count from the top
        // reaches `need`.
        const int lane = threadIdx.x;
        unsigned lsum = 0;
        for (int q = 0; q < 8; ++q) lsum += sh.hist[255 - 8 * lane - q];
        unsigned inc = lsum;
        for (int o = 1; o < 32; o <<= 1) {
          const unsigned n = __shfl_up_sync(detail::kFullMask, inc, o);
          if (lane >= o) inc += n;
        }
        const unsigned before = inc - lsum;
        if (before < need && need <= inc) {
          unsigned c = before;
          for (int q = 0; q < 8; ++q) {
            const int bin = 255 - 8 * lane - q;
            if (c + sh.hist[bin] >= need) {
              sh.bcast[0] = static_cast<unsigned>(bin);
              sh.bcast[1] = need - c;
              break;
            }
            c += sh.hist[bin];
          }
        }
      }
      __syncthreads();
      prefix |= sh.bcast[0] << shift;
      need = sh.bcast[1];
      __syncthreads();
    }
    thr = prefix;
  }
  // Ordered compaction: tiles of kSelThreads·kSelItems consecutive positions.
  unsigned eq_seen = 0, written = 0;
  for (int64_t tile = 0; tile < count; tile += int64_t{kSelThreads} * kSelItems) {
    const int64_t p0 = tile + static_cast<int64_t>(threadIdx.x) * kSelItems;
    uint32_t gt_bits = 0, eq_bits = 0;
    unsigned n_eq = 0;
#pragma unroll
    for (int it = 0; it < kSelItems; ++it) {
      const int64_t p = p0 + it;
      if (p >= count) break;
      const float v = val(p);
      if (!sel_valid(v)) continue;
      const uint32_t u = order_key(v);
      if (take_all || u > thr)
        gt_bits |= 1u << it;
      else if (u == thr) {
        eq_bits |= 1u << it;
        ++n_eq;
      }
    }
    unsigned eq_total = 0;
    unsigned eq_before = eq_seen + block_exclusive_scan(n_eq, eq_total, sh);
    uint32_t sel_bits = gt_bits;
#pragma unroll
    for (int it = 0; it < kSelItems; ++it)
      if (eq_bits & (1u << it)) {
        if (eq_before < need) sel_bits |= 1u << it;
        ++eq_before;
      }
    unsigned sel_total = 0;
    unsigned out = written + block_exclusive_scan(__popc(sel_bits), sel_total, sh);
#pragma unroll
    for (int it = 0; it < kSelItems; ++it)
      if (sel_bits & (1u << it)) out_pos[out++] = static_cast<int32_t>(p0 + it);
    eq_seen += eq_total;
    written += sel_total;
  }
  return static_cast<int>(keep);
}

enum class SelectKind { TopK, Blocks };

struct SelectParams {
  SelectKind kind;
  int64_t ratio;
  const AttnToken* tokens;
  const float* values;  // scores [n, stride] or block maxima [n, stride]
  int64_t stride;
  const int32_t* candidate_blocks;  // TopK of restricted rows: slot → entry
  int64_t ctopk, bs;
  int64_t k;
  int32_t* out;     // [n, k]
  float* cand_val;  // [n, segs_max, k]
  int32_t* cand_pos;
  int64_t segs_max;
  bool per_value_atomics;
};

__device__ __forceinline__ int64_t select_count(const SelectParams& p, const AttnToken& tk) {
  const int64_t v = visible_entries(tk, p.ratio);
  if (p.kind == SelectKind::Blocks) return (v + p.bs - 1) / p.bs;
  return p.candidate_blocks != nullptr ? p.ctopk * p.bs : v;
}
__device__ __forceinline__ int32_t select_map(const SelectParams& p, int64_t row, const AttnToken& tk, int64_t pos) {
  if (p.kind == SelectKind::Blocks || p.candidate_blocks == nullptr) return static_cast<int32_t>(pos);
  return static_cast<int32_t>(slot_entry(pos, visible_entries(tk, p.ratio), p.candidate_blocks + row * p.ctopk, p.bs));
}

// Stage 1: block (segment, row) selects within its segment; a row of one segment writes its result.
__global__ void __launch_bounds__(kSelThreads) select_stage1_kernel(SelectParams p) {
  __shared__ SelectShared sh;
  extern __shared__ int32_t chosen[];  // [k]
  const int64_t row = blockIdx.y, seg = blockIdx.x;
  const AttnToken tk = p.tokens[row];
  const int64_t count = select_count(p, tk);
  const int64_t segs = count > kSegment ? (count + kSegment - 1) / kSegment : 1;
  if (seg >= segs) return;
  const int64_t base = seg * kSegment;
  const int64_t n = count - base < 0 ? 0 : (count - base < kSegment ? count - base : kSegment);
  const float* vals = p.values + row * p.stride + base;
  const int keep = block_select([&](int64_t i) { return __ldg(vals + i); }, n, p.k, sh, chosen, p.per_value_atomics);
  __syncthreads();
  if (segs == 1) {
    int32_t* out = p.out + row * p.k;
    for (int64_t i = threadIdx.x; i < p.k; i += kSelThreads) out[i] = i < keep ? select_map(p, row, tk, chosen[i]) : -1;
  } else {
    float* cv = p.cand_val + (row * p.segs_max + seg) * p.k;
    int32_t* cp = p.cand_pos + (row * p.segs_max + seg) * p.k;
    for (int64_t i = threadIdx.x; i < p.k; i += kSelThreads) {
      cv[i] = i < keep ? vals[chosen[i]] : -INFINITY;
      cp[i] = i < keep ? static_cast<int32_t>(base + chosen[i]) : -1;
    }
  }
}

// Stage 2: rows of several segments select among the segments' winners (in position order).
__global__ void __launch_bounds__(kSelThreads) select_stage2_kernel(SelectParams p) {
  __shared__ SelectShared sh;
  extern __shared__ int32_t chosen[];
  const int64_t row = blockIdx.x;
  const AttnToken tk = p.tokens[row];
  const int64_t count = select_count(p, tk);
  const int64_t segs = (count + kSegment - 1) / kSegment;
  if (segs <= 1) return;
  const float* cv = p.cand_val + row * p.segs_max * p.k;
  const int32_t* cp = p.cand_pos + row * p.segs_max * p.k;
  const int keep =
      block_select([&](int64_t i) { return __ldcg(cv + i); }, segs * p.k, p.k, sh, chosen, p.per_value_atomics);
  __syncthreads();
  int32_t* out = p.out + row * p.k;
  for (int64_t i = threadIdx.x; i < p.k; i += kSelThreads)
    out[i] = i < keep ? select_map(p, row, tk, cp[chosen[i]]) : -1;
}

// Block maxima of the full-scan scores (std::max order: NaN entries are ignored), the newest visible
// block pinned at +inf.
__global__ void block_max_kernel(const float* scores, int64_t stride, const AttnToken* tokens, int64_t ratio,
                                 int64_t bs, float* bmax, int64_t bstride) {
  const int64_t row = blockIdx.y, b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t v = visible_entries(tokens[row], ratio), nb = (v + bs - 1) / bs;
  if (b >= nb) return;
  float m = -INFINITY;
  const float* s = scores + row * stride;
  const int64_t end = v < (b + 1) * bs ? v : (b + 1) * bs;
  for (int64_t j = b * bs; j < end; ++j) m = m < s[j] ? s[j] : m;
  bmax[row * bstride + b] = b == (v - 1) / bs ? INFINITY : m;
}

int64_t segments(int64_t count) { return std::max<int64_t>(1, (count + kSegment - 1) / kSegment); }
int64_t align256(int64_t b) { return (b + 255) / 256 * 256; }

struct SelectLayout {
  int64_t nb_max, segs_topk, segs_blocks;
  int64_t off_bmax, off_cv_topk, off_cp_topk, off_cv_blocks, off_cp_blocks, total;
};
SelectLayout select_layout(int64_t n, int64_t max_slots, int64_t topk, int64_t ctopk, int64_t bs) {
  SelectLayout l{};
  l.nb_max = (ctopk > 0 && bs > 0) ? (max_slots + bs - 1) / bs : 0;
  l.segs_topk = segments(max_slots);
  l.segs_blocks = l.nb_max > 0 ? segments(l.nb_max) : 0;
  int64_t off = 0;
  l.off_bmax = off;
  off += align256(n * l.nb_max * 4);
  const int64_t ct = l.segs_topk > 1 ? n * l.segs_topk * topk : 0;
  l.off_cv_topk = off;
  off += align256(ct * 4);
  l.off_cp_topk = off;
  off += align256(ct * 4);
  const int64_t cb = l.segs_blocks > 1 ? n * l.segs_blocks * ctopk : 0;
  l.off_cv_blocks = off;
  off += align256(cb * 4);
  l.off_cp_blocks = off;
  off += align256(cb * 4);
  l.total = off;
  return l;
}

Status launch_select(const SelectParams& p, int64_t n, int64_t segs, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(p.k) * sizeof(int32_t);
  select_stage1_kernel<<<dim3(static_cast<unsigned>(segs), static_cast<unsigned>(n)), kSelThreads, smem, stream>>>(p);
  CEDAR_RETURN_IF_ERROR(launch_status("select_stage1_kernel"));
  if (segs > 1) {
    select_stage2_kernel<<<static_cast<unsigned>(n), kSelThreads, smem, stream>>>(p);
    CEDAR_RETURN_IF_ERROR(launch_status("select_stage2_kernel"));
  }
  return Status::Ok();
}

}  // namespace

Status indexer_queries(const IndexQueryArgs& a, cudaStream_t stream) {
  const std::string who = "cuda::indexer_queries: ";
  if (a.heads <= 0 || a.heads > kMaxHeads || a.head_dim <= 0 || a.head_dim % 32 != 0 || a.head_dim > kMaxHeadDim)
    return make_error(who + "heads " + str(a.heads) + " (1.." + str(kMaxHeads) + "), head_dim " + str(a.head_dim) +
                      " (a multiple of 32 up to " + str(kMaxHeadDim) + ")");
  if (a.rope.cos_sin == nullptr || a.rope.rope_dim <= 0 || a.rope.rope_dim % 2 != 0 || a.rope.rope_dim > a.head_dim)
    return make_error(who + "RoPE table with rope_dim " + str(a.rope.rope_dim) + " does not fit head_dim " +
                      str(a.head_dim));
  if (a.n < 0 || a.n > 0x7FFFFFFF) return make_error(who + "n=" + str(a.n));
  if (a.n == 0) return Status::Ok();
  if (a.qi == nullptr || a.w_raw == nullptr || a.tokens == nullptr || a.q_codes == nullptr || a.q_scales == nullptr ||
      a.w == nullptr)
    return make_error(who + "null input or output");
  // indexer.cpp: fp32 of the double expressions.
  const double c = a.reference_precision
                       ? std::pow(static_cast<double>(a.head_dim), -0.5) * std::pow(static_cast<double>(a.heads), -0.5)
                       : std::pow(static_cast<double>(a.heads), -0.5);
  indexer_queries_kernel<<<static_cast<unsigned>(a.n), kQueryThreads, 0, stream>>>(a, static_cast<float>(c));
  return launch_status("indexer_queries_kernel");
}

Status indexer_scores(const IndexerScoreArgs& a, cudaStream_t stream) {
  const std::string who = "cuda::indexer_scores: ";
  if (a.heads <= 0 || a.heads > kMaxHeads || a.head_dim <= 0 || a.head_dim % 32 != 0 || a.head_dim > kMaxHeadDim)
    return make_error(who + "heads " + str(a.heads) + ", head_dim " + str(a.head_dim));
  if (a.ratio < 1) return make_error(who + "ratio " + str(a.ratio));
  if (a.n < 0 || a.n > 65535) return make_error(who + "n=" + str(a.n) + " rows (at most 65535 per call)");
  if (a.candidate_blocks != nullptr && (a.candidate_topk_blocks <= 0 || a.candidate_block_size <= 0))
    return make_error(who + "restricted scoring needs candidate_topk_blocks and candidate_block_size > 0");
  if (a.max_slots <= 0 || a.max_slots > 0x7FFFFFFF ||
      (a.candidate_blocks != nullptr && a.max_slots < a.candidate_topk_blocks * a.candidate_block_size))
    return make_error(who + "max_slots " + str(a.max_slots));
  if (a.n == 0) return Status::Ok();
  if (a.q_codes == nullptr || a.q_scales == nullptr || a.w == nullptr || a.tokens == nullptr || a.seqs == nullptr ||
      a.scores == nullptr)
    return make_error(who + "null input or output");
  const int64_t rb = index_key_record_bytes(a.head_dim), rb_pad = (rb + 3) / 4 * 4;
  const int heads_pad = static_cast<int>((a.heads + 15) / 16 * 16);
  const size_t smem = static_cast<size_t>(kTileKeys * rb_pad + kTileKeys * (heads_pad + 1) * 4 + kTileKeys * 8);
  if (smem + kTileKeys * sizeof(void*) > 48 * 1024)  // + the static record-pointer array
    return make_error(who + "tile needs " + str(static_cast<int64_t>(smem + kTileKeys * sizeof(void*))) +
                      " B of shared memory");
  const dim3 grid(static_cast<unsigned>((a.max_slots + kTileKeys - 1) / kTileKeys), static_cast<unsigned>(a.n));
  indexer_scores_kernel<<<grid, kScoreThreads, smem, stream>>>(a, rb_pad, heads_pad);
  return launch_status("indexer_scores_kernel");
}

int64_t indexer_select_workspace_bytes(int64_t n, int64_t max_slots, int64_t topk, int64_t candidate_topk_blocks,
                                       int64_t candidate_block_size) {
  return select_layout(n, max_slots, topk, candidate_topk_blocks, candidate_block_size).total;
}

Status indexer_select(const IndexerSelectArgs& a, cudaStream_t stream) {
  const std::string who = "cuda::indexer_select: ";
  if (a.n < 0 || a.n > 65535) return make_error(who + "n=" + str(a.n) + " rows (at most 65535 per call)");
  if (a.ratio < 1 || a.max_slots <= 0 || a.max_slots > 0x7FFFFFFF)
    return make_error(who + "ratio " + str(a.ratio) + ", max_slots " + str(a.max_slots));
  if (a.topk <= 0 || a.topk > kSegment / 2)
    return make_error(who + "topk " + str(a.topk) + " (1.." + str(kSegment / 2) + ")");
  const bool restricted = a.candidate_blocks != nullptr, blocks = a.blocks_out != nullptr;
  if ((restricted || blocks) &&
      (a.candidate_block_size <= 0 || a.candidate_topk_blocks <= 0 || a.candidate_topk_blocks > kSegment / 2))
    return make_error(who + "candidate blocks need candidate_block_size > 0 and candidate_topk_blocks in 1.." +
                      str(kSegment / 2));
  if (restricted && blocks) return make_error(who + "a restricted layer cannot publish candidate blocks");
  if (restricted && a.max_slots < a.candidate_topk_blocks * a.candidate_block_size)
    return make_error(who + "max_slots " + str(a.max_slots) + " < candidate_topk_blocks·candidate_block_size");
  if (a.n == 0) return Status::Ok();
  if (a.tokens == nullptr || a.scores == nullptr || a.topk_out == nullptr)
    return make_error(who + "null tokens, scores or output");
  const SelectLayout l =
      select_layout(a.n, a.max_slots, a.topk, blocks ? a.candidate_topk_blocks : 0, a.candidate_block_size);
  if (a.workspace_bytes < l.total || (l.total > 0 && a.workspace == nullptr))
    return make_error(who + "workspace of " + str(a.workspace_bytes) + " B, need " + str(l.total));
  uint8_t* ws = static_cast<uint8_t*>(a.workspace);
  if (blocks) {
    float* bmax = reinterpret_cast<float*>(ws + l.off_bmax);
    const dim3 grid(static_cast<unsigned>((l.nb_max + 255) / 256), static_cast<unsigned>(a.n));
    block_max_kernel<<<grid, 256, 0, stream>>>(a.scores, a.max_slots, a.tokens, a.ratio, a.candidate_block_size, bmax,
                                               l.nb_max);
    CEDAR_RETURN_IF_ERROR(launch_status("block_max_kernel"));
    const SelectParams pb{SelectKind::Blocks,
                          a.ratio,
                          a.tokens,
                          bmax,
                          l.nb_max,
                          nullptr,
                          a.candidate_topk_blocks,
                          a.candidate_block_size,
                          a.candidate_topk_blocks,
                          a.blocks_out,
                          reinterpret_cast<float*>(ws + l.off_cv_blocks),
                          reinterpret_cast<int32_t*>(ws + l.off_cp_blocks),
                          l.segs_blocks,
                          !a.warp_aggregated_histogram};
    CEDAR_RETURN_IF_ERROR(launch_select(pb, a.n, l.segs_blocks, stream));
  }
  const SelectParams pt{SelectKind::TopK,
                        a.ratio,
                        a.tokens,
                        a.scores,
                        a.max_slots,
                        a.candidate_blocks,
                        a.candidate_topk_blocks,
                        a.candidate_block_size,
                        a.topk,
                        a.topk_out,
                        reinterpret_cast<float*>(ws + l.off_cv_topk),
                        reinterpret_cast<int32_t*>(ws + l.off_cp_topk),
                        l.segs_topk,
                        !a.warp_aggregated_histogram};
  return launch_select(pt, a.n, l.segs_topk, stream);
}

// For the catalog's loadability check.
const void* indexer_queries_kernel_ptr() { return reinterpret_cast<const void*>(&indexer_queries_kernel); }
const void* indexer_scores_kernel_ptr() { return reinterpret_cast<const void*>(&indexer_scores_kernel); }
const void* indexer_select_kernel_ptr() { return reinterpret_cast<const void*>(&select_stage1_kernel); }

}  // namespace cedar::cuda
