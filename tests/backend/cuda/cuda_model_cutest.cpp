// Whole-model parity of the CUDA model (backend/cuda/cuda_model.h) with the CPU model
// (model/deepseek_v41.h) on make-tiny checkpoints written here (profiles tiny and small): exact and CED
// prefill, chunked prefill == one-shot on the GPU, greedy decode, batched decode == single-sequence
// decode, CUDA-graph replay == direct execution (bit for bit).
//
// Tolerances. Every kernel of the loop is tested against its CPU module on its own (the other
// *_cutest.cpp files): bit-exact where the arithmetic is the same (embedding, RoPE, SWA / KV records,
// compressor, indexer scores and selection, SwiGLU, combine, mHC expand / collapse), otherwise within
// one bf16 rounding of an output (2^-8 relative) from a different fp32 summation order (GEMVs / GEMMs,
// RMSNorm, router logits, mHC coefficients, attention). Such a flip moves an FP8 activation code of the
// next linear by one step (≤ 2^-4 relative of that element), so a few elements per layer differ by
// ~1e-2 relative and the logits of a 10-layer model agree to cosine ~0.9999, not bitwise. The discrete
// decisions are where the two can part completely: the router's top-k and the indexer's top-k pick
// among near-ties (the tiny random models have many; the indexer's scores are bf16-rounded, so exact
// ties are common and a one-ulp difference decides them). One flipped decision changes that row's
// output, and through the caches every later position. So each comparison finds the first position
// whose decisions (indexer top-k of every index source, router experts of every layer) differ between
// GPU and CPU and checks positions before it tightly (cosine >= 0.999, NMSE <= 2e-3: 10× the
// accumulated rounding of the kernel bounds above), later positions loosely (cosine >= 0.5: same model,
// different decisions), and bounds how often decisions flip (<= 10% of the (layer, position) decisions:
// rounding-level differences cannot flip more than the near-ties). GPU vs GPU comparisons (chunked vs
// one-shot, batched vs single) differ by kernel choice only (GEMV vs GEMM summation orders; the key split
// of the decode attention depends on the batch), and use the same rule; graph replay is bit-exact.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_model.h"
#include "cuda_test_util.h"
#include "model/deepseek_v41.h"
#include "model/moe.h"
#include "model/tiny_checkpoint.h"

