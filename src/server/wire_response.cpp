#include "server/wire_response.h"

namespace cedar::server {

using text::Json;

Json Usage::to_json() const {
  Json u = Json::object();
  u["prompt_tokens"] = prompt_tokens;
  u["completion_tokens"] = completion_tokens;
  u["total_tokens"] = prompt_tokens + completion_tokens;
  u["prompt_tokens_details"] = Json{{"cached_tokens", cached_tokens}};
  u["prompt_cache_hit_tokens"] = cached_tokens;
  u["prompt_cache_miss_tokens"] = prompt_tokens - cached_tokens;
  u["completion_tokens_details"] = Json{{"reasoning_tokens", reasoning_tokens}};
  return u;
}

std::string mint_id(std::string_view prefix, size_t hex_digits, std::mt19937_64& rng) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  uint64_t bits = 0;
  for (size_t i = 0; i < hex_digits; ++i) {
    if (i % 16 == 0) bits = rng();
    id.push_back(kHex[bits & 15]);
    bits >>= 4;
  }
  return id;
}

Json error_body(const std::string& message, const std::string& type, const std::string& code) {
  Json e = Json::object();
  e["message"] = message;
  e["type"] = type;
  e["param"] = nullptr;
  e["code"] = code.empty() ? Json(nullptr) : Json(code);
  return Json{{"error", e}};
}

