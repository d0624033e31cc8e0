#include "server/http_server.h"

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <sys/socket.h>

#include "server/anthropic.h"
#include "server/wire_request.h"
#include "server/wire_response.h"
#include "text/prompt_tokens.h"

namespace cedar::server {

using text::Json;
using Clock = std::chrono::steady_clock;

std::vector<std::string> default_served_model_names() {
  return {"deepseek-v4.1-flash", "deepseek-v4-flash", "deepseek-flash", "deepseek-chat", "deepseek-reasoner"};
}

namespace {

// Backend events of one request, filled by the backend thread, drained by the HTTP thread.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<BackendEvent> events;
  void push(const BackendEvent& e) {
    {
      std::lock_guard lock(mu);
      events.push_back(e);
    }
    cv.notify_all();
  }
  // Waits up to `timeout` for events and takes them all.
  std::deque<BackendEvent> take(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, timeout, [&] { return !events.empty(); });
    std::deque<BackendEvent> out;
    out.swap(events);
    return out;
  }
};

void send_json(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& code = "") {
  const std::string type = status == 401   ? "authentication_error"
                           : status == 404 ? "not_found_error"
                           : status == 429 ? "rate_limit_error"
                           : status >= 500 ? "server_error"
                                           : "invalid_request_error";
  send_json(res, status, error_body(message, type, code));
}

// A handler's error reply: the error body, counted in the metrics under the handler's endpoint.
struct FailReply {
  Metrics& metrics;
  const std::string& endpoint;
  httplib::Response& res;
  void operator()(int status, const std::string& message, const std::string& code = "") const {
    metrics.count_request(endpoint, status);
    send_error(res, status, message, code);
  }
  void operator()(const std::string& message) const { (*this)(400, message); }
};

bool constant_time_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// cpp-httplib listens with a backlog of 5 (compiled into the Debian library): bursts of new
// connections then lose SYNs and wait a 1 s retransmit. Re-listening on the bound socket raises it.
class HttpServer : public httplib::Server {
 public:
  void raise_backlog(int backlog) { ::listen(svr_sock_, backlog); }
};

}  // namespace

struct Server::Impl {
  GenerationBackend& backend;
  ServerOptions opt;
  HttpServer http;
  Metrics metrics;
  std::atomic<int64_t> inflight{0};
  std::atomic<bool> draining{false};
  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};
  std::once_flag stop_once;

  Impl(GenerationBackend& b, ServerOptions o) : backend(b), opt(std::move(o)) {
    if (opt.served_model_names.empty()) opt.served_model_names = default_served_model_names();
  }

  std::string new_id(std::string_view prefix) {
    std::lock_guard lock(rng_mu);
    return mint_id(prefix, 24, rng);
  }
  uint64_t new_seed() {
    std::lock_guard lock(rng_mu);
    return rng();
  }

  // The served name a request asked for ("" = the first); error when it serves no such model.
  Result<std::string> resolve_model(const std::string& asked) const {
    if (asked.empty()) return opt.served_model_names.front();
    for (const auto& n : opt.served_model_names)
      if (n == asked) return asked;
    std::string names;
    for (const auto& n : opt.served_model_names) names += (names.empty() ? "" : ", ") + n;
    return make_error("model '" + asked + "' does not exist (served: " + names + ")");
  }

  // Admission: one slot of max_inflight, released by the returned guard.
  struct Slot {
    Impl* impl = nullptr;
    explicit Slot(Impl* i) : impl(i) {}
    Slot(const Slot&) = delete;
    ~Slot() {
      if (impl) impl->metrics.set_inflight(--impl->inflight);
    }
  };
  std::shared_ptr<Slot> admit() {
    int64_t n = inflight.load();
    while (n < opt.max_inflight) {
      if (inflight.compare_exchange_weak(n, n + 1)) {
        metrics.set_inflight(n + 1);
        return std::make_shared<Slot>(this);
      }
    }
    return nullptr;
  }

  Result<Json> parse_body(const httplib::Request& req) {
    return text::parse_json(req.body, "request body");
  }

  std::string cache_key(const httplib::Request& req, const Json& body) const {
    for (const char* h : {"x-deepseek-harness-session-id", "x-session-id"})
      if (req.has_header(h)) return req.get_header_value(h);
    if (body.contains("user") && body["user"].is_string()) return body["user"].get<std::string>();
    return {};
  }

  void setup_routes();
  void handle_chat(const httplib::Request& req, httplib::Response& res);
  void handle_completions(const httplib::Request& req, httplib::Response& res);
  void handle_messages(const httplib::Request& req, httplib::Response& res);
  // Encodes a mapped chat request into prompt ids with the clamped completion budget.
  Result<BackendRequest> build_chat_backend_request(const ChatJob& job, const httplib::Request& req, const Json& body);
  // The shared middle of the chat-shaped endpoints: an OpenAI chat request (`chat_body`; `body`, what the
  // client sent, gives the cache key) → job, served model and backend request. On error: replied, nullopt.
  struct ChatCall {
    ChatJob job;
    std::string model;
    BackendRequest request;
  };
  std::optional<ChatCall> prepare_chat(const httplib::Request& req, const Json& body, const Json& chat_body,
                                       const FailReply& fail);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res);
  void handle_models(httplib::Response& res);

  template <typename Assembler>
  void run_generation(const std::string& endpoint, BackendRequest request, Assembler assembler, StreamSettings stream,
                      httplib::Response& res);
};

