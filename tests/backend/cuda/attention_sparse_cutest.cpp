// Parity of sparse_attention (window ∪ selected compressed entries, sink, inverse RoPE) with
// sparse_attention_row + RopeTable::apply over the keys attention.cpp gathers (window positions from
// the chunk's own records and the SwaRing, then the top-k entries decoded from the main KvEntries),
// and of attention_output with attention_output_projection. Batched decode rows (key split, with and
// without the split workspace), prefill chunks longer than the window, bounded replay (swa_start),
// SWA-only layers, fp32 probabilities, tiny / small / released shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "attention_cutest_util.h"
#include "backend/cpu/ops.h"
#include "kv/kv_format.h"
#include "model/attention.h"
#include "model/attention_state.h"
#include "model/sparse_attention.h"

namespace cedar::cuda {
namespace {

using testing::device_alloc;
using testing::device_filled;
using testing::parity;
using testing::to_device;
using testing::to_host;
using testing::Tolerance;

struct SeqSpec {
  int64_t pos0 = 0, n = 1;  // the call's rows of this sequence
  int64_t swa_start = 0;
  int64_t entries = 0;   // compressed entries in the KV source
  int64_t selected = 0;  // top-k ids per row (<= topk width; fewer: −1 padded)
};

struct SparseCase {
  int64_t heads = 64, head_dim = 512, rope_dim = 64, window = 128, topk = 512;
  bool compressed = true;  // false: SWA-only layer (no top-k)
  bool bf16_probabilities = true;
  bool split_workspace = true;
  std::vector<SeqSpec> seqs;
  uint32_t seed = 1;
};

void check_sparse(const SparseCase& c, const std::string& name) {
  const int64_t H = c.heads, hd = c.head_dim, W = c.window, S = static_cast<int64_t>(c.seqs.size());
  const int64_t rb = swa_record_bytes(hd);
  const cpu::RopeTable rope(testing::compress_rope_config(c.rope_dim));
  const KvRecordFormat fswa = *KvRecordFormat::make(KvRecipe::Fp8Block32Ue8m0, KvStorage::Packed, hd);
  const KvRecordFormat fmain = *KvRecordFormat::make(KvRecipe::Fp4Block16E4m3, KvStorage::Packed, hd);
  std::mt19937 rng(c.seed);

  std::vector<AttnToken> tokens;
  for (int64_t s = 0; s < S; ++s)
    append_chunk_tokens(tokens, static_cast<int32_t>(s), c.seqs[s].pos0, c.seqs[s].n, c.seqs[s].swa_start);
  const int64_t n = static_cast<int64_t>(tokens.size());

  // The call's own SWA keys: records (device) and their values (CPU), as swa_kv_encode produces them.
  std::vector<uint8_t> chunk_rec(n * rb);
  std::vector<float> chunk_val = testing::random_bf16(n * hd, c.seed + 1, -3, 1, 32);
  for (int64_t r = 0; r < n; ++r)
    ASSERT_TRUE(
        fswa.encode(std::span<float>(chunk_val).subspan(r * hd, hd), std::span<uint8_t>(chunk_rec).subspan(r * rb, rb))
            .ok());
  // Rings holding the W positions before each chunk (host SwaRing for the CPU, the same bytes on the
  // device), and the KV sources' main entries.
  std::vector<SwaRing> rings;
  std::vector<DeviceBuffer<uint8_t>> ring_rec;
  std::vector<DeviceBuffer<int64_t>> ring_pos;
  std::vector<SwaRingDesc> ring_desc;
  std::vector<KvSourceState> src(S);
  std::vector<DeviceBuffer<uint8_t>> pools;
  std::vector<DeviceBuffer<int32_t>> tables;
  std::vector<KvSourceSeq> kv_seqs;
  const int64_t epb = 16;
  for (int64_t s = 0; s < S; ++s) {
    rings.emplace_back(W, fswa);
    std::vector<uint8_t> rec(W * rb, 0);
    std::vector<int64_t> pos(W, -1);
    for (int64_t k = std::max<int64_t>(0, c.seqs[s].pos0 - W); k < c.seqs[s].pos0; ++k) {
      std::vector<float> raw = testing::random_bf16(hd, c.seed + 1000 + 7 * s + k, -3, 1, 32);
      ASSERT_TRUE(rings[s].write(k, raw).ok());
      ASSERT_TRUE(fswa.encode(raw, std::span<uint8_t>(rec).subspan((k % W) * rb, rb)).ok());
      pos[k % W] = k;
    }
    ring_rec.push_back(to_device(rec));
    ring_pos.push_back(to_device(pos));
    ring_desc.push_back(SwaRingDesc{ring_rec.back().get(), ring_pos.back().get()});
    src[s].ratio = 1;
    src[s].kv = *KvEntries::create({.format = fmain, .position_stride = 1, .entries_per_block = epb});
    const std::vector<float> lat = testing::random_bf16(c.seqs[s].entries * hd, c.seed + 2000 + s, -3, 1, 16);
    for (int64_t j = 0; j < c.seqs[s].entries; ++j)
      ASSERT_TRUE(src[s].kv.append(std::span<const float>(lat).subspan(j * hd, hd), j).ok());
    // Device pool: the host records in reversed block order.
    const int64_t blocks = std::max<int64_t>(1, (c.seqs[s].entries + epb - 1) / epb);
    std::vector<uint8_t> image(blocks * epb * fmain.record_bytes(), 0);
    std::vector<int32_t> table(blocks);
    for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(blocks - 1 - b);
    for (int64_t j = 0; j < c.seqs[s].entries; ++j)
      std::memcpy(image.data() + (table[j / epb] * epb + j % epb) * fmain.record_bytes(), src[s].kv.blocks().record(j),
                  fmain.record_bytes());
    pools.push_back(to_device(image));
    tables.push_back(to_device(table));
    kv_seqs.push_back(KvSourceSeq{
        PagedRecords{pools.back().get(), tables.back().get(), epb * fmain.record_bytes(), epb, fmain.record_bytes()},
        {}});
  }
  // Top-k ids per row: a sorted random subset, −1 padded.
  std::vector<int32_t> topk(n * c.topk, -1);
  for (int64_t r = 0; r < n && c.compressed; ++r) {
    const SeqSpec& sq = c.seqs[tokens[r].seq];
    std::vector<int32_t> all(sq.entries);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    const int64_t k = std::min(sq.selected, sq.entries);
    std::sort(all.begin(), all.begin() + k);
    std::copy_n(all.begin(), k, topk.begin() + r * c.topk);
  }
  const std::vector<float> q = testing::random_bf16(n * H * hd, c.seed + 3, -2, 1, 32);
  std::vector<float> sink(H);
  for (auto& v : sink) v = std::normal_distribution<float>(0.0f, 2.0f)(rng);

  // CPU: keys in attention.cpp's order, sparse_attention_row, inverse RoPE; and the error allowance.
  const float scale = static_cast<float>(std::pow(1.0 / static_cast<double>(hd), 0.5));
  const SparseAttentionShape shape{
      .n_heads = H, .head_dim = hd, .scale = scale, .bf16_probabilities = c.bf16_probabilities};
  std::vector<float> want(n * H * hd), allow(n * H * hd);
  std::vector<float> work, ring_buf, ent_buf;
  for (int64_t r = 0; r < n; ++r) {
    const AttnToken& tk = tokens[r];
    std::vector<const float*> keys;
    ring_buf.assign(W * hd, 0.0f);
    ent_buf.assign(c.topk * hd, 0.0f);
    for (int64_t k = std::max(tk.swa_start, tk.pos - W + 1); k <= tk.pos; ++k) {
      if (k >= tk.chunk_pos0) {
        keys.push_back(chunk_val.data() + (tk.chunk_row0 + k - tk.chunk_pos0) * hd);
      } else {
        float* b = ring_buf.data() + (k % W) * hd;
        ASSERT_TRUE(rings[tk.seq].read(k, std::span<float>(b, hd))) << "ring lacks position " << k;
        keys.push_back(b);
      }
    }
    for (int64_t i = 0; i < c.topk && c.compressed; ++i) {
      const int32_t j = topk[r * c.topk + i];
      if (j < 0) break;
      src[tk.seq].kv.read(j, std::span<float>(ent_buf.data() + i * hd, hd));
      keys.push_back(ent_buf.data() + i * hd);
    }
    std::span<float> o(want.data() + r * H * hd, H * hd);
    sparse_attention_row(std::span<const float>(q).subspan(r * H * hd, H * hd), keys, sink, shape, o, work);
    // Allowance before the rotation: (2^-7 + 2^-9)·|o| (final bf16 rounding, denominator order) plus
    // 2^-7·Σ_j p_j·|k_j[c]| / denom (each bf16(p_j) may round the other way after a dot in another order).
    std::vector<float> pre(o.begin(), o.end()), al(H * hd);
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> s(keys.size());
      double m = -INFINITY, den = 0;
      for (size_t j = 0; j < keys.size(); ++j) {
        double d = 0;
        for (int64_t ch = 0; ch < hd; ++ch) d += double(q[(r * H + h) * hd + ch]) * keys[j][ch];
        s[j] = d * scale;
        m = std::max(m, s[j]);
      }
      for (double v : s) den += std::exp(v - m);
      den += std::exp(double(sink[h]) - m);
      for (int64_t ch = 0; ch < hd; ++ch) {
        double b = 0;
        for (size_t j = 0; j < keys.size(); ++j) b += std::exp(s[j] - m) * std::fabs(keys[j][ch]);
        al[h * hd + ch] = static_cast<float>((0x1p-7 + 0x1p-9) * std::fabs(pre[h * hd + ch]) + 0x1p-7 * b / den);
      }
    }
    rope.apply(o, H, hd, tk.pos, /*inverse=*/true);
    // The rotation mixes the pair's allowances (|c|, |s| <= 1) and rounds once more.
    for (int64_t h = 0; h < H; ++h)
      for (int64_t ch = 0; ch < hd; ++ch) {
        float& a = allow[r * H * hd + h * hd + ch];
        a = al[h * hd + ch];
        if (ch >= hd - c.rope_dim) {
          const int64_t e = ch & ~int64_t{1};
          a = al[h * hd + e] + al[h * hd + e + 1] + 0x1p-7f * std::fabs(o[h * hd + ch]);
        }
      }
  }

