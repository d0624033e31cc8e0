#include "model/attention_v4.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "model/compressor.h"
#include "model/forward_common.h"
#include "model/indexer.h"
#include "model/sparse_attention.h"

namespace cedar {
namespace {

constexpr size_t kKvFp8Block = 64;  // V4 main KV: FP8 blocks of 64 on the nope channels

using namespace model_detail;  // the helpers the CPU forwards share (forward_common.h)

Status check_weights(const AttentionWeights& w, const AttentionParams& p, const LayerRole& role) {
  const int64_t hq = p.n_heads * p.head_dim;
  CEDAR_RETURN_IF_ERROR(check_linear(w.wq_a, "wq_a", p.q_lora, p.dim));
  CEDAR_RETURN_IF_ERROR(check_linear(w.wq_b, "wq_b", hq, p.q_lora));
  CEDAR_RETURN_IF_ERROR(check_linear(w.wkv, "wkv", p.head_dim, p.dim));
  CEDAR_RETURN_IF_ERROR(check_linear(w.wo_a, "wo_a", p.o_groups * p.o_lora, hq / p.o_groups));
  if (w.wo_a.format != WeightFormat::BF16 && w.wo_a.format != WeightFormat::F32)
    return make_error("wo_a must be BF16 or F32 holding bf16 values (dequantized at load)");
  CEDAR_RETURN_IF_ERROR(check_linear(w.wo_b, "wo_b", p.dim, p.o_groups * p.o_lora));
  CEDAR_RETURN_IF_ERROR(check_vector(w.q_norm, "q_norm", p.q_lora));
  CEDAR_RETURN_IF_ERROR(check_vector(w.kv_norm, "kv_norm", p.head_dim));
  CEDAR_RETURN_IF_ERROR(check_vector(w.attn_sink, "attn_sink", p.n_heads));
  if (role.mode == AttnMode::V4Csa) {
    CEDAR_RETURN_IF_ERROR(check_linear(w.wq_b_i, "indexer.wq_b", p.index_heads * p.index_head_dim, p.q_lora));
    CEDAR_RETURN_IF_ERROR(check_linear(w.weights_proj, "indexer.weights_proj", p.index_heads, p.dim));
  }
  return Status::Ok();
}

// Main cache entry of each new window: RoPE at j·ratio, FP8 QDQ of the nope channels.
Status append_main_entries(const CompressedGroups& g, const cpu::RopeTable& rope, int64_t rope_dim, KvSourceState& src) {
  const int64_t hd = src.kv.width();
  std::vector<float> entry(static_cast<size_t>(hd));
  for (int64_t i = 0; i < g.count; ++i) {
    const int64_t pos = (g.first_group + i) * src.ratio;
    std::copy_n(g.latent.begin() + i * hd, hd, entry.begin());
    rope.apply(entry, 1, hd, pos);
    qdq_fp8_ue8m0(std::span<float>(entry).first(static_cast<size_t>(hd - rope_dim)), kKvFp8Block);
    CEDAR_RETURN_IF_ERROR(src.kv.append(entry, pos));
  }
  return Status::Ok();
}

// Indexer key of each new window: RoPE at j·ratio, Hadamard rotation, FP4 QDQ (block 32, UE8M0).
Status append_index_entries(const CompressedGroups& g, const cpu::RopeTable& rope, KvSourceState& src) {
  const int64_t ih = src.index_k.width();
  std::vector<float> entry(static_cast<size_t>(ih));
  for (int64_t i = 0; i < g.count; ++i) {
    const int64_t pos = (g.first_group + i) * src.ratio;
    std::copy_n(g.latent.begin() + i * ih, ih, entry.begin());
    rope.apply(entry, 1, ih, pos);
    CEDAR_RETURN_IF_ERROR(hadamard_rotate(entry, ih));
    CEDAR_RETURN_IF_ERROR(qdq_fp4_block32_ue8m0(entry));
    CEDAR_RETURN_IF_ERROR(src.index_k.append(entry, pos));
  }
  return Status::Ok();
}

}  // namespace

void v4_query_norm(std::span<float> q, int64_t width, double eps) {
  for (size_t v0 = 0; v0 < q.size(); v0 += static_cast<size_t>(width)) {
    float* v = q.data() + v0;
    float ss = 0.0f;
    for (int64_t c = 0; c < width; ++c) ss += round_to_bf16(v[c] * v[c]);
    const float ms = round_to_bf16(ss / static_cast<float>(width));
    const float r = round_to_bf16(1.0f / std::sqrt(round_to_bf16(ms + static_cast<float>(eps))));
    for (int64_t c = 0; c < width; ++c) v[c] = round_to_bf16(v[c] * r);
  }
}

Status attention_v4_forward(const AttentionCall& call, std::span<const float> x, const AttentionWeights& w,
                            const AttentionParams& p, AttentionState& st, AttentionScratch& scratch,
                            std::span<float> out, ThreadPool* pool) {
  const std::string where = "attention layer " + str(call.layer);
  auto fail = [&](const std::string& what) -> Status { return make_error(where + ": " + what); };
  auto ctx = [&](Status s) { return s.ok() ? s : Status(s.error().with_context(where)); };
  if (call.role == nullptr || call.role->layer != call.layer) return fail("call has no role for this layer");
  const LayerRole& role = *call.role;
  if (call.layer < 0 || call.layer >= static_cast<int64_t>(st.rings.size()))
    return fail("the attention state has " + str(static_cast<int64_t>(st.rings.size())) + " layers");
  if (role.mode != AttnMode::SwaOnly && role.mode != AttnMode::V4Csa && role.mode != AttnMode::V4Hca)
    return fail("not a DeepSeek-V4 layer (mode " + std::string(attn_mode_name(role.mode)) + ")");
  if (call.pass != AttentionPass::Exact || call.swa_start != 0)
    return fail("DeepSeek-V4 attention runs exact passes only (no bounded replay)");
  const int64_t n = call.n, pos0 = call.pos0, hd = p.head_dim, rd = p.rope_dim;
  if (n <= 0 || pos0 < 0) return fail("empty chunk or negative position (pos0 " + str(pos0) + ", n " + str(n) + ")");
  if (static_cast<int64_t>(x.size()) != n * p.dim || static_cast<int64_t>(out.size()) != n * p.dim)
    return fail("x / out hold " + str(static_cast<int64_t>(x.size())) + " / " + str(static_cast<int64_t>(out.size())) +
                " values, expected " + str(n) + "×" + str(p.dim));
  CEDAR_RETURN_IF_ERROR(ctx(check_weights(w, p, role)));
  const int64_t ratio = role.compress_ratio;
  KvSourceState* src = nullptr;
  if (ratio > 0) {
    src = st.source(call.layer);
    if (src == nullptr || src->ratio != ratio) return fail("no ratio-" + str(ratio) + " compressor state");
    if (src->consumed() != pos0)
      return fail("chunk starts at position " + str(pos0) + " but the compressor has consumed " + str(src->consumed()) +
                  " positions");
  }
  SwaRing& ring = st.rings[static_cast<size_t>(call.layer)];
  if (ring.slots() < p.window || ring.width() != hd)
    return fail("ring has " + str(ring.slots()) + "×" + str(ring.width()) + " slots, expected at least " +
                str(p.window) + "×" + str(hd));
  for (int64_t k = std::max<int64_t>(0, pos0 - p.window + 1); k < pos0; ++k)
    if (!ring.holds(k)) return fail("SWA key of position " + str(k) + " is not in the ring");

  const cpu::RopeTable& rope = p.rope_for(role);
  const cpu::LinearOptions lin{.bf16_output = true, .act_block = p.act_block};
  // Query.
  std::vector<float> qa(static_cast<size_t>(n * p.q_lora)), qr(qa.size());
  CEDAR_RETURN_IF_ERROR(ctx(cpu::linear(w.wq_a, x, n, qa, lin, pool)));
  cpu::rms_norm(qa, p.q_lora, w.q_norm, p.eps, qr);
  const int64_t hq = p.n_heads * hd;
  std::vector<float> q(static_cast<size_t>(n * hq));
  CEDAR_RETURN_IF_ERROR(ctx(cpu::linear(w.wq_b, qr, n, q, lin, pool)));
  v4_query_norm(q, hd, p.eps);
  for (int64_t t = 0; t < n; ++t)
    rope.apply(std::span<float>(q).subspan(static_cast<size_t>(t * hq), static_cast<size_t>(hq)), p.n_heads, hd,
               pos0 + t);
  // The layer's own SWA KV.
  std::vector<float> k(static_cast<size_t>(n * hd)), kv(k.size());
  CEDAR_RETURN_IF_ERROR(ctx(cpu::linear(w.wkv, x, n, k, lin, pool)));
  cpu::rms_norm(k, hd, w.kv_norm, p.eps, kv);
  for (int64_t t = 0; t < n; ++t) {
    std::span<float> row(kv.data() + t * hd, static_cast<size_t>(hd));
    rope.apply(row, 1, hd, pos0 + t);
    qdq_fp8_ue8m0(row.first(static_cast<size_t>(hd - rd)), kKvFp8Block);
  }

  // Compressed entries (and, for CSA, the indexer's keys and this chunk's top-k).
  const AttentionScratch::TopK* topk = nullptr;
  if (ratio > 0) {
    CompressedGroups groups;
    CEDAR_RETURN_IF_ERROR(compress_chunk_v4({.wkv = &w.wkv_c, .wgate = &w.wgate_c, .ape = w.ape_c, .norm = w.norm_c},
                                            {.ratio = ratio, .width = hd, .layer = call.layer, .name = "compressor"},
                                            p.eps, x, n, src->kv.size(), src->v4_kv, groups, pool));
    CEDAR_RETURN_IF_ERROR(ctx(append_main_entries(groups, rope, rd, *src)));
    if (role.mode == AttnMode::V4Csa) {
      CompressedGroups igroups;
      CEDAR_RETURN_IF_ERROR(compress_chunk_v4(
          {.wkv = &w.wkv_ic, .wgate = &w.wgate_ic, .ape = w.ape_ic, .norm = w.norm_ic},
          {.ratio = ratio, .width = p.index_head_dim, .layer = call.layer, .name = "indexer.compressor"}, p.eps, x, n,
          src->index_k.size(), src->v4_index, igroups, pool));
      CEDAR_RETURN_IF_ERROR(ctx(append_index_entries(igroups, rope, *src)));
      IndexQueries iq;
      CEDAR_RETURN_IF_ERROR(ctx(index_queries({.wq_b = &w.wq_b_i,
                                               .weights_proj = &w.weights_proj,
                                               .qr = qr,
                                               .x = x,
                                               .n = n,
                                               .pos0 = pos0,
                                               .hadamard = true},
                                              p, rope, iq, pool)));
      CEDAR_RETURN_IF_ERROR(
          run_indexer({.role = &role, .source = src, .queries = &iq, .pos0 = pos0, .n = n}, p, scratch, pool));
      topk = &scratch.topk_of(call.layer);
    }
  }

  const SparseAttentionShape shape{.n_heads = p.n_heads,
                                   .head_dim = hd,
                                   .scale = static_cast<float>(std::pow(1.0 / static_cast<double>(hd), 0.5)),
                                   .bf16_probabilities = p.bf16_probabilities};
  // Window keys before the chunk and the compressed entries, decoded once from their containers.
  const int64_t ring_first = std::max<int64_t>(0, pos0 - p.window + 1);
  std::vector<float> ring_kv(static_cast<size_t>(std::max<int64_t>(0, pos0 - ring_first) * hd));
  for (int64_t j = ring_first; j < pos0; ++j)
    ring.read(j, std::span<float>(ring_kv).subspan(static_cast<size_t>((j - ring_first) * hd), static_cast<size_t>(hd)));
  std::vector<float> entries(static_cast<size_t>(src != nullptr ? src->kv.size() * hd : 0));
  for (int64_t j = 0; src != nullptr && j < src->kv.size(); ++j)
    src->kv.read(j, std::span<float>(entries).subspan(static_cast<size_t>(j * hd), static_cast<size_t>(hd)));
  std::vector<float> o(static_cast<size_t>(n * hq));
  auto rows = [&](int64_t t0, int64_t t1) {
    std::vector<const float*> keys;
    std::vector<float> work;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t pos = pos0 + t;
      keys.clear();
      for (int64_t j = std::max<int64_t>(0, pos - p.window + 1); j <= pos; ++j)
        keys.push_back(j >= pos0 ? kv.data() + (j - pos0) * hd : ring_kv.data() + (j - ring_first) * hd);
      if (topk != nullptr) {
        for (int64_t i = 0; i < topk->width; ++i) {
          const int32_t j = topk->idx[static_cast<size_t>(t * topk->width + i)];
          if (j < 0) break;
          keys.push_back(entries.data() + j * hd);
        }
      } else if (ratio > 0) {  // HCA: every visible entry
        for (int64_t j = 0; j < (pos + 1) / ratio; ++j) keys.push_back(entries.data() + j * hd);
      }
      std::span<float> ot(o.data() + t * hq, static_cast<size_t>(hq));
      sparse_attention_row(std::span<const float>(q).subspan(static_cast<size_t>(t * hq), static_cast<size_t>(hq)),
                           keys, w.attn_sink, shape, ot, work);
      rope.apply(ot, p.n_heads, hd, pos, /*inverse=*/true);
    }
  };
  if (pool)
    pool->parallel_for(n, rows, 1);
  else
    rows(0, n);

  for (int64_t t = std::max<int64_t>(0, n - ring.slots()); t < n; ++t)
    CEDAR_RETURN_IF_ERROR(
        ctx(ring.write(pos0 + t, std::span<const float>(kv).subspan(static_cast<size_t>(t * hd), static_cast<size_t>(hd)))));
  return ctx(attention_output_projection(o, n, w, p, out, pool));
}

}  // namespace cedar
