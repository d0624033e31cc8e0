// Parity of rope_apply, swa_kv_encode and swa_ring_commit with cpu::RopeTable, cpu::rms_norm, the
// FP8 SWA record format (kv_format.h) and SwaRing (attention_state.h). All bit-exact: the device
// evaluates the CPU's fp32 expressions in the same order with host-computed angles.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_cutest_util.h"
#include "backend/cpu/ops.h"
#include "kv/kv_format.h"
#include "model/attention_state.h"

namespace cedar::cuda {
namespace {

using testing::device_alloc;
using testing::device_filled;
using testing::to_device;
using testing::to_host;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// Counts values whose bits differ (NaN payloads included); reports the first.
size_t count_bit_mismatches(const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (!same_bits(got[i], want[i]) && !(std::isnan(got[i]) && std::isnan(want[i])) && bad++ == 0)
      ADD_FAILURE() << what << ": first mismatch at " << i << ": gpu " << got[i] << " cpu " << want[i];
  return bad;
}
size_t count_byte_mismatches(const std::string& what, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                             int64_t record_bytes) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && bad++ == 0)
      ADD_FAILURE() << what << ": first byte mismatch in record " << i / record_bytes << " at byte " << i % record_bytes
                    << ": gpu 0x" << std::hex << int(got[i]) << " cpu 0x" << int(want[i]);
  return bad;
}

// ---- RoPE ------------------------------------------------------------------------------------------

void check_rope(const cpu::RopeConfig& cfg, int64_t n_vec, int64_t width, const std::vector<int64_t>& positions,
                int64_t table_positions, bool inverse, const std::string& name) {
  const cpu::RopeTable rope(cfg);
  const int64_t rows = static_cast<int64_t>(positions.size()), row = n_vec * width;
  std::vector<float> x = testing::random_bf16(rows * row, 31 + rows, -4, 4, 8);
  std::vector<float> want = x;
  std::vector<AttnToken> tokens;
  for (int64_t r = 0; r < rows; ++r) {
    if (positions[r] < table_positions) {
      rope.apply(std::span<float>(want).subspan(r * row, row), n_vec, width, positions[r], inverse);
    } else {  // outside the device table: the rope channels become NaN
      for (int64_t v = 0; v < n_vec; ++v)
        for (int64_t c = width - cfg.rope_dim; c < width; ++c) want[r * row + v * width + c] = NAN;
    }
    tokens.push_back(AttnToken{0, 1, positions[r], positions[r], r, 0});
  }
  const testing::DeviceRope dr = testing::device_rope(rope, table_positions);
  auto dx = to_device(x);
  auto dt = to_device(tokens);
  const Status s = rope_apply(
      dr.view, {.x = dx.get(), .rows = rows, .n_vec = n_vec, .width = width, .tokens = dt.get(), .inverse = inverse},
      nullptr);
  ASSERT_TRUE(s.ok()) << s.error().message;
  const size_t bad = count_bit_mismatches(name, to_host(dx), want);
  std::printf("PARITY %-40s n=%zu mismatches=%zu (bit-exact required)\n", name.c_str(), want.size(), bad);
  EXPECT_EQ(bad, 0u);
}

// Host only (runs without a GPU): the table's (cos, sin) rotate exactly as RopeTable::apply does, with
// the device kernel's formula, for every position of a range and both ropes.
TEST(CudaRopeTable, HostTableReproducesRopeTable) {
  for (const cpu::RopeConfig& cfg : {testing::compress_rope_config(64), testing::main_rope_config(64)}) {
    const cpu::RopeTable rope(cfg);
    const int64_t positions = 70000, half = cfg.rope_dim / 2;
    const std::vector<float> t = rope_cos_sin_table(rope.inv_freq().data(), cfg.rope_dim, positions);
    ASSERT_EQ(static_cast<int64_t>(t.size()), positions * cfg.rope_dim);
    const std::vector<float> x = testing::random_bf16(cfg.rope_dim, 7, -3, 3, 8);
    size_t bad = 0;
    for (int64_t pos = 0; pos < positions; pos += 7)
      for (bool inverse : {false, true}) {
        std::vector<float> want = x;
        rope.apply(want, 1, cfg.rope_dim, pos, inverse);
        for (int64_t i = 0; i < half; ++i) {
          const float c = t[(pos * half + i) * 2],
                      sn = inverse ? -t[(pos * half + i) * 2 + 1] : t[(pos * half + i) * 2 + 1];
          const float e = x[2 * i], o = x[2 * i + 1];
          bad += !same_bits(round_to_bf16(e * c - o * sn), want[2 * i]);
          bad += !same_bits(round_to_bf16(e * sn + o * c), want[2 * i + 1]);
        }
      }
    EXPECT_EQ(bad, 0u) << "base " << cfg.base;
  }
}

