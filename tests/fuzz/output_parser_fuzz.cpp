// libFuzzer target: the streaming output parser (text/output_parser.h) on arbitrary completion text, any
// options and any split of the text into pieces. Properties (the server streams what the engine decodes,
// piece by piece, and answers non-streaming requests from the same parser):
// * the result does not depend on the split: the pieces give what the whole text fed at once gives, and
//   that is parse_completion's result;
// * the events add up to the result (reasoning, content, each tool call's name and arguments);
// * feeding after finish() is an error, not a crash; the strict reference parser never crashes.
// Input: byte 0 options, byte 1 the split's seed, then up to two stop sequences and the text, separated
// by NUL bytes (the stop-sequence count is byte 0's top bits).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "text/output_parser.h"

namespace {

using cedar::text::ParseEvent;
using cedar::text::ParserOptions;
using cedar::text::StopCause;
using cedar::text::StreamParser;
using cedar::fuzz::check;

struct Run {
  cedar::text::ParsedCompletion result;
  bool done = false;
  std::vector<ParseEvent> events;
};

// Feeds `text` in the pieces `cuts` gives (piece lengths, cycled; empty: whole), then finish().
Run feed(std::string_view text, const ParserOptions& opt, StopCause cause, const std::vector<size_t>& cuts) {
  StreamParser p(opt);
  Run r;
  size_t at = 0, k = 0;
  while (at < text.size()) {
    const size_t n = cuts.empty() ? text.size() : std::min(cuts[k++ % cuts.size()], text.size() - at);
    check(p.feed(text.substr(at, n), r.events).ok(), "feed failed before finish");
    at += n;
  }
  check(p.finish(cause, r.events).ok(), "finish failed");
  check(p.finish(cause, r.events).ok(), "a second finish failed (finish is idempotent)");
  std::vector<ParseEvent> after;
  check(!p.feed("x", after).ok(), "feed after finish was accepted");
  r.result = p.result();
  r.done = p.done();
  return r;
}

bool same(const cedar::text::ParsedCompletion& a, const cedar::text::ParsedCompletion& b) {
  if (a.reasoning != b.reasoning || a.has_reasoning != b.has_reasoning || a.content != b.content ||
      a.finish != b.finish || a.tool_calls.size() != b.tool_calls.size())
    return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i)
    if (a.tool_calls[i].name != b.tool_calls[i].name || a.tool_calls[i].ns != b.tool_calls[i].ns ||
        a.tool_calls[i].arguments != b.tool_calls[i].arguments)
      return false;
  return true;
}

// The events' deltas rebuild the result.
void check_events(const Run& r) {
  std::string reasoning, content;
  std::vector<std::string> names, args;
  for (const ParseEvent& e : r.events) {
    switch (e.kind) {
      case ParseEvent::Kind::kReasoning: reasoning += e.text; break;
      case ParseEvent::Kind::kContent: content += e.text; break;
      case ParseEvent::Kind::kToolCallStart:
        check(e.tool_index == names.size(), "tool calls start out of order");
        names.push_back(e.text);
        args.emplace_back();
        break;
      case ParseEvent::Kind::kToolCallArguments:
        check(e.tool_index < args.size(), "arguments of a tool call that did not start");
        args[e.tool_index] += e.text;
        break;
    }
  }
  check(reasoning == r.result.reasoning, "reasoning deltas differ from the result");
  check(content == r.result.content, "content deltas differ from the result");
  check(names.size() == r.result.tool_calls.size(), "tool call starts differ from the result");
  for (size_t i = 0; i < names.size(); ++i) {
    check(names[i] == r.result.tool_calls[i].name, "a tool call's name differs from the result");
    check(args[i] == r.result.tool_calls[i].arguments, "a tool call's argument deltas differ from the result");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t o = data[0];
  ParserOptions opt;
  opt.start = cedar::fuzz::parse_start(o);
  opt.json_output = (o & 8) != 0;
  opt.parse_tool_calls = (o & 16) == 0;
  opt.dialect = (o & 32) ? cedar::text::Dialect::kV41_1017 : cedar::text::Dialect::kV41;
  const StopCause cause = (o & 64) ? StopCause::kLength : StopCause::kEos;
  const int stops = (o >> 7) + ((data[1] & 1) ? 1 : 0);  // 0..2
  // The split: piece lengths 1..16 from a small LCG seeded by byte 1.
  std::vector<size_t> cuts;
  uint32_t s = data[1] | 0x100u;
  for (int i = 0; i < 7; ++i) {
    s = s * 1103515245u + 12345u;
    cuts.push_back(1 + ((s >> 16) & 15));
  }
  std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  for (int i = 0; i < stops; ++i) {
    const size_t nul = rest.find('\0');
    if (nul == std::string_view::npos) break;
    if (nul > 0) opt.stop.emplace_back(rest.substr(0, nul));
    rest.remove_prefix(nul + 1);
  }
  const std::string_view text = rest;

  const Run whole = feed(text, opt, cause, {});
  check_events(whole);
  const Run pieces = feed(text, opt, cause, cuts);
  check_events(pieces);
  check(same(whole.result, pieces.result), "the result depends on how the text was split");
  check(whole.done == pieces.done, "done() depends on how the text was split");
  const Run bytes = feed(text, opt, cause, {1});
  check(same(whole.result, bytes.result), "the result differs when fed byte by byte");
  check(same(whole.result, cedar::text::parse_completion(text, opt, cause)), "parse_completion differs from feed");
  (void)cedar::text::parse_completion_reference(text, opt.dialect, (o & 2) != 0);
  return 0;
}
