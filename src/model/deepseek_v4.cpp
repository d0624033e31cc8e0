#include "model/deepseek_v4.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "model/attention_v4.h"
#include "model/forward_common.h"

namespace cedar {
namespace {

using namespace model_detail;  // the helpers the CPU forwards share (forward_common.h)

// Activations of one chunk.
struct Buffers {
  std::vector<float> X, X_mid;  // [n, hc·d] residual streams
  std::vector<HcMix> mix;       // [n] coefficients of the current site
  std::vector<float> x, xn, y;  // [n, d] collapsed, normed, sublayer output
};

}  // namespace

Result<DeepseekV4Model> DeepseekV4Model::load(const std::filesystem::path& path, const LoadOptions& options) {
  CEDAR_ASSIGN_OR_RETURN(
      model_detail::LoadedModel loaded,
      model_detail::load_model(path, Arch::DeepseekV4, "DeepseekV4Model loads deepseek_v4 checkpoints", options.pool));
  DeepseekV4Model m;
  m.config_ = std::move(loaded.config);
  m.plan_ = std::move(loaded.plan);
  m.weights_ = std::move(loaded.weights);
  m.hc_ = loaded.hc;
  m.attn_ = loaded.attn;
  m.moe_ = loaded.moe;

  if (Status st = check_hc_head_weights(m.weights_.tensors().hc_head, m.hc_); !st.ok()) return st.error();
  CEDAR_RETURN_IF_ERROR(model_detail::check_layer_hc_weights(m.plan_, m.weights_, m.hc_));
  return m;
}

Result<SequenceState> DeepseekV4Model::new_sequence(const SequenceOptions& options) const {
  if (options.mode != ForwardMode::Exact)
    return make_error("ced mode is unavailable for deepseek_v4 models (no causal encoder-decoder split; exact only)");
  SequenceState s;
  s.options_ = options;
  s.exact_swa_layers_ = plan_.num_layers();
  CEDAR_ASSIGN_OR_RETURN(s.attention_, AttentionState::create(plan_, attn_, options.kv, options.swa_history));
  return s;
}

Result<ForwardOutput> DeepseekV4Model::forward(std::span<const int64_t> tokens, SequenceState& state,
                                               const ForwardOptions& options) const {
  if (state.failed_) return make_error("forward: the sequence state is unusable after an earlier error");
  if (state.options_.mode != ForwardMode::Exact) return make_error("forward: deepseek_v4 runs exact mode only");
  CEDAR_RETURN_IF_ERROR(model_detail::check_token_ids(tokens, state.length_, config_.vocab_size));
  ForwardOutput out;
  out.vocab = config_.vocab_size;
  const int64_t n = static_cast<int64_t>(tokens.size()), d = config_.hidden_size, hc = config_.hc_mult;
  if (n == 0) return out;
  const int64_t pos0 = state.length_;
  ThreadPool* pool = options.pool;
  auto failed = [&](const Status& st, int64_t l, const char* what) -> Error {
    state.failed_ = true;
    return st.error().with_context("layer " + str(l) + " " + what + " at positions [" + str(pos0) + ", " +
                                   str(pos0 + n) + ")");
  };

  Buffers b;
  b.X.resize(static_cast<size_t>(n * hc * d));
  b.X_mid.resize(b.X.size());
  b.x.resize(static_cast<size_t>(n * d));
  b.xn.resize(b.x.size());
  b.y.resize(b.x.size());
  b.mix.resize(static_cast<size_t>(n));

  model_detail::embed_rows(config_, weights_.tensors().embed, tokens, b.x, b.X, pool);
  emit(options, "embed", pos0, n, d, b.x);

  // One mHC site: mix on `in`, collapse with its own pre, norm; `sublayer` fills b.y; expand into `out`.
  auto site = [&](std::vector<float>& in, const HcWeights& hw, std::span<const float> norm, std::vector<float>& dst,
                  const std::string& in_name, const std::string& out_name,
                  const std::function<Status()>& sublayer) -> Status {
    CEDAR_RETURN_IF_ERROR(hc_mix_rows(in, n, hw, hc_, b.mix, pool));
    for_rows(pool, n, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        hc_collapse(row(in, t, hc * d), b.mix[static_cast<size_t>(t)].pre, hc, d, row(b.x, t, d));
    });
    cpu::rms_norm(b.x, d, norm, config_.rms_norm_eps, b.xn);
    emit(options, in_name, pos0, n, d, b.xn);
    CEDAR_RETURN_IF_ERROR(sublayer());
    emit(options, out_name, pos0, n, d, b.y);
    for_rows(pool, n, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        hc_expand(row(b.y, t, d), row(in, t, hc * d), b.mix[static_cast<size_t>(t)], hc, d, row(dst, t, hc * d));
    });
    return Status::Ok();
  };

  AttentionScratch scratch;
  for (const LayerRole& role : plan_.layers) {
    const int64_t l = role.layer;
    const LayerWeights& W = weights_.tensors().layers[static_cast<size_t>(l)];
    const std::string prefix = "layers." + str(l) + ".";
    AttentionCall call;
    call.layer = l;
    call.role = &role;
    call.pos0 = pos0;
    call.n = n;
    Status st = site(b.X, W.hc_attn, W.attn_norm, b.X_mid, prefix + "attn_in", prefix + "attn_out", [&] {
      return attention_v4_forward(call, b.xn, W.attn, attn_, state.attention_, scratch, b.y, pool);
    });
    if (!st.ok()) return failed(st, l, "attention");
    if (options.sink && role.mode == AttnMode::V4Csa) {  // the indexer's picks (compressed-entry ids, then −1)
      const AttentionScratch::TopK& tk = scratch.topk_of(l);
      const std::vector<float> ids(tk.idx.begin(), tk.idx.end());
      emit(options, prefix + "topk", pos0, n, tk.width, ids);
    }
    st = site(b.X_mid, W.hc_ffn, W.ffn_norm, b.X, prefix + "ffn_in", prefix + "ffn_out",
              [&] { return moe_forward(b.xn, n, W.ffn, moe_, tokens, {}, b.y, pool); });
    if (!st.ok()) return failed(st, l, "MoE");
    emit(options, prefix + "out", pos0, n, hc * d, b.X);
  }
  state.length_ = pos0 + n;

  // Learned final collapse (hc_head), final RMSNorm, fp32 head.
  for_rows(pool, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      hc_head_collapse(row(b.X, t, hc * d), weights_.tensors().hc_head, hc_, row(b.x, t, d));
  });
  emit(options, "hc_head", pos0, n, d, b.x);
  cpu::rms_norm(b.x, d, weights_.tensors().final_norm, config_.rms_norm_eps, b.xn);
  emit(options, "final_norm", pos0, n, d, b.xn);
  if (options.logits == LogitRows::None) return out;
  Status st = model_detail::head_rows(config_, weights_.tensors().head, b.xn, n, pos0, options, out);
  if (!st.ok()) {
    state.failed_ = true;
    return st.error().with_context("head");
  }
  return out;
}

}  // namespace cedar