TEST(CudaRope, BitExactWithRopeTable) {
  CEDAR_REQUIRE_GPU_ATTN();
  const std::vector<int64_t> pos = {0, 1, 2, 127, 4096, 65535, 65536, 99999, 131071};
  // q of the released shape (64 heads × 512, rope 64) with the compress rope (YaRN), forward and inverse.
  check_rope(testing::compress_rope_config(64), 64, 512, pos, 131072, false, "rope compress 64x512");
  check_rope(testing::compress_rope_config(64), 64, 512, pos, 131072, true, "rope compress 64x512 inverse");
  check_rope(testing::main_rope_config(64), 32, 128, pos, 131072, false, "rope main 32x128 (indexer q)");
  check_rope(testing::compress_rope_config(8), 4, 32, {0, 3, 17, 40, 41}, 41, false,
             "rope tiny 4x32, pos 41 off-table");
}

// ---- SWA KV -------------------------------------------------------------------------------------------

struct SwaCase {
  int64_t n = 0, head_dim = 0, rope_dim = 0;
  int64_t pos0 = 0;
  double eps = 1e-20;
  uint32_t seed = 1;
};

// The CPU path of attention.cpp window_kv + the ring's encode: rms_norm → RoPE → FP8 record.
void cpu_swa(const SwaCase& c, const std::vector<float>& kv, const std::vector<float>& w, const cpu::RopeTable& rope,
             std::vector<uint8_t>& records, std::vector<float>& values) {
  const int64_t hd = c.head_dim, rb = swa_record_bytes(hd);
  values.assign(kv.size(), 0.0f);
  cpu::rms_norm(kv, hd, w, c.eps, values);
  const KvRecordFormat f = *KvRecordFormat::make(KvRecipe::Fp8Block32Ue8m0, KvStorage::Packed, hd);
  ASSERT_EQ(f.record_bytes(), rb);
  records.assign(c.n * rb, 0);
  for (int64_t t = 0; t < c.n; ++t) {
    std::span<float> row(values.data() + t * hd, hd);
    rope.apply(row, 1, hd, c.pos0 + t);
    ASSERT_TRUE(f.encode(row, std::span<uint8_t>(records.data() + t * rb, rb)).ok());
  }
}

