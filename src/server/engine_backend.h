// GenerationBackend over the engine (engine/engine.h): the engine's step loop runs on its own thread;
// submit() / cancel() only queue work for it (the engine's own inbox), and stream callbacks run on the
// loop thread and only push into the HTTP request's queue, so no request ever blocks the loop.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "engine/engine.h"
#include "server/backend.h"

namespace cedar::server {

struct EngineBackendOptions {
  int64_t kv_capacity_bytes = int64_t{8} << 30;  // cache budget of all sequences together
  // The cache budget to use instead (a PoolCacheBudget whose pool the runner allocates from: needed for
  // prefix caching); it must outlive the backend. Null: a ByteCacheBudget of kv_capacity_bytes.
  engine::CacheBudget* budget = nullptr;
  engine::PrefixCacheOptions prefix_cache;
  // The SSD tier behind prefix_cache.store, when it is a KvDiskStore: its stats go to /metrics
  // (cedar_kv_disk_*). It must outlive the backend.
  const KvDiskStore* kv_disk = nullptr;
  int64_t max_running = 16;
  int64_t step_token_budget = 512;
  ForwardMode mode = ForwardMode::Ced;
  int64_t context_length = 4096;
  int64_t bos_token = -1;
};

class EngineBackend final : public GenerationBackend {
 public:
  // The runner (engine::DeepseekRunner for a model, engine::FakeModelRunner in tests) and the
  // tokenizer must outlive the backend.
  EngineBackend(engine::ModelRunner& runner, const text::Tokenizer& tokenizer, EngineBackendOptions options);
  ~EngineBackend() override;

  Result<BackendRequestId> submit(BackendRequest request, BackendCallback callback) override;
  void cancel(BackendRequestId id) override;
  BackendStats stats() const override;
  const text::Tokenizer& tokenizer() const override { return *tokenizer_; }
  int64_t context_length() const override { return context_length_; }
  int64_t bos_token() const override { return bos_; }
  void shutdown() override;

 private:
  void loop();

  const text::Tokenizer* tokenizer_;
  int64_t context_length_ = 0;
  int64_t bos_ = -1;
  std::unique_ptr<engine::ByteCacheBudget> own_budget_;
  engine::CacheBudget* budget_;
  engine::Engine engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  int64_t submitted_ = 0, finished_ = 0;  // guarded by mu_
  // Submitted and not yet taken as finished; cancelled at shutdown (guarded by mu_). An id that
  // finishes before submit() records it stays here harmlessly: the engine ignores unknown ids.
  std::set<engine::RequestId> live_;
  engine::PrefixCacheStats cache_stats_;  // copied after every step (guarded by mu_)
  const KvDiskStore* kv_disk_ = nullptr;
  std::thread thread_;
};

}  // namespace cedar::server
