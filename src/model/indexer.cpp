#include "model/indexer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "core/numeric.h"

namespace cedar {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::string str(int64_t v) { return std::to_string(v); }

// fp32 value of a Python-float scale expression, as the reference's bf16/fp32 kernels receive it.
float scale_f32(double v) { return static_cast<float>(v); }

}  // namespace

Status index_queries(const IndexQueryInputs& in, const AttentionParams& p, const cpu::RopeTable& rope,
                     IndexQueries& out, ThreadPool* pool) {
  const int64_t ih = p.index_heads, id = p.index_head_dim;
  if (in.wq_b == nullptr || in.wq_b->data == nullptr) return make_error("indexer.wq_b is missing");
  if (in.weights_proj == nullptr || in.weights_proj->data == nullptr)
    return make_error("indexer.weights_proj is missing");
  if (in.wq_b->out != ih * id || in.wq_b->in != p.q_lora)
    return make_error("indexer.wq_b is [" + str(in.wq_b->out) + ", " + str(in.wq_b->in) + "], expected [" +
                      str(ih * id) + ", " + str(p.q_lora) + "]");
  if (in.weights_proj->out != ih || in.weights_proj->in != p.dim)
    return make_error("indexer.weights_proj is [" + str(in.weights_proj->out) + ", " + str(in.weights_proj->in) +
                      "], expected [" + str(ih) + ", " + str(p.dim) + "]");
  out.q.assign(static_cast<size_t>(in.n * ih * id), 0.0f);
  CEDAR_RETURN_IF_ERROR(cpu::linear(*in.wq_b, in.qr, in.n, out.q, {.bf16_output = true}, pool));
  for (int64_t t = 0; t < in.n; ++t) {
    std::span<float> qt(out.q.data() + t * ih * id, static_cast<size_t>(ih * id));
    rope.apply(qt, ih, id, in.pos0 + t);
    CEDAR_RETURN_IF_ERROR(qdq_fp4_block32_ue8m0(qt));
  }
  out.w.assign(static_cast<size_t>(in.n * ih), 0.0f);
  CEDAR_RETURN_IF_ERROR(cpu::linear(*in.weights_proj, in.x, in.n, out.w, {.bf16_output = true}, pool));
  if (p.index_precision == IndexScorePrecision::Reference) {
    // weights_proj(x) * (head_dim^-0.5 · heads^-0.5): a bf16 tensor times one scalar → bf16.
    const float c = scale_f32(std::pow(static_cast<double>(id), -0.5) * std::pow(static_cast<double>(ih), -0.5));
    for (float& v : out.w) v = round_to_bf16(v * c);
  } else {
    const float c = scale_f32(std::pow(static_cast<double>(ih), -0.5));
    for (float& v : out.w) v = v * c;
  }
  return Status::Ok();
}

float index_score(const float* q, const float* w, const float* k, int64_t heads, int64_t head_dim,
                  IndexScorePrecision precision, float relu_scale) {
  float acc = 0.0f;
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q + h * head_dim;
    float dot = 0.0f;
    for (int64_t c = 0; c < head_dim; ++c) dot += qh[c] * k[c];
    if (precision == IndexScorePrecision::Reference) {
      const float relu = std::max(round_to_bf16(dot), 0.0f);
      acc += round_to_bf16(relu * w[h]);
    } else {
      acc += std::max(dot, 0.0f) * relu_scale * w[h];
    }
  }
  return precision == IndexScorePrecision::Reference ? round_to_bf16(acc) : acc;
}

int64_t select_topk(std::span<const float> scores, std::span<const int32_t> ids, int64_t k, std::span<int32_t> out) {
  std::vector<std::pair<float, int32_t>> cand;
  cand.reserve(scores.size());
  for (size_t i = 0; i < scores.size(); ++i)
    if (scores[i] > -kInf) cand.emplace_back(scores[i], ids.empty() ? static_cast<int32_t>(i) : ids[i]);
  const auto keep = static_cast<size_t>(
      std::clamp<int64_t>(std::min<int64_t>(k, static_cast<int64_t>(out.size())), 0, static_cast<int64_t>(cand.size())));
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  if (keep < cand.size()) std::nth_element(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(keep), cand.end(), better);
  std::vector<int32_t> chosen(keep);
  for (size_t i = 0; i < keep; ++i) chosen[i] = cand[i].second;
  std::sort(chosen.begin(), chosen.end());
  std::fill(out.begin(), out.end(), -1);
  std::copy(chosen.begin(), chosen.end(), out.begin());
  return static_cast<int64_t>(keep);
}

