// Engram (architecture.md §3.9): NumPy RNG reproduction, prime table and multipliers against the spec's
// values, hand-computed hash rows, history carried across chunks, DEAD/pad rules, table dequant and the
// gated stream update against a double-precision formulation.
#include "model/engram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"

namespace cedar {
namespace {

const std::string kDataDir = CEDAR_TEST_DATA_DIR;

ModelConfig real_config() {
  auto c = load_model_config(kDataDir + "/configs/deepseek_v41_flash");
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return *c;
}

// A small config: one Engram layer (id 1) with N = 3, 2 heads, primes from 10: 11 13 | 17 19 (Σ 60).
ModelConfig small_config() {
  ModelConfig c;
  c.engram_layer_ids = {1};
  c.engram_num_embeddings = {60};
  c.engram_max_ngram_size = 3;
  c.engram_vocab_size = 10;
  c.engram_n_heads = 2;
  c.engram_head_dim = 32;
  c.engram_pad_id = 2;
  c.engram_compressed_vocab_size = 99092;  // same bound as the real model: layer 1's spec multipliers
  return c;
}

// ---- NumPy reproduction --------------------------------------------------------------------------

// Values printed by NumPy 2.4.6: np.random.default_rng(seed).integers(low, high, n, dtype=np.int64).
TEST(NumpyRng, IntegersMatchNumPy) {
  struct Case {
    uint64_t seed;
    int64_t low, high;
    std::vector<int64_t> want;
  };
  const std::vector<Case> cases = {
      {10007, 0, 46539438283891, {38316048023122, 2419938046656, 17979836159674, 36993668729195}},
      {140098, 0, 46539438283891, {33858405369630, 25755403400457, 15460673601360, 41309613242795}},
      {0, 0, 46539438283891, {29643839136299, 12555722115027, 1906884788502, 769186873658}},
      // ranges within 32 bits: NumPy's 32-bit Lemire path on buffered half-words
      {0, 0, 7, {5, 4, 3, 1, 2, 0, 0, 0}},
      {12345, 0, 1000003, {699217, 227336, 788649, 316759, 204177, 797367}},
      {99, 0, 4294967296, {4115325593, 2173385197, 3254087975, 2427050077, 763719178}},
      {99, 0, 4294967297, {2173385198, 2427050078, 2198662305, 4175508674, 2640988885}},
      {18446744073709551615ULL, -5, 3, {-1, 0, 2, 1, -3, -5}},
      {123456789, -1099511627776, 4611686018427387904,
       {127801383240358197, 4064710202531613957, 2881829615582166252, 3646528208792326229}},
      {7, 0, 9223372036854775807, {5765488047046174020, 8275336682942969161, 7154437704795913392}},
      {42, INT64_MIN, INT64_MAX, {5053597115156604551, -1127493779279708224, 6614964053969868323}},
  };
  for (const auto& c : cases)
    EXPECT_EQ(numpy_default_rng_integers(c.seed, c.low, c.high, static_cast<int64_t>(c.want.size())), c.want)
        << "seed " << c.seed << " [" << c.low << ", " << c.high << ")";
}

TEST(Primes, MillerRabinAgreesWithTrialDivision) {
  auto trial = [](uint64_t n) {
    if (n < 2) return false;
    for (uint64_t p = 2; p * p <= n; ++p)
      if (n % p == 0) return false;
    return true;
  };
  for (uint64_t n = 0; n < 20000; ++n) ASSERT_EQ(is_prime_u64(n), trial(n)) << n;
  for (uint64_t n = 15999900; n < 16001000; ++n) ASSERT_EQ(is_prime_u64(n), trial(n)) << n;
  EXPECT_TRUE(is_prime_u64((uint64_t{1} << 61) - 1));          // Mersenne prime
  EXPECT_TRUE(is_prime_u64(18446744073709551557ULL));          // largest 64-bit prime
  EXPECT_FALSE(is_prime_u64(3215031751ULL));                   // strong pseudoprime to bases 2, 3, 5, 7
  EXPECT_FALSE(is_prime_u64(3825123056546413051ULL));          // strong pseudoprime to bases 2..23
  EXPECT_FALSE(is_prime_u64(uint64_t{4294967291} * 4294967279));  // product of two 32-bit primes
}

// ---- Layout of the released config ---------------------------------------------------------------

TEST(EngramLayout, RealConfigMultipliersMatchSpec) {
  auto l = EngramLayout::create(real_config());
  ASSERT_TRUE(l.ok()) << l.error().message;
  ASSERT_EQ(l->n_slots(), 2);
  EXPECT_EQ(l->layer_id(0), 1);
  EXPECT_EQ(l->layer_id(1), 14);
  EXPECT_EQ(l->slot_of_layer(14), 1);
  EXPECT_EQ(l->slot_of_layer(2), -1);
  const std::vector<int64_t> m1(l->multipliers(0).begin(), l->multipliers(0).end());
  const std::vector<int64_t> m14(l->multipliers(1).begin(), l->multipliers(1).end());
  EXPECT_EQ(m1, (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
  EXPECT_EQ(m14, (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
}

TEST(EngramLayout, RealConfigPrimesOffsetsAndSumsMatchSpec) {
  auto l = EngramLayout::create(real_config());
  ASSERT_TRUE(l.ok()) << l.error().message;
  const std::vector<int64_t> p1 = {16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183,
                                   16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321,
                                   16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463};
  const std::vector<int64_t> p14 = {16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627,
                                    16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769,
                                    16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889};
  EXPECT_EQ(l->cols(), 24);
  EXPECT_EQ(std::vector<int64_t>(l->primes(0).begin(), l->primes(0).end()), p1);
  EXPECT_EQ(std::vector<int64_t>(l->primes(1).begin(), l->primes(1).end()), p14);
  for (int64_t slot = 0; slot < 2; ++slot) {
    const auto& p = slot == 0 ? p1 : p14;
    int64_t running = 0;
    for (int64_t col = 0; col < 24; ++col) {
      EXPECT_EQ(l->offsets(slot)[col], running) << slot << "," << col;
      running += p[col];
    }
    EXPECT_EQ(running, slot == 0 ? 384006168 : 384016682);
    EXPECT_EQ(l->num_embeddings(slot), running);
  }
}

TEST(EngramLayout, NumEmbeddingsMismatchIsAClearError) {
  ModelConfig c = real_config();
  c.engram_num_embeddings[1] += 1;
  auto l = EngramLayout::create(c);
  ASSERT_FALSE(l.ok());
  const std::string& msg = l.error().message;
  EXPECT_NE(msg.find("layer 14"), std::string::npos) << msg;
  EXPECT_NE(msg.find("384016683"), std::string::npos) << msg;
  EXPECT_NE(msg.find("384016682"), std::string::npos) << msg;

  ModelConfig d = small_config();
  d.engram_num_embeddings = {60, 70};
  EXPECT_FALSE(EngramLayout::create(d).ok());
  ModelConfig e = small_config();
  e.engram_max_ngram_size = 1;
  EXPECT_FALSE(EngramLayout::create(e).ok());
  ModelConfig f = small_config();
  f.engram_layer_ids = {-1};
  EXPECT_FALSE(EngramLayout::create(f).ok());
}

TEST(EngramLayout, ConfigWithoutEngramIsEmpty) {
  ModelConfig c;
  auto l = EngramLayout::create(c);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->n_slots(), 0);
}

// ---- Row computation -----------------------------------------------------------------------------

// Expected values computed with NumPy int64 arithmetic (products and XOR wrap, % is a floor modulo):
//   M = [76632096046245, 4839876093313, 35959672319349] (layer 1's first three multipliers)
//   (5, 7, 3):  5·M0 = 383160480231225, 7·M1 = 33879132653191, r1 = 354779766860222,
//               3·M2 = 107879016958047, r2 = 317441360404961
//               rows = [r1 % 11 + 0, r1 % 13 + 11, r2 % 17 + 24, r2 % 19 + 41] = [0, 13, 38, 55]
//   (2^50, 3, 2^45): 2^50·M0 wraps to -967148019977814016, r1 = -967133500349534077 (negative),
//               r2 = 2826762157617131651 → rows [1, 23, 24, 52]
TEST(EngramLayout, RowsOfHandComputedExamples) {
  auto l = EngramLayout::create(small_config());
  ASSERT_TRUE(l.ok()) << l.error().message;
  EXPECT_EQ(std::vector<int64_t>(l->primes(0).begin(), l->primes(0).end()), (std::vector<int64_t>{11, 13, 17, 19}));
  EXPECT_EQ(std::vector<int64_t>(l->offsets(0).begin(), l->offsets(0).end()), (std::vector<int64_t>{0, 11, 24, 41}));
  EXPECT_EQ(std::vector<int64_t>(l->multipliers(0).begin(), l->multipliers(0).end()),
            (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349}));
  std::vector<int64_t> rows(4);
  l->rows(0, std::vector<int64_t>{5, 7, 3}, rows);
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 13, 38, 55}));
  l->rows(0, std::vector<int64_t>{int64_t{1} << 50, 3, int64_t{1} << 45}, rows);
  EXPECT_EQ(rows, (std::vector<int64_t>{1, 23, 24, 52}));
  l->rows(0, std::vector<int64_t>{0, 0, 0}, rows);
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 11, 24, 41}));
}

