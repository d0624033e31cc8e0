#include "server/wire_request.h"

#include <cmath>
#include <limits>

namespace cedar::server {
namespace {

using text::Json;

constexpr std::string_view kOverflowPrefix = "This model's maximum context length is ";

Status number_field(const Json& body, const char* key, double lo, double hi, double& out) {
  if (!body.contains(key) || body[key].is_null()) return Status::Ok();
  const Json& v = body[key];
  if (!v.is_number()) return make_error(std::string(key) + ": must be a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    return make_error(std::string(key) + ": " + v.dump() + " is out of range [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
  out = x;
  return Status::Ok();
}

Result<std::optional<int64_t>> int_field(const Json& body, const char* key) {
  if (!body.contains(key) || body[key].is_null()) return std::optional<int64_t>();
  const Json& v = body[key];
  if (v.is_number_integer()) return std::optional<int64_t>(v.get<int64_t>());
  // 16.0 is accepted as 16 (JSON has one number type); 16.5 is not.
  if (v.is_number_float() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) == v.get<double>() &&
      std::fabs(v.get<double>()) < 9e15)
    return std::optional<int64_t>(static_cast<int64_t>(v.get<double>()));
  return make_error(std::string(key) + ": must be an integer");
}

Result<bool> bool_field(const Json& body, const char* key, bool fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_boolean()) return make_error(std::string(key) + ": must be a boolean");
  return body[key].get<bool>();
}

Result<std::string> model_field(const Json& body) {
  if (!body.contains("model") || body["model"].is_null()) return std::string();
  if (!body["model"].is_string()) return make_error("model: must be a string");
  return body["model"].get<std::string>();
}

}  // namespace

Status parse_sampling(const Json& body, BackendSampling& s, std::optional<int64_t>& max_tokens,
                      StreamSettings& stream) {
  CEDAR_RETURN_IF_ERROR(number_field(body, "temperature", 0.0, 2.0, s.temperature));
  CEDAR_RETURN_IF_ERROR(number_field(body, "top_p", 0.0, 1.0, s.top_p));
  if (body.contains("top_p") && body["top_p"].is_number() && s.top_p <= 0.0)
    return make_error("top_p: must be > 0");
  CEDAR_RETURN_IF_ERROR(number_field(body, "min_p", 0.0, 1.0, s.min_p));
  CEDAR_RETURN_IF_ERROR(number_field(body, "presence_penalty", -2.0, 2.0, s.presence_penalty));
  CEDAR_RETURN_IF_ERROR(number_field(body, "frequency_penalty", -2.0, 2.0, s.frequency_penalty));
  CEDAR_RETURN_IF_ERROR(number_field(body, "repetition_penalty", 1e-6, 1e6, s.repetition_penalty));
  CEDAR_ASSIGN_OR_RETURN(auto top_k, int_field(body, "top_k"));
  if (top_k) s.top_k = *top_k;
  CEDAR_ASSIGN_OR_RETURN(auto seed, int_field(body, "seed"));
  if (seed) s.seed = static_cast<uint64_t>(*seed);
  CEDAR_ASSIGN_OR_RETURN(auto n, int_field(body, "n"));
  if (n && *n != 1) return make_error("n: only n=1 is supported, got " + std::to_string(*n));
  CEDAR_ASSIGN_OR_RETURN(auto mt, int_field(body, "max_tokens"));
  CEDAR_ASSIGN_OR_RETURN(auto mct, int_field(body, "max_completion_tokens"));
  max_tokens = mct ? mct : mt;
  if (max_tokens && *max_tokens < 1)
    return make_error(std::string(mct ? "max_completion_tokens" : "max_tokens") + ": must be >= 1, got " +
                      std::to_string(*max_tokens));
  CEDAR_ASSIGN_OR_RETURN(s.ignore_eos, bool_field(body, "ignore_eos", false));
  CEDAR_ASSIGN_OR_RETURN(stream.stream, bool_field(body, "stream", false));
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const Json& so = body["stream_options"];
    if (!so.is_object()) return make_error("stream_options: must be an object");
    CEDAR_ASSIGN_OR_RETURN(stream.include_usage, bool_field(so, "include_usage", false));
  }
  return Status::Ok();
}

