// Greedy argmax and the full sampler (engine/sampler.cpp semantics) on the device, one 1024-thread
// block per row. Every reduction runs in a fixed order (warp butterflies / scans, then warps in index
// order) and the radix selections count with integer atomics, so results are deterministic.
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ffn_kernels.h"

namespace cedar::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xFFFFFFFFu;

// ---- fixed-order block primitives (all threads call them; every thread gets the result) -----------

template <typename T>
__device__ T block_sum(T v, T* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  return total;
}

// Exclusive prefix sum over threads in thread order; *total = the sum of all.
template <typename T>
__device__ T block_exclusive_scan(T v, T* scratch, T* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const T up = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += up;
  }
  __syncthreads();
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  T base = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) base += scratch[w];
    all += scratch[w];
  }
  *total = all;
  return base + incl - v;
}

// The sampler's argmax order: a non-NaN beats NaN, larger beats smaller, then the lower index.
__device__ __forceinline__ bool beats(double av, int ai, double bv, int bi) {
  const bool an = isnan(av), bn = isnan(bv);
  if (an != bn) return bn;
  if (!an && av != bv) return av > bv;
  return ai < bi;
}

struct Cand {
  double v;
  int i;
};

__device__ Cand block_argmax(Cand c, double* sv, int* si) {
  for (int o = 16; o > 0; o >>= 1) {
    const double ov = __shfl_xor_sync(kFull, c.v, o);
    const int oi = __shfl_xor_sync(kFull, c.i, o);
    if (beats(ov, oi, c.v, c.i)) c = Cand{ov, oi};
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    sv[threadIdx.x >> 5] = c.v;
    si[threadIdx.x >> 5] = c.i;
  }
  __syncthreads();
  Cand best{sv[0], si[0]};
  for (int w = 1; w < kWarps; ++w)
    if (beats(sv[w], si[w], best.v, best.i)) best = Cand{sv[w], si[w]};
  return best;
}

// argmax of one float row; −1 when logit 0 is NaN or the maximum is not finite.
__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* logits, int64_t vocab, int32_t* tokens) {
  __shared__ double sv[kWarps];
  __shared__ int si[kWarps];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  Cand c{__longlong_as_double(0x7FF8000000000000ll), 0x7FFFFFFF};
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const double v = row[i];
    if (beats(v, static_cast<int>(i), c.v, c.i)) c = Cand{v, static_cast<int>(i)};
  }
  const Cand best = block_argmax(c, sv, si);
  if (threadIdx.x == 0) tokens[blockIdx.x] = (isnan(row[0]) || !isfinite(best.v)) ? -1 : best.i;
}

// ---- the sampler ----------------------------------------------------------------------------------

// engine::Pcg32.
struct Pcg {
  uint64_t state, inc;
  __device__ uint32_t next_u32() {
    const uint64_t old = state;
    state = old * 6364136223846793005ULL + inc;
    const auto xorshifted = static_cast<uint32_t>(((old >> 18u) ^ old) >> 27u);
    const auto rot = static_cast<uint32_t>(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
  }
  __device__ double next_double() {
    const uint64_t a = next_u32() >> 5;
    const uint64_t b = next_u32() >> 6;
    return static_cast<double>(a * 67108864ULL + b) / 9007199254740992.0;
  }
};

// Order-preserving unsigned keys of doubles (NaN excluded).
__device__ __forceinline__ uint64_t order_key(double v) {
  const auto b = static_cast<uint64_t>(__double_as_longlong(v));
  return (b >> 63) ? ~b : (b | 0x8000000000000000ull);
}
__device__ __forceinline__ double key_value(uint64_t k) {
  const uint64_t b = (k >> 63) ? (k & 0x7FFFFFFFFFFFFFFFull) : ~k;
  return __longlong_as_double(static_cast<long long>(b));
}
// Top-p masses in 2^-62 fixed point (p <= 1, so Σ fits): integer sums are order-independent.
__device__ __forceinline__ uint64_t mass_fx(double p) { return __double2ull_rz(p * 4611686018427387904.0); }

struct SampleShared {
  double dscratch[kWarps];
  int iscratch[kWarps];
  unsigned long long uscratch[kWarps];
  int hist[256];
  unsigned long long mass[256];
  uint64_t prefix;
  int remaining;
  int keep_all;
  double target;
  int hit;
  int last_nz;
};

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  __shared__ SampleShared sh;
  const int64_t row = blockIdx.x, V = a.vocab;
  const SamplingRowParams P = a.params[row];
  const float* lg = a.logits + row * V;
  double* xs = a.workspace + row * 2 * V;  // processed logits (only when the row has adjustments)
  double* p = xs + V;
  const int tid = threadIdx.x;
  const bool adjusted = P.bias_count > 0 || P.penalty_count > 0;
  auto xv = [&](int64_t i) { return adjusted ? xs[i] : static_cast<double>(lg[i]); };

