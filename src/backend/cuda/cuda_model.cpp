// The CUDA model (cuda_model.h): loading, the memory plan, the per-step inputs, and the layer loop.
// Steps that wait for another engineer's kernel return pending(owner, what) — see the header.
#include "backend/cuda/cuda_model.h"

#include <algorithm>
#include <set>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"

namespace cedar::cuda {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// A step of the loop whose kernel is not in this tree yet: a clean error naming the owner and the
// kernel (issue-8 design: cuda-attn = attention_kernels.h, cuda-ffn = ffn_kernels.h).
Status pending(const char* owner, const std::string& what) {
  return make_error("pending: " + std::string(owner) + " — " + what + " (CUDA model phase 1, docs/cuda.md)");
}

constexpr int64_t kMixWidth = 24;  // pre[4], post[4], comb[16] per token (hc = 4)

// Largest split-K scratch any linear of the loop needs (shapes from the config: the workspace is
// planned before the weights exist on the device).
SplitKSize max_splitk(const ModelConfig& c) {
  const int64_t d = c.hidden_size, hd = c.head_dim, inter = c.moe_intermediate_size;
  struct Shape {
    QuantWeightFormat f;
    int64_t out, in, count;
  };
  std::vector<Shape> shapes = {
      {QuantWeightFormat::FP8Block, c.q_lora_rank, d, 1},
      {QuantWeightFormat::FP8Block, c.num_attention_heads * hd, c.q_lora_rank, 1},
      {QuantWeightFormat::FP8Block, hd, d, 1},
      {QuantWeightFormat::FP8Block, d, c.o_groups * c.o_lora_rank, 1},
      {QuantWeightFormat::FP8Block, c.index_n_heads * c.index_head_dim, c.q_lora_rank, 1},
      {QuantWeightFormat::FP8Block, inter, d, 2},
      {QuantWeightFormat::FP8Block, d, inter, 1},
      {QuantWeightFormat::MXFP4, inter, d, 2 * c.num_experts_per_tok},
      {QuantWeightFormat::MXFP4, d, inter, c.num_experts_per_tok},
  };
  if (!c.engram_layer_ids.empty())
    shapes.push_back({QuantWeightFormat::FP8Block, (c.hc_mult + 1) * d,
                      (c.engram_max_ngram_size - 1) * c.engram_n_heads * c.engram_head_dim, 1});
  SplitKSize best;
  for (const Shape& s : shapes) {
    QuantWeightView v;
    v.format = s.f;
    v.out = s.out;
    v.in = s.in;
    v.block_out = c.quant.weight_block_rows > 0 ? c.quant.weight_block_rows : 32;
    v.block_in = c.quant.weight_block_cols > 0 ? c.quant.weight_block_cols : 32;
    const SplitKSize k = splitk_workspace_size(v, s.count);
    best.partial_floats = std::max(best.partial_floats, k.partial_floats);
    best.counters = std::max(best.counters, k.counters);
  }
  return best;
}

}  // namespace

// Activation buffers for `rows` rows, carved from one device slab (and the step inputs' pinned
// staging). Sizes: workspace_layout, shared by the plan and the allocation.
struct CudaModel::Workspace {
  int64_t rows = 0, logit_rows = 0;
  DeviceBuffer<uint8_t> slab;
  float *X = nullptr, *x = nullptr, *xn = nullptr, *y = nullptr;
  float *mix_attn = nullptr, *mix_ffn = nullptr, *mix_scratch = nullptr;
  float *pre = nullptr, *post = nullptr, *comb = nullptr, *e0 = nullptr;
  float *qr = nullptr, *q = nullptr, *kv = nullptr, *o = nullptr, *o_lora = nullptr;
  float *h1 = nullptr, *h3 = nullptr, *routed = nullptr;
  float* logits = nullptr;
  uint16_t* act_codes = nullptr;
  float* act_scales = nullptr;
  int64_t act_capacity = 0;
  SplitKWorkspace splitk;
  MhcWorkspace mhc;
  float* rope_main = nullptr;      // [max_context, rope_dim] cos/sin (attention_kernels.h rope_cos_sin_table)
  float* rope_compress = nullptr;  // the compress rope's (θ = compress_rope_theta + YaRN)
  float* index_scores = nullptr;   // [rows, max_context] indexer scores of a call (full scan: V ≤ max_context)
  // Step inputs, one per row (phase 2: the attention kernels' AttnToken rows are built from these).
  int32_t* token_ids = nullptr;  // int32 on the device (ffn_kernels.h)
  int64_t* positions = nullptr;
  int64_t* swa_start = nullptr;  // per row: decoder layers see SWA keys from here on (CED)
  int32_t* row_slot = nullptr;   // per row: the sequence's KV slot (AttnToken::seq)
  void* staging = nullptr;       // pinned: token_ids, positions, swa_start, row_slot of one step
  ~Workspace() {
    if (staging) cudaFreeHost(staging);
  }
};

