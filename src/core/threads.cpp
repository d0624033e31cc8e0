#include "core/threads.h"

#include <algorithm>

namespace cedar {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  const int64_t max_chunks = std::max<int64_t>(1, n / min_chunk);
  const int64_t chunks = std::min<int64_t>(max_chunks, static_cast<int64_t>(size()) * 4);
  if (workers_.empty() || chunks == 1) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + chunks - 1) / chunks;
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  job_chunks_ = (n + chunk - 1) / chunk;
  next_chunk_ = 0;
  chunks_done_ = 0;
  ++generation_;
  start_cv_.notify_all();
  // The caller works too.
  while (next_chunk_ < job_chunks_) {
    const int64_t c = next_chunk_++;
    lock.unlock();
    fn(c * chunk, std::min(n, (c + 1) * chunk));
    lock.lock();
    ++chunks_done_;
  }
  done_cv_.wait(lock, [&] { return chunks_done_ == job_chunks_; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int /*index*/) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    start_cv_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ != nullptr); });
    if (stop_) return;
    seen = generation_;
    while (job_ != nullptr && next_chunk_ < job_chunks_) {
      const int64_t c = next_chunk_++;
      const auto* fn = job_;
      const int64_t n = job_n_, chunk = job_chunk_;
      lock.unlock();
      (*fn)(c * chunk, std::min(n, (c + 1) * chunk));
      lock.lock();
      if (++chunks_done_ == job_chunks_) done_cv_.notify_all();
    }
  }
}

}  // namespace cedar