  // 1. Processed logits: bias → repetition penalty → frequency / presence (distinct ids per list, so the
  //    patches of one phase never collide; the CPU's double operations, no contraction).
  if (adjusted) {
    for (int64_t i = tid; i < V; i += kThreads) xs[i] = lg[i];
    __syncthreads();
    for (int e = tid; e < P.bias_count; e += kThreads) {
      const LogitBiasEntry b = a.bias[P.bias_begin + e];
      if (b.token >= 0 && b.token < V) xs[b.token] = __dadd_rn(xs[b.token], b.bias);
    }
    __syncthreads();
    if (P.repetition_penalty != 1.0) {
      for (int e = tid; e < P.penalty_count; e += kThreads) {
        const PenaltyEntry q = a.penalties[P.penalty_begin + e];
        if (q.token < 0 || q.token >= V || (!q.in_prompt && q.output_count <= 0)) continue;
        const double v = xs[q.token];
        xs[q.token] = v > 0 ? __ddiv_rn(v, P.repetition_penalty) : __dmul_rn(v, P.repetition_penalty);
      }
      __syncthreads();
    }
    for (int e = tid; e < P.penalty_count; e += kThreads) {
      const PenaltyEntry q = a.penalties[P.penalty_begin + e];
      if (q.token < 0 || q.token >= V || q.output_count <= 0) continue;
      const double sub =
          __dadd_rn(__dmul_rn(P.frequency_penalty, static_cast<double>(q.output_count)), P.presence_penalty);
      xs[q.token] = __dsub_rn(xs[q.token], sub);
    }
    __syncthreads();
  }

  // 2. argmax (greedy, and the softmax's max).
  Cand c{__longlong_as_double(0x7FF8000000000000ll), 0x7FFFFFFF};
  for (int64_t i = tid; i < V; i += kThreads) {
    const double v = xv(i);
    if (beats(v, static_cast<int>(i), c.v, c.i)) c = Cand{v, static_cast<int>(i)};
  }
  const Cand best = block_argmax(c, sh.dscratch, sh.iscratch);
  if (isnan(xv(0)) || !isfinite(best.v)) {  // the CPU's "no finite logit" (uniform branch)
    if (tid == 0) a.tokens[row] = -1;
    return;
  }
  if (P.temperature == 0.0) {
    if (tid == 0) a.tokens[row] = best.i;
    return;
  }

  // 3. softmax(x / T), then min-p; the normalized values are stored (every later step reads them).
  const double mx = best.v, t = P.temperature;
  double local = 0;
  for (int64_t i = tid; i < V; i += kThreads) {
    const double e = exp(__ddiv_rn(__dsub_rn(xv(i), mx), t));
    p[i] = e;
    local += e;
  }
  const double sum1 = block_sum(local, sh.dscratch);
  const double min_floor = P.min_p > 0 ? __dmul_rn(P.min_p, __ddiv_rn(1.0, sum1)) : 0.0;  // p[best] = exp(0)/sum
  local = 0;
  int nonzero = 0;
  for (int64_t i = tid; i < V; i += kThreads) {
    double v = __ddiv_rn(p[i], sum1);
    if (P.min_p > 0 && v < min_floor) v = 0;
    p[i] = v;
    local += v;
    nonzero += v > 0 ? 1 : 0;
  }
  double sum2 = block_sum(local, sh.dscratch);
  nonzero = block_sum(nonzero, sh.iscratch);

