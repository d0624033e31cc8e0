// The engine's prefix cache (issue 6; docs/prefix_cache.md): the prefix index of global-KV blocks
// (kv/prefix_index.h), the SWA snapshot pool (swa_pool.h), the restart-point policy, and the glue to the
// cache budget. The engine asks it once per admission how to start a request's sequence (admit) and
// hands it sequences to remember when their prompt is done and when they finish (record).
//
// Restart-point policy, for a request of N prompt tokens whose index match is P tokens (t = P in exact
// mode, t = min(P, N − tail) in ced mode; D = the runner's exact replay rows for the mode):
//   1. a snapshot restorable at some R <= t (the largest such R), unless the exact bounded replay below
//      restarts later (with 3, any snapshot) → a continuation bitwise equal to an uncached run (when every
//      matched block is exact);
//   2. else the exact SWA bounded replay from R = max(0, t − D − 1): bitwise equal as well (the one row
//      beyond D leaves the rings a full window of exact keys below t, so a snapshot taken later restores
//      at t); in both modes, and for the recompute of a preempted request (exact blocks only);
//   3. opt-in (SwaReplay::kWindow, ced mode, not for a recompute): the window replay R = max(0, P − window)
//      instead of 2 — W rows instead of D, approximate unless R == 0.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/cache_budget.h"
#include "engine/model_runner.h"
#include "engine/swa_pool.h"
#include "kv/prefix_block_store.h"
#include "kv/prefix_index.h"

namespace cedar::engine {

// How a hit without a usable SWA snapshot rebuilds the rings (--swa-replay).
enum class SwaReplay {
  kExact,   // the exact bounded replay: D rows (PrefixCacheSupport::*_replay_rows), bitwise equal
  kWindow,  // ced mode: the last window only (W rows), approximate; exact mode and recomputes stay exact
};
std::string_view swa_replay_name(SwaReplay r);  // "exact" / "window"
Result<SwaReplay> parse_swa_replay(std::string_view text);

struct PrefixCacheOptions {
  bool enabled = true;
  SwaReplay swa_replay = SwaReplay::kExact;
  int64_t swa_pool_bytes = int64_t{1} << 30;  // 0: no snapshots (every hit replays: swa_replay)
  double swa_ttl_seconds = 600;
  int64_t swa_history = -1;           // extra ring slots; -1: sliding_window + tokens_per_block
  PrefixBlockStore* store = nullptr;  // second tier (the SSD tier); null: memory only
  std::function<double()> clock;      // the SWA pool's clock in seconds (tests); null: steady_clock
};

struct AdmitRequest {
  RequestId id = 0;
  std::span<const int64_t> tokens;  // what the sequence must have seen (prompt, plus output on a recompute)
  int64_t prompt_length = 0;        // N (fixes the ced tail)
  ForwardMode mode = ForwardMode::Ced;
  int64_t ced_tail = 0;    // 0: the sliding window
  bool recompute = false;  // a preempted request: bitwise-equal restores only
};

// How one request's sequence starts.
struct CacheAdmission {
  int64_t cached_tokens = 0;  // P (0: a miss; the sequence starts empty)
  int64_t restart = 0;        // R: the engine feeds tokens [R, ...)
  bool from_snapshot = false;
  bool window_replay = false;  // the approximate window replay (SwaReplay::kWindow)
  bool approximate = false;    // not promised bitwise equal to an uncached run
  SequenceResume resume;     // when cached_tokens > 0 (history set by the engine)
  std::vector<PrefixNodeId> pinned;
};

// Counted per request at the start of its first sequence (recomputes separately).
struct PrefixCacheStats {
  int64_t lookups = 0;          // requests looked up
  int64_t lookup_tokens = 0;    // Σ their prompt tokens
  int64_t hits = 0;             // requests that resumed from cached blocks
  int64_t hit_tokens = 0;       // Σ P of those
  int64_t replayed_tokens = 0;  // Σ (P − R)
  int64_t snapshot_restores = 0, replay_restores = 0;  // replay: exact bounded or window replay
  int64_t window_replay_restores = 0;                  // of the replays: the approximate window replay
  int64_t approximate_restores = 0;
  int64_t recompute_hits = 0, recompute_hit_tokens = 0;  // preempted requests resumed bitwise
  int64_t recorded_sequences = 0;
  PrefixIndexStats index;
  SwaPoolStats swa;
  double hit_rate() const { return lookup_tokens > 0 ? static_cast<double>(hit_tokens) / lookup_tokens : 0.0; }
};

class PrefixCache {
 public:
  // Errors: a budget that does not account index blocks, an index the support cannot describe.
  static Result<std::unique_ptr<PrefixCache>> create(const PrefixCacheSupport& support,
                                                     const PrefixCacheOptions& options, CacheBudget& budget);
  ~PrefixCache();

  int64_t tokens_per_block() const { return support_.tokens_per_block; }
  int64_t swa_history() const { return swa_history_; }
  SwaReplay swa_replay() const { return replay_; }

  // Looks the request up, chooses its restart point and pins what it uses; charges the shared blocks to
  // the index instead of the request (budget share). A miss pins nothing.
  CacheAdmission admit(const AdmitRequest& request);
  // The admission's sequence was created (counts it in the stats; an admission given up before that,
  // by a preemption, does not count).
  void started(const AdmitRequest& request, const CacheAdmission& admission);
  void release(CacheAdmission& admission);  // unpins (the sequence has ended or was never created)
  // Remembers the sequence's full blocks (tokens [0, floor(L / B)·B), L = its length) and a snapshot of
  // its rings at L; `tokens` holds at least L tokens. Blocks the index adopts are shared from then on.
  void record(RequestId id, const ModelSequence& sequence, std::span<const int64_t> tokens);

  PrefixCacheStats stats() const;
  PrefixIndex& index() { return *index_; }
  SwaPool* swa_pool() { return swa_.get(); }

 private:
  PrefixCache(PrefixCacheSupport support, CacheBudget& budget) : support_(std::move(support)), budget_(&budget) {}

  PrefixCacheSupport support_;
  CacheBudget* budget_;
  int64_t swa_history_ = 0;
  SwaReplay replay_ = SwaReplay::kExact;
  std::unique_ptr<SwaPool> swa_;  // null when swa_pool_bytes == 0
  std::unique_ptr<PrefixIndex> index_;
  PrefixCacheStats stats_;  // the engine's counters (index and swa are read live)
};

// The index's root key material: the runner's fingerprint (model + layout) and the block span.
std::string prefix_layout_descriptor(const PrefixCacheSupport& support);

}  // namespace cedar::engine
