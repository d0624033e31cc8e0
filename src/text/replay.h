// Exact replay of generated tool-call turns. Clients re-serialize tool arguments (`{"a":1}` for the
// model's `{"a": 1}`, `2.5` for `2.50`), so re-rendering history from the client's JSON can differ
// from the bytes the model generated, and prefix reuse breaks from that turn on (serving.md §3 item
// 10, §4b). The server remembers each generated turn under its minted tool-call ids and, when the
// client sends back a turn with the same ids and the same meaning, the encoder emits the original
// bytes instead.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>

#include "text/chat.h"
#include "text/prompt.h"

namespace cedar::text {

class ReplayMemory {
 public:
  explicit ReplayMemory(size_t max_turns = 4096) : max_turns_(max_turns) {}

  // Records one generated assistant turn: `parsed` is the message returned to the client (with the
  // minted call ids); `generated` is what the model produced after the generation header, without
  // EOS, as segments (from token ids, or segment_generated_text()). Turns without tool calls are
  // ignored (they re-render exactly or are dropped from history anyway).
  void remember(const Message& parsed, Prompt generated, bool thinking);

  // The original bytes for a history message, or nullptr when the ids are unknown or the message no
  // longer means the same (different reasoning, content, names or argument values).
  const Prompt* restore(const Message& message, bool thinking) const;

  size_t size() const { return order_.size(); }

 private:
  struct Turn {
    Message parsed;
    Prompt generated;
    bool thinking;
  };
  size_t max_turns_;
  std::map<std::string, std::shared_ptr<const Turn>> by_call_id_;
  std::deque<std::shared_ptr<const Turn>> order_;  // oldest first, for eviction
};

}  // namespace cedar::text
