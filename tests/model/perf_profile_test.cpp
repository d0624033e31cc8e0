// The perf profile (make-tiny --profile perf, tiny_config.cpp) against the released DeepSeek-V4.1-Flash
// config (tests/data/configs/deepseek_v41_flash): the same fields except the documented ones, the same
// layer plan, the same per-token bytes at batch 1 except the router rows of the experts left out; its
// generator's values are valid codes of plausible magnitude, independent of chunking, and a checkpoint
// written by that generator (at tiny widths) loads and runs through the CPU forward with finite logits.
// The roofline arithmetic (model/roofline.h) is cross-checked against ModelStats, which counts the same
// weights by another rule (active fractions instead of distinct experts).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "core/threads.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/deepseek_v41.h"
#include "model/layer_plan.h"
#include "model/model_stats.h"
#include "model/roofline.h"
#include "model/tiny_checkpoint.h"
#include "model/weights.h"

namespace cedar {
namespace {

namespace fs = std::filesystem;

struct Model {
  ModelConfig config;
  LayerPlan plan;
  std::vector<WeightSpec> weights;
};

Model released() {
  Model m;
  auto c = load_model_config(std::string(CEDAR_TEST_DATA_DIR) + "/configs/deepseek_v41_flash");
  EXPECT_TRUE(c.ok()) << c.error().message;
  m.config = *c;
  m.plan = *build_layer_plan(m.config);
  m.weights = *expected_weights(m.config, m.plan);
  return m;
}

Model perf() {
  Model m;
  auto c = tiny_model_config(Arch::DeepseekV41, "perf", false);
  EXPECT_TRUE(c.ok()) << c.error().message;
  m.config = *c;
  auto plan = build_layer_plan(m.config);
  EXPECT_TRUE(plan.ok()) << plan.error().message;
  m.plan = *plan;
  m.weights = *expected_weights(m.config, m.plan);
  return m;
}

DecodeTrafficOptions batch_of(int64_t b) {
  DecodeTrafficOptions o;
  o.batch = b;
  return o;
}
DecodeTrafficOptions at_context(int64_t c) {
  DecodeTrafficOptions o;
  o.context = c;
  return o;
}
PrefillFlopsOptions prompt_of(int64_t n, ForwardMode mode = ForwardMode::Exact,
                              CedBoundary boundary = CedBoundary::ExactSource) {
  PrefillFlopsOptions o;
  o.prompt = n;
  o.mode = mode;
  o.boundary = boundary;
  return o;
}

TEST(PerfProfile, ConfigIsTheReleasedOneExceptTheDocumentedFields) {
  const Model r = released(), p = perf();
  // The documented differences (tiny_config.cpp perf_v41): expert count, Engram prime start (and so the
  // table sizes), no DSpark blocks (their compress ratios and fields), no vision tower.
  EXPECT_EQ(p.config.n_routed_experts, kPerfRoutedExperts);
  EXPECT_EQ(p.config.engram_vocab_size, kPerfEngramVocabSize);
  EXPECT_EQ(p.config.num_draft_blocks(), 0);
  EXPECT_EQ(p.config.draft_kind, DraftKind::None);
  ModelConfig aligned = p.config;
  aligned.n_routed_experts = r.config.n_routed_experts;
  aligned.engram_vocab_size = r.config.engram_vocab_size;
  aligned.engram_num_embeddings = engram_table_rows(aligned);
  EXPECT_EQ(aligned.engram_num_embeddings, r.config.engram_num_embeddings);  // the prime rule reproduces the release
  aligned.num_nextn_predict_layers = r.config.num_nextn_predict_layers;
  aligned.compress_ratios = r.config.compress_ratios;
  aligned.draft_kind = r.config.draft_kind;
  aligned.dspark_target_layer_ids = r.config.dspark_target_layer_ids;
  aligned.has_vision = r.config.has_vision;
  aligned.vision = r.config.vision;
  aligned.source = r.config.source;
  aligned.source_format = r.config.source_format;
  EXPECT_TRUE(aligned == r.config) << "the perf profile differs from the released config in an undocumented field";

  // config.json round trip: what make-tiny writes reads back as the same config.
  auto back = parse_model_config(to_hf_config_json(p.config), "perf config.json");
  ASSERT_TRUE(back.ok()) << back.error().message;
  ModelConfig reread = *back;
  reread.source = p.config.source;
  reread.source_format = p.config.source_format;
  EXPECT_TRUE(reread == p.config);
}

TEST(PerfProfile, LayerPlanIsTheReleasedPlan) {
  const Model r = released(), p = perf();
  EXPECT_EQ(p.plan.count(AttnMode::SwaOnly), 2);
  EXPECT_EQ(p.plan.count(AttnMode::Full), 4);
  EXPECT_EQ(p.plan.count(AttnMode::Reindex), 4);
  EXPECT_EQ(p.plan.count(AttnMode::Reuse), 30);
  ASSERT_EQ(p.plan.layers.size(), r.plan.layers.size());
  for (size_t l = 0; l < r.plan.layers.size(); ++l) {
    const LayerRole &a = p.plan.layers[l], &b = r.plan.layers[l];
    EXPECT_TRUE(a.compress_ratio == b.compress_ratio && a.mode == b.mode && a.kv_source == b.kv_source &&
                a.index_source == b.index_source && a.owns_compressor == b.owns_compressor &&
                a.owns_indexer_keys == b.owns_indexer_keys && a.owns_indexer == b.owns_indexer &&
                a.is_candidate_source == b.is_candidate_source && a.uses_candidates == b.uses_candidates &&
                a.has_engram == b.has_engram && a.is_encoder == b.is_encoder &&
                a.compressor_has_gate == b.compressor_has_gate && a.uses_compress_rope == b.uses_compress_rope)
        << "layer " << l;
  }
  EXPECT_TRUE(p.plan.ced);
  EXPECT_EQ(p.plan.encoder_layers, r.plan.encoder_layers);
  EXPECT_EQ(p.plan.last_kv_source, 20);
  EXPECT_TRUE(p.plan.drafts.empty());
}

TEST(PerfProfile, PerTokenBytesAtBatchOneEqualTheReleasedModelsExceptTheRouterRows) {
  const Model r = released(), p = perf();
  const DecodeTraffic a = decode_traffic(p.config, p.plan, p.weights, {});
  const DecodeTraffic b = decode_traffic(r.config, r.plan, r.weights, {});
  EXPECT_EQ(a.distinct_experts_per_layer, 6.0);
  EXPECT_EQ(b.distinct_experts_per_layer, 6.0);
  EXPECT_EQ(a.expert_bytes_each, b.expert_bytes_each);
  // One routed expert: w1, w3 [2304, 5120] + w2 [5120, 2304] MXFP4: 0.5 B per parameter + 1 B per 32.
  EXPECT_EQ(a.expert_bytes_each, 3u * (2304u * 5120u / 2 + 2304u * 5120u / 32));
  EXPECT_EQ(a.expert_bytes, b.expert_bytes);
  EXPECT_EQ(a.head_bytes, b.head_bytes);
  EXPECT_EQ(a.lookup_bytes_per_token, b.lookup_bytes_per_token);
  EXPECT_EQ(a.kv_read_bytes_per_token, b.kv_read_bytes_per_token);
  // Router weight [E, 5120] BF16 + bias [E] F32 per layer.
  const uint64_t router_row = 5120 * 2 + 4;
  EXPECT_EQ(a.router_bytes, 40u * kPerfRoutedExperts * router_row);
  EXPECT_EQ(b.router_bytes, 40u * 384u * router_row);
  EXPECT_EQ(a.layer_weight_bytes - a.router_bytes, b.layer_weight_bytes - b.router_bytes);
  const double diff = b.weight_bytes() - a.weight_bytes();
  EXPECT_EQ(diff, 40.0 * (384 - kPerfRoutedExperts) * router_row);
  EXPECT_LT(diff / b.weight_bytes(), 0.013);  // ≈ 1.2 % of ≈ 14 GB
}

TEST(PerfProfile, DecodeBytesAgreeWithModelStatsActiveBytes) {
  // ModelStats counts stored bytes (scales included) × active fraction of every non-lookup backbone
  // tensor + head; decode_traffic with stored wo_a counts distinct experts; bias_vl is the only tensor
  // one reads and the other does not (image tokens only).
  for (const Model& m : {released(), perf()}) {
    const ModelStats stats = compute_model_stats(m.config, m.plan, m.weights);
    DecodeTrafficOptions o;
    o.wo_a_bf16 = false;
    const DecodeTraffic t = decode_traffic(m.config, m.plan, m.weights, o);
    const double bias_vl = 40.0 * static_cast<double>(m.config.n_routed_experts) * 4;
    EXPECT_NEAR(t.weight_bytes() + bias_vl, static_cast<double>(stats.bytes_active_decode), 2.0);
    // BF16 wo_a (the reference's layout) doubles its 40 × 8192 × 4096 parameters' bytes, minus the scales.
    const DecodeTraffic bf16 = decode_traffic(m.config, m.plan, m.weights, {});
    EXPECT_EQ(bf16.layer_weight_bytes - t.layer_weight_bytes, 40u * (8192u * 4096u - 256u * 128u));
  }
}

TEST(PerfProfile, BatchedDecodeCountsDistinctExperts) {
  const Model p = perf();
  EXPECT_NEAR(expected_distinct_experts(16, 6, 8), 16 * (1 - std::pow(10.0 / 16, 8)), 1e-12);
  EXPECT_NEAR(expected_distinct_experts(384, 6, 64), 384 * (1 - std::pow(378.0 / 384, 64)), 1e-9);
  const DecodeTraffic b1 = decode_traffic(p.config, p.plan, p.weights, batch_of(1));
  const DecodeTraffic b64 = decode_traffic(p.config, p.plan, p.weights, batch_of(64));
  EXPECT_GT(b64.distinct_experts_per_layer, 15.9);  // nearly every one of 16
  EXPECT_LE(b64.distinct_experts_per_layer, 16.0);
  EXPECT_LT(b64.bytes_per_token(), b1.bytes_per_token() / 20);  // weights shared by 64 tokens
  DecodeTrafficOptions measured = batch_of(8);
  measured.distinct_experts_per_layer = 11.0;
  EXPECT_EQ(decode_traffic(p.config, p.plan, p.weights, measured).expert_bytes,
            11.0 * 40 * static_cast<double>(b1.expert_bytes_each));
}

TEST(PerfProfile, KvReadBytesFollowTheLayerRoles) {
  const Model p = perf();
  // Context 0: every layer reads one SWA record (its own); the 20 ratio-1 layers one compressed entry
  // (the token's own, complete at ratio 1) and their 5 indexers (20, 24, 28, 32, 36) one key.
  EXPECT_EQ(decode_traffic(p.config, p.plan, p.weights, at_context(0)).kv_read_bytes_per_token,
            40.0 * 528 + 20.0 * 288 + 5.0 * 68);
  // Context 65535 (65536 visible positions): SWA 128 × 528 per layer; 18 ratio-2 layers attend 512 of
  // 32768 entries and 20 ratio-1 layers 512 of 65536 (288 B each); indexers score 32768 keys (layers 2,
  // 8, 14), 65536 (20, the candidate source) and the 16384-entry candidate pool (24, 28, 32, 36), 68 B each.
  const double expected = 40.0 * 128 * 528 + 38.0 * 512 * 288 + (3.0 * 32768 + 65536 + 4.0 * 16384) * 68;
  EXPECT_EQ(decode_traffic(p.config, p.plan, p.weights, at_context(65535)).kv_read_bytes_per_token, expected);
}

TEST(PerfProfile, PrefillFlopsOfExactAndCed) {
  const Model p = perf();
  const ModelStats stats = compute_model_stats(p.config, p.plan, p.weights);
  const double bias_vl_params = 40.0 * kPerfRoutedExperts;
  // One token: the linear FLOPs are 2 × the decode-active parameters (head included).
  auto one = prefill_flops(p.config, p.plan, p.weights, prompt_of(1));
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_NEAR(one->linear_flops, 2.0 * (static_cast<double>(stats.params_active_decode) - bias_vl_params), 4.0);
  // At most one window of prompt: CED computes exactly what exact mode does.
  auto e128 = prefill_flops(p.config, p.plan, p.weights, prompt_of(128));
  auto c128 = prefill_flops(p.config, p.plan, p.weights, prompt_of(128, ForwardMode::Ced));
  ASSERT_TRUE(e128.ok() && c128.ok());
  EXPECT_EQ(c128->replay_start, 0);
  EXPECT_EQ(e128->total(), c128->total());
  // 8k prompt, global-KV-only boundary: pre-tail rows run exactly ModelStats' prefill-active parameters.
  auto e8k = prefill_flops(p.config, p.plan, p.weights, prompt_of(8192));
  auto c8k = prefill_flops(p.config, p.plan, p.weights, prompt_of(8192, ForwardMode::Ced, CedBoundary::GlobalKvOnly));
  ASSERT_TRUE(e8k.ok() && c8k.ok());
  EXPECT_EQ(c8k->replay_start, 8192 - 128);
  const double head = 2.0 * (129280.0 * 5120 + 5120);
  const double decode_params = static_cast<double>(stats.params_active_decode) - bias_vl_params;
  // ModelStats' prefill count includes the 20 encoder layers' bias_vl (image tokens only).
  const double prefill_params = static_cast<double>(stats.params_active_prefill) - 20.0 * kPerfRoutedExperts;
  const double expected_linear =
      2.0 * (8064.0 * prefill_params + 128.0 * (decode_params - 129280.0 * 5120 - 5120)) + head;
  EXPECT_NEAR(c8k->linear_flops, expected_linear, expected_linear * 1e-9);
  const double ratio = e8k->total() / c8k->total();
  EXPECT_GT(ratio, 1.6);  // ~40 layers vs ~21 per row, minus the head and the boundary
  EXPECT_LT(ratio, 40.0 / 20.0);
  // The exact-source boundary runs the whole attention of layer 20 on every row: more work.
  auto c8k_exact_source = prefill_flops(p.config, p.plan, p.weights, prompt_of(8192, ForwardMode::Ced));
  ASSERT_TRUE(c8k_exact_source.ok());
  EXPECT_GT(c8k_exact_source->total(), c8k->total());
  EXPECT_FALSE(prefill_flops(p.config, p.plan, p.weights, prompt_of(0)).ok());
}

// ---- the generator ---------------------------------------------------------------------------

std::map<std::string, io::StreamedTensor> by_name(std::vector<io::StreamedTensor> ts) {
  std::map<std::string, io::StreamedTensor> m;
  for (auto& t : ts) m.emplace(t.name, std::move(t));
  return m;
}

std::vector<uint8_t> rows_of(const io::StreamedTensor& t, int64_t first, int64_t rows) {
  const size_t row_bytes = dtype_size(t.dtype) * static_cast<size_t>(t.shape.back());
  std::vector<uint8_t> out(row_bytes * static_cast<size_t>(rows));
  const Status st = t.fill(first, rows, out);
  EXPECT_TRUE(st.ok()) << t.name;
  return out;
}

struct Moments {
  double mean = 0, stddev = 0, amax = 0;
};
Moments moments(const std::vector<double>& v) {
  Moments m;
  for (double x : v) m.mean += x;
  m.mean /= static_cast<double>(v.size());
  for (double x : v) {
    m.stddev += (x - m.mean) * (x - m.mean);
    m.amax = std::max(m.amax, std::fabs(x));
  }
  m.stddev = std::sqrt(m.stddev / static_cast<double>(v.size()));
  return m;
}

TEST(PerfProfile, GeneratorWritesValidCodesOfThePlannedMagnitudes) {
  const Model p = perf();
  auto ts = perf_tensors(p.config, p.plan, 3);
  ASSERT_TRUE(ts.ok()) << ts.error().message;
  ASSERT_EQ(ts->size(), p.weights.size());
  auto m = by_name(std::move(*ts));
  struct Case {
    const char* weight;
    const char* scale;  // nullptr: unquantized
    WeightFormat format;
    double sigma, offset;
  };
  const Case cases[] = {
      {"layers.0.attn.wq_b.weight", "layers.0.attn.wq_b.scale", WeightFormat::FP8Block, 1 / std::sqrt(1280.0), 0},
      {"layers.7.ffn.experts.3.w2.weight", "layers.7.ffn.experts.3.w2.scale", WeightFormat::MXFP4,
       1 / std::sqrt(2304.0), 0},
      {"layers.14.engram.embed.weight", "layers.14.engram.embed.scale", WeightFormat::FP8Rows, 1.0, 0},
      {"embed.weight", nullptr, WeightFormat::BF16, 1.0, 0},
      {"head.weight", nullptr, WeightFormat::BF16, 1 / std::sqrt(5120.0), 0},
      {"layers.3.attn_norm.weight", nullptr, WeightFormat::BF16, 0.05, 1.0},
      {"layers.3.hc_attn_fn", nullptr, WeightFormat::F32, 0.02, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.weight);
    ASSERT_TRUE(m.count(c.weight));
    const io::StreamedTensor& w = m.at(c.weight);
    const int64_t rows = std::min<int64_t>(w.shape.size() > 1 ? w.shape[0] : 1, 8);
    const std::vector<uint8_t> bytes = rows_of(w, 0, rows);
    // Chunking does not change bytes: rows [0, r) = [0, 1) + [1, r).
    if (rows > 1) {
      std::vector<uint8_t> split = rows_of(w, 0, 1);
      const std::vector<uint8_t> rest = rows_of(w, 1, rows - 1);
      split.insert(split.end(), rest.begin(), rest.end());
      EXPECT_EQ(split, bytes);
    }
    float s = 1.0f;
    if (c.scale) {
      const std::vector<uint8_t> sb = rows_of(m.at(c.scale), 0, 1);
      for (uint8_t b : sb) ASSERT_EQ(b, sb[0]);  // one scale per tensor
      ASSERT_NE(sb[0], 0xFF);
      s = ue8m0_to_f32(sb[0]);
    }
    std::vector<double> v;
    for (size_t i = 0; i < bytes.size(); ++i) {
      switch (c.format) {
        case WeightFormat::FP8Block:
        case WeightFormat::FP8Rows:
          ASSERT_NE(bytes[i] & 0x7F, 0x7F) << "NaN code at byte " << i;
          v.push_back(e4m3_to_f32(bytes[i]) * s);
          break;
        case WeightFormat::MXFP4:
          v.push_back(e2m1_to_f32(bytes[i] & 0xF) * s);
          v.push_back(e2m1_to_f32(bytes[i] >> 4) * s);
          break;
        case WeightFormat::BF16:
          if (i % 2 == 0) v.push_back(bf16_to_f32(static_cast<uint16_t>(bytes[i] | (bytes[i + 1] << 8))));
          break;
        default:
          if (i % 4 == 0) {
            float f;
            std::memcpy(&f, &bytes[i], 4);
            v.push_back(f);
          }
      }
    }
    ASSERT_GT(v.size(), 1000u);
    for (double x : v) ASSERT_TRUE(std::isfinite(x));
    const Moments mo = moments(v);
    // Coarse formats round (e2m1 has 15 values): the spread is within 15 % of the plan, the mean near
    // the offset; the scale puts the largest code in the format's top binade (no wasted range).
    EXPECT_NEAR(mo.stddev, c.sigma, 0.15 * c.sigma);
    EXPECT_NEAR(mo.mean, c.offset, 0.05 * c.sigma + 1e-3);
    if (c.format == WeightFormat::FP8Block || c.format == WeightFormat::FP8Rows) {
      EXPECT_LE(mo.amax, 448.0 * s);
      EXPECT_GT(mo.amax, 0.25 * 448.0 * s);
    } else if (c.format == WeightFormat::MXFP4) {
      EXPECT_LE(mo.amax, 6.0 * s);
      EXPECT_GT(mo.amax, 0.25 * 6.0 * s);
    }
  }
}

TEST(PerfProfile, CheckpointOfTheGeneratorRunsThroughTheCpuForward) {
  // The perf generator on the tiny widths (every tensor kind of the perf model, small enough to run):
  // the written checkpoint passes the inventory check, loads, and gives finite logits over a prompt.
  auto config = tiny_model_config(Arch::DeepseekV41, "tiny", false);
  ASSERT_TRUE(config.ok());
  auto plan = build_layer_plan(*config);
  ASSERT_TRUE(plan.ok());
  auto ts = perf_tensors(*config, *plan, 5);
  ASSERT_TRUE(ts.ok()) << ts.error().message;
  const fs::path dir = fs::temp_directory_path() / ("cedar-perfgen-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ThreadPool pool(2);
  io::StreamedWriteOptions wo;
  wo.n_shards = 3;
  wo.pool = &pool;
  wo.chunk_bytes = 4096;
  ASSERT_TRUE(io::write_streamed_sharded(dir, *ts, wo).ok());
  { std::ofstream(dir / "config.json") << to_hf_config_json(*config).dump(2); }
  const Status inv = verify_tiny_checkpoint(dir);
  EXPECT_TRUE(inv.ok()) << inv.error().message;
  LoadOptions lo;
  lo.pool = &pool;
  auto model = DeepseekV41Model::load(dir, lo);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto state = model->new_sequence({});
  ASSERT_TRUE(state.ok());
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 24; ++i) ids.push_back((i * 7919 + 11) % 128000);
  ForwardOptions fo;
  fo.logits = LogitRows::All;
  fo.pool = &pool;
  auto out = model->forward(ids, *state, fo);
  ASSERT_TRUE(out.ok()) << out.error().message;
  ASSERT_EQ(out->logits.size(), ids.size() * static_cast<size_t>(config->vocab_size));
  double sumsq = 0;
  for (float x : out->logits) {
    ASSERT_TRUE(std::isfinite(x));
    sumsq += static_cast<double>(x) * x;
  }
  EXPECT_GT(sumsq, 0.0);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace cedar
