// Prefix caching on the model side (docs/prefix_cache.md "Resuming a sequence (model)"): resume a
// sequence from cached global-KV blocks and an optional SWA ring snapshot, take snapshots, list the
// blocks of a prefix. The forward itself (replay rows, SWA floor) lives in deepseek_v41.cpp.
#include <algorithm>
#include <string>

#include "model/deepseek_v41.h"

namespace cedar {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string stream_name(const LayerPlan& plan, size_t s) {
  // Streams are in global_kv_streams order: per source layer main KV, then its indexer keys.
  size_t k = 0;
  for (const LayerRole& role : plan.layers) {
    if (!role.owns_compressor || role.compress_ratio <= 0) continue;
    if (k++ == s) return "stream " + str(static_cast<int64_t>(s)) + " (layer " + str(role.layer) + " main KV)";
    if (role.owns_indexer_keys && k++ == s)
      return "stream " + str(static_cast<int64_t>(s)) + " (layer " + str(role.layer) + " indexer keys)";
  }
  return "stream " + str(static_cast<int64_t>(s));
}

// The compress ratio of each stream, in global_kv_streams order.
std::vector<int64_t> stream_ratios(const LayerPlan& plan) {
  std::vector<int64_t> r;
  for (const LayerRole& role : plan.layers) {
    if (!role.owns_compressor || role.compress_ratio <= 0) continue;
    r.push_back(role.compress_ratio);
    if (role.owns_indexer_keys) r.push_back(role.compress_ratio);
  }
  return r;
}

// A prefix of `tokens` positions ends on a block boundary of every stream and leaves no partial
// compress group (whose fp32 state is not in the blocks).
Status check_prefix_length(const char* what, int64_t tokens, int64_t tokens_per_block, const LayerPlan& plan) {
  if (tokens < 0) return make_error(std::string(what) + " " + str(tokens) + " must not be negative");
  if (tokens_per_block <= 0 || tokens % tokens_per_block != 0)
    return make_error(std::string(what) + " " + str(tokens) + " is not a multiple of tokens_per_block " +
                      str(tokens_per_block));
  for (const LayerRole& role : plan.layers)
    if (role.owns_compressor && role.compress_ratio > 0 && tokens % role.compress_ratio != 0)
      return make_error(std::string(what) + " " + str(tokens) + " is not a multiple of compress ratio " +
                        str(role.compress_ratio) + " of KV source layer " + str(role.layer) +
                        " (a partial group's state is not cached)");
  return Status::Ok();
}

}  // namespace

// Layers that run their window on the replay rows: exact mode all; ced mode the encoder, plus the
// boundary when its attention runs on every row (ExactSource). Each adds W − 1 rows of reach.
int64_t exact_replay_rows(const LayerPlan& plan, int64_t sliding_window, ForwardMode mode, CedBoundary boundary) {
  int64_t layers = plan.num_layers();
  if (mode == ForwardMode::Ced)
    layers = boundary == CedBoundary::ExactSource ? plan.last_kv_source + 1 : plan.encoder_layers;
  return layers * std::max<int64_t>(0, sliding_window - 1);
}