int64_t select_candidate_blocks(std::span<const float> scores, int64_t block_size, int64_t topk_blocks,
                                std::span<int32_t> out) {
  const auto v = static_cast<int64_t>(scores.size());
  if (v == 0) {
    std::fill(out.begin(), out.end(), -1);
    return 0;
  }
  const int64_t nb = (v + block_size - 1) / block_size;
  std::vector<float> block(static_cast<size_t>(nb), -kInf);
  for (int64_t j = 0; j < v; ++j) block[j / block_size] = std::max(block[j / block_size], scores[j]);
  block[(v - 1) / block_size] = kInf;  // the block holding the newest visible entry is always kept
  return select_topk(block, {}, topk_blocks, out);
}

Status run_indexer(const IndexerRun& run, const AttentionParams& p, AttentionScratch& scratch, ThreadPool* pool) {
  const LayerRole& role = *run.role;
  const KvSourceState& src = *run.source;
  const int64_t r = src.ratio, ih = p.index_heads, id = p.index_head_dim;
  const std::string where = "layer " + str(role.layer) + " indexer";
  if (src.index_k.width() != id)
    return make_error(where + ": KV source " + str(src.layer) + " has indexer keys of width " +
                      str(src.index_k.width()) + ", index_head_dim is " + str(id));
  if (src.index_k.size() < (run.pos0 + run.n) / r)
    return make_error(where + ": KV source " + str(src.layer) + " has " + str(src.index_k.size()) +
                      " indexer keys, the chunk ending at position " + str(run.pos0 + run.n) + " needs " +
                      str((run.pos0 + run.n) / r));
  const bool restricted = role.uses_candidates;
  const bool publish = role.is_candidate_source;
  const AttentionScratch::Candidates& cand = scratch.candidates;
  if (restricted && (cand.pos0 != run.pos0 || cand.n != run.n || cand.kv_source != role.kv_source))
    return make_error(where + ": uses the candidate pool, but no candidate source over KV source " +
                      str(role.kv_source) + " ran for this chunk [" + str(run.pos0) + ", " + str(run.pos0 + run.n) +
                      ")");
  if ((publish || restricted) && (p.candidate_block_size <= 0 || p.candidate_topk_blocks <= 0))
    return make_error(where + ": candidate blocks need candidate_block_size and candidate_topk_blocks > 0");

  AttentionScratch::TopK& tk = scratch.topk_of(role.layer);
  tk.pos0 = run.pos0;
  tk.n = run.n;
  tk.width = p.index_topk;
  tk.idx.assign(static_cast<size_t>(run.n * tk.width), -1);
  if (publish) {
    AttentionScratch::Candidates& out = scratch.candidates;
    out.layer = role.layer;
    out.kv_source = role.kv_source;
    out.pos0 = run.pos0;
    out.n = run.n;
    out.width = p.candidate_topk_blocks;
    out.blocks.assign(static_cast<size_t>(run.n * out.width), -1);
  }
  const float relu_scale = scale_f32(std::pow(static_cast<double>(id), -0.5));
  auto queries = [&](int64_t t0, int64_t t1) {
    std::vector<float> scores, key(static_cast<size_t>(id));
    std::vector<int32_t> ids;
    auto score = [&](const float* q, const float* w, int64_t j) {
      src.index_k.read(j, key);
      return index_score(q, w, key.data(), ih, id, p.index_precision, relu_scale);
    };
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t visible = (run.pos0 + t + 1) / r;
      const float* q = run.queries->q.data() + t * ih * id;
      const float* w = run.queries->w.data() + t * ih;
      scores.clear();
      ids.clear();
      if (restricted) {
        for (int64_t b = 0; b < cand.width; ++b) {
          const int32_t blk = cand.blocks[static_cast<size_t>(t * cand.width + b)];
          if (blk < 0) break;
          const int64_t end = std::min<int64_t>(visible, (blk + 1) * p.candidate_block_size);
          for (int64_t j = static_cast<int64_t>(blk) * p.candidate_block_size; j < end; ++j)
            ids.push_back(static_cast<int32_t>(j));
        }
        for (int32_t j : ids) scores.push_back(score(q, w, j));
      } else {
        for (int64_t j = 0; j < visible; ++j) scores.push_back(score(q, w, j));
      }
      if (publish)
        select_candidate_blocks(scores, p.candidate_block_size, p.candidate_topk_blocks,
                                std::span<int32_t>(scratch.candidates.blocks).subspan(
                                    static_cast<size_t>(t * p.candidate_topk_blocks),
                                    static_cast<size_t>(p.candidate_topk_blocks)));
      select_topk(scores, ids, tk.width,
                  std::span<int32_t>(tk.idx).subspan(static_cast<size_t>(t * tk.width), static_cast<size_t>(tk.width)));
    }
  };
  if (pool) pool->parallel_for(run.n, queries, 1);
  else queries(0, run.n);
  return Status::Ok();
}

}  // namespace cedar