// ---- Hasher: context, DEAD/pad, history across chunks ----------------------------------------------

// Token map for the small config: 300 raw ids, compressed id = raw % 150 + 1 except raw 2 (pad) → 0.
std::vector<int32_t> small_map() {
  std::vector<int32_t> m(300);
  for (int i = 0; i < 300; ++i) m[i] = i % 150 + 1;
  m[2] = 0;
  return m;
}

ModelConfig small_config_for_map() {
  ModelConfig c = small_config();
  c.engram_compressed_vocab_size = 151;
  return c;
}

TEST(EngramHasher, ValidatesTheTokenMap) {
  EXPECT_TRUE(EngramHasher::create(small_config_for_map(), small_map()).ok());
  ModelConfig c = small_config_for_map();
  c.engram_compressed_vocab_size = 152;
  auto bad = EngramHasher::create(c, small_map());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("151 compressed ids"), std::string::npos) << bad.error().message;
  std::vector<int32_t> neg = small_map();
  neg[7] = -3;
  EXPECT_FALSE(EngramHasher::create(small_config_for_map(), neg).ok());
  ModelConfig far = small_config_for_map();
  far.engram_pad_id = 300;
  EXPECT_FALSE(EngramHasher::create(far, small_map()).ok());
}

// N = 3 here; written out by hand for tokens t0..t5 with t2 an image token (T = map, pad = T[2] = 0):
//   p0: [T0, pad, pad]   p1: [T1, T0, pad]   p2 (DEAD): [pad, pad, pad]
//   p3: [T3, pad, pad]   p4: [T4, T3, pad]   p5: [T5, T4, T3]
TEST(EngramHasher, PadAtSequenceStartAndStickyDeadImageTokens) {
  auto h = EngramHasher::create(small_config_for_map(), small_map());
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(h->pad(), 0);
  const std::vector<int64_t> tokens = {17, 40, 9, 250, 3, 160};
  const std::vector<uint8_t> image = {0, 0, 1, 0, 0, 0};
  auto T = [&](int i) { return int64_t{small_map()[tokens[i]]}; };
  const int64_t pad = 0;
  const std::vector<std::vector<int64_t>> ctx = {{T(0), pad, pad}, {T(1), T(0), pad}, {pad, pad, pad},
                                                 {T(3), pad, pad}, {T(4), T(3), pad}, {T(5), T(4), T(3)}};
  EngramHistory hist;
  std::vector<int64_t> rows(6 * 4);
  ASSERT_TRUE(h->hash_chunk(0, tokens, image, hist, rows).ok());
  for (int p = 0; p < 6; ++p) {
    std::vector<int64_t> want(4);
    h->layout().rows(0, ctx[p], want);
    EXPECT_EQ(std::vector<int64_t>(rows.begin() + p * 4, rows.begin() + p * 4 + 4), want) << "position " << p;
  }
  EXPECT_EQ(hist.next_pos, 6);
  EXPECT_EQ(hist.recent, (std::vector<int64_t>{T(4), T(5)}));

  // Without image flags, position 2 is an ordinary token; raw id 2 hashes exactly like padding.
  EngramHistory h2;
  ASSERT_TRUE(h->hash_chunk(0, tokens, {}, h2, rows).ok());
  std::vector<int64_t> want(4);
  h->layout().rows(0, std::vector<int64_t>{T(3), T(2), T(1)}, want);
  EXPECT_EQ(std::vector<int64_t>(rows.begin() + 12, rows.begin() + 16), want);
  EngramHistory h3;
  std::vector<int64_t> pad_rows(2 * 4);
  ASSERT_TRUE(h->hash_chunk(0, std::vector<int64_t>{2, 2}, {}, h3, pad_rows).ok());
  h->layout().rows(0, std::vector<int64_t>{pad, pad, pad}, want);
  EXPECT_EQ(std::vector<int64_t>(pad_rows.begin() + 4, pad_rows.end()), want);
}