// A SWA case's inputs on the host and the device, and the CPU's records and values for them (cpu_swa).
// kv has a wide per-block spread (2^-24 .. 2^6: after the norm the small blocks fall below the 1e-4 amax
// clamp, e4m3 subnormal codes, the smallest scales); with `specials` (n > 2) row 1 starts with an all-zero
// block and row 2 holds an inf (rstd = 0: zeros and one NaN that poisons its block).
struct SwaInputs {
  SwaInputs(const SwaCase& c, bool specials)
      : kv(testing::random_bf16(c.n * c.head_dim, c.seed, -24, 6, 32)),
        w(testing::random_bf16(c.head_dim, c.seed + 1, -1, 1, 0)),
        rope(testing::compress_rope_config(c.rope_dim)),
        eps(static_cast<float>(c.eps)) {
    const int64_t hd = c.head_dim;
    if (specials && c.n > 2) {
      std::fill(kv.begin() + 1 * hd, kv.begin() + 1 * hd + 32, 0.0f);
      kv[2 * hd + 5] = INFINITY;
    }
    cpu_swa(c, kv, w, rope, want_rec, want_val);
    std::vector<AttnToken> tokens;
    append_chunk_tokens(tokens, 0, c.pos0, c.n);
    dr = testing::device_rope(rope, c.pos0 + c.n);
    dkv = to_device(kv);
    dw = to_device(w);
    dt = to_device(tokens);
  }
  // swa_kv_encode's arguments for these rows, writing `records` (and `values` when given).
  SwaKvArgs args(const SwaCase& c, uint8_t* records, float* values = nullptr) const {
    return SwaKvArgs{.kv = dkv.get(),
                     .norm_weight = dw.get(),
                     .eps = eps,
                     .n = c.n,
                     .head_dim = c.head_dim,
                     .tokens = dt.get(),
                     .rope = dr.view,
                     .records = records,
                     .values = values};
  }
  std::vector<float> kv, w;
  cpu::RopeTable rope;
  float eps;
  std::vector<uint8_t> want_rec;
  std::vector<float> want_val;
  testing::DeviceRope dr;
  DeviceBuffer<float> dkv, dw;
  DeviceBuffer<AttnToken> dt;
};

void check_swa(const SwaCase& c, const std::string& name) {
  const int64_t hd = c.head_dim, rb = swa_record_bytes(hd);
  const SwaInputs in(c, /*specials=*/true);
  const std::vector<uint8_t>& want_rec = in.want_rec;
  auto drec = device_filled<uint8_t>(c.n * rb, 0xA5);
  auto dval = device_filled<float>(c.n * hd, 0xFF);
  const Status s = swa_kv_encode(in.args(c, drec.get(), dval.get()), nullptr);
  ASSERT_TRUE(s.ok()) << s.error().message;
  const size_t bad_rec = count_byte_mismatches(name + " records", to_host(drec), want_rec, rb);
  const size_t bad_val = count_bit_mismatches(name + " values", to_host(dval), in.want_val);
  std::printf("PARITY %-40s n=%zu record byte mismatches=%zu value mismatches=%zu (bit-exact required)\n", name.c_str(),
              want_rec.size(), bad_rec, bad_val);
  EXPECT_EQ(bad_rec, 0u);
  EXPECT_EQ(bad_val, 0u);
}

TEST(CudaSwaKv, RecordsByteIdenticalToHost) {
  CEDAR_REQUIRE_GPU_ATTN();
  check_swa({.n = 7, .head_dim = 512, .rope_dim = 64, .pos0 = 65530, .seed = 41}, "swa_kv 512 (V4.1)");
  check_swa({.n = 1, .head_dim = 512, .rope_dim = 64, .pos0 = 123456, .seed = 42}, "swa_kv 512 decode");
  check_swa({.n = 5, .head_dim = 128, .rope_dim = 32, .pos0 = 3, .eps = 1e-6, .seed = 43}, "swa_kv 128 (small)");
  check_swa({.n = 9, .head_dim = 32, .rope_dim = 8, .pos0 = 0, .seed = 44}, "swa_kv 32 (tiny)");
}

