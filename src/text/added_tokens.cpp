#include "text/added_tokens.h"

#include <algorithm>

namespace cedar::text {

void AddedTokenMatcher::Trie::add(std::string_view s, TokenId id) {
  if (s.empty()) return;  // HF never matches an empty added token
  first_byte[static_cast<unsigned char>(s[0])] = true;
  int32_t node = 0;
  for (unsigned char c : s) {
    auto& ch = nodes[static_cast<size_t>(node)].children;
    auto it = std::lower_bound(ch.begin(), ch.end(), c, [](const auto& e, unsigned char v) { return e.first < v; });
    if (it != ch.end() && it->first == c) {
      node = it->second;
      continue;
    }
    const auto child = static_cast<int32_t>(nodes.size());
    ch.insert(it, {c, child});  // `ch` is not used after nodes grows
    nodes.emplace_back();
    node = child;
  }
  // A duplicate string keeps the last id, as HF's token map does.
  nodes[static_cast<size_t>(node)].id = id;
}

size_t AddedTokenMatcher::Trie::longest_at(std::string_view text, size_t pos, TokenId& id) const {
  size_t best = 0;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto& ch = nodes[static_cast<size_t>(node)].children;
    const auto c = static_cast<unsigned char>(text[i]);
    auto it = std::lower_bound(ch.begin(), ch.end(), c, [](const auto& e, unsigned char v) { return e.first < v; });
    if (it == ch.end() || it->first != c) break;
    node = it->second;
    if (nodes[static_cast<size_t>(node)].id >= 0) {
      best = i + 1 - pos;
      id = nodes[static_cast<size_t>(node)].id;
    }
  }
  return best;
}

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) {
  for (const AddedToken& t : tokens) (t.normalized ? normalized_ : raw_).add(t.content, t.id);
}

void AddedTokenMatcher::split_with(const Trie& trie, std::string_view text, size_t begin, size_t end,
                                   std::vector<InputSpan>& out) {
  const std::string_view window = text.substr(0, end);
  size_t gap = begin;
  for (size_t pos = begin; pos < end; ++pos) {
    if (!trie.first_byte[static_cast<unsigned char>(text[pos])]) continue;
    TokenId id = -1;
    const size_t len = trie.longest_at(window, pos, id);
    if (len == 0) continue;
    if (gap < pos) out.push_back({gap, pos, -1});
    out.push_back({pos, pos + len, id});
    gap = pos + len;
    pos = gap - 1;
  }
  if (gap < end) out.push_back({gap, end, -1});
}

void AddedTokenMatcher::split(std::string_view text, std::vector<InputSpan>& out) const {
  if (raw_.empty()) {
    split_with(normalized_, text, 0, text.size(), out);
    return;
  }
  std::vector<InputSpan> first;
  split_with(raw_, text, 0, text.size(), first);
  for (const InputSpan& s : first) {
    if (s.id >= 0 || normalized_.empty()) out.push_back(s);
    else split_with(normalized_, text, s.begin, s.end, out);
  }
}

}  // namespace cedar::text
