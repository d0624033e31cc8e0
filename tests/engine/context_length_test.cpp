// serving_context_length (engine/context_length.h): explicit values against the rules (>= 1, <= the
// model's max_position_embeddings, one sequence fits the KV budget), the CPU default, and the up-front
// (GPU) default — worked examples by hand, then the defining properties (fits, maximal in whole blocks,
// bounded by the window and max_position_embeddings) over a grid of budgets and costs.
#include "engine/context_length.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace cedar::engine {
namespace {

ContextLimits tiny_gpu() {
  ContextLimits l;
  l.max_position_embeddings = 1 << 20;
  l.sliding_window = 128;
  l.kv_bytes_per_token = 70;
  l.kv_bytes_per_sequence = 0;
  l.kv_budget_bytes = int64_t{1} << 30;
  l.sized_up_front = true;
  l.device_bytes_per_position = 12288;
  return l;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ContextLength, ExplicitValuesAreCheckedAndKept) {
  ContextLimits l = tiny_gpu();
  for (bool up_front : {false, true}) {
    l.sized_up_front = up_front;
    EXPECT_EQ(*serving_context_length(l, 4096), 4096);
    EXPECT_EQ(*serving_context_length(l, 1), 1);
    // An explicit value is not capped by the device buffers (the load's memory plan decides).
    EXPECT_EQ(*serving_context_length(l, 1 << 20), 1 << 20);
    for (int64_t bad : {0, -5}) {
      auto r = serving_context_length(l, bad);
      ASSERT_FALSE(r.ok()) << bad;
      EXPECT_TRUE(contains(r.error().message, std::to_string(bad))) << r.error().message;
    }
    auto above = serving_context_length(l, (1 << 20) + 1);
    ASSERT_FALSE(above.ok());
    EXPECT_TRUE(contains(above.error().message, "1048577")) << above.error().message;
    EXPECT_TRUE(contains(above.error().message, "max_position_embeddings 1048576")) << above.error().message;
  }
}

TEST(ContextLength, ExplicitValueMustFitTheKvBudgetAlone) {
  ContextLimits l;
  l.max_position_embeddings = 1 << 20;
  l.kv_bytes_per_token = 100;
  l.kv_bytes_per_sequence = 1000;
  l.kv_budget_bytes = 100 * 5000 + 1000;  // exactly one sequence of 5000 positions
  EXPECT_EQ(*serving_context_length(l, 5000), 5000);
  auto r = serving_context_length(l, 5001);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.error().message, "context 5001")) << r.error().message;
  EXPECT_TRUE(contains(r.error().message, "KV budget")) << r.error().message;
  l.kv_budget_bytes = 0;  // unbounded
  EXPECT_EQ(*serving_context_length(l, 1 << 20), 1 << 20);
}

TEST(ContextLength, CpuDefaultIsTheModelsMaximum) {
  ContextLimits l = tiny_gpu();
  l.sized_up_front = false;
  EXPECT_EQ(*serving_context_length(l, std::nullopt), 1 << 20);
  l.kv_budget_bytes = 1 << 20;  // the CPU allocates as sequences grow: the budget does not shorten it
  EXPECT_EQ(*serving_context_length(l, std::nullopt), 1 << 20);
}

TEST(ContextLength, GpuDefaultWorkedExamples) {
  ContextLimits l = tiny_gpu();
  // 1 GiB / 12288 B of device buffers per position = 87381.33 → 87381 → whole 64-token blocks: 87360
  // (the KV alone would allow 1 GiB / 70 B = 15339168 positions).
  EXPECT_EQ(*serving_context_length(l, std::nullopt), 87360);
  // Without device buffers, the KV bound: (1 MiB − 4096 B) / 100 B = 10444.8 → 10444 → 10432.
  l.device_bytes_per_position = 0;
  l.kv_bytes_per_token = 100;
  l.kv_bytes_per_sequence = 4096;
  l.kv_budget_bytes = 1 << 20;
  EXPECT_EQ(*serving_context_length(l, std::nullopt), 10432);
  // A budget that affords more than the model reaches: max_position_embeddings.
  l.kv_budget_bytes = int64_t{1} << 40;
  EXPECT_EQ(*serving_context_length(l, std::nullopt), 1 << 20);
  // A budget below one window (or below the SWA rings alone): one window.
  l.kv_budget_bytes = 2000;
  EXPECT_EQ(*serving_context_length(l, std::nullopt), 128);
  // ... unless the window exceeds the model's maximum.
  l.max_position_embeddings = 100;
  EXPECT_EQ(*serving_context_length(l, std::nullopt), 100);
  // Unbounded budget: the model's maximum.
  l.max_position_embeddings = 1 << 20;
  l.kv_budget_bytes = 0;
  EXPECT_EQ(*serving_context_length(l, std::nullopt), 1 << 20);
}

TEST(ContextLength, GpuDefaultFitsAndIsMaximalInWholeBlocks) {
  for (int64_t max_pos : {int64_t{4096}, int64_t{1} << 20, int64_t{100000}}) {
    for (double bpt : {0.0, 70.0, 890.0, 3000.5}) {
      for (double dev : {0.0, 64.0, 9000.0, 12288.0}) {
        for (int64_t budget : {int64_t{1} << 16, int64_t{1} << 24, int64_t{1} << 30, int64_t{1} << 33}) {
          ContextLimits l;
          l.max_position_embeddings = max_pos;
          l.sliding_window = 128;
          l.kv_bytes_per_token = bpt;
          l.kv_bytes_per_sequence = 128 * 600;
          l.kv_budget_bytes = budget;
          l.sized_up_front = true;
          l.device_bytes_per_position = dev;
          auto r = serving_context_length(l, std::nullopt);
          ASSERT_TRUE(r.ok()) << r.error().message;
          const int64_t n = *r;
          const std::string where = "max_pos " + std::to_string(max_pos) + ", " + std::to_string(bpt) + " B/token, " +
                                    std::to_string(dev) + " B/position, budget " + std::to_string(budget) +
                                    ": context " + std::to_string(n);
          ASSERT_GE(n, 128) << where;
          ASSERT_LE(n, max_pos) << where;
          auto fits = [&](int64_t c) {
            return static_cast<double>(c) * bpt + static_cast<double>(l.kv_bytes_per_sequence) <=
                       static_cast<double>(budget) &&
                   static_cast<double>(c) * dev <= static_cast<double>(budget);
          };
          if (n > 128) {  // above the one-window floor: it fits, in whole blocks
            EXPECT_TRUE(fits(n)) << where;
            EXPECT_TRUE(n % 64 == 0 || n == max_pos) << where;
          }
          // Maximal: one more block either does not fit or passes the model's maximum.
          const int64_t next = (n / 64 + 1) * 64;
          EXPECT_TRUE(next > max_pos || !fits(next)) << where;
          // An explicit request of the default is accepted (it fits one sequence).
          if (n > 128) {
            EXPECT_TRUE(serving_context_length(l, n).ok()) << where;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace cedar::engine
