#include "text/output_parser.h"

#include <cctype>

#include "text/py_json.h"
#include "text/special_tokens.h"

namespace cedar::text {

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kToolCalls: return "tool_calls";
  }
  return "stop";
}

Message ParsedCompletion::to_message() const {
  Message m;
  m.role = Role::kAssistant;
  m.content = content;
  if (has_reasoning) m.reasoning_content = reasoning;
  for (const auto& c : tool_calls) m.tool_calls.push_back({"", c.name, c.arguments, c.ns});
  return m;
}

namespace {

enum class Action {
  kEndReasoning, kEnterToolCalls, kDrop, kStop, kBeginInvoke, kEndBlock, kEndName, kBeginParam, kEndInvoke,
  kEndParamName, kStringValue, kRawValue, kEndValue,
  kOpenJsonFence, kOpenJsonRaw, kCloseJson,  // JSON output mode
};

std::string json_escaped(std::string_view s) {
  std::string q;
  py_json_append_string(q, s);
  return q.substr(1, q.size() - 2);
}

const std::string kDsmlOpen = "<" + std::string(tok::kDsml);
const std::string kDsmlClose = "</" + std::string(tok::kDsml);

}  // namespace

struct StreamParser::Marker {
  std::string text;
  Action action;
  bool strip_newlines;  // newlines right before the marker are dropped
};

StreamParser::StreamParser(ParserOptions options) : opt_(std::move(options)) {
  switch (opt_.start) {
    case ParseStart::kContent: stage_ = Stage::kContent; leading_ = true; break;
    case ParseStart::kReasoning: stage_ = Stage::kReasoning; leading_ = true; break;
    case ParseStart::kReasoningContinuation: stage_ = Stage::kReasoning; break;
    case ParseStart::kContentContinuation: stage_ = Stage::kContent; break;
    case ParseStart::kToolCalls: stage_ = Stage::kToolCalls; break;
  }
  if (stage_ == Stage::kReasoning) result_.has_reasoning = true;
  if (!opt_.parse_tool_calls && stage_ == Stage::kToolCalls) stage_ = Stage::kContent;
}

std::vector<StreamParser::Marker> StreamParser::markers() const {
  std::vector<Marker> m;
  switch (stage_) {
    case Stage::kReasoning:
      m.push_back({std::string(tok::kThinkEnd), Action::kEndReasoning, true});
      if (opt_.parse_tool_calls) m.push_back({kDsmlOpen, Action::kEnterToolCalls, true});
      break;
    case Stage::kContent:
      if (opt_.json_output) {  // stop sequences do not apply to the text around the JSON
        for (const char* open : {"```json\n", "```\n"}) m.push_back({open, Action::kOpenJsonFence, false});
        for (const char* open : {"{", "["}) m.push_back({open, Action::kOpenJsonRaw, false});
      } else {
        for (const auto& s : opt_.stop) m.push_back({s, Action::kStop, false});
      }
      if (opt_.parse_tool_calls) m.push_back({kDsmlOpen, Action::kEnterToolCalls, true});
      m.push_back({std::string(tok::kThinkEnd), Action::kDrop, false});
      break;
    case Stage::kJson:
      for (const auto& s : opt_.stop) m.push_back({s, Action::kStop, false});
      m.push_back({"\n```", Action::kCloseJson, false});
      break;
    case Stage::kAfterJson:
      if (opt_.parse_tool_calls) m.push_back({kDsmlOpen, Action::kEnterToolCalls, true});
      break;
    case Stage::kToolCalls:
      m.push_back({"invoke name=\"", Action::kBeginInvoke, false});
      m.push_back({kDsmlClose + "tool_calls>", Action::kEndBlock, false});
      m.push_back({kDsmlClose + " calls>", Action::kEndBlock, false});
      break;
    case Stage::kToolName: m.push_back({"\"", Action::kEndName, false}); break;
    case Stage::kArgs:
      m.push_back({"parameter name=\"", Action::kBeginParam, false});
      m.push_back({kDsmlClose, Action::kEndInvoke, false});
      break;
    case Stage::kParamName: m.push_back({"\"", Action::kEndParamName, false}); break;
    case Stage::kParamType:
      m.push_back({"true\">", Action::kStringValue, false});
      m.push_back({"false\">", Action::kRawValue, false});
      break;
    case Stage::kParamValue: m.push_back({kDsmlClose, Action::kEndValue, false}); break;
    case Stage::kFinished: break;
  }
  return m;
}