std::string sse_data(const Json& j) {
  return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

namespace {

Json token_json(const text::Tokenizer& tok, int64_t id) {
  Json e = Json::object();
  const text::TokenId tid = static_cast<text::TokenId>(id);
  auto s = tok.decode(std::span<const text::TokenId>(&tid, 1));
  e["token"] = s.ok() ? *s : std::string();
  Json bytes = Json::array();
  if (auto b = tok.token_bytes(tid))
    for (unsigned char c : *b) bytes.push_back(static_cast<int>(c));
  e["bytes"] = bytes;
  return e;
}

// The one choice of a response or chunk: index 0, `key` ("delta", "message" or "text"), logprobs,
// finish_reason.
Json single_choice(const char* key, Json value, Json logprobs, Json finish) {
  Json choice = Json::object();
  choice["index"] = 0;
  choice[key] = std::move(value);
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = std::move(finish);
  return choice;
}

// What every response object and chunk opens with, then `choices` (empty: the usage chunk).
Json envelope(const ResponseMeta& meta, const char* object, Json choices) {
  Json out = Json::object();
  out["id"] = meta.id;
  out["object"] = object;
  out["created"] = meta.created;
  out["model"] = meta.model;
  out["choices"] = std::move(choices);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------- chat

ChatAssembler::ChatAssembler(ResponseMeta meta, text::ParserOptions parser, bool logprobs,
                             const text::Tokenizer& tokenizer, uint64_t id_seed)
    : meta_(std::move(meta)),
      parser_(parser),
      logprobs_(logprobs),
      tokenizer_(&tokenizer),
      rng_(id_seed),
      thinking_start_(parser.start == text::ParseStart::kReasoning ||
                      parser.start == text::ParseStart::kReasoningContinuation),
      in_reasoning_(thinking_start_) {
  usage_.prompt_tokens = meta_.prompt_tokens;
}

Json ChatAssembler::chunk(Json delta, const Json& logprobs, const Json& finish) const {
  return envelope(meta_, "chat.completion.chunk",
                  Json::array({single_choice("delta", std::move(delta), logprobs, finish)}));
}

Json ChatAssembler::first_chunk() const {
  Json delta = Json::object();
  delta["role"] = "assistant";
  delta["content"] = "";
  if (thinking_start_) delta["reasoning_content"] = "";
  return chunk(delta, nullptr, nullptr);
}

Json ChatAssembler::logprob_entry(const BackendToken& token) const {
  Json e = token_json(*tokenizer_, token.id);
  e["logprob"] = token.logprob;
  Json top = Json::array();
  for (const auto& t : token.top) {
    Json te = token_json(*tokenizer_, t.token);
    te["logprob"] = t.logprob;
    top.push_back(std::move(te));
  }
  Json ordered = Json::object();
  ordered["token"] = e["token"];
  ordered["logprob"] = e["logprob"];
  ordered["bytes"] = e["bytes"];
  ordered["top_logprobs"] = std::move(top);
  return ordered;
}

std::string_view ChatAssembler::finish_reason() const { return text::finish_reason_name(parser_.result().finish); }

Status ChatAssembler::finish(text::StopCause cause, std::vector<text::ParseEvent>& events) {
  CEDAR_RETURN_IF_ERROR(parser_.finish(cause, events));
  finished_ = true;
  return Status::Ok();
}

Status ChatAssembler::on_event(const BackendEvent& ev, std::vector<Json>& chunks) {
  if (finished_) return Status::Ok();  // events after a stop sequence ended the output
  std::vector<text::ParseEvent> events;
  Json lp = nullptr;
  if (ev.token) {
    ++usage_.completion_tokens;
    if (in_reasoning_) ++usage_.reasoning_tokens;
    if (logprobs_) {
      Json entry = logprob_entry(*ev.token);
      logprob_content_.push_back(entry);
      lp = Json{{"content", Json::array({entry})}};
    }
  }
  if (!ev.text.empty()) CEDAR_RETURN_IF_ERROR(parser_.feed(ev.text, events));
  if (ev.text.find("</think>") != std::string::npos) in_reasoning_ = false;
  if (ev.finish == BackendFinish::kError) return make_error("generation failed: " + ev.error);
  usage_.cached_tokens = std::max(usage_.cached_tokens, std::min(ev.cached_prompt_tokens, usage_.prompt_tokens));
  if (ev.finish != BackendFinish::kNone || parser_.done()) {
    const auto cause = ev.finish == BackendFinish::kLength ? text::StopCause::kLength : text::StopCause::kEos;
    CEDAR_RETURN_IF_ERROR(finish(cause, events));
  }
  Json delta = Json::object();
  std::string reasoning, content;
  bool has_reasoning = false, has_content = false;
  Json calls = Json::array();
  for (const auto& e : events) {
    switch (e.kind) {
      case text::ParseEvent::Kind::kReasoning:
        reasoning += e.text;
        has_reasoning = true;
        break;
      case text::ParseEvent::Kind::kContent:
        content += e.text;
        has_content = true;
        in_reasoning_ = false;
        break;
      case text::ParseEvent::Kind::kToolCallStart: {
        in_reasoning_ = false;
        while (call_ids_.size() <= e.tool_index) call_ids_.push_back(mint_id("call_", 24, rng_));
        Json fn = Json::object();
        fn["name"] = e.text;
        fn["arguments"] = "";
        Json call = Json::object();
        call["index"] = e.tool_index;
        call["id"] = call_ids_[e.tool_index];
        call["type"] = "function";
        call["function"] = fn;
        calls.push_back(std::move(call));
        break;
      }
      case text::ParseEvent::Kind::kToolCallArguments: {
        in_reasoning_ = false;
        // Fragments of one call in one event are joined.
        if (!calls.empty() && calls.back()["index"] == e.tool_index) {
          calls.back()["function"]["arguments"] = calls.back()["function"]["arguments"].get<std::string>() + e.text;
        } else {
          Json call = Json::object();
          call["index"] = e.tool_index;
          call["function"] = Json{{"arguments", e.text}};
          calls.push_back(std::move(call));
        }
        break;
      }
    }
  }
  if (has_reasoning) delta["reasoning_content"] = reasoning;
  if (has_content) delta["content"] = content;
  if (!calls.empty()) delta["tool_calls"] = std::move(calls);
  if (!delta.empty() || !lp.is_null()) chunks.push_back(chunk(std::move(delta), lp, nullptr));
  if (finished_) chunks.push_back(chunk(Json::object(), nullptr, std::string(finish_reason())));
  return Status::Ok();
}

Json ChatAssembler::response() const {
  const auto& r = parser_.result();
  Json msg = Json::object();
  msg["role"] = "assistant";
  if (r.content.empty() && !r.tool_calls.empty()) msg["content"] = nullptr;
  else msg["content"] = r.content;
  if (r.has_reasoning || thinking_start_) msg["reasoning_content"] = r.reasoning;
  if (!r.tool_calls.empty()) {
    Json calls = Json::array();
    for (size_t i = 0; i < r.tool_calls.size(); ++i) {
      Json fn = Json::object();
      fn["name"] = r.tool_calls[i].name;
      fn["arguments"] = r.tool_calls[i].arguments;
      Json call = Json::object();
      call["id"] = i < call_ids_.size() ? call_ids_[i] : std::string("call_missing");
      call["type"] = "function";
      call["function"] = fn;
      calls.push_back(std::move(call));
    }
    msg["tool_calls"] = std::move(calls);
  }
  Json logprobs = logprobs_ ? Json{{"content", logprob_content_}} : Json(nullptr);
  Json out = envelope(
      meta_, "chat.completion",
      Json::array({single_choice("message", std::move(msg), std::move(logprobs), std::string(finish_reason()))}));
  out["usage"] = usage_.to_json();
  return out;
}

Json ChatAssembler::usage_chunk() const {
  Json c = envelope(meta_, "chat.completion.chunk", Json::array());
  c["usage"] = usage_.to_json();
  return c;
}

// ----------------------------------------------------------------------------------------- completions

CompletionAssembler::CompletionAssembler(ResponseMeta meta, int logprobs, const text::Tokenizer& tokenizer,
                                         std::string echo_prefix)
    : meta_(std::move(meta)), logprobs_(logprobs), tokenizer_(&tokenizer), text_(std::move(echo_prefix)) {
  usage_.prompt_tokens = meta_.prompt_tokens;
}

Json CompletionAssembler::chunk(const std::string& text, const Json& logprobs, const Json& finish) const {
  return envelope(meta_, "text_completion", Json::array({single_choice("text", text, logprobs, finish)}));
}

Status CompletionAssembler::on_event(const BackendEvent& ev, std::vector<Json>& chunks) {
  if (finished_) return Status::Ok();
  if (ev.finish == BackendFinish::kError) return make_error("generation failed: " + ev.error);
  Json lp = nullptr;
  if (ev.token) {
    ++usage_.completion_tokens;
    if (logprobs_ >= 0) {
      Json t = token_json(*tokenizer_, ev.token->id);
      Json top = Json::object();
      for (const auto& alt : ev.token->top) top[token_json(*tokenizer_, alt.token)["token"].get<std::string>()] = alt.logprob;
      lp_tokens_.push_back(t["token"]);
      lp_values_.push_back(ev.token->logprob);
      lp_top_.push_back(top);
      lp_offsets_.push_back(text_.size());
      lp = Json{{"tokens", Json::array({t["token"]})}, {"token_logprobs", Json::array({ev.token->logprob})},
                {"top_logprobs", Json::array({top})}, {"text_offset", Json::array({text_.size()})}};
    }
  }
  text_ += ev.text;
  usage_.cached_tokens = std::max(usage_.cached_tokens, std::min(ev.cached_prompt_tokens, usage_.prompt_tokens));
  Json finish = nullptr;
  if (ev.finish != BackendFinish::kNone) {
    finished_ = true;
    finish_reason_ = ev.finish == BackendFinish::kLength ? "length" : "stop";
    finish = finish_reason_;
  }
  if (!ev.text.empty() || !lp.is_null() || finished_) chunks.push_back(chunk(ev.text, lp, finish));
  return Status::Ok();
}

Json CompletionAssembler::response() const {
  Json logprobs = logprobs_ >= 0 ? Json{{"tokens", lp_tokens_}, {"token_logprobs", lp_values_},
                                         {"top_logprobs", lp_top_}, {"text_offset", lp_offsets_}}
                                 : Json(nullptr);
  Json out = envelope(meta_, "text_completion",
                      Json::array({single_choice("text", text_, std::move(logprobs), finish_reason_)}));
  out["usage"] = usage_.to_json();
  return out;
}

Json CompletionAssembler::usage_chunk() const {
  Json c = envelope(meta_, "text_completion", Json::array());
  c["usage"] = usage_.to_json();
  return c;
}

}  // namespace cedar::server
