// libFuzzer target: a checkpoint's config.json as `cedar inspect`, `serve` and `bench` read it before any
// weight: parse_model_config, the layer plan, the expected tensors, the model's parameter and byte
// counts, the memory plan, the KV budget and the SSD tier's block layout. A config is user input (any
// directory a user points cedar at); every step must return a value or an error naming the field, never
// crash, overflow (UBSan) or allocate without bound. Byte 0 is unused (room for options); the rest is
// the JSON text.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config.h"
#include "kv/kv_disk_store.h"
#include "model/layer_plan.h"
#include "model/model_stats.h"
#include "model/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  auto config = cedar::parse_model_config(j, "config.json");
  if (!config.ok()) return 0;
  auto plan = cedar::build_layer_plan(*config);
  if (!plan.ok()) return 0;
  auto weights = cedar::expected_weights(*config, *plan);
  if (!weights.ok()) return 0;
  const cedar::ModelStats stats = cedar::compute_model_stats(*config, *plan, *weights, std::nullopt);
  (void)cedar::plan_memory(stats, cedar::MemoryPlanOptions{});
  (void)cedar::compute_kv_budget(*config, *plan);
  (void)cedar::kv_disk_layout_for(*config, *plan, 64);
  return 0;
}