// Submits `request` and answers with the assembled response (non-stream) or an SSE stream.
template <typename Assembler>
void Server::Impl::run_generation(const std::string& endpoint, BackendRequest request, Assembler assembler,
                                  StreamSettings stream, httplib::Response& res) {
  if (draining) return send_error(res, 503, "server is shutting down");
  auto slot = admit();
  if (!slot) {
    res.set_header("Retry-After", "1");
    return send_error(res, 429, "too many concurrent requests (limit " + std::to_string(opt.max_inflight) + ")",
                      "rate_limit_exceeded");
  }
  struct Session {
    Channel channel;
    Assembler assembler;
    BackendRequestId id = 0;
    bool stream_started = false;
    bool done = false;
    Clock::time_point start = Clock::now();
    double ttft_s = -1;
    std::shared_ptr<Slot> slot;
    explicit Session(Assembler a) : assembler(std::move(a)) {}
  };
  auto s = std::make_shared<Session>(std::move(assembler));
  s->slot = slot;
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
  // The callback holds the session alive: the backend may report after the HTTP side is gone.
  auto submitted = backend.submit(std::move(request), [s](const BackendEvent& e) { s->channel.push(e); });
  if (!submitted.ok()) return send_error(res, 400, submitted.error().message);
  s->id = *submitted;

  // Feeds queued events to the assembler; appends wire output. Returns false on a generation error.
  auto pump = [this, s, prompt_tokens](std::deque<BackendEvent>& events, std::vector<Json>& chunks,
                                       std::string& error) {
    for (const auto& e : events) {
      if (e.token && s->ttft_s < 0) s->ttft_s = std::chrono::duration<double>(Clock::now() - s->start).count();
      auto st = s->assembler.on_event(e, chunks);
      if (!st.ok()) {
        error = st.error().message;
        backend.cancel(s->id);
        s->done = true;
        return;
      }
      if (s->assembler.finished()) {
        if (e.finish == BackendFinish::kNone) backend.cancel(s->id);  // stop sequence / tool block ended it
        s->done = true;
        RequestRecord rec;
        rec.prompt_tokens = prompt_tokens;
        rec.completion_tokens = s->assembler.usage().completion_tokens;
        rec.cached_tokens = s->assembler.usage().cached_tokens;
        rec.ttft_s = s->ttft_s;
        rec.e2e_s = std::chrono::duration<double>(Clock::now() - s->start).count();
        metrics.record_generation(rec);
        return;
      }
    }
  };

  if (!stream.stream) {
    std::vector<Json> chunks;
    std::string error;
    while (!s->done) {
      auto events = s->channel.take(std::chrono::milliseconds(1000));
      pump(events, chunks, error);
      chunks.clear();
    }
    metrics.count_request(endpoint, error.empty() ? 200 : 500);
    if (!error.empty()) return send_error(res, 500, error);
    return send_json(res, 200, s->assembler.response());
  }

  metrics.count_request(endpoint, 200);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  const auto keepalive = opt.keepalive_interval;
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, s, stream, keepalive, pump](size_t, httplib::DataSink& sink) {
        constexpr bool kMessages = std::is_same_v<Assembler, MessagesAssembler>;
        auto write = [&](const std::string& data) { return sink.write(data.data(), data.size()); };
        auto frame = [](const Json& c) {
          if constexpr (kMessages) return MessagesAssembler::sse(c);
          else return sse_data(c);
        };
        if (!s->stream_started) {
          s->stream_started = true;
          if constexpr (!std::is_same_v<Assembler, CompletionAssembler>) {
            if (!write(frame(s->assembler.first_chunk()))) return false;
          }
          return true;
        }
        auto events = s->channel.take(keepalive);
        if (events.empty()) return write(": keep-alive\n\n");  // re-arms client idle timers (serving.md §4b)
        std::vector<Json> chunks;
        std::string error;
        pump(events, chunks, error);
        for (const auto& c : chunks)
          if (!write(frame(c))) return false;
        if (!error.empty()) {
          if constexpr (kMessages) write(frame(Json{{"type", "error"}, {"error", {{"type", "api_error"}, {"message", error}}}}));
          else write(sse_data(error_body(error, "server_error")));
        }
        if (s->done) {
          if constexpr (!kMessages) {
            if (stream.include_usage && error.empty() && !write(sse_data(s->assembler.usage_chunk()))) return false;
            if (!write("data: [DONE]\n\n")) return false;
          }
          sink.done();
        }
        return true;
      },
      [this, s](bool success) {
        // A client that went away (or a failed write) cancels the generation and frees its memory.
        if (!success || !s->done) backend.cancel(s->id);
        s->slot.reset();
      });
}

