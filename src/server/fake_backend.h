// A deterministic GenerationBackend for server tests: each request's completion is a text chosen by a
// script function (default: a reasoning part, `</think>`, then an answer that names the seed and the
// prompt length), tokenized with the real tokenizer (control tokens such as `</think>` and the DSML
// markers stay single tokens) and streamed one token per tick from the backend's own thread, exactly
// like the engine's step loop. The stream ends with kStop when the script is exhausted (the EOS) or
// kLength at max_tokens. Logprobs are a pure function of position and token id.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "server/backend.h"

namespace cedar::server {

struct FakeBackendOptions {
  const text::Tokenizer* tokenizer = nullptr;  // required
  int64_t context_length = 4096;
  std::chrono::microseconds tick{0};  // pause between steps (simulates decode time)
  // Completion text of a request; default: default_fake_script.
  std::function<std::string(const BackendRequest&)> script;
  int64_t cached_prompt_tokens = 0;  // reported on every event
};

// "Thinking about seed S.</think>Answer for seed S: N prompt tokens." (S: seed or "none").
std::string default_fake_script(const BackendRequest& request);

// The logprob the fake reports for token `id` at output position `pos`.
double fake_logprob(size_t pos, int64_t id);

class FakeBackend final : public GenerationBackend {
 public:
  explicit FakeBackend(FakeBackendOptions options);
  ~FakeBackend() override;

  Result<BackendRequestId> submit(BackendRequest request, BackendCallback callback) override;
  void cancel(BackendRequestId id) override;
  BackendStats stats() const override;
  const text::Tokenizer& tokenizer() const override { return *options_.tokenizer; }
  int64_t context_length() const override { return options_.context_length; }
  int64_t bos_token() const override { return 0; }
  void shutdown() override;

  // Requests submitted and not yet finished (tests check that cancels free everything).
  int64_t live_requests() const;
  int64_t cancelled_requests() const { return cancelled_.load(); }

 private:
  struct Active {
    BackendRequest request;
    BackendCallback callback;
    std::vector<int64_t> tokens;  // the scripted completion
    size_t emitted = 0;
    std::string emitted_text;     // decoded text released so far
    bool cancel = false;
  };
  void loop();
  bool step_one(Active& a, bool cancelled);  // emits one event; true when finished

  FakeBackendOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<BackendRequestId, std::unique_ptr<Active>> active_;
  BackendRequestId next_id_ = 1;
  bool stopping_ = false;
  std::atomic<int64_t> cancelled_{0};
  std::thread thread_;
};

}  // namespace cedar::server
