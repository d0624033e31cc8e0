// sparse_attention_prefetch (model_attention.cu, the CUDA model's copy of the sparse attention with a
// prefetching tile loader) against cuda-attn's sparse_attention (attention_kernels.h), bit for bit: the
// two share grid, arithmetic and summation order, only the order in which a tile's loads are issued
// differs. The shared arithmetic is checked against the CPU in attention_sparse_cutest.cpp. Calls of
// <= kSparseDecodeMaxRows rows (head_dim >= 128) run cuda-attn's decode kernel from both entry points. Shapes: the
// released decode (1 and 3 rows, key split) and a prefill chunk (40 rows), a small and a tiny one (SWA
// only), with rings that miss positions and bounded replay rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/attention_kernels.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/model_kernels.h"
#include "core/numeric.h"
#include "cuda_test_util.h"

namespace cedar::cuda {
namespace {

template <typename T>
DeviceBuffer<T> dev(const std::vector<T>& v) {
  auto b = DeviceBuffer<T>::from_host(v.empty() ? std::vector<T>(1) : v);
  EXPECT_TRUE(b.ok());
  return std::move(*b);
}

struct Seq {
  int64_t pos0 = 0, n = 1, swa_start = 0, entries = 0, selected = 0;
};

struct Case {
  const char* name;
  int64_t heads, head_dim, rope_dim, window, topk;
  bool compressed;
  std::vector<Seq> seqs;
  uint32_t seed;
};

// A valid e4m3 byte (never NaN) and a moderate UE8M0 scale.
uint8_t fp8_code(std::mt19937& rng) {
  uint8_t b = static_cast<uint8_t>(rng());
  if ((b & 0x7F) == 0x7F) b ^= 1;
  return b;
}

void check_case(const Case& c) {
  const int64_t H = c.heads, hd = c.head_dim, W = c.window, S = static_cast<int64_t>(c.seqs.size());
  const int64_t rb = swa_record_bytes(hd), mb = main_kv_record_bytes(hd), epb = 16;
  std::mt19937 rng(c.seed);
  auto swa_record = [&](uint8_t* r) {
    for (int64_t i = 0; i < hd; ++i) r[i] = fp8_code(rng);
    for (int64_t i = 0; i < hd / 32; ++i) r[hd + i] = static_cast<uint8_t>(118 + rng() % 8);
  };
  std::vector<AttnToken> tokens;
  for (int64_t s = 0; s < S; ++s)
    append_chunk_tokens(tokens, static_cast<int32_t>(s), c.seqs[s].pos0, c.seqs[s].n, c.seqs[s].swa_start);
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<uint8_t> chunk(n * rb);
  for (int64_t r = 0; r < n; ++r) swa_record(chunk.data() + r * rb);
  std::vector<DeviceBuffer<uint8_t>> ring_rec, pools;
  std::vector<DeviceBuffer<int64_t>> ring_pos;
  std::vector<DeviceBuffer<int32_t>> tables;
  std::vector<SwaRingDesc> rings;
  std::vector<KvSourceSeq> kv;
  std::vector<int32_t> topk(n * std::max<int64_t>(c.topk, 1), -1);
  for (int64_t s = 0; s < S; ++s) {
    const Seq& q = c.seqs[s];
    std::vector<uint8_t> rec(W * rb);
    std::vector<int64_t> pos(W, -1);
    for (int64_t k = std::max<int64_t>(0, q.pos0 - W); k < q.pos0; ++k) {
      swa_record(rec.data() + (k % W) * rb);
      pos[k % W] = (k % 7 == 3) ? -1 : k;  // some slots lost: the kernel drops those keys
    }
    ring_rec.push_back(dev(rec));
    ring_pos.push_back(dev(pos));
    rings.push_back(SwaRingDesc{ring_rec.back().get(), ring_pos.back().get()});
    const int64_t blocks = std::max<int64_t>(1, (q.entries + epb - 1) / epb);
    std::vector<uint8_t> pool(blocks * epb * mb);
    for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<uint8_t>(rng());
    for (int64_t j = 0; j < blocks * epb; ++j)  // E4M3 block scales in [2^-3, 2^1), never NaN
      for (int64_t b = 0; b < hd / 16; ++b) pool[j * mb + hd / 2 + b] = static_cast<uint8_t>(0x30 + rng() % 0x20);
    std::vector<int32_t> table(blocks);
    for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(blocks - 1 - b);
    pools.push_back(dev(pool));
    tables.push_back(dev(table));
    kv.push_back(KvSourceSeq{PagedRecords{pools.back().get(), tables.back().get(), epb * mb, epb, mb}, {}});
  }
  for (int64_t r = 0; r < n && c.compressed; ++r) {
    const Seq& q = c.seqs[tokens[r].seq];
    std::vector<int32_t> all(q.entries);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    const int64_t k = std::min(q.selected, q.entries);
    std::sort(all.begin(), all.begin() + k);
    std::copy_n(all.begin(), k, topk.begin() + r * c.topk);
  }
  std::vector<float> qv(n * H * hd), sink(H);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : qv) v = round_to_bf16(nd(rng));
  for (float& v : sink) v = 2 * nd(rng);
  int64_t max_pos = 1;
  for (const Seq& q : c.seqs) max_pos = std::max(max_pos, q.pos0 + q.n);
  std::vector<float> inv_freq(c.rope_dim / 2);
  for (int64_t i = 0; i < c.rope_dim / 2; ++i)
    inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / c.rope_dim));
  auto rope = dev(rope_cos_sin_table(inv_freq.data(), c.rope_dim, max_pos));
  auto dt = dev(tokens);
  auto dq = dev(qv);
  auto dsink = dev(sink);
  auto dchunk = dev(chunk);
  auto drings = dev(rings);
  auto dtopk = dev(topk);
  auto dkv = dev(kv);
  const SparseAttnWorkspaceSize wsz = sparse_attention_workspace_size(n, H, hd, W, c.compressed ? c.topk : 0);
  auto wf = dev(std::vector<float>(std::max<int64_t>(wsz.floats, 1)));
  auto wc = dev(std::vector<unsigned>(std::max<int64_t>(wsz.counters, 1), 0u));
  const SparseAttnWorkspace ws{wf.get(), wc.get(), wsz.floats, wsz.counters};
  std::vector<std::vector<float>> outs;
  for (int variant = 0; variant < 4; ++variant) {  // owner, prefetch, owner, prefetch (re-armed tickets)
    auto out = dev(std::vector<float>(n * H * hd, -1.0f));
    SparseAttnArgs a;
    a.n = n;
    a.heads = H;
    a.head_dim = hd;
    a.window = W;
    a.q = dq.get();
    a.sink = dsink.get();
    a.scale = static_cast<float>(std::pow(1.0 / static_cast<double>(hd), 0.5));
    a.bf16_probabilities = variant < 2;
    a.tokens = dt.get();
    a.chunk_records = dchunk.get();
    a.rings = drings.get();
    a.topk = c.compressed ? dtopk.get() : nullptr;
    a.topk_width = c.compressed ? c.topk : 0;
    a.kv_seqs = c.compressed ? dkv.get() : nullptr;
    a.rope = RopeTableView{rope.get(), max_pos, c.rope_dim};
    a.out = out.get();
    const Status st = variant % 2 == 0 ? sparse_attention(a, nullptr, ws) : sparse_attention_prefetch(a, nullptr, ws);
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto host = out.to_host();
    ASSERT_TRUE(host.ok());
    outs.push_back(std::move(*host));
  }
  for (int pair = 0; pair < 2; ++pair) {
    size_t diff = 0, nan = 0;
    for (size_t i = 0; i < outs[2 * pair].size(); ++i) {
      diff += std::memcmp(&outs[2 * pair][i], &outs[2 * pair + 1][i], 4) != 0;
      nan += std::isnan(outs[2 * pair][i]);
    }
    std::printf("PARITY %-40s n=%zu bit-differences=%zu (bit-exact required; NaN outputs %zu)\n",
                (std::string(c.name) + (pair ? " fp32 p" : " bf16 p")).c_str(), outs[2 * pair].size(), diff, nan);
    EXPECT_EQ(diff, 0u) << c.name << ": the prefetching kernel differs from cuda-attn's";
    EXPECT_EQ(nan, 0u) << c.name << ": the test inputs should give finite outputs";
  }
}

