// CSA2 compressor (ratio 1 and ratio r with the pending odd-token state on the device), the main KV
// records (FP4 / E4M3 per 16) and the indexer-key records (FP4 / UE8M0 per 32) (attention_kernels.h).
#include <cstdint>
#include <string>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/attention_math.cuh"
#include "backend/cuda/cuda_status.h"

namespace cedar::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxWidth = 1024;

std::string str(int64_t v) { return std::to_string(v); }

__device__ __forceinline__ bool completes_group(const AttnToken& tk, int64_t ratio) {
  return tk.pos >= 0 && tk.pos % ratio == ratio - 1;
}

// Row `q` of the group (position q) of the row `tk`: this call's row, or the pending slot.
__device__ __forceinline__ const float* member_row(const float* rows, const float* pending, const AttnToken& tk,
                                                   int64_t q, int64_t ratio, int64_t hd) {
  return q >= tk.chunk_pos0 ? rows + (tk.chunk_row0 + (q - tk.chunk_pos0)) * hd : pending + (q % ratio) * hd;
}

// One block per row. Thread k handles channel pairs k, k + 256, ...: an FP4 block of 16 channels is 8
// consecutive pairs (a quarter warp), so the block's amax is a quarter-warp reduction.
__global__ void __launch_bounds__(kThreads) compressor_entries_kernel(CompressorArgs a) {
  __shared__ __align__(16) float xs[kMaxWidth];
  __shared__ float rstd;
  const int64_t row = blockIdx.x, hd = a.head_dim, r = a.ratio;
  const AttnToken tk = a.tokens[row];
  float* lat = a.latent + row * hd;
  if (!completes_group(tk, r)) {
    for (int64_t c = threadIdx.x; c < hd; c += kThreads) lat[c] = 0.0f;
    return;
  }
  const KvSourceSeq seq = a.seqs[tk.seq];
  const int64_t j = tk.pos / r, g0 = j * r;
  if (r == 1) {
    for (int64_t c = threadIdx.x; c < hd; c += kThreads) xs[c] = a.kv[row * hd + c];
  } else {
    // compressor.cpp: per channel m = max_t g_t, e_t = exp(g_t − m), sum = Σ e_t, acc = Σ kv_t·(e_t/sum),
    // all sequential in t; pooled = bf16(acc).
    for (int64_t c = threadIdx.x; c < hd; c += kThreads) {
      float m = member_row(a.gate, seq.pending_gate, tk, g0, r, hd)[c];
      for (int64_t t = 1; t < r; ++t) {
        const float g = member_row(a.gate, seq.pending_gate, tk, g0 + t, r, hd)[c];
        m = m < g ? g : m;  // std::max(m, g)
      }
      // e_t is evaluated twice (same value) instead of being stored: no per-thread array.
      auto e = [&](int64_t t) {
        return detail::exp_f32(__fsub_rn(member_row(a.gate, seq.pending_gate, tk, g0 + t, r, hd)[c], m));
      };
      float sum = 0.0f;
      for (int64_t t = 0; t < r; ++t) sum = __fadd_rn(sum, e(t));
      float acc = 0.0f;
      for (int64_t t = 0; t < r; ++t)
        acc = __fadd_rn(acc, __fmul_rn(member_row(a.kv, seq.pending_kv, tk, g0 + t, r, hd)[c], __fdiv_rn(e(t), sum)));
      xs[c] = detail::round_bf16(acc);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) rstd = detail::rms_rstd_sequential_smem(xs, hd, a.eps);
  __syncthreads();
  const float rs = rstd;
  const int64_t rope_start = hd - a.rope.rope_dim;
  uint8_t* rec = detail::record_ptr(seq.kv, j);
  for (int64_t base = 0; base < hd / 2; base += kThreads) {
    const int64_t pr = base + threadIdx.x;
    const bool valid = pr < hd / 2;  // quarter warps are all valid or all not
    const int64_t c = 2 * pr;
    float e = 0.0f, o = 0.0f;
    if (valid) {
      e = detail::rms_apply(xs[c], rs, a.norm_weight, c);
      o = detail::rms_apply(xs[c + 1], rs, a.norm_weight, c + 1);
      lat[c] = e;
      lat[c + 1] = o;
      if (c >= rope_start) detail::rope_pair(a.rope, g0, (c - rope_start) / 2, false, e, o);
    }
    const bool finite = detail::quarter_warp_all(isfinite(e) && isfinite(o));
    const float amax = detail::quarter_warp_max(fmaxf(fabsf(e), fabsf(o)));
    const uint32_t sb = finite ? detail::fp4_b16_scale_byte(amax) : 0x7Fu;  // e4m3 NaN poisons the block
    const float s = detail::e4m3_to_f32(sb);
    const uint32_t ce = finite ? detail::fp4_encode(e, s) : 0u;
    const uint32_t co = finite ? detail::fp4_encode(o, s) : 0u;
    if (valid) {
      rec[pr] = static_cast<uint8_t>(ce | (co << 4));  // element 2i in the low nibble
      if ((threadIdx.x & 7) == 0) rec[hd / 2 + c / 16] = static_cast<uint8_t>(sb);
    }
  }
}

__global__ void __launch_bounds__(kThreads) compressor_keep_pending_kernel(CompressorArgs a) {
  const int64_t row = blockIdx.x, hd = a.head_dim, r = a.ratio;
  const AttnToken tk = a.tokens[row];
  const int64_t open_group = (tk.chunk_pos0 + tk.chunk_len) / r * r;  // first position of the open group
  if (tk.pos < open_group || tk.pos < 0) return;
  const KvSourceSeq seq = a.seqs[tk.seq];
  const int64_t slot = tk.pos % r;
  for (int64_t c = threadIdx.x; c < hd; c += kThreads) {
    seq.pending_kv[slot * hd + c] = a.kv[row * hd + c];
    seq.pending_gate[slot * hd + c] = a.gate[row * hd + c];
  }
}

// One block per row; a UE8M0 block of 32 channels is 16 pairs (a half warp).
__global__ void __launch_bounds__(kThreads) indexer_keys_store_kernel(IndexKeyArgs a) {
  __shared__ __align__(16) float xs[kMaxWidth];
  __shared__ float rstd;
  const int64_t row = blockIdx.x, w = a.index_head_dim, r = a.ratio;
  const AttnToken tk = a.tokens[row];
  if (!completes_group(tk, r)) return;
  const int64_t j = tk.pos / r, g0 = j * r;
  for (int64_t c = threadIdx.x; c < w; c += kThreads) xs[c] = a.k[row * w + c];
  __syncthreads();
  if (threadIdx.x == 0) rstd = detail::rms_rstd_sequential_smem(xs, w, a.eps);
  __syncthreads();
  const float rs = rstd;
  const int64_t rope_start = w - a.rope.rope_dim;
  uint8_t* rec = detail::record_ptr(a.seqs[tk.seq].index_k, j);
  for (int64_t base = 0; base < w / 2; base += kThreads) {
    const int64_t pr = base + threadIdx.x;
    const bool valid = pr < w / 2;
    const int64_t c = 2 * pr;
    float e = 0.0f, o = 0.0f;
    if (valid) {
      e = detail::rms_apply(xs[c], rs, a.norm_weight, c);
      o = detail::rms_apply(xs[c + 1], rs, a.norm_weight, c + 1);
      if (c >= rope_start) detail::rope_pair(a.rope, g0, (c - rope_start) / 2, false, e, o);
    }
    const bool finite = detail::half_warp_all(isfinite(e) && isfinite(o));
    const float amax = detail::half_warp_max(fmaxf(fabsf(e), fabsf(o)));
    const uint32_t sb = finite ? detail::fp4_b32_scale_byte(amax) : 0xFFu;
    const float s = detail::ue8m0_to_float(sb);
    const uint32_t ce = finite ? detail::fp4_encode(e, s) : 0u;
    const uint32_t co = finite ? detail::fp4_encode(o, s) : 0u;
    if (valid) {
      rec[pr] = static_cast<uint8_t>(ce | (co << 4));
      if ((threadIdx.x & 15) == 0) rec[w / 2 + c / 32] = static_cast<uint8_t>(sb);
    }
  }
}

Status check_common(const char* who, int64_t n, int64_t width, int64_t ratio, const RopeTableView& rope,
                    const AttnToken* tokens, const KvSourceSeq* seqs) {
  if (width <= 0 || width % 32 != 0 || width > kMaxWidth)
    return make_error(std::string(who) + ": width " + str(width) + " must be a multiple of 32 up to " + str(kMaxWidth));
  if (ratio < 1 || ratio > 128) return make_error(std::string(who) + ": compress ratio " + str(ratio) + " (1..128)");
  if (rope.cos_sin == nullptr || rope.positions <= 0 || rope.rope_dim <= 0 || rope.rope_dim % 2 != 0 ||
      rope.rope_dim > width)
    return make_error(std::string(who) + ": RoPE table with rope_dim " + str(rope.rope_dim) + " and " +
                      str(rope.positions) + " positions does not fit width " + str(width));
  if (n < 0 || n > 0x7FFFFFFF) return make_error(std::string(who) + ": n=" + str(n));
  if (n > 0 && (tokens == nullptr || seqs == nullptr)) return make_error(std::string(who) + ": null tokens or seqs");
  return Status::Ok();
}

}  // namespace

