// Weight binding on hand-made checkpoints of the tiny_v41 test config: every tensor of the expected
// inventory is written with a known byte pattern, then bound. Conversions are checked against decoders
// written here from the format definitions (architecture.md §2.1: e4m3 = bias-7 OCP e4m3fn, e8m0 =
// 2^(b−127), bf16 = upper half of binary32 with round-to-nearest-even), not against cedar's numeric.h.
#include "model/weight_binding.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "../io/safetensors_test_util.h"
#include "model/weights.h"

namespace cedar {
namespace {

const std::string kConfigs = std::string(CEDAR_TEST_DATA_DIR) + "/configs/";

float ref_e4m3(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int e = (b >> 3) & 0xF, m = b & 7;
  if (e == 0) return sign * std::ldexp(static_cast<float>(m) / 8.0f, -6);
  return sign * std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
}

uint16_t ref_bf16_bits(float x) {  // RNE, finite inputs
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

float ref_bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Deterministic bytes of one tensor: finite e4m3 codes (no 0x7F/0xFF), e8m0 scales near 2^0, small
// floats for F32/BF16 (value i·2^-10 − 1, shifted by a per-tensor offset).
std::vector<uint8_t> pattern(const WeightSpec& s, uint32_t salt) {
  const size_t n = static_cast<size_t>(s.numel());
  std::vector<uint8_t> b(s.nbytes());
  for (size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>((i * 13 + salt) % 2048) / 1024.0f - 1.0f;
    switch (s.dtype) {
      case DType::F32: std::memcpy(&b[4 * i], &v, 4); break;
      case DType::BF16: {
        const uint16_t h = ref_bf16_bits(v);
        b[2 * i] = static_cast<uint8_t>(h & 0xFF);
        b[2 * i + 1] = static_cast<uint8_t>(h >> 8);
        break;
      }
      case DType::F8_E4M3: b[i] = static_cast<uint8_t>(((i * 29 + salt) % 0x7E) | ((i & 1) << 7)); break;
      case DType::F8_E8M0: b[i] = static_cast<uint8_t>(120 + (i + salt) % 12); break;
      default: b[i] = static_cast<uint8_t>(i * 7 + salt); break;
    }
  }
  return b;
}

struct Fixture {
  ModelConfig config;
  LayerPlan plan;
  std::vector<WeightSpec> specs;
};

Fixture tiny(bool quantized) {
  Fixture f;
  auto c = load_model_config(kConfigs + "tiny_v41");
  EXPECT_TRUE(c.ok()) << c.error().message;
  f.config = *c;
  if (!quantized) f.config.quant = QuantConfig{};
  f.plan = *build_layer_plan(f.config);
  f.specs = *expected_weights(f.config, f.plan);
  return f;
}

// Writes every expected tensor (after `edit` may drop or change specs) as a 2-shard checkpoint.
io::Checkpoint write(const Fixture& f, const std::filesystem::path& dir,
                     const std::function<bool(WeightSpec&)>& edit = nullptr) {
  io::SafetensorsWriter w;
  uint32_t salt = 0;
  for (WeightSpec s : f.specs) {
    ++salt;
    if (edit && !edit(s)) continue;
    EXPECT_TRUE(w.add(s.name, s.dtype, s.shape, pattern(s, salt)).ok()) << s.name;
  }
  EXPECT_TRUE(w.write_sharded(dir, 2).ok());
  auto ckpt = io::Checkpoint::open(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.error().message;
  return std::move(*ckpt);
}

TEST(WeightBinding, BindsEveryRoleOfTheTinyModel) {
  io::testing::TempDir dir;
  const Fixture f = tiny(true);
  auto bound = BoundWeights::bind(write(f, dir.path()), f.config, f.plan, nullptr);
  ASSERT_TRUE(bound.ok()) << bound.error().message;
  const ModelWeights& t = bound->tensors();
  ASSERT_EQ(t.layers.size(), 8u);
  EXPECT_EQ(t.embed.format, WeightFormat::BF16);
  EXPECT_EQ(t.embed.out, 512);
  EXPECT_EQ(t.head.in, 64);
  EXPECT_EQ(t.final_norm.size(), 64u);
  for (const LayerRole& role : f.plan.layers) {
    SCOPED_TRACE(role.layer);
    const LayerWeights& L = t.layers[static_cast<size_t>(role.layer)];
    EXPECT_EQ(L.attn.wq_a.format, WeightFormat::FP8Block);
    EXPECT_EQ(L.attn.wq_a.out, 32);
    EXPECT_EQ(L.attn.wq_a.in, 64);
    EXPECT_NE(L.attn.wq_a.scale, nullptr);
    EXPECT_EQ(L.attn.wo_a.format, WeightFormat::BF16);  // converted at load
    EXPECT_EQ(L.attn.wo_a.scale, nullptr);
    EXPECT_EQ(L.hc_attn.fn.size(), 24u * 256u);
    EXPECT_EQ(L.ffn.experts.size(), 8u);
    EXPECT_EQ(L.ffn.experts[7].w2.format, WeightFormat::MXFP4);
    EXPECT_EQ(L.ffn.experts[7].w2.in, 64);
    EXPECT_EQ(L.ffn.shared.w1.format, WeightFormat::FP8Block);
    EXPECT_EQ(L.attn.wkv_c.data != nullptr, role.owns_compressor);
    EXPECT_EQ(L.attn.wgate_c.data != nullptr, role.compressor_has_gate);
    EXPECT_EQ(L.attn.wk.data != nullptr, role.owns_indexer_keys);
    EXPECT_EQ(L.attn.wq_b_i.data != nullptr, role.owns_indexer);
    EXPECT_EQ(L.engram.has_value(), role.has_engram);
  }
  const EngramWeights& e = *t.layers[4].engram;
  EXPECT_EQ(t.layers[4].engram_table_format, WeightFormat::FP8Rows);
  EXPECT_EQ(e.rows, 101);
  EXPECT_EQ(e.head_dim, 32);
  EXPECT_NE(e.table_scale, nullptr);
}

TEST(WeightBinding, ConvertsValuesAsTheReferenceHoldsThem) {
  io::testing::TempDir dir;
  const Fixture f = tiny(true);
  io::Checkpoint ckpt = write(f, dir.path());
  // Raw bytes straight from the checkpoint, decoded here.
  auto raw = [&](const std::string& name) { return ckpt.raw_tensor(name)->bytes; };
  const auto wo_a = raw("layers.3.attn.wo_a.weight");
  const auto wo_a_scale = raw("layers.3.attn.wo_a.scale");
  const auto norm = raw("layers.3.attn_norm.weight");
  const auto sink = raw("layers.3.attn.attn_sink");
  const auto gate = raw("layers.5.ffn.gate.weight");
  const std::vector<uint8_t> wo_a_copy(wo_a.begin(), wo_a.end()), scale_copy(wo_a_scale.begin(), wo_a_scale.end());
  const std::vector<uint8_t> norm_copy(norm.begin(), norm.end()), sink_copy(sink.begin(), sink.end());
  const std::vector<uint8_t> gate_copy(gate.begin(), gate.end());

  ThreadPool pool(2);
  auto bound = BoundWeights::bind(std::move(ckpt), f.config, f.plan, &pool);
  ASSERT_TRUE(bound.ok()) << bound.error().message;
  const LayerWeights& L = bound->tensors().layers[3];

  // wo_a [out = o_groups·o_lora = 64, in = heads·head_dim/o_groups = 128], scales per 32×32 block.
  const cpu::LinearWeight& w = L.attn.wo_a;
  ASSERT_EQ(w.out, 64);
  ASSERT_EQ(w.in, 128);
  ASSERT_EQ(scale_copy.size(), 2u * 4u);
  int64_t checked = 0;
  for (int64_t r = 0; r < w.out; ++r) {
    for (int64_t c = 0; c < w.in; ++c) {
      const float expect = ref_e4m3(wo_a_copy[static_cast<size_t>(r * w.in + c)]) *
                           std::ldexp(1.0f, scale_copy[static_cast<size_t>((r / 32) * 4 + c / 32)] - 127);
      const uint16_t got = static_cast<uint16_t>(w.data[2 * (r * w.in + c)] | (w.data[2 * (r * w.in + c) + 1] << 8));
      ASSERT_EQ(got, ref_bf16_bits(expect)) << "wo_a[" << r << "," << c << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 64 * 128);

  // BF16 norm and router weights as fp32 values; F32 sink as is.
  ASSERT_EQ(L.attn_norm.size(), 64u);
  for (size_t i = 0; i < 64; ++i)
    EXPECT_EQ(L.attn_norm[i], ref_bf16_value(static_cast<uint16_t>(norm_copy[2 * i] | (norm_copy[2 * i + 1] << 8))));
  ASSERT_EQ(L.attn.attn_sink.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    float v;
    std::memcpy(&v, &sink_copy[4 * i], 4);
    EXPECT_EQ(L.attn.attn_sink[i], v);
  }
  const auto& g = bound->tensors().layers[5].ffn.gate;
  ASSERT_EQ(g.size(), 8u * 64u);
  for (size_t i = 0; i < g.size(); i += 37)
    EXPECT_EQ(g[i], ref_bf16_value(static_cast<uint16_t>(gate_copy[2 * i] | (gate_copy[2 * i + 1] << 8))));
}

TEST(WeightBinding, BindsBf16Checkpoints) {
  io::testing::TempDir dir;
  const Fixture f = tiny(false);
  auto bound = BoundWeights::bind(write(f, dir.path()), f.config, f.plan, nullptr);
  ASSERT_TRUE(bound.ok()) << bound.error().message;
  const LayerWeights& L = bound->tensors().layers[4];
  EXPECT_EQ(L.attn.wq_b.format, WeightFormat::BF16);
  EXPECT_EQ(L.attn.wo_a.format, WeightFormat::BF16);
  EXPECT_EQ(L.ffn.experts[0].w1.format, WeightFormat::BF16);
  ASSERT_TRUE(L.engram.has_value());
  EXPECT_EQ(L.engram_table_format, WeightFormat::BF16);
  EXPECT_EQ(L.engram->table_scale, nullptr);
  EXPECT_EQ(bound->converted_bytes() % 4, 0u);
}

TEST(WeightBinding, MissingTensorsAreNamed) {
  io::testing::TempDir dir;
  const Fixture f = tiny(true);
  auto ckpt = write(f, dir.path(), [](WeightSpec& s) {
    return s.name != "layers.3.attn.wq_a.scale" && s.name != "layers.2.attn.compressor.wgate.weight";
  });
  auto bound = BoundWeights::bind(std::move(ckpt), f.config, f.plan, nullptr);
  ASSERT_FALSE(bound.ok());
  const std::string& m = bound.error().message;
  EXPECT_NE(m.find("2 problems"), std::string::npos) << m;
  EXPECT_NE(m.find("missing tensor 'layers.3.attn.wq_a.scale' (expected F8_E8M0 [1, 2])"), std::string::npos) << m;
  EXPECT_NE(m.find("missing tensor 'layers.2.attn.compressor.wgate.weight' (expected BF16 [64, 64])"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(dir.path().string()), std::string::npos) << m;
}

TEST(WeightBinding, WrongDtypeOrShapeIsNamed) {
  io::testing::TempDir dir;
  const Fixture f = tiny(true);
  auto ckpt = write(f, dir.path(), [](WeightSpec& s) {
    if (s.name == "layers.0.hc_ffn_base") s.shape = {25};
    if (s.name == "layers.1.attn.kv_norm.weight") s.dtype = DType::F32;
    return true;
  });
  auto bound = BoundWeights::bind(std::move(ckpt), f.config, f.plan, nullptr);
  ASSERT_FALSE(bound.ok());
  const std::string& m = bound.error().message;
  EXPECT_NE(m.find("tensor 'layers.0.hc_ffn_base' is F32 [25], expected F32 [24]"), std::string::npos) << m;
  EXPECT_NE(m.find("tensor 'layers.1.attn.kv_norm.weight' is F32 [64], expected BF16 [64]"), std::string::npos) << m;
}

TEST(WeightBinding, BindsV4) {
  io::testing::TempDir dir;
  auto c = load_model_config(kConfigs + "tiny_v4");
  ASSERT_TRUE(c.ok());
  const LayerPlan plan = *build_layer_plan(*c);
  Fixture f{*c, plan, *expected_weights(*c, plan)};
  auto bound = BoundWeights::bind(write(f, dir.path()), f.config, f.plan, nullptr);
  ASSERT_TRUE(bound.ok()) << bound.error().message;
  const ModelWeights& t = bound->tensors();
  EXPECT_EQ(t.hc_head.fn.size(), static_cast<size_t>(c->hc_mult * c->hc_mult * c->hidden_size));
  for (const LayerRole& role : plan.layers) {
    const LayerWeights& L = t.layers[static_cast<size_t>(role.layer)];
    EXPECT_EQ(L.ffn.tid2eid.empty(), !role.hash_routed) << "layer " << role.layer;
    EXPECT_EQ(L.attn.ape_c.empty(), !role.owns_compressor) << "layer " << role.layer;
    EXPECT_EQ(L.attn.wkv_ic.data == nullptr, role.mode != AttnMode::V4Csa) << "layer " << role.layer;
  }
}

TEST(WeightBinding, DequantizeFp8MatchesTheDefinition) {
  // A 3×40 weight with 32×32 blocks: partial blocks on both axes.
  std::vector<uint8_t> codes(3 * 40), scales(1 * 2);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>((i * 53) % 0x7E | (i % 3 == 0 ? 0x80 : 0));
  scales = {118, 133};
  cpu::LinearWeight w{WeightFormat::FP8Block, 3, 40, codes.data(), scales.data(), 32, 32};
  const std::vector<uint16_t> got = dequantize_fp8_block_to_bf16(w, nullptr);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 40; ++c)
      EXPECT_EQ(got[static_cast<size_t>(r * 40 + c)],
                ref_bf16_bits(ref_e4m3(codes[static_cast<size_t>(r * 40 + c)]) * std::ldexp(1.0f, scales[c / 32] - 127)));
}

}  // namespace
}  // namespace cedar
