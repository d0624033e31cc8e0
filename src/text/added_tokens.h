// Added (special/control) tokens: matching their literal strings inside text, as HF tokenizers'
// AddedVocabulary does — leftmost-longest, first over the tokens with normalized=false, then, inside the text
// left between those, over the tokens with normalized=true (the normalizer is empty, so both passes see the
// same text; the order still decides overlaps).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/bpe.h"

namespace cedar::text {

struct AddedToken {
  TokenId id = -1;
  std::string content;
  bool special = false;     // HF: dropped by decode(skip_special_tokens=True)
  bool normalized = false;  // HF: matched after normalization (second pass)
};

// A span of input: an added token (id >= 0) or plain text to pre-tokenize (id == -1).
struct InputSpan {
  size_t begin;
  size_t end;
  TokenId id;
};

class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  // Appends the spans of text[0, size) in order; adjacent text is never split without a token between.
  void split(std::string_view text, std::vector<InputSpan>& out) const;

 private:
  // Byte trie; children are sorted (byte, node) edges, small per node.
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    TokenId id = -1;  // token ending here
  };
  struct Trie {
    std::vector<Node> nodes{Node{}};
    bool first_byte[256] = {};
    void add(std::string_view s, TokenId id);
    // Longest token starting at text[pos]: sets id and returns its length, 0 if none.
    size_t longest_at(std::string_view text, size_t pos, TokenId& id) const;
    bool empty() const { return nodes.size() == 1; }
  };
  // Splits text[begin, end) with one trie, appending spans.
  static void split_with(const Trie& trie, std::string_view text, size_t begin, size_t end,
                         std::vector<InputSpan>& out);

  Trie raw_;         // normalized == false
  Trie normalized_;  // normalized == true
};

}  // namespace cedar::text
