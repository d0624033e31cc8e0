// Parity of the Engram kernels with the CPU oracle (model/engram.h): the device hash against
// EngramHasher (integers: bit-exact), the gather + dequant + FP8 quantization against engram_gather and
// the activation recipe (bit-exact, device and mapped host tables), and the whole layer against
// engram_forward (gate: fp32 sums in another order — bounded).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/ffn_kernels.h"
#include "core/numeric.h"
#include "cuda_test_util.h"
#include "ffn_test_util.h"
#include "io/config.h"
#include "model/engram.h"

namespace cedar::cuda {
namespace {

using namespace ffn_testing;
using testing::parity;
using testing::Tolerance;

constexpr double kU = 0x1p-24;

// The V4.1-Flash Engram configuration (architecture.md §1.1).
ModelConfig v41_engram_config() {
  ModelConfig c;
  c.engram_layer_ids = {1, 14};
  c.engram_num_embeddings = {384006168, 384016682};
  c.engram_max_ngram_size = 4;
  c.engram_vocab_size = 16000000;
  c.engram_n_heads = 8;
  c.engram_head_dim = 256;
  c.engram_pad_id = 2;
  c.engram_compressed_vocab_size = 99092;
  return c;
}

TEST(CudaEngramHash, MatchesHasherAcrossChunksAndBatchedDecode) {
  CEDAR_REQUIRE_GPU();
  std::vector<int32_t> map(129280);
  for (int i = 0; i < 129280; ++i) map[i] = (i * 7919) % 99092;  // any map with 99092 classes
  for (int i = 0; i < 99092; ++i) map[(i * 13) % 129280] = i;    // ...all of them present
  auto hasher = EngramHasher::create(v41_engram_config(), map);
  ASSERT_TRUE(hasher.ok()) << hasher.error().message;
  const EngramLayout& layout = hasher->layout();
  const int64_t slots = layout.n_slots(), cols = layout.cols(), look_back = layout.max_ngram() - 1;

  // Three sequences; seq 0 has an image span and a lone image token (DEAD → pad, sticky).
  const int64_t S = 3;
  const std::vector<int64_t> len = {40, 6, 9};
  std::vector<std::vector<int64_t>> tokens(S);
  std::vector<std::vector<uint8_t>> image(S);
  std::mt19937 rng(5);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < len[s]; ++i) {
      tokens[s].push_back(rng() % 129280);
      image[s].push_back(s == 0 && ((i >= 11 && i < 14) || i == 30));
    }
  // Launches of (sequence, count): prefill chunks and single decode tokens mixed.
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> launches = {
      {{0, 17}, {1, 1}, {2, 5}}, {{1, 1}, {0, 23}, {2, 1}}, {{1, 1}, {2, 1}}, {{1, 3}, {2, 2}}};

