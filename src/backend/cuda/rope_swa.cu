// RoPE/YaRN apply and the SWA KV path (attention_kernels.h): RMSNorm_kv → RoPE → FP8 QDQ → staged
// 528-B records, and the ring commit.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/attention_math.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma_bf16.cuh"
#include "backend/cuda/rms_norm_block.cuh"

namespace cedar::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxHeadDim = 1024;

std::string str(int64_t v) { return std::to_string(v); }

Status check_rope(const RopeTableView& t, int64_t width, const char* who) {
  if (t.cos_sin == nullptr || t.positions <= 0)
    return make_error(std::string(who) + ": empty RoPE table (" + str(t.positions) + " positions)");
  if (t.rope_dim <= 0 || t.rope_dim % 2 != 0 || t.rope_dim > width)
    return make_error(std::string(who) + ": rope_dim " + str(t.rope_dim) + " must be even and within width " +
                      str(width));
  return Status::Ok();
}

Status check_swa_kv(const SwaKvArgs& a, const char* who) {
  if (a.head_dim <= 0 || a.head_dim % 32 != 0 || a.head_dim > kMaxHeadDim)
    return make_error(std::string(who) + ": head_dim " + str(a.head_dim) + " must be a multiple of 32 up to " +
                      str(kMaxHeadDim));
  CEDAR_RETURN_IF_ERROR(check_rope(a.rope, a.head_dim, who));
  if (a.n < 0 || a.n > 0x7FFFFFFF) return make_error(std::string(who) + ": n=" + str(a.n));
  if (a.n > 0 && (a.kv == nullptr || a.tokens == nullptr || a.records == nullptr))
    return make_error(std::string(who) + ": null input, tokens or records");
  return Status::Ok();
}

// One thread per (row, vector, pair of the rope range).
__global__ void __launch_bounds__(kThreads)
    rope_apply_kernel(RopeTableView t, float* x, int64_t rows, int64_t n_vec, int64_t width, int64_t row_stride,
                      const AttnToken* tokens, bool inverse) {
  const int64_t half = t.rope_dim / 2;
  const int64_t total = rows * n_vec * half;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t i = e % half, v = (e / half) % n_vec, r = e / (half * n_vec);
    float* p = x + r * row_stride + v * width + (width - t.rope_dim) + 2 * i;
    float a = p[0], b = p[1];
    detail::rope_pair(t, tokens[r].pos, i, inverse, a, b);
    p[0] = a;
    p[1] = b;
  }
}

// What a thread of swa_kv_encode_row reads besides the row's kv: the row's position, its channel pairs' norm
// weights and RoPE cos / sin. Step inputs and weights, written before any kernel of the step, so the PDL launch
// reads them before its wait: the chain after the wait is kv's load, the sum and the stores, not four dependent
// round trips (pos, then the weights and the table by position; s30).
constexpr int kSwaPairsPerThread = static_cast<int>(kMaxHeadDim / 2 / kThreads);
struct SwaRowInputs {
  int64_t pos = 0;
  float2 weight[kSwaPairsPerThread];   // (1, 1) without a norm weight (rms_apply's null weight: the same bits)
  float2 cos_sin[kSwaPairsPerThread];  // NaN outside the table or the rope range (rope_pair's values)
};

__device__ __forceinline__ SwaRowInputs swa_row_inputs(const SwaKvArgs& a, int64_t row) {
  SwaRowInputs in;
  in.pos = a.tokens[row].pos;
  const int64_t hd = a.head_dim, rope_start = hd - a.rope.rope_dim;
  const bool in_table = in.pos >= 0 && in.pos < a.rope.positions;
#pragma unroll
  for (int k = 0; k < kSwaPairsPerThread; ++k) {
    const int64_t c = 2 * (int64_t{k} * kThreads + threadIdx.x);
    const bool valid = c < hd;
    in.weight[k] = valid && a.norm_weight ? make_float2(__ldg(a.norm_weight + c), __ldg(a.norm_weight + c + 1))
                                          : make_float2(1.0f, 1.0f);
    in.cos_sin[k] = make_float2(detail::nan_f(), detail::nan_f());
    if (valid && c >= rope_start && in_table) {
      const float* cs = a.rope.cos_sin + in.pos * a.rope.rope_dim + (c - rope_start);
      in.cos_sin[k] = __ldg(reinterpret_cast<const float2*>(cs));
    }
  }
  return in;
}

