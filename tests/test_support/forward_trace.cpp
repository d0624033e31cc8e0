#include "test_support/forward_trace.h"

#include <cstring>

namespace cedar::test_support {

size_t bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  size_t diffs = a.size() == b.size() ? 0 : std::max(a.size(), b.size());
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) diffs += std::memcmp(&a[i], &b[i], 4) != 0;
  return diffs;
}

void expect_bitwise_equal(const Trace& a, const Trace& b, const std::string& what) {
  ASSERT_EQ(a.positions, b.positions) << what;
  ASSERT_FALSE(a.last_logits.empty()) << what;
  ASSERT_EQ(a.hidden.size(), b.hidden.size()) << what;
  ASSERT_EQ(a.last_logits.size(), b.last_logits.size()) << what;
  EXPECT_EQ(bit_differences(a.hidden, b.hidden), 0u) << what << ": final hidden states differ";
  EXPECT_EQ(bit_differences(a.last_logits, b.last_logits), 0u) << what << ": last logits differ";
}

}  // namespace cedar::test_support