// Two sequences over three calls (a prefill chunk longer than the ring, then batched decode rows):
// the device rings must equal host SwaRings fed the same rows, record bytes and positions.
TEST(CudaSwaKv, RingCommitMatchesHostRing) {
  CEDAR_REQUIRE_GPU_ATTN();
  const int64_t hd = 128, rope_dim = 32, slots = 8, rb = swa_record_bytes(hd);
  const cpu::RopeTable rope(testing::compress_rope_config(rope_dim));
  const testing::DeviceRope dr = testing::device_rope(rope, 64);
  const KvRecordFormat f = *KvRecordFormat::make(KvRecipe::Fp8Block32Ue8m0, KvStorage::Packed, hd);
  const std::vector<float> w = testing::random_bf16(hd, 50, -1, 1, 0);
  auto dw = to_device(w);
  SwaRing host[2] = {SwaRing(slots, f), SwaRing(slots, f)};
  std::vector<uint8_t> host_rec[2] = {std::vector<uint8_t>(slots * rb, 0), std::vector<uint8_t>(slots * rb, 0)};
  auto drec0 = device_filled<uint8_t>(slots * rb, 0), drec1 = device_filled<uint8_t>(slots * rb, 0);
  auto dpos0 = to_device(std::vector<int64_t>(slots, -1)), dpos1 = to_device(std::vector<int64_t>(slots, -1));
  auto drings = to_device(std::vector<SwaRingDesc>{{drec0.get(), dpos0.get()}, {drec1.get(), dpos1.get()}});
  int64_t next[2] = {0, 0};
  // (sequence, rows) per call: seq 0 prefills 20 rows (> slots), seq 1 prefills 3; then decode both.
  const std::vector<std::vector<std::pair<int32_t, int64_t>>> calls = {
      {{0, 20}, {1, 3}}, {{0, 1}, {1, 1}}, {{1, 1}, {0, 1}}};
  uint32_t seed = 60;
  for (const auto& call : calls) {
    std::vector<AttnToken> tokens;
    for (auto [seq, n] : call) {
      append_chunk_tokens(tokens, seq, next[seq], n);
      next[seq] += n;
    }
    const int64_t n = static_cast<int64_t>(tokens.size());
    const std::vector<float> kv = testing::random_bf16(n * hd, seed++, -3, 3, 32);
    // Host: every row into its SwaRing (as attention.cpp writes the chunk's last `window` rows) and the
    // expected slot bytes.
    std::vector<float> normed(kv.size());
    cpu::rms_norm(kv, hd, w, 1e-20, normed);
    for (int64_t r = 0; r < n; ++r) {
      const AttnToken& tk = tokens[r];
      if (tk.pos < tk.chunk_pos0 + tk.chunk_len - slots) continue;
      std::vector<float> row(normed.begin() + r * hd, normed.begin() + (r + 1) * hd);
      rope.apply(row, 1, hd, tk.pos);
      ASSERT_TRUE(host[tk.seq].write(tk.pos, row).ok());
      std::vector<float> q = row;
      ASSERT_TRUE(f.encode(q, std::span<uint8_t>(host_rec[tk.seq].data() + (tk.pos % slots) * rb, rb)).ok());
    }
    auto dkv = to_device(kv);
    auto dt = to_device(tokens);
    auto dstage = device_alloc<uint8_t>(n * rb);
    ASSERT_TRUE(swa_kv_encode({.kv = dkv.get(),
                               .norm_weight = dw.get(),
                               .eps = 1e-20f,
                               .n = n,
                               .head_dim = hd,
                               .tokens = dt.get(),
                               .rope = dr.view,
                               .records = dstage.get()},
                              nullptr)
                    .ok());
    const Status s = swa_ring_commit({.records = dstage.get(),
                                      .n = n,
                                      .record_bytes = rb,
                                      .tokens = dt.get(),
                                      .rings = drings.get(),
                                      .slots = slots},
                                     nullptr);
    ASSERT_TRUE(s.ok()) << s.error().message;
  }
  for (int seq = 0; seq < 2; ++seq) {
    const std::vector<uint8_t> got = to_host(seq == 0 ? drec0 : drec1);
    const std::vector<int64_t> got_pos = to_host(seq == 0 ? dpos0 : dpos1);
    const size_t bad = count_byte_mismatches("ring " + std::to_string(seq), got, host_rec[seq], rb);
    size_t bad_pos = 0, bad_val = 0;
    for (int64_t slot = 0; slot < slots; ++slot) {
      bad_pos += got_pos[slot] != host[seq].slot_position(slot);
      if (got_pos[slot] < 0) continue;
      std::vector<float> dec(hd);
      f.decode(std::span<const uint8_t>(got.data() + slot * rb, rb), dec);
      const std::vector<float> want = host[seq].decoded(got_pos[slot]);
      for (int64_t c = 0; c < hd; ++c) bad_val += !same_bits(dec[c], want[c]);
    }
    std::printf("PARITY %-40s slots=%ld byte mismatches=%zu position mismatches=%zu value mismatches=%zu\n",
                ("swa ring commit seq " + std::to_string(seq)).c_str(), static_cast<long>(slots), bad, bad_pos,
                bad_val);
    EXPECT_EQ(bad, 0u);
    EXPECT_EQ(bad_pos, 0u);
    EXPECT_EQ(bad_val, 0u);
  }
}