namespace cedar::cuda {
namespace {

namespace fs = std::filesystem;

fs::path engram_map() {
  if (const char* env = std::getenv("CEDAR_ENGRAM_MAP")) return env;
  const fs::path rel = fs::path("assets") / "engram" / "deepseek_v41_token_map.npy";
  if (fs::exists(fs::path(CEDAR_SOURCE_DIR) / rel)) return fs::path(CEDAR_SOURCE_DIR) / rel;
  return fs::absolute(rel);
}

// A fixed pseudo-random prompt of real token ids (< 128000: no special tokens).
std::vector<int64_t> prompt(int64_t n, uint64_t seed) {
  std::vector<int64_t> ids;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 12345;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ids.push_back(static_cast<int64_t>(x % 128000));
  }
  return ids;
}

// Discrete decisions by (layer, position): the indexer top-k ids (index sources) and the router's
// experts (sorted), of the CPU or the GPU.
struct Decisions {
  std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>> topk, experts;
};

// Logits of some positions, row-major [positions, vocab].
struct Logits {
  std::vector<float> values;
  std::vector<int64_t> positions;
  int64_t vocab = 0;
  const float* row(int64_t pos) const {
    for (size_t i = 0; i < positions.size(); ++i)
      if (positions[i] == pos) return values.data() + i * vocab;
    return nullptr;
  }
};

struct Model {
  std::string profile;
  fs::path dir;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<DeepseekV41Model> cpu;
  std::unique_ptr<CudaModel> gpu;
  std::string error;
  ~Model() {
    gpu.reset();
    cpu.reset();
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

Model* model_for(const std::string& profile) {
  static std::map<std::string, std::unique_ptr<Model>> models;
  auto& m = models[profile];
  if (m) return m.get();
  m = std::make_unique<Model>();
  m->profile = profile;
  m->dir = fs::temp_directory_path() / ("cedar-cuda-model-parity-" + profile + "-" + std::to_string(::getpid()));
  fs::remove_all(m->dir);
  TinyCheckpointOptions o;
  o.profile = profile;
  o.seed = profile == "tiny" ? 3 : 1;
  o.tokenizer_files = false;
  if (Status st = make_tiny_checkpoint(o, m->dir, false); !st.ok()) {
    m->error = "make-tiny " + profile + ": " + st.error().message;
    return m.get();
  }
  m->pool = std::make_unique<ThreadPool>(0);
  LoadOptions lo;
  lo.engram_map = engram_map();
  lo.pool = m->pool.get();
  auto cpu = DeepseekV41Model::load(m->dir, lo);
  if (!cpu.ok()) {
    m->error = "CPU load: " + cpu.error().message;
    return m.get();
  }
  m->cpu = std::make_unique<DeepseekV41Model>(std::move(*cpu));
  CudaModelOptions go;
  go.max_batch = 128;  // also the logit rows of one call: whole prompts with every row's logits
  go.max_chunk = 128;
  go.kv.max_sequences = 130;
  go.kv.max_context = 1024;
  go.kv.token_capacity = 16384;
  go.headroom_bytes = uint64_t{1} << 30;
  go.engram_map = lo.engram_map;
  go.pool = m->pool.get();
  auto gpu = CudaModel::load(m->dir, go);
  if (!gpu.ok()) {
    m->error = "CUDA load: " + gpu.error().message;
    return m.get();
  }
  m->gpu = std::move(*gpu);
  std::printf("[ model    ] %s: %s, cuBLASLt %s\n", profile.c_str(), m->dir.c_str(),
              m->gpu->has_cublas() ? "loaded (BF16 prefill GEMMs)" : "missing (gemv_bf16 for every BF16 linear)");
  return m.get();
}

#define CEDAR_REQUIRE_MODEL(var, profile)                  \
  CEDAR_REQUIRE_GPU();                                     \
  Model* var = model_for(profile);                         \
  ASSERT_TRUE(var->error.empty()) << var->error;

// ---- CPU side ----------------------------------------------------------------------------------

int64_t layer_of(std::string_view name, std::string_view suffix) {
  if (name.substr(0, 7) != "layers." || name.size() < suffix.size() ||
      name.substr(name.size() - suffix.size()) != suffix)
    return -1;
  return std::atoll(std::string(name.substr(7)).c_str());
}

// Per-layer tensors by name, rows [pos0, pos0 + rows) appended in call order.
struct Tensors {
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, int64_t> width, pos0;
  std::vector<std::string> order;
  void add(const TensorRecord& r) {
    const std::string name(r.name);
    if (!values.count(name)) {
      order.push_back(name);
      width[name] = r.width;
      pos0[name] = r.pos0;
    }
    auto& v = values[name];
    v.insert(v.end(), r.data.begin(), r.data.begin() + r.rows * r.width);
  }
};

bool traced(std::string_view name) {
  for (const char* s : {".attn_in", ".attn_out", ".ffn_in", ".ffn_out", ".engram_out"})
    if (name.size() > std::strlen(s) && name.substr(name.size() - std::strlen(s)) == s) return true;
  return false;
}

// One CPU forward call: logits and the decisions of its rows.
Logits cpu_call(Model& m, SequenceState& st, std::span<const int64_t> tokens, LogitRows rows, Decisions* dec,
                Tensors* tensors = nullptr) {
  ForwardOptions fo;
  fo.logits = rows;
  fo.pool = m.pool.get();
  const MoeParams mp = moe_params_from_config(m.cpu->config());
  fo.sink = [&](const TensorRecord& r) {
    if (tensors && traced(r.name)) tensors->add(r);
    if (!dec) return;
    if (int64_t l = layer_of(r.name, ".topk"); l >= 0) {
      for (int64_t i = 0; i < r.rows; ++i) {
        std::vector<int32_t> ids(static_cast<size_t>(r.width));
        for (int64_t j = 0; j < r.width; ++j) ids[j] = static_cast<int32_t>(r.data[i * r.width + j]);
        dec->topk[{l, r.pos0 + i}] = ids;
      }
    } else if (int64_t l2 = layer_of(r.name, ".ffn_in"); l2 >= 0) {
      const std::vector<float> x(r.data.begin(), r.data.begin() + r.rows * r.width);
      auto routing = route_tokens(x, r.rows, m.cpu->weights().tensors().layers[l2].ffn, mp, {}, {}, nullptr);
      ASSERT_TRUE(routing.ok()) << routing.error().message;
      for (int64_t i = 0; i < r.rows; ++i) {
        std::vector<int32_t> e;
        for (int64_t k = 0; k < routing->topk; ++k) e.push_back(static_cast<int32_t>(routing->experts[i * routing->topk + k]));
        std::sort(e.begin(), e.end());
        dec->experts[{l2, r.pos0 + i}] = e;
      }
    }
  };
  auto out = m.cpu->forward(tokens, st, fo);
  EXPECT_TRUE(out.ok()) << out.error().message;
  Logits lg;
  lg.vocab = m.cpu->config().vocab_size;
  if (out.ok()) {
    lg.values = out->logits;
    lg.positions = out->positions;
  }
  return lg;
}

// ---- GPU side ----------------------------------------------------------------------------------

Logits gpu_logits(const CudaModel& g, const CudaStepOutput& out) {
  Logits lg;
  lg.vocab = g.config().vocab_size;
  lg.positions = out.positions;
  lg.values.resize(static_cast<size_t>(out.rows * lg.vocab));
  if (out.rows > 0) {
    EXPECT_EQ(cudaMemcpy(lg.values.data(), out.logits, lg.values.size() * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  return lg;
}

// The decisions of the GPU's last call, whose row r is at position row_pos[r].
void gpu_decisions(const CudaModel& g, const std::vector<int64_t>& row_pos, Decisions& dec) {
  auto s = g.last_selections(static_cast<int64_t>(row_pos.size()));
  ASSERT_TRUE(s.ok()) << s.error().message;
  for (size_t l = 0; l < s->topk.size(); ++l)
    for (size_t r = 0; r < row_pos.size(); ++r) {
      const int64_t L = static_cast<int64_t>(l);
      if (!s->topk[l].empty())
        dec.topk[{L, row_pos[r]}] = std::vector<int32_t>(s->topk[l].begin() + r * s->index_topk,
                                                         s->topk[l].begin() + (r + 1) * s->index_topk);
      std::vector<int32_t> e(s->experts[l].begin() + r * s->experts_per_token,
                             s->experts[l].begin() + (r + 1) * s->experts_per_token);
      std::sort(e.begin(), e.end());
      dec.experts[{L, row_pos[r]}] = e;
    }
}

Logits gpu_prefill(CudaModel& g, CudaSequence& s, std::span<const int64_t> tokens, LogitRows rows, Decisions* dec) {
  CudaStepOutput out;
  const int64_t pos0 = s.length;
  const Status st = g.prefill(s, tokens, rows, out);
  EXPECT_TRUE(st.ok()) << st.error().message;
  if (!st.ok()) return {};
  if (dec) {
    std::vector<int64_t> pos;
    for (size_t i = 0; i < tokens.size(); ++i) pos.push_back(pos0 + static_cast<int64_t>(i));
    gpu_decisions(g, pos, *dec);
  }
  return gpu_logits(g, out);
}

// ---- comparison ----------------------------------------------------------------------------------

// Counts the decisions that differ (keys both sides have) and returns the first position with one.
int64_t first_flip(const Decisions& a, const Decisions& b, int64_t* flips, int64_t* total) {
  int64_t first = std::numeric_limits<int64_t>::max();
  for (const auto* maps : {&a.topk, &a.experts}) {
    const auto& other = maps == &a.topk ? b.topk : b.experts;
    for (const auto& [key, ids] : *maps) {
      auto it = other.find(key);
      if (it == other.end()) continue;
      ++*total;
      if (it->second != ids) {
        ++*flips;
        first = std::min(first, key.second);
      }
    }
  }
  return first;
}

struct Report {
  int64_t rows = 0, tight_rows = 0, strict_top1 = 0, robust_top1 = 0, bit_equal_rows = 0;
  double min_cos_tight = 1, max_nmse_tight = 0, min_cos_loose = 1;
  int64_t first_mismatch = -1;  // first position out of the tight tolerance
};

// Per-position comparison of `got` with `want` at the positions both have; positions before `flip`
// tightly, others loosely. Prints one MODEL line.
Report compare_logits(const std::string& what, const Logits& got, const Logits& want, int64_t flip, int64_t flips,
                      int64_t decisions) {
  Report r;
  const int64_t V = want.vocab;
  for (int64_t pos : want.positions) {
    const float* w = want.row(pos);
    const float* g = got.row(pos);
    if (!g) continue;
    ++r.rows;
    double dot = 0, gg = 0, ww = 0, e2 = 0;
    int64_t ag = 0, aw = 0;
    bool equal = true;
    for (int64_t i = 0; i < V; ++i) {
      dot += double(g[i]) * w[i];
      gg += double(g[i]) * g[i];
      ww += double(w[i]) * w[i];
      e2 += (double(g[i]) - w[i]) * (double(g[i]) - w[i]);
      if (g[i] > g[ag]) ag = i;
      if (w[i] > w[aw]) aw = i;
      equal = equal && std::memcmp(&g[i], &w[i], 4) == 0;
    }
    const double cos = dot / std::sqrt(std::max(gg * ww, 1e-300)), nmse = e2 / std::max(ww, 1e-300);
    const double rms = std::sqrt(e2 / V);
    r.bit_equal_rows += equal;
    r.strict_top1 += ag == aw;
    r.robust_top1 += w[ag] >= w[aw] - 3 * rms;  // a near-tie of the reference's top two counts as agreement
    if (pos < flip) {
      ++r.tight_rows;
      r.min_cos_tight = std::min(r.min_cos_tight, cos);
      r.max_nmse_tight = std::max(r.max_nmse_tight, nmse);
      if (r.first_mismatch < 0 && !(cos >= 0.999 && nmse <= 2e-3)) r.first_mismatch = pos;
    } else {
      r.min_cos_loose = std::min(r.min_cos_loose, cos);
    }
    if (!std::isfinite(cos)) r.min_cos_loose = -1;
  }
  std::printf(
      "MODEL %-44s rows=%lld tight=%lld min_cos=%.6f max_nmse=%.3e | after first flip: min_cos=%.4f | top1 strict "
      "%.1f%% robust %.1f%% | bit-equal rows %lld | decision flips %lld/%lld, first at pos %s | first mismatch %s\n",
      what.c_str(), static_cast<long long>(r.rows), static_cast<long long>(r.tight_rows), r.min_cos_tight,
      r.max_nmse_tight, r.min_cos_loose, r.rows ? 100.0 * r.strict_top1 / r.rows : 0.0,
      r.rows ? 100.0 * r.robust_top1 / r.rows : 0.0, static_cast<long long>(r.bit_equal_rows),
      static_cast<long long>(flips), static_cast<long long>(decisions),
      flip == std::numeric_limits<int64_t>::max() ? "none" : std::to_string(flip).c_str(),
      r.first_mismatch < 0 ? "none" : std::to_string(r.first_mismatch).c_str());
  return r;
}

void expect_parity(const std::string& what, const Logits& got, const Logits& want, const Decisions& dg,
                   const Decisions& dw) {
  int64_t flips = 0, total = 0;
  const int64_t flip = first_flip(dw, dg, &flips, &total);
  const Report r = compare_logits(what, got, want, flip, flips, total);
  EXPECT_EQ(r.rows, static_cast<int64_t>(want.positions.size())) << what << ": positions missing on one side";
  EXPECT_GT(r.rows, 0) << what;
  EXPECT_LT(r.first_mismatch, 0) << what << ": position " << r.first_mismatch
                                 << " differs beyond rounding before any decision flipped (min cosine "
                                 << r.min_cos_tight << ", max NMSE " << r.max_nmse_tight << ")";
  EXPECT_GE(r.min_cos_loose, 0.5) << what << ": logits after a decision flip are unrelated";
  EXPECT_LE(flips * 10, std::max<int64_t>(total, 1)) << what << ": " << flips << " of " << total << " decisions flipped";
}

// Layer-by-layer comparison of the GPU's tensors with the CPU's over positions [pos0, limit): the first
// tensor that drifts tells where a difference starts. Prints one TRACE line per tensor.
void print_trace(const std::string& what, const Tensors& gpu, const Tensors& cpu, int64_t limit) {
  for (const std::string& name : cpu.order) {
    auto g = gpu.values.find(name);
    if (g == gpu.values.end()) {
      std::printf("TRACE %s %-24s missing on the GPU\n", what.c_str(), name.c_str());
      continue;
    }
    const std::vector<float>& c = cpu.values.at(name);
    const int64_t w = cpu.width.at(name), p0 = cpu.pos0.at(name);
    const int64_t rows = std::min<int64_t>({static_cast<int64_t>(c.size()) / w,
                                            static_cast<int64_t>(g->second.size()) / w, std::max<int64_t>(limit - p0, 0)});
    double dot = 0, gg = 0, cc = 0, e2 = 0, max_abs = 0;
    int64_t equal = 0;
    for (int64_t i = 0; i < rows * w; ++i) {
      const double a = g->second[i], b = c[i];
      dot += a * b;
      gg += a * a;
      cc += b * b;
      e2 += (a - b) * (a - b);
      max_abs = std::max(max_abs, std::fabs(a - b));
      equal += std::memcmp(&g->second[i], &c[i], 4) == 0;
    }
    std::printf("TRACE %s %-24s rows=%lld cos=%.7f nmse=%.3e max_abs=%.3e bit-equal=%.2f%%\n", what.c_str(),
                name.c_str(), static_cast<long long>(rows), dot / std::sqrt(std::max(gg * cc, 1e-300)),
                e2 / std::max(cc, 1e-300), max_abs, rows ? 100.0 * equal / (rows * w) : 0.0);
  }
}

// ---- tests ---------------------------------------------------------------------------------------

class CudaModelParity : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModelParity, ExactPrefillMatchesCpu) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  // 77 rows: the GEMM path, cuBLASLt for the BF16 linears (> 64 rows), windows slide, top-k selects.
  const std::vector<int64_t> ids = prompt(77, 11);
  auto cs = m->cpu->new_sequence({});
  ASSERT_TRUE(cs.ok());
  Decisions dc, dg;
  Tensors tc, tg;
  const Logits want = cpu_call(*m, *cs, ids, LogitRows::All, &dc, &tc);
  auto gs = m->gpu->new_sequence({});
  ASSERT_TRUE(gs.ok()) << gs.error().message;
  m->gpu->set_debug_sink([&](const TensorRecord& r) { tg.add(r); });
  const Logits got = gpu_prefill(*m->gpu, *gs, ids, LogitRows::All, &dg);
  m->gpu->set_debug_sink({});
  expect_parity(GetParam() + " exact prefill 77", got, want, dg, dc);
  int64_t flips = 0, total = 0;
  print_trace(GetParam() + " exact", tg, tc, first_flip(dc, dg, &flips, &total));
}

TEST_P(CudaModelParity, CedPrefillMatchesCpu) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  const std::vector<int64_t> ids = prompt(77, 12);
  for (CedBoundary b : {CedBoundary::ExactSource, CedBoundary::GlobalKvOnly}) {
    SequenceOptions so;
    so.mode = ForwardMode::Ced;
    so.prompt_length = static_cast<int64_t>(ids.size());
    so.ced_boundary = b;
    auto cs = m->cpu->new_sequence(so);
    ASSERT_TRUE(cs.ok()) << cs.error().message;
    Decisions dc, dg;
    const Logits want = cpu_call(*m, *cs, ids, LogitRows::All, &dc);
    auto gs = m->gpu->new_sequence(so);
    ASSERT_TRUE(gs.ok()) << gs.error().message;
    const Logits got = gpu_prefill(*m->gpu, *gs, ids, LogitRows::All, &dg);
    EXPECT_EQ(got.positions, want.positions) << "CED logits exist for rows from the replay start on";
    const std::string what = GetParam() + (b == CedBoundary::ExactSource ? " ced prefill 77" : " ced gkv-only 77");
    expect_parity(what, got, want, dg, dc);
    // Decode after the CED prompt: decoder layers keep the truncated window.
    for (int step = 0; step < 3; ++step) {
      const int64_t tok = 1000 + 17 * step;
      Decisions dc2, dg2;
      const Logits w2 = cpu_call(*m, *cs, std::span<const int64_t>(&tok, 1), LogitRows::All, &dc2);
      CudaSequence* one[] = {&*gs};
      CudaStepOutput out;
      ASSERT_TRUE(m->gpu->decode_step(one, std::span<const int64_t>(&tok, 1), out).ok());
      gpu_decisions(*m->gpu, out.positions, dg2);
      expect_parity(what + " + decode " + std::to_string(step), gpu_logits(*m->gpu, out), w2, dg2, dc2);
    }
  }
}

TEST_P(CudaModelParity, ChunkedPrefillMatchesOneShotAndCpu) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  // Chunks of 5, 3, 1 (GEMV path), 20 and 48 (GEMM path) against one call; logits of every row.
  const std::vector<int64_t> ids = prompt(77, 13);
  auto one = m->gpu->new_sequence({});
  ASSERT_TRUE(one.ok());
  Decisions d_one, d_chunk, d_cpu;
  const Logits whole = gpu_prefill(*m->gpu, *one, ids, LogitRows::All, &d_one);
  auto chunked = m->gpu->new_sequence({});
  ASSERT_TRUE(chunked.ok());
  Logits parts;
  parts.vocab = whole.vocab;
  size_t at = 0;
  for (size_t len : {5, 3, 1, 20, 48}) {
    const Logits p = gpu_prefill(*m->gpu, *chunked, std::span<const int64_t>(ids).subspan(at, len), LogitRows::All,
                                 &d_chunk);
    parts.values.insert(parts.values.end(), p.values.begin(), p.values.end());
    parts.positions.insert(parts.positions.end(), p.positions.begin(), p.positions.end());
    at += len;
  }
  ASSERT_EQ(at, ids.size());
  expect_parity(GetParam() + " gpu chunked vs one-shot", parts, whole, d_chunk, d_one);
  auto cs = m->cpu->new_sequence({});
  ASSERT_TRUE(cs.ok());
  const Logits want = cpu_call(*m, *cs, ids, LogitRows::All, &d_cpu);
  expect_parity(GetParam() + " gpu chunked vs cpu", parts, want, d_chunk, d_cpu);
}

TEST_P(CudaModelParity, GreedyDecodeMatchesCpu) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  const std::vector<int64_t> ids = prompt(30, 14);
  auto cs = m->cpu->new_sequence({});
  auto gs = m->gpu->new_sequence({});
  ASSERT_TRUE(cs.ok() && gs.ok());
  Decisions dc, dg;
  Logits want = cpu_call(*m, *cs, ids, LogitRows::Last, &dc);
  Logits got = gpu_prefill(*m->gpu, *gs, ids, LogitRows::Last, &dg);
  expect_parity(GetParam() + " prefill 30 (last row)", got, want, dg, dc);
  int64_t agree = 0;
  const int steps = 8;
  for (int step = 0; step < steps; ++step) {
    // Both sides continue with the CPU's greedy token (lockstep), the GPU's own argmax is compared.
    const float* w = want.row(want.positions.back());
    const int64_t tok = std::max_element(w, w + want.vocab) - w;
    Decisions dc2, dg2;
    want = cpu_call(*m, *cs, std::span<const int64_t>(&tok, 1), LogitRows::All, &dc2);
    CudaSequence* one[] = {&*gs};
    CudaStepOutput out;
    const Status st = m->gpu->decode_step(one, std::span<const int64_t>(&tok, 1), out);
    ASSERT_TRUE(st.ok()) << st.error().message;
    gpu_decisions(*m->gpu, out.positions, dg2);
    got = gpu_logits(*m->gpu, out);
    const float* g = got.row(out.positions[0]);
    ASSERT_NE(g, nullptr);
    const float* w2 = want.row(out.positions[0]);
    ASSERT_NE(w2, nullptr);
    EXPECT_EQ(out.argmax[0], std::max_element(g, g + got.vocab) - g) << "device argmax vs the downloaded logits";
    agree += out.argmax[0] == std::max_element(w2, w2 + want.vocab) - w2;
    expect_parity(GetParam() + " decode step " + std::to_string(step), got, want, dg2, dc2);
  }
  std::printf("MODEL %s greedy: GPU argmax = CPU argmax in %lld of %d steps\n", GetParam().c_str(),
              static_cast<long long>(agree), steps);
}

TEST_P(CudaModelParity, BatchedDecodeMatchesSingleSequence) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  // Batches of 3 (GEMV path) and 10 (GEMM path): prompts of different lengths, one CED sequence.
  for (int64_t batch : {3, 10}) {
    std::vector<CudaSequence> together, alone;
    for (int64_t i = 0; i < batch; ++i) {
      const std::vector<int64_t> ids = prompt(9 + 7 * i, 20 + i);
      SequenceOptions so;
      if (i == 1) {
        so.mode = ForwardMode::Ced;
        so.prompt_length = static_cast<int64_t>(ids.size());
      }
      for (auto* v : {&together, &alone}) {
        auto s = m->gpu->new_sequence(so);
        ASSERT_TRUE(s.ok()) << s.error().message;
        CudaStepOutput out;
        ASSERT_TRUE(m->gpu->prefill(*s, ids, LogitRows::None, out).ok());
        v->push_back(std::move(*s));
      }
    }
    for (int step = 0; step < 3; ++step) {
      std::vector<int64_t> toks;
      std::vector<CudaSequence*> ptrs;
      for (int64_t i = 0; i < batch; ++i) {
        toks.push_back(500 + 31 * i + step);
        ptrs.push_back(&together[i]);
      }
      CudaStepOutput out;
      ASSERT_TRUE(m->gpu->decode_step(ptrs, toks, out).ok());
      Decisions db, ds;
      gpu_decisions(*m->gpu, out.positions, db);
      const Logits all = gpu_logits(*m->gpu, out);
      for (int64_t i = 0; i < batch; ++i) {
        // Row i of the batch against sequence i decoded alone (positions differ per sequence).
        Logits row_b, row_s;
        row_b.vocab = row_s.vocab = all.vocab;
        row_b.positions = {out.positions[i]};
        row_b.values.assign(all.values.begin() + i * all.vocab, all.values.begin() + (i + 1) * all.vocab);
        Decisions one_b;
        for (const auto& [k, v] : db.topk)
          if (k.second == out.positions[i]) one_b.topk[k] = v;
        for (const auto& [k, v] : db.experts)
          if (k.second == out.positions[i]) one_b.experts[k] = v;
        (void)ds;
        CudaSequence* single[] = {&alone[i]};
        CudaStepOutput o1;
        ASSERT_TRUE(m->gpu->decode_step(single, std::span<const int64_t>(&toks[i], 1), o1).ok());
        Decisions one_s;
        gpu_decisions(*m->gpu, o1.positions, one_s);
        row_s = gpu_logits(*m->gpu, o1);
        // Batch rows see different key ranges per sequence; the decisions of one row could flip but
        // the rows of the batch are independent, so a flip only loosens that row.
        expect_parity(GetParam() + " batch " + std::to_string(batch) + " row " + std::to_string(i) + " step " +
                          std::to_string(step),
                      row_b, row_s, one_b, one_s);
      }
    }
  }
}