namespace {

// Carves typed arrays from a slab; with base == nullptr it only sums the bytes (the plan).
class Carver {
 public:
  explicit Carver(uint8_t* base, DeviceMemoryPlan* plan) : base_(base), plan_(plan) {}
  template <typename T>
  T* take(const char* component, int64_t count) {
    const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(count, 0)) * sizeof(T);
    if (plan_) plan_->add(component, bytes, false, "rows");
    T* p = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ = (offset_ + bytes + 255) / 256 * 256;
    return p;
  }
  uint64_t bytes() const { return offset_; }

 private:
  uint8_t* base_;
  DeviceMemoryPlan* plan_;
  uint64_t offset_ = 0;
};

// Every activation buffer of the loop for `rows` rows (decode batch or prefill chunk), and the tables
// sized by the context (RoPE angles, indexer scores).
void workspace_layout(const ModelConfig& c, int64_t rows, int64_t logit_rows, int64_t max_context, Carver& k,
                      CudaModel::Workspace& w) {
  const int64_t d = c.hidden_size, hc = c.hc_mult, heads_dim = c.num_attention_heads * c.head_dim;
  const int64_t topk = c.num_experts_per_tok, inter = c.moe_intermediate_size;
  const int64_t engram_in = (c.engram_max_ngram_size - 1) * c.engram_n_heads * c.engram_head_dim;
  const int64_t max_in = std::max({d, c.q_lora_rank, heads_dim, c.o_groups * c.o_lora_rank, inter, engram_in});
  w.rows = rows;
  w.logit_rows = logit_rows;
  w.X = k.take<float>("activations", rows * hc * d);
  w.x = k.take<float>("activations", rows * d);
  w.xn = k.take<float>("activations", rows * d);
  w.y = k.take<float>("activations", rows * std::max(d, (hc + 1) * d));  // attention / ffn / Engram outputs
  w.mix_attn = k.take<float>("activations", rows * kMixWidth);
  w.mix_ffn = k.take<float>("activations", rows * kMixWidth);
  w.mix_scratch = k.take<float>("activations", rows * kMixWidth);
  w.pre = k.take<float>("activations", rows * hc);
  w.post = k.take<float>("activations", rows * hc);
  w.comb = k.take<float>("activations", rows * hc * hc);
  w.e0 = k.take<float>("activations", rows * hc);
  w.qr = k.take<float>("attention scratch", rows * c.q_lora_rank);
  w.q = k.take<float>("attention scratch", rows * heads_dim);
  w.kv = k.take<float>("attention scratch", rows * c.head_dim);
  w.o = k.take<float>("attention scratch", rows * heads_dim);
  w.o_lora = k.take<float>("attention scratch", rows * c.o_groups * c.o_lora_rank);
  w.h1 = k.take<float>("moe scratch", rows * (topk + 1) * inter);
  w.h3 = k.take<float>("moe scratch", rows * (topk + 1) * inter);
  w.routed = k.take<float>("moe scratch", rows * topk * d);
  w.logits = k.take<float>("logits", logit_rows * c.vocab_size);
  w.act_capacity = rows * max_in;
  w.act_codes = k.take<uint16_t>("activations", w.act_capacity);
  w.act_scales = k.take<float>("activations", w.act_capacity / 32 + 1);
  const SplitKSize sk = max_splitk(c);
  w.splitk.partials = k.take<float>("split-k + mhc scratch", sk.partial_floats);
  w.splitk.counters = k.take<unsigned>("split-k + mhc scratch", sk.counters);
  w.splitk.partial_floats = sk.partial_floats;
  w.splitk.counter_count = sk.counters;
  w.mhc.partials = k.take<float>("split-k + mhc scratch", mhc_workspace_floats(rows, d));
  w.mhc.counter = k.take<unsigned>("split-k + mhc scratch", 1);
  w.rope_main = k.take<float>("rope tables", max_context * c.qk_rope_head_dim);
  w.rope_compress = k.take<float>("rope tables", max_context * c.qk_rope_head_dim);
  w.index_scores = k.take<float>("indexer scratch", rows * max_context);
  w.token_ids = k.take<int32_t>("step inputs", rows);
  w.positions = k.take<int64_t>("step inputs", rows);
  w.swa_start = k.take<int64_t>("step inputs", rows);
  w.row_slot = k.take<int32_t>("step inputs", rows);
}