  const EngramHashTablesHost tables = engram_hash_tables(layout);
  auto dtables = upload(tables.values);
  EngramHashTables view = tables.view;
  view.table = dtables.get();
  auto dmap = upload(map);
  auto recent = alloc<int32_t>(S * look_back);
  auto next_pos = upload(std::vector<int64_t>(S, 0));
  std::vector<EngramHistory> hist(S);
  std::vector<int64_t> done(S, 0);
  for (size_t li = 0; li < launches.size(); ++li) {
    std::vector<int32_t> ltok, lseq;
    std::vector<int64_t> lpos;
    std::vector<uint8_t> limg;
    std::vector<int64_t> want_rows;
    int64_t n = 0;
    for (const auto& [s, cnt] : launches[li]) n += cnt;
    want_rows.assign(slots * n * cols, -7);
    int64_t at = 0;
    for (const auto& [s, cnt] : launches[li]) {
      const int64_t p0 = done[s];
      std::vector<int64_t> chunk(tokens[s].begin() + p0, tokens[s].begin() + p0 + cnt);
      std::vector<uint8_t> chunk_img(image[s].begin() + p0, image[s].begin() + p0 + cnt);
      std::vector<int64_t> rows(slots * cnt * cols);
      ASSERT_TRUE(hasher->hash_chunk(p0, chunk, chunk_img, hist[s], rows).ok());
      for (int64_t sl = 0; sl < slots; ++sl)
        for (int64_t i = 0; i < cnt; ++i)
          std::copy_n(rows.begin() + (sl * cnt + i) * cols, cols, want_rows.begin() + (sl * n + at + i) * cols);
      for (int64_t i = 0; i < cnt; ++i) {
        ltok.push_back(static_cast<int32_t>(chunk[i]));
        lseq.push_back(static_cast<int32_t>(s));
        lpos.push_back(p0 + i);
        limg.push_back(chunk_img[i]);
      }
      done[s] += cnt;
      at += cnt;
    }
    auto dtok = upload(ltok), dseq = upload(lseq);
    auto dpos = upload(lpos);
    auto dimg = upload(limg);
    auto drows = alloc<int64_t>(slots * n * cols);
    EngramHashArgs a;
    a.layout = view;
    a.token_map = dmap.get();
    a.map_size = static_cast<int64_t>(map.size());
    a.pad = static_cast<int32_t>(hasher->pad());
    a.n = n;
    a.tokens = dtok.get();
    a.is_image = dimg.get();
    a.seq = dseq.get();
    a.pos = dpos.get();
    a.recent = recent.get();
    a.next_pos = next_pos.get();
    a.rows = drows.get();
    ASSERT_TRUE(engram_hash(a, nullptr).ok());
    const auto got = download(drows);
    size_t bad = 0, first = got.size();
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want_rows[i] && bad++ == 0) first = i;
    std::printf("PARITY %-40s n=%zu mismatches=%zu (bit-exact required)\n",
                ("engram hash launch " + std::to_string(li)).c_str(), got.size(), bad);
    EXPECT_EQ(bad, 0u) << "launch " << li << ": first mismatch at " << first << " (slot " << first / (n * cols)
                       << ", token " << (first / cols) % n << ", column " << first % cols << "): gpu "
                       << (first < got.size() ? got[first] : 0) << " cpu "
                       << (first < got.size() ? want_rows[first] : 0);
    const auto np = download(next_pos);
    for (int64_t s = 0; s < S; ++s) EXPECT_EQ(np[s], done[s]) << "next_pos of sequence " << s << " after launch " << li;
  }
}

// ---- gather + dequant + quantization --------------------------------------------------------------

struct TableHost {
  int64_t rows = 0, hd = 0;
  bool bf16 = false;
  std::vector<uint8_t> data, scale;
};

TableHost random_table(int64_t rows, int64_t hd, bool bf16, uint32_t seed) {
  TableHost t;
  t.rows = rows;
  t.hd = hd;
  t.bf16 = bf16;
  std::mt19937 rng(seed);
  if (bf16) {
    const auto v = bf16_bits(random_bf16(rows * hd, seed, 0.3f));
    t.data.resize(v.size() * 2);
    std::memcpy(t.data.data(), v.data(), t.data.size());
  } else {
    t.data.resize(rows * hd);
    for (auto& c : t.data) {
      c = static_cast<uint8_t>(rng());
      if ((c & 0x7F) == 0x7F) c ^= 1;  // no NaN codes
    }
    std::fill_n(t.data.begin() + 5 * hd, hd, uint8_t{0});  // an all-zero row: the 1e-4 amax floor
    t.scale.resize(rows * hd / 32);
    for (auto& s : t.scale) s = static_cast<uint8_t>(100 + rng() % 24);  // 2^-27 .. 2^-4
  }
  return t;
}

EngramWeights cpu_table(const TableHost& t) {
  EngramWeights w;
  w.table_format = t.bf16 ? WeightFormat::BF16 : WeightFormat::FP8Rows;
  w.table = t.data.data();
  w.table_scale = t.bf16 ? nullptr : t.scale.data();
  w.rows = t.rows;
  w.head_dim = t.hd;
  return w;
}

struct GatherOut {
  std::vector<float> E, scales;
  std::vector<uint16_t> codes;
  int32_t bad = 0;
};

GatherOut run_gather(const TableHost& t, const uint8_t* table, const uint8_t* scale, const std::vector<int64_t>& rows,
                     int64_t n, int64_t cols) {
  auto drows = upload(rows);
  auto dE = alloc<float>(n * cols * t.hd);
  auto dcodes = alloc<uint16_t>(n * cols * t.hd);
  auto dscales = alloc<float>(n * cols * t.hd / 32);
  auto dbad = upload(std::vector<int32_t>{0});
  EngramGatherArgs a;
  a.n = n;
  a.cols = cols;
  a.head_dim = t.hd;
  a.rows = drows.get();
  a.table_rows = t.rows;
  a.bf16_table = t.bf16;
  a.table = table;
  a.table_scale = scale;
  a.E = dE.get();
  a.codes = dcodes.get();
  a.scales = dscales.get();
  a.bad_row = dbad.get();
  const Status s = engram_gather_quant(a, nullptr);
  EXPECT_TRUE(s.ok()) << s.error().message;
  GatherOut o;
  o.E = download(dE);
  o.codes = download(dcodes);
  o.scales = download(dscales);
  o.bad = download(dbad)[0];
  return o;
}

