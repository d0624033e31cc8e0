// MXFP4 GEMV over the packed expert layout (ffn_kernels.h): the plain kernel's arithmetic with a
// cheaper memory side. Per K block a plain-layout thread loads 4 weight bytes of each of its 2 rows, 2
// scale bytes, 16 activation bytes and 2 activation scales (~1 byte per load instruction); here one
// 16-byte load brings a thread's bytes of 4 consecutive K blocks of a row (the packed permutation), one
// 32-bit load their 4 scales, one float4 the 4 activation scales of a token, and each warp covers 32
// rows (two m16 tiles) so every activation fragment feeds two MMAs: ~5 weight bytes per load. Each
// word is stored in the f16 placement (gemv_common.cuh e2m1_f16_word): the codes sit where an f16's
// bits are, so 8 values become MMA operands in 9 integer ops, with no e4m3 detour and no cvt.
//
// Bit-equality with the plain kernel (no split-K): each warp takes the plain kernel's K runs (8
// consecutive blocks, runs strided by 8 warps), accumulates the same MMA results (scaled by the exact
// 2^-8 of the placement, undone on the activation scale) with the same expression in the same block
// order, and the warps' partials are added in warp order — per 16-row tile exactly the plain computation. (The plain kernel's padding blocks past the end of K add ±0,
// which can only change the sign of an exact zero.)
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/ffn_kernels.h"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma_bf16.cuh"

namespace cedar::cuda {
namespace {

using namespace gemv_detail;

constexpr int kPackedRows = 32;  // rows per block (and per warp): two m16 tiles
constexpr int kRun = 8;          // K blocks per warp run (= the plain MXFP4 kernel's kUnroll)
static_assert(kRun == kUnroll<true>, "the K partition must match the plain MXFP4 kernel");

struct PackedParams {
  GemvOperands ops[kMaxGroup];  // host-item mode: contiguous token rows
  int n;                        // host-item mode: tokens in this tile
  const DeviceGemvItem* items;  // device-item mode
  const int32_t* count;
  int64_t capacity;
  int64_t group;  // host-item mode: matrices
  int64_t out, in, tiles;
  bool bf16_output;
  bool balanced;  // false: the plain kernel's K schedule (8 warps)
  int warps;      // = blockDim.x / 32
  unsigned* work;  // device-item mode, or null: [next unit, blocks done] (GemvItemsOptions::work)
};

// The operands of one (matrix, tile) unit.
struct UnitOperands {
  const uint8_t* w;
  const uint8_t* ws;
  const uint16_t* act;
  const float* as;
  float* y;
  int n;
  const int32_t* act_row;  // null: row j
  const int32_t* y_row;
};

__device__ __forceinline__ int64_t row_of(const int32_t* rows, int j) { return rows ? rows[j] : j; }

// One group of 4 K blocks (q = group index) of a thread's 4 rows (tile 0: rows g, g+8; tile 1: g+16,
// g+24): loads first (4 weight vectors, 4 scale words, 4 activation fragments, 2 activation-scale
// vectors), then 16 MMAs accumulated exactly as the plain kernel does per block.
struct GroupLoads {
  uint4 w[4];
  uint32_t s[4];
  uint4 act[4];
  float4 sa0, sa1;
};

__device__ __forceinline__ void load_group(const uint8_t* const (&wp)[4], const uint8_t* const (&sp)[4],
                                           const uint16_t* a_row, const float* as0, const float* as1, int q,
                                           GroupLoads& L) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    L.w[i] = detail::ld_weight(reinterpret_cast<const uint4*>(wp[i] + q * 64));
    L.s[i] = detail::ld_weight(reinterpret_cast<const uint32_t*>(sp[i] + q * 4));
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) L.act[u] = __ldg(reinterpret_cast<const uint4*>(a_row + (q * 4 + u) * 32));
  L.sa0 = __ldg(reinterpret_cast<const float4*>(as0 + q * 4));
  L.sa1 = __ldg(reinterpret_cast<const float4*>(as1 + q * 4));
}

__device__ __forceinline__ float comp_of(const float4& v, int u) {
  return u == 0 ? v.x : u == 1 ? v.y : u == 2 ? v.z : v.w;
}

