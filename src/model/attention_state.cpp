#include "model/attention_state.h"

#include <algorithm>

namespace cedar {

void KvEntries::append(std::span<const float> values, int64_t position) {
  values_.insert(values_.end(), values.begin(), values.end());
  positions_.push_back(position);
}

SwaRing::SwaRing(int64_t slots, int64_t width)
    : slots_(slots),
      width_(width),
      values_(static_cast<size_t>(slots * width), 0.0f),
      positions_(static_cast<size_t>(slots), -1) {}

const float* SwaRing::find(int64_t pos) const {
  if (pos < 0 || slots_ == 0) return nullptr;
  const int64_t slot = pos % slots_;
  if (positions_[static_cast<size_t>(slot)] != pos) return nullptr;
  return values_.data() + slot * width_;
}

void SwaRing::write(int64_t pos, std::span<const float> kv) {
  const int64_t slot = pos % slots_;
  std::copy(kv.begin(), kv.end(), values_.begin() + slot * width_);
  positions_[static_cast<size_t>(slot)] = pos;
}

AttentionState AttentionState::create(const LayerPlan& plan, const AttentionParams& p) {
  AttentionState st;
  const int64_t n = plan.num_layers();
  st.rings.reserve(static_cast<size_t>(n));
  st.source_slot.assign(static_cast<size_t>(n), -1);
  for (const LayerRole& role : plan.layers) {
    st.rings.emplace_back(p.window, p.head_dim);
    if (!role.owns_compressor) continue;
    KvSourceState src;
    src.layer = role.layer;
    src.ratio = role.compress_ratio;
    src.kv = KvEntries(p.head_dim);
    src.index_k = KvEntries(p.index_head_dim);
    st.source_slot[static_cast<size_t>(role.layer)] = static_cast<int64_t>(st.sources.size());
    st.sources.push_back(std::move(src));
  }
  return st;
}

KvSourceState* AttentionState::source(int64_t layer) {
  if (layer < 0 || layer >= static_cast<int64_t>(source_slot.size())) return nullptr;
  const int64_t s = source_slot[static_cast<size_t>(layer)];
  return s < 0 ? nullptr : &sources[static_cast<size_t>(s)];
}

const KvSourceState* AttentionState::source(int64_t layer) const {
  return const_cast<AttentionState*>(this)->source(layer);
}

AttentionScratch::TopK& AttentionScratch::topk_of(int64_t layer) {
  if (layer >= static_cast<int64_t>(topk.size())) topk.resize(static_cast<size_t>(layer + 1));
  return topk[static_cast<size_t>(layer)];
}

}  // namespace cedar
