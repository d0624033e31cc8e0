// libFuzzer target: encode arbitrary bytes with the real DeepSeek tokenizer. Invalid UTF-8 must be refused;
// valid text must round-trip exactly through decode and through the stream decoder; decoding arbitrary ids must
// yield valid UTF-8. Needs third_party/downloads/deepseek-v4/tokenizer.json (tools/fetch_tokenizer.py).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "text/tokenizer.h"

namespace {

const cedar::text::Tokenizer* g_tok = nullptr;
using cedar::fuzz::check;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_tok = &cedar::fuzz::load_tokenizer("/third_party/downloads/deepseek-v4/tokenizer.json");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  cedar::text::TokenizeOptions opts;
  opts.allow_added_tokens = (data[0] & 1) != 0;
  auto ids = g_tok->encode(text, opts);
  const bool valid = cedar::text::find_invalid_utf8(text) == std::string_view::npos;
  check(ids.ok() == valid, "encode accepted invalid UTF-8 or refused valid UTF-8");
  if (ids.ok()) {
    auto back = g_tok->decode(*ids);
    check(back.ok() && *back == text, "decode(encode(text)) != text");
    cedar::text::StreamDecoder dec(*g_tok);
    std::string streamed;
    for (auto id : *ids) check(dec.push(id, streamed).ok(), "stream push failed");
    streamed += dec.finish();
    check(streamed == text, "stream decode != text");
  }
  // The same bytes as token ids (little-endian pairs, taken modulo the vocabulary).
  std::vector<cedar::text::TokenId> raw;
  for (size_t i = 0; i + 1 < size; i += 2)
    raw.push_back(static_cast<cedar::text::TokenId>((data[i] | (data[i + 1] << 8)) * 2 % g_tok->vocab_size()));
  auto decoded = g_tok->decode(raw);
  check(decoded.ok() && cedar::text::find_invalid_utf8(*decoded) == std::string_view::npos, "decode of ids");
  return 0;
}