void Server::Impl::handle_chat(const httplib::Request& req, httplib::Response& res) {
  const std::string ep = "/v1/chat/completions";
  const FailReply fail{metrics, ep, res};
  auto body = parse_body(req);
  if (!body.ok()) return fail(400, body.error().message);
  auto call = prepare_chat(req, *body, *body, fail);
  if (!call) return;
  ResponseMeta meta{new_id("chatcmpl-"), call->model, unix_now(), static_cast<int64_t>(call->request.prompt.size())};
  res.set_header("x-request-id", meta.id);
  ChatAssembler assembler(meta, call->job.parser, call->job.logprobs, backend.tokenizer(), new_seed());
  run_generation(ep, std::move(call->request), std::move(assembler), call->job.stream, res);
}

void Server::Impl::handle_messages(const httplib::Request& req, httplib::Response& res) {
  const std::string ep = "/v1/messages";
  const FailReply fail{metrics, ep, res};
  auto body = parse_body(req);
  if (!body.ok()) return fail(400, body.error().message);
  auto chat_body = messages_to_chat_request(*body);
  if (!chat_body.ok()) return fail(400, chat_body.error().message);
  auto call = prepare_chat(req, *body, *chat_body, fail);
  if (!call) return;
  ResponseMeta meta{new_id("chatcmpl-"), call->model, unix_now(), static_cast<int64_t>(call->request.prompt.size())};
  const std::string msg_id = new_id("msg_");
  res.set_header("x-request-id", msg_id);
  MessagesAssembler assembler(ChatAssembler(meta, call->job.parser, false, backend.tokenizer(), new_seed()), msg_id);
  run_generation(ep, std::move(call->request), std::move(assembler), call->job.stream, res);
}

