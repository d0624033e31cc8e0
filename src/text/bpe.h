// Byte-level BPE: GPT-2's byte<->unicode mapping and the merge loop of HF tokenizers' BPE model.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace cedar::text {

using TokenId = int32_t;

// GPT-2 byte-level alphabet: printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100..U+0143.
char32_t byte_to_unicode(uint8_t b);
// Inverse of byte_to_unicode; -1 for characters outside the alphabet.
int unicode_to_byte(char32_t c);
// UTF-8 of the byte-level form of `bytes` (what tokenizer.json vocab entries look like).
std::string bytes_to_byte_level(std::string_view bytes);

// (left, right) -> (rank, merged id), open addressing. Built once; lookups are the BPE hot path.
class MergeTable {
 public:
  static constexpr uint32_t kNoRank = UINT32_MAX;

  void reserve(size_t count);
  // A later merge of the same pair replaces the earlier one (HF builds its merge map the same way).
  void insert(TokenId left, TokenId right, uint32_t rank, TokenId merged);
  // Rank of the pair (kNoRank if it never merges); sets `merged` when it does.
  uint32_t find(TokenId left, TokenId right, TokenId& merged) const {
    const uint64_t key = pair_key(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) { merged = s.merged; return s.rank; }
      if (s.key == kEmpty) return kNoRank;
    }
  }
  size_t size() const { return count_; }

 private:
  struct Slot {
    uint64_t key;
    uint32_t rank;
    TokenId merged;
  };
  static constexpr uint64_t kEmpty = UINT64_MAX;
  static uint64_t pair_key(TokenId l, TokenId r) {
    return (uint64_t{static_cast<uint32_t>(l)} << 32) | static_cast<uint32_t>(r);
  }
  size_t slot_of(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  void grow();

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t count_ = 0;
};

// Working memory for BpeModel::encode_piece, reusable across pieces (one per encoding thread).
struct BpeScratch {
  std::vector<TokenId> tokens;
  std::vector<uint32_t> ranks;
  std::vector<TokenId> merged;
  struct Symbol {
    TokenId id;
    int32_t prev, next;
  };
  std::vector<Symbol> symbols;
  struct Candidate {
    uint32_t rank;
    uint32_t pos;
    TokenId merged;
  };
  std::vector<Candidate> heap;
};

struct BpeMergeSpec {
  std::string left, right;  // byte-level strings as in tokenizer.json
};

class BpeModel {
 public:
  // `vocab` maps byte-level token strings to ids. Every one of the 256 byte-level characters must be in it
  // (byte_fallback and unk tokens are not supported); every merge's parts and result must be too.
  static Result<BpeModel> build(const std::vector<std::pair<std::string, TokenId>>& vocab,
                                const std::vector<BpeMergeSpec>& merges);

  // Appends the ids of one pre-tokenized piece (raw bytes, not byte-level text).
  void encode_piece(std::string_view bytes, std::vector<TokenId>& out, BpeScratch& scratch) const;

  size_t merge_count() const { return merges_.size(); }

 private:
  void merge_small(std::string_view bytes, std::vector<TokenId>& out, BpeScratch& scratch) const;
  void merge_large(std::string_view bytes, std::vector<TokenId>& out, BpeScratch& scratch) const;

  std::array<TokenId, 256> byte_token_{};
  MergeTable merges_;
};

}  // namespace cedar::text
