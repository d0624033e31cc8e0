// cedar make-tiny's writer: every variant reopens with io::Checkpoint and passes the inventory check;
// the values are deterministic per seed; quantized values follow the released formats (§2.1) and
// the magnitudes the writer documents. References: the spec's numbers (Engram primes, format rules),
// not the writer's output.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/numeric.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/inventory.h"
#include "model/layer_plan.h"
#include "model/tiny_checkpoint.h"
#include "model/weights.h"

namespace cedar {
namespace {

namespace fs = std::filesystem;

struct Variant {
  Arch arch;
  bool bf16;
  uint64_t seed;
  bool tokenizer = false;  // tests of tensor values skip the (slow to parse) tokenizer files
  std::string dir_name() const {
    return std::string(arch_name(arch)) + (bf16 ? "-bf16" : "") + "-seed" + std::to_string(seed) +
           (tokenizer ? "-tok" : "");
  }
};

// Writes each variant at most once per process (the embedding tables make a checkpoint ~40 MB).
class TinyCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(fs::temp_directory_path() / ("cedar-tiny-test-" + std::to_string(::getpid())));
    fs::remove_all(*root_);
    fs::create_directories(*root_);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*root_, ec);
    delete root_;
    root_ = nullptr;
  }
  // The checkpoint directory of a variant, written on first request; fails the test on error.
  static fs::path written(const Variant& v) {
    const fs::path dir = *root_ / v.dir_name();
    if (!fs::exists(dir)) {
      TinyCheckpointOptions o;
      o.arch = v.arch;
      o.bf16 = v.bf16;
      o.seed = v.seed;
      o.tokenizer_files = v.tokenizer;
      const Status st = make_tiny_checkpoint(o, dir, false);
      EXPECT_TRUE(st.ok()) << v.dir_name() << ": " << st.error().message;
    }
    return dir;
  }
  static fs::path* root_;
};
fs::path* TinyCheckpointTest::root_ = nullptr;

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::vector<fs::path> shard_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST_F(TinyCheckpointTest, EveryVariantReopensAndPassesTheInventoryCheck) {
  for (Arch arch : {Arch::DeepseekV41, Arch::DeepseekV4}) {
    for (bool bf16 : {false, true}) {
      const Variant v{arch, bf16, 0, true};
      const fs::path dir = written(v);
      auto config = load_model_config(dir);
      ASSERT_TRUE(config.ok()) << config.error().message;
      EXPECT_EQ(config->arch, arch);
      EXPECT_EQ(config->quant.quantized(), !bf16) << v.dir_name();
      auto plan = build_layer_plan(*config);
      ASSERT_TRUE(plan.ok()) << plan.error().message;
      auto ckpt = io::Checkpoint::open(dir);
      ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
      EXPECT_GE(ckpt->shard_paths().size(), 2u) << v.dir_name();
      auto expected = expected_weights(*config, *plan);
      ASSERT_TRUE(expected.ok());
      const Status inv = check_inventory(*expected, *ckpt, inventory_options(*config, *plan));
      EXPECT_TRUE(inv.ok()) << v.dir_name() << ": " << inv.error().message;
      EXPECT_EQ(ckpt->tensors().size(), expected->size()) << v.dir_name();
      for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"})
        EXPECT_TRUE(fs::is_regular_file(dir / f)) << v.dir_name() << " lacks " << f;
    }
  }
}

TEST_F(TinyCheckpointTest, SameSeedGivesIdenticalShardsAndAnotherSeedDifferentOnes) {
  const fs::path a = written({Arch::DeepseekV41, false, 0});
  const fs::path b = *root_ / "again-seed0";
  TinyCheckpointOptions o;  // V4.1, seed 0
  o.tokenizer_files = false;
  ASSERT_TRUE(make_tiny_checkpoint(o, b, false).ok());
  const fs::path c = written({Arch::DeepseekV41, false, 1});
  const auto sa = shard_files(a), sb = shard_files(b), sc = shard_files(c);
  ASSERT_EQ(sa.size(), sb.size());
  ASSERT_EQ(sa.size(), sc.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(file_bytes(sa[i]), file_bytes(sb[i])) << sa[i].filename();
    EXPECT_NE(file_bytes(sa[i]), file_bytes(sc[i])) << sa[i].filename();
  }
  EXPECT_EQ(file_bytes(a / "model.safetensors.index.json"), file_bytes(b / "model.safetensors.index.json"));
}