// Codes and scales against the CPU recipe applied to E (bit-exact); returns mismatches.
size_t check_codes(const std::vector<float>& E, const GatherOut& o) {
  size_t bad = 0;
  for (size_t b = 0; b < E.size() / 32; ++b) {
    std::array<uint8_t, 32> q{};
    const uint8_t sb = quantize_act_block32(std::span<const float, 32>(E.data() + 32 * b, 32), q);
    bad += o.scales[b] == ue8m0_to_f32(sb) ? 0 : 1;
    for (int i = 0; i < 32; ++i) {
      const float want = e4m3_to_f32(q[i]), got = half_bits_to_float(o.codes[32 * b + i]);
      bad += (got == want && std::signbit(got) == std::signbit(want)) ? 0 : 1;
    }
  }
  return bad;
}

void check_gather(bool bf16) {
  const int64_t n = 3, cols = 24, hd = 256;
  const TableHost t = random_table(3000, hd, bf16, bf16 ? 61 : 62);
  std::vector<int64_t> rows(n * cols);
  std::mt19937 rng(7);
  for (auto& r : rows) r = rng() % t.rows;
  rows[0] = t.rows - 1;
  rows[1] = 5;  // the all-zero FP8 row
  std::vector<float> want(n * cols * hd);
  ASSERT_TRUE(engram_gather(rows, cpu_table(t), want).ok());
  auto dtab = upload(t.data);
  auto dsc = upload(t.scale);
  const GatherOut o = run_gather(t, dtab.get(), bf16 ? nullptr : dsc.get(), rows, n, cols);
  const std::string tag = std::string("engram gather ") + (bf16 ? "bf16" : "fp8") + " table";
  const Tolerance exact{.max_nmse = 0, .min_cosine = 0, .rel = 0, .abs = 0};
  // Dequant is the same exact product and the same bf16 rounding: bit-exact.
  EXPECT_TRUE(parity(tag + " E", o.E, want, exact));
  const size_t bad = check_codes(want, o);
  std::printf("PARITY %-40s n=%zu mismatches=%zu (bit-exact required)\n", (tag + " fp8 quant").c_str(), want.size(),
              bad);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(o.bad, 0);

  // The same table in mapped pinned host memory (how a 98 GB table is served): identical results.
  uint8_t* host = nullptr;
  uint8_t* host_scale = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&host), t.data.size(), cudaHostAllocMapped), cudaSuccess);
  std::memcpy(host, t.data.data(), t.data.size());
  uint8_t* dev_view = nullptr;
  uint8_t* dev_scale_view = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_view), host, 0), cudaSuccess);
  if (!bf16) {
    ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&host_scale), t.scale.size(), cudaHostAllocMapped), cudaSuccess);
    std::memcpy(host_scale, t.scale.data(), t.scale.size());
    ASSERT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_scale_view), host_scale, 0), cudaSuccess);
  }
  const GatherOut oh = run_gather(t, dev_view, dev_scale_view, rows, n, cols);
  EXPECT_TRUE(parity(tag + " E (host-mapped table)", oh.E, want, exact));
  EXPECT_EQ(oh.codes, o.codes) << "host-mapped table: codes differ from the device table's";
  EXPECT_EQ(oh.scales, o.scales);
  cudaFreeHost(host);
  if (host_scale) cudaFreeHost(host_scale);
}

TEST(CudaEngramGather, DequantAndQuantBitExactFromDeviceAndHostTables) {
  CEDAR_REQUIRE_GPU();
  check_gather(false);
  check_gather(true);
}

TEST(CudaEngramGather, RowsOutsideTheTableGiveZerosAndAFlag) {
  CEDAR_REQUIRE_GPU();
  const TableHost t = random_table(100, 64, false, 63);
  auto dtab = upload(t.data);
  auto dsc = upload(t.scale);
  const std::vector<int64_t> rows = {3, 100, 7, -1};  // n = 2 tokens × 2 columns
  const GatherOut o = run_gather(t, dtab.get(), dsc.get(), rows, 2, 2);
  EXPECT_EQ(o.bad, 4) << "bad_row = 1 + the largest flat index of an out-of-range row";
  for (int64_t c = 0; c < 64; ++c) {
    EXPECT_EQ(o.E[1 * 64 + c], 0.0f);
    EXPECT_EQ(o.E[3 * 64 + c], 0.0f);
  }
  EXPECT_NE(std::count(o.E.begin(), o.E.begin() + 64, 0.0f), 64) << "row 3 is a real row";
}