Status compressor_entries(const CompressorArgs& a, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_common("cuda::compressor_entries", a.n, a.head_dim, a.ratio, a.rope, a.tokens, a.seqs));
  if (a.n == 0) return Status::Ok();
  if (a.kv == nullptr || a.latent == nullptr || (a.ratio > 1 && a.gate == nullptr))
    return make_error("cuda::compressor_entries: null kv, gate (ratio " + str(a.ratio) + ") or latent");
  compressor_entries_kernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream>>>(a);
  return launch_status("compressor_entries_kernel");
}

Status compressor_keep_pending(const CompressorArgs& a, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(
      check_common("cuda::compressor_keep_pending", a.n, a.head_dim, a.ratio, a.rope, a.tokens, a.seqs));
  if (a.n == 0 || a.ratio == 1) return Status::Ok();
  if (a.kv == nullptr || a.gate == nullptr) return make_error("cuda::compressor_keep_pending: null kv or gate");
  compressor_keep_pending_kernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream>>>(a);
  return launch_status("compressor_keep_pending_kernel");
}

Status indexer_keys_store(const IndexKeyArgs& a, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(
      check_common("cuda::indexer_keys_store", a.n, a.index_head_dim, a.ratio, a.rope, a.tokens, a.seqs));
  if (a.n == 0) return Status::Ok();
  if (a.k == nullptr) return make_error("cuda::indexer_keys_store: null k");
  indexer_keys_store_kernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream>>>(a);
  return launch_status("indexer_keys_store_kernel");
}

// For the catalog's loadability check.
const void* compressor_entries_kernel_ptr() { return reinterpret_cast<const void*>(&compressor_entries_kernel); }
const void* compressor_keep_pending_kernel_ptr() {
  return reinterpret_cast<const void*>(&compressor_keep_pending_kernel);
}
const void* indexer_keys_store_kernel_ptr() { return reinterpret_cast<const void*>(&indexer_keys_store_kernel); }

}  // namespace cedar::cuda
