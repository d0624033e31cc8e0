// Randomized robustness test of the safetensors header and index parsers (fixed seed, a few thousand
// mutants of valid inputs): byte flips, truncations, header-length changes and JSON-aware edits.
// Every mutant must give either an Error naming the file or a header whose invariants hold; run under
// the asan preset this also proves the parsers never read out of bounds. tests/fuzz/ has the libFuzzer
// counterpart for open-ended fuzzing.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "safetensors_test_util.h"

namespace cedar::io {
namespace {

using testing::make_file;

constexpr const char* kLabel = "mutant.safetensors";

struct Seed {
  std::string header;
  size_t data;
};

const std::vector<Seed>& seeds() {
  static const std::vector<Seed> s = {
      {R"({"__metadata__":{"format":"pt"},"a.weight":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
       R"("a.scale":{"dtype":"F8_E8M0","shape":[2,1],"data_offsets":[12,14]},"b":{"dtype":"F32","shape":[],"data_offsets":[14,18]}})",
       18},
      {R"({"e":{"dtype":"I8","shape":[0,4],"data_offsets":[0,0]},"w":{"dtype":"F8_E4M3","shape":[4,4],"data_offsets":[0,16]}})",
       16},
      {R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},"y":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}})", 11},
      {"{}", 0},
  };
  return s;
}

const char* const kTokens[] = {
    "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "\"F32\"", "\"BF16\"", "\"I8\"", "\"Q8\"",
    "0", "1", "-1", "18", "4294967296", "9223372036854775807", "9223372036854775808", "18446744073709551615",
    "18446744073709551616", "1e308", "2.5", "null", "true", "[]", "{}", "[0,0]", "[[[[", "]]]]", "{", "}", "[",
    "]", ",", ":", "\"", "\\", "\"\\u0000\"", "\"\xc3\x28\"",
};

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  size_t below(size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  bool chance(int percent) { return below(100) < static_cast<size_t>(percent); }

  // JSON-aware edits on the header text.
  void mutate_text(std::string& s) {
    switch (below(6)) {
      case 0: {  // replace a token (or any run of characters) with another token
        const size_t at = below(s.size() + 1);
        const size_t len = std::min(s.size() - at, below(12));
        s.replace(at, len, kTokens[below(std::size(kTokens))]);
        break;
      }
      case 1: {  // swap two field names / values that occur in the text
        const std::string a = kTokens[below(std::size(kTokens))];
        const std::string b = kTokens[below(std::size(kTokens))];
        if (auto pos = s.find(a, below(s.size() + 1)); pos != std::string::npos) s.replace(pos, a.size(), b);
        break;
      }
      case 2: {  // duplicate a slice (duplicate entries, fields, array items)
        const size_t at = below(s.size() + 1);
        const size_t len = std::min(s.size() - at, below(64));
        s.insert(below(s.size() + 1), s.substr(at, len));
        break;
      }
      case 3:  // delete a slice
        if (!s.empty()) s.erase(below(s.size()), below(16));
        break;
      case 4: {  // change a number
        for (size_t tries = 0; tries < 8; ++tries) {
          const size_t at = below(s.size());
          if (at < s.size() && std::isdigit(static_cast<unsigned char>(s[at]))) {
            s[at] = static_cast<char>('0' + below(10));
            if (chance(30)) s.insert(at, 1, static_cast<char>('0' + below(10)));
            break;
          }
        }
        break;
      }
      default:  // insert a random byte
        s.insert(below(s.size() + 1), 1, static_cast<char>(below(256)));
        break;
    }
  }

  std::vector<uint8_t> mutate_file(const Seed& seed) {
    std::string header = seed.header;
    const int text_edits = static_cast<int>(below(4));
    for (int i = 0; i < text_edits; ++i) mutate_text(header);
    const size_t data = chance(80) ? seed.data : below(seed.data + 16);
    std::vector<uint8_t> file = make_file(header, data, chance(80));
    const int byte_edits = static_cast<int>(below(3));
    for (int i = 0; i < byte_edits && !file.empty(); ++i) {
      switch (below(4)) {
        case 0: file[below(file.size())] ^= static_cast<uint8_t>(1u << below(8)); break;  // bit flip
        case 1: file[below(file.size())] = static_cast<uint8_t>(below(256)); break;       // byte overwrite
        case 2: file.resize(below(file.size() + 1)); break;                                  // truncation
        default: {  // header length field: off by a little, or anything at all
          uint64_t len = 0;
          for (int b = 7; b >= 0 && file.size() >= 8; --b) len = (len << 8) | file[static_cast<size_t>(b)];
          len = chance(50) ? len + below(17) - 8 : (uint64_t{rng_()} >> below(64));
          for (int b = 0; b < 8 && file.size() >= 8; ++b) file[static_cast<size_t>(b)] = static_cast<uint8_t>(len >> (8 * b));
          break;
        }
      }
    }
    return file;
  }

 private:
  std::mt19937_64 rng_;
};

