// Engram on the device (§3.9): n-gram hash rows with the per-sequence history in device memory, the
// table gather + dequant fused with the FP8 activation quantization of the wkv input, and the gated
// update of the hc streams.
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/ffn_device.cuh"
#include "backend/cuda/ffn_kernels.h"

namespace cedar::cuda {
namespace {

constexpr int kHashThreads = 128;
constexpr int kMaxNgram = 16;        // look-back window the kernels hold in registers
constexpr int kGatherThreads = 256;  // 8 warps = 8 table rows per block
constexpr int kUpdateThreads = 256;

__device__ __forceinline__ int64_t floor_mod(int64_t a, int64_t m) {
  const int64_t r = a % m;
  return r < 0 ? r + m : r;
}

// Compressed id of a launch token (−1 for an image token), as EngramHasher::hash_chunk maps it.
__device__ __forceinline__ int32_t compressed_id(const EngramHashArgs& a, int64_t i) {
  if (a.is_image && a.is_image[i]) return -1;
  int64_t tok = a.tokens[i];
  tok = tok < 0 ? 0 : (tok >= a.map_size ? a.map_size - 1 : tok);
  return a.token_map[tok];
}

// One thread per token: the history c_0..c_{N−1} (from this launch or the sequence's ring, with the
// sticky pad rule), then the rows of every layer slot.
__global__ void __launch_bounds__(kHashThreads) engram_hash_kernel(EngramHashArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kHashThreads + threadIdx.x;
  if (i >= a.n) return;
  const int64_t N = a.layout.max_ngram, look_back = N - 1, heads = a.layout.n_heads, cols = look_back * heads;
  const int32_t s = a.seq[i];
  const int64_t p = a.pos[i];
  const int64_t j = p - a.next_pos[s];  // index of this token within its sequence's run in the launch
  int64_t ctx[kMaxNgram];
  bool blocked = false;
  for (int64_t k = 0; k <= look_back; ++k) {
    int32_t c = a.pad;
    if (!(blocked || p < k)) {
      const int32_t id =
          k <= j ? compressed_id(a, i - k) : a.recent[static_cast<int64_t>(s) * look_back + (p - k) % look_back];
      blocked = id < 0;
      c = blocked ? a.pad : id;
    } else {
      blocked = true;
    }
    ctx[k] = c;
  }
  const int64_t* mult_all = a.layout.table;
  const int64_t* prime_all = mult_all + a.layout.n_slots * N;
  const int64_t* offset_all = prime_all + a.layout.n_slots * cols;
  for (int64_t slot = 0; slot < a.layout.n_slots; ++slot) {
    const int64_t* mult = mult_all + slot * N;
    const int64_t* prime = prime_all + slot * cols;
    const int64_t* offset = offset_all + slot * cols;
    int64_t* out = a.rows + (slot * a.n + i) * cols;
    // int64 products and XOR with wraparound, computed in uint64 (EngramLayout::rows).
    uint64_t rolling = static_cast<uint64_t>(ctx[0]) * static_cast<uint64_t>(mult[0]);
    for (int64_t ng = 1; ng < N; ++ng) {
      rolling ^= static_cast<uint64_t>(ctx[ng]) * static_cast<uint64_t>(mult[ng]);
      const auto hash = static_cast<int64_t>(rolling);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t col = (ng - 1) * heads + h;
        out[col] = floor_mod(hash, prime[col]) + offset[col];
      }
    }
  }
}

// After the rows: each sequence's last N−1 ids go to its ring and next_pos moves past the run
// (separate launch: the hash kernel reads the old ring).
__global__ void __launch_bounds__(kHashThreads) engram_history_kernel(EngramHashArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kHashThreads + threadIdx.x;
  if (i >= a.n) return;
  const int64_t look_back = a.layout.max_ngram - 1;
  const int32_t s = a.seq[i];
  const int64_t p = a.pos[i];
  int64_t following = 0;  // tokens of the same run after this one, capped at look_back
  while (following < look_back && i + following + 1 < a.n && a.seq[i + following + 1] == s) ++following;
  if (following < look_back) a.recent[static_cast<int64_t>(s) * look_back + p % look_back] = compressed_id(a, i);
  if (following == 0) a.next_pos[s] = p + 1;
}

// One warp per table row (a token's column): lane = 8 channels (8 bytes of FP8 codes or 16 of bf16),
// a quad = one 32-channel scale block; dequant as engram_gather, then quantize_act_fp8's recipe.
__global__ void __launch_bounds__(kGatherThreads) engram_gather_kernel(EngramGatherArgs a) {
  const int64_t row_idx = (static_cast<int64_t>(blockIdx.x) * kGatherThreads + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row_idx >= a.n * a.cols) return;  // whole warps
  const int64_t hd = a.head_dim, chunks = hd / 8;
  const int64_t r = a.rows[row_idx];
  const bool ok = r >= 0 && r < a.table_rows;
  if (!ok && lane == 0 && a.bad_row)
    atomicMax(a.bad_row, static_cast<int32_t>(row_idx < 0x7FFFFFFE ? row_idx + 1 : 0x7FFFFFFF));
  const int64_t rr = ok ? r : 0;
  const int64_t out0 = row_idx * hd;                   // E is [n, cols·hd]: token t, column c at (t·cols + c)·hd
  for (int64_t base = 0; base < chunks; base += 32) {  // every lane iterates (the quads shuffle)
    const int64_t ch = base + lane;
    const bool live = ch < chunks;
    float v[8];
    if (live && ok) {
      if (a.bf16_table) {
        const uint4 w = *reinterpret_cast<const uint4*>(a.table + (rr * hd + ch * 8) * 2);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          v[2 * k] = detail::bf16_bits_to_float(words[k] & 0xFFFFu);
          v[2 * k + 1] = detail::bf16_bits_to_float(words[k] >> 16);
        }
      } else {
        const uint2 w = *reinterpret_cast<const uint2*>(a.table + rr * hd + ch * 8);
        const float s = detail::ue8m0_to_float(a.table_scale[rr * (hd / 32) + ch / 4]);
        const uint32_t words[2] = {w.x, w.y};
#pragma unroll
        for (int k = 0; k < 8; ++k)
          v[k] = detail::round_bf16(__fmul_rn(detail::e4m3_to_float((words[k / 4] >> (8 * (k % 4))) & 0xFFu), s));
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = 0.0f;
    }
    if (live && a.E) {
      float4* dst = reinterpret_cast<float4*>(a.E + out0 + ch * 8);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    if (a.codes) {
      float m = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[k]));
      const float block_amax = detail::quad_max(m);
      if (live) {
        float s = 0.0f;
        uint32_t q[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) q[k] = detail::quantize_act_value(v[k], block_amax, &s);
        *reinterpret_cast<uint4*>(a.codes + out0 + ch * 8) =
            make_uint4(q[0] | (q[1] << 16), q[2] | (q[3] << 16), q[4] | (q[5] << 16), q[6] | (q[7] << 16));
        if ((lane & 3) == 0) a.scales[(out0 + ch * 8) / 32] = s;
      }
    }
  }
}

