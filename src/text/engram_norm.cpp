#include "text/engram_norm.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "text/unicode.h"

namespace cedar::text {

namespace {

constexpr char32_t kSentinel = 0xE000;

// Lowercase mappings of Unicode 16.0/17.0 (Rust's char::to_lowercase in tokenizers 0.23) that ICU 72 (Unicode
// 15.0) does not have: (first, last, offset to add). Every other code point lowercases identically in both
// (checked on all code points against HF's Lowercase normalizer).
struct LowerDelta {
  char32_t first, last;
  int32_t offset;
};
constexpr LowerDelta kNewerLowercase[] = {
    {0x1C89, 0x1C89, 1},  {0xA7CB, 0xA7CB, 0x0264 - 0xA7CB}, {0xA7CC, 0xA7CC, 1}, {0xA7CE, 0xA7CE, 1},
    {0xA7D2, 0xA7D2, 1},  {0xA7D4, 0xA7D4, 1},  {0xA7DA, 0xA7DA, 1}, {0xA7DC, 0xA7DC, 0x019B - 0xA7DC},
    {0x10D50, 0x10D65, 0x20},  // Garay
    {0x16EA0, 0x16EB8, 0x1B},  // Beria Erfe
};

bool is_white_space(char32_t c) {  // Rust char::is_whitespace (White_Space property)
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_collapsible_space(char32_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::vector<char32_t> to_code_points(const icu::UnicodeString& s) {
  std::vector<char32_t> out;
  out.reserve(static_cast<size_t>(s.length()));
  for (int32_t i = 0; i < s.length();) {
    const UChar32 c = s.char32At(i);
    out.push_back(static_cast<char32_t>(c));
    i += U16_LENGTH(c);
  }
  return out;
}

}  // namespace

struct EngramNormalizer::Impl {
  icu::UnicodeSet unicode9;  // code points assigned in Unicode <= 9.0
  std::unique_ptr<icu::FilteredNormalizer2> nfkc, nfd;

  bool is_mark_in_unicode9(char32_t c) const {
    if (c == 0x1CF2 || c == 0x1CF3) return true;  // Mc in 9.0, Lo since 10.0
    if (c == 0x111C9) return false;               // Po in 9.0, Mn since 10.0
    return unicode9.contains(static_cast<UChar32>(c)) && (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_M_MASK) != 0;
  }

  // Rust char::to_lowercase: the full (SpecialCasing unconditional) mapping of one character, no context.
  void append_lowercase(char32_t c, std::vector<char32_t>& out) const {
    for (const LowerDelta& d : kNewerLowercase)
      if (c >= d.first && c <= d.last) {
        out.push_back(static_cast<char32_t>(static_cast<int32_t>(c) + d.offset));
        return;
      }
    UChar src[2], dst[8];
    int32_t n = 0;
    U16_APPEND_UNSAFE(src, n, static_cast<UChar32>(c));
    UErrorCode err = U_ZERO_ERROR;
    const int32_t m = u_strToLower(dst, 8, src, n, "", &err);
    if (U_FAILURE(err)) {
      out.push_back(c);
      return;
    }
    for (int32_t i = 0; i < m;) {
      UChar32 d;
      U16_NEXT(dst, i, m, d);
      out.push_back(static_cast<char32_t>(d));
    }
  }
};

EngramNormalizer::EngramNormalizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EngramNormalizer::EngramNormalizer(EngramNormalizer&&) noexcept = default;
EngramNormalizer& EngramNormalizer::operator=(EngramNormalizer&&) noexcept = default;
EngramNormalizer::~EngramNormalizer() = default;

Result<EngramNormalizer> EngramNormalizer::create() {
  auto impl = std::make_unique<Impl>();
  UErrorCode err = U_ZERO_ERROR;
  impl->unicode9.applyPattern(icu::UnicodeString("[:age=9.0:]", -1, US_INV), err);
  if (U_FAILURE(err)) return make_error(std::string("ICU: cannot build [:age=9.0:]: ") + u_errorName(err));
  impl->unicode9.freeze();
  const icu::Normalizer2* nfkc = icu::Normalizer2::getNFKCInstance(err);
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(err);
  if (U_FAILURE(err)) return make_error(std::string("ICU: no NFKC/NFD data: ") + u_errorName(err));
  impl->nfkc = std::make_unique<icu::FilteredNormalizer2>(*nfkc, impl->unicode9);
  impl->nfd = std::make_unique<icu::FilteredNormalizer2>(*nfd, impl->unicode9);
  return EngramNormalizer(std::move(impl));
}

std::string EngramNormalizer::normalize(std::string_view text) const {
  UErrorCode err = U_ZERO_ERROR;
  const icu::UnicodeString src = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  const icu::Normalizer2& nfkc = *impl_->nfkc;
  const icu::Normalizer2& nfd = *impl_->nfd;
  const icu::UnicodeString decomposed = nfd.normalize(nfkc.normalize(src, err), err);
  if (U_FAILURE(err)) return std::string(text);  // unreachable for valid UTF-8 input

  // StripAccents, then Lowercase.
  std::vector<char32_t> lowered;
  for (char32_t c : to_code_points(decomposed))
    if (!impl_->is_mark_in_unicode9(c)) impl_->append_lowercase(c, lowered);

  // Replace([ \t\r\n]+, " ").
  std::vector<char32_t> s;
  for (size_t i = 0; i < lowered.size(); ++i) {
    if (!is_collapsible_space(lowered[i])) { s.push_back(lowered[i]); continue; }
    while (i + 1 < lowered.size() && is_collapsible_space(lowered[i + 1])) ++i;
    s.push_back(' ');
  }
  // Replace(^ $, sentinel): no newline is left, so this matches exactly the one-space string.
  if (s.size() == 1 && s[0] == ' ') s[0] = kSentinel;
  // Strip, then Replace(sentinel, " ") — every U+E000, including ones the token itself contained.
  size_t b = 0, e = s.size();
  while (b < e && is_white_space(s[b])) ++b;
  while (e > b && is_white_space(s[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) append_utf8(out, s[i] == kSentinel ? U' ' : s[i]);
  return out;
}

Result<EngramTokenMap> build_engram_token_map(const Tokenizer& tokenizer) {
  auto norm = EngramNormalizer::create();
  if (!norm) return norm.error();
  EngramTokenMap map;
  const auto n = static_cast<size_t>(tokenizer.vocab_size());
  map.compressed.resize(n);
  std::unordered_map<std::string, int32_t> key_to_id;
  key_to_id.reserve(n * 2);
  for (size_t id = 0; id < n; ++id) {
    const auto tid = static_cast<TokenId>(id);
    // An id without a token decodes to "" in HF (decode skips unknown ids).
    const std::string text = tokenizer.id_to_token(tid) ? *tokenizer.decode(std::vector<TokenId>{tid}) : std::string();
    std::string key;
    if (text.find("\xEF\xBF\xBD") != std::string::npos) {
      key = std::string(*tokenizer.id_to_token(tid));
    } else {
      key = norm->normalize(text);
      if (key.empty()) key = text;
    }
    auto [it, inserted] = key_to_id.emplace(std::move(key), static_cast<int32_t>(key_to_id.size()));
    map.compressed[id] = it->second;
  }
  map.num_classes = static_cast<int32_t>(key_to_id.size());
  return map;
}

Status save_engram_map_npy(const std::vector<int32_t>& map, const std::string& path) {
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (" + std::to_string(map.size()) + ",), }";
  // NumPy 1.0 format: magic, version, uint16 header length; header padded with spaces to a multiple of 64
  // (including the 10 preamble bytes) and ended by '\n'.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) return make_error("cannot write '" + path + "'");
  const char magic[] = "\x93NUMPY\x01\x00";
  f.write(magic, 8);
  const auto hlen = static_cast<uint16_t>(header.size());
  const char len_le[2] = {static_cast<char>(hlen & 0xFF), static_cast<char>(hlen >> 8)};
  f.write(len_le, 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (int32_t v : map) {
    const auto u = static_cast<uint32_t>(v);
    const char le[4] = {static_cast<char>(u & 0xFF), static_cast<char>((u >> 8) & 0xFF),
                        static_cast<char>((u >> 16) & 0xFF), static_cast<char>(u >> 24)};
    f.write(le, 4);
  }
  if (!f) return make_error("error writing '" + path + "'");
  return Status::Ok();
}

Result<std::vector<int32_t>> parse_engram_map_npy(std::string_view data, const std::string& label) {
  auto bad = [&](const std::string& why) { return make_error("'" + label + "' is not an int32 .npy vector: " + why); };
  if (data.size() < 10 || data.compare(0, 6, "\x93NUMPY") != 0) return bad("no NumPy magic");
  if (data[6] != 1) return bad("format version " + std::to_string(static_cast<int>(data[6])) + " (want 1)");
  const size_t hlen = static_cast<unsigned char>(data[8]) | (static_cast<size_t>(static_cast<unsigned char>(data[9])) << 8);
  if (data.size() < 10 + hlen) return bad("truncated header");
  const std::string header(data.substr(10, hlen));
  if (header.find("'descr': '<i4'") == std::string::npos) return bad("dtype is not '<i4'");
  if (header.find("'fortran_order': False") == std::string::npos) return bad("fortran order");
  const size_t shape = header.find("'shape': (");
  if (shape == std::string::npos) return bad("no shape");
  const size_t count = std::strtoull(header.c_str() + shape + 10, nullptr, 10);
  const size_t after = shape + 10 + std::to_string(count).size();  // past the first dimension
  if (after > header.size() || header.compare(after, 2, ",)") != 0) return bad("not one-dimensional");
  // The first test keeps count * 4 from overflowing on a forged shape.
  const size_t payload = data.size() - 10 - hlen;
  if (count > payload / 4 || payload != count * 4)
    return bad("payload size " + std::to_string(payload) + " bytes for " + std::to_string(count) + " values");
  std::vector<int32_t> out(count);
  for (size_t i = 0; i < count; ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(data.data() + 10 + hlen + 4 * i);
    out[i] = static_cast<int32_t>(uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24));
  }
  return out;
}

Result<std::vector<int32_t>> load_engram_map_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error("cannot open '" + path + "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return make_error("cannot read '" + path + "'");
  return parse_engram_map_npy(ss.str(), path);
}

}  // namespace cedar::text
