#include "kv/kv_layout.h"

#include <string>

namespace cedar {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

Result<KvFormats> kv_formats(const KvDims& d, KvStorage storage) {
  KvFormats f;
  if (d.arch == Arch::DeepseekV41) {
    CEDAR_ASSIGN_OR_RETURN(f.main, KvRecordFormat::make(KvRecipe::Fp4Block16E4m3, storage, d.head_dim));
    CEDAR_ASSIGN_OR_RETURN(f.swa, KvRecordFormat::make(KvRecipe::Fp8Block32Ue8m0, storage, d.head_dim));
  } else {
    CEDAR_ASSIGN_OR_RETURN(f.main, KvRecordFormat::make(KvRecipe::V4Fp8Bf16Rope, storage, d.head_dim, d.rope_dim));
    f.swa = f.main;
  }
  CEDAR_ASSIGN_OR_RETURN(f.index, KvRecordFormat::make(KvRecipe::Fp4Block32Ue8m0, storage, d.index_head_dim));
  return f;
}

Result<int64_t> kv_entries_per_block(int64_t ratio, int64_t tokens_per_block) {
  if (ratio <= 0 || tokens_per_block <= 0)
    return make_error("KV blocks: ratio " + str(ratio) + " and tokens_per_block " + str(tokens_per_block) +
                      " must be positive");
  if (ratio <= tokens_per_block) {
    if (tokens_per_block % ratio != 0)
      return make_error("KV blocks: tokens_per_block " + str(tokens_per_block) +
                        " is not a multiple of the compress ratio " + str(ratio));
    return tokens_per_block / ratio;
  }
  if (ratio % tokens_per_block != 0)
    return make_error("KV blocks: compress ratio " + str(ratio) + " is not a multiple of tokens_per_block " +
                      str(tokens_per_block));
  return int64_t{1};
}

Result<std::vector<KvStreamSpec>> global_kv_streams(const LayerPlan& plan, const KvFormats& formats,
                                                    int64_t tokens_per_block) {
  std::vector<KvStreamSpec> streams;
  for (const LayerRole& role : plan.layers) {
    if (!role.owns_compressor || role.compress_ratio <= 0) continue;
    Result<int64_t> epb = kv_entries_per_block(role.compress_ratio, tokens_per_block);
    if (!epb.ok()) return epb.error().with_context("layer " + str(role.layer));
    streams.push_back({role.layer, KvStreamKind::MainKv, role.compress_ratio, formats.main, *epb});
    if (role.owns_indexer_keys)
      streams.push_back({role.layer, KvStreamKind::IndexKey, role.compress_ratio, formats.index, *epb});
  }
  return streams;
}

Result<KvMeasurement> measure_kv_bytes(const ModelConfig& config, const LayerPlan& plan, int64_t tokens,
                                       int64_t tokens_per_block) {
  if (tokens <= 0) return make_error("KV measurement: token count " + str(tokens) + " must be positive");
  const KvDims dims{config.arch, config.head_dim, config.index_head_dim, config.qk_rope_head_dim};
  CEDAR_ASSIGN_OR_RETURN(const KvFormats formats, kv_formats(dims, KvStorage::Packed));
  CEDAR_ASSIGN_OR_RETURN(const std::vector<KvStreamSpec> streams,
                         global_kv_streams(plan, formats, tokens_per_block));
  CEDAR_ASSIGN_OR_RETURN(std::shared_ptr<BlockPool> pool, BlockPool::create({.dry_run = true}));
  KvMeasurement m;
  m.tokens = tokens;
  std::vector<BlockTable> tables;  // held until the pool is read
  for (const KvStreamSpec& s : streams) {
    CEDAR_ASSIGN_OR_RETURN(BlockTable t, BlockTable::create(pool, s.format.record_bytes(), s.entries_per_block));
    const int64_t entries = tokens / s.ratio;
    CEDAR_RETURN_IF_ERROR(t.ensure(entries));
    m.payload_bytes += entries * s.format.record_bytes();
    tables.push_back(std::move(t));
  }
  const BlockPoolStats st = pool->stats();
  m.allocated_bytes = st.used_bytes;
  m.blocks = st.used_blocks;
  m.padding_bytes = m.allocated_bytes - m.payload_bytes;
  return m;
}

Result<double> kv_bytes_per_token_measured(const ModelConfig& config, const LayerPlan& plan) {
  CEDAR_ASSIGN_OR_RETURN(const KvMeasurement m, measure_kv_bytes(config, plan, int64_t{1} << 20));
  return m.bytes_per_token();
}

}  // namespace cedar
