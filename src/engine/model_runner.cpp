#include "engine/model_runner.h"

#include <chrono>

#include "kv/kv_layout.h"
#include "model/model_stats.h"

namespace cedar::engine {

Result<std::vector<std::vector<BlockId>>> ModelSequence::prefix_blocks(int64_t) const {
  return make_error("this model runner does not export prefix-cache blocks");
}

Result<std::shared_ptr<const SequenceSnapshot>> ModelSequence::snapshot() const {
  return make_error("this model runner does not snapshot SWA state");
}

namespace {

// The model's ring snapshot inside the engine's snapshot type.
struct DeepseekSnapshot final : SequenceSnapshot {
  SwaSnapshot swa;
};

class DeepseekSequence final : public ModelSequence {
 public:
  DeepseekSequence(const DeepseekV41Model& model, SequenceState s, int64_t main_entry_bytes,
                   int64_t indexer_entry_bytes)
      : state(std::move(s)),
        model_(&model),
        main_entry_bytes_(main_entry_bytes),
        indexer_entry_bytes_(indexer_entry_bytes) {}
  int64_t length() const override { return state.length(); }
  // What the stored global entries would occupy packed (architecture.md §3.12).
  int64_t kv_bytes_packed() const override {
    int64_t bytes = 0;
    for (const KvSourceState& s : state.attention().sources)
      bytes += s.kv.size() * main_entry_bytes_ + s.index_k.size() * indexer_entry_bytes_;
    return bytes;
  }
  int64_t kv_bytes_allocated() const override {
    int64_t bytes = 0;
    for (const KvSourceState& s : state.attention().sources)
      bytes += s.kv.blocks().blocks() * s.kv.blocks().block_bytes() +
               s.index_k.blocks().blocks() * s.index_k.blocks().block_bytes();
    return bytes;
  }
  Result<std::vector<std::vector<BlockId>>> prefix_blocks(int64_t tokens) const override {
    return model_->prefix_blocks(state, tokens);
  }
  Result<std::shared_ptr<const SequenceSnapshot>> snapshot() const override {
    CEDAR_ASSIGN_OR_RETURN(SwaSnapshot swa, model_->snapshot_swa(state));
    auto s = std::make_shared<DeepseekSnapshot>();
    s->length = swa.length;
    s->earliest_restore = swa.earliest_restore(model_->config().sliding_window);
    s->exact_layers = swa.exact_layers;
    s->bytes = swa.bytes();
    s->swa = std::move(swa);
    return std::shared_ptr<const SequenceSnapshot>(std::move(s));
  }
  bool global_kv_exact() const override { return state.global_kv_exact(); }
  SequenceState state;

