#include "engine/context_length.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace cedar::engine {
namespace {

std::string mib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / static_cast<double>(1 << 20));
  return buf;
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Positions of `bytes` at `per_position` bytes each, clamped to [0, cap] (no overflow for tiny costs).
int64_t positions_of(double bytes, double per_position, int64_t cap) {
  if (bytes < 0) return 0;
  if (per_position <= 0) return cap;
  const double n = std::floor(bytes / per_position);
  return n <= 0 ? 0 : n >= static_cast<double>(cap) ? cap : static_cast<int64_t>(n);
}

}  // namespace

Result<int64_t> serving_context_length(const ContextLimits& l, std::optional<int64_t> requested) {
  const int64_t max_pos = l.max_position_embeddings;
  if (max_pos < 1) return make_error("the model's max_position_embeddings is " + std::to_string(max_pos));
  const bool bounded = l.kv_budget_bytes > 0;
  if (requested) {
    const int64_t n = *requested;
    if (n < 1) return make_error("context " + std::to_string(n) + " must be at least 1 position");
    if (n > max_pos)
      return make_error("context " + std::to_string(n) + " exceeds the model's max_position_embeddings " +
                        std::to_string(max_pos));
    const double need = static_cast<double>(n) * l.kv_bytes_per_token + static_cast<double>(l.kv_bytes_per_sequence);
    if (bounded && need > static_cast<double>(l.kv_budget_bytes))
      return make_error("context " + std::to_string(n) + " needs " + mib(need) + " of KV for one sequence (" +
                        std::to_string(n) + " x " + num(l.kv_bytes_per_token) + " B per position + " +
                        std::to_string(l.kv_bytes_per_sequence) + " B of SWA rings), more than the KV budget of " +
                        mib(static_cast<double>(l.kv_budget_bytes)));
    return n;
  }
  if (!l.sized_up_front || !bounded) return max_pos;
  // A plan sized for the context spends its buffers whether or not a sequence gets that long: the default
  // is what the budget the user gave affords, not what the model could reach.
  const double budget = static_cast<double>(l.kv_budget_bytes);
  const int64_t by_kv =
      positions_of(budget - static_cast<double>(l.kv_bytes_per_sequence), l.kv_bytes_per_token, max_pos);
  const int64_t by_device = positions_of(budget, l.device_bytes_per_position, max_pos);
  int64_t n = std::min(by_kv, by_device);
  if (l.tokens_per_block > 1 && n < max_pos) n -= n % l.tokens_per_block;
  n = std::max(n, l.sliding_window);
  return std::clamp<int64_t>(n, 1, max_pos);
}

}  // namespace cedar::engine