template <bool kOne, bool kExpAdd>
__device__ __forceinline__ void compute_group(const GroupLoads& L, float (&acc)[2][4]) {
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const uint32_t w[4] = {word_of(L.w[0], u), word_of(L.w[1], u), word_of(L.w[2], u), word_of(L.w[3], u)};
    const uint32_t b[4] = {(L.s[0] >> (8 * u)) & 0xFFu, (L.s[1] >> (8 * u)) & 0xFFu, (L.s[2] >> (8 * u)) & 0xFFu,
                           (L.s[3] >> (8 * u)) & 0xFFu};
    packed_block_math<kOne, kExpAdd>(w, b, L.act[u], comp_of(L.sa0, u), comp_of(L.sa1, u), acc);
  }
}

// A warp's K groups of one unit (the plain schedule or the balanced one), accumulated into acc.
struct UnitStream {
  const uint8_t* const (&wp)[4];
  const uint8_t* const (&sp)[4];
  const uint16_t* a_row;
  const float* as0;
  const float* as1;
  int n_kb, warp, warps;
  bool balanced;
};

template <bool kOne, bool kExpAdd>
__device__ __forceinline__ void unit_k_loop(const UnitStream& u, float (&acc)[2][4]) {
  if (!u.balanced) {
    for (int kb0 = u.warp * kRun; kb0 < u.n_kb; kb0 += kGemvWarps * kRun) {
      const int q0 = kb0 / 4;
      if (kb0 + kRun <= u.n_kb) {  // a whole run: both groups' loads in flight, then the math in block order
        GroupLoads L0, L1;
        load_group(u.wp, u.sp, u.a_row, u.as0, u.as1, q0, L0);
        load_group(u.wp, u.sp, u.a_row, u.as0, u.as1, q0 + 1, L1);
        compute_group<kOne, kExpAdd>(L0, acc);
        compute_group<kOne, kExpAdd>(L1, acc);
      } else {  // the last, half run (u.n_kb % 8 == 4)
        GroupLoads L0;
        load_group(u.wp, u.sp, u.a_row, u.as0, u.as1, q0, L0);
        compute_group<kOne, kExpAdd>(L0, acc);
      }
    }
  } else {
    // A contiguous range of groups per warp (the ranges of the W warps differ by at most one group), two
    // in flight: the pair's second group sits at fixed offsets from the first, and the row pointers step by
    // constants, so the loads need no per-group address arithmetic (s12: ~2.4 integer ops per MMA).
    const int n_groups = u.n_kb / 4, W = u.warps;
    const int q_begin = n_groups * u.warp / W, q_end = n_groups * (u.warp + 1) / W;
    const uint8_t* wp[4];
    const uint8_t* sp[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      wp[i] = u.wp[i] + q_begin * 64;
      sp[i] = u.sp[i] + q_begin * 4;
    }
    const uint16_t* a_row = u.a_row + q_begin * 128;
    const float* as0 = u.as0 + q_begin * 4;
    const float* as1 = u.as1 + q_begin * 4;
    int left = q_end - q_begin;
    for (; left >= 2; left -= 2) {
      GroupLoads L0, L1;
      load_group(wp, sp, a_row, as0, as1, 0, L0);
      load_group(wp, sp, a_row, as0, as1, 1, L1);
      compute_group<kOne, kExpAdd>(L0, acc);
      compute_group<kOne, kExpAdd>(L1, acc);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        wp[i] += 2 * 64;
        sp[i] += 2 * 4;
      }
      a_row += 2 * 128;
      as0 += 2 * 4;
      as1 += 2 * 4;
    }
    if (left > 0) {
      GroupLoads L0;
      load_group(wp, sp, a_row, as0, as1, 0, L0);
      compute_group<kOne, kExpAdd>(L0, acc);
    }
  }
}