TEST_F(TinyCheckpointTest, OneTensorsValuesDoNotDependOnTheOthers) {
  // Quantized and bf16 variants list different tensors, but a tensor both list as BF16 (a norm) is
  // drawn from (seed, name) alone, so it must be identical.
  auto q = io::Checkpoint::open(written({Arch::DeepseekV41, false, 0}));
  auto b = io::Checkpoint::open(written({Arch::DeepseekV41, true, 0}));
  ASSERT_TRUE(q.ok() && b.ok());
  for (const char* name : {"layers.3.attn_norm.weight", "norm.weight", "embed.weight"}) {
    auto tq = q->tensor(name), tb = b->tensor(name);
    ASSERT_TRUE(tq.ok() && tb.ok()) << name;
    ASSERT_EQ(tq->bytes.size(), tb->bytes.size());
    EXPECT_EQ(0, std::memcmp(tq->bytes.data(), tb->bytes.data(), tq->bytes.size())) << name;
  }
}

struct Stats {
  double mean = 0, rms = 0, amax = 0;
};

Stats stats_of(const std::vector<float>& v) {
  Stats s;
  for (float x : v) {
    s.mean += x;
    s.rms += static_cast<double>(x) * x;
    s.amax = std::max(s.amax, static_cast<double>(std::fabs(x)));
  }
  s.mean /= static_cast<double>(v.size());
  s.rms = std::sqrt(s.rms / static_cast<double>(v.size()));
  return s;
}

// Dequantizes an FP8 block weight with the §2.1 rule, checking on the way that every block's scale
// is the smallest power of two that keeps |q| <= 448 (so the block's largest |q| is above 224).
std::vector<float> dequant_fp8_block(const io::Checkpoint& ck, const std::string& name, int64_t block) {
  auto w = ck.tensor(name + ".weight");
  auto s = ck.tensor(name + ".scale");
  EXPECT_TRUE(w.ok() && s.ok()) << name;
  if (!w.ok() || !s.ok()) return {};
  EXPECT_EQ(w->entry->dtype, DType::F8_E4M3) << name;
  EXPECT_EQ(s->entry->dtype, DType::F8_E8M0) << name;
  const int64_t rows = w->entry->shape[0], cols = w->entry->shape[1];
  const int64_t sr = (rows + block - 1) / block, sc = (cols + block - 1) / block;
  EXPECT_EQ(s->entry->shape, (std::vector<int64_t>{sr, sc})) << name;
  std::vector<float> out(static_cast<size_t>(rows * cols));
  std::vector<float> block_qmax(static_cast<size_t>(sr * sc), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const size_t b = static_cast<size_t>((r / block) * sc + c / block);
      const uint8_t sbyte = s->bytes[b];
      EXPECT_NE(sbyte, 0xFF) << name;
      const float q = e4m3_to_f32(w->bytes[i]);
      block_qmax[b] = std::max(block_qmax[b], std::fabs(q));
      out[i] = q * std::ldexp(1.0f, static_cast<int>(sbyte) - 127);
    }
  }
  for (float m : block_qmax) {
    EXPECT_LE(m, 448.0f) << name;
    EXPECT_GT(m, 224.0f) << name << ": scale is not the smallest power of two";
  }
  return out;
}

TEST_F(TinyCheckpointTest, Fp8WeightsDequantizeToTheDrawnMagnitudes) {
  const fs::path dir = written({Arch::DeepseekV41, false, 0});
  auto config = load_model_config(dir);
  ASSERT_TRUE(config.ok());
  auto ck = io::Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok());
  // Linear weights ~ N(0, 1/fan_in): rms ≈ 1/sqrt(in), mean ≈ 0.
  for (const char* name : {"layers.0.attn.wq_a", "layers.5.attn.wq_b", "layers.7.ffn.shared_experts.w2"}) {
    const std::vector<float> v = dequant_fp8_block(*ck, name, config->quant.weight_block_rows);
    ASSERT_FALSE(v.empty());
    const int64_t in = ck->find(std::string(name) + ".weight")->shape[1];
    const Stats s = stats_of(v);
    const double expect_rms = 1.0 / std::sqrt(static_cast<double>(in));
    EXPECT_NEAR(s.rms, expect_rms, 0.1 * expect_rms) << name;
    EXPECT_NEAR(s.mean, 0.0, 0.1 * expect_rms) << name;
  }
}

