// What the HTTP server drives: a generation backend that takes a tokenized prompt with sampling
// parameters and streams tokens back through a callback. The production backend wraps the engine
// (engine_backend.h) with its step loop on its own thread; FakeBackend (fake_backend.h) is a
// deterministic stand-in for server tests. The server never blocks the backend: callbacks only push
// into a per-request queue that the HTTP worker thread drains.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/kv_disk_store.h"
#include "text/tokenizer.h"

namespace cedar::server {

using BackendRequestId = uint64_t;

struct BackendSampling {
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;
  int64_t top_k = 0;  // <= 0: off
  double min_p = 0.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;
  std::optional<uint64_t> seed;
  bool logprobs = false;
  int top_logprobs = 0;
  int64_t max_tokens = 16;
  std::vector<std::string> stop;  // raw-text stop strings (completions); chat stops are parsed by the server
  bool ignore_eos = false;
};

struct BackendRequest {
  std::vector<int64_t> prompt;
  BackendSampling sampling;
  std::string cache_key;  // session affinity (x-deepseek-harness-session-id / user); may be empty
};

struct TopLogprob {
  int64_t token = 0;
  double logprob = 0;
};

struct BackendToken {
  int64_t id = 0;
  double logprob = 0;
  std::vector<TopLogprob> top;
};

enum class BackendFinish { kNone, kStop, kLength, kCancelled, kError };

// One streamed piece: a newly sampled token (absent on a final event without a token) and the text it
// releases. The final event has finish != kNone. Every event carries the prompt tokens served from
// the prefix cache (known once prefill starts; the server keeps the largest value seen).
struct BackendEvent {
  std::optional<BackendToken> token;
  std::string text;
  BackendFinish finish = BackendFinish::kNone;
  std::string error;              // kError
  int64_t cached_prompt_tokens = 0;
};

using BackendCallback = std::function<void(const BackendEvent&)>;

struct BackendStats {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t kv_used_bytes = 0;  // held by sequences (cached prefixes: prefix_cache_index_bytes)
  int64_t kv_capacity_bytes = 0;
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up
  int64_t prefix_cache_hits = 0;     // prompt tokens found
  // The engine's prefix cache (docs/prefix_cache.md); all zero when it is off.
  bool prefix_cache_enabled = false;
  int64_t prefix_cache_replayed_tokens = 0;  // cached tokens re-run to rebuild SWA state
  // Hits by how the SWA state was rebuilt: from a snapshot, by replay (exact bounded or window), of the
  // replays the window replay (--swa-replay window), and hits not promised bitwise equal.
  int64_t prefix_cache_snapshot_restores = 0, prefix_cache_replay_restores = 0;
  int64_t prefix_cache_window_replay_restores = 0, prefix_cache_approximate_restores = 0;
  int64_t prefix_cache_index_bytes = 0, prefix_cache_index_blocks = 0;
  int64_t prefix_cache_evicted_blocks = 0;
  int64_t prefix_cache_store_loaded_blocks = 0;  // second tier (SSD)
  int64_t swa_pool_bytes = 0, swa_pool_entries = 0;
  std::optional<KvDiskStoreStats> kv_disk;  // the SSD tier (--kv-cache-dir); absent without one
};

class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  // Queues a request; `callback` runs on the backend's thread, once per event, the last with a finish.
  // Errors (bad parameters) are returned here and no callback runs.
  virtual Result<BackendRequestId> submit(BackendRequest request, BackendCallback callback) = 0;
  // Ends a request early (finish kCancelled follows); unknown or finished ids are ignored.
  virtual void cancel(BackendRequestId id) = 0;
  virtual BackendStats stats() const = 0;
  virtual const text::Tokenizer& tokenizer() const = 0;
  virtual int64_t context_length() const = 0;
  virtual int64_t bos_token() const = 0;  // -1: none
  // Stops the loop: pending requests finish with kCancelled. Idempotent.
  virtual void shutdown() = 0;
};

}  // namespace cedar::server