// Block = 32 rows of one matrix (8 warps splitting K as the plain kernel); blocks loop over the
// (matrix, row tile) units.
template <bool kDeviceItems, bool kExpAdd = false>
__global__ void __launch_bounds__(kGemvWarps * 32, kMinBlocksPerSm<true>) gemv_mxfp4_packed_kernel(PackedParams p) {
  // The warps' partial sums, [p.warps][kPackedRows][kTokensPerTile]: dynamic, sized by the split (4 KB at the
  // default 4 warps instead of a static 8 KB), so that the blocks an SM holds need a smaller shared-memory
  // carveout (a change of carveout between kernels drains the SM).
  extern __shared__ float partial[];
  // Under PDL (device items): the item table and the activations come from the previous kernels.
  detail::pdl_launch_dependents();
  detail::pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tok0 = 2 * t, tok1 = 2 * t + 1;
  const int n_kb = static_cast<int>(p.in / 32);  // a multiple of 4
  const int64_t w_stride = p.in / 2;
  int64_t matrices = p.group;
  if constexpr (kDeviceItems) {
    matrices = *p.count;
    matrices = matrices < 0 ? 0 : (matrices > p.capacity ? p.capacity : matrices);
  }
  const int64_t units = matrices * p.tiles;
  // Block b's first unit is b. With a work counter the later ones (grid, grid + 1, ...) are taken in order
  // by whichever block is free (thread 0 asks for the next one while the block computes this one); else
  // block b takes b + grid, b + 2·grid, ... The first unit is not claimed: when blocks outnumber units (batch
  // 1 at 2 warps: 864 units, 1 056 blocks) claims would give every unit to the blocks that started first —
  // under PDL those sit in whatever slots the previous kernel left free, on a few SMs (s19 run 1: the routed
  // path 55 → 83 µs at 2 warps); b → unit b spreads the units as the scheduler spreads the blocks.
  __shared__ int64_t next_unit;
  unsigned* const work = kDeviceItems ? p.work : nullptr;
  for (int64_t unit = blockIdx.x; unit < units; unit = work ? next_unit : unit + gridDim.x) {
    int64_t claimed = 0;
    if (work != nullptr && threadIdx.x == 0) claimed = gridDim.x + int64_t{atomicAdd(work, 1u)};  // used after the math
    const int64_t m = unit / p.tiles;
    const int64_t row0 = (unit % p.tiles) * kPackedRows;
    UnitOperands op;
    if constexpr (kDeviceItems) {
      const DeviceGemvItem* it = p.items + m;
      op = UnitOperands{it->data,       it->scales, it->act_codes,
                        it->act_scales, it->y,      min(max(it->n, 0), kTokensPerTile),
                        it->act_row,    it->y_row};
    } else {
      const GemvOperands& o = p.ops[m];
      op = UnitOperands{o.w, o.w_scales, o.act, o.act_scales, o.y, p.n, nullptr, nullptr};
    }
    // Rows past `out` and tokens past n read row 0 / token 0 (valid memory; never written).
    const uint8_t* wp[4];
    const uint8_t* sp[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = row0 + g + 8 * i;
      const int64_t rr = r < p.out ? r : 0;
      wp[i] = op.w + rr * w_stride + t * 16;
      sp[i] = op.ws + rr * n_kb;
    }
    const uint16_t* a_row = op.act + row_of(op.act_row, g < op.n ? g : 0) * p.in + t * 8;
    const float* as0 = op.as + row_of(op.act_row, tok0 < op.n ? tok0 : 0) * n_kb;
    const float* as1 = op.as + row_of(op.act_row, tok1 < op.n ? tok1 : 0) * n_kb;
    float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    const UnitStream us{wp, sp, a_row, as0, as1, n_kb, warp, p.warps, p.balanced};
    if (op.n == 1) unit_k_loop<true, kExpAdd>(us, acc);  // block-uniform branch
    else unit_k_loop<false, kExpAdd>(us, acc);
#pragma unroll
    for (int rt = 0; rt < 2; ++rt) {
      float* pw = partial + warp * kPackedRows * kTokensPerTile;
      pw[(16 * rt + g) * kTokensPerTile + tok0] = acc[rt][0];
      pw[(16 * rt + g) * kTokensPerTile + tok1] = acc[rt][1];
      pw[(16 * rt + g + 8) * kTokensPerTile + tok0] = acc[rt][2];
      pw[(16 * rt + g + 8) * kTokensPerTile + tok1] = acc[rt][3];
    }
    __syncthreads();  // every thread has read `unit`: next_unit may change
    if (work != nullptr && threadIdx.x == 0) next_unit = claimed;
    for (int e = threadIdx.x; e < kPackedRows * kTokensPerTile; e += blockDim.x) {
      const int row = e / kTokensPerTile, tok = e % kTokensPerTile;
      float sum = 0.0f;
      for (int ww = 0; ww < p.warps; ++ww)  // warp order, as the plain kernel
        sum += partial[(ww * kPackedRows + row) * kTokensPerTile + tok];
      if (tok < op.n && row0 + row < p.out)
        op.y[row_of(op.y_row, tok) * p.out + row0 + row] = p.bf16_output ? detail::round_bf16(sum) : sum;
    }
    __syncthreads();  // `partial` is reused by the next unit; next_unit is visible
  }
  // Re-arm: a block counts itself done after its last claim, so the last one to count sees every claim
  // made; the next launch starts after this grid completes (stream order; under PDL after its wait).
  if (work != nullptr && threadIdx.x == 0 && atomicAdd(work + 1, 1u) == gridDim.x - 1) {
    work[0] = 0;
    work[1] = 0;
  }
}

