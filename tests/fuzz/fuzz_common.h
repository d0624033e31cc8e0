// What the libFuzzer targets share: a broken property aborts (libFuzzer saves the input), the DeepSeek
// tokenizers from third_party/downloads, and the parser start an options byte picks.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace cedar::fuzz {

inline void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz property broken: %s\n", what);
    std::abort();
  }
}

// A tokenizer.json under the source tree (e.g. "/third_party/downloads/deepseek-v4/tokenizer.json"), kept
// for the process; aborts with the loader's message when it is missing or bad.
inline const text::Tokenizer& load_tokenizer(const char* relative) {
  static std::vector<std::unique_ptr<text::Tokenizer>> kept;
  auto tok = text::Tokenizer::load(std::string(CEDAR_SOURCE_DIR) + relative);
  if (!tok) {
    std::fprintf(stderr, "fuzz: %s\n", tok.error().message.c_str());
    std::abort();
  }
  kept.push_back(std::make_unique<text::Tokenizer>(std::move(tok.value())));
  return *kept.back();
}

// The parser start of an options byte's low 3 bits (values 5..7 wrap around).
inline text::ParseStart parse_start(uint8_t bits) {
  constexpr text::ParseStart kStarts[] = {text::ParseStart::kContent, text::ParseStart::kReasoning,
                                          text::ParseStart::kReasoningContinuation,
                                          text::ParseStart::kContentContinuation, text::ParseStart::kToolCalls};
  return kStarts[(bits & 7) % 5];
}

}  // namespace cedar::fuzz
