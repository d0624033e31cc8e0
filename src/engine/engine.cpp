#include "engine/engine.h"

#include <algorithm>

namespace cedar::engine {

using Clock = std::chrono::steady_clock;

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "none";
}

double RequestStats::decode_tokens_per_s() const {
  const double t = total_s - ttft_s;
  return output_tokens > 1 && t > 0 ? static_cast<double>(output_tokens - 1) / t : 0.0;
}

struct Engine::Active {
  RequestId id = 0;
  GenerationRequest request;
  std::vector<int64_t> tokens;  // prompt + generated: what the model must have seen to sample next
  int64_t prompt_length = 0;
  std::unique_ptr<ModelSequence> sequence;
  int64_t computed = 0;   // tokens of `tokens` fed to `sequence`
  bool reserved = false;  // holds a cache reservation
  bool admitted = false;  // the prefix cache chose how the current sequence starts
  CacheAdmission cache;   // that choice (pins held until the sequence ends)
  bool prompt_recorded = false;
  bool started = false;   // a sequence of it has been created (a later one recomputes)
  bool preempt_now = false;
  bool done = false;
  std::optional<Sampler> sampler;
  std::optional<text::StreamDecoder> decoder;
  StopMatcher stop{{}};
  RequestResult result;
  Clock::time_point submitted;
};

namespace {
uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b * 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

Engine::Engine(ModelRunner& runner, CacheBudget& budget, EngineOptions options)
    : runner_(&runner), budget_(&budget), options_(std::move(options)) {
  if (!options_.prefix_cache.enabled) return;
  const std::optional<PrefixCacheSupport> support = runner_->prefix_cache();
  if (!support) {
    cache_status_ = "prefix cache off: the model runner does not support it";
    return;
  }
  auto cache = PrefixCache::create(*support, options_.prefix_cache, *budget_);
  if (!cache.ok()) {
    cache_status_ = "prefix cache off: " + cache.error().message;
    return;
  }
  cache_ = std::move(*cache);
}

Engine::~Engine() = default;

PrefixCacheStats Engine::prefix_cache_stats() const { return cache_ ? cache_->stats() : PrefixCacheStats{}; }

// Chooses how the request's next sequence starts: from the longest cached prefix the policy admits, or
// empty. Runs once per sequence, before the planner reserves room for it.
AdmitRequest Engine::admit_request(const Active& r) const {
  AdmitRequest q;
  q.id = r.id;
  q.tokens = r.tokens;
  q.prompt_length = r.prompt_length;
  q.mode = options_.mode;
  q.ced_tail = options_.ced_tail;
  q.recompute = r.started;
  return q;
}

void Engine::admit_from_cache(Active& r) {
  r.admitted = true;
  if (!cache_) return;
  r.cache = cache_->admit(admit_request(r));
  r.computed = r.cache.restart;
}

// The request's sequence exists now: its stats report how the first one started.
void Engine::sequence_started(Active& r) {
  if (cache_) cache_->started(admit_request(r), r.cache);
  if (!r.started) {
    r.result.stats.cached_tokens = r.cache.cached_tokens;
    r.result.stats.replayed_tokens = r.cache.cached_tokens - r.cache.restart;
    r.result.stats.cache_approximate = r.cache.approximate;
  }
  r.started = true;
}

void Engine::record_in_cache(Active& r) {
  if (cache_ && r.sequence) cache_->record(r.id, *r.sequence, r.tokens);
}

bool Engine::holds_cache(const Active& a) const { return a.reserved || !a.cache.pinned.empty(); }

Result<RequestId> Engine::submit(GenerationRequest request) {
  const int64_t vocab = runner_->vocab_size();
  if (request.prompt.empty()) return make_error("request: the prompt is empty");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    const int64_t t = request.prompt[i];
    if (t < 0 || t >= vocab)
      return make_error("request: prompt token " + std::to_string(i) + " = " + std::to_string(t) + " is outside [0, " +
                        std::to_string(vocab) + ")");
  }
  CEDAR_RETURN_IF_ERROR(request.params.validate(vocab));
  if (!request.params.stop.empty() && options_.tokenizer == nullptr)
    return make_error("request: stop strings need a tokenizer (the engine has none)");
  const auto n = static_cast<int64_t>(request.prompt.size());
  if (budget_->bytes_for(n + 1) > budget_->capacity_bytes())
    return make_error("request: a prompt of " + std::to_string(n) + " tokens needs " +
                      std::to_string(budget_->bytes_for(n + 1)) + " cache bytes; the cache holds " +
                      std::to_string(budget_->capacity_bytes()));

