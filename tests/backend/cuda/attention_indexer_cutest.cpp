// Parity of the device indexer with model/indexer.h: indexer_queries vs index_queries (bit-exact q and
// head weights, given the same projections), indexer_scores vs index_score (bit-exact in the exact-dot
// regime the test data stays in: per-block scales of q and k within a few binades), and indexer_select vs
// run_indexer (identical top-k and candidate-block sets: the scores are identical, so any difference
// is a selection bug — the bf16 scores of the reference precision tie often, exercising the tie rule).
// Batched rows of several sequences (decode rows at 4 … 70000 visible entries — one and several
// select segments — and a prefill chunk), the full scan of a candidate source, restricted (Reindex)
// scoring from the device's own candidate blocks, ratio 2, both precisions, tiny shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attention_cutest_util.h"
#include "backend/cpu/ops.h"
#include "kv/kv_format.h"
#include "model/attention_params.h"
#include "model/attention_state.h"
#include "model/indexer.h"

namespace cedar::cuda {
namespace {

using testing::device_alloc;
using testing::device_filled;
using testing::to_device;
using testing::to_host;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b)); }

struct SeqSpec {
  int64_t entries = 0;  // indexer keys in the source
  int64_t pos0 = 0, n = 1;
};

struct IndexerCase {
  int64_t heads = 32, head_dim = 128, rope_dim = 64, ratio = 1;
  int64_t topk = 512, block_size = 8, topk_blocks = 2048;
  bool reference = true;
  bool candidates = true;  // full scan publishes blocks, then a restricted pass uses them
  std::vector<SeqSpec> seqs;
  uint32_t seed = 1;
};

struct HostFp8Weight {
  std::vector<uint8_t> data, scales;
  cpu::LinearWeight lw;
};
HostFp8Weight fp8_weight(int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  HostFp8Weight w;
  w.data.resize(out * in);
  for (auto& c : w.data) {
    c = static_cast<uint8_t>(rng());
    if ((c & 0x7F) == 0x7F) c ^= 1;  // no NaN codes
  }
  w.scales.resize(((out + 31) / 32) * ((in + 31) / 32));
  for (auto& s : w.scales) s = static_cast<uint8_t>(118 + rng() % 2);
  w.lw = {.format = WeightFormat::FP8Block, .out = out, .in = in, .data = w.data.data(), .scale = w.scales.data()};
  return w;
}

// The host KvEntries' records copied into a device pool in scrambled block order.
struct DeviceStreams {
  DeviceBuffer<uint8_t> pool;
  std::vector<DeviceBuffer<int32_t>> tables;
  std::vector<KvSourceSeq> seqs;
};
DeviceStreams upload_streams(const std::vector<KvSourceState>& src, int64_t epb) {
  DeviceStreams d;
  const int64_t rb = src[0].index_k.format().record_bytes(), block_bytes = epb * rb;
  int64_t blocks = 0;
  for (const auto& s : src) blocks += (s.index_k.size() + epb - 1) / epb;
  std::vector<uint8_t> image(blocks * block_bytes, 0);
  std::vector<std::vector<int32_t>> tables;
  int64_t next = blocks - 1;  // hand blocks out from the top: sequences interleave backwards
  for (const auto& s : src) {
    std::vector<int32_t> t;
    for (int64_t b = 0; b < (s.index_k.size() + epb - 1) / epb; ++b) t.push_back(static_cast<int32_t>(next--));
    for (int64_t j = 0; j < s.index_k.size(); ++j)
      std::memcpy(image.data() + t[j / epb] * block_bytes + (j % epb) * rb, s.index_k.blocks().record(j), rb);
    tables.push_back(t);
  }
  d.pool = to_device(image);
  for (const auto& t : tables) {
    d.tables.push_back(to_device(t));
    d.seqs.push_back(KvSourceSeq{{}, PagedRecords{d.pool.get(), d.tables.back().get(), block_bytes, epb, rb}});
  }
  return d;
}

size_t compare_ids(const std::string& what, const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                   int64_t width) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && bad++ == 0)
      ADD_FAILURE() << what << ": first difference at row " << i / width << " slot " << i % width << ": gpu " << got[i]
                    << " cpu " << want[i];
  return bad;
}