TEST(EngramHasher, ChunkedHashingEqualsOneShot) {
  auto h = EngramHasher::create(real_config(), [] {
    std::vector<int32_t> m(129280);
    for (int i = 0; i < 129280; ++i) m[i] = i % 99092;  // any map with 99092 classes
    return m;
  }());
  ASSERT_TRUE(h.ok()) << h.error().message;
  const int64_t n = 40, slots = 2, cols = 24;
  std::mt19937 rng(5);
  std::vector<int64_t> tokens(n);
  std::vector<uint8_t> image(n);
  for (int64_t i = 0; i < n; ++i) {
    tokens[i] = rng() % 129280;
    image[i] = (i >= 11 && i < 14) || i == 30;  // an image span and a lone image token
  }
  std::vector<int64_t> one_shot(slots * n * cols);
  EngramHistory h1;
  ASSERT_TRUE(h->hash_chunk(0, tokens, image, h1, one_shot).ok());

  for (int64_t chunk : {1, 2, 3, 7, 16}) {
    EngramHistory hist;
    std::vector<int64_t> chunked(slots * n * cols);
    for (int64_t p0 = 0; p0 < n; p0 += chunk) {
      const int64_t m = std::min(chunk, n - p0);
      std::vector<int64_t> part(slots * m * cols);
      ASSERT_TRUE(h->hash_chunk(p0, std::span<const int64_t>(tokens).subspan(p0, m),
                                std::span<const uint8_t>(image).subspan(p0, m), hist, part)
                      .ok());
      for (int64_t s = 0; s < slots; ++s)
        std::copy(part.begin() + s * m * cols, part.begin() + (s + 1) * m * cols, chunked.begin() + (s * n + p0) * cols);
    }
    EXPECT_EQ(chunked, one_shot) << "chunk " << chunk;
    EXPECT_EQ(hist.next_pos, h1.next_pos);
    EXPECT_EQ(hist.recent, h1.recent);
  }
}