int64_t workspace_rows(const CudaModelOptions& o) { return std::max(o.max_batch, o.max_chunk); }

}  // namespace

Result<DeviceMemoryPlan> cuda_model_extra_plan(const ModelConfig& c, const LayerPlan& plan, const CudaModelOptions& o) {
  CEDAR_ASSIGN_OR_RETURN(const DeviceKvGeometry g, DeviceKvGeometry::create(c, plan, o.kv));
  DeviceMemoryPlan p = g.memory_plan();
  CudaModel::Workspace w;
  Carver k(nullptr, &p);
  workspace_layout(c, workspace_rows(o), o.max_batch, o.kv.max_context, k, w);
  return p;
}

CudaModel::CudaModel(DeepseekV41Model host, const CudaModelOptions& options, Stream stream, DeviceWeights weights,
                     DeviceKvPool kv, std::unique_ptr<Workspace> ws, DeviceMemoryPlan plan)
    : host_(std::move(host)),
      options_(options),
      stream_(std::move(stream)),
      weights_(std::move(weights)),
      kv_(std::move(kv)),
      ws_(std::move(ws)),
      memory_plan_(std::move(plan)) {}

CudaModel::~CudaModel() = default;

Result<std::unique_ptr<CudaModel>> CudaModel::load(const std::filesystem::path& path, const CudaModelOptions& o) {
  if (o.max_batch < 1 || o.max_chunk < 1)
    return make_error("CudaModel: max_batch and max_chunk must be >= 1, got " + str(o.max_batch) + " and " +
                      str(o.max_chunk));
  if (o.kv.max_sequences < o.max_batch)
    return make_error("CudaModel: kv.max_sequences (" + str(o.kv.max_sequences) + ") is below max_batch (" +
                      str(o.max_batch) + ")");
  CEDAR_CUDA_RETURN_IF_ERROR(cudaSetDevice(o.device));
  CEDAR_ASSIGN_OR_RETURN(DeepseekV41Model host, DeepseekV41Model::load(path, {o.engram_map, o.pool}));
  const ModelConfig& c = host.config();
  if (c.hc_mult != 4)
    return make_error("CudaModel: the fused mHC kernel is built for hc_mult 4, got " + str(c.hc_mult));

  // Everything is planned before anything is allocated: weights + KV + workspace must fit together.
  CEDAR_ASSIGN_OR_RETURN(DeviceMemoryPlan extra, cuda_model_extra_plan(c, host.plan(), o));
  CEDAR_ASSIGN_OR_RETURN(DeviceWeights weights,
                         DeviceWeights::upload(c, host.weights(), o.weights, extra, o.headroom_bytes));
  DeviceMemoryPlan plan = weights.memory_plan();
  for (const MemoryPlanEntry& e : extra.entries) plan.add(e.component, e.bytes, e.in_host, e.read_per_step);
  CEDAR_ASSIGN_OR_RETURN(DeviceKvPool kv, DeviceKvPool::create(c, host.plan(), o.kv));
  CEDAR_ASSIGN_OR_RETURN(Stream stream, Stream::create());

  auto ws = std::make_unique<Workspace>();
  {
    Carver sizing(nullptr, nullptr);
    workspace_layout(c, workspace_rows(o), o.max_batch, o.kv.max_context, sizing, *ws);
    CEDAR_ASSIGN_OR_RETURN(ws->slab, DeviceBuffer<uint8_t>::allocate(sizing.bytes()));
    CEDAR_RETURN_IF_ERROR(ws->slab.zero());  // split-K / mHC counters start at zero (the kernels re-arm them)
    Carver carve(ws->slab.get(), nullptr);
    workspace_layout(c, workspace_rows(o), o.max_batch, o.kv.max_context, carve, *ws);
    const size_t staging = static_cast<size_t>(ws->rows) * (2 * sizeof(int64_t) + 2 * sizeof(int32_t));
    CEDAR_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&ws->staging, staging, cudaHostAllocDefault));
    // e_0 rows: the collapse weights before layer 0 (pre_prev = e_0, §3.2).
    std::vector<float> e0(static_cast<size_t>(ws->rows * c.hc_mult), 0.0f);
    for (int64_t r = 0; r < ws->rows; ++r) e0[static_cast<size_t>(r * c.hc_mult)] = 1.0f;
    CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpy(ws->e0, e0.data(), e0.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(host), o, std::move(stream), std::move(weights),
                                                  std::move(kv), std::move(ws), std::move(plan)));
}