// Row `row` by the block's kThreads threads. Thread k handles channel pairs k, k + 256, ...: a 32-channel
// QDQ block is 16 consecutive pairs, i.e. one half warp in one iteration. rms_apply and rope_pair's
// arithmetic (rms_scale, rope_rotate) on the values `in` holds.
__device__ __forceinline__ void swa_kv_encode_row(const SwaKvArgs& a, int64_t row, const SwaRowInputs& in) {
  __shared__ __align__(16) float xs[kMaxHeadDim];
  __shared__ float rstd;
  const int64_t hd = a.head_dim;
  const float* x = a.kv + row * hd;
  for (int64_t c = threadIdx.x; c < hd; c += kThreads) xs[c] = x[c];
  __syncthreads();
  if (threadIdx.x == 0) rstd = detail::rms_rstd_sequential_smem(xs, hd, a.eps);
  __syncthreads();
  const float r = rstd;
  const int64_t rope_start = hd - a.rope.rope_dim;
  const int64_t rb = swa_record_bytes(hd);
  uint8_t* rec = a.records + row * rb;
#pragma unroll
  for (int k = 0; k < kSwaPairsPerThread; ++k) {
    if (int64_t{k} * kThreads >= hd / 2) break;  // block-uniform
    const int64_t pr = int64_t{k} * kThreads + threadIdx.x;
    const bool valid = pr < hd / 2;  // half warps are all valid or all not (hd % 32 == 0)
    const int64_t c = 2 * pr;
    float e = 0.0f, o = 0.0f;
    if (valid) {
      e = detail::rms_scale(xs[c], r, a.norm_weight != nullptr, in.weight[k].x);
      o = detail::rms_scale(xs[c + 1], r, a.norm_weight != nullptr, in.weight[k].y);
      if (c >= rope_start) detail::rope_rotate(in.cos_sin[k].x, in.cos_sin[k].y, e, o);
    }
    const bool finite = detail::half_warp_all(isfinite(e) && isfinite(o));
    const float amax = detail::half_warp_max(fmaxf(fabsf(e), fabsf(o)));
    const uint32_t sb = finite ? detail::fp8_b32_scale_byte(amax) : 0xFFu;
    const float s = detail::ue8m0_to_float(sb);
    const uint32_t ce = finite ? detail::fp8_encode(e, s) : 0x7Fu;
    const uint32_t co = finite ? detail::fp8_encode(o, s) : 0x7Fu;
    if (valid) {
      rec[c] = static_cast<uint8_t>(ce);  // byte stores: records of odd size (head_dim 32: 33 B) are unaligned
      rec[c + 1] = static_cast<uint8_t>(co);
      if ((threadIdx.x & 15) == 0) rec[hd + c / 32] = static_cast<uint8_t>(sb);
      if (a.values != nullptr) {
        a.values[row * hd + c] = __fmul_rn(detail::e4m3_to_f32(ce), s);
        a.values[row * hd + c + 1] = __fmul_rn(detail::e4m3_to_f32(co), s);
      }
    }
  }
}

// One block per row (a plain launch: stream order gives it kv).
__global__ void __launch_bounds__(kThreads) swa_kv_encode_kernel(SwaKvArgs a) {
  swa_kv_encode_row(a, blockIdx.x, swa_row_inputs(a, blockIdx.x));
}

// q_norm's rows (blocks [0, n): rms_norm_block) and the SWA KV encode of the same rows (blocks [n, 2n)).
template <bool kQuant>
__global__ void __launch_bounds__(kThreads) q_norm_swa_kv_encode_kernel(QNormArgs q, SwaKvArgs a) {
  if (blockIdx.x < a.n) {
    detail::rms_norm_block<kQuant>(q.x, q.dim, q.weight, q.eps, q.y, q.quant.codes, q.quant.scales, blockIdx.x);
  } else {
    detail::pdl_launch_dependents();
    const SwaRowInputs in = swa_row_inputs(a, blockIdx.x - a.n);  // step inputs and weights: before the wait
    detail::pdl_wait();
    swa_kv_encode_row(a, blockIdx.x - a.n, in);
  }
}

__global__ void __launch_bounds__(kThreads) swa_ring_commit_kernel(SwaRingCommitArgs a) {
  const int64_t row = blockIdx.x;
  const AttnToken tk = a.tokens[row];
  if (tk.pos < tk.chunk_pos0 + tk.chunk_len - a.slots || tk.pos < 0) return;
  const SwaRingDesc ring = a.rings[tk.seq];
  const int64_t slot = tk.pos % a.slots;
  const uint8_t* src = a.records + row * a.record_bytes;
  uint8_t* dst = ring.records + slot * a.record_bytes;
  for (int64_t b = threadIdx.x; b < a.record_bytes; b += kThreads) dst[b] = src[b];
  if (threadIdx.x == 0) ring.positions[slot] = tk.pos;
}

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, 132 * 16));
}

}  // namespace

