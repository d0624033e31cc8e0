#include "model/deepseek_v4.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/numeric.h"
#include "model/attention_v4.h"

namespace cedar {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

void for_rows(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool && n > 1)
    pool->parallel_for(n, fn);
  else
    fn(0, n);
}

template <typename T>
std::span<T> row(std::vector<T>& v, int64_t t, int64_t width) {
  return std::span<T>(v).subspan(static_cast<size_t>(t * width), static_cast<size_t>(width));
}

void emit(const ForwardOptions& o, const std::string& name, int64_t pos0, int64_t rows, int64_t width,
          std::span<const float> data) {
  if (o.sink) o.sink(TensorRecord{name, pos0, rows, width, data.first(static_cast<size_t>(rows * width))});
}

// Activations of one chunk.
struct Buffers {
  std::vector<float> X, X_mid;  // [n, hc·d] residual streams
  std::vector<HcMix> mix;       // [n] coefficients of the current site
  std::vector<float> x, xn, y;  // [n, d] collapsed, normed, sublayer output
};

}  // namespace

Result<DeepseekV4Model> DeepseekV4Model::load(const std::filesystem::path& path, const LoadOptions& options) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return make_error(path.string() + ": no such model directory or file");
  const std::filesystem::path dir = std::filesystem::is_directory(path) ? path : path.parent_path();
  DeepseekV4Model m;
  CEDAR_ASSIGN_OR_RETURN(m.config_, load_model_config(dir));
  const ModelConfig& c = m.config_;
  if (c.arch != Arch::DeepseekV4)
    return make_error(c.source + ": DeepseekV4Model loads deepseek_v4 checkpoints (config is " +
                      std::string(arch_name(c.arch)) + ")");
  CEDAR_ASSIGN_OR_RETURN(m.plan_, build_layer_plan(c));
  CEDAR_ASSIGN_OR_RETURN(io::Checkpoint ckpt, io::Checkpoint::open(path));
  CEDAR_ASSIGN_OR_RETURN(m.weights_, BoundWeights::bind(std::move(ckpt), c, m.plan_, options.pool));

  m.hc_ = HcParams{c.hc_mult, c.hidden_size, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps};
  CEDAR_ASSIGN_OR_RETURN(m.attn_, attention_params_from_config(c));
  m.moe_ = moe_params_from_config(c);

  if (Status st = check_hc_head_weights(m.weights_.tensors().hc_head, m.hc_); !st.ok()) return st.error();
  for (const LayerRole& role : m.plan_.layers) {
    const LayerWeights& w = m.weights_.tensors().layers[static_cast<size_t>(role.layer)];
    for (const HcWeights* hc : {&w.hc_attn, &w.hc_ffn}) {
      Status st = check_hc_weights(*hc, m.hc_);
      if (!st.ok()) return st.error().with_context("layer " + str(role.layer) + " mHC");
    }
  }
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
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size)
      return make_error("forward: token " + str(tokens[i]) + " at position " +
                        str(state.length_ + static_cast<int64_t>(i)) + " is outside the vocabulary [0, " +
                        str(config_.vocab_size) + ")");
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

  const cpu::LinearWeight& embed = weights_.tensors().embed;
  for_rows(pool, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* e = embed.data + 2 * tokens[static_cast<size_t>(t)] * d;
      std::span<float> x = row(b.x, t, d);
      for (int64_t c = 0; c < d; ++c) x[c] = bf16_to_f32(static_cast<uint16_t>(e[2 * c] | (e[2 * c + 1] << 8)));
      for (int64_t k = 0; k < hc; ++k) std::copy(x.begin(), x.end(), row(b.X, t, hc * d).begin() + k * d);
    }
  });
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
  const int64_t first = options.logits == LogitRows::Last ? n - 1 : 0;
  const int64_t m = n - first, vocab = config_.vocab_size;
  out.logits.resize(static_cast<size_t>(m * vocab));
  Status st = cpu::linear(weights_.tensors().head, std::span<const float>(b.xn).subspan(static_cast<size_t>(first * d)),
                          m, out.logits, cpu::LinearOptions{.bf16_output = false}, pool);
  if (!st.ok()) {
    state.failed_ = true;
    return st.error().with_context("head");
  }
  for (int64_t t = first; t < n; ++t) out.positions.push_back(pos0 + t);
  emit(options, "logits", pos0 + first, m, vocab, out.logits);
  return out;
}

}  // namespace cedar
