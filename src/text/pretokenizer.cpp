#include "text/pretokenizer.h"

namespace cedar::text {

namespace {

constexpr size_t kNoMatch = static_cast<size_t>(-1);

// The regexes exactly as DeepSeek's tokenizer.json spells them (CR/LF are literal characters there).
const char kNumbersRegex[] = "\\p{N}{1,3}";
const char kCjkRegex[] = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+";
const char kWordsPunctRegex[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"  // A: ASCII punctuation + ASCII letters
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"             // B: optional non-letter prefix + letters
    "| ?[\\p{P}\\p{S}]+[\r\n]*"                               // C: optional space + punctuation + newlines
    "|\\s*[\r\n]+"                                            // D: whitespace ending in a newline
    "|\\s+(?!\\S)"                                            // E: whitespace not followed by a non-space
    "|\\s+";                                                  // F: any whitespace

// tokenizer.json may escape CR/LF inside the regex ("\\r") instead of embedding them; Oniguruma reads both alike.
std::string canonical_regex(std::string_view regex) {
  std::string out;
  for (char c : regex) {
    if (c == '\r') out += "\\r";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x309F) || (c >= 0x30A0 && c <= 0x30FF);
}
bool is_ascii_letter(unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }
bool is_ascii_punct(char32_t c) {
  return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
}
bool is_newline(char32_t c) { return c == '\r' || c == '\n'; }

// Matching context for one piece: text bytes, piece end, class table.
struct Scanner {
  const unsigned char* s;
  size_t end;
  const UnicodeClassTable& classes;

  CharClass class_at(size_t p, char32_t& cp, int& len) const {
    cp = decode_utf8(s + p, len);
    return classes.get(cp);
  }
  // End of the run of `cls` characters starting at p.
  size_t run_of(size_t p, CharClass cls) const {
    while (p < end) {
      char32_t cp;
      int len;
      if (class_at(p, cp, len) != cls) break;
      p += static_cast<size_t>(len);
    }
    return p;
  }
  size_t run_of_newlines(size_t p) const {
    while (p < end && (s[p] == '\r' || s[p] == '\n')) ++p;
    return p;
  }

  // End of the kWordsPunct match starting exactly at q, or kNoMatch. Alternatives are tried in regex order;
  // the comments name them (see kWordsPunctRegex).
  size_t match_words_punct(size_t q) const {
    char32_t c0, c1 = 0;
    int l0, l1 = 0;
    const CharClass k0 = class_at(q, c0, l0);
    const size_t p1 = q + static_cast<size_t>(l0);
    const bool has1 = p1 < end;
    CharClass k1 = CharClass::kOther;
    if (has1) k1 = class_at(p1, c1, l1);

    if (has1 && is_ascii_punct(c0) && is_ascii_letter(s[p1])) {  // A
      size_t p = p1 + 1;
      while (p < end && is_ascii_letter(s[p])) ++p;
      return p;
    }
    // B: a letter/mark run, optionally preceded by one char that is not CR, LF, letter, punctuation or symbol.
    // A mark as the prefix char gives the same match as the plain run, so marks need no case of their own.
    if (k0 == CharClass::kLetterMark) return run_of(p1, CharClass::kLetterMark);
    if (has1 && k1 == CharClass::kLetterMark && k0 != CharClass::kPunctSymbol && !is_newline(c0))
      return run_of(p1 + static_cast<size_t>(l1), CharClass::kLetterMark);
    // C
    if (k0 == CharClass::kPunctSymbol) return run_of_newlines(run_of(p1, CharClass::kPunctSymbol));
    if (c0 == ' ' && has1 && k1 == CharClass::kPunctSymbol)
      return run_of_newlines(run_of(p1 + static_cast<size_t>(l1), CharClass::kPunctSymbol));
    if (k0 != CharClass::kSpace) return kNoMatch;
    // D, E, F over the whitespace run starting at q.
    size_t after_last_newline = kNoMatch, last_char = q, p = q;
    while (p < end) {
      char32_t cp;
      int len;
      if (class_at(p, cp, len) != CharClass::kSpace) break;
      if (is_newline(cp)) after_last_newline = p + static_cast<size_t>(len);
      last_char = p;
      p += static_cast<size_t>(len);
    }
    if (after_last_newline != kNoMatch) return after_last_newline;  // D: \s* backtracks to the last newline
    if (p == end) return p;                                         // E: nothing follows the run
    if (last_char > q) return last_char;                            // E: keep the last space for the next word
    return p;                                                       // F
  }
};

// Emits the gap before a match (if any) and the match, the "Isolated" split behaviour.
inline void emit(std::vector<Piece>& out, size_t& gap_begin, size_t match_begin, size_t match_end) {
  if (gap_begin < match_begin) out.push_back({gap_begin, match_begin});
  out.push_back({match_begin, match_end});
  gap_begin = match_end;
}

void split_numbers(const Scanner& sc, size_t begin, std::vector<Piece>& out) {
  size_t gap = begin, q = begin;
  while (q < sc.end) {
    char32_t cp;
    int len;
    if (sc.class_at(q, cp, len) != CharClass::kNumber) {
      q += static_cast<size_t>(len);
      continue;
    }
    size_t p = q + static_cast<size_t>(len);
    for (int n = 1; n < 3 && p < sc.end; ++n) {
      int l2;
      if (sc.class_at(p, cp, l2) != CharClass::kNumber) break;
      p += static_cast<size_t>(l2);
    }
    emit(out, gap, q, p);
    q = p;
  }
  if (gap < sc.end) out.push_back({gap, sc.end});
}

void split_cjk(const Scanner& sc, size_t begin, std::vector<Piece>& out) {
  size_t gap = begin, q = begin;
  while (q < sc.end) {
    int len;
    if (!is_cjk(decode_utf8(sc.s + q, len))) {
      q += static_cast<size_t>(len);
      continue;
    }
    size_t p = q + static_cast<size_t>(len);
    while (p < sc.end) {
      int l2;
      if (!is_cjk(decode_utf8(sc.s + p, l2))) break;
      p += static_cast<size_t>(l2);
    }
    emit(out, gap, q, p);
    q = p;
  }
  if (gap < sc.end) out.push_back({gap, sc.end});
}

void split_words_punct(const Scanner& sc, size_t begin, std::vector<Piece>& out) {
  size_t gap = begin, q = begin;
  while (q < sc.end) {
    const size_t m = sc.match_words_punct(q);
    if (m == kNoMatch) {
      int len;
      decode_utf8(sc.s + q, len);
      q += static_cast<size_t>(len);
      continue;
    }
    emit(out, gap, q, m);
    q = m;
  }
  if (gap < sc.end) out.push_back({gap, sc.end});
}

}  // namespace

Result<SplitPattern> split_pattern_from_regex(std::string_view regex) {
  const std::string canon = canonical_regex(regex);
  for (SplitPattern p : {SplitPattern::kNumbers, SplitPattern::kCjk, SplitPattern::kWordsPunct})
    if (canon == canonical_regex(split_pattern_regex(p))) return p;
  return make_error("unsupported Split regex '" + std::string(regex) +
                    "' (cedar implements only the DeepSeek-V3/V4 pre-tokenizer regexes)");
}

std::string split_pattern_regex(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kNumbers: return kNumbersRegex;
    case SplitPattern::kCjk: return kCjkRegex;
    case SplitPattern::kWordsPunct: return kWordsPunctRegex;
  }
  return {};
}

PreTokenizer::PreTokenizer(std::vector<SplitPattern> steps)
    : steps_(std::move(steps)), classes_(&unicode_classes()) {}

void PreTokenizer::split(std::string_view text, size_t begin, size_t end, std::vector<Piece>& out,
                         Scratch& scratch) const {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  if (steps_.empty()) {
    if (begin < end) out.push_back({begin, end});
    return;
  }
  // Each step re-splits every piece of the previous one; a later step never sees across an earlier boundary.
  scratch.current.assign(1, Piece{begin, end});
  for (size_t i = 0; i < steps_.size(); ++i) {
    const bool last = i + 1 == steps_.size();
    std::vector<Piece>& dst = last ? out : scratch.next;
    if (!last) scratch.next.clear();
    for (const Piece& piece : scratch.current) {
      const Scanner sc{s, piece.end, *classes_};
      switch (steps_[i]) {
        case SplitPattern::kNumbers: split_numbers(sc, piece.begin, dst); break;
        case SplitPattern::kCjk: split_cjk(sc, piece.begin, dst); break;
        case SplitPattern::kWordsPunct: split_words_punct(sc, piece.begin, dst); break;
      }
    }
    if (!last) scratch.current.swap(scratch.next);
  }
}

}  // namespace cedar::text