 private:
  const DeepseekV41Model* model_;
  int64_t main_entry_bytes_, indexer_entry_bytes_;
};

// Prefix caching needs the shared pool and block spans that nest with every compress ratio.
std::optional<PrefixCacheSupport> deepseek_prefix_support(const DeepseekV41Model& model, const KvCacheOptions& kv,
                                                          std::string fingerprint) {
  if (kv.pool == nullptr) return std::nullopt;
  const ModelConfig& c = model.config();
  auto formats = kv_formats(KvDims{c.arch, c.head_dim, c.index_head_dim, c.qk_rope_head_dim}, kv.storage);
  if (!formats.ok()) return std::nullopt;
  auto streams = global_kv_streams(model.plan(), *formats, kv.tokens_per_block);
  if (!streams.ok() || streams->empty()) return std::nullopt;
  PrefixCacheSupport s;
  s.pool = kv.pool;
  for (const KvStreamSpec& st : *streams) {
    if (kv.tokens_per_block % st.ratio != 0) return std::nullopt;  // a block would cut a compress group
    auto cls = kv.pool->size_class(st.entries_per_block * st.format.record_bytes());
    if (!cls.ok()) return std::nullopt;
    s.stream_classes.push_back(*cls);
  }
  s.tokens_per_block = kv.tokens_per_block;
  // In-process identity unless a real fingerprint is given: the config and the plan's shape.
  s.fingerprint = !fingerprint.empty() ? std::move(fingerprint)
                                       : "config:" + c.source + ";layers=" + std::to_string(model.plan().num_layers()) +
                                             ";storage=" + std::to_string(static_cast<int>(kv.storage));
  s.sliding_window = c.sliding_window;
  s.exact_mode_layers = model.plan().num_layers();
  // ced snapshots hold the encoder and the (ExactSource) boundary layer, as SequenceState reports.
  s.ced_layers = model.plan().last_kv_source + 1;
  s.exact_mode_replay_rows = model.exact_replay_rows(ForwardMode::Exact);
  s.ced_replay_rows = model.exact_replay_rows(ForwardMode::Ced, CedBoundary::ExactSource);
  return s;
}

}  // namespace

DeepseekRunner::DeepseekRunner(const DeepseekV41Model& model, ThreadPool* pool, KvCacheOptions kv,
                               std::string fingerprint)
    : model_(&model), pool_(pool), kv_(std::move(kv)) {
  prefix_ = deepseek_prefix_support(model, kv_, std::move(fingerprint));
  const KvBudget budget = compute_kv_budget(model.config(), model.plan());
  footprint_.bytes_per_token = budget.bytes_per_token();
  footprint_.bytes_per_sequence = budget.swa_bytes_per_sequence;
  main_entry_bytes_ = budget.main_entry_bytes;
  indexer_entry_bytes_ = budget.indexer_entry_bytes;
}

int64_t DeepseekRunner::eos_token() const { return model_->config().eos_token_id; }

Result<std::unique_ptr<ModelSequence>> DeepseekRunner::create_sequence(const SequenceSpec& spec) {
  SequenceOptions so;
  so.mode = spec.mode;
  so.prompt_length = spec.prompt_length;
  so.ced_tail = spec.ced_tail;
  so.kv = kv_;
  so.swa_history = spec.swa_history;
  SequenceState state;
  if (spec.resume != nullptr) {
    const SequenceResume& r = *spec.resume;
    ResumeSpec rs;
    rs.cached_tokens = r.cached_tokens;
    rs.blocks = r.blocks;
    rs.restart = r.restart;
    rs.history = r.history;
    rs.prefix_exact = r.prefix_exact;
    if (r.snapshot != nullptr) {
      const auto* snap = dynamic_cast<const DeepseekSnapshot*>(r.snapshot.get());
      if (snap == nullptr) return make_error("DeepseekRunner: the SWA snapshot was not made by this runner");
      rs.swa = &snap->swa;
    }
    CEDAR_ASSIGN_OR_RETURN(state, model_->resume_sequence(so, rs));
  } else {
    CEDAR_ASSIGN_OR_RETURN(state, model_->new_sequence(so));
  }
  return std::unique_ptr<ModelSequence>(
      std::make_unique<DeepseekSequence>(*model_, std::move(state), main_entry_bytes_, indexer_entry_bytes_));
}

void DeepseekRunner::run_batch(std::span<BatchItem> items) {
  for (BatchItem& item : items) {
    const auto t0 = std::chrono::steady_clock::now();
    auto* seq = dynamic_cast<DeepseekSequence*>(item.sequence);
    if (seq == nullptr) {
      item.status = make_error("DeepseekRunner: sequence was not created by this runner");
      continue;
    }
    ForwardOptions fo;
    fo.pool = pool_;
    fo.logits = item.want_logits ? LogitRows::Last : LogitRows::None;
    auto out = model_->forward(item.tokens, seq->state, fo);
    if (!out.ok()) {
      item.status = out.error();
    } else if (item.want_logits) {
      if (out->positions.empty()) {
        item.status = make_error("forward returned no logit row for the chunk's last position");
      } else {
        item.logits.assign(out->logits.end() - out->vocab, out->logits.end());
        item.status = Status::Ok();
      }
    } else {
      item.status = Status::Ok();
    }
    item.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
}

}  // namespace cedar::engine