Result<CudaSequence> CudaModel::new_sequence(const SequenceOptions& options) {
  CudaSequence s;
  s.options = options;
  if (options.mode == ForwardMode::Ced) {
    if (!plan().ced) return make_error("ced mode is unavailable for this model: " + plan().ced_unavailable_reason);
    if (options.prompt_length <= 0) return make_error("ced mode needs the prompt length (> 0)");
    const int64_t tail = options.ced_tail > 0 ? options.ced_tail : config().sliding_window;
    s.replay_start = std::max<int64_t>(0, options.prompt_length - tail);
  }
  CEDAR_ASSIGN_OR_RETURN(s.kv, kv_.new_sequence(stream_.get()));
  return s;
}

Status CudaModel::upload_step_inputs(std::span<CudaSequence* const> seqs, std::span<const int64_t> tokens,
                                     std::span<const int64_t> positions) {
  Workspace& w = *ws_;
  const size_t n = tokens.size();
  auto* pos = static_cast<int64_t*>(w.staging);
  int64_t* swa = pos + w.rows;
  auto* ids = reinterpret_cast<int32_t*>(swa + w.rows);
  int32_t* slot = ids + w.rows;
  for (size_t i = 0; i < n; ++i) {
    const CudaSequence& s = *seqs[seqs.size() == 1 ? 0 : i];
    ids[i] = static_cast<int32_t>(tokens[i]);
    pos[i] = positions[i];
    // Decoder layers of a CED sequence see SWA keys from the replay start on (also in later decodes).
    swa[i] = s.options.mode == ForwardMode::Ced ? s.replay_start : 0;
    slot[i] = static_cast<int32_t>(s.kv.slot());
  }
  const cudaStream_t st = stream_.get();
  CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(w.token_ids, ids, n * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(w.positions, pos, n * sizeof(int64_t), cudaMemcpyHostToDevice, st));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(w.swa_start, swa, n * sizeof(int64_t), cudaMemcpyHostToDevice, st));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(w.row_slot, slot, n * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  return Status::Ok();
}

