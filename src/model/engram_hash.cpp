// Engram hashing: NumPy's default_rng reproduced for the multipliers, the prime table, and the per-sequence
// n-gram history (engram.h).
#include <algorithm>
#include <limits>
#include <string>

#include "model/engram.h"

namespace cedar {
namespace {

__extension__ typedef unsigned __int128 u128;

// ---- NumPy SeedSequence (numpy/random/bit_generator.pyx), pool_size 4, no spawn key ------------------
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;  // 4 bytes * 8 / 2

// State words of SeedSequence(seed).generate_state(n64, np.uint64).
std::vector<uint64_t> seed_sequence_state(uint64_t seed, size_t n64) {
  // The entropy as little-endian 32-bit words (0 is one zero word).
  std::vector<uint32_t> entropy;
  for (uint64_t v = seed; v != 0; v >>= 32) entropy.push_back(static_cast<uint32_t>(v));
  if (entropy.empty()) entropy.push_back(0);

  uint32_t hash_const = kInitA;
  auto hashmix = [&hash_const](uint32_t value) {
    value ^= hash_const;
    hash_const *= kMultA;
    value *= hash_const;
    value ^= value >> kXShift;
    return value;
  };
  auto mix = [](uint32_t x, uint32_t y) {
    uint32_t result = kMixMultL * x - kMixMultR * y;
    result ^= result >> kXShift;
    return result;
  };
  uint32_t pool[4];
  for (size_t i = 0; i < 4; ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0);
  for (size_t src = 0; src < 4; ++src)
    for (size_t dst = 0; dst < 4; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
  for (size_t src = 4; src < entropy.size(); ++src)
    for (size_t dst = 0; dst < 4; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src]));

