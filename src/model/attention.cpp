#include "model/attention.h"

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

using namespace model_detail;  // the helpers the CPU forwards share (forward_common.h)

Status check_own_weights(const AttentionWeights& w, const AttentionParams& p) {
  const int64_t hq = p.n_heads * p.head_dim;
  CEDAR_RETURN_IF_ERROR(check_linear(w.wq_a, "wq_a", p.q_lora, p.dim));
  CEDAR_RETURN_IF_ERROR(check_linear(w.wq_b, "wq_b", hq, p.q_lora));
  CEDAR_RETURN_IF_ERROR(check_linear(w.wkv, "wkv", p.head_dim, p.dim));
  CEDAR_RETURN_IF_ERROR(check_linear(w.wo_a, "wo_a", p.o_groups * p.o_lora, hq / p.o_groups));
  if (w.wo_a.format != WeightFormat::BF16 && w.wo_a.format != WeightFormat::F32)
    return make_error("wo_a must be BF16 or F32 holding bf16 values (dequantized at load), got " +
                      std::string(weight_format_name(w.wo_a.format)));
  CEDAR_RETURN_IF_ERROR(check_linear(w.wo_b, "wo_b", p.dim, p.o_groups * p.o_lora));
  CEDAR_RETURN_IF_ERROR(check_vector(w.q_norm, "q_norm", p.q_lora));
  CEDAR_RETURN_IF_ERROR(check_vector(w.kv_norm, "kv_norm", p.head_dim));
  CEDAR_RETURN_IF_ERROR(check_vector(w.attn_sink, "attn_sink", p.n_heads));
  return Status::Ok();
}

// qr = RMSNorm_q(wq_a·x) [n, q_lora]; q = RoPE(wq_b·qr) [n, heads·head_dim].
Status query_path(std::span<const float> x, int64_t n, int64_t pos0, const AttentionWeights& w,
                  const AttentionParams& p, const cpu::RopeTable& rope, std::vector<float>& qr,
                  std::vector<float>& q, ThreadPool* pool) {
  std::vector<float> qa(static_cast<size_t>(n * p.q_lora));
  CEDAR_RETURN_IF_ERROR(cpu::linear(w.wq_a, x, n, qa, {}, pool));
  qr.resize(qa.size());
  cpu::rms_norm(qa, p.q_lora, w.q_norm, p.eps, qr);
  const int64_t hq = p.n_heads * p.head_dim;
  q.resize(static_cast<size_t>(n * hq));
  CEDAR_RETURN_IF_ERROR(cpu::linear(w.wq_b, qr, n, q, {}, pool));
  for (int64_t t = 0; t < n; ++t)
    rope.apply(std::span<float>(q).subspan(static_cast<size_t>(t * hq), static_cast<size_t>(hq)), p.n_heads,
               p.head_dim, pos0 + t);
  return Status::Ok();
}

// The layer's own SWA KV for the chunk: FP8-QDQ(RoPE(RMSNorm_kv(wkv·x))) [n, head_dim]. The rows
// before quantization of the last `slots` positions go to `ring_raw` (the ring quantizes on write).
Status window_kv(std::span<const float> x, int64_t n, int64_t pos0, int64_t slots, const AttentionWeights& w,
                 const AttentionParams& p, const cpu::RopeTable& rope, std::vector<float>& kv,
                 std::vector<float>& ring_raw, ThreadPool* pool) {
  std::vector<float> k(static_cast<size_t>(n * p.head_dim));
  CEDAR_RETURN_IF_ERROR(cpu::linear(w.wkv, x, n, k, {}, pool));
  kv.resize(k.size());
  cpu::rms_norm(k, p.head_dim, w.kv_norm, p.eps, kv);
  const int64_t first_kept = std::max<int64_t>(0, n - slots);
  ring_raw.clear();
  for (int64_t t = 0; t < n; ++t) {
    std::span<float> row(kv.data() + t * p.head_dim, static_cast<size_t>(p.head_dim));
    rope.apply(row, 1, p.head_dim, pos0 + t);
    if (t >= first_kept) ring_raw.insert(ring_raw.end(), row.begin(), row.end());
    CEDAR_RETURN_IF_ERROR(qdq_fp8_block32_ue8m0(row));
  }
  return Status::Ok();
}

}  // namespace