TEST_P(CudaModelParity, GraphReplayEqualsDirectRun) {
  CEDAR_REQUIRE_MODEL(m, GetParam());
  const std::vector<int64_t> ids = prompt(21, 15);
  for (int64_t batch : {1, 4}) {
    std::vector<CudaSequence> graph_seqs, direct_seqs;
    for (int64_t i = 0; i < batch; ++i)
      for (auto* v : {&graph_seqs, &direct_seqs}) {
        auto s = m->gpu->new_sequence({});
        ASSERT_TRUE(s.ok());
        CudaStepOutput out;
        ASSERT_TRUE(m->gpu->prefill(*s, std::span<const int64_t>(ids).first(21 - i), LogitRows::None, out).ok());
        v->push_back(std::move(*s));
      }
    const size_t graphs_before = m->gpu->decode_graph_count();
    for (int step = 0; step < 4; ++step) {  // step 0 runs directly (warm-up), then capture, then replays
      std::vector<int64_t> toks;
      std::vector<CudaSequence*> pg, pd;
      for (int64_t i = 0; i < batch; ++i) {
        toks.push_back(700 + 3 * i + step);
        pg.push_back(&graph_seqs[i]);
        pd.push_back(&direct_seqs[i]);
      }
      CudaStepOutput og, od;
      m->gpu->use_cuda_graphs(true);
      ASSERT_TRUE(m->gpu->decode_step(pg, toks, og).ok());
      const Logits lg = gpu_logits(*m->gpu, og);
      m->gpu->use_cuda_graphs(false);
      ASSERT_TRUE(m->gpu->decode_step(pd, toks, od).ok());
      m->gpu->use_cuda_graphs(true);
      const Logits ld = gpu_logits(*m->gpu, od);
      size_t diff = 0;
      for (size_t i = 0; i < lg.values.size(); ++i) diff += std::memcmp(&lg.values[i], &ld.values[i], 4) != 0;
      std::printf("MODEL %s graph vs direct batch %lld step %d: %zu of %zu logits differ\n", GetParam().c_str(),
                  static_cast<long long>(batch), step, diff, lg.values.size());
      EXPECT_EQ(diff, 0u) << "graph replay must equal the direct run bit for bit (batch " << batch << ", step " << step
                          << ")";
      EXPECT_EQ(og.argmax, od.argmax);
    }
    EXPECT_GT(m->gpu->decode_graph_count(), graphs_before) << "no decode graph was captured";
  }
}

