// What the forward tests compare between two runs of a model: the final hidden states of every computed
// position and the logits of the last one, fed in chunks, with a bit-for-bit comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/forward_types.h"

namespace cedar::test_support {

struct Trace {
  std::vector<float> hidden;  // "final_norm" rows: [positions, d]
  std::vector<int64_t> positions;
  std::vector<float> last_logits;  // [vocab]
};

// Final hidden states (the head's input, "final_norm") of every computed position for `ids` on a new
// sequence, fed in chunks of `chunk` (0 = one call), and the logits of the last position. Comparing the
// hidden states instead of every logit row keeps the tests fast (the 129 280-row head dominates the tiny
// model). Model: DeepseekV41Model or DeepseekV4Model.
template <class Model>
Trace run_trace(const Model& model, const std::vector<int64_t>& ids, int64_t chunk, const SequenceOptions& so = {},
                ThreadPool* pool = nullptr) {
  Trace trace;
  auto state = model.new_sequence(so);
  EXPECT_TRUE(state.ok()) << state.error().message;
  if (!state.ok()) return trace;
  ForwardOptions fo;
  fo.pool = pool;
  fo.sink = [&trace](const TensorRecord& r) {
    if (r.name != "final_norm") return;
    trace.hidden.insert(trace.hidden.end(), r.data.begin(), r.data.end());
    for (int64_t i = 0; i < r.rows; ++i) trace.positions.push_back(r.pos0 + i);
  };
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t step = chunk > 0 ? chunk : n;
  for (int64_t p = 0; p < n; p += step) {
    const int64_t len = std::min(step, n - p);
    fo.logits = p + len == n ? LogitRows::Last : LogitRows::None;
    auto out = model.forward(std::span<const int64_t>(ids).subspan(static_cast<size_t>(p), static_cast<size_t>(len)),
                             *state, fo);
    EXPECT_TRUE(out.ok()) << out.error().message;
    if (!out.ok()) return trace;
    if (!out->logits.empty()) trace.last_logits = out->logits;
  }
  return trace;
}

// Elements whose bits differ; a size difference counts as the larger size.
size_t bit_differences(const std::vector<float>& a, const std::vector<float>& b);

// The same positions, non-empty last logits of the same size, and hidden states and logits equal bit for bit.
void expect_bitwise_equal(const Trace& a, const Trace& b, const std::string& what);

}  // namespace cedar::test_support