Result<SequenceState> DeepseekV41Model::resume_sequence(const SequenceOptions& options,
                                                        const ResumeSpec& resume) const {
  auto fail = [](const std::string& what) { return make_error("resume: " + what); };
  const int64_t P = resume.cached_tokens, R = resume.restart, window = config_.sliding_window;
  CEDAR_ASSIGN_OR_RETURN(SequenceState s, init_sequence(options));
  if (Status st = check_prefix_length("cached_tokens", P, options.kv.tokens_per_block, plan_); !st.ok())
    return st.error().with_context("resume");
  if (R < 0 || R > P) return fail("restart " + str(R) + " is outside [0, cached_tokens " + str(P) + "]");
  // A replay without a snapshot is exact when the window truncation at R cannot reach t: the cached
  // end P, and in ced mode also the uncached run's replay start (decoder rows from there on).
  const int64_t replay_rows = exact_replay_rows(options.mode, options.ced_boundary);
  const int64_t t = options.mode == ForwardMode::Ced ? std::min(P, s.replay_start_) : P;
  const bool exact_replay = R == 0 || R <= t - replay_rows;
  if (options.mode == ForwardMode::Exact) {
    if (!resume.prefix_exact)
      return fail("exact mode cannot resume from a prefix whose global KV is not exact (recompute instead)");
    if (resume.swa == nullptr && !exact_replay)
      return fail("exact mode refuses an inexact SWA bounded replay: restart " + str(R) + " replays " + str(P - R) +
                  " rows, exactness needs " + str(replay_rows) + " (restart <= " +
                  str(std::max<int64_t>(0, P - replay_rows)) + ", or a ring snapshot)");
  }
  if (static_cast<int64_t>(resume.history.size()) != R)
    return fail("history holds " + str(static_cast<int64_t>(resume.history.size())) +
                " tokens, expected the sequence's " + str(R) + " tokens before the restart");
  for (size_t i = 0; i < resume.history.size(); ++i)
    if (resume.history[i] < 0 || resume.history[i] >= config_.vocab_size)
      return fail("history token " + str(resume.history[i]) + " at position " + str(static_cast<int64_t>(i)) +
                  " is outside the vocabulary [0, " + str(config_.vocab_size) + ")");

  // Global KV: adopt the cached blocks (shared by reference count, no copy).
  CEDAR_ASSIGN_OR_RETURN(const std::vector<KvEntries*> streams, s.attention_.global_kv_entries(plan_));
  const std::vector<int64_t> ratios = stream_ratios(plan_);
  const bool nothing_cached = P == 0 && resume.blocks.empty();  // a resume at 0 from nothing
  if (!nothing_cached && resume.blocks.size() != streams.size())
    return fail("blocks name " + str(static_cast<int64_t>(resume.blocks.size())) +
                " global-KV streams, the model has " + str(static_cast<int64_t>(streams.size())));
  if (P > 0 && options.kv.pool == nullptr)
    return fail("cached blocks need options.kv.pool (the pool that holds them); it is null");
  for (size_t k = 0; k < streams.size() && !nothing_cached; ++k) {
    const int64_t entries = P / ratios[k];
    const int64_t epb = streams[k]->blocks().entries_per_block();
    const int64_t want = entries / epb;
    if (static_cast<int64_t>(resume.blocks[k].size()) != want)
      return fail(stream_name(plan_, k) + " has " + str(static_cast<int64_t>(resume.blocks[k].size())) +
                  " blocks, cached_tokens " + str(P) + " needs " + str(want) + " (" + str(entries) + " entries, " +
                  str(epb) + " per block)");
    Status st = streams[k]->adopt(resume.blocks[k], entries);
    if (!st.ok()) return st.error().with_context("resume: " + stream_name(plan_, k));
  }
  s.cached_end_ = P;

  // SWA rings: restore the snapshot at R, or replay from R.
  const int64_t needed = s.exact_swa_layers_;
  if (resume.swa != nullptr) {
    const SwaSnapshot& snap = *resume.swa;
    const int64_t slots = window + options.swa_history;
    if (snap.slots != slots)
      return fail("snapshot rings have " + str(snap.slots) + " slots, the sequence's " + str(slots) + " (window " +
                  str(window) + " + swa_history " + str(options.swa_history) + ")");
    if (static_cast<int64_t>(snap.rings.size()) != snap.exact_layers || snap.exact_layers > plan_.num_layers())
      return fail("snapshot holds " + str(static_cast<int64_t>(snap.rings.size())) + " rings for " +
                  str(snap.exact_layers) + " layers (the model has " + str(plan_.num_layers()) + ")");
    if (snap.exact_layers < needed)
      return fail("snapshot covers layers [0, " + str(snap.exact_layers) + "), " +
                  std::string(forward_mode_name(options.mode)) + " mode needs [0, " + str(needed) + ")");
    const int64_t earliest = snap.earliest_restore(window);
    if (R < earliest || R > snap.length)
      return fail("restart " + str(R) + " is outside the snapshot's restorable range [" + str(earliest) + ", " +
                  str(snap.length) + "] (length " + str(snap.length) + ", " + str(slots) + " slots, held from " +
                  str(snap.held_from) + ")");
    for (int64_t l = 0; l < needed; ++l) {
      const SwaRing& from = snap.rings[static_cast<size_t>(l)];
      SwaRing& to = s.attention_.rings[static_cast<size_t>(l)];
      if (from.slots() != to.slots() || !(from.format() == to.format()))
        return fail("snapshot ring of layer " + str(l) + " is " + str(from.slots()) + " × " + from.format().name() +
                    ", the sequence's " + str(to.slots()) + " × " + to.format().name());
      to = from;
      to.forget_from(R);  // positions the resumed sequence has not reached yet
      for (int64_t k = std::max<int64_t>(0, R - window + 1); k < R; ++k)
        if (!to.holds(k))
          return fail("snapshot ring of layer " + str(l) + " lacks the SWA key of position " + str(k) + " (restart " +
                      str(R) + ")");
    }
    s.swa_held_from_ = snap.held_from;
  } else {
    s.swa_floor_ = R;  // SWA bounded replay (§3.11 use 2): no layer sees SWA keys before R
    // Layer l's ring keys are exact from R + l·(W − 1) on; the last exact layer's bound them all.
    const int64_t reach = std::max<int64_t>(0, needed - 1) * std::max<int64_t>(0, window - 1);
    s.swa_held_from_ = R == 0 || !exact_replay ? R : R + reach;
  }
  s.global_kv_exact_ = resume.prefix_exact && (resume.swa != nullptr || exact_replay);

  if (hasher_) {
    auto h = hasher_->history_at(R, resume.history);
    if (!h.ok()) return h.error().with_context("resume");
    s.engram_ = std::move(*h);
  }
  s.length_ = R;
  if (options.mode == ForwardMode::Ced) s.replay_start_ = std::max(s.replay_start_, R);
  return s;
}

