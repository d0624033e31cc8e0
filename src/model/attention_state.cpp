#include "model/attention_state.h"

#include <algorithm>
#include <string>

namespace cedar {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

KvEntries::KvEntries(int64_t width) : format_(KvRecordFormat::raw_f32(width)) {
  Result<std::shared_ptr<BlockPool>> pool = BlockPool::create({});  // unbounded: cannot fail
  if (!pool.ok() || width <= 0) return;
  Result<BlockTable> t = BlockTable::create(*pool, format_.record_bytes(), 64);
  if (t.ok()) table_ = std::move(*t);
}

Result<KvEntries> KvEntries::create(const KvEntriesOptions& o) {
  if (o.format.width <= 0 || o.format.record_bytes() <= 0)
    return make_error("KV entries: format " + o.format.name() + " has no width");
  if (o.position_stride < 0) return make_error("KV entries: negative position stride " + str(o.position_stride));
  std::shared_ptr<BlockPool> pool = o.pool;
  if (pool == nullptr) {
    CEDAR_ASSIGN_OR_RETURN(pool, BlockPool::create({}));
  }
  if (pool->dry_run()) return make_error("KV entries need a pool with memory (a dry-run pool only measures)");
  KvEntries e;
  e.format_ = o.format;
  e.stride_ = o.position_stride;
  CEDAR_ASSIGN_OR_RETURN(e.table_, BlockTable::create(std::move(pool), o.format.record_bytes(), o.entries_per_block));
  return e;
}

Status KvEntries::append(std::span<const float> values, int64_t position) {
  if (static_cast<int64_t>(values.size()) != width() || width() <= 0)
    return make_error("KV entries (" + format_.name() + "): entry has " + str(static_cast<int64_t>(values.size())) +
                      " values, expected " + str(width()));
  if (stride_ > 0 && position != size_ * stride_)
    return make_error("KV entries: entry " + str(size_) + " must be at position " + str(size_ * stride_) + ", got " +
                      str(position));
  CEDAR_RETURN_IF_ERROR(table_.ensure(size_ + 1));
  scratch_.assign(values.begin(), values.end());
  Result<uint8_t*> rec = table_.writable(size_);
  if (!rec.ok()) return rec.error();
  if (*rec != nullptr) {
    CEDAR_RETURN_IF_ERROR(
        format_.encode(scratch_, std::span<uint8_t>(*rec, static_cast<size_t>(format_.record_bytes()))));
  }
  if (stride_ == 0) positions_.push_back(position);
  ++size_;
  return Status::Ok();
}

std::vector<float> KvEntries::decoded(int64_t j) const {
  std::vector<float> out(static_cast<size_t>(width()));
  read(j, out);
  return out;
}

void KvEntries::truncate(int64_t size) {
  if (size < 0 || size >= size_) return;
  size_ = size;
  if (stride_ == 0) positions_.resize(static_cast<size_t>(size));
  table_.shrink(size);
}

Status KvEntries::adopt(std::span<const BlockId> blocks, int64_t entries) {
  if (size_ != 0) return make_error("KV entries: adopting a cached prefix needs an empty list, it holds " + str(size_));
  if (stride_ <= 0) return make_error("KV entries: adopting a cached prefix needs derived positions (packed caches)");
  const int64_t epb = table_.entries_per_block();
  if (entries < 0 || entries != static_cast<int64_t>(blocks.size()) * epb)
    return make_error("KV entries: " + str(entries) + " entries cannot be held in exactly " +
                      str(static_cast<int64_t>(blocks.size())) + " full blocks of " + str(epb));
  CEDAR_RETURN_IF_ERROR(table_.adopt(blocks));
  size_ = entries;
  return Status::Ok();
}

SwaRing::SwaRing(int64_t slots, int64_t width) : SwaRing(slots, KvRecordFormat::raw_f32(width)) {}

SwaRing::SwaRing(int64_t slots, const KvRecordFormat& format)
    : slots_(slots),
      format_(format),
      records_(static_cast<size_t>(slots * format.record_bytes()), 0),
      positions_(static_cast<size_t>(slots), -1) {}

bool SwaRing::read(int64_t pos, std::span<float> out) const {
  if (!holds(pos)) return false;
  const int64_t rb = format_.record_bytes();
  format_.decode(std::span<const uint8_t>(records_).subspan(static_cast<size_t>((pos % slots_) * rb),
                                                           static_cast<size_t>(rb)),
                 out);
  return true;
}

std::vector<float> SwaRing::decoded(int64_t pos) const {
  std::vector<float> out(static_cast<size_t>(width()));
  if (!read(pos, out)) out.clear();
  return out;
}

Status SwaRing::write(int64_t pos, std::span<const float> kv) {
  if (pos < 0 || slots_ <= 0) return make_error("SWA ring: cannot write position " + str(pos));
  if (static_cast<int64_t>(kv.size()) != width())
    return make_error("SWA ring (" + format_.name() + "): entry has " + str(static_cast<int64_t>(kv.size())) +
                      " values, expected " + str(width()));
  const int64_t slot = pos % slots_, rb = format_.record_bytes();
  scratch_.assign(kv.begin(), kv.end());
  CEDAR_RETURN_IF_ERROR(format_.encode(
      scratch_, std::span<uint8_t>(records_).subspan(static_cast<size_t>(slot * rb), static_cast<size_t>(rb))));
  positions_[static_cast<size_t>(slot)] = pos;
  return Status::Ok();
}

void SwaRing::forget_from(int64_t pos) {
  for (int64_t& p : positions_)
    if (p >= pos) p = -1;
}

bool accepts_recipe(const KvRecordFormat& f, KvRecipe recipe) {
  return f.recipe == recipe || f.recipe == KvRecipe::None;
}

namespace {

// `raw` quantized with `recipe` when the container does not do it itself.
Result<std::vector<float>> values_for(const KvRecordFormat& f, std::span<const float> raw, KvRecipe recipe,
                                      const char* what) {
  std::vector<float> v(raw.begin(), raw.end());
  if (f.recipe == recipe) return v;
  if (f.recipe != KvRecipe::None)
    return make_error(std::string(what) + " stores " + f.name() + ", the writer produces " +
                      std::string(kv_recipe_name(recipe)));
  CEDAR_ASSIGN_OR_RETURN(const KvRecordFormat q, KvRecordFormat::make(recipe, KvStorage::F32, f.width));
  CEDAR_RETURN_IF_ERROR(q.quantize(v));
  return v;
}

}  // namespace

Status append_quantized(KvEntries& entries, std::span<const float> raw, int64_t position, KvRecipe recipe) {
  CEDAR_ASSIGN_OR_RETURN(const std::vector<float> v, values_for(entries.format(), raw, recipe, "KV cache"));
  return entries.append(v, position);
}

Status write_quantized(SwaRing& ring, int64_t pos, std::span<const float> raw, KvRecipe recipe) {
  CEDAR_ASSIGN_OR_RETURN(const std::vector<float> v, values_for(ring.format(), raw, recipe, "SWA ring"));
  return ring.write(pos, v);
}

Result<AttentionState> AttentionState::create(const LayerPlan& plan, const AttentionParams& p,
                                              const KvCacheOptions& options, int64_t swa_history) {
  if (swa_history < 0) return make_error("SWA history " + str(swa_history) + " must not be negative");
  const KvDims dims{plan.arch, p.head_dim, p.index_head_dim, p.rope_dim};
  KvFormats f{KvRecordFormat::raw_f32(p.head_dim), KvRecordFormat::raw_f32(p.index_head_dim),
              KvRecordFormat::raw_f32(p.head_dim)};
  if (plan.arch == Arch::DeepseekV41) {
    CEDAR_ASSIGN_OR_RETURN(f, kv_formats(dims, options.storage));
  }
  std::shared_ptr<BlockPool> pool = options.pool;
  if (pool == nullptr) {
    CEDAR_ASSIGN_OR_RETURN(pool, BlockPool::create({}));
  }

  AttentionState st;
  const int64_t n = plan.num_layers();
  st.rings.reserve(static_cast<size_t>(n));
  st.source_slot.assign(static_cast<size_t>(n), -1);
  for (const LayerRole& role : plan.layers) {
    st.rings.emplace_back(p.window + swa_history, f.swa);
    if (!role.owns_compressor) continue;
    KvSourceState src;
    src.layer = role.layer;
    src.ratio = role.compress_ratio;
    Result<int64_t> epb = kv_entries_per_block(role.compress_ratio, options.tokens_per_block);
    if (!epb.ok()) return epb.error().with_context("layer " + str(role.layer));
    // Raw containers keep explicit positions (their writers decide them); packed ones derive j·ratio.
    const int64_t stride = plan.arch == Arch::DeepseekV41 ? role.compress_ratio : 0;
    CEDAR_ASSIGN_OR_RETURN(src.kv, KvEntries::create({f.main, stride, *epb, pool}));
    CEDAR_ASSIGN_OR_RETURN(src.index_k, KvEntries::create({f.index, stride, *epb, pool}));
    st.source_slot[static_cast<size_t>(role.layer)] = static_cast<int64_t>(st.sources.size());
    st.sources.push_back(std::move(src));
  }
  return st;
}

AttentionState AttentionState::create(const LayerPlan& plan, const AttentionParams& p) {
  Result<AttentionState> st = create(plan, p, KvCacheOptions{});
  return st.ok() ? std::move(*st) : AttentionState{};
}

KvSourceState* AttentionState::source(int64_t layer) {
  if (layer < 0 || layer >= static_cast<int64_t>(source_slot.size())) return nullptr;
  const int64_t s = source_slot[static_cast<size_t>(layer)];
  return s < 0 ? nullptr : &sources[static_cast<size_t>(s)];
}

const KvSourceState* AttentionState::source(int64_t layer) const {
  return const_cast<AttentionState*>(this)->source(layer);
}

Result<std::vector<KvEntries*>> AttentionState::global_kv_entries(const LayerPlan& plan) {
  std::vector<KvEntries*> out;
  for (const LayerRole& role : plan.layers) {
    if (!role.owns_compressor || role.compress_ratio <= 0) continue;
    KvSourceState* src = source(role.layer);
    if (src == nullptr) return make_error("the attention state has no cache of KV source layer " + str(role.layer));
    out.push_back(&src->kv);
    if (role.owns_indexer_keys) out.push_back(&src->index_k);
  }
  return out;
}

Result<std::vector<const KvEntries*>> AttentionState::global_kv_entries(const LayerPlan& plan) const {
  CEDAR_ASSIGN_OR_RETURN(const std::vector<KvEntries*> e, const_cast<AttentionState*>(this)->global_kv_entries(plan));
  return std::vector<const KvEntries*>(e.begin(), e.end());
}

AttentionScratch::TopK& AttentionScratch::topk_of(int64_t layer) {
  if (layer >= static_cast<int64_t>(topk.size())) topk.resize(static_cast<size_t>(layer + 1));
  return topk[static_cast<size_t>(layer)];
}

}  // namespace cedar
