#include "server/engine_backend.h"

#include <cstdio>

namespace cedar::server {
namespace {

BackendFinish to_backend(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kStop: return BackendFinish::kStop;
    case engine::FinishReason::kLength: return BackendFinish::kLength;
    case engine::FinishReason::kCancelled: return BackendFinish::kCancelled;
    case engine::FinishReason::kError: return BackendFinish::kError;
    default: return BackendFinish::kNone;
  }
}

engine::SamplingParams to_engine(const BackendSampling& s) {
  engine::SamplingParams p;
  p.temperature = s.temperature;
  p.top_p = s.top_p;
  p.top_k = s.top_k;
  p.min_p = s.min_p;
  p.presence_penalty = s.presence_penalty;
  p.frequency_penalty = s.frequency_penalty;
  p.repetition_penalty = s.repetition_penalty;
  p.seed = s.seed;
  p.logprobs = s.logprobs;
  p.top_logprobs = s.top_logprobs;
  p.max_tokens = s.max_tokens;
  p.stop = s.stop;
  p.ignore_eos = s.ignore_eos;
  return p;
}

engine::EngineOptions engine_options(const EngineBackendOptions& o, const text::Tokenizer& tok) {
  engine::EngineOptions e;
  e.step_token_budget = o.step_token_budget;
  e.max_running = o.max_running;
  e.mode = o.mode;
  e.tokenizer = &tok;
  e.prefix_cache = o.prefix_cache;
  return e;
}

std::unique_ptr<engine::ByteCacheBudget> own_budget(const EngineBackendOptions& o, const engine::ModelRunner& r) {
  if (o.budget != nullptr) return nullptr;
  return std::make_unique<engine::ByteCacheBudget>(r.cache_footprint(), o.kv_capacity_bytes);
}

}  // namespace

EngineBackend::EngineBackend(engine::ModelRunner& runner, const text::Tokenizer& tokenizer,
                             EngineBackendOptions options)
    : tokenizer_(&tokenizer),
      context_length_(options.context_length),
      bos_(options.bos_token),
      own_budget_(own_budget(options, runner)),
      budget_(options.budget != nullptr ? options.budget : own_budget_.get()),
      engine_(runner, *budget_, engine_options(options, tokenizer)),
      kv_disk_(options.kv_disk) {
  if (!engine_.prefix_cache_status().empty())
    std::fprintf(stderr, "cedar serve: %s\n", engine_.prefix_cache_status().c_str());
  thread_ = std::thread([this] { loop(); });
}

EngineBackend::~EngineBackend() { shutdown(); }

Result<BackendRequestId> EngineBackend::submit(BackendRequest request, BackendCallback callback) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return make_error("server is shutting down");
  }
  engine::GenerationRequest g;
  g.prompt = std::move(request.prompt);
  g.params = to_engine(request.sampling);
  // Runs on the loop thread; the HTTP side only queues the event.
  g.on_event = [cb = std::move(callback)](const engine::StreamEvent& ev) {
    BackendEvent out;
    if (ev.token) {
      BackendToken t{ev.token->token, ev.token->logprob, {}};
      for (const auto& alt : ev.token->top) t.top.push_back({alt.token, alt.logprob});
      out.token = std::move(t);
    }
    out.text = ev.text;
    out.finish = to_backend(ev.finish);
    out.cached_prompt_tokens = ev.cached_tokens;
    if (out.finish == BackendFinish::kError) out.error = "the engine could not run this request";
    cb(out);
  };
  CEDAR_ASSIGN_OR_RETURN(auto id, engine_.submit(std::move(g)));
  {
    std::lock_guard lock(mu_);
    ++submitted_;
    live_.insert(id);
  }
  cv_.notify_all();
  return static_cast<BackendRequestId>(id);
}

void EngineBackend::cancel(BackendRequestId id) {
  engine_.cancel(static_cast<engine::RequestId>(id));
  cv_.notify_all();
}

BackendStats EngineBackend::stats() const {
  BackendStats s;
  std::lock_guard lock(mu_);
  s.running = submitted_ - finished_;  // submitted and not finished (running or waiting)
  s.kv_used_bytes = budget_->sequence_bytes();
  s.kv_capacity_bytes = budget_->capacity_bytes();
  const engine::PrefixCacheStats& c = cache_stats_;
  s.prefix_cache_enabled = engine_.prefix_cache() != nullptr;
  s.prefix_cache_queries = c.lookup_tokens;
  s.prefix_cache_hits = c.hit_tokens;
  s.prefix_cache_replayed_tokens = c.replayed_tokens;
  s.prefix_cache_snapshot_restores = c.snapshot_restores;
  s.prefix_cache_replay_restores = c.replay_restores;
  s.prefix_cache_window_replay_restores = c.window_replay_restores;
  s.prefix_cache_approximate_restores = c.approximate_restores;
  s.prefix_cache_index_bytes = c.index.bytes;
  s.prefix_cache_index_blocks = c.index.nodes;
  s.prefix_cache_evicted_blocks = c.index.evicted_blocks;
  s.prefix_cache_store_loaded_blocks = c.index.store_loaded_blocks;
  s.swa_pool_bytes = c.swa.bytes;
  s.swa_pool_entries = c.swa.entries;
  if (kv_disk_ != nullptr) s.kv_disk = kv_disk_->stats();  // thread-safe
  return s;
}

void EngineBackend::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EngineBackend::loop() {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || engine_.has_work(); });
      if (stopping_) {
        for (auto id : live_) engine_.cancel(id);  // their streams end with kCancelled
        live_.clear();
        if (!engine_.has_work()) return;
      }
    }
    if (Status st = engine_.step(); !st.ok())
      std::fprintf(stderr, "cedar serve: engine step: %s\n", st.error().message.c_str());
    const auto done = engine_.take_finished();  // results were streamed; this frees them
    engine::PrefixCacheStats cache = engine_.prefix_cache_stats();  // the engine's counters: loop thread only
    std::lock_guard lock(mu_);
    cache_stats_ = std::move(cache);
    finished_ += static_cast<int64_t>(done.size());
    for (const auto& r : done) live_.erase(r.id);
  }
}

}  // namespace cedar::server