Status CudaModel::decode_step(std::span<CudaSequence* const> seqs, std::span<const int64_t> tokens,
                              CudaStepOutput& out) {
  const int64_t batch = static_cast<int64_t>(seqs.size());
  if (batch < 1 || batch > options_.max_batch || tokens.size() != seqs.size())
    return make_error("decode_step: " + str(batch) + " sequences and " + str(static_cast<int64_t>(tokens.size())) +
                      " tokens (need 1..max_batch " + str(options_.max_batch) + ", one token each)");
  std::set<int64_t> slots;
  std::vector<int64_t> positions;
  for (int64_t i = 0; i < batch; ++i) {
    CudaSequence& s = *seqs[static_cast<size_t>(i)];
    if (s.failed) return make_error("decode_step: sequence " + str(i) + " is unusable after an earlier error");
    if (!slots.insert(s.kv.slot()).second) return make_error("decode_step: sequence " + str(i) + " appears twice");
    if (tokens[static_cast<size_t>(i)] < 0 || tokens[static_cast<size_t>(i)] >= config().vocab_size)
      return make_error("decode_step: token " + str(tokens[static_cast<size_t>(i)]) + " of sequence " + str(i) +
                        " is outside the vocabulary");
    CEDAR_RETURN_IF_ERROR(s.kv.ensure(s.length + 1));
    CEDAR_RETURN_IF_ERROR(s.kv.upload_tables(stream_.get()));
    positions.push_back(s.length);
  }
  CEDAR_RETURN_IF_ERROR(upload_step_inputs(seqs, tokens, positions));
  Rows r;
  r.n = batch;
  r.decode = true;
  Status st;
  if (options_.cuda_graphs) {
    CudaGraph& g = decode_graphs_[batch];
    if (g.empty()) {
      auto captured = CudaGraph::capture(stream_.get(), [&](cudaStream_t) { return run_rows(r); });
      if (!captured.ok()) {
        decode_graphs_.erase(batch);
        return captured.error().with_context("decode_step (batch " + str(batch) + ")");
      }
      g = std::move(*captured);
    }
    st = g.launch(stream_.get());
  } else {
    st = run_rows(r);
  }
  if (st.ok()) st = stream_.synchronize();
  if (!st.ok()) {
    if (state_written_)
      for (CudaSequence* s : seqs) s->failed = true;
    return st.error().with_context("decode_step");
  }
  out.logits = ws_->logits;
  out.rows = batch;
  out.positions = positions;
  for (CudaSequence* s : seqs) ++s->length;
  return Status::Ok();
}

Status CudaModel::prefill(CudaSequence& seq, std::span<const int64_t> tokens, LogitRows logits, CudaStepOutput& out) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (seq.failed) return make_error("prefill: the sequence is unusable after an earlier error");
  if (n < 1 || n > options_.max_chunk)
    return make_error("prefill: chunk of " + str(n) + " tokens (need 1..max_chunk " + str(options_.max_chunk) + ")");
  if (logits == LogitRows::All && n > ws_->logit_rows)
    return make_error("prefill: logits of all " + str(n) + " rows exceed the " + str(ws_->logit_rows) + " logit rows");
  for (int64_t i = 0; i < n; ++i)
    if (tokens[static_cast<size_t>(i)] < 0 || tokens[static_cast<size_t>(i)] >= config().vocab_size)
      return make_error("prefill: token " + str(tokens[static_cast<size_t>(i)]) + " at position " +
                        str(seq.length + i) + " is outside the vocabulary");
  CEDAR_RETURN_IF_ERROR(seq.kv.ensure(seq.length + n));
  CEDAR_RETURN_IF_ERROR(seq.kv.upload_tables(stream_.get()));
  std::vector<int64_t> positions(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = seq.length + i;
  CudaSequence* one[] = {&seq};
  CEDAR_RETURN_IF_ERROR(upload_step_inputs(one, tokens, positions));
  // Rows before the CED replay start run the encoder and the boundary layer only (as the CPU model):
  // split the chunk there.
  const int64_t head = std::clamp<int64_t>(seq.replay_start - seq.length, 0, n);
  const Rows parts[2] = {{0, head, false, false, seq.options.ced_boundary},
                         {head, n - head, true, false, seq.options.ced_boundary}};
  Status st;
  for (const Rows& r : parts) {
    if (r.n == 0) continue;
    st = run_rows(r);
    if (!st.ok()) break;
  }
  if (st.ok()) st = stream_.synchronize();
  if (!st.ok()) {
    if (state_written_) seq.failed = true;
    return st.error().with_context("prefill");
  }
  out.logits = ws_->logits;
  out.rows = logits == LogitRows::None ? 0 : (logits == LogitRows::Last ? 1 : n);
  out.positions.clear();
  for (int64_t i = n - out.rows; i < n; ++i) out.positions.push_back(seq.length + i);
  seq.length += n;
  return Status::Ok();
}