// One block per (token, stream): the three sums over d (fixed blocked order), the gate, the update.
__global__ void __launch_bounds__(kUpdateThreads) engram_update_kernel(EngramUpdateArgs a) {
  __shared__ float scratch[32];
  __shared__ float gate_s;
  const int64_t t = blockIdx.x / a.hc, k = blockIdx.x % a.hc, d = a.d;
  float* x = a.X + (t * a.hc + k) * d;
  const float* key = a.kv + t * (a.hc + 1) * d + k * d;
  const float* value = a.kv + t * (a.hc + 1) * d + a.hc * d;
  const float* wk = a.qk + k * d;
  float dot = 0.0f, ssx = 0.0f, ssk = 0.0f;
  for (int64_t c = threadIdx.x; c < d; c += kUpdateThreads) {
    const float xv = x[c], kv = key[c];
    dot = fmaf(__fmul_rn(xv, wk[c]), kv, dot);  // x·wk is exact (bf16 × product of two bf16)
    ssx = fmaf(xv, xv, ssx);
    ssk = fmaf(kv, kv, ssk);
  }
  dot = detail::block_sum(dot, scratch);
  ssx = detail::block_sum(ssx, scratch);
  ssk = detail::block_sum(ssk, scratch);
  if (threadIdx.x == 0) {
    const float fd = static_cast<float>(d);
    const float rstd = (1.0f / sqrtf(ssx / fd + a.norm_eps)) * (1.0f / sqrtf(ssk / fd + a.norm_eps));
    const float inv_sqrt_d = static_cast<float>(1.0 / sqrt(static_cast<double>(d)));
    const float dd = __fmul_rn(__fmul_rn(dot, rstd), inv_sqrt_d);
    const bool image = a.is_image && a.is_image[t];
    float g = 0.0f;
    if (!image) {  // engram_gate: sigmoid(copysign(sqrt(max(|dot|, 1e-6)), dot))
      const float root = copysignf(sqrtf(fmaxf(fabsf(dd), 1e-6f)), dd);
      g = 1.0f / __fadd_rn(1.0f, detail::expf_cr(-root));
    }
    gate_s = g;
    if (a.gates) a.gates[t * a.hc + k] = g;
  }
  __syncthreads();
  const float g = gate_s;
  for (int64_t c = threadIdx.x; c < d; c += kUpdateThreads)
    x[c] = detail::round_bf16(__fadd_rn(x[c], __fmul_rn(g, value[c])));
}

}  // namespace