// out = wo_b · concat_g(wo_a[g] · o_g): block-diagonal BF16 projection per group of heads (bf16
// output, no activation quantization), then the FP8 GEMM.
Status attention_output_projection(std::span<const float> o, int64_t n, const AttentionWeights& w,
                                   const AttentionParams& p, std::span<float> out, ThreadPool* pool) {
  const int64_t in_g = p.n_heads * p.head_dim / p.o_groups;
  const int64_t elem = w.wo_a.format == WeightFormat::BF16 ? 2 : 4;
  std::vector<float> og(static_cast<size_t>(n * in_g)), ug(static_cast<size_t>(n * p.o_lora));
  std::vector<float> u(static_cast<size_t>(n * p.o_groups * p.o_lora));
  for (int64_t g = 0; g < p.o_groups; ++g) {
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(o.begin() + t * p.n_heads * p.head_dim + g * in_g, in_g, og.begin() + t * in_g);
    cpu::LinearWeight wg = w.wo_a;
    wg.out = p.o_lora;
    wg.data = w.wo_a.data + g * p.o_lora * in_g * elem;
    CEDAR_RETURN_IF_ERROR(cpu::linear(wg, og, n, ug, {}, pool));
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(ug.begin() + t * p.o_lora, p.o_lora, u.begin() + (t * p.o_groups + g) * p.o_lora);
  }
  return cpu::linear(w.wo_b, u, n, out, {.act_block = p.act_block}, pool);
}

