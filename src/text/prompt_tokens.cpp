#include "text/prompt_tokens.h"

namespace cedar::text {

Result<std::vector<TokenId>> prompt_token_ids(const Prompt& prompt, const Tokenizer& tokenizer) {
  std::vector<TokenId> ids;
  size_t index = 0;
  for (const Segment& seg : prompt.segments()) {
    if (seg.kind == SegmentKind::kControl) {
      const auto id = tokenizer.token_to_id(seg.text);
      // Only an added token counts: a control string that happened to be a BPE vocab entry would
      // silently encode as something else.
      if (!id || tokenizer.added_token(*id) == nullptr) {
        return make_error("control token '" + seg.text + "' (prompt segment " + std::to_string(index) +
                          ") is not an added token of this tokenizer.json");
      }
      ids.push_back(*id);
    } else {
      auto text_ids = tokenizer.encode(seg.text, TokenizeOptions{.allow_added_tokens = false});
      if (!text_ids) return make_error("prompt segment " + std::to_string(index) + ": " + text_ids.error().message);
      ids.insert(ids.end(), text_ids->begin(), text_ids->end());
    }
    ++index;
  }
  return ids;
}

}  // namespace cedar::text