// q_norm_swa_kv_encode (decode's q_norm and SWA KV encode in one launch) against the two launches it
// replaces, rms_norm (with or without its FP8 codes) and swa_kv_encode, and the encode against the CPU:
// every output bit for bit.
struct QNormKvCase {
  SwaCase swa;
  int64_t q_dim = 0;
  bool quant = false, weighted = true, pdl = false;
};

void check_q_norm_kv(const QNormKvCase& c, const std::string& name) {
  const SwaCase& s = c.swa;
  const int64_t hd = s.head_dim, rb = swa_record_bytes(hd), qd = c.q_dim;
  const SwaInputs in(s, /*specials=*/false);
  const std::vector<float> q = testing::random_bf16(s.n * qd, s.seed + 2, -8, 4, 8);
  const std::vector<float> qw = testing::random_bf16(qd, s.seed + 3, -1, 1, 0);
  auto dqw = to_device(qw);
  const float* qweight = c.weighted ? dqw.get() : nullptr;
  const float eps = static_cast<float>(s.eps);
  // The two launches.
  auto dq_sep = to_device(q);
  auto dcodes_sep = device_filled<uint16_t>(s.n * qd, 0xA5);
  auto dscales_sep = device_filled<float>(s.n * qd / 32 + 1, 0xA5);
  auto drec_sep = device_filled<uint8_t>(s.n * rb, 0xA5);
  const ActQuantOut quant_sep = c.quant ? ActQuantOut{dcodes_sep.get(), dscales_sep.get()} : ActQuantOut{};
  ASSERT_TRUE(rms_norm(dq_sep.get(), s.n, qd, qweight, eps, dq_sep.get(), nullptr, false, quant_sep).ok());
  SwaKvArgs a = in.args(s, drec_sep.get());
  ASSERT_TRUE(swa_kv_encode(a, nullptr).ok());
  // One launch (q normalized in place, as the model does).
  auto dq = to_device(q);
  auto dcodes = device_filled<uint16_t>(s.n * qd, 0xA5);
  auto dscales = device_filled<float>(s.n * qd / 32 + 1, 0xA5);
  auto drec = device_filled<uint8_t>(s.n * rb, 0x5A);
  a.records = drec.get();
  QNormArgs qa;
  qa.x = dq.get();
  qa.dim = qd;
  qa.weight = qweight;
  qa.eps = eps;
  qa.y = dq.get();
  if (c.quant) qa.quant = ActQuantOut{dcodes.get(), dscales.get()};
  const Status st = q_norm_swa_kv_encode(qa, a, nullptr, c.pdl);
  ASSERT_TRUE(st.ok()) << st.error().message;
  const size_t bad_y = count_bit_mismatches(name + " q_norm", to_host(dq), to_host(dq_sep));
  const size_t bad_rec = count_byte_mismatches(name + " records", to_host(drec), to_host(drec_sep), rb);
  const size_t bad_cpu = count_byte_mismatches(name + " records vs cpu", to_host(drec), in.want_rec, rb);
  size_t bad_codes = 0;
  if (c.quant) {
    const std::vector<uint16_t> got = to_host(dcodes), want = to_host(dcodes_sep);
    for (size_t i = 0; i < want.size(); ++i)
      if (got[i] != want[i] && bad_codes++ == 0) ADD_FAILURE() << name << ": first code mismatch at " << i;
    bad_codes += count_bit_mismatches(name + " scales", to_host(dscales), to_host(dscales_sep));
  }
  std::printf("PARITY %-40s q %ld×%ld, kv %ld×%ld: q_norm mismatches=%zu codes/scales=%zu records=%zu (vs cpu %zu)\n",
              name.c_str(), static_cast<long>(s.n), static_cast<long>(qd), static_cast<long>(s.n),
              static_cast<long>(hd), bad_y, bad_codes, bad_rec, bad_cpu);
  EXPECT_EQ(bad_y, 0u);
  EXPECT_EQ(bad_codes, 0u);
  EXPECT_EQ(bad_rec, 0u);
  EXPECT_EQ(bad_cpu, 0u);
}

