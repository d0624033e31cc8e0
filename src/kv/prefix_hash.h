// Content addresses of prefix-cache blocks (issue 6; ../shared/spec/architecture.md §4.3).
//
// A cached block is the global KV of token positions [k·B, (k+1)·B) of some token sequence, B =
// tokens_per_block. Its key is a chained hash: key_k = chain(key_{k−1}, tokens of block k), key_{−1} =
// root(model fingerprint, layout), so a key names the whole prefix [0, (k+1)·B) of one model and cache
// layout, not just the block's own tokens. Keys are 128 bits (two independently seeded 64-bit lanes);
// whoever holds a block also keeps its parent key and its tokens and compares them on every match, so a
// hash collision can never hand back another prefix's KV.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

namespace cedar {

struct PrefixKey {
  uint64_t hi = 0, lo = 0;
  friend bool operator==(const PrefixKey& a, const PrefixKey& b) { return a.hi == b.hi && a.lo == b.lo; }
  friend bool operator!=(const PrefixKey& a, const PrefixKey& b) { return !(a == b); }
  friend bool operator<(const PrefixKey& a, const PrefixKey& b) { return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo; }
  // 32 lowercase hex digits (file names of the SSD tier).
  std::string hex() const {
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                  static_cast<unsigned long long>(lo));
    return buf;
  }
};

struct PrefixKeyHash {
  size_t operator()(const PrefixKey& k) const { return static_cast<size_t>(k.hi ^ (k.lo * 0x9E3779B97F4A7C15ull)); }
};

namespace prefix_hash_detail {
// splitmix64's finalizer: a bijective 64-bit mixer with full avalanche.
inline uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}
// One lane: absorbs 64-bit words one at a time through the mixer (every word changes every later state).
inline uint64_t absorb(uint64_t state, uint64_t word, uint64_t lane_seed) {
  return mix(state ^ mix(word + lane_seed));
}
constexpr uint64_t kSeedHi = 0x6365646172505846ull;  // "cedarPXF"
constexpr uint64_t kSeedLo = 0x9E3779B97F4A7C15ull;
}  // namespace prefix_hash_detail

// The key before block 0: binds every key to the model (a fingerprint of its config and weights) and to
// the cache layout (formats, tokens per block), so caches of different models or layouts never match.
inline PrefixKey prefix_root(std::string_view model_fingerprint, std::string_view layout_descriptor) {
  using namespace prefix_hash_detail;
  PrefixKey k{kSeedHi, kSeedLo};
  auto take = [&](std::string_view s) {
    k.hi = absorb(k.hi, s.size(), kSeedHi);
    k.lo = absorb(k.lo, s.size(), kSeedLo);
    for (unsigned char c : s) {
      k.hi = absorb(k.hi, c, kSeedHi);
      k.lo = absorb(k.lo, c, kSeedLo);
    }
  };
  take(model_fingerprint);
  take(layout_descriptor);
  return k;
}

// key_k = chain(key_{k−1}, tokens of block k).
inline PrefixKey prefix_chain(const PrefixKey& parent, std::span<const int64_t> block_tokens) {
  using namespace prefix_hash_detail;
  PrefixKey k{absorb(parent.hi, parent.lo, kSeedHi), absorb(parent.lo, parent.hi, kSeedLo)};
  k.hi = absorb(k.hi, block_tokens.size(), kSeedHi);
  k.lo = absorb(k.lo, block_tokens.size(), kSeedLo);
  for (int64_t t : block_tokens) {
    k.hi = absorb(k.hi, static_cast<uint64_t>(t), kSeedHi);
    k.lo = absorb(k.lo, static_cast<uint64_t>(t), kSeedLo);
  }
  return k;
}

}  // namespace cedar