Status check_packed_shape(const QuantWeightView& w, const char* who) {
  if (w.format != QuantWeightFormat::MXFP4) return make_error(std::string(who) + ": the packed layout is MXFP4 only");
  if (!mxfp4_packable(w.out, w.in))
    return make_error(std::string(who) + ": shape " + std::to_string(w.out) + "×" + std::to_string(w.in) +
                      " cannot use the packed layout (in must be a positive multiple of 128)");
  return Status::Ok();
}

// Dynamic shared memory of a block of `warps` warps: its partial sums.
size_t partial_bytes(int warps) { return sizeof(float) * static_cast<size_t>(warps) * kPackedRows * kTokensPerTile; }

bool misaligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a != 0; }

// Warps per block: 8 for the plain schedule; balanced: the W in 8..4 that spreads the K groups most
// evenly (groups / (W·ceil(groups / W)), ties to more warps).
int packed_warps(int64_t in, bool balanced) {
  if (!balanced) return kGemvWarps;
  const int64_t groups = in / 128;
  int best = kGemvWarps;
  double best_eff = 0;
  for (int w = kGemvWarps; w >= 4; --w) {
    const double eff = static_cast<double>(groups) / (w * ((groups + w - 1) / w));
    if (eff > best_eff + 1e-9) {
      best_eff = eff;
      best = w;
    }
  }
  return best;
}

}  // namespace

bool mxfp4_packable(int64_t out, int64_t in) {
  return out > 0 && in > 0 && in % 128 == 0 && in / 32 <= 0x3FFFFFF &&
         (out + kPackedRows - 1) / kPackedRows <= 0x7FFFFFFF;
}

bool mxfp4_scales_allow_exp_add(const uint8_t* scales, size_t count) {
  if (scales == nullptr) return false;
  for (size_t i = 0; i < count; ++i)
    if (scales[i] < 9 || scales[i] > 127) return false;
  return true;
}

Status repack_mxfp4(const uint8_t* plain, int64_t out, int64_t in, uint8_t* packed) {
  if (!mxfp4_packable(out, in))
    return make_error("repack_mxfp4: shape " + std::to_string(out) + "×" + std::to_string(in) +
                      " (in must be a positive multiple of 128)");
  if (plain == nullptr || packed == nullptr || plain == packed)
    return make_error("repack_mxfp4: distinct non-null source and destination are required");
  const int64_t row_bytes = in / 2;
  for (int64_t r = 0; r < out; ++r) {
    const uint8_t* src = plain + r * row_bytes;
    uint8_t* dst = packed + r * row_bytes;
    for (int64_t q = 0; q < row_bytes / 64; ++q)
      for (int t = 0; t < 4; ++t)
        for (int u = 0; u < 4; ++u) {
          // Thread t's 4 bytes of K block 4q + u (values 8t .. 8t + 7, low nibble first) → one word in
          // the f16 placement (gemv_common.cuh e2m1_f16_word), stored little-endian.
          const uint8_t* b = src + 64 * q + 16 * u + 4 * t;
          const uint8_t code[8] = {uint8_t(b[0] & 15), uint8_t(b[0] >> 4), uint8_t(b[1] & 15), uint8_t(b[1] >> 4),
                                   uint8_t(b[2] & 15), uint8_t(b[2] >> 4), uint8_t(b[3] & 15), uint8_t(b[3] >> 4)};
          const uint32_t w = e2m1_f16_word(code);
          for (int j = 0; j < 4; ++j) dst[64 * q + 16 * t + 4 * u + j] = static_cast<uint8_t>(w >> (8 * j));
        }
  }
  return Status::Ok();
}

