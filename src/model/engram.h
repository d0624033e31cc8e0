// Engram (architecture.md §3.9): n-gram hash rows per position, the table gather + dequant, and the
// gated update of the hc residual streams before the Engram layers' blocks. CPU reference numerics.
//
// Hashing (R-engram `EngramLayout`, `compute_hash_multipliers`, `NgramHashState`):
//   * each token id maps to a compressed id c = T[id] (the frozen 129 280-entry map); image-span tokens
//     are DEAD;
//   * for position p and shift s = 0..N-1: c_s = T[token[p-s]] unless p < s or any of the tokens at
//     p, p-1, ..., p-s is DEAD (sticky), in which case c_s = pad = T[engram_pad_id];
//   * multipliers M[s] = numpy default_rng(10007·layer).integers(0, bound, N, int64)·2 + 1 with
//     bound = max(1, (INT64_MAX // compressed_vocab) // 2) — NumPy's SeedSequence, PCG64 and
//     Generator.integers reproduced bit-exactly below;
//   * rolling XOR r_1 = c_0·M_0 ⊕ c_1·M_1, r_n = r_{n-1} ⊕ c_n·M_n in int64 (products wrap like NumPy's);
//   * column col = (n-2)·heads + h holds row = floor_mod(r_{n-1}, P[col]) + offset[col], with the
//     primes drawn as the smallest unused primes >= engram_vocab_size in (layer, order, head) order and
//     offset = exclusive prefix sum of the layer's primes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/status.h"
#include "core/threads.h"
#include "io/config.h"
#include "model/weights.h"

namespace cedar {

// Compressed id of an image-span token in a history (never hashed: it turns into pad).
inline constexpr int64_t kEngramDead = -1;

// NumPy `np.random.default_rng(seed).integers(low, high, count, dtype=np.int64)` (high exclusive,
// low < high): SeedSequence(seed) → PCG64 → Lemire bounded integers, as NumPy 1.17+ computes them.
std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t low, int64_t high, int64_t count);

// Deterministic primality for any 64-bit value.
bool is_prime_u64(uint64_t n);

// Hash layout of every Engram layer of a config (empty when the config has none).
class EngramLayout {
 public:
  // Validates the engram_* fields and that each layer's Σ primes == engram_num_embeddings[slot].
  static Result<EngramLayout> create(const ModelConfig& c);

  int64_t n_slots() const { return static_cast<int64_t>(layer_ids_.size()); }
  int64_t layer_id(int64_t slot) const { return layer_ids_[slot]; }
  int64_t slot_of_layer(int64_t layer) const;  // -1 when `layer` has no Engram
  int64_t max_ngram() const { return max_ngram_; }  // N: orders 2..N, N shifts per position
  int64_t n_heads() const { return n_heads_; }
  int64_t cols() const { return (max_ngram_ - 1) * n_heads_; }  // rows per position and layer
  int64_t num_embeddings(int64_t slot) const { return num_embeddings_[slot]; }
  std::span<const int64_t> multipliers(int64_t slot) const { return slice(multipliers_, slot, max_ngram_); }
  std::span<const int64_t> primes(int64_t slot) const { return slice(primes_, slot, cols()); }
  std::span<const int64_t> offsets(int64_t slot) const { return slice(offsets_, slot, cols()); }

  // Rows of one position for layer slot `slot`: history = c_0 (current token), c_1, ..., c_{N-1}, already
  // pad-substituted (all >= 0); rows_out has cols() entries in column order.
  void rows(int64_t slot, std::span<const int64_t> history, std::span<int64_t> rows_out) const;

 private:
  static std::span<const int64_t> slice(const std::vector<int64_t>& v, int64_t slot, int64_t width) {
    return std::span<const int64_t>(v).subspan(static_cast<size_t>(slot * width), static_cast<size_t>(width));
  }
  std::vector<int64_t> layer_ids_, num_embeddings_;
  int64_t max_ngram_ = 0, n_heads_ = 0;
  std::vector<int64_t> multipliers_;  // [slot, N]
  std::vector<int64_t> primes_;       // [slot, cols]
  std::vector<int64_t> offsets_;      // [slot, cols]
};

// Per-sequence n-gram history carried across chunks: the compressed ids (kEngramDead for image tokens)
// of the last min(next_pos, N-1) positions. A plain value: copy it to snapshot (speculative rollback).
struct EngramHistory {
  int64_t next_pos = 0;         // absolute position of the next token to hash
  std::vector<int64_t> recent;  // positions [next_pos - recent.size(), next_pos), oldest first
};