std::optional<Server::Impl::ChatCall> Server::Impl::prepare_chat(const httplib::Request& req, const Json& body,
                                                                 const Json& chat_body, const FailReply& fail) {
  auto job = parse_chat_request(chat_body, opt.policy);
  if (!job.ok()) {
    fail(400, job.error().message);
    return std::nullopt;
  }
  auto model = resolve_model(job->model);
  if (!model.ok()) {
    fail(404, model.error().message, "model_not_found");
    return std::nullopt;
  }
  auto breq = build_chat_backend_request(*job, req, body);
  if (!breq.ok()) {
    const bool overflow = is_context_overflow(breq.error().message);
    fail(400, breq.error().message, overflow ? "context_length_exceeded" : "");
    return std::nullopt;
  }
  return ChatCall{std::move(*job), std::move(*model), std::move(*breq)};
}

Result<BackendRequest> Server::Impl::build_chat_backend_request(const ChatJob& job, const httplib::Request& req,
                                                                const Json& body) {
  CEDAR_ASSIGN_OR_RETURN(auto prompt, text::encode_request(job.encoder));
  if (!prompt.images.empty()) return make_error("messages: images are not supported by this server");
  CEDAR_ASSIGN_OR_RETURN(auto ids, text::prompt_token_ids(prompt, backend.tokenizer()));
  BackendRequest breq;
  breq.prompt.assign(ids.begin(), ids.end());
  CEDAR_ASSIGN_OR_RETURN(auto max_tokens,
                         clamp_max_tokens(job.max_tokens, static_cast<int64_t>(breq.prompt.size()), backend.context_length()));
  breq.sampling = job.sampling;
  breq.sampling.max_tokens = max_tokens;
  breq.cache_key = cache_key(req, body);
  return breq;
}

void Server::Impl::handle_completions(const httplib::Request& req, httplib::Response& res) {
  const std::string ep = "/v1/completions";
  const FailReply fail{metrics, ep, res};
  auto body = parse_body(req);
  if (!body.ok()) return fail(400, body.error().message);
  auto job = parse_completion_request(*body);
  if (!job.ok()) return fail(400, job.error().message);
  auto model = resolve_model(job->model);
  if (!model.ok()) return fail(404, model.error().message, "model_not_found");
  const auto& tok = backend.tokenizer();
  BackendRequest breq;
  std::string echo;
  if (job->prompt_text) {
    if (backend.bos_token() >= 0) breq.prompt.push_back(backend.bos_token());
    text::TokenizeOptions topt;
    topt.allow_added_tokens = true;  // raw prompts may spell the chat template's control tokens
    auto ids = tok.encode(*job->prompt_text, topt);
    if (!ids.ok()) return fail(400, "prompt: " + ids.error().message);
    breq.prompt.insert(breq.prompt.end(), ids->begin(), ids->end());
    echo = *job->prompt_text;
  } else {
    for (size_t i = 0; i < job->prompt_ids.size(); ++i)
      if (job->prompt_ids[i] < 0 || job->prompt_ids[i] >= tok.vocab_size())
        return fail(400, "prompt[" + std::to_string(i) + "]: token id " + std::to_string(job->prompt_ids[i]) +
                             " is outside the vocabulary [0, " + std::to_string(tok.vocab_size()) + ")");
    breq.prompt = job->prompt_ids;
    std::vector<text::TokenId> t(breq.prompt.begin(), breq.prompt.end());
    auto d = tok.decode(t);
    if (d.ok()) echo = *d;
  }
  auto max_tokens = clamp_max_tokens(job->max_tokens, static_cast<int64_t>(breq.prompt.size()), backend.context_length());
  if (!max_tokens.ok()) return fail(400, max_tokens.error().message, "context_length_exceeded");
  breq.sampling = job->sampling;
  breq.sampling.max_tokens = *max_tokens;
  breq.cache_key = cache_key(req, *body);
  ResponseMeta meta{new_id("cmpl-"), *model, unix_now(), static_cast<int64_t>(breq.prompt.size())};
  res.set_header("x-request-id", meta.id);
  CompletionAssembler assembler(meta, job->logprobs, tok, job->echo ? echo : std::string());
  run_generation(ep, std::move(breq), std::move(assembler), job->stream, res);
}