  uint32_t out_const = kInitB;
  std::vector<uint32_t> words(2 * n64);
  for (size_t i = 0; i < words.size(); ++i) {
    uint32_t v = pool[i % 4];
    v ^= out_const;
    out_const *= kMultB;
    v *= out_const;
    v ^= v >> kXShift;
    words[i] = v;
  }
  std::vector<uint64_t> state(n64);
  for (size_t i = 0; i < n64; ++i) state[i] = words[2 * i] | (static_cast<uint64_t>(words[2 * i + 1]) << 32);
  return state;
}

// ---- PCG64 (XSL-RR 128/64) as seeded by numpy.random.PCG64(SeedSequence) ---------------------------
class Pcg64 {
 public:
  explicit Pcg64(uint64_t seed) {
    const std::vector<uint64_t> v = seed_sequence_state(seed, 4);
    const u128 initstate = (static_cast<u128>(v[0]) << 64) | v[1];
    const u128 initseq = (static_cast<u128>(v[2]) << 64) | v[3];
    inc_ = (initseq << 1) | 1;
    state_ = 0;
    step();
    state_ += initstate;
    step();
  }
  uint64_t next64() {
    step();
    const uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
    const unsigned rot = static_cast<unsigned>(state_ >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
  }
  // NumPy's PCG64 next_uint32: the low half of a 64-bit draw, then its high half.
  uint32_t next32() {
    if (has_u32_) {
      has_u32_ = false;
      return u32_;
    }
    const uint64_t v = next64();
    has_u32_ = true;
    u32_ = static_cast<uint32_t>(v >> 32);
    return static_cast<uint32_t>(v);
  }

 private:
  void step() {
    const u128 mult = (static_cast<u128>(0x2360ED051FC65DA4ULL) << 64) | 0x4385DF649FCCF645ULL;
    state_ = state_ * mult + inc_;
  }
  u128 state_ = 0, inc_ = 0;
  bool has_u32_ = false;
  uint32_t u32_ = 0;
};

// Lemire's bounded integer in [0, rng] (rng inclusive) as numpy's distributions.c computes it.
uint64_t bounded_lemire64(Pcg64& g, uint64_t rng) {
  const uint64_t rng_excl = rng + 1;
  u128 m = static_cast<u128>(g.next64()) * rng_excl;
  uint64_t leftover = static_cast<uint64_t>(m);
  if (leftover < rng_excl) {
    const uint64_t threshold = (std::numeric_limits<uint64_t>::max() - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<u128>(g.next64()) * rng_excl;
      leftover = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

uint32_t bounded_lemire32(Pcg64& g, uint32_t rng) {
  const uint32_t rng_excl = rng + 1;
  uint64_t m = static_cast<uint64_t>(g.next32()) * rng_excl;
  uint32_t leftover = static_cast<uint32_t>(m);
  if (leftover < rng_excl) {
    const uint32_t threshold = (std::numeric_limits<uint32_t>::max() - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<uint64_t>(g.next32()) * rng_excl;
      leftover = static_cast<uint32_t>(m);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m) { return static_cast<uint64_t>(static_cast<u128>(a) * b % m); }

uint64_t powmod(uint64_t base, uint64_t e, uint64_t m) {
  uint64_t r = 1 % m;
  for (base %= m; e != 0; e >>= 1, base = mulmod(base, base, m))
    if (e & 1) r = mulmod(r, base, m);
  return r;
}

int64_t floor_mod(int64_t a, int64_t m) {
  const int64_t r = a % m;
  return r < 0 ? r + m : r;
}

}  // namespace

std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t low, int64_t high, int64_t count) {
  // Generator.integers(low, high, endpoint=False) → _rand_int64 with the inclusive range high-1-low and
  // use_masked=False → random_bounded_uint64_fill: the 32-bit Lemire path when the range fits 32 bits.
  Pcg64 g(seed);
  const uint64_t rng = static_cast<uint64_t>(high) - 1 - static_cast<uint64_t>(low);
  const uint64_t off = static_cast<uint64_t>(low);
  std::vector<int64_t> out(static_cast<size_t>(std::max<int64_t>(count, 0)));
  for (auto& v : out) {
    uint64_t draw = 0;
    if (rng == 0) draw = 0;
    else if (rng < 0xFFFFFFFFULL) draw = bounded_lemire32(g, static_cast<uint32_t>(rng));
    else if (rng == 0xFFFFFFFFULL) draw = g.next32();
    else if (rng == std::numeric_limits<uint64_t>::max()) draw = g.next64();
    else draw = bounded_lemire64(g, rng);
    v = static_cast<int64_t>(off + draw);
  }
  return out;
}

bool is_prime_u64(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t p : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
    if (n % p == 0) return n == p;
  }
  // Deterministic Miller–Rabin: these bases decide every n < 3.3e24.
  uint64_t d = n - 1;
  int s = 0;
  for (; (d & 1) == 0; d >>= 1) ++s;
  for (uint64_t a : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
    uint64_t x = powmod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int r = 1; r < s && composite; ++r) {
      x = mulmod(x, x, n);
      if (x == n - 1) composite = false;
    }
    if (composite) return false;
  }
  return true;
}

// ---- EngramLayout -----------------------------------------------------------------------------------

int64_t EngramLayout::slot_of_layer(int64_t layer) const {
  const auto it = std::find(layer_ids_.begin(), layer_ids_.end(), layer);
  return it == layer_ids_.end() ? -1 : static_cast<int64_t>(it - layer_ids_.begin());
}

Result<EngramLayout> EngramLayout::create(const ModelConfig& c) {
  const std::string where = c.source.empty() ? "config" : c.source;
  auto fail = [&](const std::string& m) { return make_error(where + ": Engram: " + m); };
  EngramLayout l;
  if (c.engram_layer_ids.empty()) return l;

  const int64_t n_layers = static_cast<int64_t>(c.engram_layer_ids.size());
  if (static_cast<int64_t>(c.engram_num_embeddings.size()) != n_layers)
    return fail("engram_num_embeddings has " + std::to_string(c.engram_num_embeddings.size()) +
                " entries for " + std::to_string(n_layers) + " engram_layer_ids");
  if (c.engram_max_ngram_size < 2 || c.engram_max_ngram_size > 64)
    return fail("engram_max_ngram_size must be in [2, 64], got " + std::to_string(c.engram_max_ngram_size));
  if (c.engram_n_heads < 1 || c.engram_n_heads > 4096)
    return fail("engram_n_heads must be in [1, 4096], got " + std::to_string(c.engram_n_heads));
  if (c.engram_compressed_vocab_size < 1)
    return fail("engram_compressed_vocab_size must be >= 1, got " + std::to_string(c.engram_compressed_vocab_size));
  if (c.engram_vocab_size < 0 || c.engram_vocab_size > (int64_t{1} << 62))
    return fail("engram_vocab_size must be in [0, 2^62], got " + std::to_string(c.engram_vocab_size));
  for (int64_t i = 0; i < n_layers; ++i) {
    const int64_t id = c.engram_layer_ids[i];
    if (id < 0 || id > std::numeric_limits<int64_t>::max() / 10007)
      return fail("engram_layer_ids[" + std::to_string(i) + "] = " + std::to_string(id) + " is out of range");
    if (std::find(c.engram_layer_ids.begin(), c.engram_layer_ids.begin() + i, id) != c.engram_layer_ids.begin() + i)
      return fail("engram_layer_ids lists layer " + std::to_string(id) + " twice");
  }

  l.layer_ids_ = c.engram_layer_ids;
  l.num_embeddings_ = c.engram_num_embeddings;
  l.max_ngram_ = c.engram_max_ngram_size;
  l.n_heads_ = c.engram_n_heads;

  // Multipliers: odd, bounded so that (compressed id) × multiplier cannot overflow int64.
  const int64_t bound = std::max<int64_t>(1, (std::numeric_limits<int64_t>::max() / c.engram_compressed_vocab_size) / 2);
  for (int64_t id : l.layer_ids_)
    for (int64_t v : numpy_default_rng_integers(static_cast<uint64_t>(10007 * id), 0, bound, l.max_ngram_))
      l.multipliers_.push_back(v * 2 + 1);

  // Primes: the smallest unused prime >= engram_vocab_size, in (layer, order, head) order — what the
  // reference's per-order restart from engram_vocab_size − 1 with a "seen" set amounts to.
  int64_t candidate = c.engram_vocab_size;
  for (int64_t slot = 0; slot < n_layers; ++slot) {
    int64_t total = 0;
    for (int64_t col = 0; col < l.cols(); ++col) {
      while (!is_prime_u64(static_cast<uint64_t>(candidate))) ++candidate;
      l.offsets_.push_back(total);
      l.primes_.push_back(candidate);
      if (__builtin_add_overflow(total, candidate, &total)) return fail("sum of primes overflows int64");
      ++candidate;
    }
    if (total != l.num_embeddings_[slot])
      return fail("layer " + std::to_string(l.layer_ids_[slot]) + ": engram_num_embeddings[" + std::to_string(slot) +
                  "] = " + std::to_string(l.num_embeddings_[slot]) + " but its " + std::to_string(l.cols()) +
                  " hash primes sum to " + std::to_string(total) +
                  " (primes from engram_vocab_size = " + std::to_string(c.engram_vocab_size) + ")");
  }
  return l;
}

void EngramLayout::rows(int64_t slot, std::span<const int64_t> history, std::span<int64_t> rows_out) const {
  const std::span<const int64_t> mult = multipliers(slot), prime = primes(slot), offset = offsets(slot);
  // int64 products and XOR with NumPy's wraparound (computed in uint64, read back as two's complement).
  uint64_t rolling = static_cast<uint64_t>(history[0]) * static_cast<uint64_t>(mult[0]);
  for (int64_t n = 1; n < max_ngram_; ++n) {
    rolling ^= static_cast<uint64_t>(history[n]) * static_cast<uint64_t>(mult[n]);
    const int64_t hash = static_cast<int64_t>(rolling);
    for (int64_t h = 0; h < n_heads_; ++h) {
      const int64_t col = (n - 1) * n_heads_ + h;
      rows_out[col] = floor_mod(hash, prime[col]) + offset[col];
    }
  }
}

// ---- EngramHasher -----------------------------------------------------------------------------------

Result<EngramHasher> EngramHasher::create(const ModelConfig& c, std::vector<int32_t> token_map) {
  EngramHasher h;
  CEDAR_ASSIGN_OR_RETURN(h.layout_, EngramLayout::create(c));
  if (h.layout_.n_slots() == 0) return h;
  const std::string where = (c.source.empty() ? "config" : c.source) + ": Engram token map: ";
  if (token_map.empty()) return make_error(where + "empty");
  int64_t max_id = -1;
  for (size_t i = 0; i < token_map.size(); ++i) {
    if (token_map[i] < 0)
      return make_error(where + "entry " + std::to_string(i) + " is negative (" + std::to_string(token_map[i]) + ")");
    max_id = std::max<int64_t>(max_id, token_map[i]);
  }
  if (max_id + 1 != c.engram_compressed_vocab_size)
    return make_error(where + std::to_string(max_id + 1) + " compressed ids, config engram_compressed_vocab_size is " +
                      std::to_string(c.engram_compressed_vocab_size));
  if (c.engram_pad_id < 0 || c.engram_pad_id >= static_cast<int64_t>(token_map.size()))
    return make_error(where + "engram_pad_id " + std::to_string(c.engram_pad_id) + " is outside the map (" +
                      std::to_string(token_map.size()) + " ids)");
  h.pad_ = token_map[static_cast<size_t>(c.engram_pad_id)];
  h.map_ = std::move(token_map);
  return h;
}

Status EngramHasher::hash_chunk(int64_t pos0, std::span<const int64_t> tokens, std::span<const uint8_t> is_image,
                                EngramHistory& hist, std::span<int64_t> rows_out) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t look_back = layout_.max_ngram() - 1;  // 0 when the config has no Engram
  const int64_t cols = layout_.n_slots() == 0 ? 0 : layout_.cols();
  if (pos0 != hist.next_pos)
    return make_error("Engram hash: chunk starts at position " + std::to_string(pos0) + " but the history is at " +
                      std::to_string(hist.next_pos));
  if (static_cast<int64_t>(hist.recent.size()) != std::min(hist.next_pos, std::max<int64_t>(look_back, 0)))
    return make_error("Engram hash: history holds " + std::to_string(hist.recent.size()) + " ids at position " +
                      std::to_string(hist.next_pos));
  if (!is_image.empty() && static_cast<int64_t>(is_image.size()) != n)
    return make_error("Engram hash: " + std::to_string(is_image.size()) + " image flags for " + std::to_string(n) + " tokens");
  if (static_cast<int64_t>(rows_out.size()) != layout_.n_slots() * n * cols)
    return make_error("Engram hash: rows_out has " + std::to_string(rows_out.size()) + " entries, expected " +
                      std::to_string(layout_.n_slots() * n * cols));
  if (layout_.n_slots() == 0) {
    hist.next_pos += n;
    return Status::Ok();
  }

  // seq = the carried history followed by this chunk's compressed ids (DEAD for image tokens).
  std::vector<int64_t> seq(hist.recent);
  seq.reserve(seq.size() + static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (!is_image.empty() && is_image[i]) {
      seq.push_back(kEngramDead);
      continue;
    }
    if (tokens[i] < 0 || tokens[i] >= static_cast<int64_t>(map_.size()))
      return make_error("Engram hash: token id " + std::to_string(tokens[i]) + " at position " +
                        std::to_string(pos0 + i) + " is outside the token map (" + std::to_string(map_.size()) + " ids)");
    seq.push_back(map_[static_cast<size_t>(tokens[i])]);
  }

  const int64_t base = static_cast<int64_t>(hist.recent.size());
  std::vector<int64_t> ctx(static_cast<size_t>(layout_.max_ngram()));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = pos0 + i;
    bool blocked = false;  // sticky: once a look-back hits the sequence start or a DEAD token, pad from there on
    for (int64_t s = 0; s <= look_back; ++s) {
      blocked = blocked || p < s || seq[static_cast<size_t>(base + i - s)] == kEngramDead;
      ctx[s] = blocked ? pad_ : seq[static_cast<size_t>(base + i - s)];
    }
    for (int64_t slot = 0; slot < layout_.n_slots(); ++slot)
      layout_.rows(slot, ctx, rows_out.subspan(static_cast<size_t>((slot * n + i) * cols), static_cast<size_t>(cols)));
  }