  auto a = std::make_unique<Active>();
  a->prompt_length = n;
  a->tokens = request.prompt;
  a->stop = StopMatcher(request.params.stop);
  if (options_.tokenizer) a->decoder.emplace(*options_.tokenizer);
  a->result.stats.prompt_tokens = n;
  a->submitted = Clock::now();
  std::lock_guard<std::mutex> lock(inbox_mu_);
  a->id = next_id_++;
  const uint64_t seed = request.params.seed ? *request.params.seed : mix_seed(options_.default_seed, a->id);
  CEDAR_ASSIGN_OR_RETURN(Sampler sampler, Sampler::create(request.params, vocab, seed));
  sampler.add_prompt(request.prompt);
  a->sampler.emplace(std::move(sampler));
  a->request = std::move(request);
  a->result.id = a->id;
  const RequestId id = a->id;
  inbox_.push_back(std::move(a));
  ++pending_;
  return id;
}

void Engine::cancel(RequestId id) {
  std::lock_guard<std::mutex> lock(inbox_mu_);
  cancel_requests_.insert(id);
}

bool Engine::has_work() const {
  std::lock_guard<std::mutex> lock(inbox_mu_);
  return pending_ > 0;
}

std::vector<RequestResult> Engine::take_finished() {
  std::vector<RequestResult> out;
  out.swap(finished_);
  return out;
}

void Engine::drain_inbox() {
  std::set<RequestId> cancels;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    for (auto& a : inbox_) waiting_.push_back(std::move(a));
    inbox_.clear();
    cancels.swap(cancel_requests_);
  }
  for (RequestId id : cancels) {
    for (auto& a : waiting_)
      if (a->id == id && !a->done) finish(*a, FinishReason::kCancelled);
    for (auto& a : running_)
      if (a->id == id && !a->done) finish(*a, FinishReason::kCancelled);
  }
}

void Engine::finish(Active& r, FinishReason reason, std::string error) {
  r.done = true;
  if (reason != FinishReason::kError) record_in_cache(r);  // a failed forward leaves unusable state
  if (cache_) cache_->release(r.cache);
  if (r.sequence) {
    r.result.stats.kv_bytes_packed = r.sequence->kv_bytes_packed();
    r.result.stats.kv_bytes_allocated = r.sequence->kv_bytes_allocated();
    r.result.stats.kv_tokens = r.sequence->length();
  }
  r.sequence.reset();
  budget_->release(r.id);
  r.reserved = false;
  r.result.finish = reason;
  r.result.error = std::move(error);
  r.result.stats.total_s = seconds_since(r.submitted);
  if (reason == FinishReason::kCancelled || reason == FinishReason::kError) {
    if (r.request.on_event) {
      StreamEvent ev;
      ev.id = r.id;
      ev.finish = reason;
      ev.cached_tokens = r.result.stats.cached_tokens;
      r.request.on_event(ev);
    }
  }
  finished_.push_back(std::move(r.result));
  std::lock_guard<std::mutex> lock(inbox_mu_);
  --pending_;
}

void Engine::preempt(Active& r) {
  r.sequence.reset();
  if (cache_) cache_->release(r.cache);
  r.admitted = false;
  budget_->release(r.id);
  r.reserved = false;
  r.computed = 0;
  r.preempt_now = true;
  ++r.result.stats.preemptions;
  ++stats_.preemptions;
}

