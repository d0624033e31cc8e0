#include "text/prompt.h"

#include "text/special_tokens.h"

namespace cedar::text {

void Prompt::control(std::string_view token) { segments_.push_back({SegmentKind::kControl, std::string(token)}); }

void Prompt::text(std::string_view s) {
  if (s.empty()) return;
  if (!segments_.empty() && segments_.back().kind == SegmentKind::kText) {
    segments_.back().text.append(s);
  } else {
    segments_.push_back({SegmentKind::kText, std::string(s)});
  }
}

void Prompt::template_text(std::string_view s) {
  static constexpr std::string_view kMarkers[] = {tok::kDsml, tok::kThinkEnd, tok::kThinkStart};
  while (!s.empty()) {
    size_t best = std::string_view::npos;
    std::string_view which;
    for (auto m : kMarkers) {
      const size_t p = s.find(m);
      if (p < best) { best = p; which = m; }
    }
    if (best == std::string_view::npos) { text(s); return; }
    text(s.substr(0, best));
    control(which);
    s.remove_prefix(best + which.size());
  }
}

void Prompt::append(const Prompt& other) {
  for (const auto& seg : other.segments_) {
    if (seg.kind == SegmentKind::kText) text(seg.text); else segments_.push_back(seg);
  }
  images.insert(images.end(), other.images.begin(), other.images.end());
}

std::string Prompt::str() const {
  std::string out;
  for (const auto& seg : segments_) out += seg.text;
  return out;
}

Prompt segment_generated_text(std::string_view generated) {
  Prompt p;
  p.template_text(generated);
  return p;
}

}  // namespace cedar::text
