#include "server/metrics.h"

#include <cstdio>

namespace cedar::server {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, std::string& out) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + num(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}),
      tpot_({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}),
      e2e_({0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800}) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::record_generation(const RequestRecord& r) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += static_cast<uint64_t>(r.prompt_tokens);
  generation_tokens_ += static_cast<uint64_t>(r.completion_tokens);
  cached_tokens_ += static_cast<uint64_t>(r.cached_tokens);
  if (r.ttft_s >= 0) {
    ttft_.observe(r.ttft_s);
    if (r.completion_tokens > 1) tpot_.observe((r.e2e_s - r.ttft_s) / static_cast<double>(r.completion_tokens - 1));
  }
  e2e_.observe(r.e2e_s);
}

void Metrics::set_inflight(int64_t n) {
  std::lock_guard lock(mu_);
  inflight_ = n;
}

std::string Metrics::render(const BackendStats& b) const {
  std::lock_guard lock(mu_);
  std::string out;
  out += "# HELP cedar_requests_total HTTP requests by endpoint and status code.\n# TYPE cedar_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += "cedar_requests_total{endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " +
           std::to_string(n) + "\n";
  out += "# HELP cedar_prompt_tokens_total Prompt tokens of finished generations.\n# TYPE cedar_prompt_tokens_total counter\n";
  out += "cedar_prompt_tokens_total " + std::to_string(prompt_tokens_) + "\n";
  out += "# HELP cedar_generation_tokens_total Generated tokens.\n# TYPE cedar_generation_tokens_total counter\n";
  out += "cedar_generation_tokens_total " + std::to_string(generation_tokens_) + "\n";
  out += "# HELP cedar_prompt_cached_tokens_total Prompt tokens served from the prefix cache.\n# TYPE cedar_prompt_cached_tokens_total counter\n";
  out += "cedar_prompt_cached_tokens_total " + std::to_string(cached_tokens_) + "\n";
  out += "# HELP cedar_prefix_cache_hit_rate Cached / prompt tokens over all finished generations.\n# TYPE cedar_prefix_cache_hit_rate gauge\n";
  out += "cedar_prefix_cache_hit_rate " +
         num(prompt_tokens_ ? static_cast<double>(cached_tokens_) / static_cast<double>(prompt_tokens_) : 0.0) + "\n";
  // The engine's prefix cache (docs/prefix_cache.md): what it looked up and found at admission, and what
  // it holds. The hit rate here is over admissions; cedar_prefix_cache_hit_rate above is over finished
  // generations as reported in usage.
  auto gauge = [&](const char* name, const char* help, const char* type, double v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + num(v) + "\n";
  };
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  gauge("cedar_prefix_cache_enabled", "1 when the engine's prefix cache is on.", "gauge", b.prefix_cache_enabled ? 1 : 0);
  gauge("cedar_prefix_cache_lookup_tokens_total", "Prompt tokens looked up in the prefix cache at admission.", "counter",
        d(b.prefix_cache_queries));
  gauge("cedar_prefix_cache_hit_tokens_total", "Prompt tokens resumed from cached global KV.", "counter",
        d(b.prefix_cache_hits));
  gauge("cedar_prefix_cache_lookup_hit_rate", "Hit tokens / lookup tokens.", "gauge",
        b.prefix_cache_queries ? d(b.prefix_cache_hits) / d(b.prefix_cache_queries) : 0.0);
  gauge("cedar_prefix_cache_replayed_tokens_total", "Cached tokens re-run to rebuild sliding-window state.", "counter",
        d(b.prefix_cache_replayed_tokens));
  gauge("cedar_prefix_cache_snapshot_restores_total", "Hits whose SWA state came from a snapshot.", "counter",
        d(b.prefix_cache_snapshot_restores));
  gauge("cedar_prefix_cache_replay_restores_total", "Hits whose SWA state was rebuilt by replay (no snapshot).",
        "counter", d(b.prefix_cache_replay_restores));
  gauge("cedar_prefix_cache_window_replay_restores_total",
        "Replays of the window only (--swa-replay window): approximate.", "counter",
        d(b.prefix_cache_window_replay_restores));
  gauge("cedar_prefix_cache_approximate_restores_total", "Hits not bitwise equal to an uncached run.", "counter",
        d(b.prefix_cache_approximate_restores));
  gauge("cedar_prefix_cache_index_bytes", "Global-KV bytes the prefix index holds.", "gauge", d(b.prefix_cache_index_bytes));
  gauge("cedar_prefix_cache_index_blocks", "Cache blocks the prefix index holds.", "gauge", d(b.prefix_cache_index_blocks));
  gauge("cedar_prefix_cache_evicted_blocks_total", "Cache blocks evicted from memory.", "counter",
        d(b.prefix_cache_evicted_blocks));
  gauge("cedar_prefix_cache_store_loaded_blocks_total", "Cache blocks loaded from the second tier (SSD).", "counter",
        d(b.prefix_cache_store_loaded_blocks));
  gauge("cedar_swa_pool_bytes", "Host bytes of the SWA snapshot pool.", "gauge", d(b.swa_pool_bytes));
  gauge("cedar_swa_pool_entries", "Snapshots in the SWA pool.", "gauge", d(b.swa_pool_entries));
  // The SSD tier (KvDiskStoreStats), only with --kv-cache-dir.
  gauge("cedar_kv_disk_enabled", "1 when the prefix cache has an SSD tier (--kv-cache-dir).", "gauge",
        b.kv_disk ? 1 : 0);
  if (b.kv_disk) {
    const KvDiskStoreStats& k = *b.kv_disk;
    gauge("cedar_kv_disk_files", "Cache block files in the SSD tier.", "gauge", d(k.files));
    gauge("cedar_kv_disk_bytes", "Bytes of the SSD tier's block files.", "gauge", d(k.bytes));
    gauge("cedar_kv_disk_budget_bytes", "The SSD tier's size budget.", "gauge", d(k.budget_bytes));
    gauge("cedar_kv_disk_puts_total", "Blocks written to the SSD tier.", "counter", d(k.puts));
    gauge("cedar_kv_disk_put_errors_total", "Failed SSD tier writes.", "counter", d(k.put_errors));
    gauge("cedar_kv_disk_puts_skipped_total", "Writes of blocks the SSD tier already held (not rewritten).", "counter",
          d(k.puts_skipped));
    gauge("cedar_kv_disk_gets_total", "SSD tier reads.", "counter", d(k.gets));
    gauge("cedar_kv_disk_hits_total", "SSD tier reads that returned a block.", "counter", d(k.hits));
    gauge("cedar_kv_disk_misses_total", "SSD tier reads without a usable block (damaged files included).", "counter",
          d(k.misses));
    gauge("cedar_kv_disk_corrupt_total", "Damaged or foreign block files dropped (the prefix was recomputed).",
          "counter", d(k.corrupt));
    gauge("cedar_kv_disk_evictions_total", "Block files deleted for the size budget.", "counter", d(k.evictions));
    gauge("cedar_kv_disk_read_bytes_total", "Bytes read from the SSD tier.", "counter", d(k.bytes_read));
    gauge("cedar_kv_disk_written_bytes_total", "Bytes written to the SSD tier.", "counter", d(k.bytes_written));
  }
  out += "# HELP cedar_requests_inflight Generation requests being served.\n# TYPE cedar_requests_inflight gauge\n";
  out += "cedar_requests_inflight " + std::to_string(inflight_) + "\n";
  out += "# TYPE cedar_requests_running gauge\ncedar_requests_running " + std::to_string(b.running) + "\n";
  out += "# TYPE cedar_requests_waiting gauge\ncedar_requests_waiting " + std::to_string(b.waiting) + "\n";
  out += "# HELP cedar_kv_cache_usage KV cache bytes held by sequences / capacity (cached prefixes not included).\n# TYPE cedar_kv_cache_usage gauge\n";
  out += "cedar_kv_cache_usage " +
         num(b.kv_capacity_bytes ? static_cast<double>(b.kv_used_bytes) / static_cast<double>(b.kv_capacity_bytes) : 0.0) +
         "\n";
  out += "# TYPE cedar_kv_cache_used_bytes gauge\ncedar_kv_cache_used_bytes " + std::to_string(b.kv_used_bytes) + "\n";
  out += "# TYPE cedar_kv_cache_capacity_bytes gauge\ncedar_kv_cache_capacity_bytes " + std::to_string(b.kv_capacity_bytes) + "\n";
  out += "# HELP cedar_time_to_first_token_seconds Submit to first token.\n# TYPE cedar_time_to_first_token_seconds histogram\n";
  ttft_.render("cedar_time_to_first_token_seconds", out);
  out += "# HELP cedar_time_per_output_token_seconds Mean decode time per token after the first.\n# TYPE cedar_time_per_output_token_seconds histogram\n";
  tpot_.render("cedar_time_per_output_token_seconds", out);
  out += "# HELP cedar_e2e_request_latency_seconds Submit to finish.\n# TYPE cedar_e2e_request_latency_seconds histogram\n";
  e2e_.render("cedar_e2e_request_latency_seconds", out);
  return out;
}

}  // namespace cedar::server
