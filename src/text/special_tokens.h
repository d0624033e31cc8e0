// Spellings of the DeepSeek-V4 / V4.1 control tokens (encoding.md §1). They use U+FF5C `｜` and U+2581
// `▁`, never ASCII `|` / `_`.
#pragma once

#include <string_view>

namespace cedar::text::tok {

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kSystem = "<｜System｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";  // the token is the bare word; `<` and `>` are BPE text
inline constexpr std::string_view kImage = "<｜deepseek_image｜>";

// Quick-instruction task tokens (official DS_TASK_SP_TOKENS).
struct TaskToken {
  std::string_view task;
  std::string_view token;
};
inline constexpr TaskToken kTaskTokens[] = {
    {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
    {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"},  {"read_url", "<｜read_url｜>"},
};

}  // namespace cedar::text::tok