// ---- the whole Engram layer ------------------------------------------------------------------------

// The gate in double from the streams X, qk and kv (an independent reference for one (token, stream)).
double gate_ref(const float* x, const float* wk, const float* key, int64_t d, double* dot_out, double* abs_sum) {
  double dot = 0, sx = 0, sk = 0, a = 0;
  for (int64_t c = 0; c < d; ++c) {
    const double t = double(x[c]) * wk[c] * key[c];
    dot += t;
    a += std::fabs(t);
    sx += double(x[c]) * x[c];
    sk += double(key[c]) * key[c];
  }
  const double rstd = 1.0 / std::sqrt(sx / d + 1e-20) / std::sqrt(sk / d + 1e-20) / std::sqrt(double(d));
  *dot_out = dot * rstd;
  *abs_sum = a * rstd;
  const double root = std::copysign(std::sqrt(std::max(std::fabs(*dot_out), 1e-6)), *dot_out);
  return 1.0 / (1.0 + std::exp(-root));
}

// Bound on |g_fp32 − g_ref| for a blocked (per-thread chunk of `per_lane` terms + `levels` reduction
// steps) fp32 evaluation: Δdot from the sums and the rsqrt factors, then through sqrt and sigmoid.
double gate_bound(double dot, double abs_sum, int64_t per_lane, int64_t levels) {
  const double sum_err = (per_lane + levels + 1) * kU * abs_sum;            // the dot sum (+ one product rounding)
  const double scale_err = (per_lane + levels + 12) * kU * std::fabs(dot);  // two rsqrt(mean) and two products
  const double ddot = 2.0 * (sum_err + scale_err);                          // factor 2: headroom
  const double m = std::max(std::fabs(dot), 1e-6);
  return 0.25 * ddot / (2.0 * std::sqrt(m)) + 4 * kU;  // sigmoid' <= 1/4; exp, division
}

