#include "model/forward_common.h"

#include <algorithm>
#include <system_error>
#include <utility>

#include "core/numeric.h"

namespace cedar::model_detail {

Status check_linear(const cpu::LinearWeight& w, const std::string& name, int64_t out, int64_t in) {
  if (w.data == nullptr) return make_error(name + " is missing");
  if (w.out != out || w.in != in)
    return make_error(name + " is [" + str(w.out) + ", " + str(w.in) + "], expected [" + str(out) + ", " + str(in) +
                      "]");
  return Status::Ok();
}

Status check_vector(std::span<const float> v, const std::string& name, int64_t size) {
  if (static_cast<int64_t>(v.size()) != size)
    return make_error(name + " has " + str(static_cast<int64_t>(v.size())) + " values, expected " + str(size));
  return Status::Ok();
}

Result<LoadedModel> load_model(const std::filesystem::path& path, Arch arch, std::string_view expects,
                               ThreadPool* pool) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return make_error(path.string() + ": no such model directory or file");
  LoadedModel m;
  m.dir = std::filesystem::is_directory(path) ? path : path.parent_path();
  CEDAR_ASSIGN_OR_RETURN(m.config, load_model_config(m.dir));
  const ModelConfig& c = m.config;
  if (c.arch != arch)
    return make_error(c.source + ": " + std::string(expects) + " (config is " + std::string(arch_name(c.arch)) + ")");
  CEDAR_ASSIGN_OR_RETURN(m.plan, build_layer_plan(c));
  CEDAR_ASSIGN_OR_RETURN(io::Checkpoint ckpt, io::Checkpoint::open(path));
  CEDAR_ASSIGN_OR_RETURN(m.weights, BoundWeights::bind(std::move(ckpt), c, m.plan, pool));
  m.hc = HcParams{c.hc_mult, c.hidden_size, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps};
  CEDAR_ASSIGN_OR_RETURN(m.attn, attention_params_from_config(c));
  m.moe = moe_params_from_config(c);
  return m;
}

Status check_layer_hc_weights(const LayerPlan& plan, const BoundWeights& weights, const HcParams& hc) {
  for (const LayerRole& role : plan.layers) {
    const LayerWeights& w = weights.tensors().layers[static_cast<size_t>(role.layer)];
    for (const HcWeights* site : {&w.hc_attn, &w.hc_ffn}) {
      Status st = check_hc_weights(*site, hc);
      if (!st.ok()) return st.error().with_context("layer " + str(role.layer) + " mHC");
    }
  }
  return Status::Ok();
}

Status check_token_ids(std::span<const int64_t> tokens, int64_t pos0, int64_t vocab) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      return make_error("forward: token " + str(tokens[i]) + " at position " + str(pos0 + static_cast<int64_t>(i)) +
                        " is outside the vocabulary [0, " + str(vocab) + ")");
  return Status::Ok();
}

void embed_rows(const ModelConfig& c, const cpu::LinearWeight& embed, std::span<const int64_t> tokens,
                std::vector<float>& x, std::vector<float>& X, ThreadPool* pool) {
  const int64_t n = static_cast<int64_t>(tokens.size()), d = c.hidden_size, hc = c.hc_mult;
  for_rows(pool, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* e = embed.data + 2 * tokens[static_cast<size_t>(t)] * d;
      std::span<float> xt = row(x, t, d);
      for (int64_t k = 0; k < d; ++k) xt[k] = bf16_to_f32(static_cast<uint16_t>(e[2 * k] | (e[2 * k + 1] << 8)));
      for (int64_t k = 0; k < hc; ++k) std::copy(xt.begin(), xt.end(), row(X, t, hc * d).begin() + k * d);
    }
  });
}

Status head_rows(const ModelConfig& c, const cpu::LinearWeight& head, const std::vector<float>& xn, int64_t n,
                 int64_t pos0, const ForwardOptions& options, ForwardOutput& out) {
  const int64_t d = c.hidden_size, vocab = c.vocab_size;
  const int64_t first = options.logits == LogitRows::Last ? n - 1 : 0;
  const int64_t m = n - first;
  const auto h = std::span<const float>(xn).subspan(static_cast<size_t>(first * d));
  const size_t offset = out.logits.size();
  out.logits.resize(offset + static_cast<size_t>(m * vocab));
  const auto logits = std::span<float>(out.logits).subspan(offset);
  CEDAR_RETURN_IF_ERROR(cpu::linear(head, h, m, logits, cpu::LinearOptions{.bf16_output = false}, options.pool));
  for (int64_t t = first; t < n; ++t) out.positions.push_back(pos0 + t);
  emit(options, "logits", pos0 + first, m, vocab, logits);
  return Status::Ok();
}

}  // namespace cedar::model_detail
