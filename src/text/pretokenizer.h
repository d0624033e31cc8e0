// The pre-tokenizer of DeepSeek's tokenizer.json: a Sequence of Split(Regex, Isolated) steps followed by
// ByteLevel(use_regex=false). Each known regex is implemented as a hand-written matcher with exactly the
// semantics Oniguruma (the engine of HF tokenizers) gives it: leftmost-first alternation, greedy quantifiers with
// backtracking, and Unicode 16.0 classes (text/unicode.h). A regex cedar does not know is a load error, never a
// silent approximation.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/unicode.h"

namespace cedar::text {

enum class SplitPattern {
  kNumbers,     // \p{N}{1,3}
  kCjk,         // [一-龥぀-ゟ゠-ヿ]+  (U+4E00-9FA5, U+3040-309F, U+30A0-30FF)
  kWordsPunct,  // the long alternation of DeepSeek-V3/V4: letters, punctuation, newlines, spaces
};

// Maps a Split regex from tokenizer.json to the matcher implementing it.
Result<SplitPattern> split_pattern_from_regex(std::string_view regex);
// The regex as written in DeepSeek's tokenizer.json (CR and LF as literal characters).
std::string split_pattern_regex(SplitPattern pattern);

struct Piece {
  size_t begin;  // byte offsets into the pre-tokenized text
  size_t end;
};

class PreTokenizer {
 public:
  explicit PreTokenizer(std::vector<SplitPattern> steps);

  // Working space for split(), reusable across calls to avoid allocations.
  struct Scratch {
    std::vector<Piece> current, next;
  };

  // Splits text[begin, end) (valid UTF-8) through every step; appends the final pieces to `out`.
  void split(std::string_view text, size_t begin, size_t end, std::vector<Piece>& out, Scratch& scratch) const;

  const std::vector<SplitPattern>& steps() const { return steps_; }

 private:
  std::vector<SplitPattern> steps_;
  const UnicodeClassTable* classes_;
};

}  // namespace cedar::text