TEST_F(TinyCheckpointTest, V4UsesItsOwnWeightBlockSize) {
  const fs::path dir = written({Arch::DeepseekV4, false, 0});
  auto config = load_model_config(dir);
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->quant.weight_block_rows, 128);
  auto ck = io::Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok());
  const std::vector<float> v = dequant_fp8_block(*ck, "layers.2.attn.wq_a", 128);
  ASSERT_FALSE(v.empty());
  const double expect_rms = 1.0 / std::sqrt(static_cast<double>(ck->find("layers.2.attn.wq_a.weight")->shape[1]));
  EXPECT_NEAR(stats_of(v).rms, expect_rms, 0.1 * expect_rms);
}

TEST_F(TinyCheckpointTest, ExpertsAreMxfp4WithTightScales) {
  const fs::path dir = written({Arch::DeepseekV41, false, 0});
  auto ck = io::Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok());
  auto w = ck->tensor("layers.2.ffn.experts.3.w1.weight");
  auto s = ck->tensor("layers.2.ffn.experts.3.w1.scale");
  ASSERT_TRUE(w.ok() && s.ok());
  EXPECT_EQ(w->entry->dtype, DType::I8);
  EXPECT_EQ(s->entry->dtype, DType::F8_E8M0);
  const int64_t rows = w->entry->shape[0], in = w->entry->shape[1] * 2;
  ASSERT_EQ(s->entry->shape, (std::vector<int64_t>{rows, in / 32}));
  std::vector<float> v;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < in / 32; ++b) {
      const uint8_t sbyte = s->bytes[static_cast<size_t>(r * (in / 32) + b)];
      float qmax = 0;
      for (int64_t k = 0; k < 32; ++k) {
        const size_t i = static_cast<size_t>(r * in + b * 32 + k);
        const uint8_t byte = w->bytes[i / 2];
        const float q = e2m1_to_f32(i % 2 == 0 ? byte & 0xF : byte >> 4);  // even element: low nibble
        qmax = std::max(qmax, std::fabs(q));
        v.push_back(q * std::ldexp(1.0f, static_cast<int>(sbyte) - 127));
      }
      EXPECT_GE(qmax, 3.0f) << "block (" << r << ", " << b << "): scale is not the smallest power of two";
    }
  }
  const double expect_rms = 1.0 / std::sqrt(static_cast<double>(in));
  EXPECT_NEAR(stats_of(v).rms, expect_rms, 0.25 * expect_rms);  // FP4 rounding is coarse
}

std::vector<float> bf16_values(const io::TensorView& t) {
  std::vector<float> out(t.bytes.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, t.bytes.data() + 2 * i, 2);
    out[i] = bf16_to_f32(b);
  }
  return out;
}

std::vector<float> f32_values(const io::TensorView& t) {
  std::vector<float> out(t.bytes.size() / 4);
  std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

TEST_F(TinyCheckpointTest, RoleMagnitudes) {
  auto ck = io::Checkpoint::open(written({Arch::DeepseekV41, false, 0}));
  ASSERT_TRUE(ck.ok());
  auto norm = ck->tensor("layers.4.ffn_norm.weight");
  ASSERT_TRUE(norm.ok());
  const Stats n = stats_of(bf16_values(*norm));
  EXPECT_NEAR(n.mean, 1.0, 0.05);
  EXPECT_LT(n.amax, 1.5);
  for (const char* name : {"layers.4.attn.attn_sink", "layers.4.ffn.gate.bias", "layers.4.hc_attn_fn"}) {
    auto t = ck->tensor(name);
    ASSERT_TRUE(t.ok()) << name;
    ASSERT_EQ(t->entry->dtype, DType::F32) << name;
    const Stats s = stats_of(f32_values(*t));
    EXPECT_LT(s.amax, 0.2) << name;
    EXPECT_GT(s.amax, 0.0) << name;
  }
}

// The prime rule against the released numbers (architecture.md §3.9 item 5): two layers, orders 2..4,
// 8 heads from 16 000 000 give 384 006 168 and 384 016 682 rows.
TEST(EngramTableRows, ReleasedConfigGivesTheReleasedRowCounts) {
  ModelConfig c;
  c.engram_layer_ids = {1, 14};
  c.engram_max_ngram_size = 4;
  c.engram_n_heads = 8;
  c.engram_vocab_size = 16000000;
  EXPECT_EQ(engram_table_rows(c), (std::vector<int64_t>{384006168, 384016682}));
}

TEST(EngramTableRows, TinyProfileUsesTheRuleFromItsOwnVocabSize) {
  auto c = tiny_model_config(Arch::DeepseekV41, "tiny", false);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->engram_vocab_size, 1000);
  ASSERT_EQ(c->engram_max_ngram_size, 4);
  ASSERT_EQ(c->engram_n_heads, 2);
  // Primes from 1000 on: 1009 1013 1019 1021 1031 1033 | 1039 1049 1051 1061 1063 1069.
  EXPECT_EQ(c->engram_num_embeddings, (std::vector<int64_t>{1009 + 1013 + 1019 + 1021 + 1031 + 1033,
                                                            1039 + 1049 + 1051 + 1061 + 1063 + 1069}));
  EXPECT_EQ(c->engram_compressed_vocab_size, 99092);
  EXPECT_EQ(c->vocab_size, 129280);
}