Status gemv_mxfp4_packed_grouped(const QuantWeightView& shape, const GemvGroupItem* items, int64_t count, int64_t n,
                                 bool bf16_output, cudaStream_t stream, bool balanced) {
  const char* who = "cuda::gemv_mxfp4_packed";
  CEDAR_RETURN_IF_ERROR(check_packed_shape(shape, who));
  if (count < 0 || (count > 0 && items == nullptr) || n < 0)
    return make_error(std::string(who) + ": count=" + std::to_string(count) + ", n=" + std::to_string(n));
  const int64_t n_kb = shape.in / 32;
  for (int64_t i = 0; i < count; ++i) {
    const GemvGroupItem& it = items[i];
    if (!it.data || !it.scales || !it.act_codes || !it.act_scales || !it.y)
      return make_error(std::string(who) + ": item " + std::to_string(i) + " has a null pointer");
    if (misaligned(it.data, 16) || misaligned(it.scales, 4) || misaligned(it.act_codes, 16) ||
        misaligned(it.act_scales, 16))
      return make_error(std::string(who) + ": item " + std::to_string(i) +
                        " misaligned (weights and activations 16 bytes, scales 4 bytes)");
    if (it.act_row_stride != 0 || it.act_scale_row_stride != 0 || it.y_row_stride != 0)
      return make_error(std::string(who) + ": item " + std::to_string(i) +
                        " has row strides (act_row_stride, act_scale_row_stride, y_row_stride): the packed layout "
                        "takes contiguous rows only");
  }
  const int64_t tiles = (shape.out + kPackedRows - 1) / kPackedRows;
  for (int64_t g0 = 0; g0 < count; g0 += kMaxGroup) {
    const int64_t group = std::min<int64_t>(kMaxGroup, count - g0);
    for (int64_t t0 = 0; t0 < n; t0 += kTokensPerTile) {
      PackedParams p{};
      for (int64_t i = 0; i < group; ++i) {
        const GemvGroupItem& it = items[g0 + i];
        p.ops[i] = GemvOperands{it.data, it.scales, it.act_codes + t0 * shape.in, it.act_scales + t0 * n_kb,
                                it.y + t0 * shape.out};
      }
      p.n = static_cast<int>(std::min<int64_t>(n - t0, kTokensPerTile));
      p.group = group;
      p.out = shape.out;
      p.in = shape.in;
      p.tiles = tiles;
      p.bf16_output = bf16_output;
      p.balanced = balanced;
      p.warps = packed_warps(shape.in, balanced);
      const auto grid = static_cast<unsigned>(std::min<int64_t>(tiles * group, 0x7FFFFFFF));
      gemv_mxfp4_packed_kernel<false><<<grid, p.warps * 32, partial_bytes(p.warps), stream>>>(p);
      CEDAR_RETURN_IF_ERROR(launch_status("gemv_mxfp4_packed_kernel"));
    }
  }
  return Status::Ok();
}

Status gemv_mxfp4_packed(const QuantWeightView& w, const uint16_t* act_codes, const float* act_scales, int64_t n,
                         float* y, bool bf16_output, cudaStream_t stream, bool balanced) {
  const GemvGroupItem item{w.data, w.scales, act_codes, act_scales, y};
  return gemv_mxfp4_packed_grouped(w, &item, 1, n, bf16_output, stream, balanced);
}