// Resuming at position p from the preceding tokens (prefix cache): hashing on from there gives the
// rows of the uninterrupted run.
TEST(EngramHasher, HistoryAtPositionResumesHashing) {
  auto h = EngramHasher::create(real_config(), [] {
    std::vector<int32_t> m(129280);
    for (int i = 0; i < 129280; ++i) m[i] = (129279 - i) % 99092;
    return m;
  }());
  ASSERT_TRUE(h.ok()) << h.error().message;
  const int64_t n = 30, slots = 2, cols = 24;
  std::mt19937 rng(9);
  std::vector<int64_t> tokens(n);
  for (auto& t : tokens) t = rng() % 129280;
  std::vector<int64_t> one_shot(slots * n * cols);
  EngramHistory h1;
  ASSERT_TRUE(h->hash_chunk(0, tokens, {}, h1, one_shot).ok());
  for (int64_t p : {0, 1, 2, 3, 4, 17}) {
    for (int64_t given : {p, std::min<int64_t>(p, 3)}) {  // all preceding tokens, or just the last N−1
      auto hist = h->history_at(p, std::span<const int64_t>(tokens).subspan(p - given, given));
      ASSERT_TRUE(hist.ok()) << hist.error().message;
      std::vector<int64_t> rest(slots * (n - p) * cols);
      ASSERT_TRUE(h->hash_chunk(p, std::span<const int64_t>(tokens).subspan(p), {}, *hist, rest).ok());
      for (int64_t s = 0; s < slots; ++s)
        EXPECT_TRUE(std::equal(rest.begin() + s * (n - p) * cols, rest.begin() + (s + 1) * (n - p) * cols,
                               one_shot.begin() + (s * n + p) * cols))
            << "position " << p << ", " << given << " tokens given, slot " << s;
    }
  }
  auto too_few = h->history_at(10, std::span<const int64_t>(tokens).subspan(8, 2));
  ASSERT_FALSE(too_few.ok());
  EXPECT_NE(too_few.error().message.find("needs the last 3 tokens, got 2"), std::string::npos)
      << too_few.error().message;
  EXPECT_FALSE(h->history_at(1, std::span<const int64_t>(tokens).first(2)).ok());  // more than the position
  const std::vector<int64_t> bad{5, 200000, 6};
  auto out_of_map = h->history_at(3, bad);
  ASSERT_FALSE(out_of_map.ok());
  EXPECT_NE(out_of_map.error().message.find("200000 at position 1"), std::string::npos) << out_of_map.error().message;
}

