// Server metrics in Prometheus text format (GET /metrics): request counts by endpoint and status,
// prompt / generation / cached token counters, TTFT / TPOT / end-to-end latency histograms, in-flight
// requests, and the backend's KV usage and prefix-cache hit rate. Thread-safe; one instance per server.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "server/backend.h"

namespace cedar::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Appends the _bucket / _sum / _count lines of metric `name`.
  void render(const std::string& name, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last: +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct RequestRecord {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  double ttft_s = -1;  // < 0: no token
  double e2e_s = 0;
};

class Metrics {
 public:
  Metrics();
  void count_request(const std::string& endpoint, int status);
  void record_generation(const RequestRecord& r);
  void set_inflight(int64_t n);
  std::string render(const BackendStats& backend) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0, cached_tokens_ = 0;
  int64_t inflight_ = 0;
  Histogram ttft_, tpot_, e2e_;
};

}  // namespace cedar::server