void StreamParser::emit_data(std::string_view data, std::vector<ParseEvent>& events) {
  if (data.empty()) return;
  auto args = [&](std::string s) {
    result_.tool_calls.back().arguments += s;
    events.push_back({ParseEvent::Kind::kToolCallArguments, result_.tool_calls.size() - 1, std::move(s), ""});
  };
  auto content = [&](std::string_view s) {
    result_.content.append(s);
    events.push_back({ParseEvent::Kind::kContent, 0, std::string(s), ""});
  };
  switch (stage_) {
    case Stage::kReasoning:
      result_.reasoning.append(data);
      events.push_back({ParseEvent::Kind::kReasoning, 0, std::string(data), ""});
      break;
    case Stage::kContent:
    case Stage::kAfterJson:
      if (!opt_.json_output) { content(data); break; }
      // One space per run of text around the JSON, however the run arrives (split invariance;
      // deepseek-recipe writes one per chunk, which equals this when it gets the text in one piece).
      if (!in_space_run_) content(" ");
      in_space_run_ = true;
      break;
    case Stage::kJson: content(data); break;
    case Stage::kToolName: name_.append(data); break;
    case Stage::kParamName: args(json_escaped(data)); break;
    case Stage::kParamValue: args(string_value_ ? json_escaped(data) : std::string(data)); break;
    default: break;  // markup between markers is skipped
  }
}

void StreamParser::apply(const Marker& m, std::vector<ParseEvent>& events) {
  auto args = [&](std::string s) {
    result_.tool_calls.back().arguments += s;
    events.push_back({ParseEvent::Kind::kToolCallArguments, result_.tool_calls.size() - 1, std::move(s), ""});
  };
  in_space_run_ = false;
  switch (m.action) {
    case Action::kEndReasoning: stage_ = Stage::kContent; leading_ = true; break;
    case Action::kOpenJsonFence: stage_ = Stage::kJson; break;
    case Action::kOpenJsonRaw:  // the bracket is part of the JSON
      stage_ = Stage::kJson;
      emit_data(m.text, events);
      break;
    case Action::kCloseJson: stage_ = Stage::kAfterJson; break;
    case Action::kEnterToolCalls: stage_ = Stage::kToolCalls; break;
    case Action::kDrop: break;
    case Action::kStop: stage_ = Stage::kFinished; stopped_by_sequence_ = true; break;
    case Action::kBeginInvoke: stage_ = Stage::kToolName; name_.clear(); break;
    case Action::kEndBlock: stage_ = Stage::kFinished; break;
    case Action::kEndName: {
      ParsedToolCall call;
      call.name = name_;
      if (dialect_spec(opt_.dialect).namespaces) {
        if (const size_t p = name_.find("::"); p != std::string::npos) {
          call.ns = name_.substr(0, p);
          call.name = name_.substr(p + 2);
        }
      }
      result_.tool_calls.push_back(call);
      events.push_back({ParseEvent::Kind::kToolCallStart, result_.tool_calls.size() - 1, call.name, call.ns});
      stage_ = Stage::kArgs;
      params_in_call_ = 0;
      break;
    }
    case Action::kBeginParam:
      args(params_in_call_++ == 0 ? "{\"" : ", \"");
      stage_ = Stage::kParamName;
      break;
    case Action::kEndInvoke:
      args(params_in_call_ == 0 ? "{}" : "}");
      stage_ = Stage::kToolCalls;
      break;
    case Action::kEndParamName: args("\": "); stage_ = Stage::kParamType; break;
    case Action::kStringValue: args("\""); string_value_ = true; stage_ = Stage::kParamValue; break;
    case Action::kRawValue: string_value_ = false; stage_ = Stage::kParamValue; break;
    case Action::kEndValue:
      if (string_value_) args("\"");
      stage_ = Stage::kArgs;
      break;
  }
}

