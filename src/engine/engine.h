// The generation engine: continuous batching over a ModelRunner. Requests join and leave between
// steps; every step runs one decode token for each running request that has finished its prompt,
// then prompt chunks (oldest request first) until the step's token budget is spent. Cache room comes
// from a CacheBudget; when it runs out the newest running request is preempted — its sequence and
// cache are freed and it is requeued to recompute from its prompt plus the tokens it already
// generated (the recompute is exact, so its output is the same as without preemption). A request
// that cannot fit even alone finishes with an error; nothing crashes and no request is lost.
//
// Prefix cache (prefix_cache.h, docs/prefix_cache.md; EngineOptions::prefix_cache): at admission a request
// resumes from the longest cached prefix of its tokens when the restart-point policy allows it; its
// blocks and a snapshot of its SWA rings are recorded when its prompt is done and when it finishes.
// Unused cached blocks are evicted (by the budget) before any request is preempted. The recompute of a
// preempted request uses the cache only where the result is bitwise equal to an uncached run.
//
// Threading: submit() and cancel() may be called from any thread; step() from one thread at a time.
// Callbacks run on the step() thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/cache_budget.h"
#include "engine/model_runner.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "text/tokenizer.h"

namespace cedar::engine {

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
std::string_view finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct EngineOptions {
  int64_t step_token_budget = 512;  // tokens per step (decode tokens + prefill chunks)
  int64_t max_running = 16;         // sequences holding model state at once
  ForwardMode mode = ForwardMode::Ced;
  int64_t ced_tail = 0;  // 0: the model's sliding window
  // Detokenizes output and matches stop strings; without it text stays empty and stop strings are
  // rejected at submit.
  const text::Tokenizer* tokenizer = nullptr;
  uint64_t default_seed = 0;  // seed of requests without one (mixed with the request id)
  // Needs a runner with prefix_cache() support and a budget that accounts shared blocks
  // (PoolCacheBudget); otherwise the engine runs without (prefix_cache_status() says why).
  PrefixCacheOptions prefix_cache;
};

struct RequestStats {
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t preemptions = 0;
  double ttft_s = 0;         // submit → first token
  double total_s = 0;        // submit → finish
  int64_t kv_bytes_packed = 0;  // global KV of the sequence at its end, packed format (0: not modelled)
  int64_t kv_bytes_allocated = 0;  // the same, as allocated in the pool (page padding included)
  int64_t kv_tokens = 0;        // tokens the sequence held then
  // Prefix cache, at the request's first admission: prompt tokens whose global KV came from the cache
  // (P), the cached tokens replayed to rebuild SWA state (P − R), and whether the continuation is not
  // promised bitwise equal to an uncached run (an approximate SWA replay, or approximate blocks).
  int64_t cached_tokens = 0;
  int64_t replayed_tokens = 0;
  bool cache_approximate = false;
  double decode_tokens_per_s() const;  // (output − 1) / (total − ttft)
};

// A streamed piece of one request: the newly sampled token (absent on the final event of a
// cancelled or failed request) and the text it completes.
struct StreamEvent {
  RequestId id = 0;
  std::optional<SampledToken> token;
  std::string text;                          // newly released text (stop strings withheld)
  FinishReason finish = FinishReason::kNone; // set on the last event
  int64_t cached_tokens = 0;                 // the request's RequestStats::cached_tokens
};
using StreamCallback = std::function<void(const StreamEvent&)>;

struct GenerationRequest {
  std::vector<int64_t> prompt;
  SamplingParams params;
  StreamCallback on_event;  // optional
};

struct RequestResult {
  RequestId id = 0;
  std::vector<int64_t> tokens;       // generated ids (a final stop id included)
  std::vector<SampledToken> samples; // per generated token (logprobs when asked)
  std::string text;                  // detokenized, stop string and stop ids excluded
  FinishReason finish = FinishReason::kNone;
  std::string error;                 // kError
  RequestStats stats;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // model time by kind of chunk
  int64_t preemptions = 0;
  int64_t max_running_seen = 0;
  // Prefix cache (after every step; prefix_cache_stats() has the details).
  int64_t prefix_lookup_tokens = 0, prefix_hit_tokens = 0;
  double prefix_hit_rate = 0;     // hit / lookup tokens
  int64_t prefix_index_bytes = 0;  // global KV the index holds
  int64_t swa_pool_bytes = 0;
};

class Engine {
 public:
  Engine(ModelRunner& runner, CacheBudget& budget, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request; it joins the batch at the next step.
  Result<RequestId> submit(GenerationRequest request);
  // Marks a request cancelled; it leaves at the next step with FinishReason::kCancelled.
  void cancel(RequestId id);
  // One scheduling step. Per-request failures finish that request; an error here is the engine's.
  Status step();
  bool has_work() const;
  // Steps until every submitted request has finished.
  Status run_until_idle();
  // Results of finished requests since the last call, in finishing order.
  std::vector<RequestResult> take_finished();

  const EngineStats& stats() const { return stats_; }
  const EngineOptions& options() const { return options_; }
  // The prefix cache (null when off) and why it is off ("" when on or disabled by the options).
  const PrefixCache* prefix_cache() const { return cache_.get(); }
  const std::string& prefix_cache_status() const { return cache_status_; }
  PrefixCacheStats prefix_cache_stats() const;  // zeros when off

 private:
  struct Active;
  struct PlanItem {
    Active* request;
    int64_t begin, count;
  };

  void drain_inbox();
  AdmitRequest admit_request(const Active& r) const;
  void admit_from_cache(Active& r);
  void sequence_started(Active& r);
  void record_in_cache(Active& r);
  bool holds_cache(const Active& a) const;
  void finish(Active& r, FinishReason reason, std::string error = {});
  void preempt(Active& r);
  std::vector<PlanItem> plan();
  bool reserve_or_preempt(Active& r, int64_t tokens);
  void handle_token(Active& r, const SampledToken& token);
  void remove_finished_from_running();

  ModelRunner* runner_;
  CacheBudget* budget_;
  EngineOptions options_;
  EngineStats stats_;
  std::unique_ptr<PrefixCache> cache_;
  std::string cache_status_;

  mutable std::mutex inbox_mu_;
  std::vector<std::unique_ptr<Active>> inbox_;
  std::set<RequestId> cancel_requests_;
  RequestId next_id_ = 1;
  int64_t pending_ = 0;  // submitted and not finished (guarded by inbox_mu_)

  std::deque<std::unique_ptr<Active>> waiting_;  // oldest first
  std::vector<std::unique_ptr<Active>> running_; // oldest first
  std::vector<RequestResult> finished_;
};

}  // namespace cedar::engine
