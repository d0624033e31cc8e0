// A rendered prompt (prompt.h) -> token ids, as DeepSeek's deepseek-recipe 0.2.0 encodes prompts
// (encoding.md §4.3): each control segment is the id of the added token spelled exactly like it;
// each text segment goes through BPE with the added vocabulary OFF, so text can never become a
// control token whatever it contains.
#pragma once

#include <vector>

#include "core/status.h"
#include "text/prompt.h"
#include "text/tokenizer.h"

namespace cedar::text {

// Errors name the control token a tokenizer lacks (e.g. `<｜System｜>` with a V4 tokenizer.json)
// or the text segment that is not valid UTF-8.
Result<std::vector<TokenId>> prompt_token_ids(const Prompt& prompt, const Tokenizer& tokenizer);

}  // namespace cedar::text