  // 4. top-k: the k-th largest processed logit among p > 0 (radix select, 8 bits per level); logits
  //    below it drop (ties at the k-th value stay).
  if (P.top_k > 0 && P.top_k < V && nonzero > P.top_k) {
    uint64_t prefix = 0, mask = 0;
    int remaining = static_cast<int>(P.top_k);
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += kThreads) sh.hist[b] = 0;
      __syncthreads();
      for (int64_t i = tid; i < V; i += kThreads) {
        if (!(p[i] > 0)) continue;
        const uint64_t key = order_key(xv(i));
        if ((key & mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & 0xFF], 1);
      }
      __syncthreads();
      if (tid == 0) {
        int cum = 0, sel = 0;
        for (int b = 255; b >= 0; --b) {
          if (cum + sh.hist[b] >= remaining) {
            sel = b;
            break;
          }
          cum += sh.hist[b];
        }
        sh.remaining = remaining - cum;
        sh.prefix = prefix | (static_cast<uint64_t>(sel) << shift);
      }
      __syncthreads();
      prefix = sh.prefix;
      remaining = sh.remaining;
      mask |= 0xFFull << shift;
      __syncthreads();
    }
    const double kth = key_value(prefix);
    local = 0;
    for (int64_t i = tid; i < V; i += kThreads) {
      if (xv(i) < kth) p[i] = 0;
      local += p[i];
    }
    sum2 = block_sum(local, sh.dscratch);
  }
  // 5. Renormalize.
  for (int64_t i = tid; i < V; i += kThreads) p[i] = __ddiv_rn(p[i], sum2);
  __syncthreads();

  // 6. top-p: in descending p (lower id first on ties), keep while the mass before < top_p: find the
  //    crossing value v* by a radix descent over p's bits with fixed-point masses, then keep p > v* and
  //    the first j* ids with p == v*.
  const int64_t chunk = (V + kThreads - 1) / kThreads;
  const int64_t c0 = tid * chunk, c1 = c0 + chunk < V ? c0 + chunk : V;
  bool renorm3 = false;
  double sum3 = 1.0;
  if (P.top_p < 1.0) {
    const uint64_t target = mass_fx(P.top_p);
    uint64_t prefix = 0, mask = 0;
    unsigned long long above = 0;
    int keep_all = 0, last_cnt = 0;
    for (int shift = 56; shift >= 0 && !keep_all; shift -= 8) {
      for (int b = tid; b < 256; b += kThreads) {
        sh.hist[b] = 0;
        sh.mass[b] = 0;
      }
      __syncthreads();
      for (int64_t i = tid; i < V; i += kThreads) {
        const double v = p[i];
        if (!(v > 0)) continue;
        const auto key = static_cast<uint64_t>(__double_as_longlong(v));
        if ((key & mask) != prefix) continue;
        const int b = static_cast<int>((key >> shift) & 0xFF);
        atomicAdd(&sh.hist[b], 1);
        atomicAdd(&sh.mass[b], static_cast<unsigned long long>(mass_fx(v)));
      }
      __syncthreads();
      if (tid == 0) {
        unsigned long long cum = 0;
        int sel = -1;
        for (int b = 255; b >= 0; --b) {
          if (above + cum + sh.mass[b] >= target) {
            sel = b;
            break;
          }
          cum += sh.mass[b];
        }
        sh.keep_all = sel < 0;  // only possible at the first level: the total is below top_p
        if (sel >= 0) {
          above += cum;
          sh.prefix = prefix | (static_cast<uint64_t>(sel) << shift);
          sh.uscratch[0] = above;
          sh.remaining = sh.hist[sel];
        }
      }
      __syncthreads();
      keep_all = sh.keep_all;
      if (!keep_all) {
        prefix = sh.prefix;
        above = sh.uscratch[0];
        last_cnt = sh.remaining;
        mask |= 0xFFull << shift;
      }
      __syncthreads();
    }
    if (!keep_all) {
      const double vstar = __longlong_as_double(static_cast<long long>(prefix));
      const unsigned long long m = mass_fx(vstar);
      unsigned long long need = (target > above && m > 0) ? (target - above + m - 1) / m : 1;
      need = need < 1 ? 1 : (need > static_cast<unsigned long long>(last_cnt) ? last_cnt : need);
      // Rank of each id among the ids with p == v*, in id order: contiguous chunks + a thread scan.
      int eq = 0;
      for (int64_t i = c0; i < c1; ++i) eq += p[i] == vstar ? 1 : 0;
      int eq_total = 0;
      int rank = block_exclusive_scan(eq, sh.iscratch, &eq_total);
      local = 0;
      for (int64_t i = c0; i < c1; ++i) {
        const double v = p[i];
        bool keep = v > vstar;
        if (v == vstar) keep = static_cast<unsigned long long>(rank++) < need;
        if (!keep) p[i] = 0;
        local += keep ? v : 0.0;
      }
      sum3 = block_sum(local, sh.dscratch);
      renorm3 = true;
    }
  }

  // 7. The draw: u from the row's PCG32, target = u · total, the first id whose inclusive prefix sum
  //    (id order) exceeds it; prefix sums over contiguous chunks + a thread scan.
  local = 0;
  for (int64_t i = c0; i < c1; ++i) {
    if (renorm3) p[i] = __ddiv_rn(p[i], sum3);
    local += p[i];
  }
  double total = 0;
  const double base = block_exclusive_scan(local, sh.dscratch, &total);
  if (tid == 0) {
    Pcg rng{a.rng[row].state, a.rng[row].inc};
    sh.target = rng.next_double() * total;
    a.rng[row] = Pcg32State{rng.state, rng.inc};
    sh.hit = 0x7FFFFFFF;
    sh.last_nz = -1;
  }
  __syncthreads();
  const double target = sh.target;
  double acc = base;
  int hit = 0x7FFFFFFF, last = -1;
  for (int64_t i = c0; i < c1; ++i) {
    const double v = p[i];
    if (!(v > 0)) continue;
    last = static_cast<int>(i);
    acc += v;
    if (target < acc) {
      hit = static_cast<int>(i);
      break;
    }
  }
  if (hit != 0x7FFFFFFF) atomicMin(&sh.hit, hit);
  if (last >= 0) atomicMax(&sh.last_nz, last);
  __syncthreads();
  // No crossing (rounding at the top end): the last nonzero id, as the CPU (0 if none).
  if (tid == 0) a.tokens[row] = sh.hit != 0x7FFFFFFF ? sh.hit : (sh.last_nz >= 0 ? sh.last_nz : 0);
}

}  // namespace

