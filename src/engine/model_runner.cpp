#include "engine/model_runner.h"

#include <chrono>

#include "model/model_stats.h"

namespace cedar::engine {

Result<std::vector<std::vector<BlockId>>> ModelSequence::prefix_blocks(int64_t) const {
  return make_error("this model runner does not export prefix-cache blocks");
}

Result<std::shared_ptr<const SequenceSnapshot>> ModelSequence::snapshot() const {
  return make_error("this model runner does not snapshot SWA state");
}

namespace {

class DeepseekSequence final : public ModelSequence {
 public:
  DeepseekSequence(SequenceState s, int64_t main_entry_bytes, int64_t indexer_entry_bytes)
      : state(std::move(s)), main_entry_bytes_(main_entry_bytes), indexer_entry_bytes_(indexer_entry_bytes) {}
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
  SequenceState state;

 private:
  int64_t main_entry_bytes_, indexer_entry_bytes_;
};

}  // namespace

DeepseekRunner::DeepseekRunner(const DeepseekV41Model& model, ThreadPool* pool, KvCacheOptions kv)
    : model_(&model), pool_(pool), kv_(std::move(kv)) {
  const KvBudget budget = compute_kv_budget(model.config(), model.plan());
  footprint_.bytes_per_token = budget.bytes_per_token();
  footprint_.bytes_per_sequence = budget.swa_bytes_per_sequence;
  main_entry_bytes_ = budget.main_entry_bytes;
  indexer_entry_bytes_ = budget.indexer_entry_bytes;
}

int64_t DeepseekRunner::eos_token() const { return model_->config().eos_token_id; }

Result<std::unique_ptr<ModelSequence>> DeepseekRunner::create_sequence(const SequenceSpec& spec) {
  if (spec.resume != nullptr) return make_error("DeepseekRunner: resuming from the prefix cache is not available yet");
  SequenceOptions so;
  so.mode = spec.mode;
  so.prompt_length = spec.prompt_length;
  so.ced_tail = spec.ced_tail;
  so.kv = kv_;
  CEDAR_ASSIGN_OR_RETURN(SequenceState state, model_->new_sequence(so));
  return std::unique_ptr<ModelSequence>(
      std::make_unique<DeepseekSequence>(std::move(state), main_entry_bytes_, indexer_entry_bytes_));
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
