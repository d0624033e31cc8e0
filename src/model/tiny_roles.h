// How make-tiny distributes a tensor's values, by the role its name gives it (shared by the tiny /
// small generator, tiny_tensors.cpp, and the streamed perf generator, perf_tensors.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "model/weights.h"

namespace cedar::tiny_detail {

// The per-element helpers are always inlined: the debug/ASan builds that CI runs would otherwise spend
// most of a tiny checkpoint's generation in calls (the vocab-sized tables hold ~20 M values).
[[gnu::always_inline]] inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001B3ull;
  return h;
}

// The stream state of a tensor: seed mixed with a hash of its name, so one tensor's values do not
// depend on any other.
inline uint64_t tensor_stream_state(uint64_t seed, std::string_view name) {
  uint64_t mix = fnv1a(name);
  return seed ^ splitmix64(mix);
}

enum class Role {
  Norm,       // RMSNorm weights and Engram q/k gains: ≈ 1
  HyperConn,  // hc_* mixing parameters: small
  NearZero,   // attention sinks, router biases, V4 compressor position biases (ape): ≈ 0
  Embedding,  // token / Markov embeddings, Engram table rows: unit variance
  Linear,     // projections: N(0, σ²) with σ = 1/sqrt(fan_in)
  ExpertIds,  // V4 tid2eid: distinct expert ids per token
};

inline bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

inline Role role_of(const WeightSpec& w) {
  const std::string_view name = w.name;
  const std::string_view last = name.substr(name.rfind('.') == std::string_view::npos ? 0 : name.rfind('.') + 1);
  if (w.dtype == DType::I32 || w.dtype == DType::I64) return Role::ExpertIds;
  if (w.format == WeightFormat::FP8Rows || w.component == Component::EngramTable) return Role::Embedding;
  if (ends_with(name, "norm.weight") || last == "q_weight" || last == "k_weight") return Role::Norm;
  if (last.rfind("hc_", 0) == 0) return Role::HyperConn;
  if (last == "attn_sink" || last == "bias" || last == "bias_vl" || last == "ape") return Role::NearZero;
  if (name == "embed.weight" || ends_with(name, ".embed.weight")) return Role::Embedding;
  if (w.shape.size() >= 2) return Role::Linear;
  return Role::NearZero;
}

// Logical [rows, cols] of a weight (MXFP4 stores two columns per byte). 1-D tensors are one row.
struct Logical {
  int64_t rows = 1;
  int64_t cols = 1;
};

inline Logical logical_shape(const WeightSpec& w) {
  Logical l;
  if (w.shape.empty()) return l;
  l.cols = w.shape.back();
  for (size_t i = 0; i + 1 < w.shape.size(); ++i) l.rows *= w.shape[i];
  if (w.format == WeightFormat::MXFP4) l.cols *= 2;
  return l;
}

// Values of a role are offset + scale · N(0, 1).
struct Affine {
  double offset = 0.0;
  double scale = 1.0;
};

inline Affine affine_of(Role role, double fan_in) {
  switch (role) {
    case Role::Norm:
      return {1.0, 0.05};
    case Role::HyperConn:
      return {0.0, 0.02};
    case Role::NearZero:
      return {0.0, 0.01};
    case Role::Embedding:
      return {0.0, 1.0};
    case Role::Linear:
      return {0.0, 1.0 / std::sqrt(fan_in)};  // sqrt is exactly rounded (IEEE)
    case Role::ExpertIds:
      break;
  }
  return {};
}

}  // namespace cedar::tiny_detail