TEST(CudaSwaKv, QNormAndEncodeInOneLaunchEqualTheTwoLaunches) {
  CEDAR_REQUIRE_GPU_ATTN();
  check_q_norm_kv({.swa = {.n = 1, .head_dim = 512, .rope_dim = 64, .pos0 = 4095, .eps = 1e-6, .seed = 71},
                   .q_dim = 1536, .quant = true, .pdl = true},
                  "q_norm+swa_kv 1536 / 512 decode, codes");
  check_q_norm_kv({.swa = {.n = 4, .head_dim = 512, .rope_dim = 64, .pos0 = 100, .eps = 1e-6, .seed = 72},
                   .q_dim = 1536, .quant = false},
                  "q_norm+swa_kv 1536 / 512 batch 4");
  check_q_norm_kv({.swa = {.n = 3, .head_dim = 32, .rope_dim = 8, .pos0 = 0, .seed = 73},
                   .q_dim = 64, .quant = true, .weighted = false},
                  "q_norm+swa_kv 64 / 32 (tiny), unweighted");
  check_q_norm_kv({.swa = {.n = 2, .head_dim = 128, .rope_dim = 32, .pos0 = 7, .seed = 74},
                   .q_dim = 6000, .quant = false},
                  "q_norm+swa_kv 6000 (two passes) / 128");
}

TEST(CudaSwaKv, RejectsBadArguments) {
  CEDAR_REQUIRE_GPU_ATTN();
  auto buf = device_alloc<float>(64);
  Status s = swa_kv_encode({.kv = buf.get(), .n = 1, .head_dim = 40}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("head_dim 40"), std::string::npos) << s.error().message;
  s = rope_apply(RopeTableView{buf.get(), 1, 7}, {.x = buf.get(), .rows = 1, .width = 32}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("rope_dim 7"), std::string::npos) << s.error().message;
  // The one-launch q_norm + encode names what is wrong with either half.
  const cpu::RopeTable rope(testing::compress_rope_config(8));
  const testing::DeviceRope dr = testing::device_rope(rope, 4);
  auto tokens = to_device(std::vector<AttnToken>{AttnToken{0, 1, 0, 0, 0, 0}});
  auto rec = device_alloc<uint8_t>(64);
  auto codes = device_alloc<uint16_t>(64);
  const SwaKvArgs kv{.kv = buf.get(), .n = 1, .head_dim = 32, .tokens = tokens.get(), .rope = dr.view,
                     .records = rec.get()};
  SwaKvArgs bad_kv = kv;
  bad_kv.head_dim = 40;
  QNormArgs q;
  q.x = q.y = buf.get();
  q.dim = 64;
  s = q_norm_swa_kv_encode(q, bad_kv, nullptr, false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("q_norm_swa_kv_encode: head_dim 40"), std::string::npos) << s.error().message;
  q.quant.codes = codes.get();  // codes without scales
  s = q_norm_swa_kv_encode(q, kv, nullptr, false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("both codes and scales"), std::string::npos) << s.error().message;
  q.quant.scales = buf.get();
  q.dim = 40;
  s = q_norm_swa_kv_encode(q, kv, nullptr, false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("dim % 32 == 0 (dim=40)"), std::string::npos) << s.error().message;
  q = QNormArgs{};
  s = q_norm_swa_kv_encode(q, kv, nullptr, false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("null query"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace cedar::cuda
