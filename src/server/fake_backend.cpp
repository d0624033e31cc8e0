#include "server/fake_backend.h"

#include <cmath>

namespace cedar::server {

std::string default_fake_script(const BackendRequest& request) {
  const std::string seed = request.sampling.seed ? std::to_string(*request.sampling.seed) : "none";
  return "Thinking about seed " + seed + ".</think>Answer for seed " + seed + ": " +
         std::to_string(request.prompt.size()) + " prompt tokens.";
}

double fake_logprob(size_t pos, int64_t id) {
  return -0.125 * static_cast<double>((pos + static_cast<size_t>(id)) % 8);
}

FakeBackend::FakeBackend(FakeBackendOptions options) : options_(std::move(options)) {
  if (!options_.script) options_.script = default_fake_script;
  thread_ = std::thread([this] { loop(); });
}

FakeBackend::~FakeBackend() { shutdown(); }

Result<BackendRequestId> FakeBackend::submit(BackendRequest request, BackendCallback callback) {
  if (request.prompt.empty()) return make_error("prompt: must not be empty");
  if (request.sampling.max_tokens <= 0)
    return make_error("max_tokens: must be > 0, got " + std::to_string(request.sampling.max_tokens));
  auto active = std::make_unique<Active>();
  text::TokenizeOptions opts;
  opts.allow_added_tokens = true;  // the script writes control tokens by name
  CEDAR_ASSIGN_OR_RETURN(auto ids, options_.tokenizer->encode(options_.script(request), opts));
  active->tokens.assign(ids.begin(), ids.end());
  active->request = std::move(request);
  active->callback = std::move(callback);
  std::lock_guard lock(mu_);
  if (stopping_) return make_error("server is shutting down");
  const BackendRequestId id = next_id_++;
  active_.emplace(id, std::move(active));
  cv_.notify_all();
  return id;
}

void FakeBackend::cancel(BackendRequestId id) {
  std::lock_guard lock(mu_);
  auto it = active_.find(id);
  if (it != active_.end()) it->second->cancel = true;
  cv_.notify_all();
}

BackendStats FakeBackend::stats() const {
  std::lock_guard lock(mu_);
  BackendStats s;
  s.running = static_cast<int64_t>(active_.size());
  s.kv_capacity_bytes = options_.context_length * 64;
  for (const auto& [id, a] : active_)
    s.kv_used_bytes += static_cast<int64_t>(a->request.prompt.size() + a->emitted) * 64;
  return s;
}

int64_t FakeBackend::live_requests() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(active_.size());
}

void FakeBackend::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    for (auto& [id, a] : active_) a->cancel = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

bool FakeBackend::step_one(Active& a, bool cancelled) {
  BackendEvent ev;
  if (cancelled) {
    ev.finish = BackendFinish::kCancelled;
    cancelled_.fetch_add(1);
  } else if (a.emitted >= a.tokens.size()) {
    ev.finish = BackendFinish::kStop;  // the EOS: produces no text
  } else {
    const int64_t id = a.tokens[a.emitted];
    BackendToken tok{id, fake_logprob(a.emitted, id), {}};
    if (a.request.sampling.logprobs) {
      for (int k = 0; k < a.request.sampling.top_logprobs; ++k) {
        const int64_t alt = k == 0 ? id : id + k;
        tok.top.push_back({alt, fake_logprob(a.emitted, alt) - 0.5 * k});
      }
    }
    ++a.emitted;
    std::vector<text::TokenId> ids(a.tokens.begin(), a.tokens.begin() + static_cast<ptrdiff_t>(a.emitted));
    auto decoded = options_.tokenizer->decode(ids);
    std::string full = decoded.ok() ? *decoded : a.emitted_text;
    // Hold back a trailing replacement character: the next token may complete the UTF-8 sequence.
    const bool incomplete = a.emitted < a.tokens.size() && full.size() >= 3 && full.compare(full.size() - 3, 3, "\xEF\xBF\xBD") == 0;
    if (!incomplete && full.size() >= a.emitted_text.size()) {
      ev.text = full.substr(a.emitted_text.size());
      a.emitted_text = full;
    }
    ev.token = tok;
    if (static_cast<int64_t>(a.emitted) >= a.request.sampling.max_tokens) ev.finish = BackendFinish::kLength;
    if (!a.request.sampling.stop.empty()) {
      for (const auto& s : a.request.sampling.stop) {
        const size_t at = a.emitted_text.find(s);
        if (s.empty() || at == std::string::npos) continue;
        const size_t released = a.emitted_text.size() - ev.text.size();
        ev.text = at > released ? a.emitted_text.substr(released, at - released) : "";
        ev.finish = BackendFinish::kStop;
        break;
      }
    }
  }
  ev.cached_prompt_tokens = options_.cached_prompt_tokens;
  a.callback(ev);
  return ev.finish != BackendFinish::kNone;
}

void FakeBackend::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !active_.empty(); });
    if (active_.empty() && stopping_) return;
    // One step: one event for every active request (callbacks run without the lock, like the engine).
    std::vector<std::pair<BackendRequestId, Active*>> batch;
    for (auto& [id, a] : active_) batch.emplace_back(id, a.get());
    lock.unlock();
    std::vector<BackendRequestId> done;
    for (auto& [id, a] : batch) {
      bool cancel_now;
      {
        std::lock_guard g(mu_);
        cancel_now = a->cancel;
      }
      if (step_one(*a, cancel_now)) done.push_back(id);
    }
    if (options_.tick.count() > 0) std::this_thread::sleep_for(options_.tick);
    lock.lock();
    for (auto id : done) active_.erase(id);
  }
}

}  // namespace cedar::server
