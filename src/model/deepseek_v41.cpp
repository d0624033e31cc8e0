#include "model/deepseek_v41.h"

#include <algorithm>
#include <string>

#include "backend/cpu/ops.h"
#include "model/engram_token_map.h"
#include "model/forward_common.h"

namespace cedar {
namespace {

using namespace model_detail;  // the helpers the CPU forwards share (forward_common.h)

}  // namespace

int64_t SwaSnapshot::bytes() const {
  int64_t total = static_cast<int64_t>(sizeof(SwaSnapshot));
  for (const SwaRing& r : rings) total += r.bytes() + r.slots() * static_cast<int64_t>(sizeof(int64_t));
  return total;
}

std::string_view forward_mode_name(ForwardMode m) { return m == ForwardMode::Exact ? "exact" : "ced"; }

Result<ForwardMode> parse_forward_mode(std::string_view text) {
  if (text == "exact") return ForwardMode::Exact;
  if (text == "ced") return ForwardMode::Ced;
  return make_error("unknown forward mode '" + std::string(text) + "' (known: exact, ced)");
}

struct DeepseekV41Model::Rows {
  std::span<const int64_t> tokens;
  int64_t pos0 = 0;
  int64_t n = 0;
  bool tail = true;     // false: rows before the CED replay start (encoder + boundary layer only)
  bool replay = false;  // rows of a resumed sequence's cached prefix: KV sources do not write global KV
  bool last = true;     // holds the chunk's last row (LogitRows::Last)
};

struct DeepseekV41Model::Buffers {
  std::vector<float> X, X_mid;          // [n, hc·d] residual streams
  std::vector<float> pre_prev;          // [n, hc] collapse weights of the next attention site
  std::vector<HcMix> mix_attn, mix_ffn; // [n]
  std::vector<float> x, xn, y;          // [n, d] collapsed, normed, sublayer output
  std::vector<int64_t> engram_rows;     // [slots, n, cols]
};

Result<DeepseekV41Model> DeepseekV41Model::load(const std::filesystem::path& path, const LoadOptions& options) {
  CEDAR_ASSIGN_OR_RETURN(
      model_detail::LoadedModel loaded,
      model_detail::load_model(path, Arch::DeepseekV41, "the CPU forward supports deepseek_v41 only", options.pool));
  const std::filesystem::path& dir = loaded.dir;
  DeepseekV41Model m;
  m.config_ = std::move(loaded.config);
  m.plan_ = std::move(loaded.plan);
  m.weights_ = std::move(loaded.weights);
  m.hc_ = loaded.hc;
  m.attn_ = loaded.attn;
  m.moe_ = loaded.moe;
  const ModelConfig& c = m.config_;

  if (!c.engram_layer_ids.empty()) {
    CEDAR_ASSIGN_OR_RETURN(ResolvedEngramMap map, resolve_engram_map(dir, options.engram_map));
    if (static_cast<int64_t>(map.map.size()) != c.vocab_size)
      return make_error(map.source() + ": Engram token map has " + str(static_cast<int64_t>(map.map.size())) +
                        " entries, the model's vocabulary " + str(c.vocab_size));
    auto hasher = EngramHasher::create(c, std::move(map.map));
    if (!hasher.ok()) return hasher.error().with_context(map.source());
    m.hasher_.emplace(std::move(*hasher));
    m.engram_map_file_ = std::move(map.file);
    m.engram_params_ = EngramParams{c.hc_mult, c.hidden_size, m.hasher_->layout().cols(), c.rms_norm_eps};
  }

  CEDAR_RETURN_IF_ERROR(model_detail::check_layer_hc_weights(m.plan_, m.weights_, m.hc_));
  for (const LayerRole& role : m.plan_.layers) {
    const LayerWeights& w = m.weights_.tensors().layers[static_cast<size_t>(role.layer)];
    m.engram_slot_.push_back(w.engram ? m.hasher_->layout().slot_of_layer(role.layer) : -1);
  }
  return m;
}

Result<SequenceState> DeepseekV41Model::init_sequence(const SequenceOptions& options) const {
  SequenceState s;
  s.options_ = options;
  if (options.swa_history < 0) return make_error("swa_history " + str(options.swa_history) + " must not be negative");
  s.exact_swa_layers_ = plan_.num_layers();
  if (options.mode == ForwardMode::Ced) {
    if (!plan_.ced) return make_error("ced mode is unavailable for this model: " + plan_.ced_unavailable_reason);
    if (options.prompt_length <= 0) return make_error("ced mode needs the prompt length (> 0)");
    const int64_t tail = options.ced_tail > 0 ? options.ced_tail : config_.sliding_window;
    s.replay_start_ = std::max<int64_t>(0, options.prompt_length - tail);
    s.exact_swa_layers_ = ced_exact_layers(options);
  }
  CEDAR_ASSIGN_OR_RETURN(s.attention_, AttentionState::create(plan_, attn_, options.kv, options.swa_history));
  return s;
}

// Layers whose rings a ced run computes as the exact run does: the encoder, and the boundary (last KV
// source) when its attention runs on every row. The decoder's rings start at the replay start.
int64_t DeepseekV41Model::ced_exact_layers(const SequenceOptions& options) const {
  return options.ced_boundary == CedBoundary::ExactSource ? plan_.last_kv_source + 1 : plan_.encoder_layers;
}

Result<SequenceState> DeepseekV41Model::new_sequence(const SequenceOptions& options) const {
  return init_sequence(options);
}

Result<ForwardOutput> DeepseekV41Model::forward(std::span<const int64_t> tokens, SequenceState& state,
                                                const ForwardOptions& options) const {
  if (state.failed_) return make_error("forward: the sequence state is unusable after an earlier error");
  CEDAR_RETURN_IF_ERROR(model_detail::check_token_ids(tokens, state.length_, config_.vocab_size));
  ForwardOutput out;
  out.vocab = config_.vocab_size;
  // Rows before the CED replay start run fewer layers than the rest, replay rows of a resumed sequence
  // (before its cached end P) run their KV sources without global writes: split the chunk at both
  // points. The split is exact since a chunk boundary anywhere gives the same result.
  const int64_t n = static_cast<int64_t>(tokens.size()), pos0 = state.length_;
  int64_t cuts[4] = {0, std::clamp<int64_t>(state.replay_start_ - pos0, 0, n),
                     std::clamp<int64_t>(state.cached_end_ - pos0, 0, n), n};
  std::sort(cuts + 1, cuts + 3);
  for (int k = 0; k < 3; ++k) {
    const int64_t a = cuts[k], b = cuts[k + 1];
    if (a == b) continue;
    const Rows rows{.tokens = tokens.subspan(static_cast<size_t>(a), static_cast<size_t>(b - a)),
                    .pos0 = pos0 + a,
                    .n = b - a,
                    .tail = pos0 + a >= state.replay_start_,
                    .replay = pos0 + a < state.cached_end_,
                    .last = b == n};
    Status st = run_rows(rows, state, options, out);
    if (!st.ok()) {
      state.failed_ = true;
      return st.error();
    }
  }
  return out;
}

Status DeepseekV41Model::run_rows(const Rows& rows, SequenceState& state, const ForwardOptions& options,
                                  ForwardOutput& out) const {
  const int64_t n = rows.n, d = config_.hidden_size, hc = config_.hc_mult;
  Buffers b;
  b.X.resize(static_cast<size_t>(n * hc * d));
  b.X_mid.resize(b.X.size());
  b.x.resize(static_cast<size_t>(n * d));
  b.xn.resize(b.x.size());
  b.y.resize(b.x.size());
  b.mix_attn.resize(static_cast<size_t>(n));
  b.mix_ffn.resize(static_cast<size_t>(n));
  b.pre_prev.assign(static_cast<size_t>(n * hc), 0.0f);

  // §3.2: X_0 = [e, e, e, e], pre_prev = e_0.
  model_detail::embed_rows(config_, weights_.tensors().embed, rows.tokens, b.x, b.X, options.pool);
  for (int64_t t = 0; t < n; ++t) b.pre_prev[static_cast<size_t>(t * hc)] = 1.0f;
  emit(options, "embed", rows.pos0, n, d, b.x);

  if (hasher_) {
    const EngramLayout& layout = hasher_->layout();
    b.engram_rows.resize(static_cast<size_t>(layout.n_slots() * n * layout.cols()));
    CEDAR_RETURN_IF_ERROR(hasher_->hash_chunk(rows.pos0, rows.tokens, {}, state.engram_, b.engram_rows));
  }

  AttentionScratch scratch;
  int64_t last_layer = rows.tail ? plan_.num_layers() - 1 : plan_.last_kv_source;
  // A GlobalKvOnly boundary has nothing to do on pre-tail rows whose global KV is cached.
  if (!rows.tail && rows.replay && state.options_.ced_boundary == CedBoundary::GlobalKvOnly) --last_layer;
  for (int64_t l = 0; l <= last_layer; ++l) CEDAR_RETURN_IF_ERROR(run_layer(l, rows, b, state, scratch, options));
  state.length_ = rows.pos0 + n;
  if (!rows.tail) return Status::Ok();
  return finish_rows(rows, b, options, out);
}

Status DeepseekV41Model::run_layer(int64_t l, const Rows& rows, Buffers& b, SequenceState& state,
                                   AttentionScratch& scratch, const ForwardOptions& options) const {
  const LayerRole& role = plan_.layers[static_cast<size_t>(l)];
  const LayerWeights& W = weights_.tensors().layers[static_cast<size_t>(l)];
  const int64_t engram_slot = engram_slot_[static_cast<size_t>(l)];
  const int64_t n = rows.n, d = config_.hidden_size, hc = config_.hc_mult, pos0 = rows.pos0;
  const std::string prefix = "layers." + str(l) + ".";
  ThreadPool* pool = options.pool;
  auto fail = [&](const Status& st, const char* what) {
    return st.error().with_context("layer " + str(l) + " " + what + " at positions [" + str(pos0) + ", " +
                                   str(pos0 + n) + ")");
  };

  if (engram_slot >= 0) {
    const int64_t cols = hasher_->layout().cols();
    const auto slot_rows = std::span<const int64_t>(b.engram_rows).subspan(static_cast<size_t>(engram_slot * n * cols),
                                                                           static_cast<size_t>(n * cols));
    Status st = engram_forward(b.X, n, slot_rows, {}, *W.engram, engram_params_, pool);
    if (!st.ok()) return fail(st, "Engram");
    emit(options, prefix + "engram_out", pos0, n, hc * d, b.X);
  }

  // Attention site: input collapsed with the previous site's pre (single pass, §3.3).
  CEDAR_RETURN_IF_ERROR(hc_mix_rows(b.X, n, W.hc_attn, hc_, b.mix_attn, pool));
  for_rows(pool, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) hc_collapse(row(b.X, t, hc * d), row(b.pre_prev, t, hc), hc, d, row(b.x, t, d));
  });
  cpu::rms_norm(b.x, d, W.attn_norm, config_.rms_norm_eps, b.xn);
  emit(options, prefix + "attn_in", pos0, n, d, b.xn);

  AttentionCall call;
  call.layer = l;
  call.role = &role;
  call.pos0 = pos0;
  call.n = n;
  const bool boundary = l == plan_.last_kv_source;
  const bool global_kv_only = state.options_.ced_boundary == CedBoundary::GlobalKvOnly;
  if (rows.tail && (l > plan_.last_kv_source || (boundary && global_kv_only))) call.swa_start = state.replay_start_;
  call.swa_start = std::max(call.swa_start, state.swa_floor_);  // SWA bounded replay of a resumed sequence
  if (!rows.tail && boundary && global_kv_only) call.pass = AttentionPass::GlobalKvOnly;
  if (rows.replay && role.owns_compressor) call.pass = AttentionPass::SwaReplay;  // global KV is cached
  Status st = attention_forward(call, b.xn, W.attn, attn_, state.attention_, scratch,
                                call.pass == AttentionPass::GlobalKvOnly ? std::span<float>() : std::span<float>(b.y),
                                pool);
  if (!st.ok()) return fail(st, "attention");
  if (!rows.tail && boundary) return Status::Ok();  // pre-tail rows stop after the boundary's global KV
  if (options.sink && role.owns_indexer) {  // the selection, so tests can tell tie flips from errors
    const AttentionScratch::TopK& tk = scratch.topk_of(l);
    const std::vector<float> ids(tk.idx.begin(), tk.idx.end());
    emit(options, prefix + "topk", pos0, n, tk.width, ids);
  }
  emit(options, prefix + "attn_out", pos0, n, d, b.y);

  // FFN site: expand the attention output, then collapse with the attention site's pre.
  for_rows(pool, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      hc_expand(row(b.y, t, d), row(b.X, t, hc * d), b.mix_attn[static_cast<size_t>(t)], hc, d, row(b.X_mid, t, hc * d));
  });
  CEDAR_RETURN_IF_ERROR(hc_mix_rows(b.X_mid, n, W.hc_ffn, hc_, b.mix_ffn, pool));
  for_rows(pool, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      hc_collapse(row(b.X_mid, t, hc * d), b.mix_attn[static_cast<size_t>(t)].pre, hc, d, row(b.x, t, d));
  });
  cpu::rms_norm(b.x, d, W.ffn_norm, config_.rms_norm_eps, b.xn);
  emit(options, prefix + "ffn_in", pos0, n, d, b.xn);
  st = moe_forward(b.xn, n, W.ffn, moe_, rows.tokens, {}, b.y, pool);
  if (!st.ok()) return fail(st, "MoE");
  emit(options, prefix + "ffn_out", pos0, n, d, b.y);

  for_rows(pool, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const HcMix& mix = b.mix_ffn[static_cast<size_t>(t)];
      hc_expand(row(b.y, t, d), row(b.X_mid, t, hc * d), mix, hc, d, row(b.X, t, hc * d));
      std::copy(mix.pre.begin(), mix.pre.end(), row(b.pre_prev, t, hc).begin());
    }
  });
  emit(options, prefix + "out", pos0, n, hc * d, b.X);
  return Status::Ok();
}

Status DeepseekV41Model::finish_rows(const Rows& rows, Buffers& b, const ForwardOptions& options,
                                     ForwardOutput& out) const {
  const int64_t n = rows.n, d = config_.hidden_size, hc = config_.hc_mult;
  // Final collapse with the last ffn pre, final RMSNorm (§3.3).
  for_rows(options.pool, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) hc_collapse(row(b.X, t, hc * d), row(b.pre_prev, t, hc), hc, d, row(b.x, t, d));
  });
  cpu::rms_norm(b.x, d, weights_.tensors().final_norm, config_.rms_norm_eps, b.xn);
  emit(options, "final_norm", rows.pos0, n, d, b.xn);
  if (options.logits == LogitRows::None || (options.logits == LogitRows::Last && !rows.last)) return Status::Ok();

  return model_detail::head_rows(config_, weights_.tensors().head, b.xn, n, rows.pos0, options, out);
}

}  // namespace cedar