Status attention_forward(const AttentionCall& call, std::span<const float> x, const AttentionWeights& w,
                         const AttentionParams& p, AttentionState& st, AttentionScratch& scratch,
                         std::span<float> out, ThreadPool* pool) {
  const std::string where = "attention layer " + str(call.layer);
  auto fail = [&](const std::string& what) -> Status { return make_error(where + ": " + what); };
  if (call.role == nullptr || call.role->layer != call.layer) return fail("call has no role for this layer");
  const LayerRole& role = *call.role;
  if (call.layer < 0 || call.layer >= static_cast<int64_t>(st.rings.size()))
    return fail("the attention state has " + str(static_cast<int64_t>(st.rings.size())) + " layers");
  if (role.mode == AttnMode::V4Csa || role.mode == AttnMode::V4Hca)
    return fail("V4 compressed attention is not implemented by the V4.1 attention module");
  const int64_t n = call.n, pos0 = call.pos0;
  if (n <= 0 || pos0 < 0) return fail("empty chunk or negative position (pos0 " + str(pos0) + ", n " + str(n) + ")");
  if (call.swa_start < 0 || call.swa_start > pos0)
    return fail("swa_start " + str(call.swa_start) + " must lie in [0, pos0 = " + str(pos0) + "]");
  if (static_cast<int64_t>(x.size()) != n * p.dim)
    return fail("x has " + str(static_cast<int64_t>(x.size())) + " values, expected " + str(n) + "×" + str(p.dim));
  const bool attend = call.pass != AttentionPass::GlobalKvOnly;
  if (attend && static_cast<int64_t>(out.size()) != n * p.dim)
    return fail("out has " + str(static_cast<int64_t>(out.size())) + " values, expected " + str(n) + "×" + str(p.dim));
  if (!attend && !role.owns_compressor) return fail("GlobalKvOnly needs a KV source layer");

  const int64_t ratio = role.compress_ratio;
  const cpu::RopeTable& rope = p.rope_for(role);
  auto ctx = [&](Status s) { return s.ok() ? s : Status(s.error().with_context(where)); };

  // Everything is validated before the state changes.
  KvSourceState* src = nullptr;
  if (ratio > 0) {
    src = st.source(role.kv_source);
    if (src == nullptr || src->ratio != ratio)
      return fail("KV source layer " + str(role.kv_source) + " has no ratio-" + str(ratio) + " cache in the state");
  }
  const bool compress = role.owns_compressor && call.pass != AttentionPass::SwaReplay;
  if (compress) {
    if (src->consumed() != pos0)
      return fail("chunk starts at position " + str(pos0) + " but the compressor has consumed " +
                  str(src->consumed()) + " positions");
    CEDAR_RETURN_IF_ERROR(ctx(check_linear(w.wkv_c, "compressor.wkv", p.head_dim, p.dim)));
    if (role.compressor_has_gate)
      CEDAR_RETURN_IF_ERROR(ctx(check_linear(w.wgate_c, "compressor.wgate", p.head_dim, p.dim)));
    CEDAR_RETURN_IF_ERROR(ctx(check_vector(w.norm_c, "compressor.norm", p.head_dim)));
    if (role.owns_indexer_keys) {
      CEDAR_RETURN_IF_ERROR(ctx(check_linear(w.wk, "indexer.wk", p.index_head_dim, p.head_dim)));
      CEDAR_RETURN_IF_ERROR(ctx(check_vector(w.k_norm, "indexer.k_norm", p.index_head_dim)));
    }
    if (!accepts_recipe(src->kv.format(), KvRecipe::Fp4Block16E4m3) ||
        (role.owns_indexer_keys && !accepts_recipe(src->index_k.format(), KvRecipe::Fp4Block32Ue8m0)))
      return fail("KV source caches store " + src->kv.format().name() + " / " + src->index_k.format().name() +
                  ", expected the V4.1 FP4 formats or raw fp32");
  } else if (src != nullptr && src->kv.size() < (pos0 + n) / ratio) {
    return fail("KV source layer " + str(role.kv_source) + " has " + str(src->kv.size()) +
                " compressed entries, the chunk ending at " + str(pos0 + n) + " needs " + str((pos0 + n) / ratio));
  }
  SwaRing& ring = st.rings[static_cast<size_t>(call.layer)];
  if (attend) {
    CEDAR_RETURN_IF_ERROR(ctx(check_own_weights(w, p)));
    // Slots beyond the window keep older positions for prefix-cache snapshots (swa_history).
    if (ring.slots() < p.window || ring.width() != p.head_dim)
      return fail("ring has " + str(ring.slots()) + "×" + str(ring.width()) + " slots, expected at least " +
                  str(p.window) + "×" + str(p.head_dim));
    if (!accepts_recipe(ring.format(), KvRecipe::Fp8Block32Ue8m0))
      return fail("ring stores " + ring.format().name() + ", expected the FP8 SWA format or raw fp32");
    // Window keys before the chunk come from the ring; all of them must be there.
    for (int64_t k = std::max(call.swa_start, pos0 - p.window + 1); k < pos0; ++k)
      if (!ring.holds(k))
        return fail("SWA key of position " + str(k) + " is not in the ring (its slot holds position " +
                    str(ring.slot_position(k % ring.slots())) + "); truncate the window with swa_start");
    if (ratio > 0 && role.owns_indexer) {
      CEDAR_RETURN_IF_ERROR(ctx(check_linear(w.wq_b_i, "indexer.wq_b", p.index_heads * p.index_head_dim, p.q_lora)));
      CEDAR_RETURN_IF_ERROR(ctx(check_linear(w.weights_proj, "indexer.weights_proj", p.index_heads, p.dim)));
      if ((role.is_candidate_source || role.uses_candidates) &&
          (p.candidate_block_size <= 0 || p.candidate_topk_blocks <= 0))
        return fail("candidate blocks need candidate_block_size and candidate_topk_blocks > 0");
      const auto& cand = scratch.candidates;
      if (role.uses_candidates && (cand.pos0 != pos0 || cand.n != n || cand.kv_source != role.kv_source))
        return fail("uses the candidate pool, but no candidate source over KV source " + str(role.kv_source) +
                    " ran for this chunk [" + str(pos0) + ", " + str(pos0 + n) + ")");
    }
  }

  // Global KV: the KV source appends the chunk's complete groups (main KV + indexer keys).
  if (compress) {
    CompressedGroups groups;
    CEDAR_RETURN_IF_ERROR(ctx(compress_chunk(
        {.wkv = &w.wkv_c, .wgate = role.compressor_has_gate ? &w.wgate_c : nullptr, .norm = w.norm_c}, p.eps, x, n,
        *src, groups, pool)));
    CEDAR_RETURN_IF_ERROR(ctx(append_cache_entries(
        groups, {.rope = &rope, .wk = role.owns_indexer_keys ? &w.wk : nullptr, .k_norm = w.k_norm, .eps = p.eps},
        *src, pool)));
  }
  if (!attend) return Status::Ok();

  std::vector<float> qr, q, kv, ring_raw;
  CEDAR_RETURN_IF_ERROR(ctx(query_path(x, n, pos0, w, p, rope, qr, q, pool)));
  CEDAR_RETURN_IF_ERROR(ctx(window_kv(x, n, pos0, ring.slots(), w, p, rope, kv, ring_raw, pool)));
  // Window keys before the chunk, decoded once from the ring: positions [ring_first, pos0).
  const int64_t ring_first = std::max(call.swa_start, pos0 - p.window + 1);
  std::vector<float> ring_kv(static_cast<size_t>(std::max<int64_t>(0, pos0 - ring_first) * p.head_dim));
  for (int64_t k = ring_first; k < pos0; ++k)
    ring.read(k, std::span<float>(ring_kv).subspan(static_cast<size_t>((k - ring_first) * p.head_dim),
                                                   static_cast<size_t>(p.head_dim)));

  // Compressed entries: the index source's top-k of this chunk.
  const AttentionScratch::TopK* topk = nullptr;
  if (ratio > 0) {
    if (role.owns_indexer) {
      IndexQueries iq;
      CEDAR_RETURN_IF_ERROR(ctx(index_queries(
          {.wq_b = &w.wq_b_i, .weights_proj = &w.weights_proj, .qr = qr, .x = x, .n = n, .pos0 = pos0}, p, rope, iq,
          pool)));
      CEDAR_RETURN_IF_ERROR(
          run_indexer({.role = &role, .source = src, .queries = &iq, .pos0 = pos0, .n = n}, p, scratch, pool));
    }
    topk = &scratch.topk_of(role.index_source);
    if (topk->pos0 != pos0 || topk->n != n)
      return fail("index source layer " + str(role.index_source) + " did not run for this chunk [" + str(pos0) + ", " +
                  str(pos0 + n) + ")");
  }

  const int64_t hq = p.n_heads * p.head_dim;
  const SparseAttentionShape shape{.n_heads = p.n_heads,
                                   .head_dim = p.head_dim,
                                   .scale = static_cast<float>(std::pow(1.0 / static_cast<double>(p.head_dim), 0.5)),
                                   .bf16_probabilities = p.bf16_probabilities};
  std::vector<float> o(static_cast<size_t>(n * hq));
  auto rows = [&](int64_t t0, int64_t t1) {
    std::vector<const float*> keys;
    std::vector<float> work, selected;  // selected: decoded compressed entries of one query
    if (topk != nullptr) selected.resize(static_cast<size_t>(topk->width * p.head_dim));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t pos = pos0 + t;
      keys.clear();
      for (int64_t k = std::max(call.swa_start, pos - p.window + 1); k <= pos; ++k)
        keys.push_back(k >= pos0 ? kv.data() + (k - pos0) * p.head_dim : ring_kv.data() + (k - ring_first) * p.head_dim);
      if (topk != nullptr)
        for (int64_t i = 0; i < topk->width; ++i) {
          const int32_t j = topk->idx[static_cast<size_t>(t * topk->width + i)];
          if (j < 0) break;
          std::span<float> e(selected.data() + i * p.head_dim, static_cast<size_t>(p.head_dim));
          src->kv.read(j, e);
          keys.push_back(e.data());
        }
      std::span<float> ot(o.data() + t * hq, static_cast<size_t>(hq));
      sparse_attention_row(std::span<const float>(q).subspan(static_cast<size_t>(t * hq), static_cast<size_t>(hq)),
                           keys, w.attn_sink, shape, ot, work);
      // K = V carries the key's rotation; remove the query's (conjugate rotation at p).
      rope.apply(ot, p.n_heads, p.head_dim, pos, /*inverse=*/true);
    }
  };
  if (pool) pool->parallel_for(n, rows, 1);
  else rows(0, n);

  const int64_t first_kept = std::max<int64_t>(0, n - ring.slots());
  for (int64_t t = first_kept; t < n; ++t)
    CEDAR_RETURN_IF_ERROR(ctx(write_quantized(
        ring, pos0 + t,
        std::span<const float>(ring_raw).subspan(static_cast<size_t>((t - first_kept) * p.head_dim),
                                                 static_cast<size_t>(p.head_dim)),
        KvRecipe::Fp8Block32Ue8m0)));
  return ctx(attention_output_projection(o, n, w, p, out, pool));
}

}  // namespace cedar