// ---- the layer loop ----------------------------------------------------------------------------

Status CudaModel::run_rows(const Rows& r) {
  CEDAR_RETURN_IF_ERROR(embed(r));
  const LayerPlan& p = plan();
  const int64_t last = r.tail ? p.num_layers() - 1 : p.last_kv_source;
  for (int64_t l = 0; l <= last; ++l) {
    CEDAR_RETURN_IF_ERROR(attention_site(l, r));
    CEDAR_RETURN_IF_ERROR(attention(l, r));
    if (!r.tail && l == p.last_kv_source) return Status::Ok();  // pre-tail rows stop after the boundary's KV
    CEDAR_RETURN_IF_ERROR(ffn_site(l, r));
    CEDAR_RETURN_IF_ERROR(moe(l, r));
  }
  return r.tail ? finish(r) : Status::Ok();
}

Status CudaModel::embed(const Rows&) {
  // Phase 2 (cuda-ffn, ffn_kernels.h): embed_gather{table = weights_.embed(), tokens = token_ids + first,
  // x, X, pre_prev} — X_0 = [e, e, e, e] (§3.2); then engram_hash (device history per slot) for the
  // Engram layers' rows.
  return pending("cuda-ffn", "embedding gather + stream expansion (embed_gather, ffn_kernels.h)");
}

// pre / post / comb of a mix row [24] into the contiguous [n, 4] / [n, 4] / [n, 16] arrays mhc_fused
// takes. (A strided mix argument in MhcFusedArgs — cuda-ffn owns mhc.cu — would save these copies.)
static Status split_mix(const float* mix, int64_t n, float* pre, float* post, float* comb, cudaStream_t s) {
  const size_t row = kMixWidth * sizeof(float);
  CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(pre, 4 * sizeof(float), mix, row, 4 * sizeof(float),
                                               static_cast<size_t>(n), cudaMemcpyDeviceToDevice, s));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(post, 4 * sizeof(float), mix + 4, row, 4 * sizeof(float),
                                               static_cast<size_t>(n), cudaMemcpyDeviceToDevice, s));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(comb, 16 * sizeof(float), mix + 8, row, 16 * sizeof(float),
                                               static_cast<size_t>(n), cudaMemcpyDeviceToDevice, s));
  return Status::Ok();
}

Status CudaModel::attention_site(int64_t l, const Rows& r) {
  const ModelConfig& c = config();
  const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
  Workspace& w = *ws_;
  const cudaStream_t s = stream_.get();
  MhcFusedArgs a;
  a.n = r.n;
  a.hc = c.hc_mult;
  a.d = c.hidden_size;
  a.X = w.X;
  a.X_out = w.X;
  a.fn = L.hc_attn.fn.data;
  a.base = L.hc_attn.base.data;
  a.scale = L.hc_attn.scale.data;
  a.sinkhorn_iters = c.hc_sinkhorn_iters;
  a.hc_eps = static_cast<float>(c.hc_eps);
  a.norm_eps = static_cast<float>(c.rms_norm_eps);
  if (l > 0) {  // expand the previous layer's ffn output with its site's post / comb
    CEDAR_RETURN_IF_ERROR(split_mix(w.mix_ffn, r.n, w.pre, w.post, w.comb, s));
    a.y = w.y;
    a.post = w.post;
    a.comb = w.comb;
  }
  a.collapse_w = l > 0 ? w.pre : w.e0;
  a.collapsed = w.x;
  a.mix_out = w.mix_attn;
  if (L.engram) {
    // Engram changes the streams between the expand and this site's collapse and coefficients: expand
    // alone first (its coefficients are discarded), Engram, then collapse + coefficients.
    if (a.y) {
      MhcFusedArgs expand = a;
      expand.collapse_w = nullptr;
      expand.mix_out = w.mix_scratch;
      CEDAR_RETURN_IF_ERROR(mhc_fused(expand, w.mhc, s));
    }
    // Phase 2 (cuda-ffn): engram_gather_quant (table rows → FP8 codes of E), gemv_quantized(engram wkv),
    // engram_update{X, kv, qk = L.engram->qk} (the gated stream update).
    CEDAR_RETURN_IF_ERROR(pending("cuda-ffn", "Engram gather + gated update (engram_gather_quant, engram_update)"));
    a.y = nullptr;
  }
  CEDAR_RETURN_IF_ERROR(mhc_fused(a, w.mhc, s));
  return rms_norm(w.x, r.n, c.hidden_size, L.attn_norm.data, static_cast<float>(c.rms_norm_eps), w.xn, s);
}