namespace gemv_detail {
// Resident blocks per SM of the item kernel at `warps` per block (register-bound: 128 registers per
// thread, so 16 warps per SM whatever the split); 0 if the query fails.
int packed_items_blocks_per_sm(int warps) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_mxfp4_packed_kernel<true>, warps * 32,
                                                    partial_bytes(warps)) !=
          cudaSuccess ||
      per_sm <= 0) {
    (void)cudaGetLastError();
    return 0;
  }
  return per_sm;
}

// The split of the item kernel when none is forced (balanced schedule): 4 warps per block (4 resident
// blocks per SM: 16 warps, as 2 blocks of 8), whatever the shape or the item count. Fastest or level at
// every released decode shape (s18 runs 1-2, routed top-6 of 384, µs): w1/w3 (5 120 = 40 groups) n = 1
// 4 warps 31.1 / 31.2, 8 warps (the former choice there) 31.4 / 31.7; n = 8 179.6 vs 217.0; w2 (2 304 =
// 18 groups) n = 1 18.2 / 18.4 vs 24.5 / 24.9. One split at every batch also keeps a token's rows
// independent of the batch it decodes in (the K partition, hence the summation order, is the same).
constexpr int kItemsWarps = 4;

Status gemv_mxfp4_packed_items(const QuantWeightView& shape, const DeviceGemvItem* items, const int32_t* count,
                               int64_t capacity, bool bf16_output, cudaStream_t stream, bool balanced,
                               const GemvItemsOptions& options) {
  const int warps = options.packed_warps;
  const char* who = "cuda::gemv_quantized_items(packed)";
  CEDAR_RETURN_IF_ERROR(check_packed_shape(shape, who));
  if (items == nullptr || count == nullptr || capacity <= 0 || capacity > (int64_t{1} << 24))
    return make_error(std::string(who) + ": items, count and a capacity in [1, 2^24] are required (capacity " +
                      std::to_string(capacity) + ")");
  static_assert(kForcedSplitMaxWarps == kGemvWarps, "the partial sums and launch bounds allow kGemvWarps warps");
  if (warps != 0 && (!balanced || warps < kForcedSplitMinWarps || warps > kForcedSplitMaxWarps))
    return make_error(std::string(who) + ": warps=" + std::to_string(warps) +
                      " (a forced split needs the balanced schedule and " +
                      std::to_string(kForcedSplitMinWarps) + ".." + std::to_string(kForcedSplitMaxWarps) + " warps)");
  PackedParams p{};
  p.items = items;
  p.count = count;
  p.capacity = capacity;
  p.out = shape.out;
  p.in = shape.in;
  p.tiles = (shape.out + kPackedRows - 1) / kPackedRows;
  p.bf16_output = bf16_output;
  p.balanced = balanced;
  p.work = options.work;
  p.warps = warps != 0 ? warps : balanced ? kItemsWarps : packed_warps(shape.in, false);
  // One wave of resident blocks (fewer warps per block: more blocks per SM).
  const int per_sm = std::max(packed_items_blocks_per_sm(p.warps), kMinBlocksPerSm<true>);
  const int64_t wave = static_cast<int64_t>(per_sm) * device_sm_count();
  const auto grid = static_cast<unsigned>(std::min<int64_t>(capacity * p.tiles, wave));
  return launch_kernel(options.scale_exp_add ? gemv_mxfp4_packed_kernel<true, true> : gemv_mxfp4_packed_kernel<true>,
                       dim3(grid), dim3(p.warps * 32), partial_bytes(p.warps), stream, options.programmatic_launch,
                       "gemv_mxfp4_packed_kernel<items>", p);
}
}  // namespace gemv_detail

const void* gemv_mxfp4_packed_kernel_ptr() { return reinterpret_cast<const void*>(&gemv_mxfp4_packed_kernel<false>); }
const void* gemv_mxfp4_packed_items_kernel_ptr() {
  return reinterpret_cast<const void*>(&gemv_mxfp4_packed_kernel<true>);
}

}  // namespace cedar::cuda