TEST(CudaEngram, LayerMatchesEngramForward) {
  CEDAR_REQUIRE_GPU();
  const int64_t n = 3, hc = 4, d = 512, cols = 24, hd = 256, e_width = cols * hd, kv_width = (hc + 1) * d;
  const TableHost t = random_table(2000, hd, false, 71);
  TableHost tq = t;
  for (auto& s : tq.scale) s = static_cast<uint8_t>(112 + s % 8);  // E values up to ~1.75
  std::vector<int64_t> rows(n * cols);
  std::mt19937 rng(8);
  for (auto& r : rows) r = rng() % tq.rows;
  const std::vector<uint8_t> image = {0, 0, 1};  // token 2: image (g = 0)
  QuantWeightHost wkv = random_fp8_weight(kv_width, e_width, 72, 116);
  const auto q = random_bf16(hc * d, 73, 1.0f), k = random_bf16(hc * d, 74, 1.0f);
  std::vector<float> qk(hc * d);
  for (int64_t i = 0; i < hc * d; ++i) qk[i] = q[i] * k[i];  // exact (bf16 × bf16)
  const auto X0 = random_acts(n * hc * d, 75, 1.0f, -3, 2);

  EngramWeights w = cpu_table(tq);
  w.wkv = wkv.cpu;
  w.q_weight = q;
  w.k_weight = k;
  const EngramParams p{.hc = hc, .dim = d, .n_cols = cols};
  std::vector<float> X_cpu = X0;
  ASSERT_TRUE(engram_forward(X_cpu, n, rows, image, w, p, nullptr).ok());
  // The CPU's kv (the same calls engram_forward makes), for the kv check and the bounds.
  std::vector<float> E_cpu(n * e_width), kv_cpu(n * kv_width);
  ASSERT_TRUE(engram_gather(rows, w, E_cpu).ok());
  ASSERT_TRUE(cpu::linear(wkv.cpu, E_cpu, n, kv_cpu, {.bf16_output = true, .act_block = 32}, nullptr).ok());

  // Device: gather+quant → wkv GEMV (bf16) → gated update.
  auto dtab = upload(tq.data), dsc = upload(tq.scale), dwkv = upload(wkv.data), dwkvs = upload(wkv.scales);
  auto drows = upload(rows);
  auto dimg = upload(image);
  auto dqk = upload(qk);
  auto dX = upload(X0);
  auto codes = alloc<uint16_t>(n * e_width);
  auto scales = alloc<float>(n * e_width / 32);
  auto kv = alloc<float>(n * kv_width);
  auto gates = alloc<float>(n * hc);
  EngramGatherArgs ga;
  ga.n = n;
  ga.cols = cols;
  ga.head_dim = hd;
  ga.rows = drows.get();
  ga.table_rows = tq.rows;
  ga.table = dtab.get();
  ga.table_scale = dsc.get();
  ga.codes = codes.get();
  ga.scales = scales.get();
  ASSERT_TRUE(engram_gather_quant(ga, nullptr).ok());
  ASSERT_TRUE(
      gemv_quantized(view_of(wkv, dwkv.get(), dwkvs.get()), codes.get(), scales.get(), n, kv.get(), true, nullptr)
          .ok());
  EngramUpdateArgs ua;
  ua.n = n;
  ua.hc = hc;
  ua.d = d;
  ua.X = dX.get();
  ua.kv = kv.get();
  ua.qk = dqk.get();
  ua.is_image = dimg.get();
  ua.gates = gates.get();
  ASSERT_TRUE(engram_update(ua, nullptr).ok());

  const auto kv_gpu = download(kv);
  const Tolerance& gemv_tol = testing::kBlockSumTol;
  const auto kv_bound = abs_bound(wkv, E_cpu, n);
  EXPECT_TRUE(parity("engram kv (wkv GEMV)", kv_gpu, kv_cpu, gemv_tol, kv_bound));

  // Gates: against the double reference on the GPU's own kv, within the blocked-fp32 bound (the GPU
  // sums d/256 terms per thread, then 5 + 8 levels).
  const auto g_gpu = download(gates);
  std::vector<float> g_want(n * hc), g_bound(n * hc), dg_total(n * hc);
  for (int64_t tk = 0; tk < n * hc; ++tk) {
    const int64_t tt = tk / hc, kk = tk % hc;
    double dot, asum, dot_c, asum_c;
    const double g =
        gate_ref(X0.data() + tk * d, qk.data() + kk * d, kv_gpu.data() + tt * kv_width + kk * d, d, &dot, &asum);
    const double g_c =
        gate_ref(X0.data() + tk * d, qk.data() + kk * d, kv_cpu.data() + tt * kv_width + kk * d, d, &dot_c, &asum_c);
    g_want[tk] = image[tt] ? 0.0f : static_cast<float>(g);
    g_bound[tk] = image[tt] ? 0.0f : static_cast<float>(gate_bound(dot, asum, d / 256, 13));
    // The CPU's own gate error (index-order sums of d terms) and the effect of any kv difference.
    dg_total[tk] =
        image[tt] ? 0.0f : static_cast<float>(g_bound[tk] + gate_bound(dot_c, asum_c, d, 0) + std::fabs(g - g_c));
  }
  const Tolerance gtol{.max_nmse = 1e-8, .min_cosine = 0.9999999, .bound_scale = 1.0};
  EXPECT_TRUE(parity("engram gates vs double reference", g_gpu, g_want, gtol, g_bound));

  // Streams: X_k ← bf16(X_k + g·v). Per element: |v|·Δg (both sides' gate errors and kv effects),
  // g·|Δv| where the GEMVs differ, and one bf16 rounding flip of the result.
  const auto X_gpu = download(dX);
  std::vector<float> xb(X_gpu.size());
  for (int64_t tt = 0; tt < n; ++tt)
    for (int64_t kk = 0; kk < hc; ++kk)
      for (int64_t c = 0; c < d; ++c) {
        const size_t i = static_cast<size_t>((tt * hc + kk) * d + c);
        const float v = kv_cpu[tt * kv_width + hc * d + c], dv = std::fabs(kv_gpu[tt * kv_width + hc * d + c] - v);
        const double shift = std::fabs(v) * dg_total[tt * hc + kk] + dv;
        xb[i] = static_cast<float>(shift + 0x1p-7 * (std::fabs(X_cpu[i]) + shift));
      }
  const Tolerance xtol{.max_nmse = 1e-6, .min_cosine = 0.999999, .bound_scale = 1.0};
  EXPECT_TRUE(parity("engram streams vs engram_forward", X_gpu, X_cpu, xtol, xb));
  // Image token: g = 0, so its streams are unchanged, bit for bit (bf16(x + 0·v) = x).
  for (int64_t i = 2 * hc * d; i < 3 * hc * d; ++i) ASSERT_EQ(X_gpu[i], X0[i]) << "image token stream value " << i;
}

}  // namespace
}  // namespace cedar::cuda
