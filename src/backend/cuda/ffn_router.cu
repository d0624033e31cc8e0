// Embedding gather + stream expansion (§3.2) and the MoE router (§3.8): fp32 logits from the bf16
// gate, sqrtsoftplus, biased top-k selection with the CPU's strict order, routing weights.
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/ffn_device.cuh"
#include "backend/cuda/ffn_kernels.h"

namespace cedar::cuda {
namespace {

constexpr int kEmbedThreads = 256;
constexpr int kRouterWarps = 8;  // warps per block: kRouterRowsPerBlock rows × kRouterSplit quarters
constexpr int kRouterSplit = 4;  // warps sharing one expert row
constexpr int kRouterRowsPerBlock = kRouterWarps / kRouterSplit;
constexpr int kRouterTokens = 8;  // tokens per router_logits launch tile
constexpr int kSelectThreads = 256;
constexpr int64_t kMaxExperts = 4096;  // router_select keeps scores in shared memory
constexpr int64_t kMaxTopk = 64;

// One block per (token, slice of 8-value chunks). Out-of-range tokens give zero rows.
__global__ void __launch_bounds__(kEmbedThreads) embed_gather_kernel(EmbedGatherArgs a) {
  const int64_t t = blockIdx.y;
  const int32_t tok = a.tokens[t];
  const bool ok = tok >= 0 && tok < a.vocab;
  if (!ok && a.bad_token && threadIdx.x == 0 && blockIdx.x == 0) atomicMax(a.bad_token, static_cast<int32_t>(t + 1));
  const int64_t d = a.d;
  const uint16_t* src = a.table + (ok ? static_cast<int64_t>(tok) : 0) * d;
  for (int64_t c = (static_cast<int64_t>(blockIdx.x) * kEmbedThreads + threadIdx.x); c < d;
       c += static_cast<int64_t>(gridDim.x) * kEmbedThreads) {
    const float v = ok ? detail::bf16_bits_to_float(src[c]) : 0.0f;
    if (a.x) a.x[t * d + c] = v;
    if (a.X)
      for (int64_t k = 0; k < a.hc; ++k) a.X[(t * a.hc + k) * d + c] = v;
  }
  if (a.pre_prev && blockIdx.x == 0 && threadIdx.x < a.hc)
    a.pre_prev[t * a.hc + threadIdx.x] = threadIdx.x == 0 ? 1.0f : 0.0f;
}

// logits[t, e] for a tile of <= 8 tokens. A block holds 2 expert rows × 4 warps; the 4 warps of a row
// take interleaved quarters of its 16-byte chunks (chunk ch goes to warp (ch / 32) % 4, lane ch % 32),
// so 384 experts give 192 blocks (every SM streams the 3.9 MB gate). Each lane accumulates its chunks in
// order (fp32 FMA: bf16·bf16 products are exact, so fma == mul + add), then a fixed butterfly per warp
// and the 4 quarters added in order. Deterministic.
__global__ void __launch_bounds__(kRouterWarps * 32)
    router_logits_kernel(const float* x, const uint16_t* gate, int64_t d, int64_t n_experts, int nt, float* logits) {
  __shared__ float quarter[kRouterRowsPerBlock][kRouterSplit][kRouterTokens];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = warp / kRouterSplit, q = warp % kRouterSplit;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kRouterRowsPerBlock + row;
  const bool live = e < n_experts;
  const uint4* w = reinterpret_cast<const uint4*>(gate + (live ? e : 0) * d);
  const int64_t chunks = d / 8;
  float acc[kRouterTokens];
#pragma unroll
  for (int t = 0; t < kRouterTokens; ++t) acc[t] = 0.0f;
  for (int64_t ch = q * 32 + lane; ch < chunks; ch += 32 * kRouterSplit) {
    const uint4 wv = __ldg(w + ch);
    const float wf[8] = {detail::bf16_bits_to_float(wv.x & 0xFFFFu), detail::bf16_bits_to_float(wv.x >> 16),
                         detail::bf16_bits_to_float(wv.y & 0xFFFFu), detail::bf16_bits_to_float(wv.y >> 16),
                         detail::bf16_bits_to_float(wv.z & 0xFFFFu), detail::bf16_bits_to_float(wv.z >> 16),
                         detail::bf16_bits_to_float(wv.w & 0xFFFFu), detail::bf16_bits_to_float(wv.w >> 16)};
#pragma unroll
    for (int t = 0; t < kRouterTokens; ++t) {
      if (t < nt) {
        const float4* xp = reinterpret_cast<const float4*>(x + t * d + ch * 8);
        const float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
        float s = acc[t];
        s = fmaf(x0.x, wf[0], s);
        s = fmaf(x0.y, wf[1], s);
        s = fmaf(x0.z, wf[2], s);
        s = fmaf(x0.w, wf[3], s);
        s = fmaf(x1.x, wf[4], s);
        s = fmaf(x1.y, wf[5], s);
        s = fmaf(x1.z, wf[6], s);
        s = fmaf(x1.w, wf[7], s);
        acc[t] = s;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kRouterTokens; ++t) {
    const float s = detail::warp_sum(acc[t]);  // every lane holds the same sum (commutative butterfly)
    if (lane == 0) quarter[row][q][t] = s;
  }
  __syncthreads();
  if (threadIdx.x < kRouterRowsPerBlock * kRouterTokens) {
    const int r = threadIdx.x / kRouterTokens, t = threadIdx.x % kRouterTokens;
    const int64_t er = static_cast<int64_t>(blockIdx.x) * kRouterRowsPerBlock + r;
    if (er < n_experts && t < nt) {
      float s = quarter[r][0][t];
      for (int qq = 1; qq < kRouterSplit; ++qq) s += quarter[r][qq][t];
      logits[t * n_experts + er] = s;
    }
  }
}

// torch softplus (beta 1, threshold 20) then sqrt, with the CPU's fp32 rounding steps.
__device__ __forceinline__ float sqrt_softplus(float v) {
  return sqrtf(v > 20.0f ? v : detail::log1pf_cr(detail::expf_cr(v)));
}

// The CPU's SelectionOrder: does expert a come before expert b?
__device__ __forceinline__ bool selected_before(float va, int64_t a, float vb, int64_t b) {
  const bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return a < b;
}

// One block per token: scores, biased values, rank of every expert under the strict total order
// (rank < topk: selected at slot rank), then thread 0 forms the weights in slot order.
__global__ void __launch_bounds__(kSelectThreads) router_select_kernel(RouterArgs a) {
  extern __shared__ float smem[];
  float* score = smem;                 // [E]
  float* biased = smem + a.n_experts;  // [E]
  __shared__ int32_t sel[kMaxTopk];
  const int64_t t = blockIdx.x, E = a.n_experts, K = a.topk;
  const bool image = a.is_image != nullptr && a.is_image[t] != 0;
  const float* b = image ? a.bias_vl : a.bias;
  for (int64_t e = threadIdx.x; e < E; e += kSelectThreads) {
    const float s = sqrt_softplus(a.logits[t * E + e] / a.gate_temp);
    score[e] = s;
    if (a.scores) a.scores[t * E + e] = s;
    if (a.tid2eid == nullptr) biased[e] = s + b[e];
  }
  __syncthreads();
  if (a.tid2eid != nullptr) {
    int64_t id = a.token_ids[t];
    id = id < 0 ? 0 : (id >= a.tid2eid_vocab ? a.tid2eid_vocab - 1 : id);
    for (int64_t k = threadIdx.x; k < K; k += kSelectThreads) sel[k] = a.tid2eid[id * K + k];
  } else {
    for (int64_t e = threadIdx.x; e < E; e += kSelectThreads) {
      const float v = biased[e];
      int64_t rank = 0;
      for (int64_t f = 0; f < E && rank < K; ++f) rank += selected_before(biased[f], f, v, e) ? 1 : 0;
      if (rank < K) sel[rank] = static_cast<int32_t>(e);
    }
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  // Weights in slot order, as route_tokens: w_k = s_k / (Σ + 1e-20) · route_scale (no contraction:
  // each step is one rounded operation).
  float w[kMaxTopk];
  float sum = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    const int32_t e = sel[k];
    w[k] = (e >= 0 && e < E) ? score[e] : 0.0f;
    sum = __fadd_rn(sum, w[k]);
  }
  for (int64_t k = 0; k < K; ++k) {
    float v = w[k];
    if (a.norm_topk_prob) v = v / __fadd_rn(sum, 1e-20f);
    v = __fmul_rn(v, a.route_scale);
    a.experts[t * K + k] = sel[k];
    a.weights[t * K + k] = v;
  }
}

Status check_router(const RouterArgs& a, bool logits_stage) {
  auto fail = [](const std::string& m) { return make_error("cuda::moe_route: " + m); };
  if (a.n < 0 || a.n > 0x7FFFFFFF) return fail("n=" + std::to_string(a.n));
  if (a.n_experts <= 0 || a.n_experts > kMaxExperts)
    return fail("n_experts=" + std::to_string(a.n_experts) + " (1.." + std::to_string(kMaxExperts) + ")");
  if (a.logits == nullptr) return fail("logits buffer is required");
  if (logits_stage) {
    if (a.d <= 0 || a.d % 8 != 0) return fail("d=" + std::to_string(a.d) + " must be a positive multiple of 8");
    if (!a.x || !a.gate) return fail("x and gate are required");
    if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<uintptr_t>(a.gate) % 16 != 0)
      return fail("x and gate must be 16-byte aligned");
    return Status::Ok();
  }
  if (a.topk < 1 || a.topk > a.n_experts || a.topk > kMaxTopk)
    return fail("topk=" + std::to_string(a.topk) + " outside [1, min(n_experts, " + std::to_string(kMaxTopk) + ")]");
  if (!(a.gate_temp > 0.0f)) return fail("gate_temp must be positive");
  if (!a.experts || !a.weights) return fail("experts and weights outputs are required");
  if (a.tid2eid) {
    if (!a.token_ids || a.tid2eid_vocab <= 0) return fail("tid2eid needs token_ids and tid2eid_vocab");
  } else {
    if (!a.bias) return fail("bias is required (selection)");
    if (a.is_image && !a.bias_vl) return fail("is_image given but the gate has no bias_vl");
  }
  return Status::Ok();
}

}  // namespace

Status embed_gather(const EmbedGatherArgs& a, cudaStream_t stream) {
  if (a.n < 0 || a.n > 65535 || a.d <= 0 || a.vocab <= 0 || a.hc <= 0 || a.hc > kEmbedThreads)
    return make_error("cuda::embed_gather: n=" + std::to_string(a.n) + " (<= 65535 per launch), d=" +
                      std::to_string(a.d) + ", vocab=" + std::to_string(a.vocab) + ", hc=" + std::to_string(a.hc));
  if (!a.table || !a.tokens) return make_error("cuda::embed_gather: table and tokens are required");
  if (a.n == 0) return Status::Ok();
  const int64_t slices = (a.d + kEmbedThreads * 4 - 1) / (kEmbedThreads * 4);  // ~4 values per thread
  embed_gather_kernel<<<dim3(static_cast<unsigned>(slices), static_cast<unsigned>(a.n)), kEmbedThreads, 0, stream>>>(a);
  return launch_status("embed_gather_kernel");
}

Status router_logits(const RouterArgs& a, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_router(a, true));
  const unsigned grid = static_cast<unsigned>((a.n_experts + kRouterRowsPerBlock - 1) / kRouterRowsPerBlock);
  for (int64_t t0 = 0; t0 < a.n; t0 += kRouterTokens) {
    const int nt = static_cast<int>(a.n - t0 < kRouterTokens ? a.n - t0 : kRouterTokens);
    router_logits_kernel<<<grid, kRouterWarps * 32, 0, stream>>>(a.x + t0 * a.d, a.gate, a.d, a.n_experts, nt,
                                                                 a.logits + t0 * a.n_experts);
    CEDAR_RETURN_IF_ERROR(launch_status("router_logits_kernel"));
  }
  return Status::Ok();
}

Status router_select(const RouterArgs& a, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_router(a, false));
  if (a.n == 0) return Status::Ok();
  const size_t smem = static_cast<size_t>(2 * a.n_experts) * sizeof(float);
  router_select_kernel<<<static_cast<unsigned>(a.n), kSelectThreads, smem, stream>>>(a);
  return launch_status("router_select_kernel");
}

Status moe_route(const RouterArgs& a, cudaStream_t stream) {
  CEDAR_RETURN_IF_ERROR(check_router(a, true));
  CEDAR_RETURN_IF_ERROR(check_router(a, false));
  CEDAR_RETURN_IF_ERROR(router_logits(a, stream));
  return router_select(a, stream);
}

const void* embed_gather_kernel_ptr() { return reinterpret_cast<const void*>(&embed_gather_kernel); }
const void* router_logits_kernel_ptr() { return reinterpret_cast<const void*>(&router_logits_kernel); }
const void* router_select_kernel_ptr() { return reinterpret_cast<const void*>(&router_select_kernel); }

}  // namespace cedar::cuda