bool Engine::reserve_or_preempt(Active& r, int64_t tokens) {
  if (budget_->bytes_for(tokens) > budget_->capacity_bytes()) {
    finish(r, FinishReason::kError,
           "the cache (" + std::to_string(budget_->capacity_bytes()) + " bytes) cannot hold " + std::to_string(tokens) +
               " tokens of one sequence (" + std::to_string(budget_->bytes_for(tokens)) + " bytes)");
    return false;
  }
  // A resumed sequence's tables cover the cached prefix from the start.
  tokens = std::max(tokens, r.cache.cached_tokens);
  while (!budget_->reserve(r.id, tokens)) {
    // The newest request younger than r that holds cache (a reservation, or pinned cached blocks).
    Active* victim = nullptr;
    for (auto& a : running_)
      if (a->id > r.id && !a->done && holds_cache(*a) && (victim == nullptr || a->id > victim->id)) victim = a.get();
    if (victim != nullptr) {
      preempt(*victim);
      continue;
    }
    bool others_hold = budget_->sequences() > (r.reserved ? 1 : 0);
    for (auto& a : running_) others_hold = others_hold || (a.get() != &r && !a->done && holds_cache(*a));
    if (!others_hold) {  // alone and still refused (page rounding, fragmentation): can never run
      finish(r, FinishReason::kError, "the cache refused " + std::to_string(tokens) + " tokens with nothing else in it");
      return false;
    }
    if (holds_cache(r)) preempt(r);  // older requests hold the memory: give ours back and wait
    return false;
  }
  r.reserved = true;
  return true;
}

std::vector<Engine::PlanItem> Engine::plan() {
  std::vector<PlanItem> items;
  int64_t budget = options_.step_token_budget;
  auto usable = [](const Active& a) { return !a.done && !a.preempt_now; };
  // Decode tokens first (one per request past its prompt), oldest first.
  for (auto& a : running_) {
    if (budget <= 0) break;
    if (!usable(*a) || static_cast<int64_t>(a->tokens.size()) - a->computed != 1) continue;
    if (!reserve_or_preempt(*a, a->computed + 1)) continue;
    items.push_back({a.get(), a->computed, 1});
    --budget;
  }
  // Then prompt (or recompute) chunks under what is left of the budget.
  for (auto& a : running_) {
    if (budget <= 0) break;
    const int64_t remaining = static_cast<int64_t>(a->tokens.size()) - a->computed;
    if (!usable(*a) || remaining <= 1) continue;
    const int64_t n = std::min(remaining, budget);
    if (!reserve_or_preempt(*a, a->computed + n)) continue;
    items.push_back({a.get(), a->computed, n});
    budget -= n;
  }
  // Requests preempted while planning lose their items.
  std::erase_if(items, [](const PlanItem& p) { return p.request->done || p.request->preempt_now; });
  return items;
}

void Engine::handle_token(Active& r, const SampledToken& token) {
  RequestResult& res = r.result;
  if (res.tokens.empty()) res.stats.ttft_s = seconds_since(r.submitted);
  res.tokens.push_back(token.token);
  res.samples.push_back(token);
  ++res.stats.output_tokens;
  r.tokens.push_back(token.token);

  const SamplingParams& p = r.request.params;
  const bool stop_id = (token.token == runner_->eos_token() && !p.ignore_eos) ||
                       std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token.token) != p.stop_token_ids.end();
  StreamEvent ev;
  ev.id = r.id;
  ev.token = token;
  ev.cached_tokens = res.stats.cached_tokens;
  if (r.decoder && !stop_id) {
    std::string piece;
    if (Status st = r.decoder->push(token.token, piece); !st.ok()) {
      finish(r, FinishReason::kError, st.error().message);
      return;
    }
    ev.text = r.stop.push(piece);
  }
  if (r.stop.matched()) {
    ev.finish = FinishReason::kStop;
  } else if (stop_id) {
    ev.finish = FinishReason::kStop;
  } else if (res.stats.output_tokens >= p.max_tokens) {
    ev.finish = FinishReason::kLength;
  }
  if (ev.finish != FinishReason::kNone && !r.stop.matched() && r.decoder) {
    ev.text += r.stop.push(r.decoder->finish());  // an incomplete character at the end
    ev.text += r.stop.flush();
  }
  res.text += ev.text;
  if (r.request.on_event) r.request.on_event(ev);
  if (ev.finish != FinishReason::kNone) finish(r, ev.finish);
}