TEST(EngramHasher, RejectsInconsistentCalls) {
  auto h = EngramHasher::create(small_config_for_map(), small_map());
  ASSERT_TRUE(h.ok());
  EngramHistory hist;
  std::vector<int64_t> rows(4);
  EXPECT_FALSE(h->hash_chunk(1, std::vector<int64_t>{5}, {}, hist, rows).ok());  // history is at 0
  const Status out_of_map = h->hash_chunk(0, std::vector<int64_t>{300}, {}, hist, rows);
  ASSERT_FALSE(out_of_map.ok());
  EXPECT_NE(out_of_map.error().message.find("300"), std::string::npos);
  EXPECT_EQ(hist.next_pos, 0);  // a failed call leaves the history alone
  std::vector<int64_t> small(3);
  EXPECT_FALSE(h->hash_chunk(0, std::vector<int64_t>{5}, {}, hist, small).ok());
  EXPECT_FALSE(h->hash_chunk(0, std::vector<int64_t>{5}, std::vector<uint8_t>{0, 0}, hist, rows).ok());
  // An out-of-map id inside an image span is never looked up.
  EXPECT_TRUE(h->hash_chunk(0, std::vector<int64_t>{100000}, std::vector<uint8_t>{1}, hist, rows).ok());
}

// ---- Gate, gather, forward --------------------------------------------------------------------------

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(EngramGate, SignedSqrtWithFloorAndCopysign) {
  EXPECT_FLOAT_EQ(engram_gate(0.0f), float(sigmoid(1e-3)));
  EXPECT_FLOAT_EQ(engram_gate(-0.0f), float(sigmoid(-1e-3)));
  EXPECT_GT(engram_gate(0.0f), 0.5f);
  EXPECT_LT(engram_gate(-0.0f), 0.5f);
  EXPECT_FLOAT_EQ(engram_gate(1e-9f), engram_gate(0.0f));  // |dot| floored at 1e-6
  EXPECT_FLOAT_EQ(engram_gate(-1e-9f), engram_gate(-0.0f));
  EXPECT_FLOAT_EQ(engram_gate(4.0f), float(sigmoid(2.0)));
  EXPECT_FLOAT_EQ(engram_gate(-9.0f), float(sigmoid(-3.0)));
}

TEST(EngramGather, DequantizesPerRowAndPer32Channels) {
  const int64_t rows = 3, hd = 64;
  std::vector<uint8_t> table(rows * hd, 0x38), scale(rows * 2, 127);  // e4m3 0x38 = 1.0, 2^(127-127) = 1
  table[1 * hd + 0] = 0x40;   // 2.0
  table[1 * hd + 33] = 0xBC;  // -1.5
  table[1 * hd + 63] = 0x01;  // 2^-9 (smallest subnormal)
  scale[1 * 2 + 0] = 130;     // ×8 for channels 0..31 of row 1
  scale[1 * 2 + 1] = 120;     // ×2^-7 for channels 32..63
  EngramWeights w{.table = table.data(), .table_scale = scale.data(), .rows = rows, .head_dim = hd};
  std::vector<float> E(2 * hd);
  ASSERT_TRUE(engram_gather(std::vector<int64_t>{1, 2}, w, E).ok());
  EXPECT_EQ(E[0], 16.0f);
  EXPECT_EQ(E[1], 8.0f);
  EXPECT_EQ(E[32], std::ldexp(1.0f, -7));
  EXPECT_EQ(E[33], -1.5f * std::ldexp(1.0f, -7));
  EXPECT_EQ(E[63], std::ldexp(1.0f, -16));
  EXPECT_EQ(E[hd + 5], 1.0f);
  const Status st = engram_gather(std::vector<int64_t>{3, 0}, w, E);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("row 3"), std::string::npos);
}

// A small Engram layer with a BF16 wkv (no activation quantization), so the reference below is plain
// double-precision math of the §3.9 formulas.
struct SmallEngram {
  int64_t hc = 2, d = 64, hd = 32, cols = 3, table_rows = 10;
  std::vector<uint8_t> table, scale, wkv_bytes;
  std::vector<float> wkv_values, q, k;
  EngramWeights weights() const {
    EngramWeights w{.table = table.data(), .table_scale = scale.data(), .rows = table_rows, .head_dim = hd};
    w.wkv = cpu::LinearWeight{.format = WeightFormat::BF16, .out = (hc + 1) * d, .in = cols * hd, .data = wkv_bytes.data()};
    w.q_weight = q;
    w.k_weight = k;
    return w;
  }
  EngramParams params() const { return EngramParams{.hc = hc, .dim = d, .n_cols = cols, .norm_eps = 1e-20}; }
};