void Server::Impl::handle_tokenize(const httplib::Request& req, httplib::Response& res) {
  const std::string ep = "/tokenize";
  const FailReply fail{metrics, ep, res};
  auto body = parse_body(req);
  if (!body.ok()) return fail(body.error().message);
  if (!body->is_object()) return fail("request body: must be a JSON object");
  std::vector<text::TokenId> ids;
  if (body->contains("messages")) {
    auto mapped = text::map_chat_request(*body, opt.policy);
    if (!mapped.ok()) return fail(mapped.error().message);
    auto prompt = text::encode_request(*mapped);
    if (!prompt.ok()) return fail(prompt.error().message);
    auto t = text::prompt_token_ids(*prompt, backend.tokenizer());
    if (!t.ok()) return fail(t.error().message);
    ids = std::move(*t);
  } else if (body->contains("prompt") && (*body)["prompt"].is_string()) {
    bool add_special = true;
    if (body->contains("add_special_tokens")) {
      if (!(*body)["add_special_tokens"].is_boolean()) return fail("add_special_tokens: must be a boolean");
      add_special = (*body)["add_special_tokens"].get<bool>();
    }
    if (add_special && backend.bos_token() >= 0) ids.push_back(static_cast<text::TokenId>(backend.bos_token()));
    text::TokenizeOptions topt;
    topt.allow_added_tokens = true;
    auto t = backend.tokenizer().encode((*body)["prompt"].get<std::string>(), topt);
    if (!t.ok()) return fail("prompt: " + t.error().message);
    ids.insert(ids.end(), t->begin(), t->end());
  } else {
    return fail("request body: needs \"prompt\" (a string) or \"messages\"");
  }
  Json out = Json::object();
  out["count"] = ids.size();
  out["max_model_len"] = backend.context_length();
  out["tokens"] = ids;
  metrics.count_request(ep, 200);
  send_json(res, 200, out);
}

void Server::Impl::handle_detokenize(const httplib::Request& req, httplib::Response& res) {
  const std::string ep = "/detokenize";
  const FailReply fail{metrics, ep, res};
  auto body = parse_body(req);
  if (!body.ok()) return fail(body.error().message);
  if (!body->is_object() || !body->contains("tokens") || !(*body)["tokens"].is_array())
    return fail("tokens: is required (an array of token ids)");
  std::vector<text::TokenId> ids;
  const Json& t = (*body)["tokens"];
  const auto& tok = backend.tokenizer();
  for (size_t i = 0; i < t.size(); ++i) {
    if (!t[i].is_number_integer() || t[i].get<int64_t>() < 0 || t[i].get<int64_t>() >= tok.vocab_size())
      return fail("tokens[" + std::to_string(i) + "]: must be a token id in [0, " + std::to_string(tok.vocab_size()) + ")");
    ids.push_back(static_cast<text::TokenId>(t[i].get<int64_t>()));
  }
  auto text = tok.decode(ids);
  if (!text.ok()) return fail(text.error().message);
  metrics.count_request(ep, 200);
  send_json(res, 200, Json{{"prompt", *text}});
}

void Server::Impl::handle_models(httplib::Response& res) {
  Json data = Json::array();
  for (const auto& n : opt.served_model_names) {
    Json m = Json::object();
    m["id"] = n;
    m["object"] = "model";
    m["created"] = 0;
    m["owned_by"] = "cedar";
    m["max_model_len"] = backend.context_length();
    m["context_length"] = backend.context_length();
    m["context_window"] = backend.context_length();
    data.push_back(std::move(m));
  }
  metrics.count_request("/v1/models", 200);
  send_json(res, 200, Json{{"object", "list"}, {"data", data}});
}