Status argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* tokens, cudaStream_t stream) {
  if (rows < 0 || rows > 0x7FFFFFFF || vocab <= 0 || vocab >= 0x7FFFFFFF)
    return make_error("cuda::argmax_rows: rows=" + std::to_string(rows) + ", vocab=" + std::to_string(vocab));
  if (!logits || !tokens) return make_error("cuda::argmax_rows: logits and tokens are required");
  if (rows == 0) return Status::Ok();
  argmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, tokens);
  return launch_status("argmax_kernel");
}

Status sample_rows(const SampleArgs& a, cudaStream_t stream) {
  if (a.rows < 0 || a.rows > 0x7FFFFFFF || a.vocab <= 0 || a.vocab >= 0x7FFFFFFF)
    return make_error("cuda::sample_rows: rows=" + std::to_string(a.rows) + ", vocab=" + std::to_string(a.vocab));
  if (!a.logits || !a.params || !a.rng || !a.workspace || !a.tokens)
    return make_error("cuda::sample_rows: logits, params, rng, workspace and tokens are required");
  if (a.rows == 0) return Status::Ok();
  sample_kernel<<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a);
  return launch_status("sample_kernel");
}

const void* argmax_kernel_ptr() { return reinterpret_cast<const void*>(&argmax_kernel); }
const void* sample_kernel_ptr() { return reinterpret_cast<const void*>(&sample_kernel); }

}  // namespace cedar::cuda
