// libFuzzer target: a request body as the server receives it (POST /v1/chat/completions, /v1/completions,
// /v1/messages) through the whole request side: parse_json, the wire parsers, the Anthropic translation,
// the request mapping, the encoder and the prompt's token ids with the real DeepSeek tokenizer. Every
// path must return a value or an error, never crash or throw. Properties besides:
// * an encoded prompt is valid UTF-8 and its token ids decode back to the prompt's text;
// * a body without non-finite numbers survives py_json_dumps + parse_json unchanged (the prompt embeds
//   tool schemas through py_json_dumps).
// Byte 0 picks the policy (dialect, default thinking, developer role); the rest is the body's text.
// Needs third_party/downloads/deepseek-v4/tokenizer.json (tools/fetch_tokenizer.py) for the V4 dialects and
// the V4.1 file derived from it (tools/derive_v41_tokenizer.py; scripts/fuzz.sh writes it) for the others.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz_common.h"
#include "server/anthropic.h"
#include "server/wire_request.h"
#include "text/prompt_tokens.h"
#include "text/py_json.h"
#include "text/request_mapping.h"
#include "text/tokenizer.h"

namespace {

using cedar::text::Json;
using cedar::fuzz::check;

const cedar::text::Tokenizer* g_v4 = nullptr;   // V4 and V4-0731 prompts
const cedar::text::Tokenizer* g_v41 = nullptr;  // the V4.1 dialects' (`<｜System｜>`, `<｜deepseek_image｜>`)

bool all_finite(const Json& j) {
  if (j.is_number_float()) return std::isfinite(j.get<double>());
  if (j.is_structured())
    for (const auto& v : j)
      if (!all_finite(v)) return false;
  return true;
}

void check_chat(const Json& body, const cedar::text::RequestPolicy& policy) {
  const bool v4 = policy.dialect == cedar::text::Dialect::kV4 || policy.dialect == cedar::text::Dialect::kV4_0731;
  const cedar::text::Tokenizer& tok = v4 ? *g_v4 : *g_v41;
  auto job = cedar::server::parse_chat_request(body, policy);
  if (!job.ok()) return;
  auto prompt = cedar::text::encode_request(job->encoder);
  if (!prompt.ok()) return;
  const std::string text = prompt->str();
  check(cedar::text::find_invalid_utf8(text) == std::string_view::npos, "the prompt is not valid UTF-8");
  auto ids = cedar::text::prompt_token_ids(*prompt, tok);
  check(ids.ok(), "a rendered prompt has no token ids");
  auto back = tok.decode(*ids);
  check(back.ok() && *back == text, "the prompt's token ids do not decode to its text");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_v4 = &cedar::fuzz::load_tokenizer("/third_party/downloads/deepseek-v4/tokenizer.json");
  g_v41 = &cedar::fuzz::load_tokenizer("/third_party/downloads/deepseek-v41-derived/tokenizer.json");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t o = data[0];
  cedar::text::RequestPolicy policy;
  constexpr cedar::text::Dialect kDialects[] = {cedar::text::Dialect::kV4, cedar::text::Dialect::kV4_0731,
                                                cedar::text::Dialect::kV41Pre, cedar::text::Dialect::kV41,
                                                cedar::text::Dialect::kV41_1017};
  policy.dialect = kDialects[(o & 7) % 5];
  policy.default_thinking = (o & 8) != 0;
  constexpr cedar::text::DeveloperPolicy kDev[] = {cedar::text::DeveloperPolicy::kNativeOrSystem,
                                                   cedar::text::DeveloperPolicy::kAsUser,
                                                   cedar::text::DeveloperPolicy::kReject};
  policy.developer = kDev[((o >> 4) & 3) % 3];
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto body = cedar::text::parse_json(text, "request body");
  if (!body.ok()) return 0;
  if (all_finite(*body)) {
    auto again = cedar::text::parse_json(cedar::text::py_json_dumps(*body), "dumped body");
    check(again.ok() && *again == *body, "py_json_dumps + parse_json changed the body");
  }
  check_chat(*body, policy);
  (void)cedar::server::parse_completion_request(*body);
  if (auto chat = cedar::server::messages_to_chat_request(*body); chat.ok()) check_chat(*chat, policy);
  return 0;
}