SmallEngram make_small_engram(uint32_t seed) {
  SmallEngram e;
  std::mt19937 rng(seed);
  e.table.resize(e.table_rows * e.hd);
  for (auto& b : e.table) b = static_cast<uint8_t>(rng() % 0x7E) | static_cast<uint8_t>(rng() % 2 ? 0x80 : 0);
  e.scale.resize(e.table_rows * e.hd / 32);
  for (auto& b : e.scale) b = static_cast<uint8_t>(118 + rng() % 6);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  const int64_t out = (e.hc + 1) * e.d, in = e.cols * e.hd;
  e.wkv_values.resize(out * in);
  e.wkv_bytes.resize(out * in * 2);
  for (int64_t i = 0; i < out * in; ++i) {
    const uint16_t b = f32_to_bf16(dist(rng));
    e.wkv_values[i] = bf16_to_f32(b);
    e.wkv_bytes[2 * i] = b & 0xFF;
    e.wkv_bytes[2 * i + 1] = b >> 8;
  }
  std::normal_distribution<float> qk(1.0f, 0.3f);
  for (int64_t i = 0; i < e.hc * e.d; ++i) {
    e.q.push_back(round_to_bf16(qk(rng)));
    e.k.push_back(round_to_bf16(qk(rng)));
  }
  return e;
}

// §3.9 in double: E from the table, kv = W·E rounded to bf16 (as the reference's linear stores it),
// per-(token, stream) normalized dot, copysign gate, X + g·value rounded to bf16.
std::vector<double> reference_forward(const SmallEngram& e, const std::vector<float>& X, const std::vector<int64_t>& rows,
                                      const std::vector<uint8_t>& image, int64_t n) {
  std::vector<double> out(X.begin(), X.end());
  const int64_t in = e.cols * e.hd, kvw = (e.hc + 1) * e.d;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> E(in);
    for (int64_t col = 0; col < e.cols; ++col)
      for (int64_t c = 0; c < e.hd; ++c) {
        const int64_t r = rows[t * e.cols + col];
        E[col * e.hd + c] = double(e4m3_to_f32(e.table[r * e.hd + c])) * std::ldexp(1.0, e.scale[r * e.hd / 32 + c / 32] - 127);
      }
    std::vector<double> kv(kvw);
    for (int64_t o = 0; o < kvw; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += double(e.wkv_values[o * in + i]) * E[i];
      kv[o] = round_to_bf16(float(acc));
    }
    for (int64_t k = 0; k < e.hc; ++k) {
      double sx = 0, sk = 0, dot = 0;
      for (int64_t c = 0; c < e.d; ++c) {
        const double x = X[(t * e.hc + k) * e.d + c], key = kv[k * e.d + c];
        sx += x * x;
        sk += key * key;
        dot += x * double(e.q[k * e.d + c]) * double(e.k[k * e.d + c]) * key;
      }
      dot = dot / std::sqrt(sx / e.d + 1e-20) / std::sqrt(sk / e.d + 1e-20) / std::sqrt(double(e.d));
      const double g = image.size() && image[t] ? 0.0 : sigmoid(std::copysign(std::sqrt(std::max(std::fabs(dot), 1e-6)), dot));
      for (int64_t c = 0; c < e.d; ++c) {
        const int64_t i = (t * e.hc + k) * e.d + c;
        out[i] = X[i] + g * kv[e.hc * e.d + c];
      }
    }
  }
  return out;
}

std::vector<float> random_streams(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> X(count);
  for (auto& x : X) x = round_to_bf16(dist(rng));
  return X;
}

TEST(EngramForward, MatchesDoublePrecisionFormulasAndLeavesImageTokensAlone) {
  const SmallEngram e = make_small_engram(3);
  const int64_t n = 5;
  std::vector<float> X = random_streams(n * e.hc * e.d, 4);
  for (int64_t c = 0; c < e.d; ++c) X[(1 * e.hc + 1) * e.d + c] *= 64.0f;  // streams normalized separately
  std::mt19937 rng(6);
  std::vector<int64_t> rows(n * e.cols);
  for (auto& r : rows) r = rng() % e.table_rows;
  const std::vector<uint8_t> image = {0, 0, 1, 0, 0};
  const std::vector<double> want = reference_forward(e, X, rows, image, n);
  std::vector<float> got = X;
  ASSERT_TRUE(engram_forward(got, n, rows, image, e.weights(), e.params(), nullptr).ok());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], std::fabs(want[i]) * std::ldexp(1.0, -7) + 1e-5) << i;
    EXPECT_EQ(got[i], round_to_bf16(got[i]));
  }
  for (int64_t c = 0; c < e.hc * e.d; ++c) EXPECT_EQ(got[2 * e.hc * e.d + c], X[2 * e.hc * e.d + c]);
}