void Server::Impl::setup_routes() {
  http.new_task_queue = [n = opt.http_threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
  http.set_payload_max_length(opt.max_body_bytes);
  http.set_read_timeout(opt.read_timeout_s, 0);
  http.set_write_timeout(opt.write_timeout_s, 0);
  http.set_keep_alive_timeout(5);
  http.set_keep_alive_max_count(1000);
  http.set_tcp_nodelay(true);
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // Health checks and Prometheus scrapes carry no key (and expose no content).
    if (opt.api_key.empty() || req.path == "/health" || req.path == "/metrics")
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string key = auth.rfind("Bearer ", 0) == 0 ? auth.substr(7) : req.get_header_value("x-api-key");
    if (constant_time_equal(key, opt.api_key)) return httplib::Server::HandlerResponse::Unhandled;
    metrics.count_request(req.path, 401);
    send_error(res, 401, auth.empty() && !req.has_header("x-api-key") ? "missing API key (Authorization: Bearer KEY)"
                                                                       : "invalid API key",
               "invalid_api_key");
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) return send_error(res, 413, "request body too large");
    if (res.status == 404) return send_error(res, 404, "no route for " + req.method + " " + req.path);
    if (res.status == 400) return send_error(res, 400, "malformed HTTP request");
    send_error(res, res.status, "HTTP error " + std::to_string(res.status));
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what += std::string(": ") + e.what();
    } catch (...) {
    }
    send_error(res, 500, what);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_chat(q, r); });
  http.Post("/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_chat(q, r); });
  http.Post("/v1/messages", [this](const httplib::Request& q, httplib::Response& r) { handle_messages(q, r); });
  http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { handle_completions(q, r); });
  http.Post("/tokenize", [this](const httplib::Request& q, httplib::Response& r) { handle_tokenize(q, r); });
  http.Post("/detokenize", [this](const httplib::Request& q, httplib::Response& r) { handle_detokenize(q, r); });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) { handle_models(r); });
  http.Get("/models", [this](const httplib::Request&, httplib::Response& r) { handle_models(r); });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
    if (draining) return send_error(r, 503, "server is shutting down");
    send_json(r, 200, Json{{"status", "ok"}});
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
    r.set_content(metrics.render(backend.stats()), "text/plain; version=0.0.4");
  });
}

Server::Server(GenerationBackend& backend, ServerOptions options)
    : impl_(std::make_unique<Impl>(backend, std::move(options))) {
  impl_->setup_routes();
}

Server::~Server() { stop(); }

Result<int> Server::bind() {
  auto& o = impl_->opt;
  if (o.port == 0) {
    const int port = impl_->http.bind_to_any_port(o.host);
    if (port <= 0) return make_error("cannot bind " + o.host + " to a free port");
    o.port = port;
  } else if (!impl_->http.bind_to_port(o.host, o.port)) {
    return make_error("cannot bind " + o.host + ":" + std::to_string(o.port) + " (in use or not permitted)");
  }
  impl_->http.raise_backlog(1024);
  return o.port;
}

Status Server::serve() {
  if (!impl_->http.listen_after_bind() && !impl_->draining)
    return make_error("HTTP server on " + impl_->opt.host + ":" + std::to_string(impl_->opt.port) + " failed");
  return Status::Ok();
}

void Server::stop() {
  std::call_once(impl_->stop_once, [this] {
    impl_->draining = true;
    const auto deadline = Clock::now() + impl_->opt.drain_timeout;
    while (impl_->inflight.load() > 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    impl_->backend.shutdown();  // cancels what is left: their streams end
    impl_->http.stop();
  });
}

int64_t Server::inflight() const { return impl_->inflight.load(); }

}  // namespace cedar::server
