// UTF-8 validation, lossy decoding and character classes. Expected values: Python's
// bytes.decode("utf-8", "replace") (same maximal-subpart rule as Rust's from_utf8_lossy) and Unicode 16.0.
#include "text/unicode.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "text/bpe.h"

namespace cedar::text {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8, FindInvalid) {
  EXPECT_EQ(find_invalid_utf8(""), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("plain ascii text, long enough for the 8-byte path"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("é日🙂\xF4\x8F\xBF\xBF"), std::string_view::npos);  // U+10FFFF is valid
  EXPECT_EQ(find_invalid_utf8("ab\x80"), 2u);                       // lone continuation
  EXPECT_EQ(find_invalid_utf8("ok\xC0\xAF"), 2u);                   // overlong 2-byte
  EXPECT_EQ(find_invalid_utf8("\xE0\x80\x80"), 0u);                 // overlong 3-byte
  EXPECT_EQ(find_invalid_utf8("x\xED\xA0\x80"), 1u);                // surrogate U+D800
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);             // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("12345678\xF0\x9F\x99"), 8u);         // truncated at the end
  EXPECT_EQ(find_invalid_utf8("\xE2\x82x"), 0u);                    // truncated by a non-continuation
  EXPECT_EQ(find_invalid_utf8("\xFF"), 0u);
}

TEST(Utf8, LossyMatchesPythonReplace) {
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x99" "A"), kFffd + "A");
  EXPECT_EQ(utf8_lossy("\xE0\x80"), kFffd + kFffd);
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), kFffd + kFffd);
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);
  EXPECT_EQ(utf8_lossy("a\x80" "b"), "a" + kFffd + "b");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x99"), kFffd);
  EXPECT_EQ(utf8_lossy("\xFF\xFE"), kFffd + kFffd);
  EXPECT_EQ(utf8_lossy("\xE2\x82\xAC\xE2"), "€" + kFffd);
  EXPECT_EQ(utf8_lossy("é日🙂"), "é日🙂");
}

// Feeding bytes in pieces gives the one-shot result, for every split of random byte strings.
TEST(Utf8, LossyIsSplitInvariant) {
  std::mt19937 rng(5);
  const std::string alphabet = "a\x80\xBF\xC2\xC3\xE0\xE2\xED\xF0\xF4\x9F\x90\xA0\x82\xAC\xFF";
  for (int iter = 0; iter < 500; ++iter) {
    std::string bytes;
    for (int i = 0; i < 12; ++i) bytes += alphabet[rng() % alphabet.size()];
    const std::string whole = utf8_lossy(bytes);
    for (size_t cut1 = 0; cut1 <= bytes.size(); ++cut1) {
      const size_t cut2 = cut1 + (bytes.size() - cut1) / 2;
      Utf8LossyDecoder d;
      std::string out;
      d.feed(std::string_view(bytes).substr(0, cut1), out);
      d.feed(std::string_view(bytes).substr(cut1, cut2 - cut1), out);
      d.feed(std::string_view(bytes).substr(cut2), out);
      d.finish(out);
      ASSERT_EQ(out, whole) << "iteration " << iter << " cut " << cut1;
    }
  }
}

TEST(Utf8, AppendUtf8) {
  std::string s;
  for (char32_t c : {U'A', U'é', U'日', U'🙂', char32_t{0x10FFFF}}) append_utf8(s, c);
  EXPECT_EQ(s, "Aé日🙂\xF4\x8F\xBF\xBF");
}

TEST(UnicodeClasses, MatchUnicode16) {
  const auto& t = unicode_classes();
  EXPECT_EQ(t.get(U'a'), CharClass::kLetterMark);
  EXPECT_EQ(t.get(0x0301), CharClass::kLetterMark);    // combining acute (Mn)
  EXPECT_EQ(t.get(0x0903), CharClass::kLetterMark);    // Devanagari visarga (Mc)
  EXPECT_EQ(t.get(U'~'), CharClass::kPunctSymbol);     // Sm: the " ~~~" golden depends on it
  EXPECT_EQ(t.get(U'$'), CharClass::kPunctSymbol);
  EXPECT_EQ(t.get(0x0663), CharClass::kNumber);        // Arabic-Indic three
  EXPECT_EQ(t.get(0x216B), CharClass::kNumber);        // Roman numeral twelve (Nl)
  EXPECT_EQ(t.get(0x00BD), CharClass::kNumber);        // ½ (No)
  for (char32_t ws : {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x200A, 0x2028, 0x2029,
                      0x202F, 0x205F, 0x3000})
    EXPECT_EQ(t.get(ws), CharClass::kSpace) << std::hex << static_cast<uint32_t>(ws);
  EXPECT_EQ(t.get(0x200B), CharClass::kOther);         // zero-width space is Cf, not \s
  EXPECT_EQ(t.get(0x180E), CharClass::kOther);         // Mongolian vowel separator: Cf since Unicode 6.3
  EXPECT_EQ(t.get(0xE000), CharClass::kOther);         // private use
  EXPECT_EQ(t.get(0x1C89), CharClass::kLetterMark);    // new in Unicode 16.0 (Lu)
  EXPECT_EQ(t.get(0x0897), CharClass::kLetterMark);    // new in Unicode 16.0 (Mn)
  EXPECT_EQ(t.get(0x10D40), CharClass::kNumber);       // Garay digit zero, new in 16.0
  EXPECT_EQ(t.get(0x11DE0), CharClass::kOther);        // assigned only in Unicode 17.0
  EXPECT_EQ(t.get(0x10FFFF), CharClass::kOther);
  EXPECT_STREQ(kUnicodeClassVersion, "16.0.0");
}

TEST(ByteLevel, Gpt2Alphabet) {
  EXPECT_EQ(byte_to_unicode('A'), U'A');
  EXPECT_EQ(byte_to_unicode(' '), char32_t{0x120});   // Ġ
  EXPECT_EQ(byte_to_unicode('\n'), char32_t{0x10A});  // Ċ
  EXPECT_EQ(byte_to_unicode('\t'), char32_t{0x109});  // ĉ
  EXPECT_EQ(byte_to_unicode(0x00), char32_t{0x100});
  EXPECT_EQ(byte_to_unicode(0x7F), char32_t{0x121});
  EXPECT_EQ(byte_to_unicode(0xA0), char32_t{0x142});
  EXPECT_EQ(byte_to_unicode(0xAD), char32_t{0x143});
  EXPECT_EQ(byte_to_unicode(0xE9), char32_t{0xE9});
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode_to_byte(byte_to_unicode(static_cast<uint8_t>(b))), b);
  EXPECT_EQ(unicode_to_byte(0x144), -1);
  EXPECT_EQ(unicode_to_byte(U'｜'), -1);
  EXPECT_EQ(bytes_to_byte_level(" world\n"), "Ġworld\xC4\x8A");
}

}  // namespace
}  // namespace cedar::text