// bf16-weight checkpoints store the table as BF16 rows (no scales). The rows are fed to wkv as stored,
// so a BF16 table holding the dequantized FP8 values must give the §3.9 double reference of the FP8 one.
TEST(EngramForward, Bf16TableReadsStoredValues) {
  const SmallEngram e = make_small_engram(21);
  std::vector<uint8_t> bf16_table(e.table.size() * 2);
  for (int64_t r = 0; r < e.table_rows; ++r)
    for (int64_t c = 0; c < e.hd; ++c) {
      const double v = double(e4m3_to_f32(e.table[r * e.hd + c])) * std::ldexp(1.0, e.scale[r * e.hd / 32 + c / 32] - 127);
      const uint16_t b = f32_to_bf16(static_cast<float>(v));
      ASSERT_EQ(double(bf16_to_f32(b)), v);  // e4m3 · 2^k is bf16-exact
      bf16_table[2 * (r * e.hd + c)] = b & 0xFF;
      bf16_table[2 * (r * e.hd + c) + 1] = b >> 8;
    }
  EngramWeights w = e.weights();
  w.table_format = WeightFormat::BF16;
  w.table = bf16_table.data();
  w.table_scale = nullptr;

  std::vector<float> E(2 * e.hd);
  ASSERT_TRUE(engram_gather(std::vector<int64_t>{7, 2}, w, E).ok());
  for (int64_t c = 0; c < e.hd; ++c) {
    EXPECT_EQ(E[c], bf16_to_f32(static_cast<uint16_t>(bf16_table[2 * (7 * e.hd + c)] | bf16_table[2 * (7 * e.hd + c) + 1] << 8)));
    EXPECT_EQ(E[e.hd + c], bf16_to_f32(static_cast<uint16_t>(bf16_table[2 * (2 * e.hd + c)] | bf16_table[2 * (2 * e.hd + c) + 1] << 8)));
  }

  const int64_t n = 4;
  const std::vector<float> X = random_streams(n * e.hc * e.d, 22);
  std::mt19937 rng(23);
  std::vector<int64_t> rows(n * e.cols);
  for (auto& r : rows) r = rng() % e.table_rows;
  const std::vector<double> want = reference_forward(e, X, rows, {}, n);
  std::vector<float> got = X;
  ASSERT_TRUE(engram_forward(got, n, rows, {}, w, e.params(), nullptr).ok());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], std::fabs(want[i]) * std::ldexp(1.0, -7) + 1e-5) << i;

  w.table_format = WeightFormat::FP8Rows;  // an FP8 table must come with its scales
  const Status st = engram_forward(got, n, rows, {}, w, e.params(), nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("scales"), std::string::npos) << st.error().message;
}

TEST(EngramForward, ZeroDotGivesThePositiveFloorGate) {
  SmallEngram e = make_small_engram(8);
  std::fill(e.q.begin(), e.q.end(), 0.0f);  // q ⊙ k = 0 → dot = +0 → g = sigmoid(+1e-3)
  const int64_t n = 1;
  const std::vector<float> X = random_streams(e.hc * e.d, 9);
  const std::vector<int64_t> rows = {1, 4, 7};
  std::vector<float> got = X;
  ASSERT_TRUE(engram_forward(got, n, rows, {}, e.weights(), e.params(), nullptr).ok());
  const std::vector<double> zero_image_ref = reference_forward(e, X, rows, {}, n);
  const float g = engram_gate(0.0f);
  EXPECT_NEAR(g, 0.50025, 1e-6);
  for (int64_t i = 0; i < e.hc * e.d; ++i) EXPECT_NEAR(got[i], zero_image_ref[i], std::fabs(zero_image_ref[i]) * 1e-2 + 1e-5);
  // And explicitly: every stream moved by the same g·value.
  for (int64_t c = 0; c < e.d; ++c) {
    const double v0 = (double(got[c]) - X[c]), v1 = (double(got[e.d + c]) - X[e.d + c]);
    EXPECT_NEAR(v0, v1, std::fabs(X[c]) * 1e-2 + std::fabs(X[e.d + c]) * 1e-2 + 1e-3);
  }
}

TEST(EngramForward, TokenBlockingAndThreadsDoNotChangeResults) {
  const SmallEngram e = make_small_engram(12);
  const int64_t n = 9;
  const std::vector<float> X = random_streams(n * e.hc * e.d, 13);
  std::mt19937 rng(14);
  std::vector<int64_t> rows(n * e.cols);
  for (auto& r : rows) r = rng() % e.table_rows;
  std::vector<float> a = X, b = X, c = X;
  ASSERT_TRUE(engram_forward(a, n, rows, {}, e.weights(), e.params(), nullptr).ok());
  EngramParams p = e.params();
  p.token_block = 2;
  ThreadPool pool(2);
  ASSERT_TRUE(engram_forward(b, n, rows, {}, e.weights(), p, &pool).ok());
  EXPECT_EQ(a, b);
  // One token at a time (decode) equals the whole chunk.
  for (int64_t t = 0; t < n; ++t)
    ASSERT_TRUE(engram_forward(std::span<float>(c).subspan(t * e.hc * e.d, e.hc * e.d), 1,
                               std::span<const int64_t>(rows).subspan(t * e.cols, e.cols), {}, e.weights(), e.params(),
                               nullptr)
                    .ok());
  EXPECT_EQ(a, c);
}

