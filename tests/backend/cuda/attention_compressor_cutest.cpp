// Parity of compressor_entries / compressor_keep_pending / indexer_keys_store with the CPU compressor
// (compress_chunk + append_cache_entries into packed KvEntries): two sequences batched in each call,
// odd chunk lengths and splits that leave a ratio-2 group open across calls, paged device streams with
// scrambled block tables. Given the CPU's projections (cpu::linear, as compress_chunk computes them)
// latents, pending state and records must be bit/byte-identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "attention_cutest_util.h"
#include "backend/cpu/ops.h"
#include "kv/kv_format.h"
#include "model/attention_state.h"
#include "model/compressor.h"

namespace cedar::cuda {
namespace {

using testing::device_alloc;
using testing::device_filled;
using testing::to_device;
using testing::to_host;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

struct BfWeight {  // a BF16 linear weight on the host
  std::vector<uint8_t> bytes;
  cpu::LinearWeight lw;
};
BfWeight bf_weight(int64_t out, int64_t in, uint32_t seed, int lo, int hi, size_t block) {
  BfWeight w;
  w.bytes = testing::bf16_bytes(testing::bf16_bits(testing::random_bf16(out * in, seed, lo, hi, block)));
  w.lw = {.format = WeightFormat::BF16, .out = out, .in = in, .data = w.bytes.data()};
  return w;
}

// A paged device stream per sequence: `blocks` blocks of `epb` records, block tables scrambled so that
// sequences interleave in the pool.
struct DevicePool {
  DeviceBuffer<uint8_t> pool;
  std::vector<DeviceBuffer<int32_t>> tables;
  std::vector<std::vector<int32_t>> host_tables;
  int64_t block_bytes = 0, epb = 0, rb = 0;
  PagedRecords stream(int s) const {
    return PagedRecords{const_cast<uint8_t*>(pool.get()), tables[s].get(), block_bytes, epb, rb};
  }
  const uint8_t* host_record(const std::vector<uint8_t>& bytes, int s, int64_t j) const {
    return bytes.data() + host_tables[s][j / epb] * block_bytes + (j % epb) * rb;
  }
};
DevicePool make_pool(int seqs, int64_t blocks_per_seq, int64_t epb, int64_t rb) {
  DevicePool p;
  p.block_bytes = epb * rb;
  p.epb = epb;
  p.rb = rb;
  const int64_t total = seqs * blocks_per_seq;
  p.pool = device_filled<uint8_t>(total * p.block_bytes, 0xCD);
  for (int s = 0; s < seqs; ++s) {
    std::vector<int32_t> t;
    for (int64_t b = 0; b < blocks_per_seq; ++b) t.push_back(static_cast<int32_t>(total - 1 - (b * seqs + s)));
    p.host_tables.push_back(t);
    p.tables.push_back(to_device(t));
  }
  return p;
}

struct CompressorCase {
  int64_t ratio = 2, head_dim = 0, index_head_dim = 0, rope_dim = 0, dim = 256, epb = 4;
  double eps = 1e-20;
  std::vector<std::vector<int64_t>> calls;  // per call: chunk length of sequence 0, 1
  uint32_t seed = 1;
};

void check_compressor(const CompressorCase& c, const std::string& name) {
  const int64_t hd = c.head_dim, ih = c.index_head_dim, r = c.ratio, S = 2;
  const cpu::RopeTable rope(testing::compress_rope_config(c.rope_dim));
  // Rows of wkv / wk with a per-16-row power-of-two spread (2^-20 .. 2^2): after the norm the small
  // channels quantize with subnormal E4M3 / tiny UE8M0 scales or hit the amax clamps.
  const BfWeight wkv = bf_weight(hd, c.dim, c.seed, -20, 2, 16 * c.dim);
  const BfWeight wgate = bf_weight(hd, c.dim, c.seed + 1, -3, 0, c.dim);
  const BfWeight wk = bf_weight(ih, hd, c.seed + 2, -20, 2, 16 * hd);
  const std::vector<float> norm = testing::random_bf16(hd, c.seed + 3, -1, 1, 0);
  const std::vector<float> k_norm = testing::random_bf16(ih, c.seed + 4, -1, 1, 0);

  // CPU oracle state, one KV source per sequence.
  const KvRecordFormat fmain = *KvRecordFormat::make(KvRecipe::Fp4Block16E4m3, KvStorage::Packed, hd);
  const KvRecordFormat findex = *KvRecordFormat::make(KvRecipe::Fp4Block32Ue8m0, KvStorage::Packed, ih);
  ASSERT_EQ(fmain.record_bytes(), main_kv_record_bytes(hd));
  ASSERT_EQ(findex.record_bytes(), index_key_record_bytes(ih));
  std::vector<KvSourceState> src(S);
  int64_t total[2] = {0, 0};
  for (const auto& call : c.calls)
    for (int s = 0; s < S; ++s) total[s] += call[s];
  for (int s = 0; s < S; ++s) {
    src[s].layer = 2;
    src[s].ratio = r;
    src[s].kv = *KvEntries::create({.format = fmain, .position_stride = r, .entries_per_block = c.epb});
    src[s].index_k = *KvEntries::create({.format = findex, .position_stride = r, .entries_per_block = c.epb});
  }
  const int64_t max_entries = std::max(total[0], total[1]) / r + 1;
  const int64_t blocks = (max_entries + c.epb - 1) / c.epb;
  const DevicePool pkv = make_pool(S, blocks, c.epb, fmain.record_bytes());
  const DevicePool pidx = make_pool(S, blocks, c.epb, findex.record_bytes());
  auto dpend_kv = device_filled<float>(S * (r - 1 + 1) * hd, 0xFF);
  auto dpend_gate = device_filled<float>(S * (r - 1 + 1) * hd, 0xFF);
  std::vector<KvSourceSeq> seqs;
  for (int s = 0; s < S; ++s)
    seqs.push_back(
        KvSourceSeq{pkv.stream(s), pidx.stream(s), dpend_kv.get() + s * r * hd, dpend_gate.get() + s * r * hd});
  auto dseqs = to_device(seqs);
  const testing::DeviceRope dr = testing::device_rope(rope, std::max(total[0], total[1]) + 1);
  auto dnorm = to_device(norm);
  auto dknorm = to_device(k_norm);

  int64_t next[2] = {0, 0};
  size_t bad_latent = 0, bad_pending = 0, checked_latent = 0;
  uint32_t seed = c.seed + 10;
  for (const auto& call : c.calls) {
    std::vector<AttnToken> tokens;
    std::vector<float> kv_rows, gate_rows, want_latent, k_rows;
    for (int s = 0; s < S; ++s) {
      const int64_t n = call[s];
      if (n == 0) continue;
      const std::vector<float> x = testing::random_bf16(n * c.dim, seed++, -2, 2, 32);
      append_chunk_tokens(tokens, s, next[s], n);
      // The projections exactly as compress_chunk computes them.
      std::vector<float> kv(n * hd), gate(n * hd);
      ASSERT_TRUE(cpu::linear(wkv.lw, x, n, kv, {.bf16_output = r == 1}, nullptr).ok());
      if (r > 1) {
        ASSERT_TRUE(cpu::linear(wgate.lw, x, n, gate, {.bf16_output = false}, nullptr).ok());
      }
      kv_rows.insert(kv_rows.end(), kv.begin(), kv.end());
      gate_rows.insert(gate_rows.end(), gate.begin(), gate.end());
      // The oracle.
      CompressedGroups groups;
      ASSERT_TRUE(compress_chunk({.wkv = &wkv.lw, .wgate = r > 1 ? &wgate.lw : nullptr, .norm = norm}, c.eps, x, n,
                                 src[s], groups, nullptr)
                      .ok());
      std::vector<float> k(groups.count * ih);
      if (groups.count > 0) {
        ASSERT_TRUE(cpu::linear(wk.lw, groups.latent, groups.count, k, {.bf16_output = true}, nullptr).ok());
      }
      ASSERT_TRUE(
          append_cache_entries(groups, {.rope = &rope, .wk = &wk.lw, .k_norm = k_norm, .eps = c.eps}, src[s], nullptr)
              .ok());
      // Row t of the chunk completes group (pos/r − first_group) when pos % r == r − 1.
      for (int64_t t = 0; t < n; ++t) {
        const int64_t pos = next[s] + t;
        const bool done = pos % r == r - 1;
        const int64_t gi = pos / r - groups.first_group;
        for (int64_t ch = 0; ch < hd; ++ch) want_latent.push_back(done ? groups.latent[gi * hd + ch] : 0.0f);
        for (int64_t ch = 0; ch < ih; ++ch) k_rows.push_back(done ? k[gi * ih + ch] : 0.0f);
      }
      next[s] += n;
    }
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n == 0) continue;
    auto dt = to_device(tokens);
    auto dkv = to_device(kv_rows);
    auto dgate = to_device(gate_rows);
    auto dlat = device_filled<float>(n * hd, 0xFF);
    const CompressorArgs ca{.n = n,
                            .head_dim = hd,
                            .ratio = r,
                            .kv = dkv.get(),
                            .gate = r > 1 ? dgate.get() : nullptr,
                            .norm_weight = dnorm.get(),
                            .eps = static_cast<float>(c.eps),
                            .tokens = dt.get(),
                            .seqs = dseqs.get(),
                            .rope = dr.view,
                            .latent = dlat.get()};
    Status s = compressor_entries(ca, nullptr);
    ASSERT_TRUE(s.ok()) << s.error().message;
    s = compressor_keep_pending(ca, nullptr);
    ASSERT_TRUE(s.ok()) << s.error().message;
    auto dk = to_device(k_rows);
    s = indexer_keys_store({.n = n,
                            .index_head_dim = ih,
                            .ratio = r,
                            .k = dk.get(),
                            .norm_weight = dknorm.get(),
                            .eps = static_cast<float>(c.eps),
                            .tokens = dt.get(),
                            .seqs = dseqs.get(),
                            .rope = dr.view},
                           nullptr);
    ASSERT_TRUE(s.ok()) << s.error().message;
    const std::vector<float> lat = to_host(dlat);
    for (size_t i = 0; i < lat.size(); ++i)
      if (!same_bits(lat[i], want_latent[i]) && bad_latent++ == 0)
        ADD_FAILURE() << name << ": first latent mismatch at row " << i / hd << " channel " << i % hd << ": gpu "
                      << lat[i] << " cpu " << want_latent[i];
    checked_latent += lat.size();
    // The open group's projections: the CPU keeps src.pending rows from position kv.size()·r on.
    const std::vector<float> pk = to_host(dpend_kv), pg = to_host(dpend_gate);
    for (int sq = 0; sq < S; ++sq)
      for (int64_t i = 0; i < src[sq].pending * hd; ++i)
        if ((!same_bits(pk[sq * r * hd + i], src[sq].pending_kv[i]) ||
             !same_bits(pg[sq * r * hd + i], src[sq].pending_gate[i])) &&
            bad_pending++ == 0)
          ADD_FAILURE() << name << ": first pending mismatch, sequence " << sq << " value " << i;
  }
  // Every record of both streams, byte for byte.
  size_t bad_main = 0, bad_index = 0, records = 0;
  const std::vector<uint8_t> gkv = to_host(pkv.pool), gidx = to_host(pidx.pool);
  for (int s = 0; s < S; ++s) {
    ASSERT_EQ(src[s].kv.size(), next[s] / r);
    for (int64_t j = 0; j < src[s].kv.size(); ++j, ++records) {
      const uint8_t* g = pkv.host_record(gkv, s, j);
      const uint8_t* w = src[s].kv.blocks().record(j);
      for (int64_t b = 0; b < fmain.record_bytes(); ++b)
        if (g[b] != w[b] && bad_main++ == 0)
          ADD_FAILURE() << name << ": main KV record " << j << " of sequence " << s << " byte " << b << ": gpu 0x"
                        << std::hex << int(g[b]) << " cpu 0x" << int(w[b]);
      const uint8_t* gi = pidx.host_record(gidx, s, j);
      const uint8_t* wi = src[s].index_k.blocks().record(j);
      for (int64_t b = 0; b < findex.record_bytes(); ++b)
        if (gi[b] != wi[b] && bad_index++ == 0)
          ADD_FAILURE() << name << ": indexer key record " << j << " of sequence " << s << " byte " << b << ": gpu 0x"
                        << std::hex << int(gi[b]) << " cpu 0x" << int(wi[b]);
    }
  }
  std::printf(
      "PARITY %-40s records=%zu main byte mismatches=%zu index byte mismatches=%zu latent mismatches=%zu/%zu "
      "pending mismatches=%zu (bit-exact required)\n",
      name.c_str(), records, bad_main, bad_index, bad_latent, checked_latent, bad_pending);
  EXPECT_EQ(bad_main + bad_index + bad_latent + bad_pending, 0u);
  EXPECT_GT(records, 0u);
}

TEST(CudaCompressor, Ratio2RecordsByteIdentical) {
  CEDAR_REQUIRE_GPU_ATTN();
  // Odd chunks, single decode tokens, an empty turn: groups stay open across calls in both sequences.
  const std::vector<std::vector<int64_t>> calls = {{5, 2}, {1, 3}, {1, 0}, {4, 1}, {0, 6}, {3, 1}, {1, 1}};
  check_compressor({.ratio = 2, .head_dim = 512, .index_head_dim = 128, .rope_dim = 64, .calls = calls, .seed = 71},
                   "compressor ratio 2 (512/128)");
  check_compressor({.ratio = 2,
                    .head_dim = 32,
                    .index_head_dim = 32,
                    .rope_dim = 8,
                    .epb = 2,
                    .eps = 1e-6,
                    .calls = calls,
                    .seed = 72},
                   "compressor ratio 2 (tiny 32/32)");
}

TEST(CudaCompressor, Ratio1RecordsByteIdentical) {
  CEDAR_REQUIRE_GPU_ATTN();
  const std::vector<std::vector<int64_t>> calls = {{3, 1}, {1, 2}, {1, 1}, {6, 0}};
  check_compressor({.ratio = 1, .head_dim = 512, .index_head_dim = 128, .rope_dim = 64, .calls = calls, .seed = 73},
                   "compressor ratio 1 (512/128)");
  check_compressor({.ratio = 1, .head_dim = 128, .index_head_dim = 64, .rope_dim = 32, .calls = calls, .seed = 74},
                   "compressor ratio 1 (small 128/64)");
}

TEST(CudaCompressor, RejectsBadArguments) {
  CEDAR_REQUIRE_GPU_ATTN();
  const Status s = compressor_entries({.n = 1, .head_dim = 48}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("width 48"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace cedar::cuda