TEST(TinyModelConfig, V41PlanIsStructurallyComplete) {
  auto c = tiny_model_config(Arch::DeepseekV41, "tiny", false);
  ASSERT_TRUE(c.ok());
  auto plan = build_layer_plan(*c);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_GE(plan->count(AttnMode::SwaOnly), 2);
  EXPECT_GE(plan->count(AttnMode::Full), 3);
  EXPECT_GE(plan->count(AttnMode::Reindex), 1);
  EXPECT_GE(plan->count(AttnMode::Reuse), 3);
  EXPECT_EQ(plan->drafts.size(), 3u);
  int engram_swa = 0, engram_full = 0, candidate = 0, ratio2_full = 0, ratio2_reuse = 0;
  for (const auto& l : plan->layers) {
    if (l.has_engram && l.mode == AttnMode::SwaOnly) ++engram_swa;
    if (l.has_engram && l.mode == AttnMode::Full) ++engram_full;
    if (l.is_candidate_source) {
      ++candidate;
      EXPECT_EQ(l.compress_ratio, 1);
    }
    if (l.compress_ratio == 2 && l.mode == AttnMode::Full) ++ratio2_full;
    if (l.compress_ratio == 2 && l.mode == AttnMode::Reuse) ++ratio2_reuse;
  }
  EXPECT_EQ(engram_swa, 1);
  EXPECT_EQ(engram_full, 1);
  EXPECT_EQ(candidate, 1);
  EXPECT_GE(ratio2_full, 2);
  EXPECT_GE(ratio2_reuse, 2);
  EXPECT_LT(c->index_topk, c->candidate_topk_blocks * c->candidate_block_size + 1);
}

// config.json must carry the whole profile: parsing what make-tiny writes gives the profile back.
TEST(TinyModelConfig, ConfigJsonRoundTrips) {
  for (Arch arch : {Arch::DeepseekV41, Arch::DeepseekV4}) {
    for (bool bf16 : {false, true}) {
      auto c = tiny_model_config(arch, "tiny", bf16);
      ASSERT_TRUE(c.ok());
      auto parsed = parse_model_config(to_hf_config_json(*c), "config.json");
      ASSERT_TRUE(parsed.ok()) << parsed.error().message;
      parsed->source = c->source;
      parsed->source_format = c->source_format;
      EXPECT_TRUE(*parsed == *c) << arch_name(arch) << (bf16 ? " bf16" : "");
    }
  }
}

TEST(TinyModelConfig, UnknownProfileIsAnError) {
  auto c = tiny_model_config(Arch::DeepseekV41, "huge", false);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("huge"), std::string::npos);
}

}  // namespace
}  // namespace cedar

// The benchmark profile keeps the tiny layer structure at wider, block-aligned widths.
TEST(TinyProfiles, SmallProfileKeepsTheLayerPlanAtBlockAlignedWidths) {
  for (const cedar::Arch arch : {cedar::Arch::DeepseekV41, cedar::Arch::DeepseekV4}) {
    auto tiny = cedar::tiny_model_config(arch, "tiny", false);
    auto small = cedar::tiny_model_config(arch, "small", false);
    ASSERT_TRUE(tiny.ok() && small.ok());
    EXPECT_EQ(small->hidden_size, 512);
    EXPECT_EQ(small->compress_ratios, tiny->compress_ratios);
    for (int64_t width : {small->hidden_size, small->head_dim, small->q_lora_rank, small->moe_intermediate_size,
                          small->o_lora_rank, small->index_head_dim})
      EXPECT_EQ(width % 32, 0) << width;
    auto plan = cedar::build_layer_plan(*small);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    auto weights = cedar::expected_weights(*small, *plan);
    ASSERT_TRUE(weights.ok()) << weights.error().message;
  }
  auto unknown = cedar::tiny_model_config(cedar::Arch::DeepseekV41, "huge", false);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("'huge'"), std::string::npos);
}