INSTANTIATE_TEST_SUITE_P(Profiles, CudaModelParity, ::testing::Values(std::string("tiny"), std::string("small")),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(CudaModelErrors, BadInputsLeaveSequencesUsable) {
  CEDAR_REQUIRE_MODEL(m, "tiny");
  auto s = m->gpu->new_sequence({});
  ASSERT_TRUE(s.ok());
  CudaStepOutput out;
  CudaSequence* one[] = {&*s};
  const int64_t bad = -1;
  const Status st = m->gpu->decode_step(one, std::span<const int64_t>(&bad, 1), out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("vocabulary"), std::string::npos) << st.error().message;
  const std::vector<int64_t> big(129, 5);
  EXPECT_FALSE(m->gpu->prefill(*s, big, LogitRows::Last, out).ok()) << "chunk above max_chunk";
  EXPECT_FALSE(s->failed);
  EXPECT_EQ(s->length, 0);
  const std::vector<int64_t> ok_ids = prompt(4, 3);
  ASSERT_TRUE(m->gpu->prefill(*s, ok_ids, LogitRows::Last, out).ok());
  EXPECT_EQ(s->length, 4);
  EXPECT_EQ(out.rows, 1);
  ASSERT_EQ(out.argmax.size(), 1u);
}

}  // namespace
}  // namespace cedar::cuda
