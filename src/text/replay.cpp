#include "text/replay.h"

#include "text/py_json.h"

namespace cedar::text {
namespace {

// Arguments mean the same when they parse to equal JSON values (key order and spacing aside).
bool same_arguments(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const Json ja = Json::parse(a, nullptr, false), jb = Json::parse(b, nullptr, false);
  if (ja.is_discarded() || jb.is_discarded()) return false;
  return ja == jb;
}

}  // namespace

void ReplayMemory::remember(const Message& parsed, Prompt generated, bool thinking) {
  if (parsed.tool_calls.empty() || max_turns_ == 0) return;
  for (const auto& c : parsed.tool_calls) if (c.id.empty()) return;  // cannot be looked up
  auto turn = std::make_shared<const Turn>(Turn{parsed, std::move(generated), thinking});
  for (const auto& c : parsed.tool_calls) by_call_id_[c.id] = turn;
  order_.push_back(turn);
  while (order_.size() > max_turns_) {
    const auto old = order_.front();
    order_.pop_front();
    for (const auto& c : old->parsed.tool_calls) {
      auto it = by_call_id_.find(c.id);
      if (it != by_call_id_.end() && it->second == old) by_call_id_.erase(it);
    }
  }
}

const Prompt* ReplayMemory::restore(const Message& m, bool thinking) const {
  if (m.role != Role::kAssistant || m.tool_calls.empty()) return nullptr;
  auto it = by_call_id_.find(m.tool_calls[0].id);
  if (it == by_call_id_.end()) return nullptr;
  const Turn& t = *it->second;
  if (t.thinking != thinking || t.parsed.tool_calls.size() != m.tool_calls.size()) return nullptr;
  if (m.content.value_or("") != t.parsed.content.value_or("")) return nullptr;
  if (thinking && m.reasoning_content.value_or("") != t.parsed.reasoning_content.value_or("")) return nullptr;
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    const auto& a = m.tool_calls[i];
    const auto& b = t.parsed.tool_calls[i];
    if (a.id != b.id || a.name != b.name || a.ns != b.ns || !same_arguments(a.arguments, b.arguments)) return nullptr;
  }
  return &t.generated;
}

}  // namespace cedar::text
