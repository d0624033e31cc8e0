// UTF-8 helpers and the character classes the pre-tokenizer needs.
//
// Classes come from a committed table generated from Unicode 16.0.0 (tools/gen_unicode_tables.py): that is the
// Unicode version of the regex engine in HF tokenizers 0.23, the reference tokenizer. Using the build machine's
// PCRE2/ICU tables instead would silently change tokenization when Debian upgrades them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cedar::text {

// Pre-tokenizer character class of a code point. The DeepSeek regexes only use \p{L} together with \p{M}, and
// \p{P} together with \p{S}, so those pairs share a class; kSpace is \s (the White_Space property).
enum class CharClass : uint8_t { kOther = 0, kLetterMark = 1, kPunctSymbol = 2, kNumber = 3, kSpace = 4 };

struct UnicodeClassRange {
  char32_t first;  // first code point of a run
  uint8_t cls;     // CharClass value for the run
};
extern const UnicodeClassRange kUnicodeClassRanges[];
extern const size_t kUnicodeClassRangeCount;
extern const char kUnicodeClassVersion[];

// Two-stage lookup table (256-code-point blocks, duplicate blocks shared), built once from the ranges.
class UnicodeClassTable {
 public:
  UnicodeClassTable();
  CharClass get(char32_t cp) const {
    if (cp < 0x80) return static_cast<CharClass>(ascii_[cp]);
    if (cp >= 0x110000) return CharClass::kOther;
    return static_cast<CharClass>(blocks_[(static_cast<size_t>(block_index_[cp >> 8]) << 8) | (cp & 0xFF)]);
  }

 private:
  std::array<uint8_t, 128> ascii_{};
  std::vector<uint16_t> block_index_;  // 0x1100 entries
  std::vector<uint8_t> blocks_;        // unique blocks, 256 entries each
};

// The process-wide immutable table (built on first use; thread-safe).
const UnicodeClassTable& unicode_classes();

// Decodes one code point from valid UTF-8 at p (the caller has validated the text); sets len to its byte count.
inline char32_t decode_utf8(const unsigned char* p, int& len) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) { len = 1; return b0; }
  if (b0 < 0xE0) { len = 2; return (char32_t{b0 & 0x1Fu} << 6) | (p[1] & 0x3Fu); }
  if (b0 < 0xF0) { len = 3; return (char32_t{b0 & 0x0Fu} << 12) | (char32_t{p[1] & 0x3Fu} << 6) | (p[2] & 0x3Fu); }
  len = 4;
  return (char32_t{b0 & 0x07u} << 18) | (char32_t{p[1] & 0x3Fu} << 12) | (char32_t{p[2] & 0x3Fu} << 6) |
         (p[3] & 0x3Fu);
}

// Byte offset of the first byte that makes `s` invalid UTF-8 (overlong forms, surrogates, code points above
// U+10FFFF and truncated sequences are invalid), or std::string_view::npos when `s` is valid.
size_t find_invalid_utf8(std::string_view s);

void append_utf8(std::string& out, char32_t cp);

// Incremental lossy UTF-8 decoding with the semantics of Rust's String::from_utf8_lossy (and Python's
// bytes.decode("utf-8", "replace")): every maximal ill-formed subpart becomes one U+FFFD. A trailing sequence
// that may still be completed by later bytes is held back, so feeding bytes in any split gives the same text as
// decoding them all at once.
class Utf8LossyDecoder {
 public:
  // Appends the text completed by `bytes` to `out`.
  void feed(std::string_view bytes, std::string& out);
  // Appends U+FFFD for a held incomplete sequence (if any) and resets.
  void finish(std::string& out);
  // Bytes currently held back (0..3).
  size_t pending() const { return held_len_; }

 private:
  void feed_byte(unsigned char b, std::string& out);
  unsigned char held_[4] = {};
  uint8_t held_len_ = 0;
  uint8_t need_ = 0;  // continuation bytes still expected
  unsigned char lo_ = 0x80, hi_ = 0xBF;  // allowed range of the next continuation byte
};

// One-shot lossy decoding.
std::string utf8_lossy(std::string_view bytes);

}  // namespace cedar::text