Result<ChatJob> parse_chat_request(const Json& body, const text::RequestPolicy& policy) {
  if (!body.is_object()) return make_error("request body: must be a JSON object");
  ChatJob job;
  CEDAR_ASSIGN_OR_RETURN(job.model, model_field(body));
  CEDAR_ASSIGN_OR_RETURN(job.encoder, text::map_chat_request(body, policy));
  CEDAR_RETURN_IF_ERROR(parse_sampling(body, job.sampling, job.max_tokens, job.stream));
  CEDAR_ASSIGN_OR_RETURN(job.logprobs, bool_field(body, "logprobs", false));
  CEDAR_ASSIGN_OR_RETURN(auto top, int_field(body, "top_logprobs"));
  if (top) {
    if (*top < 0 || *top > 20) return make_error("top_logprobs: must be in [0, 20], got " + std::to_string(*top));
    if (!job.logprobs && *top > 0) return make_error("top_logprobs: needs logprobs: true");
    job.top_logprobs = static_cast<int>(*top);
  }
  job.sampling.logprobs = job.logprobs;
  job.sampling.top_logprobs = job.top_logprobs;

  const auto& e = job.encoder;
  job.parser.dialect = e.options.dialect;
  job.parser.stop = e.stop;
  job.parser.json_output = e.json_mode;
  job.parser.parse_tool_calls = e.tool_choice != text::ToolChoice::kNone;
  if (e.starts_in_tool_calls()) {
    job.parser.start = text::ParseStart::kToolCalls;
  } else if (e.prefix_continuation) {
    const auto& last = e.messages.back();
    const bool in_reasoning = e.options.thinking && (!last.content || last.content->empty());
    job.parser.start = in_reasoning ? text::ParseStart::kReasoningContinuation : text::ParseStart::kContentContinuation;
  } else {
    job.parser.start = e.options.thinking ? text::ParseStart::kReasoning : text::ParseStart::kContent;
  }
  return job;
}

Result<CompletionJob> parse_completion_request(const Json& body) {
  if (!body.is_object()) return make_error("request body: must be a JSON object");
  CompletionJob job;
  CEDAR_ASSIGN_OR_RETURN(job.model, model_field(body));
  if (!body.contains("prompt") || body["prompt"].is_null()) return make_error("prompt: is required");
  const Json& p = body["prompt"];
  if (p.is_string()) {
    job.prompt_text = p.get<std::string>();
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    job.prompt_text = p[0].get<std::string>();
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    for (size_t i = 0; i < p.size(); ++i) {
      if (!p[i].is_number_integer()) return make_error("prompt[" + std::to_string(i) + "]: must be a token id");
      job.prompt_ids.push_back(p[i].get<int64_t>());
    }
  } else {
    return make_error("prompt: must be a string, a one-string array, or a non-empty array of token ids");
  }
  CEDAR_RETURN_IF_ERROR(parse_sampling(body, job.sampling, job.max_tokens, job.stream));
  if (!job.max_tokens) job.max_tokens = 16;  // OpenAI's legacy default
  CEDAR_ASSIGN_OR_RETURN(job.echo, bool_field(body, "echo", false));
  CEDAR_ASSIGN_OR_RETURN(auto lp, int_field(body, "logprobs"));
  if (lp) {
    if (*lp < 0 || *lp > 20) return make_error("logprobs: must be in [0, 20], got " + std::to_string(*lp));
    job.logprobs = static_cast<int>(*lp);
    job.sampling.logprobs = true;
    job.sampling.top_logprobs = job.logprobs;
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const Json& st = body["stop"];
    if (st.is_string()) {
      job.sampling.stop.push_back(st.get<std::string>());
    } else if (st.is_array()) {
      if (st.size() > 16) return make_error("stop: at most 16 sequences");
      for (size_t i = 0; i < st.size(); ++i) {
        if (!st[i].is_string()) return make_error("stop[" + std::to_string(i) + "]: must be a string");
        job.sampling.stop.push_back(st[i].get<std::string>());
      }
    } else {
      return make_error("stop: must be a string or an array of strings");
    }
    for (const auto& s : job.sampling.stop)
      if (s.empty()) return make_error("stop: sequences must not be empty");
  }
  return job;
}

Result<int64_t> clamp_max_tokens(std::optional<int64_t> requested, int64_t prompt_tokens, int64_t context_length) {
  const int64_t room = context_length - prompt_tokens;
  if (room < 1) {
    return make_error(std::string(kOverflowPrefix) + std::to_string(context_length) + " tokens. However, your prompt has " +
                      std::to_string(prompt_tokens) + " tokens, which leaves no room for a completion. Please reduce the "
                      "length of the messages.");
  }
  if (!requested) return room;
  return std::min(*requested, room);
}

bool is_context_overflow(const std::string& message) { return message.rfind(kOverflowPrefix, 0) == 0; }

}  // namespace cedar::server