void check_indexer(const IndexerCase& c, const std::string& name) {
  const int64_t ih = c.heads, id = c.head_dim, r = c.ratio, q_lora = 256, dim = 256;
  const int64_t S = static_cast<int64_t>(c.seqs.size());
  AttentionParams p;
  p.dim = dim;
  p.q_lora = q_lora;
  p.index_heads = ih;
  p.index_head_dim = id;
  p.index_topk = c.topk;
  p.candidate_block_size = c.block_size;
  p.candidate_topk_blocks = c.topk_blocks;
  p.index_precision = c.reference ? IndexScorePrecision::Reference : IndexScorePrecision::Fp32;
  const cpu::RopeTable rope(testing::compress_rope_config(c.rope_dim));
  const HostFp8Weight wq_b = fp8_weight(ih * id, q_lora, c.seed);
  const std::vector<uint8_t> wp_bytes =
      testing::bf16_bytes(testing::bf16_bits(testing::random_bf16(ih * dim, c.seed + 1, -4, -2, 0)));
  const cpu::LinearWeight weights_proj{.format = WeightFormat::BF16, .out = ih, .in = dim, .data = wp_bytes.data()};

  // Sources: random raw keys with per-32 block scales in 2^[-1, 1], quantized on append.
  const KvRecordFormat fk = *KvRecordFormat::make(KvRecipe::Fp4Block32Ue8m0, KvStorage::Packed, id);
  std::vector<KvSourceState> src(S);
  int64_t max_pos = 0;
  for (int64_t s = 0; s < S; ++s) {
    src[s].layer = 20;
    src[s].ratio = r;
    src[s].index_k = *KvEntries::create({.format = fk, .position_stride = r, .entries_per_block = 64});
    const std::vector<float> keys = testing::random_bf16(c.seqs[s].entries * id, c.seed + 100 + s, -1, 1, 32);
    for (int64_t j = 0; j < c.seqs[s].entries; ++j)
      ASSERT_TRUE(src[s].index_k.append(std::span<const float>(keys).subspan(j * id, id), j * r).ok());
    max_pos = std::max(max_pos, c.seqs[s].pos0 + c.seqs[s].n);
  }
  const DeviceStreams ds = upload_streams(src, 64);
  auto dseqs = to_device(ds.seqs);

  // Queries: the CPU oracle per sequence chunk; the same projections for the device.
  std::vector<AttnToken> tokens;
  std::vector<float> qi_all, wraw_all, q_want, w_want;
  std::vector<IndexQueries> iq(S);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t n = c.seqs[s].n;
    const std::vector<float> qr = testing::random_bf16(n * q_lora, c.seed + 200 + s, -2, 2, 32);
    const std::vector<float> x = testing::random_bf16(n * dim, c.seed + 300 + s, -1, 1, 32);
    ASSERT_TRUE(index_queries(
                    {.wq_b = &wq_b.lw, .weights_proj = &weights_proj, .qr = qr, .x = x, .n = n, .pos0 = c.seqs[s].pos0},
                    p, rope, iq[s], nullptr)
                    .ok());
    std::vector<float> qi(n * ih * id), wr(n * ih);
    ASSERT_TRUE(cpu::linear(wq_b.lw, qr, n, qi, {.bf16_output = true, .act_block = 32}, nullptr).ok());
    ASSERT_TRUE(cpu::linear(weights_proj, x, n, wr, {.bf16_output = true}, nullptr).ok());
    qi_all.insert(qi_all.end(), qi.begin(), qi.end());
    wraw_all.insert(wraw_all.end(), wr.begin(), wr.end());
    q_want.insert(q_want.end(), iq[s].q.begin(), iq[s].q.end());
    w_want.insert(w_want.end(), iq[s].w.begin(), iq[s].w.end());
    append_chunk_tokens(tokens, static_cast<int32_t>(s), c.seqs[s].pos0, n);
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  const testing::DeviceRope dr = testing::device_rope(rope, max_pos);
  auto dt = to_device(tokens);
  auto dqi = to_device(qi_all);
  auto dwr = to_device(wraw_all);
  auto dq = device_filled<float>(n * ih * id, 0xFF);
  auto dcodes = device_alloc<uint16_t>(n * ih * id);
  auto dscales = device_alloc<float>(n * ih * id / 32);
  auto dw = device_filled<float>(n * ih, 0xFF);
  Status st = indexer_queries({.n = n,
                               .heads = ih,
                               .head_dim = id,
                               .qi = dqi.get(),
                               .w_raw = dwr.get(),
                               .tokens = dt.get(),
                               .rope = dr.view,
                               .reference_precision = c.reference,
                               .q = dq.get(),
                               .q_codes = dcodes.get(),
                               .q_scales = dscales.get(),
                               .w = dw.get()},
                              nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  {
    const std::vector<float> gq = to_host(dq), gw = to_host(dw);
    size_t bad_q = 0, bad_w = 0;
    for (size_t i = 0; i < q_want.size(); ++i)
      if (!same_bits(gq[i], q_want[i]) && bad_q++ == 0)
        ADD_FAILURE() << name << ": first query mismatch at " << i << ": gpu " << gq[i] << " cpu " << q_want[i];
    for (size_t i = 0; i < w_want.size(); ++i)
      if (!same_bits(gw[i], w_want[i]) && bad_w++ == 0)
        ADD_FAILURE() << name << ": first head-weight mismatch at " << i << ": gpu " << gw[i] << " cpu " << w_want[i];
    std::printf("PARITY %-40s queries n=%zu mismatches=%zu, weights n=%zu mismatches=%zu (bit-exact required)\n",
                name.c_str(), q_want.size(), bad_q, w_want.size(), bad_w);
    EXPECT_EQ(bad_q + bad_w, 0u);
  }

  // Full scan: scores against index_score.
  int64_t max_v = 1;
  for (const AttnToken& tk : tokens) max_v = std::max(max_v, (tk.pos + 1) / r);
  const float relu_scale = static_cast<float>(std::pow(static_cast<double>(id), -0.5));
  auto dscores = device_filled<float>(n * max_v, 0xFF);
  IndexerScoreArgs sa{.n = n,
                      .heads = ih,
                      .head_dim = id,
                      .ratio = r,
                      .q_codes = dcodes.get(),
                      .q_scales = dscales.get(),
                      .w = dw.get(),
                      .tokens = dt.get(),
                      .seqs = dseqs.get(),
                      .reference_precision = c.reference,
                      .relu_scale = relu_scale,
                      .max_slots = max_v,
                      .scores = dscores.get()};
  st = indexer_scores(sa, nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  {
    const std::vector<float> gs = to_host(dscores);
    size_t bad = 0, total = 0;
    double max_rel = 0;
    std::vector<float> key(id);
    for (int64_t row = 0; row < n; ++row) {
      const AttnToken& tk = tokens[row];
      const int64_t t = row - tk.chunk_row0;
      for (int64_t j = 0; j < (tk.pos + 1) / r; ++j, ++total) {
        src[tk.seq].index_k.read(j, key);
        const float want = index_score(iq[tk.seq].q.data() + t * ih * id, iq[tk.seq].w.data() + t * ih, key.data(), ih,
                                       id, p.index_precision, relu_scale);
        const float got = gs[row * max_v + j];
        if (!same_bits(got, want)) {
          max_rel = std::max(max_rel, std::fabs(double(got) - want) / std::max(1e-30, std::fabs(double(want))));
          if (bad++ == 0)
            ADD_FAILURE() << name << ": first score mismatch, row " << row << " entry " << j << ": gpu " << got
                          << " cpu " << want;
        }
      }
    }
    std::printf("PARITY %-40s scores n=%zu mismatches=%zu max_rel=%.3e (bit-exact required)\n", name.c_str(), total,
                bad, max_rel);
    EXPECT_EQ(bad, 0u);
  }

  // Selection: the candidate source's top-k (+ blocks) against run_indexer.
  auto dtopk = device_filled<int32_t>(n * c.topk, 0x7F);
  auto dblocks = device_filled<int32_t>(n * std::max<int64_t>(c.topk_blocks, 1), 0x7F);
  int64_t ws_bytes = indexer_select_workspace_bytes(n, max_v, c.topk, c.candidates ? c.topk_blocks : 0, c.block_size);
  auto dws = device_alloc<uint8_t>(ws_bytes);
  IndexerSelectArgs sel{.n = n,
                        .ratio = r,
                        .tokens = dt.get(),
                        .scores = dscores.get(),
                        .max_slots = max_v,
                        .candidate_topk_blocks = c.topk_blocks,
                        .candidate_block_size = c.block_size,
                        .topk = c.topk,
                        .topk_out = dtopk.get(),
                        .blocks_out = c.candidates ? dblocks.get() : nullptr,
                        .workspace = dws.get(),
                        .workspace_bytes = ws_bytes};
  st = indexer_select(sel, nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  {  // the warp-aggregated histogram must select the same ids and blocks as the default per-value one
    auto ltopk = device_filled<int32_t>(n * c.topk, 0x7F);
    auto lblocks = device_filled<int32_t>(n * std::max<int64_t>(c.topk_blocks, 1), 0x7F);
    IndexerSelectArgs ls = sel;
    ls.topk_out = ltopk.get();
    ls.blocks_out = c.candidates ? lblocks.get() : nullptr;
    ls.warp_aggregated_histogram = true;
    ASSERT_TRUE(indexer_select(ls, nullptr).ok()) << name << " warp-aggregated histogram";
    EXPECT_TRUE(to_host(ltopk) == to_host(dtopk))
        << name << ": warp-aggregated and per-value histograms selected different top-k ids";
    EXPECT_TRUE(to_host(lblocks) == to_host(dblocks))
        << name << ": warp-aggregated and per-value histograms selected different candidate blocks";
  }
  const LayerRole source_role{.layer = 20,
                              .compress_ratio = r,
                              .mode = AttnMode::Full,
                              .kv_source = 20,
                              .index_source = 20,
                              .owns_compressor = true,
                              .owns_indexer_keys = true,
                              .owns_indexer = true,
                              .is_candidate_source = c.candidates};
  std::vector<AttentionScratch> scratch(S);
  std::vector<int32_t> want_topk, want_blocks;
  for (int64_t s = 0; s < S; ++s) {
    ASSERT_TRUE(
        run_indexer(
            {.role = &source_role, .source = &src[s], .queries = &iq[s], .pos0 = c.seqs[s].pos0, .n = c.seqs[s].n}, p,
            scratch[s], nullptr)
            .ok());
    const auto& tk = scratch[s].topk_of(20).idx;
    want_topk.insert(want_topk.end(), tk.begin(), tk.end());
    if (c.candidates)
      want_blocks.insert(want_blocks.end(), scratch[s].candidates.blocks.begin(), scratch[s].candidates.blocks.end());
  }
  size_t bad_sel = compare_ids(name + " top-k", to_host(dtopk), want_topk, c.topk);
  size_t bad_blocks = 0;
  if (c.candidates) {
    std::vector<int32_t> gb = to_host(dblocks);
    gb.resize(want_blocks.size());
    bad_blocks = compare_ids(name + " candidate blocks", gb, want_blocks, c.topk_blocks);
  }
  std::printf("PARITY %-40s top-k ids=%zu mismatches=%zu, candidate blocks=%zu mismatches=%zu (identical required)\n",
              name.c_str(), want_topk.size(), bad_sel, want_blocks.size(), bad_blocks);
  EXPECT_EQ(bad_sel + bad_blocks, 0u);
  if (!c.candidates) return;

  // Restricted (Reindex) pass over the device's candidate blocks; the CPU uses its own (equal) ones.
  const int64_t slots = c.topk_blocks * c.block_size;
  auto drscores = device_filled<float>(n * slots, 0xFF);
  IndexerScoreArgs ra = sa;
  ra.candidate_blocks = dblocks.get();
  ra.candidate_topk_blocks = c.topk_blocks;
  ra.candidate_block_size = c.block_size;
  ra.max_slots = slots;
  ra.scores = drscores.get();
  st = indexer_scores(ra, nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ws_bytes = indexer_select_workspace_bytes(n, slots, c.topk, 0, c.block_size);
  auto drws = device_alloc<uint8_t>(ws_bytes);
  auto drtopk = device_filled<int32_t>(n * c.topk, 0x7F);
  IndexerSelectArgs rsel{.n = n,
                         .ratio = r,
                         .tokens = dt.get(),
                         .scores = drscores.get(),
                         .max_slots = slots,
                         .candidate_blocks = dblocks.get(),
                         .candidate_topk_blocks = c.topk_blocks,
                         .candidate_block_size = c.block_size,
                         .topk = c.topk,
                         .topk_out = drtopk.get(),
                         .workspace = drws.get(),
                         .workspace_bytes = ws_bytes};
  st = indexer_select(rsel, nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  const LayerRole reindex_role{.layer = 24,
                               .compress_ratio = r,
                               .mode = AttnMode::Reindex,
                               .kv_source = 20,
                               .index_source = 24,
                               .owns_indexer = true,
                               .uses_candidates = true};
  std::vector<int32_t> want_r;
  for (int64_t s = 0; s < S; ++s) {
    ASSERT_TRUE(
        run_indexer(
            {.role = &reindex_role, .source = &src[s], .queries = &iq[s], .pos0 = c.seqs[s].pos0, .n = c.seqs[s].n}, p,
            scratch[s], nullptr)
            .ok());
    const auto& tk = scratch[s].topk_of(24).idx;
    want_r.insert(want_r.end(), tk.begin(), tk.end());
  }
  const size_t bad_r = compare_ids(name + " restricted top-k", to_host(drtopk), want_r, c.topk);
  std::printf("PARITY %-40s restricted top-k ids=%zu mismatches=%zu (identical required)\n", name.c_str(),
              want_r.size(), bad_r);
  EXPECT_EQ(bad_r, 0u);
}

TEST(CudaIndexer, CandidateSourceAndReindexMatchCpu) {
  CEDAR_REQUIRE_GPU_ATTN();
  // Decode rows at 20000 (3 select segments) and 70000 (9 segments; 2 block segments) visible
  // entries, a short one (fewer entries than top-k: all taken), and a 4-row prefill chunk.
  check_indexer({.seqs = {{20000, 19999, 1}, {70000, 69999, 1}, {4, 3, 1}, {1104, 1100, 4}}, .seed = 81},
                "indexer ratio 1 reference (32x128)");
}

TEST(CudaIndexer, Fp32PrecisionAndRatio2MatchCpu) {
  CEDAR_REQUIRE_GPU_ATTN();
  check_indexer({.reference = false, .seqs = {{3000, 2999, 1}, {600, 597, 3}}, .seed = 82},
                "indexer ratio 1 fp32 (32x128)");
  // Encoder index source: ratio 2, no candidate pool; visible = (p+1)/2 includes odd/even positions.
  check_indexer({.ratio = 2, .candidates = false, .seqs = {{5000, 9999, 1}, {600, 1194, 5}}, .seed = 83},
                "indexer ratio 2 reference (32x128)");
}

TEST(CudaIndexer, TinyShapesMatchCpu) {
  CEDAR_REQUIRE_GPU_ATTN();
  check_indexer({.heads = 2,
                 .head_dim = 32,
                 .rope_dim = 8,
                 .topk = 4,
                 .block_size = 2,
                 .topk_blocks = 3,
                 .seqs = {{20, 19, 1}, {9, 2, 7}},
                 .seed = 84},
                "indexer tiny (2x32)");
  check_indexer({.heads = 4,
                 .head_dim = 64,
                 .rope_dim = 32,
                 .ratio = 2,
                 .topk = 16,
                 .block_size = 4,
                 .topk_blocks = 8,
                 .seqs = {{40, 79, 1}, {25, 40, 10}},
                 .seed = 85},
                "indexer small ratio 2 (4x64)");
}

TEST(CudaIndexer, RejectsBadArguments) {
  CEDAR_REQUIRE_GPU_ATTN();
  const Status s = indexer_select({.n = 1, .ratio = 1, .max_slots = 8, .topk = 0}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("topk 0"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace cedar::cuda
