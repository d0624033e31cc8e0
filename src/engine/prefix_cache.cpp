#include "engine/prefix_cache.h"

#include <algorithm>

namespace cedar::engine {

std::string_view swa_replay_name(SwaReplay r) { return r == SwaReplay::kExact ? "exact" : "window"; }

Result<SwaReplay> parse_swa_replay(std::string_view text) {
  if (text == "exact") return SwaReplay::kExact;
  if (text == "window") return SwaReplay::kWindow;
  return make_error("unknown SWA replay '" + std::string(text) + "' (known: exact, window)");
}

std::string prefix_layout_descriptor(const PrefixCacheSupport& s) {
  std::string d = "tokens_per_block=" + std::to_string(s.tokens_per_block) + ";streams=";
  for (int32_t c : s.stream_classes) d += std::to_string(s.pool ? s.pool->class_bytes(c) : 0) + ",";
  return d;
}

Result<std::unique_ptr<PrefixCache>> PrefixCache::create(const PrefixCacheSupport& support,
                                                         const PrefixCacheOptions& options, CacheBudget& budget) {
  if (support.tokens_per_block <= 0 || support.sliding_window <= 0)
    return make_error("prefix cache: the runner reports tokens_per_block " + std::to_string(support.tokens_per_block) +
                      " and sliding window " + std::to_string(support.sliding_window));
  std::unique_ptr<PrefixCache> cache(new PrefixCache(support, budget));
  cache->swa_history_ =
      options.swa_history >= 0 ? options.swa_history : support.sliding_window + support.tokens_per_block;
  cache->replay_ = options.swa_replay;
  if (options.swa_pool_bytes > 0)
    cache->swa_ =
        std::make_unique<SwaPool>(SwaPoolOptions{options.swa_pool_bytes, options.swa_ttl_seconds, options.clock});
  PrefixIndexOptions io;
  io.tokens_per_block = support.tokens_per_block;
  io.root = prefix_root(support.fingerprint, prefix_layout_descriptor(support));
  io.pool = support.pool;
  io.stream_classes = support.stream_classes;
  io.store = options.store;
  io.byte_limit = [b = &budget] { return b->index_byte_limit(); };
  if (cache->swa_) io.on_remove = [pool = cache->swa_.get()](PrefixNodeId id) { pool->drop_node(id); };
  auto index = PrefixIndex::create(std::move(io));
  if (!index.ok()) return index.error().with_context("prefix cache");
  cache->index_ = std::move(*index);
  if (!budget.attach_prefix_index(cache->index_.get()))
    return make_error("prefix cache: the cache budget cannot account shared blocks (it needs a PoolCacheBudget)");
  return cache;
}

PrefixCache::~PrefixCache() {
  if (index_) budget_->attach_prefix_index(nullptr);
}

CacheAdmission PrefixCache::admit(const AdmitRequest& req) {
  CacheAdmission a;
  const bool exact = req.mode == ForwardMode::Exact;
  const int64_t n = static_cast<int64_t>(req.tokens.size());
  // At least one token must be fed (the next logits come from it).
  Result<PrefixMatch> m = index_->lookup(req.tokens, {.exact_only = exact || req.recompute, .max_tokens = n - 1});
  if (!m.ok() || m->tokens == 0) return a;
  const int64_t P = m->tokens, B = support_.tokens_per_block, window = support_.sliding_window;
  const int64_t tail = req.ced_tail > 0 ? req.ced_tail : window;
  const int64_t t = std::max<int64_t>(0, exact ? P : std::min(P, req.prompt_length - tail));
  // The exact bounded replay: D rows before t, plus one so that the rings end up holding a full window
  // of exact keys below t (a snapshot restores at held_from + window, held_from = R + D − (W − 1)).
  const int64_t replay_rows = exact ? support_.exact_mode_replay_rows : support_.ced_replay_rows;
  const int64_t bounded = std::max<int64_t>(0, t - replay_rows - 1);
  std::optional<SwaRestore> restore;
  if (swa_ && t > 0)
    restore = swa_->find(req.tokens, m->nodes, B, t, exact ? support_.exact_mode_layers : support_.ced_layers);
  // The opt-in window replay (ced mode, never for a recompute) stands in for the bounded replay; a
  // snapshot, exact, is still preferred to it.
  const bool window_replay = replay_ == SwaReplay::kWindow && !exact && !req.recompute;
  if (restore && (window_replay || restore->restart >= bounded)) {
    a.restart = restore->restart;
    a.from_snapshot = true;
    a.approximate = !m->exact;
    a.resume.snapshot = std::move(restore->snapshot);
  } else if (window_replay) {
    a.restart = std::max<int64_t>(0, P - window);
    a.approximate = a.restart > 0 || !m->exact;
    a.window_replay = true;
  } else {
    a.restart = bounded;
    a.approximate = !m->exact;
  }
  a.cached_tokens = P;
  a.resume.cached_tokens = P;
  a.resume.restart = a.restart;
  a.resume.prefix_exact = m->exact;
  a.resume.blocks = std::move(m->blocks);
  a.pinned = std::move(m->nodes);
  budget_->share(req.id, P / B * index_->node_bytes());
  return a;
}

void PrefixCache::started(const AdmitRequest& req, const CacheAdmission& a) {
  const int64_t P = a.cached_tokens;
  if (req.recompute) {
    stats_.recompute_hits += P > 0 ? 1 : 0;
    stats_.recompute_hit_tokens += P;
    return;
  }
  ++stats_.lookups;
  stats_.lookup_tokens += req.prompt_length;
  if (P == 0) return;
  ++stats_.hits;
  stats_.hit_tokens += P;
  stats_.replayed_tokens += P - a.restart;
  ++(a.from_snapshot ? stats_.snapshot_restores : stats_.replay_restores);
  stats_.window_replay_restores += a.window_replay ? 1 : 0;
  stats_.approximate_restores += a.approximate ? 1 : 0;
}

void PrefixCache::release(CacheAdmission& a) {
  if (!a.pinned.empty()) index_->unpin(a.pinned);
  a = CacheAdmission{};
}

void PrefixCache::record(RequestId id, const ModelSequence& sequence, std::span<const int64_t> tokens) {
  const int64_t B = support_.tokens_per_block;
  const int64_t length = std::min<int64_t>(sequence.length(), static_cast<int64_t>(tokens.size()));
  const int64_t full = length / B * B;
  if (full == 0) return;
  Result<std::vector<std::vector<BlockId>>> blocks = sequence.prefix_blocks(full);
  if (!blocks.ok()) return;
  Result<PrefixInsertResult> ins =
      index_->insert(tokens.first(static_cast<size_t>(full)), *blocks, sequence.global_kv_exact());
  if (!ins.ok()) return;
  ++stats_.recorded_sequences;
  budget_->share(id, ins->adopted() * index_->node_bytes());
  if (!swa_) return;
  Result<std::shared_ptr<const SequenceSnapshot>> snap = sequence.snapshot();
  if (snap.ok() && *snap != nullptr && (*snap)->length == length)
    swa_->put(*snap, tokens.first(static_cast<size_t>(length)), ins->nodes, B);
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s = stats_;
  s.index = index_->stats();
  if (swa_) s.swa = swa_->stats();
  return s;
}

}  // namespace cedar::engine