  hist.next_pos += n;
  const size_t keep = static_cast<size_t>(std::min<int64_t>(hist.next_pos, look_back));
  hist.recent.assign(seq.end() - static_cast<std::ptrdiff_t>(keep), seq.end());
  return Status::Ok();
}

Result<EngramHistory> EngramHasher::history_at(int64_t pos, std::span<const int64_t> preceding) const {
  const int64_t have = static_cast<int64_t>(preceding.size());
  const int64_t keep = std::min(pos, std::max<int64_t>(layout_.max_ngram() - 1, 0));
  if (pos < 0) return make_error("Engram history: negative position " + std::to_string(pos));
  if (have > pos)
    return make_error("Engram history: " + std::to_string(have) + " preceding tokens before position " +
                      std::to_string(pos));
  if (layout_.n_slots() > 0 && have < keep)
    return make_error("Engram history at position " + std::to_string(pos) + " needs the last " +
                      std::to_string(keep) + " tokens, got " + std::to_string(have));
  EngramHistory h;
  h.next_pos = pos;
  if (layout_.n_slots() == 0) return h;
  for (int64_t i = have - keep; i < have; ++i) {
    const int64_t id = preceding[static_cast<size_t>(i)];
    if (id < 0 || id >= static_cast<int64_t>(map_.size()))
      return make_error("Engram history: token id " + std::to_string(id) + " at position " +
                        std::to_string(pos - have + i) + " is outside the token map (" + std::to_string(map_.size()) +
                        " ids)");
    h.recent.push_back(map_[static_cast<size_t>(id)]);
  }
  return h;
}

}  // namespace cedar