TEST(CudaModelAttention, PrefetchEqualsTheOwnersKernelBitForBit) {
  CEDAR_REQUIRE_GPU();
  check_case({"released decode 1 row", 64, 512, 64, 128, 512, true, {{5000, 1, 0, 5001, 512}}, 1});
  check_case({"released decode 3 rows",
              64,
              512,
              64,
              128,
              512,
              true,
              {{700, 1, 650, 701, 512}, {40, 1, 0, 41, 41}, {900, 1, 0, 901, 100}},
              2});
  check_case({"released prefill 40 rows", 64, 512, 64, 128, 512, true, {{300, 40, 0, 340, 512}}, 3});
  // Up to kSparseDecodeMaxRows rows both entry points run the decode kernel; 72 rows keep the tiled
  // kernel and its prefetching copy compared at the released shape.
  check_case({"released prefill 72 rows", 64, 512, 64, 128, 512, true, {{300, 72, 0, 372, 512}}, 6});
  check_case({"small 8x128", 8, 128, 32, 32, 16, true, {{50, 40, 0, 90, 16}, {64, 9, 60, 73, 9}}, 4});
  check_case({"tiny swa-only 4x32", 4, 32, 8, 8, 4, false, {{3, 12, 0, 0, 0}, {30, 1, 0, 0, 0}}, 5});
}

}  // namespace
}  // namespace cedar::cuda