Status CudaModel::linear(const DeviceMatrix& m, const float* x, int64_t n, float* y) {
  if (m.format == DeviceFormat::Bf16 || m.format == DeviceFormat::F32)
    return pending("cuda-attn", "gemv_bf16 for BF16 linear weights (attention_kernels.h, on h/cuda-attn)");
  Workspace& w = *ws_;
  const ActWorkspace act{w.act_codes, w.act_scales, w.act_capacity, w.splitk};
  return linear_quantized(m.quant(), x, n, act, y, /*bf16_output=*/true, stream_.get());
}

Status CudaModel::attention(int64_t l, const Rows& r) {
  const ModelConfig& c = config();
  const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
  Workspace& w = *ws_;
  const cudaStream_t s = stream_.get();
  // Query: qr = RMSNorm_q(wq_a·x), q = wq_b·qr (bf16 outputs, as the reference's linear()).
  CEDAR_RETURN_IF_ERROR(linear(L.wq_a, w.xn, r.n, w.qr));
  CEDAR_RETURN_IF_ERROR(rms_norm(w.qr, r.n, c.q_lora_rank, L.q_norm.data, static_cast<float>(c.rms_norm_eps), w.qr, s));
  CEDAR_RETURN_IF_ERROR(linear(L.wq_b, w.qr, r.n, w.q));
  // Phase 2 (cuda-attn, attention_kernels.h), in this order, every row described by an AttnToken built
  // from the step inputs (seq = the row's KV slot, pos, swa_start) and the per-slot descriptor tables of
  // DeviceKvPool::slot_table (SwaRingDesc per layer, KvSourceSeq per KV source):
  //   rope_apply(q, n_vec = heads) with the layer's table (rope_compress for ratio > 0, else rope_main);
  //   SWA KV: linear(wkv) → swa_kv_encode (RMSNorm_kv, RoPE, FP8 QDQ → staged 528-B records);
  //   KV sources: gemv_bf16(wkv_c / wgate_c, fp32 out at ratio 2, bf16 at ratio 1) → compressor_entries
  //     (+ compressor_keep_pending) → gemv_bf16(wk) → indexer_keys_store;
  //   index sources: linear(wq_b_i, qr) and gemv_bf16(weights_proj, x) → indexer_queries → indexer_scores
  //     (restricted to the candidate blocks at Reindex layers) → indexer_select (blocks_out at the
  //     candidate source) into the layer's top-k, which its Reuse layers read;
  //   sparse attention over window ∪ top-k with the sink (the attention kernel, not in the header yet),
  //     inverse rope_apply, grouped gemv_bf16 for wo_a (8 groups; or an FP8 variant with
  //     DeviceWeightOptions::wo_a_fp8), linear(wo_b) into w.y; swa_ring_commit after the attention.
  //   Set state_written_ from the first ring / cache write on.
  return pending("cuda-attn", "RoPE, SWA KV, compressor, indexer, sparse attention, wo_a (attention_kernels.h)");
}

