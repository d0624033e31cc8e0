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
  int64_t lost_mod = 0;  // > 0: ring positions k with k % lost_mod == 1 are missing (both sides drop them)
};

// Which launcher runs: the dispatcher (by rows), or one of the two kernels explicitly.
enum class Kernel { Dispatch, Decode, Tiled };

struct SparseCase {
  int64_t heads = 64, head_dim = 512, rope_dim = 64, window = 128, topk = 512;
  bool compressed = true;  // false: SWA-only layer (no top-k)
  bool bf16_probabilities = true;
  bool split_workspace = true;
  Kernel kernel = Kernel::Dispatch;
  std::vector<SeqSpec> seqs;
  uint32_t seed = 1;
};

// The first output whose bits differ, or got.size().
size_t first_bit_difference(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0) return i;
  return got.size();
}

// The decode kernel's head-split plan (SparseAttnArgs::decode_head_split) on a check_sparse case: every
// head group the head_dim allows (16 needs head_dim >= 256) and the plan's own pick, each against the
// CPU oracle with the same allowance (phase A sums its channel parts in another order than the 64-head
// kernel, so its bits are not the legacy plan's), no unwritten output, two runs bit-identical; for the
// plan's pick also the legacy merge and q_before_rope bit for bit, as for the legacy plan.
void check_head_split(const SparseAttnArgs& a, const RopeTableView& rope, const std::vector<float>& q,
                      const std::vector<float>& want, const std::vector<float>& allow, const Tolerance& tol,
                      const std::string& tag, const SparseAttnWorkspace& ws) {
  auto run = [&](const SparseAttnArgs& x, const std::string& what, std::vector<float>& got) {
    ASSERT_EQ(cudaMemset(x.out, 0xFF, got.size() * sizeof(float)), cudaSuccess);
    const Status s = sparse_attention_decode(x, nullptr, ws);
    ASSERT_TRUE(s.ok()) << what << ": " << s.error().message;
    ASSERT_EQ(cudaMemcpy(got.data(), x.out, got.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  };
  const size_t count = want.size();
  // out's f16 staging requested (out_f16_codes): the codes and scales bit for bit stage_act_f16(out)'s
  // (written by the fast merge, or by a stage launch after a launch without one), out unchanged.
  auto check_staged = [&](const SparseAttnArgs& x, const std::vector<float>& plain, const std::string& what) {
    const int64_t values = static_cast<int64_t>(count), blocks = values / 32;
    auto codes = DeviceBuffer<uint16_t>::allocate(values), want_codes = DeviceBuffer<uint16_t>::allocate(values);
    auto scales = DeviceBuffer<float>::allocate(blocks), want_scales = DeviceBuffer<float>::allocate(blocks);
    ASSERT_TRUE(codes.ok() && want_codes.ok() && scales.ok() && want_scales.ok());
    SparseAttnArgs sx = x;
    sx.out_f16_codes = codes->get();
    sx.out_f16_scales = scales->get();
    std::vector<float> got(count);
    run(sx, what + " staging o", got);
    EXPECT_EQ(first_bit_difference(got, plain), count) << what << ": out changed when its staging was requested";
    ASSERT_TRUE(stage_act_f16(sx.out, sx.n, sx.heads * sx.head_dim, want_codes->get(), want_scales->get(), nullptr).ok());
    const std::vector<uint16_t> c = codes->to_host().value(), wc = want_codes->to_host().value();
    const std::vector<float> s = scales->to_host().value(), wsc = want_scales->to_host().value();
    size_t bad_codes = 0, bad_scales = 0;
    for (size_t i = 0; i < c.size(); ++i) bad_codes += c[i] != wc[i];
    for (size_t i = 0; i < s.size(); ++i) bad_scales += std::memcmp(&s[i], &wsc[i], 4) != 0;
    EXPECT_EQ(bad_codes, 0u) << what << ": staged codes differ from stage_act_f16(out)";
    EXPECT_EQ(bad_scales, 0u) << what << ": staged scales differ from stage_act_f16(out)";
  };
  for (int hb : {0, 16, 32, 64}) {
    if (hb == 16 && a.head_dim < 256) continue;
    SparseAttnArgs ha = a;
    ha.decode_head_split = true;
    ha.decode_heads_per_block = hb;
    const std::string htag = tag + " head-split " + (hb != 0 ? std::to_string(hb) + " heads/block" : "(plan)");
    std::vector<float> got(count), again(count);
    run(ha, htag, got);
    size_t unwritten = 0;
    for (float v : got) unwritten += std::isnan(v) ? 1 : 0;
    EXPECT_EQ(unwritten, 0u) << htag << ": NaN outputs (unwritten heads/channels, or a NaN in the arithmetic)";
    EXPECT_TRUE(parity(htag, got, want, tol, allow));
    run(ha, htag, again);
    const size_t at = first_bit_difference(again, got);
    EXPECT_EQ(at, count) << htag << ": two runs differ, first at output " << at << " (" << got[at < count ? at : 0]
                         << " vs " << again[at < count ? at : 0] << ")";
    SparseAttnArgs ta = ha;  // the fast merge triggering its dependents at its start: the same bits
    ta.decode_merge_trigger = true;
    std::vector<float> triggered(count);
    run(ta, htag + " merge trigger", triggered);
    EXPECT_EQ(first_bit_difference(triggered, got), count) << htag << ": decode_merge_trigger changed out";
    for (const int max_splits : {1, 2}) {  // fewer, longer key ranges (1: no merge launch)
      SparseAttnArgs ma = ha;
      ma.decode_max_splits = max_splits;
      const std::string mtag = htag + " at most " + std::to_string(max_splits) + " key range(s)";
      std::vector<float> one(count);
      run(ma, mtag, one);
      size_t nan = 0;
      for (float v : one) nan += std::isnan(v) ? 1 : 0;
      EXPECT_EQ(nan, 0u) << mtag << ": NaN outputs";
      EXPECT_TRUE(parity(mtag, one, want, tol, allow));
      if (hb == 0) check_staged(ma, one, mtag);
    }
    if (hb != 0) continue;
    check_staged(ha, got, htag);
    SparseAttnArgs la = ha;
    la.legacy_decode_merge = true;
    std::vector<float> leg(count);
    run(la, htag + " legacy merge", leg);
    check_staged(la, leg, htag + " legacy merge");
    const size_t lat = first_bit_difference(leg, got);
    EXPECT_EQ(lat, count) << htag << ": the prefetching merge differs from the legacy merge, first at output " << lat
                          << " (" << got[lat < count ? lat : 0] << " vs " << leg[lat < count ? lat : 0]
                          << "); they must agree bit for bit";
    auto droped = to_device(q);
    ASSERT_TRUE(rope_apply(rope,
                           {.x = droped.get(), .rows = a.n, .n_vec = a.heads, .width = a.head_dim, .tokens = a.tokens},
                           nullptr)
                    .ok());
    SparseAttnArgs ra = ha;
    ra.q = droped.get();
    std::vector<float> rotated(count), fused(count);
    run(ra, htag + " after rope_apply", rotated);
    SparseAttnArgs fa = ha;
    fa.q_before_rope = true;
    run(fa, htag + " q_before_rope", fused);
    const size_t fat = first_bit_difference(fused, rotated);
    EXPECT_EQ(fat, count) << htag << ": q_before_rope differs from rope_apply + the kernel, first at output " << fat
                          << " (" << fused[fat < count ? fat : 0] << " vs " << rotated[fat < count ? fat : 0]
                          << "); they must agree bit for bit";
  }
}

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
      if (c.seqs[s].lost_mod > 0 && k % c.seqs[s].lost_mod == 1) continue;  // the slot stays empty (-1)
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
        const SeqSpec& sq = c.seqs[tk.seq];
        if (sq.lost_mod > 0 && k % sq.lost_mod == 1) continue;  // a lost slot: the kernels drop the key
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
    // The decode kernel (split-K) rounds bf16(exp(s_j − m_z)) against its key range's max m_z and then
    // rescales by exp(m_z − M): within 2^-9 + 2^-9 + O(2^-22) of p_j of the CPU's bf16(exp(s_j − M)), and
    // its expf (<= 2 ulp) moves p_j by ~2^-22 — inside the same 2^-7·p_j per key, so one bound serves both;
    // the merge's extra fp32 products and sums (<= 20 ranges) are ~2^-19 relative, far below 2^-9·|o|.
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
      for (double& v : s) {
        v = std::exp(v - m);  // s now holds the exact p_j
        den += v;
      }
      den += std::exp(double(sink[h]) - m);
      for (int64_t ch = 0; ch < hd; ++ch) {
        double b = 0;
        for (size_t j = 0; j < keys.size(); ++j) b += s[j] * std::fabs(keys[j][ch]);
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
  const bool decode =
      c.kernel == Kernel::Decode || (c.kernel == Kernel::Dispatch && sparse_attention_picks_decode(a, ws));
  const std::string tag = name + (decode ? " [decode" : " [tiled") + (wsz.floats ? " ws]" : "]");
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {  // the second run checks the re-armed tickets and determinism
    const Status s = c.kernel == Kernel::Decode  ? sparse_attention_decode(a, nullptr, ws)
                     : c.kernel == Kernel::Tiled ? sparse_attention_tiled(a, nullptr, ws)
                                                 : sparse_attention(a, nullptr, ws);
    ASSERT_TRUE(s.ok()) << tag << ": " << s.error().message;
    const std::vector<float> got = to_host(dout);
    size_t unwritten = 0;  // the output was filled with NaN bytes: a NaN names an element never written
    for (float v : got) unwritten += std::isnan(v) ? 1 : 0;
    EXPECT_EQ(unwritten, 0u) << tag << ": NaN outputs (unwritten heads/channels, or a NaN in the arithmetic)";
    EXPECT_TRUE(parity(tag, got, want, tol, allow));
    if (rep == 0) {
      first = got;
    } else {
      EXPECT_EQ(std::memcmp(first.data(), got.data(), got.size() * 4), 0) << tag << ": two runs differ";
    }
  }
  if (decode) {  // the first merge (serial loads, plain launch) on the same inputs: same arithmetic, same bits
    SparseAttnArgs la = a;
    la.legacy_decode_merge = true;
    const Status s = sparse_attention_decode(la, nullptr, ws);
    ASSERT_TRUE(s.ok()) << tag << " legacy merge: " << s.error().message;
    const std::vector<float> got = to_host(dout);
    size_t differ = 0, at = got.size();
    for (size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &first[i], 4) != 0 && differ++ == 0) at = i;
    EXPECT_EQ(differ, 0u) << tag << ": the prefetching merge differs from the legacy merge in " << differ
                          << " outputs (first at " << at << ": " << first[at < got.size() ? at : 0] << " vs "
                          << got[at < got.size() ? at : 0] << "); they must agree bit for bit";
    // q before RoPE: taking the test's q as the un-rotated query, the kernel's own rotation must give
    // the bits of rope_apply followed by the kernel on the rotated q.
    auto droped = to_device(q);
    ASSERT_TRUE(
        rope_apply(dr.view, {.x = droped.get(), .rows = n, .n_vec = H, .width = hd, .tokens = dt.get()}, nullptr).ok());
    SparseAttnArgs ra = a;
    ra.q = droped.get();
    ASSERT_TRUE(sparse_attention_decode(ra, nullptr, ws).ok()) << tag << " after rope_apply";
    const std::vector<float> want_fused = to_host(dout);
    SparseAttnArgs fa = a;  // dq: the same values, not rotated
    fa.q_before_rope = true;
    const Status sf = sparse_attention_decode(fa, nullptr, ws);
    ASSERT_TRUE(sf.ok()) << tag << " q_before_rope: " << sf.error().message;
    const std::vector<float> fused = to_host(dout);
    size_t fdiff = 0;
    for (size_t i = 0; i < fused.size(); ++i) fdiff += std::memcmp(&fused[i], &want_fused[i], 4) != 0 ? 1 : 0;
    EXPECT_EQ(fdiff, 0u) << tag << ": q_before_rope (RoPE applied while loading q) differs from rope_apply + the "
                         << "kernel in " << fdiff << " of " << fused.size() << " outputs; they must agree bit for bit";
    // The tiled kernel refuses the option (it reads q after rope_apply).
    EXPECT_FALSE(sparse_attention_tiled(fa, nullptr, ws).ok()) << tag << ": tiled kernel accepted q_before_rope";
    check_head_split(a, dr.view, q, want, allow, tol, tag, ws);
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

// ---- the decode kernel (split-K over the keys, 64 heads per block; every case below and the decode
// cases above also run the head-split plan at 16 / 32 / 64 heads per block: check_head_split) ----

// A row at the released shape: full window + 512 selected, so 640 keys in 20 ranges of one tile.
const SeqSpec kFullRow{.pos0 = 5000, .entries = 5001, .selected = 512};

TEST(CudaSparseAttentionDecode, ReleasedBatch1MatchesCpu) {
  CEDAR_REQUIRE_GPU_ATTN();
  for (Kernel k : {Kernel::Decode, Kernel::Tiled}) {  // the new kernel and the old one on the same row
    check_sparse({.kernel = k, .seqs = {kFullRow}, .seed = 201}, "sparse_decode b1 64x512");
    check_sparse({.bf16_probabilities = false, .kernel = k, .seqs = {kFullRow}, .seed = 202},
                 "sparse_decode b1 64x512 fp32 p");
  }
  // The dispatcher picks the decode kernel at one row; SWA-only layer (128 keys: 4 ranges).
  check_sparse({.seqs = {kFullRow}, .seed = 203}, "sparse_decode b1 dispatch");
  check_sparse({.compressed = false, .kernel = Kernel::Decode, .seqs = {{.pos0 = 300}}, .seed = 204},
               "sparse_decode b1 swa-only");
}

TEST(CudaSparseAttentionDecode, Batch8DifferentLengthsMatchesCpu) {
  CEDAR_REQUIRE_GPU_ATTN();
  // 8 rows (10 ranges of 2 tiles): full rows, a young sequence whose keys end inside the first tile
  // (pos 3: 4 window keys + 2 entries — fewer keys than a range, most ranges empty), no selected entries
  // (all −1: ranges past the window hold no key), a partial last tile, bounded replay, lost ring slots.
  const std::vector<SeqSpec> seqs = {kFullRow,
                                     {.pos0 = 3, .entries = 4, .selected = 2},
                                     {.pos0 = 900, .entries = 901, .selected = 0},
                                     {.pos0 = 1200, .entries = 1201, .selected = 77},
                                     {.pos0 = 700, .swa_start = 650, .entries = 701, .selected = 512},
                                     {.pos0 = 2000, .entries = 2001, .selected = 300, .lost_mod = 5},
                                     {.pos0 = 129, .entries = 130, .selected = 130},
                                     {.pos0 = 64, .entries = 65, .selected = 33}};
  check_sparse({.kernel = Kernel::Decode, .seqs = seqs, .seed = 211}, "sparse_decode b8 64x512");
  check_sparse({.bf16_probabilities = false, .kernel = Kernel::Decode, .seqs = seqs, .seed = 212},
               "sparse_decode b8 64x512 fp32 p");
}

TEST(CudaSparseAttentionDecode, Batch64MatchesCpu) {
  CEDAR_REQUIRE_GPU_ATTN();
  // 64 rows (2 ranges of 10 tiles per row: the online part of the kernel is several tiles per block),
  // lengths and selections varying row by row.
  std::vector<SeqSpec> seqs;
  for (int64_t i = 0; i < 64; ++i) {
    const int64_t pos = 20 + 97 * i;
    seqs.push_back({.pos0 = pos,
                    .swa_start = i % 9 == 4 ? pos - 40 : 0,
                    .entries = pos + 1,
                    .selected = std::min<int64_t>(pos + 1, (i * 53) % 513),
                    .lost_mod = i % 11 == 6 ? 3 : 0});
  }
  // Through the dispatcher: the tag printed with the PARITY line says it took the decode kernel.
  check_sparse({.seqs = seqs, .seed = 221}, "sparse_decode b64 64x512");
}

TEST(CudaSparseAttentionDecode, OtherShapesMatchCpu) {
  CEDAR_REQUIRE_GPU_ATTN();
  // head_dim 128 and 256 (the other instantiations), a head count that is not a multiple of 64 (80: a
  // second, partial head group; 8: one m-tile of 4 in use), prefill-like chunks of <= 64 rows.
  check_sparse(
      {.heads = 80,
       .head_dim = 256,
       .rope_dim = 64,
       .window = 64,
       .topk = 96,
       .kernel = Kernel::Decode,
       .seqs = {{.pos0 = 500, .entries = 501, .selected = 96}, {.pos0 = 10, .n = 3, .entries = 13, .selected = 9}},
       .seed = 231},
      "sparse_decode 80x256");
  check_sparse({.heads = 8,
                .head_dim = 128,
                .rope_dim = 32,
                .window = 32,
                .topk = 16,
                .kernel = Kernel::Decode,
                .seqs = {{.pos0 = 50, .n = 40, .entries = 90, .selected = 16},
                         {.pos0 = 64, .n = 9, .swa_start = 60, .entries = 73, .selected = 9}},
                .seed = 232},
               "sparse_decode 8x128 chunks");
}

TEST(CudaSparseAttentionDecode, RejectsBadArguments) {
  CEDAR_REQUIRE_GPU_ATTN();
  Status s = sparse_attention_decode({.n = 1, .heads = 4, .head_dim = 64, .window = 8}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("head_dim 64"), std::string::npos) << s.error().message;
  s = sparse_attention_decode({.n = 65, .heads = 4, .head_dim = 128, .window = 8}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("n=65"), std::string::npos) << s.error().message;
  // A split launch without its workspace is refused (the dispatcher takes the tiled kernel instead).
  const SparseAttnArgs a{.n = 1, .heads = 64, .head_dim = 512, .window = 128};
  EXPECT_FALSE(sparse_attention_picks_decode(a, {}));
  EXPECT_GT(sparse_attention_decode_workspace_size(1, 64, 512, 128, 512).floats, 0);
  // The head-split plan's forced head groups: 16 heads need head_dim >= 256 (16 parts of >= 16 channels).
  for (int hb : {16, 48}) {
    SparseAttnArgs h{.n = 1, .heads = 64, .head_dim = 128, .window = 8};
    h.decode_head_split = true;
    h.decode_heads_per_block = hb;
    s = sparse_attention_decode(h, nullptr);
    ASSERT_FALSE(s.ok()) << hb << " heads per block at head_dim 128 accepted";
    EXPECT_NE(s.error().message.find("decode_heads_per_block " + std::to_string(hb)), std::string::npos)
        << s.error().message;
  }
  SparseAttnArgs m = a;
  m.decode_max_splits = -1;
  s = sparse_attention_decode(m, nullptr);
  ASSERT_FALSE(s.ok()) << "decode_max_splits -1 accepted";
  EXPECT_NE(s.error().message.find("decode_max_splits -1"), std::string::npos) << s.error().message;
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
