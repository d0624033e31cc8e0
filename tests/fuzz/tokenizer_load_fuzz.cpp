// libFuzzer target: loading a tokenizer.json (Tokenizer::from_json), which a user supplies with a
// checkpoint or with `--tokenizer FILE`. Any bytes must give a tokenizer or an error naming what is
// unsupported, never a crash or undefined behaviour. A tokenizer that loads must then encode and decode
// without crashing: plain text with and without the added vocabulary, the stream decoder, and every id it
// claims to have (ids past the vocabulary are errors). Byte 0 is unused; the rest is the JSON text.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "text/tokenizer.h"

using cedar::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto tok = cedar::text::Tokenizer::from_json(text, "fuzz/tokenizer.json");
  if (!tok.ok()) {
    check(!tok.error().message.empty(), "an error without a message");
    return 0;
  }
  for (const bool added : {false, true}) {
    cedar::text::TokenizeOptions opts;
    opts.allow_added_tokens = added;
    for (const std::string_view s : {"the thin thread 12345 中文 <｜begin▁of▁sentence｜>\n\n  x", ""}) {
      auto ids = tok->encode(s, opts);
      if (!ids.ok()) continue;
      (void)tok->decode(*ids);
      cedar::text::StreamDecoder dec(*tok);
      std::string out;
      for (const auto id : *ids) (void)dec.push(id, out);
      out += dec.finish();
    }
  }
  const int64_t vocab = tok->vocab_size();
  std::vector<cedar::text::TokenId> ids;
  for (int64_t id = 0; id < vocab && id < 4096; ++id) ids.push_back(static_cast<cedar::text::TokenId>(id));
  (void)tok->decode(ids);
  const std::vector<cedar::text::TokenId> past{static_cast<cedar::text::TokenId>(vocab)};
  check(!tok->decode(past).ok(), "an id past the vocabulary decoded");
  return 0;
}