Result<SwaSnapshot> DeepseekV41Model::snapshot_swa(const SequenceState& state) const {
  if (state.failed_) return make_error("SWA snapshot: the sequence state is unusable after an earlier error");
  SwaSnapshot snap;
  snap.length = state.length_;
  snap.exact_layers = state.exact_swa_layers();
  snap.slots = state.attention_.rings.empty() ? 0 : state.attention_.rings.front().slots();
  snap.held_from = std::max<int64_t>({0, state.swa_held_from_, state.length_ - snap.slots});
  snap.rings.assign(state.attention_.rings.begin(), state.attention_.rings.begin() + snap.exact_layers);
  return snap;
}

Result<std::vector<std::vector<BlockId>>> DeepseekV41Model::prefix_blocks(const SequenceState& state,
                                                                          int64_t tokens) const {
  if (state.failed_) return make_error("prefix blocks: the sequence state is unusable after an earlier error");
  if (Status st = check_prefix_length("prefix", tokens, state.options_.kv.tokens_per_block, plan_); !st.ok())
    return st.error().with_context("prefix blocks");
  CEDAR_ASSIGN_OR_RETURN(const std::vector<const KvEntries*> streams, state.attention_.global_kv_entries(plan_));
  const std::vector<int64_t> ratios = stream_ratios(plan_);
  std::vector<std::vector<BlockId>> out(streams.size());
  for (size_t k = 0; k < streams.size(); ++k) {
    const KvEntries& e = *streams[k];
    const int64_t entries = tokens / ratios[k];
    if (entries > e.size())
      return make_error("prefix blocks: " + stream_name(plan_, k) + " holds " + str(e.size()) +
                        " entries, a prefix of " + str(tokens) + " tokens needs " + str(entries));
    const int64_t n_blocks = entries / e.blocks().entries_per_block();
    for (int64_t b = 0; b < n_blocks; ++b) out[k].push_back(e.blocks().block_id(b));
  }
  return out;
}

}  // namespace cedar
