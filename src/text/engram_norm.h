// V4.1 Engram token-normalization map (architecture.md §3.9 item 1): raw token id -> compressed id, where ids
// whose decoded text normalizes alike share a compressed id. The reference is `build_compressed_token_map`
// (official inference/engram.py; transformers deepseek_v41), which normalizes with HF tokenizers' normalizers:
//   NFKC -> NFD -> StripAccents -> Lowercase -> Replace([ \t\r\n]+, " ") -> Replace(^ $, U+E000) -> Strip
//   -> Replace(U+E000, " ")
// The Unicode data behind those steps in HF tokenizers 0.23 is not one version (measured on every code point):
//   * NFKC, NFD and StripAccents use Unicode 9.0 tables (crate unicode-normalization-alignments); StripAccents
//     removes General_Category=Mark as of 9.0 (U+1CF2/U+1CF3 were Mc then, U+111C9 was Po).
//   * Lowercase is Rust's char::to_lowercase per character (no final-sigma rule), Unicode 17.0.
//   * Strip removes White_Space characters.
// cedar reproduces this with ICU: normalization filtered to [:age=9.0:] (how ICU emulates older
// normalization), marks by age and General_Category, and ICU's lowercase plus the Unicode 16/17 additions ICU 72
// lacks. The map used at inference is frozen offline (assets/engram/); this builder regenerates and checks it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/tokenizer.h"

namespace cedar::text {

// engram_compressed_vocab_size of DeepSeek-V4.1-Flash (config.json); build_compressed_token_map asserts it.
inline constexpr int32_t kEngramCompressedVocabSizeV41 = 99092;

class EngramNormalizer {
 public:
  static Result<EngramNormalizer> create();
  EngramNormalizer(EngramNormalizer&&) noexcept;
  EngramNormalizer& operator=(EngramNormalizer&&) noexcept;
  ~EngramNormalizer();

  // The HF normalizer sequence above applied to valid UTF-8 text.
  std::string normalize(std::string_view text) const;

 private:
  struct Impl;
  explicit EngramNormalizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct EngramTokenMap {
  std::vector<int32_t> compressed;  // raw id -> compressed id, one entry per id of the tokenizer
  int32_t num_classes = 0;          // number of distinct compressed ids
};

// build_compressed_token_map: decode each id alone; text containing U+FFFD is keyed by the raw token string,
// other text by its normalized form (or itself when that is empty); compressed ids in first-seen key order.
Result<EngramTokenMap> build_engram_token_map(const Tokenizer& tokenizer);

// The frozen map as a NumPy .npy file: little-endian int32, shape (vocab,).
Status save_engram_map_npy(const std::vector<int32_t>& map, const std::string& path);
Result<std::vector<int32_t>> load_engram_map_npy(const std::string& path);
// The same from the bytes of such a file; `label` names them in errors.
Result<std::vector<int32_t>> parse_engram_map_npy(std::string_view data, const std::string& label);

}  // namespace cedar::text