  // GPU.
  int64_t max_pos = 0;
  for (const auto& sq : c.seqs) max_pos = std::max(max_pos, sq.pos0 + sq.n);
  const testing::DeviceRope dr = testing::device_rope(rope, max_pos);
  auto dt = to_device(tokens);
  auto dq = to_device(q);
  auto dsink = to_device(sink);
  auto dchunk = to_device(chunk_rec);
  auto drings = to_device(ring_desc);
  auto dtopk = to_device(topk);
  auto dkv = to_device(kv_seqs);
  auto dout = device_filled<float>(n * H * hd, 0xFF);
  const SparseAttnWorkspaceSize wsz = c.split_workspace
                                          ? sparse_attention_workspace_size(n, H, hd, W, c.compressed ? c.topk : 0)
                                          : SparseAttnWorkspaceSize{};
  auto dwf = device_alloc<float>(wsz.floats);
  auto dwc = device_alloc<unsigned>(wsz.counters);
  ASSERT_TRUE(dwc.zero().ok());
  const SparseAttnArgs a{.n = n,
                         .heads = H,
                         .head_dim = hd,
                         .window = W,
                         .q = dq.get(),
                         .sink = dsink.get(),
                         .scale = scale,
                         .bf16_probabilities = c.bf16_probabilities,
                         .tokens = dt.get(),
                         .chunk_records = dchunk.get(),
                         .rings = drings.get(),
                         .topk = c.compressed ? dtopk.get() : nullptr,
                         .topk_width = c.compressed ? c.topk : 0,
                         .kv_seqs = c.compressed ? dkv.get() : nullptr,
                         .rope = dr.view,
                         .out = dout.get()};
  const SparseAttnWorkspace ws{dwf.get(), dwc.get(), wsz.floats, wsz.counters};
  const Tolerance tol{.max_nmse = 1e-5, .min_cosine = 0.99999, .rel = 0, .abs = 1e-30, .bound_scale = 1.0};
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {  // the second run checks the re-armed tickets and determinism
    const Status s = sparse_attention(a, nullptr, ws);
    ASSERT_TRUE(s.ok()) << s.error().message;
    const std::vector<float> got = to_host(dout);
    EXPECT_TRUE(parity(name + (wsz.counters ? " split" : ""), got, want, tol, allow));
    if (rep == 0) {
      first = got;
    } else {
      EXPECT_EQ(std::memcmp(first.data(), got.data(), got.size() * 4), 0) << name << ": two runs differ";
    }
  }
}

TEST(CudaSparseAttention, DecodeBatchMatchesCpu) {
  CEDAR_REQUIRE_GPU_ATTN();
  // Released shapes; rows: a full window + 512 selected, a young sequence (partial window), one with
  // fewer selected entries than the width, one in bounded replay (swa_start).
  const std::vector<SeqSpec> seqs = {{.pos0 = 5000, .entries = 5001, .selected = 512},
                                     {.pos0 = 40, .entries = 41, .selected = 41},
                                     {.pos0 = 900, .entries = 901, .selected = 100},
                                     {.pos0 = 700, .swa_start = 650, .entries = 701, .selected = 512}};
  check_sparse({.seqs = seqs, .seed = 91}, "sparse_attn decode 64x512");
  check_sparse({.split_workspace = false, .seqs = seqs, .seed = 91}, "sparse_attn decode 64x512 unsplit");
  check_sparse({.bf16_probabilities = false, .seqs = seqs, .seed = 92}, "sparse_attn decode fp32 p");
}

TEST(CudaSparseAttention, PrefillChunksMatchCpu) {
  CEDAR_REQUIRE_GPU_ATTN();
  // Small shapes (8 heads: a partial head group): a 40-row chunk with a 32-slot window reads the ring
  // for its first rows and only its own records later; a second sequence replays with swa_start.
  check_sparse({.heads = 8,
                .head_dim = 128,
                .rope_dim = 32,
                .window = 32,
                .topk = 16,
                .seqs = {{.pos0 = 50, .n = 40, .entries = 90, .selected = 16},
                         {.pos0 = 64, .n = 9, .swa_start = 60, .entries = 73, .selected = 9}},
                .seed = 93},
               "sparse_attn prefill 8x128");
  check_sparse(
      {.heads = 4,
       .head_dim = 32,
       .rope_dim = 8,
       .window = 8,
       .topk = 4,
       .seqs = {{.pos0 = 0, .n = 20, .entries = 20, .selected = 4}, {.pos0 = 9, .n = 1, .entries = 10, .selected = 3}},
       .seed = 94},
      "sparse_attn tiny 4x32");
  check_sparse({.heads = 4,
                .head_dim = 32,
                .rope_dim = 8,
                .window = 8,
                .topk = 4,
                .compressed = false,
                .seqs = {{.pos0 = 3, .n = 12}, {.pos0 = 30, .n = 1}},
                .seed = 95},
               "sparse_attn tiny swa-only");
}

TEST(CudaAttentionOutput, MatchesCpuProjection) {
  CEDAR_REQUIRE_GPU_ATTN();
  const int64_t n = 3, H = 8, hd = 128, groups = 2, o_lora = 128, dim = 256, in_g = H * hd / groups;
  const std::vector<float> o = testing::random_bf16(n * H * hd, 101, -2, 1, 32);
  const std::vector<uint16_t> wo_a = testing::bf16_bits(testing::random_bf16(groups * o_lora * in_g, 102, -7, -5, 0));
  const std::vector<uint8_t> wo_a_bytes = testing::bf16_bytes(wo_a);
  std::mt19937 rng(103);
  std::vector<uint8_t> wb(dim * groups * o_lora), wbs((dim / 32) * (groups * o_lora / 32));
  for (auto& v : wb) {
    v = static_cast<uint8_t>(rng());
    if ((v & 0x7F) == 0x7F) v ^= 1;
  }
  for (auto& v : wbs) v = static_cast<uint8_t>(118 + rng() % 4);
  AttentionWeights w;
  w.wo_a = {.format = WeightFormat::BF16, .out = groups * o_lora, .in = in_g, .data = wo_a_bytes.data()};
  w.wo_b = {
      .format = WeightFormat::FP8Block, .out = dim, .in = groups * o_lora, .data = wb.data(), .scale = wbs.data()};
  AttentionParams p;
  p.n_heads = H;
  p.head_dim = hd;
  p.o_groups = groups;
  p.o_lora = o_lora;
  p.dim = dim;
  std::vector<float> want(n * dim);
  ASSERT_TRUE(attention_output_projection(o, n, w, p, want, nullptr).ok());

  auto d_o = to_device(o);
  auto dwa = to_device(wo_a);
  auto dwb = to_device(wb);
  auto dwbs = to_device(wbs);
  auto du = device_alloc<float>(n * groups * o_lora);
  auto dout = device_filled<float>(n * dim, 0xFF);
  auto dcodes = device_alloc<uint16_t>(n * groups * o_lora);
  auto dscales = device_alloc<float>(n * groups * o_lora / 32);
  const ActWorkspace act{dcodes.get(), dscales.get(), n * groups * o_lora, {}};
  const Status s = attention_output({.n = n,
                                     .o = d_o.get(),
                                     .wo_a = dwa.get(),
                                     .groups = groups,
                                     .o_lora = o_lora,
                                     .in_per_group = in_g,
                                     .u = du.get(),
                                     .wo_b = {.format = QuantWeightFormat::FP8Block,
                                              .out = dim,
                                              .in = groups * o_lora,
                                              .data = dwb.get(),
                                              .scales = dwbs.get()},
                                     .act = &act,
                                     .out = dout.get()},
                                    nullptr);
  ASSERT_TRUE(s.ok()) << s.error().message;
  // Two tested kernels in sequence: u may differ from the CPU's by one bf16 rounding (summation order),
  // which can move one FP8 activation code of wo_b's input by a step; the output agrees to ~1e-3
  // relative per element in the worst case, far better on average.
  EXPECT_TRUE(parity("attention_output 8x128 -> 256", to_host(dout), want,
                     Tolerance{.max_nmse = 1e-4, .min_cosine = 0.9999, .rel = 0.1, .abs = 1e-3}));
}

TEST(CudaSparseAttention, RejectsBadArguments) {
  CEDAR_REQUIRE_GPU_ATTN();
  const Status s = sparse_attention({.n = 1, .heads = 4, .head_dim = 96, .window = 8}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("head_dim 96"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace cedar::cuda
