// RAII CUDA stream and event pair, and an event-based timer for benchmarks and `cedar doctor`.
// C++17 (included from .cu files).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_status.h"

namespace cedar::cuda {

class Stream {
 public:
  Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  ~Stream() { reset(); }

  // A non-blocking stream (does not synchronize with the legacy default stream).
  static Result<Stream> create() {
    Stream s;
    CEDAR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking));
    return Result<Stream>(std::move(s));
  }
  cudaStream_t get() const { return s_; }
  Status synchronize() const { return cuda_status(cudaStreamSynchronize(s_), "cudaStreamSynchronize"); }

 private:
  void reset() {
    if (s_) cudaStreamDestroy(s_);
    s_ = nullptr;
  }
  cudaStream_t s_ = nullptr;
};

// Times work enqueued on one stream between start() and stop_ms() with a pair of CUDA events.
class EventTimer {
 public:
  EventTimer() = default;
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  ~EventTimer() {
    if (start_) cudaEventDestroy(start_);
    if (stop_) cudaEventDestroy(stop_);
  }
  Status init() {
    CEDAR_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start_));
    CEDAR_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop_));
    return Status::Ok();
  }
  Status start(cudaStream_t s) { return cuda_status(cudaEventRecord(start_, s), "cudaEventRecord(start)"); }
  // Records the stop event, waits for it and returns the elapsed milliseconds.
  Result<float> stop_ms(cudaStream_t s) {
    CEDAR_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop_, s));
    CEDAR_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    CEDAR_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace cedar::cuda