Status rope_apply(const RopeTableView& table, const RopeApplyArgs& a, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_rope(table, a.width, "cuda::rope_apply"));
  if (a.rows < 0 || a.n_vec <= 0 || a.width <= 0)
    return make_error("cuda::rope_apply: rows=" + str(a.rows) + ", n_vec=" + str(a.n_vec) + ", width=" + str(a.width));
  if (a.rows == 0) return Status::Ok();
  const int64_t stride = a.row_stride != 0 ? a.row_stride : a.n_vec * a.width;
  if (a.x == nullptr || a.tokens == nullptr || stride < a.n_vec * a.width)
    return make_error("cuda::rope_apply: null data or tokens, or row_stride " + str(stride) + " < " +
                      str(a.n_vec * a.width));
  rope_apply_kernel<<<grid_for(a.rows * a.n_vec * table.rope_dim / 2), kThreads, 0, stream>>>(
      table, a.x, a.rows, a.n_vec, a.width, stride, a.tokens, a.inverse);
  return launch_status("rope_apply_kernel");
}

Status swa_kv_encode(const SwaKvArgs& a, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_swa_kv(a, "cuda::swa_kv_encode"));
  if (a.n == 0) return Status::Ok();
  swa_kv_encode_kernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream>>>(a);
  return launch_status("swa_kv_encode_kernel");
}

Status q_norm_swa_kv_encode(const QNormArgs& q, const SwaKvArgs& a, cudaStream_t stream, bool pdl) {
  const char* who = "cuda::q_norm_swa_kv_encode";
  CEDAR_RETURN_IF_ERROR(check_swa_kv(a, who));
  if (q.x == nullptr || q.y == nullptr || q.dim <= 0)
    return make_error(std::string(who) + ": null query input / output, or dim " + str(q.dim));
  if (q.quant.on() != (q.quant.scales != nullptr))
    return make_error(std::string(who) + ": the FP8 output needs both codes and scales");
  if (q.quant.on() && q.dim % 32 != 0)
    return make_error(std::string(who) + ": FP8 codes need dim % 32 == 0 (dim=" + str(q.dim) + ")");
  if (a.n > 0x3FFFFFFF) return make_error(std::string(who) + ": n=" + str(a.n));
  if (a.n == 0) return Status::Ok();
  const dim3 grid(static_cast<unsigned>(2 * a.n));
  if (q.quant.on())
    return launch_kernel(q_norm_swa_kv_encode_kernel<true>, grid, dim3(kThreads), 0, stream, pdl,
                         "q_norm_swa_kv_encode_kernel<quant>", q, a);
  return launch_kernel(q_norm_swa_kv_encode_kernel<false>, grid, dim3(kThreads), 0, stream, pdl,
                       "q_norm_swa_kv_encode_kernel", q, a);
}

Status swa_ring_commit(const SwaRingCommitArgs& a, cudaStream_t stream) {
  if (a.n < 0 || a.n > 0x7FFFFFFF || a.slots <= 0 || a.record_bytes <= 0)
    return make_error("cuda::swa_ring_commit: n=" + str(a.n) + ", slots=" + str(a.slots) +
                      ", record_bytes=" + str(a.record_bytes));
  if (a.n == 0) return Status::Ok();
  if (a.records == nullptr || a.tokens == nullptr || a.rings == nullptr)
    return make_error("cuda::swa_ring_commit: null records, tokens or rings");
  swa_ring_commit_kernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream>>>(a);
  return launch_status("swa_ring_commit_kernel");
}

// For the catalog's loadability check.
const void* rope_apply_kernel_ptr() { return reinterpret_cast<const void*>(&rope_apply_kernel); }
const void* swa_kv_encode_kernel_ptr() { return reinterpret_cast<const void*>(&swa_kv_encode_kernel); }
const void* q_norm_swa_kv_encode_kernel_ptr() {
  return reinterpret_cast<const void*>(&q_norm_swa_kv_encode_kernel<true>);
}
const void* swa_ring_commit_kernel_ptr() { return reinterpret_cast<const void*>(&swa_ring_commit_kernel); }

}  // namespace cedar::cuda
