#include "backend/cuda/cuda_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "model/model_stats.h"

namespace cedar::cuda {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

class CudaRunnerSequence final : public engine::ModelSequence {
 public:
  CudaRunnerSequence(CudaSequence s, int64_t prompt) : seq(std::move(s)), prompt_length(prompt) {}
  int64_t length() const override { return seq.length; }
  CudaSequence seq;
  int64_t prompt_length;  // rows before it are prompt rows (prefill), later single tokens decode
};

using Clock = std::chrono::steady_clock;

// Enqueues the copy of row `row` of the step's device logits into `logits` (valid after a
// synchronize of the model's stream).
Status enqueue_row(const CudaModel& m, const CudaStepOutput& out, int64_t row, std::vector<float>& logits) {
  const int64_t V = m.config().vocab_size;
  if (out.logits == nullptr || row < 0 || row >= out.rows)
    return make_error("no logit row " + str(row) + " in a step of " + str(out.rows) + " rows");
  logits.resize(static_cast<size_t>(V));
  return cuda_status(cudaMemcpyAsync(logits.data(), out.logits + row * V, V * sizeof(float), cudaMemcpyDeviceToHost,
                                     m.stream()),
                     "cudaMemcpyAsync(logits)");
}

Status synchronize(const CudaModel& m) {
  return cuda_status(cudaStreamSynchronize(m.stream()), "cudaStreamSynchronize(logits)");
}

}  // namespace

CudaRunner::CudaRunner(CudaModel& model) : model_(&model) {
  const KvBudget b = compute_kv_budget(model.config(), model.plan());
  footprint_.bytes_per_token = b.bytes_per_token();
  footprint_.bytes_per_sequence = b.swa_bytes_per_sequence;
}

int64_t CudaRunner::max_sequences() const { return model_->options().max_batch; }

Result<std::unique_ptr<engine::ModelSequence>> CudaRunner::create_sequence(const engine::SequenceSpec& spec) {
  if (spec.resume != nullptr)
    return make_error("CudaRunner: resuming from a cached prefix is not supported on the GPU yet");
  SequenceOptions so;
  so.mode = spec.mode;
  so.prompt_length = spec.prompt_length;
  so.ced_tail = spec.ced_tail;
  so.swa_history = spec.swa_history;
  CEDAR_ASSIGN_OR_RETURN(CudaSequence s, model_->new_sequence(so));
  return std::unique_ptr<engine::ModelSequence>(std::make_unique<CudaRunnerSequence>(std::move(s), spec.prompt_length));
}

void CudaRunner::run_batch(std::span<engine::BatchItem> items) {
  std::vector<engine::BatchItem*> decode;
  for (engine::BatchItem& item : items) {
    auto* s = dynamic_cast<CudaRunnerSequence*>(item.sequence);
    if (s == nullptr) {
      item.status = make_error("CudaRunner: sequence was not created by this runner");
      continue;
    }
    // One token past the prompt: a decode row of this step's batch. Prompt chunks (any length) prefill.
    if (item.tokens.size() == 1 && s->seq.length >= s->prompt_length)
      decode.push_back(&item);
    else
      run_prefill(item);
  }
  const size_t cap = static_cast<size_t>(std::max<int64_t>(1, max_sequences()));
  for (size_t i = 0; i < decode.size(); i += cap)
    run_decode(std::span<engine::BatchItem* const>(decode.data() + i, std::min(cap, decode.size() - i)));
}

void CudaRunner::run_prefill(engine::BatchItem& item) {
  const auto t0 = Clock::now();
  CudaSequence& seq = static_cast<CudaRunnerSequence*>(item.sequence)->seq;
  const int64_t chunk = std::max<int64_t>(1, model_->options().max_chunk);
  const int64_t n = static_cast<int64_t>(item.tokens.size());
  CudaStepOutput out;
  Status st;
  for (int64_t i = 0; i < n && st.ok(); i += chunk) {
    const int64_t m = std::min(chunk, n - i);
    const bool last = i + m == n;
    st = model_->prefill(seq, item.tokens.subspan(static_cast<size_t>(i), static_cast<size_t>(m)),
                         last && item.want_logits ? LogitRows::Last : LogitRows::None, out);
  }
  if (st.ok() && item.want_logits) {
    // The chunk's last row is computed unless it precedes the CED replay start (then no logits exist).
    st = out.rows > 0 ? enqueue_row(*model_, out, out.rows - 1, item.logits)
                      : make_error("prefill returned no logit row for the chunk's last position");
    if (st.ok()) st = synchronize(*model_);
  }
  item.status = st;
  item.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
}