Status CudaModel::ffn_site(int64_t l, const Rows& r) {
  const ModelConfig& c = config();
  const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
  Workspace& w = *ws_;
  const cudaStream_t s = stream_.get();
  CEDAR_RETURN_IF_ERROR(split_mix(w.mix_attn, r.n, w.pre, w.post, w.comb, s));
  MhcFusedArgs a;
  a.n = r.n;
  a.hc = c.hc_mult;
  a.d = c.hidden_size;
  a.X = w.X;
  a.y = w.y;
  a.post = w.post;
  a.comb = w.comb;
  a.X_out = w.X;
  a.collapse_w = w.pre;  // the attention site's pre (single pass)
  a.collapsed = w.x;
  a.fn = L.hc_ffn.fn.data;
  a.base = L.hc_ffn.base.data;
  a.scale = L.hc_ffn.scale.data;
  a.sinkhorn_iters = c.hc_sinkhorn_iters;
  a.hc_eps = static_cast<float>(c.hc_eps);
  a.norm_eps = static_cast<float>(c.rms_norm_eps);
  a.mix_out = w.mix_ffn;
  CEDAR_RETURN_IF_ERROR(mhc_fused(a, w.mhc, s));
  return rms_norm(w.x, r.n, c.hidden_size, L.ffn_norm.data, static_cast<float>(c.rms_norm_eps), w.xn, s);
}

Status CudaModel::moe(int64_t l, const Rows& r) {
  const DeviceLayer& L = weights_.layers()[static_cast<size_t>(l)];
  Workspace& w = *ws_;
  // Phase 2 (cuda-ffn, ffn_kernels.h): moe_route{x = xn, gate = L.gate, bias = L.gate_bias} → experts,
  // weights; moe_build_items with ExpertWeightTable{L.experts.data_table[k], scale_table[k]} (w1 + w3 in
  // one table, then w2 by pair) → gemv_quantized_items (Mxfp4Layout::Packed when the upload repacked);
  // swiglu with the routing weights (FP8 codes for w2); moe_combine (routed + shared) into w.y.
  CEDAR_RETURN_IF_ERROR(pending("cuda-ffn", "router + device-indexed expert GEMVs (moe_route, moe_build_items)"));
  // Shared expert (FP8): w1 / w3 projections, swiglu (no routing weight), w2.
  CEDAR_RETURN_IF_ERROR(linear(L.shared_w1, w.xn, r.n, w.h1));
  CEDAR_RETURN_IF_ERROR(linear(L.shared_w3, w.xn, r.n, w.h3));
  return pending("cuda-ffn", "SwiGLU and the MoE combine (swiglu, moe_combine)");
}

Status CudaModel::finish(const Rows& r) {
  const ModelConfig& c = config();
  Workspace& w = *ws_;
  const cudaStream_t s = stream_.get();
  // Final expand + collapse with the last ffn site's pre (§3.3); mhc_fused always computes a next
  // site's coefficients, discarded here (an fn-less mode would save reading one fn).
  const DeviceLayer& last = weights_.layers().back();
  CEDAR_RETURN_IF_ERROR(split_mix(w.mix_ffn, r.n, w.pre, w.post, w.comb, s));
  MhcFusedArgs a;
  a.n = r.n;
  a.hc = c.hc_mult;
  a.d = c.hidden_size;
  a.X = w.X;
  a.y = w.y;
  a.post = w.post;
  a.comb = w.comb;
  a.X_out = w.X;
  a.collapse_w = w.pre;
  a.collapsed = w.x;
  a.fn = last.hc_ffn.fn.data;
  a.base = last.hc_ffn.base.data;
  a.scale = last.hc_ffn.scale.data;
  a.sinkhorn_iters = c.hc_sinkhorn_iters;
  a.hc_eps = static_cast<float>(c.hc_eps);
  a.norm_eps = static_cast<float>(c.rms_norm_eps);
  a.mix_out = w.mix_scratch;
  CEDAR_RETURN_IF_ERROR(mhc_fused(a, w.mhc, s));
  CEDAR_RETURN_IF_ERROR(
      rms_norm(w.x, r.n, c.hidden_size, weights_.final_norm().data, static_cast<float>(c.rms_norm_eps), w.xn, s));
  // Head in fp32 (§2.3) over the logit rows (phase 2: final_head of cuda-ffn does the collapse, the
  // norm and the head in one call; argmax_rows / sample_rows on the device).
  return pending("cuda-ffn", "fp32 head (final_head) + argmax / sampling (ffn_kernels.h)");
}

}  // namespace cedar::cuda
