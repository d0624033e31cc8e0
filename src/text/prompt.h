// A rendered prompt as a list of segments: control tokens (template markup, encoded by exact id
// lookup) and text (user data and template prose, encoded by BPE with the added vocabulary OFF, so
// content can never forge a control token; encoding.md §4.3). Turning a Prompt into ids is one loop:
//   for (seg : prompt.segments()) ids += seg.kind == kControl ? vocab.at(seg.text) : bpe(seg.text);
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/py_json.h"

namespace cedar::text {

enum class SegmentKind : unsigned char { kControl, kText };

struct Segment {
  SegmentKind kind;
  std::string text;
  bool operator==(const Segment&) const = default;
};

class Prompt {
 public:
  // One control token, spelled exactly (must be a known special token).
  void control(std::string_view token);
  // Untrusted text: never split, whatever it contains.
  void text(std::string_view s);
  // Trusted template text: the spellings `｜DSML｜`, `<think>` and `</think>` inside it become control
  // tokens (the official encoder's prose and DSML markup are tokenized that way).
  void template_text(std::string_view s);
  void append(const Prompt& other);

  const std::vector<Segment>& segments() const { return segments_; }
  std::string str() const;  // the flat prompt string (what Python's encode_messages returns)
  bool empty() const { return segments_.empty(); }

  // Image sources in placeholder order (one `<｜deepseek_image｜>` control segment each).
  std::vector<Json> images;

 private:
  std::vector<Segment> segments_;
};

// Splits generated text into segments by the markers the model emits as single tokens
// (`</think>`, `<think>`, `｜DSML｜`); used when replaying a generated turn from its text.
Prompt segment_generated_text(std::string_view generated);

}  // namespace cedar::text