// One step over buf_: apply the marker whose match ends first, or emit the text that can no longer be
// part of a marker and keep the rest. The first match to end is the one a reader of the text piece by
// piece sees first, however the pieces fall, so applying it at once is split-invariant (no text still
// to come can end a match earlier). Ties: the match that starts first, then the marker listed first
// (stop sequences before the markup's markers). This is deepseek-recipe's rule: a stop sequence longer
// than the `<｜DSML｜` it starts with loses to it, one that ends with it (or within it) wins.
bool StreamParser::step(std::vector<ParseEvent>& events) {
  if (stage_ == Stage::kFinished) { buf_.clear(); return false; }
  if (leading_ && (stage_ == Stage::kReasoning || stage_ == Stage::kContent)) {
    const size_t n = buf_.find_first_not_of('\n');
    if (n == std::string::npos) { buf_.clear(); return false; }
    buf_.erase(0, n);
    leading_ = false;
  }
  const auto ms = markers();
  size_t best = std::string::npos, best_end = std::string::npos;
  const Marker* hit = nullptr;
  for (const auto& m : ms) {
    if (m.text.empty()) continue;
    const size_t p = buf_.find(m.text);  // the first occurrence also ends first
    if (p == std::string::npos) continue;
    const size_t end = p + m.text.size();
    if (end < best_end || (end == best_end && p < best)) { best = p; best_end = end; hit = &m; }
  }
  if (hit) {
    size_t text_end = best;
    if (hit->strip_newlines) while (text_end > 0 && buf_[text_end - 1] == '\n') --text_end;
    const Marker m = *hit;
    emit_data(std::string_view(buf_).substr(0, text_end), events);
    buf_.erase(0, best_end);
    apply(m, events);
    return true;
  }
  // Earliest position from which the rest of buf_ could still grow into a marker: its first partial
  // match, or the end of buf_ (the marker may begin with the next piece). A marker that drops the newlines
  // before it holds those too, before either position — whatever another marker holds.
  size_t hold = buf_.size();
  for (const auto& m : ms) {
    size_t start = buf_.size();
    const size_t from = buf_.size() > m.text.size() ? buf_.size() - m.text.size() + 1 : 0;
    for (size_t k = from; k < buf_.size(); ++k) {
      if (m.text.compare(0, buf_.size() - k, buf_, k, buf_.size() - k) == 0) { start = k; break; }
    }
    if (m.strip_newlines)
      while (start > 0 && buf_[start - 1] == '\n') --start;
    hold = std::min(hold, start);
  }
  emit_data(std::string_view(buf_).substr(0, hold), events);
  buf_.erase(0, hold);
  return false;
}

Status StreamParser::feed(std::string_view text, std::vector<ParseEvent>& events) {
  if (finished_) return make_error("output parser: feed() after finish()");
  buf_.append(text);
  while (step(events)) {}
  return Status::Ok();
}

bool StreamParser::in_tool_block() const {
  switch (stage_) {
    case Stage::kToolCalls: case Stage::kToolName: case Stage::kArgs: case Stage::kParamName:
    case Stage::kParamType: case Stage::kParamValue: return true;
    default: return false;
  }
}

Status StreamParser::finish(StopCause cause, std::vector<ParseEvent>& events) {
  if (finished_) return Status::Ok();
  while (step(events)) {}
  // Held text is not a marker after all: flush it verbatim into the current field — except inside a
  // tool block, where the held text is the start of DSML markup (`</｜DSML｜ para`) cut by the token
  // limit, and a client must never receive markup as argument text.
  const bool inside_block = in_tool_block();
  if (inside_block) buf_.clear();
  if (stage_ == Stage::kToolName && !buf_.empty()) name_ += buf_;
  else if (!(leading_ && buf_.find_first_not_of('\n') == std::string::npos)) emit_data(buf_, events);
  buf_.clear();
  // deepseek-recipe: a stop sequence wins, then the token limit (even after a complete tool block:
  // the model never said it was done), then tool_calls when any call was parsed.
  if (stopped_by_sequence_) result_.finish = FinishReason::kStop;
  else if (cause == StopCause::kLength) result_.finish = FinishReason::kLength;
  else if (!result_.tool_calls.empty()) result_.finish = FinishReason::kToolCalls;
  else result_.finish = FinishReason::kStop;
  finished_ = true;
  return Status::Ok();
}

ParsedCompletion parse_completion(std::string_view text, const ParserOptions& options, StopCause cause) {
  StreamParser p(options);
  std::vector<ParseEvent> ev;
  (void)p.feed(text, ev);
  (void)p.finish(cause, ev);
  return p.result();
}

// ---- the official strict parser -----------------------------------------------------------------

namespace {

struct Cursor {
  std::string_view text;
  size_t index = 0;
  // Reads up to the earliest of `stops`; returns the text before it and which stop matched (or -1).
  std::string_view read_until(std::initializer_list<std::string_view> stops, int& which) {
    size_t best = text.size();
    which = -1;
    int i = 0;
    for (auto s : stops) {
      const size_t p = text.find(s, index);
      if (p != std::string_view::npos && p < best) { best = p; which = i; }
      ++i;
    }
    std::string_view out = text.substr(index, best - index);
    index = which >= 0 ? best + std::data(stops)[which].size() : text.size();
    return out;
  }
};

}  // namespace

