// The CUDA model's keys path of a layer (cuda_model.h): the compressor of a KV source layer (compressed
// KV entries, and the indexer's keys where the layer owns them) and the indexer of an index source layer
// (queries, scores over the compressed entries, top-k). Split from cuda_model_layers.cpp, whose
// attention() calls them; mirrors model/attention.cpp's compress_chunk, append_cache_entries,
// index_queries and run_indexer.
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_model_internal.h"

namespace cedar::cuda {
using namespace model_detail;

// compress_chunk + append_cache_entries of a KV source layer.
Status CudaModel::compressor(int64_t l, const Rows& r) {
  const ModelConfig& c = config();
  const LayerRole& role = plan().layers[static_cast<size_t>(l)];
  const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
  Workspace& w = *ws_;
  const StepInputs& in = r.decode ? w.decode_in : w.prefill_in;
  const cudaStream_t s = cs();
  const int64_t n = r.n, d = c.hidden_size, hd = c.head_dim, ratio = role.compress_ratio;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const KvSourceSeq* seqs = tables_->sources[static_cast<size_t>(l)].get();
  // Ratio 1: bf16 projections; ratio > 1: fp32 (the reference holds wkv / wgate in fp32 there).
  DenseCall kv;
  kv.w = &L.wkv_c;
  kv.out = hd;
  kv.in = d;
  kv.x = w.xn;
  kv.y = w.comp_kv;
  kv.n = n;
  kv.bf16_output = ratio == 1;
  CEDAR_RETURN_IF_ERROR(dense(kv));
  CompressorArgs ca;
  ca.n = n;
  ca.head_dim = hd;
  ca.ratio = ratio;
  ca.kv = w.comp_kv;
  ca.norm_weight = L.norm_c.data;
  ca.eps = eps;
  ca.tokens = in.tok_exact + r.first;
  ca.seqs = seqs;
  ca.rope = tables_->rope_compress_view;
  ca.latent = w.latent;
  uint64_t bytes = L.wkv_c.bytes();
  if (ratio > 1) {
    DenseCall gate = kv;
    gate.w = &L.wgate_c;
    gate.y = w.comp_gate;
    CEDAR_RETURN_IF_ERROR(dense(gate));
    ca.gate = w.comp_gate;
    bytes += L.wgate_c.bytes();
  }
  CEDAR_RETURN_IF_ERROR(compressor_entries(ca, s));
  if (ratio > 1) CEDAR_RETURN_IF_ERROR(compressor_keep_pending(ca, s));
  if (role.owns_indexer_keys) {
    DenseCall k;
    k.w = &L.wk;
    k.out = c.index_head_dim;
    k.in = hd;
    k.x = w.latent;
    k.y = w.index_k;
    k.n = n;
    CEDAR_RETURN_IF_ERROR(dense(k));
    IndexKeyArgs ka;
    ka.n = n;
    ka.index_head_dim = c.index_head_dim;
    ka.ratio = ratio;
    ka.k = w.index_k;
    ka.norm_weight = L.k_norm.data;
    ka.eps = eps;
    ka.tokens = ca.tokens;
    ka.seqs = seqs;
    ka.rope = tables_->rope_compress_view;
    CEDAR_RETURN_IF_ERROR(indexer_keys_store(ka, s));
    bytes += L.wk.bytes();
  }
  return mark("compressor", bytes);
}

// index_queries + run_indexer of an index source layer (qr's FP8 codes are in act_b).
Status CudaModel::indexer(int64_t l, const Rows& r, bool qi_ready) {
  const ModelConfig& c = config();
  const LayerRole& role = plan().layers[static_cast<size_t>(l)];
  const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
  Workspace& w = *ws_;
  const StepInputs& in = r.decode ? w.decode_in : w.prefill_in;
  const cudaStream_t s = cs();
  const int64_t n = r.n, ih = c.index_n_heads, ihd = c.index_head_dim, ratio = role.compress_ratio;
  const AttnToken* tok = in.tok_exact + r.first;
  if (!qi_ready) CEDAR_RETURN_IF_ERROR(qlinear(L.wq_b_i, w.act_b, w.act_b_scales, n, w.qi));
  DenseCall wp;
  wp.w = &L.weights_proj;
  wp.out = ih;
  wp.in = c.hidden_size;
  wp.x = w.xn;
  wp.y = w.w_raw;
  wp.n = n;
  CEDAR_RETURN_IF_ERROR(dense(wp));
  IndexQueryArgs qa;
  qa.n = n;
  qa.heads = ih;
  qa.head_dim = ihd;
  qa.qi = w.qi;
  qa.w_raw = w.w_raw;
  qa.tokens = tok;
  qa.rope = tables_->rope_compress_view;
  qa.reference_precision = tables_->index_reference;
  qa.q_codes = w.q_codes;
  qa.q_scales = w.q_scales;
  qa.w = w.iw;
  CEDAR_RETURN_IF_ERROR(indexer_queries(qa, s));
  const bool restricted = role.uses_candidates;
  const int64_t max_slots = std::min(w.max_slots_cap, restricted ? c.candidate_topk_blocks * c.candidate_block_size
                                                                 : std::max<int64_t>(1, ceil_div(r.context, ratio)));
  IndexerScoreArgs sa;
  sa.n = n;
  sa.heads = ih;
  sa.head_dim = ihd;
  sa.ratio = ratio;
  sa.q_codes = w.q_codes;
  sa.q_scales = w.q_scales;
  sa.w = w.iw;
  sa.tokens = tok;
  sa.seqs = tables_->sources[static_cast<size_t>(role.kv_source)].get();
  sa.reference_precision = tables_->index_reference;
  sa.relu_scale = static_cast<float>(std::pow(static_cast<double>(ihd), -0.5));
  sa.candidate_blocks = restricted ? w.cand_blocks : nullptr;
  sa.candidate_topk_blocks = c.candidate_topk_blocks;
  sa.candidate_block_size = c.candidate_block_size;
  sa.max_slots = max_slots;
  sa.scores = w.index_scores;
  CEDAR_RETURN_IF_ERROR(indexer_scores(sa, s));
  IndexerSelectArgs se;
  se.n = n;
  se.ratio = ratio;
  se.tokens = tok;
  se.scores = w.index_scores;
  se.max_slots = max_slots;
  se.candidate_blocks = sa.candidate_blocks;
  se.candidate_topk_blocks = c.candidate_topk_blocks;
  se.candidate_block_size = c.candidate_block_size;
  se.topk = c.index_topk;
  se.topk_out = w.topk[static_cast<size_t>(l)] + r.first * c.index_topk;
  se.blocks_out = role.is_candidate_source ? w.cand_blocks : nullptr;
  se.workspace = w.select_ws;
  se.workspace_bytes = w.select_ws_bytes;
  CEDAR_RETURN_IF_ERROR(indexer_select(se, s));
  return mark("indexer", (qi_ready ? 0 : L.wq_b_i.bytes()) + L.weights_proj.bytes());
}

}  // namespace cedar::cuda