Status engram_hash(const EngramHashArgs& a, cudaStream_t stream) {
  auto fail = [](const std::string& m) { return make_error("cuda::engram_hash: " + m); };
  const EngramHashTables& l = a.layout;
  if (l.n_slots < 1 || l.max_ngram < 2 || l.max_ngram > kMaxNgram || l.n_heads < 1 || !l.table)
    return fail("layout n_slots=" + std::to_string(l.n_slots) + ", max_ngram=" + std::to_string(l.max_ngram) + " (2.." +
                std::to_string(kMaxNgram) + "), n_heads=" + std::to_string(l.n_heads) + ", table required");
  if (a.n < 0 || a.map_size <= 0 || !a.token_map) return fail("n=" + std::to_string(a.n) + ", token map required");
  if (a.n == 0) return Status::Ok();
  if (!a.tokens || !a.seq || !a.pos || !a.recent || !a.next_pos || !a.rows)
    return fail("tokens, seq, pos, recent, next_pos and rows are required");
  const auto grid = static_cast<unsigned>((a.n + kHashThreads - 1) / kHashThreads);
  engram_hash_kernel<<<grid, kHashThreads, 0, stream>>>(a);
  CEDAR_RETURN_IF_ERROR(launch_status("engram_hash_kernel"));
  engram_history_kernel<<<grid, kHashThreads, 0, stream>>>(a);
  return launch_status("engram_history_kernel");
}

Status engram_gather_quant(const EngramGatherArgs& a, cudaStream_t stream) {
  auto fail = [](const std::string& m) { return make_error("cuda::engram_gather_quant: " + m); };
  if (a.n < 0 || a.cols <= 0 || a.head_dim <= 0 || a.head_dim % 32 != 0)
    return fail("n=" + std::to_string(a.n) + ", cols=" + std::to_string(a.cols) +
                ", head_dim=" + std::to_string(a.head_dim) + " (a positive multiple of 32)");
  if (!a.rows || !a.table || a.table_rows <= 0 || (!a.bf16_table && !a.table_scale))
    return fail("rows, a table (with scales unless bf16) and table_rows are required");
  if ((!a.E && !a.codes) || (a.codes && !a.scales)) return fail("an output (E, or codes with scales) is required");
  const uintptr_t need = a.bf16_table ? 16 : 8;
  if (reinterpret_cast<uintptr_t>(a.table) % need != 0 || reinterpret_cast<uintptr_t>(a.E) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.codes) % 16 != 0)
    return fail("table (8 bytes, bf16: 16), E and codes (16 bytes) must be aligned");
  const int64_t warps = a.n * a.cols;
  if (warps == 0) return Status::Ok();
  const int64_t grid = (warps * 32 + kGatherThreads - 1) / kGatherThreads;
  if (grid > 0x7FFFFFFF) return fail("too many rows");
  engram_gather_kernel<<<static_cast<unsigned>(grid), kGatherThreads, 0, stream>>>(a);
  return launch_status("engram_gather_kernel");
}

Status engram_update(const EngramUpdateArgs& a, cudaStream_t stream) {
  if (a.n < 0 || a.hc <= 0 || a.d <= 0 || a.n * a.hc > 0x7FFFFFFF)
    return make_error("cuda::engram_update: n=" + std::to_string(a.n) + ", hc=" + std::to_string(a.hc) +
                      ", d=" + std::to_string(a.d));
  if (!a.X || !a.kv || !a.qk) return make_error("cuda::engram_update: X, kv and qk are required");
  if (a.n == 0) return Status::Ok();
  engram_update_kernel<<<static_cast<unsigned>(a.n * a.hc), kUpdateThreads, 0, stream>>>(a);
  return launch_status("engram_update_kernel");
}

const void* engram_hash_kernel_ptr() { return reinterpret_cast<const void*>(&engram_hash_kernel); }
const void* engram_gather_kernel_ptr() { return reinterpret_cast<const void*>(&engram_gather_kernel); }
const void* engram_update_kernel_ptr() { return reinterpret_cast<const void*>(&engram_update_kernel); }

}  // namespace cedar::cuda