// Token normalization + layout: turns raw token ids into table rows for every Engram layer.
class EngramHasher {
 public:
  // token_map: raw id -> compressed id (text/engram_norm.h load_engram_map_npy). Checks that it has
  // exactly engram_compressed_vocab_size classes (max + 1; the multipliers derive from that size).
  static Result<EngramHasher> create(const ModelConfig& c, std::vector<int32_t> token_map);

  const EngramLayout& layout() const { return layout_; }
  int64_t pad() const { return pad_; }  // T[engram_pad_id]
  std::span<const int32_t> token_map() const { return map_; }  // raw id -> compressed id (device hashing)

  // Hashes n = tokens.size() tokens at absolute positions [pos0, pos0+n) of one sequence (pos0 must be
  // hist.next_pos), then advances hist. is_image: [n] (non-zero = image-span token) or empty.
  // rows_out: [n_slots, n, cols] (layer slot major, so one layer's rows are contiguous).
  // Chunked calls give exactly the rows of one call over the whole sequence.
  Status hash_chunk(int64_t pos0, std::span<const int64_t> tokens, std::span<const uint8_t> is_image,
                    EngramHistory& hist, std::span<int64_t> rows_out) const;
  // The history a sequence carries at position `pos` (resuming it there, e.g. from a prefix cache):
  // `preceding` holds the token ids of positions [pos − preceding.size(), pos) (text tokens) and must
  // cover the last min(pos, N−1) positions. Hashing from there on gives the rows of an uninterrupted
  // run. Errors: pos < 0, preceding longer than pos or too short, an id outside the token map.
  Result<EngramHistory> history_at(int64_t pos, std::span<const int64_t> preceding) const;

 private:
  EngramLayout layout_;
  std::vector<int32_t> map_;
  int64_t pad_ = 0;
};

// One Engram layer's weights (borrowed views).
struct EngramWeights {
  // FP8Rows (released format): F8_E4M3 [rows, head_dim] + table_scale F8_E8M0 [rows, head_dim/32].
  // BF16 (bf16-weight checkpoints): bf16 bits [rows, head_dim], no table_scale.
  WeightFormat table_format = WeightFormat::FP8Rows;
  const uint8_t* table = nullptr;
  const uint8_t* table_scale = nullptr;
  int64_t rows = 0;
  int64_t head_dim = 0;
  cpu::LinearWeight wkv{};               // [(hc+1)*d, cols*head_dim], FP8 block (act-quant block 32)
  std::span<const float> q_weight{}, k_weight{};  // [hc, d] bf16 values (used only as their product)
};

struct EngramParams {
  int64_t hc = 4;
  int64_t dim = 0;     // d
  int64_t n_cols = 0;  // rows gathered per token (EngramLayout::cols())
  double norm_eps = 1e-20;
  int64_t token_block = 64;  // tokens per wkv GEMM (bounds scratch memory; no effect on results)
};

// The gate of one (token, stream): sigmoid(copysign(sqrt(max(|dot|, 1e-6)), dot)) in fp32; copysign keeps
// the sign of zero (dot = +0 gives sigmoid(+1e-3), dot = −0 gives sigmoid(−1e-3)).
float engram_gate(float dot);

// Gathers one token's rows and dequantizes them: E[col*head_dim + c] = bf16(e4m3(row) · 2^(s−127)),
// s = the row's scale byte of channel block c/32 (BF16 tables: the stored bf16 value).
// E: [rows.size() * head_dim]. Rows must be < w.rows.
Status engram_gather(std::span<const int64_t> rows, const EngramWeights& w, std::span<float> E);

// X: [n, hc*d] streams before the block (bf16 values), updated in place (§3.9 module):
//   kv = wkv·E (bf16), key_k = kv[k·d, (k+1)·d), value = kv[hc·d, (hc+1)·d)
//   dot_k = Σ_c X_k·(q_k·k_k)·key_k · rsqrt(mean X_k² + eps) · rsqrt(mean key_k² + eps) · d^-1/2
//   g_k = sigmoid(copysign(sqrt(max(|dot_k|, 1e-6)), dot_k)), 0 for image tokens
//   X_k ← bf16(X_k + g_k·value)
// rows: [n, n_cols] of this layer (EngramHasher rows_out slice); is_image [n] or empty.
Status engram_forward(std::span<float> X, int64_t n, std::span<const int64_t> rows, std::span<const uint8_t> is_image,
                      const EngramWeights& w, const EngramParams& p, ThreadPool* pool);

}  // namespace cedar