Result<ParsedCompletion> parse_completion_reference(std::string_view text, Dialect dialect, bool thinking) {
  const auto& spec = dialect_spec(dialect);
  const std::string dsml(tok::kDsml);
  const std::string calls_start = "\n\n<" + dsml + std::string(spec.calls_tag);
  const std::string calls_end = "</" + dsml + std::string(spec.calls_tag) + ">";
  const std::string invoke_start = "<" + dsml + std::string(spec.invoke_tag);
  const std::string invoke_end = "</" + dsml + std::string(spec.invoke_tag);
  const std::string param_start = "<" + dsml + std::string(spec.parameter_tag);
  const std::string param_end = "/" + dsml + std::string(spec.parameter_tag);
  ParsedCompletion out;
  Cursor c{text};
  int which = -1;
  if (thinking) {
    out.reasoning = std::string(c.read_until({tok::kThinkEnd, calls_start}, which));
    out.has_reasoning = true;
    if (which != 0) return make_error("invalid thinking format: missing </think>");
  }
  out.content = std::string(c.read_until({tok::kEos, calls_start}, which));
  if (which == 1) {
    while (c.index < text.size()) {
      std::string_view between = c.read_until({invoke_start, calls_end}, which);
      if (between != ">\n") return make_error("tool call format error: expected '>\\n' but got '" + std::string(between) + "'");
      if (which == 1) break;
      if (which < 0) return make_error("missing special token in tool calls");
      std::string_view head = c.read_until({param_start, invoke_end}, which);
      // ^\s*name="(.*?)">\n$
      size_t k = 0;
      while (k < head.size() && std::isspace(static_cast<unsigned char>(head[k]))) ++k;
      head.remove_prefix(k);
      if (head.rfind("name=\"", 0) != 0 || head.size() < 9 || head.substr(head.size() - 3) != "\">\n" ||
          head.substr(6, head.size() - 9).find("\">\n") != std::string_view::npos) {
        return make_error("tool name format error: '" + std::string(head) + "'");
      }
      ParsedToolCall call;
      call.name = std::string(head.substr(6, head.size() - 9));
      std::vector<std::string> keys;
      std::string args = "{";
      while (which == 0) {
        std::string_view pc = c.read_until({param_end}, which);
        // ^ name="(.*?)" string="(true|false)">(.*?)<$  (first `" string="` ends the name)
        const size_t q = pc.find("\" string=\"");
        if (pc.rfind(" name=\"", 0) != 0 || q == std::string_view::npos || pc.empty() || pc.back() != '<') {
          return make_error("parameter format error: '" + std::string(pc) + "'");
        }
        const std::string key(pc.substr(7, q - 7));
        std::string_view rest = pc.substr(q + 10);
        bool is_string;
        if (rest.rfind("true\">", 0) == 0) { is_string = true; rest.remove_prefix(6); }
        else if (rest.rfind("false\">", 0) == 0) { is_string = false; rest.remove_prefix(7); }
        else return make_error("parameter format error: '" + std::string(pc) + "'");
        rest.remove_suffix(1);
        for (const auto& seen : keys) if (seen == key) return make_error("duplicate parameter name: '" + key + "'");
        keys.push_back(key);
        if (keys.size() > 1) args += ", ";
        py_json_append_string(args, key);
        args += ": ";
        if (is_string) py_json_append_string(args, rest); else args.append(rest);
        std::string_view after = c.read_until({param_start, invoke_end}, which);
        if (after != ">\n") return make_error("parameter format error: expected '>\\n' but got '" + std::string(after) + "'");
      }
      call.arguments = args + "}";
      if (spec.namespaces) {
        if (const size_t p = call.name.find("::"); p != std::string::npos) {
          call.ns = call.name.substr(0, p);
          call.name = call.name.substr(p + 2);
        }
      }
      out.tool_calls.push_back(std::move(call));
    }
    std::string_view tail = c.read_until({tok::kEos}, which);
    if (!tail.empty()) return make_error("unexpected content after tool calls: '" + std::string(tail) + "'");
  } else if (which != 0) {
    return make_error("invalid format: missing EOS token");
  }
  if (c.index != text.size()) return make_error("unexpected content at end");
  for (auto sp : {tok::kBos, tok::kEos, tok::kThinkStart, tok::kThinkEnd, tok::kDsml}) {
    if (out.content.find(sp) != std::string::npos || out.reasoning.find(sp) != std::string::npos) {
      return make_error("unexpected special token '" + std::string(sp) + "' in content");
    }
  }
  out.finish = out.tool_calls.empty() ? FinishReason::kStop : FinishReason::kToolCalls;
  return out;
}

}  // namespace cedar::text