// What every accepted header must satisfy, whatever the input was.
void expect_invariants(const SafetensorsHeader& h, size_t file_size) {
  ASSERT_LE(h.data_offset, file_size);
  EXPECT_EQ(h.data_offset + h.data_size, file_size);
  uint64_t pos = 0;
  std::set<std::string> names;
  for (const TensorEntry& t : h.tensors) {
    EXPECT_TRUE(names.insert(t.name).second) << t.name;
    EXPECT_EQ(t.begin, pos) << t.name;
    EXPECT_LE(t.begin, t.end) << t.name;
    EXPECT_LE(t.end, h.data_size) << t.name;
    EXPECT_EQ(t.nbytes(), static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype)) << t.name;
    for (int64_t d : t.shape) EXPECT_GE(d, 0) << t.name;
    pos = t.end;
  }
  EXPECT_EQ(pos, h.data_size);
}

TEST(SafetensorsFuzz, MutatedHeadersNeverCrashAndAcceptedOnesAreConsistent) {
  Mutator m(0x5AFE7E25u);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    const std::vector<uint8_t> file = m.mutate_file(seeds()[m.below(seeds().size())]);
    auto r = parse_safetensors(file, kLabel);
    if (r.ok()) {
      ++accepted;
      expect_invariants(*r, file.size());
    } else {
      ++rejected;
      ASSERT_EQ(r.error().message.rfind(std::string(kLabel) + ": ", 0), 0u) << r.error().message;
    }
    if (::testing::Test::HasFailure()) FAIL() << "at iteration " << iter;
  }
  // Both outcomes must be common, or the mutator is not exercising the parser.
  EXPECT_GT(accepted, 200);
  EXPECT_GT(rejected, 1000);
}

TEST(SafetensorsFuzz, MutatedIndexJsonNeverCrashes) {
  Mutator m(0x1DE7u);
  const std::string seed =
      R"({"metadata":{"total_size":123},"weight_map":{"a.weight":"model-00001-of-00002.safetensors",)"
      R"("b":"model-00002-of-00002.safetensors","c":"sub/x.safetensors"}})";
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text = seed;
    const int edits = 1 + static_cast<int>(m.below(3));
    for (int i = 0; i < edits; ++i) m.mutate_text(text);
    auto r = parse_safetensors_index(text, "index.json");
    if (r.ok()) {
      ++accepted;
      for (const auto& [name, file] : r->weight_map) {
        EXPECT_FALSE(file.empty()) << name;
        EXPECT_NE(file[0], '/') << name;
        for (const auto& part : std::filesystem::path(file)) EXPECT_NE(part, "..") << name << " → " << file;
      }
    } else {
      ++rejected;
      ASSERT_EQ(r.error().message.rfind("index.json: ", 0), 0u) << r.error().message;
    }
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(rejected, 500);
}

}  // namespace
}  // namespace cedar::io
