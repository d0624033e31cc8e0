// Stop strings on streamed text: text is released as soon as it can no longer be the start of a stop
// string, so a stop that spans several tokens (or several pushes) is still found and never leaks out.
// The earliest match in the text wins; the stop string and everything after it are dropped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace cedar::engine {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Appends `text`; returns the text that is now safe to emit. After a match returns nothing more.
  std::string push(std::string_view text);
  // End of generation without a match: the held-back text.
  std::string flush();
  bool matched() const { return matched_; }
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
  std::string matched_stop_;
};

}  // namespace cedar::engine
