// The engine's ModelRunner over a CudaModel (cuda_model.h): the scheduler, sampler, stop strings and the
// server's wire API run unchanged while the forward runs on the GPU. A batch's decode items (one token
// per sequence, past its prompt) run as one decode_step — the point of a GPU runner: the weights are
// read once per step for every sequence — and prompt chunks run one sequence at a time (prefill, split
// at max_chunk). Results do not depend on the batch: batched decode is bit-identical to one sequence
// at a time (tests/backend/cuda/cuda_model_cutest.cpp).
//
// Not supported yet: prefix caching (the device KV pool is not the engine's block pool, so
// prefix_cache() is empty and a resume is refused), SWA snapshots. The budget the engine schedules
// against must not exceed the device pool (cuda_runner_budget_bytes).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/cuda_model.h"
#include "engine/model_runner.h"

namespace cedar::cuda {

class CudaRunner final : public engine::ModelRunner {
 public:
  explicit CudaRunner(CudaModel& model);  // the model must outlive the runner and its sequences
  int64_t vocab_size() const override { return model_->config().vocab_size; }
  int64_t eos_token() const override { return model_->config().eos_token_id; }
  engine::CacheFootprint cache_footprint() const override { return footprint_; }
  Result<std::unique_ptr<engine::ModelSequence>> create_sequence(const engine::SequenceSpec& spec) override;
  void run_batch(std::span<engine::BatchItem> items) override;
  // Sequences a decode step takes at once (CudaModelOptions::max_batch): the engine's max_running.
  int64_t max_sequences() const;

 private:
  void run_prefill(engine::BatchItem& item);
  void run_decode(std::span<engine::BatchItem* const> items);
  CudaModel* model_;
  engine::CacheFootprint footprint_;
};

// The KV bytes the engine may schedule on `model`'s device pool (a ByteCacheBudget over the runner's
// cache_footprint): the pool's capacity less one block per stream and sequence of rounding, plus the
// SWA rings of every slot; never more than `requested` when that is > 0. The engine's max_running must
// not exceed max_sequences().
int64_t cuda_runner_budget_bytes(CudaModel& model, int64_t requested);

// The CudaModel options of a serving runner (cedar serve|run|chat --device cuda): up to `max_running`
// sequences decoded together (<= 64) of up to `context` positions each, and device pools for `kv_bytes`
// of KV at the packed bytes per token — at least one full context, at most every sequence at the full
// context (more could never be used).
struct CudaRunnerSizing {
  int64_t max_running = 16;
  int64_t kv_bytes = 0;
  int64_t context = 1;
};
CudaModelOptions cuda_runner_model_options(const ModelConfig& config, const LayerPlan& plan, const CudaRunnerSizing& s);

// Device bytes per context position of that model besides its KV pool: what its memory plan sizes by the
// context (the indexer's scores and selection workspace of a prefill chunk, the RoPE and KV block tables),
// as the slope of cuda_model_extra_plan between two contexts. Host arithmetic: no GPU needed.
Result<double> cuda_context_bytes_per_position(const ModelConfig& config, const LayerPlan& plan, int64_t max_running);

}  // namespace cedar::cuda