// FP8 wkv: the activation is FP8-quantized in blocks of 32 (§3.1) before the GEMM. Reference: quantize E
// with the QDQ recipe of core/numeric, dequantize the weight, multiply in double.
TEST(EngramForward, Fp8WkvUsesActivationQuantization) {
  SmallEngram e = make_small_engram(21);
  const int64_t out = (e.hc + 1) * e.d, in = e.cols * e.hd;
  std::vector<uint8_t> codes(out * in), wscale((out / 32) * (in / 32));
  std::mt19937 rng(22);
  for (auto& c : codes) c = static_cast<uint8_t>(rng() % 0x7E) | static_cast<uint8_t>(rng() % 2 ? 0x80 : 0);
  for (auto& s : wscale) s = static_cast<uint8_t>(115 + rng() % 4);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      e.wkv_values[o * in + i] = e4m3_to_f32(codes[o * in + i]) * ue8m0_to_f32(wscale[(o / 32) * (in / 32) + i / 32]);
  EngramWeights w = e.weights();
  w.wkv = cpu::LinearWeight{.format = WeightFormat::FP8Block, .out = out, .in = in, .data = codes.data(),
                            .scale = wscale.data(), .block_out = 32, .block_in = 32};
  const int64_t n = 2;
  const std::vector<float> X = random_streams(n * e.hc * e.d, 23);
  const std::vector<int64_t> rows = {0, 5, 9, 3, 3, 8};
  std::vector<float> got = X;
  ASSERT_TRUE(engram_forward(got, n, rows, {}, w, e.params(), nullptr).ok());

  std::vector<double> want(X.size());
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> E(in);
    ASSERT_TRUE(engram_gather(std::span<const int64_t>(rows).subspan(t * e.cols, e.cols), w, E).ok());
    ASSERT_TRUE(qdq_fp8_block32_ue8m0(E).ok());  // the activation quantization, as values
    std::vector<double> kv(out);
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += double(e.wkv_values[o * in + i]) * E[i];
      kv[o] = round_to_bf16(float(acc));
    }
    for (int64_t k = 0; k < e.hc; ++k) {
      double sx = 0, sk = 0, dot = 0;
      for (int64_t c = 0; c < e.d; ++c) {
        const double x = X[(t * e.hc + k) * e.d + c], key = kv[k * e.d + c];
        sx += x * x;
        sk += key * key;
        dot += x * double(e.q[k * e.d + c]) * double(e.k[k * e.d + c]) * key;
      }
      dot = dot / std::sqrt(sx / e.d) / std::sqrt(sk / e.d) / std::sqrt(double(e.d));
      const double g = sigmoid(std::copysign(std::sqrt(std::max(std::fabs(dot), 1e-6)), dot));
      for (int64_t c = 0; c < e.d; ++c) want[(t * e.hc + k) * e.d + c] = X[(t * e.hc + k) * e.d + c] + g * kv[e.hc * e.d + c];
    }
  }
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], std::fabs(want[i]) * std::ldexp(1.0, -7) + 1e-5) << i;
}

TEST(EngramForward, RejectsBadShapesAndRows) {
  const SmallEngram e = make_small_engram(30);
  std::vector<float> X = random_streams(e.hc * e.d, 31);
  const Status bad_row = engram_forward(X, 1, std::vector<int64_t>{0, 10, 1}, {}, e.weights(), e.params(), nullptr);
  ASSERT_FALSE(bad_row.ok());
  EXPECT_NE(bad_row.error().message.find("row 10"), std::string::npos) << bad_row.error().message;
  EXPECT_FALSE(engram_forward(X, 2, std::vector<int64_t>{0, 1, 2}, {}, e.weights(), e.params(), nullptr).ok());
  EngramParams p = e.params();
  p.n_cols = 2;
  EXPECT_FALSE(engram_forward(X, 1, std::vector<int64_t>{0, 1}, {}, e.weights(), p, nullptr).ok());
}

}  // namespace
}  // namespace cedar
