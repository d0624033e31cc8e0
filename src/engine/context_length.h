// The context one sequence may reach (prompt + output positions) when serving: `cedar serve|run|chat
// --context N`, or its default (docs/server.md "Context length"). The server rejects prompts that leave
// no room in it (context_length_exceeded) and clamps max_tokens to what it leaves; on the GPU it also
// sizes the device plan (block tables, RoPE tables, the indexer's per-chunk scores), which is why the GPU
// default follows the KV budget instead of max_position_embeddings.
#pragma once

#include <cstdint>
#include <optional>

#include "core/status.h"

namespace cedar::engine {

struct ContextLimits {
  int64_t max_position_embeddings = 0;  // the model's (config.json)
  int64_t sliding_window = 0;           // the default is at least one window
  double kv_bytes_per_token = 0;        // global KV of one position (KvBudget::bytes_per_token)
  int64_t kv_bytes_per_sequence = 0;    // fixed per sequence (its SWA rings)
  int64_t kv_budget_bytes = 0;          // KV budget of all sequences together (<= 0: unbounded)
  // The plan is sized for the context when the model loads (the GPU); the CPU allocates as sequences grow.
  bool sized_up_front = false;
  // With sized_up_front: device bytes the plan spends per context position besides the KV pool.
  double device_bytes_per_position = 0;
  int64_t tokens_per_block = 64;  // the default is rounded down to whole KV blocks
};

// `requested` (--context N) must be >= 1 and <= max_position_embeddings, and one sequence of N positions
// must fit the KV budget (N × kv_bytes_per_token + kv_bytes_per_sequence); the errors name both numbers.
// Without a request: max_position_embeddings, unless sized_up_front — then the longest context for which
// both one sequence's KV and the context's device buffers (N × device_bytes_per_position) fit the KV
// budget, in whole blocks, at least one sliding window, at most max_position_embeddings.
Result<int64_t> serving_context_length(const ContextLimits& limits, std::optional<int64_t> requested);

}  // namespace cedar::engine
