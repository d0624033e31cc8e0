#include "text/unicode.h"

#include <cstring>
#include <map>

namespace cedar::text {

UnicodeClassTable::UnicodeClassTable() {
  std::vector<uint8_t> flat(0x110000, 0);
  for (size_t i = 0; i < kUnicodeClassRangeCount; ++i) {
    const char32_t end = i + 1 < kUnicodeClassRangeCount ? kUnicodeClassRanges[i + 1].first : 0x110000;
    std::memset(flat.data() + kUnicodeClassRanges[i].first, kUnicodeClassRanges[i].cls,
                end - kUnicodeClassRanges[i].first);
  }
  std::memcpy(ascii_.data(), flat.data(), 128);
  block_index_.resize(0x1100);
  std::map<std::string, uint16_t> seen;  // block contents -> index (build time only)
  for (size_t b = 0; b < 0x1100; ++b) {
    std::string key(reinterpret_cast<const char*>(flat.data() + b * 256), 256);
    auto [it, inserted] = seen.emplace(key, static_cast<uint16_t>(seen.size()));
    if (inserted) blocks_.insert(blocks_.end(), key.begin(), key.end());
    block_index_[b] = it->second;
  }
}

const UnicodeClassTable& unicode_classes() {
  static const UnicodeClassTable table;
  return table;
}

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) { i += 8; continue; }
    }
    const unsigned char b = p[i];
    if (b < 0x80) { ++i; continue; }
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lo = 0xA0;  // overlong
      if (b == 0xED) hi = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lo = 0x90;  // overlong
      if (b == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + need >= n) return i;  // truncated at end of input
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (int k = 2; k <= need; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    i += need + 1;
  }
  return std::string_view::npos;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {
constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
}

void Utf8LossyDecoder::feed_byte(unsigned char b, std::string& out) {
  if (need_ > 0) {
    if (b >= lo_ && b <= hi_) {
      held_[held_len_++] = b;
      lo_ = 0x80;
      hi_ = 0xBF;
      if (--need_ == 0) {
        out.append(reinterpret_cast<const char*>(held_), held_len_);
        held_len_ = 0;
      }
      return;
    }
    // The held bytes are a maximal ill-formed subpart; `b` starts afresh.
    out.append(kReplacement);
    held_len_ = 0;
    need_ = 0;
  }
  if (b < 0x80) {
    out.push_back(static_cast<char>(b));
    return;
  }
  lo_ = 0x80;
  hi_ = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need_ = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need_ = 2;
    if (b == 0xE0) lo_ = 0xA0;
    if (b == 0xED) hi_ = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need_ = 3;
    if (b == 0xF0) lo_ = 0x90;
    if (b == 0xF4) hi_ = 0x8F;
  } else {
    out.append(kReplacement);
    return;
  }
  held_[0] = b;
  held_len_ = 1;
}

void Utf8LossyDecoder::feed(std::string_view bytes, std::string& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    if (need_ == 0) {  // copy an ASCII run directly
      size_t j = i;
      while (j < n && p[j] < 0x80) ++j;
      out.append(bytes.data() + i, j - i);
      i = j;
      if (i == n) break;
    }
    feed_byte(p[i++], out);
  }
}

void Utf8LossyDecoder::finish(std::string& out) {
  if (need_ > 0) out.append(kReplacement);
  need_ = 0;
  held_len_ = 0;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  Utf8LossyDecoder dec;
  dec.feed(bytes, out);
  dec.finish(out);
  return out;
}

}  // namespace cedar::text
