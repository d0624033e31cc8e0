#include "model/compressor.h"

#include <algorithm>
#include <string>

#include "core/numeric.h"
#include "model/sparse_attention.h"

namespace cedar {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

Status check_weight(const cpu::LinearWeight* w, const char* name, int64_t out, int64_t in, int64_t layer) {
  if (w == nullptr || w->data == nullptr)
    return make_error("layer " + str(layer) + ": compressor." + name + " is missing");
  if (w->out != out || w->in != in)
    return make_error("layer " + str(layer) + ": compressor." + name + " is [" + str(w->out) + ", " + str(w->in) +
                      "], expected [" + str(out) + ", " + str(in) + "]");
  return Status::Ok();
}

}  // namespace

Status compress_chunk(const CompressorWeights& w, double eps, std::span<const float> x, int64_t n,
                      KvSourceState& src, CompressedGroups& out, ThreadPool* pool) {
  const int64_t hd = src.kv.width();
  const int64_t r = src.ratio;
  out.first_group = src.kv.size();
  out.count = 0;
  out.latent.clear();
  if (n <= 0) return Status::Ok();
  const int64_t dim = static_cast<int64_t>(x.size()) / n;
  CEDAR_RETURN_IF_ERROR(check_weight(w.wkv, "wkv", hd, dim, src.layer));
  if (static_cast<int64_t>(w.norm.size()) != hd)
    return make_error("layer " + str(src.layer) + ": compressor.norm has " + str(static_cast<int64_t>(w.norm.size())) +
                      " values, expected " + str(hd));

  if (r == 1) {  // every token is its own group: BF16 GEMM (bf16 output) + norm
    std::vector<float> k(static_cast<size_t>(n * hd));
    CEDAR_RETURN_IF_ERROR(cpu::linear(*w.wkv, x, n, k, {.bf16_output = true}, pool));
    out.latent.resize(k.size());
    cpu::rms_norm(k, hd, w.norm, eps, out.latent);
    out.count = n;
    return Status::Ok();
  }
  if (r < 1) return make_error("layer " + str(src.layer) + ": compress ratio " + str(r) + " has no compressor");
  CEDAR_RETURN_IF_ERROR(check_weight(w.wgate, "wgate", hd, dim, src.layer));

  // fp32 projections (the reference holds wkv/wgate in fp32 above ratio 1).
  std::vector<float> kv(static_cast<size_t>(n * hd)), gate(static_cast<size_t>(n * hd));
  CEDAR_RETURN_IF_ERROR(cpu::linear(*w.wkv, x, n, kv, {.bf16_output = false}, pool));
  CEDAR_RETURN_IF_ERROR(cpu::linear(*w.wgate, x, n, gate, {.bf16_output = false}, pool));

  // Rows in position order: the buffered tokens of the open group, then the chunk.
  const int64_t pending = src.pending;
  const int64_t total = pending + n;
  const int64_t groups = total / r;
  auto row = [&](const std::vector<float>& buffered, const std::vector<float>& chunk, int64_t i) {
    return i < pending ? buffered.data() + i * hd : chunk.data() + (i - pending) * hd;
  };
  std::vector<float> pooled(static_cast<size_t>(groups * hd));
  std::vector<float> e(static_cast<size_t>(r));
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t c = 0; c < hd; ++c) {
      float m = row(src.pending_gate, gate, g * r)[c];
      for (int64_t t = 1; t < r; ++t) m = std::max(m, row(src.pending_gate, gate, g * r + t)[c]);
      float sum = 0.0f;
      for (int64_t t = 0; t < r; ++t) {
        e[t] = exp_f32(row(src.pending_gate, gate, g * r + t)[c] - m);
        sum += e[t];
      }
      float acc = 0.0f;
      for (int64_t t = 0; t < r; ++t) acc += row(src.pending_kv, kv, g * r + t)[c] * (e[t] / sum);
      pooled[static_cast<size_t>(g * hd + c)] = round_to_bf16(acc);
    }
  }
  out.latent.resize(pooled.size());
  cpu::rms_norm(pooled, hd, w.norm, eps, out.latent);
  out.count = groups;

  // Keep the tokens of the new open group (fp32, exactly as projected).
  std::vector<float> next_kv, next_gate;
  for (int64_t i = groups * r; i < total; ++i) {
    next_kv.insert(next_kv.end(), row(src.pending_kv, kv, i), row(src.pending_kv, kv, i) + hd);
    next_gate.insert(next_gate.end(), row(src.pending_gate, gate, i), row(src.pending_gate, gate, i) + hd);
  }
  src.pending_kv = std::move(next_kv);
  src.pending_gate = std::move(next_gate);
  src.pending = total - groups * r;
  return Status::Ok();
}

Status append_cache_entries(const CompressedGroups& groups, const CacheWriteParams& p, KvSourceState& src,
                            ThreadPool* pool) {
  const int64_t hd = src.kv.width();
  const int64_t ih = src.index_k.width();
  if (groups.first_group != src.kv.size())
    return make_error("layer " + str(src.layer) + ": compressed groups start at " + str(groups.first_group) +
                      " but the cache holds " + str(src.kv.size()) + " entries");
  if (groups.count == 0) return Status::Ok();
  if (p.rope == nullptr) return make_error("layer " + str(src.layer) + ": no rope table for the compressed cache");

  if (p.wk != nullptr) {
    if (src.index_k.size() != src.kv.size())
      return make_error("layer " + str(src.layer) + ": indexer-K cache has " + str(src.index_k.size()) +
                        " entries, main cache " + str(src.kv.size()));
    if (p.wk->out != ih || p.wk->in != hd)
      return make_error("layer " + str(src.layer) + ": indexer.wk is [" + str(p.wk->out) + ", " + str(p.wk->in) +
                        "], expected [" + str(ih) + ", " + str(hd) + "]");
    if (static_cast<int64_t>(p.k_norm.size()) != ih)
      return make_error("layer " + str(src.layer) + ": indexer.k_norm has " +
                        str(static_cast<int64_t>(p.k_norm.size())) + " values, expected " + str(ih));
    std::vector<float> k(static_cast<size_t>(groups.count * ih)), kn(k.size());
    CEDAR_RETURN_IF_ERROR(cpu::linear(*p.wk, groups.latent, groups.count, k, {.bf16_output = true}, pool));
    cpu::rms_norm(k, ih, p.k_norm, p.eps, kn);
    for (int64_t i = 0; i < groups.count; ++i) {
      const int64_t pos = (groups.first_group + i) * src.ratio;
      std::span<float> ki(kn.data() + i * ih, static_cast<size_t>(ih));
      p.rope->apply(ki, 1, ih, pos);
      CEDAR_RETURN_IF_ERROR(append_quantized(src.index_k, ki, pos, KvRecipe::Fp4Block32Ue8m0));
    }
  }
  std::vector<float> entry(static_cast<size_t>(hd));
  for (int64_t i = 0; i < groups.count; ++i) {
    const int64_t pos = (groups.first_group + i) * src.ratio;
    std::copy_n(groups.latent.begin() + i * hd, hd, entry.begin());
    p.rope->apply(entry, 1, hd, pos);
    CEDAR_RETURN_IF_ERROR(append_quantized(src.kv, entry, pos, KvRecipe::Fp4Block16E4m3));
  }
  return Status::Ok();
}

}  // namespace cedar
