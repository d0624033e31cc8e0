// Internal to src/model: the pieces the CPU forwards of both architectures (deepseek_v4.cpp,
// deepseek_v41.cpp) and their attention modules (attention.cpp, attention_v4.cpp) share — row helpers,
// weight shape checks, the common opening of load(), the embedding lookup and the fp32 head.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/status.h"
#include "core/threads.h"
#include "io/config.h"
#include "model/attention_params.h"
#include "model/forward_types.h"
#include "model/layer_plan.h"
#include "model/mhc.h"
#include "model/moe.h"
#include "model/weight_binding.h"

namespace cedar::model_detail {

inline std::string str(int64_t v) { return std::to_string(v); }

// fn(t0, t1) over rows [0, n): split across `pool` when there is one and more than one row.
inline void for_rows(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool && n > 1)
    pool->parallel_for(n, fn);
  else
    fn(0, n);
}

// Row t of a row-major [rows, width] array.
template <typename T>
std::span<T> row(std::vector<T>& v, int64_t t, int64_t width) {
  return std::span<T>(v).subspan(static_cast<size_t>(t * width), static_cast<size_t>(width));
}
template <typename T>
std::span<const T> row(const std::vector<T>& v, int64_t t, int64_t width) {
  return std::span<const T>(v).subspan(static_cast<size_t>(t * width), static_cast<size_t>(width));
}

// Hands rows [pos0, pos0 + rows) of a dump tensor (`width` values a row) to the options' sink, if any.
inline void emit(const ForwardOptions& o, const std::string& name, int64_t pos0, int64_t rows, int64_t width,
                 std::span<const float> data) {
  if (o.sink) o.sink(TensorRecord{name, pos0, rows, width, data.first(static_cast<size_t>(rows * width))});
}

// A bound linear weight is present and [out, in]; the error names it.
Status check_linear(const cpu::LinearWeight& w, const std::string& name, int64_t out, int64_t in);
// A bound vector has `size` values; the error names it.
Status check_vector(std::span<const float> v, const std::string& name, int64_t size);

// What both architectures load the same way: the model directory, its config, layer plan, bound
// weights and the module parameters derived from the config.
struct LoadedModel {
  std::filesystem::path dir;  // `path` itself, or the folder of a single-file checkpoint
  ModelConfig config;
  LayerPlan plan;
  BoundWeights weights;
  HcParams hc;
  AttentionParams attn;
  MoeParams moe;
};

// The opening of load(): `path` exists, its config.json is of `arch` (else "<config>: <expects> (config is
// <arch>)"), then the layer plan, the checkpoint bound to it (`pool` parallelizes the conversions) and
// the mHC, attention and MoE parameters.
Result<LoadedModel> load_model(const std::filesystem::path& path, Arch arch, std::string_view expects,
                               ThreadPool* pool);

// Every layer's two mHC sites against `hc`; the error names the layer.
Status check_layer_hc_weights(const LayerPlan& plan, const BoundWeights& weights, const HcParams& hc);

// Token ids in [0, vocab); the error names the first id outside and its position (`pos0` + index).
Status check_token_ids(std::span<const int64_t> tokens, int64_t pos0, int64_t vocab);

// §3.2: x [n, d] = the BF16 embedding rows of `tokens`, X [n, hc·d] = hc copies of each (the residual
// streams), with d and hc from `c`.
void embed_rows(const ModelConfig& c, const cpu::LinearWeight& embed, std::span<const int64_t> tokens,
                std::vector<float>& x, std::vector<float>& X, ThreadPool* pool);

// The fp32 head (§2.3: BF16 weights multiplied and accumulated in fp32, the output not rounded) over the
// final-normed rows `xn` [n, d] of a chunk at pos0: all rows, or only the last for LogitRows::Last.
// Appends their logits and positions to `out` and emits "logits".
Status head_rows(const ModelConfig& c, const cpu::LinearWeight& head, const std::vector<float>& xn, int64_t n,
                 int64_t pos0, const ForwardOptions& options, ForwardOutput& out);

}  // namespace cedar::model_detail