Status Engine::step() {
  drain_inbox();
  std::erase_if(waiting_, [](const std::unique_ptr<Active>& a) { return a->done; });
  // Admit waiting requests (oldest first) while there is room in the batch.
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_running) {
    std::unique_ptr<Active> a = std::move(waiting_.front());
    waiting_.pop_front();
    auto at = std::upper_bound(running_.begin(), running_.end(), a->id,
                               [](RequestId id, const std::unique_ptr<Active>& b) { return id < b->id; });
    running_.insert(at, std::move(a));
  }
  stats_.max_running_seen = std::max<int64_t>(stats_.max_running_seen, static_cast<int64_t>(running_.size()));
  for (auto& a : running_)
    if (!a->done && !a->sequence && !a->admitted) admit_from_cache(*a);

  std::vector<PlanItem> plan_items = plan();
  std::vector<BatchItem> batch;
  batch.reserve(plan_items.size());
  std::vector<PlanItem> ran;
  for (const PlanItem& p : plan_items) {
    Active& r = *p.request;
    if (!r.sequence) {
      SequenceSpec spec{options_.mode, r.prompt_length, options_.ced_tail};
      if (cache_) spec.swa_history = cache_->swa_history();
      if (r.cache.cached_tokens > 0) {
        r.cache.resume.history = std::span<const int64_t>(r.tokens).first(static_cast<size_t>(r.cache.restart));
        spec.resume = &r.cache.resume;
      }
      auto seq = runner_->create_sequence(spec);
      r.cache.resume.blocks.clear();  // the sequence holds its own references now
      r.cache.resume.snapshot.reset();
      if (!seq.ok()) {
        finish(r, FinishReason::kError, seq.error().message);
        continue;
      }
      r.sequence = std::move(*seq);
      sequence_started(r);
    }
    BatchItem item;
    item.sequence = r.sequence.get();
    item.tokens = std::span<const int64_t>(r.tokens).subspan(static_cast<size_t>(p.begin), static_cast<size_t>(p.count));
    item.want_logits = p.begin + p.count == static_cast<int64_t>(r.tokens.size());
    batch.push_back(std::move(item));
    ran.push_back(p);
  }
  if (!batch.empty()) runner_->run_batch(batch);
  ++stats_.steps;

  for (size_t i = 0; i < batch.size(); ++i) {
    Active& r = *ran[i].request;
    BatchItem& item = batch[i];
    if (!item.status.ok()) {
      finish(r, FinishReason::kError, item.status.error().message);
      continue;
    }
    r.computed += ran[i].count;
    if (!r.prompt_recorded && r.computed >= r.prompt_length) {
      r.prompt_recorded = true;
      record_in_cache(r);
    }
    const bool decode = ran[i].count == 1 && ran[i].begin >= r.prompt_length;
    (decode ? stats_.decode_tokens : stats_.prefill_tokens) += ran[i].count;
    (decode ? stats_.decode_seconds : stats_.prefill_seconds) += item.seconds;
    if (!item.want_logits) continue;
    auto token = r.sampler->sample(item.logits);
    if (!token.ok()) {
      finish(r, FinishReason::kError, token.error().message);
      continue;
    }
    handle_token(r, *token);
  }

  // Leave: finished requests go, preempted ones return to the waiting queue in age order.
  std::vector<std::unique_ptr<Active>> keep;
  for (auto& a : running_) {
    if (a->done) continue;
    if (a->preempt_now) {
      a->preempt_now = false;
      auto at = std::upper_bound(waiting_.begin(), waiting_.end(), a->id,
                                 [](RequestId id, const std::unique_ptr<Active>& b) { return id < b->id; });
      waiting_.insert(at, std::move(a));
      continue;
    }
    keep.push_back(std::move(a));
  }
  running_.swap(keep);
  if (cache_) {
    const PrefixCacheStats c = cache_->stats();
    stats_.prefix_lookup_tokens = c.lookup_tokens;
    stats_.prefix_hit_tokens = c.hit_tokens;
    stats_.prefix_hit_rate = c.hit_rate();
    stats_.prefix_index_bytes = c.index.bytes;
    stats_.swa_pool_bytes = c.swa.bytes;
  }
  return Status::Ok();
}

Status Engine::run_until_idle() {
  while (has_work()) CEDAR_RETURN_IF_ERROR(step());
  return Status::Ok();
}

}  // namespace cedar::engine