void CudaRunner::run_decode(std::span<engine::BatchItem* const> items) {
  const auto t0 = Clock::now();
  std::vector<CudaSequence*> seqs;
  std::vector<int64_t> tokens;
  for (engine::BatchItem* item : items) {
    seqs.push_back(&static_cast<CudaRunnerSequence*>(item->sequence)->seq);
    tokens.push_back(item->tokens[0]);
  }
  CudaStepOutput out;
  Status st = model_->decode_step(seqs, tokens, out);
  for (size_t i = 0; i < items.size(); ++i) {
    engine::BatchItem& item = *items[i];
    item.status = st.ok() && item.want_logits ? enqueue_row(*model_, out, static_cast<int64_t>(i), item.logits) : st;
  }
  // One wait for every row's copy.
  if (const Status synced = synchronize(*model_); !synced.ok())
    for (engine::BatchItem* item : items)
      if (item->status.ok()) item->status = synced;
  // The step's wall time, split evenly over its rows (the engine sums item times per request).
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(items.size());
  for (engine::BatchItem* item : items) item->seconds = secs;
}

int64_t cuda_runner_budget_bytes(CudaModel& model, int64_t requested) {
  // The engine counts packed bytes per token (+ the SWA rings per sequence); the device pool allocates
  // whole blocks per stream, so each live sequence may hold up to one block per stream more than that.
  DeviceKvPool& pool = model.kv_pool();
  const int64_t sequences = model.options().kv.max_sequences;
  const int64_t slack = sequences * pool.geometry().bytes_for(1);
  const KvBudget b = compute_kv_budget(model.config(), model.plan());
  const int64_t cap = std::max<int64_t>(0, pool.stats().capacity_bytes - slack) + sequences * b.swa_bytes_per_sequence;
  return requested > 0 ? std::min(requested, cap) : cap;
}

CudaModelOptions cuda_runner_model_options(const ModelConfig& c, const LayerPlan& plan, const CudaRunnerSizing& s) {
  const KvBudget kv = compute_kv_budget(c, plan);
  CudaModelOptions o;
  o.max_batch = std::clamp<int64_t>(s.max_running, 1, 64);
  o.kv.max_sequences = o.max_batch;
  o.kv.max_context = std::max<int64_t>(1, s.context);
  const int64_t all = o.kv.max_sequences * o.kv.max_context;
  const double budget_positions = kv.bytes_per_token() > 0
                                      ? static_cast<double>(std::max<int64_t>(0, s.kv_bytes)) / kv.bytes_per_token()
                                      : static_cast<double>(all);
  const int64_t positions = budget_positions >= static_cast<double>(all) ? all : static_cast<int64_t>(budget_positions);
  o.kv.token_capacity = std::clamp(positions, o.kv.max_context, all);
  return o;
}

Result<double> cuda_context_bytes_per_position(const ModelConfig& c, const LayerPlan& plan, int64_t max_running) {
  constexpr int64_t kLow = int64_t{1} << 16, kHigh = int64_t{1} << 20;
  auto device_bytes = [&](int64_t context) -> Result<double> {
    CudaModelOptions o = cuda_runner_model_options(c, plan, {max_running, 0, context});
    o.kv.token_capacity = kHigh;  // the same pool at both contexts: only the context's buffers differ
    CEDAR_ASSIGN_OR_RETURN(const DeviceMemoryPlan p, cuda_model_extra_plan(c, plan, o));
    return static_cast<double>(p.device_bytes());
  };
  CEDAR_ASSIGN_OR_RETURN(const double low, device_bytes(kLow));
  CEDAR_ASSIGN_OR_RETURN(const double high, device_bytes(kHigh));
  return std::max(0.0, (high - low) / static_cast<double>(kHigh - kLow));
}

}  // namespace cedar::cuda
