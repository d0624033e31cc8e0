// The whole-model CUDA tests' shared part (cuda_model_cutest.cpp: parity with the CPU model and its
// tolerances, explained at the top of that file; cuda_model_paths_cutest.cpp: the kernel-path switches): one
// CPU and one GPU model per make-tiny profile, loaded once per process, and the runs and comparisons both use.
#pragma once

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
#include "test_support/tiny_model.h"

namespace cedar::cuda::model_testing {

namespace fs = std::filesystem;

// A fixed pseudo-random prompt of real token ids (< 128000: no special tokens).
inline std::vector<int64_t> prompt(int64_t n, uint64_t seed) { return test_support::xorshift_prompt(n, seed, 12345); }

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
  CudaModelOptions options;                  // gpu's load options
  std::unique_ptr<CudaModel> gpu_bf16_wo_a;  // loaded on first use: wo_a_fp8 = false, item tables up to 128 rows
  std::string error;
  ~Model() {
    gpu_bf16_wo_a.reset();
    gpu.reset();
    cpu.reset();
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

inline Model* model_for(const std::string& profile) {
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
  lo.engram_map = testing::engram_map_path();
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
  // The packed experts as well (not a default): routed_tiles=0 then takes the balanced packed kernel, which the
  // LaunchOnly switches compare with the tiles bit for bit. variant_for loads the default copies.
  go.packed_experts = true;
  go.engram_map = lo.engram_map;
  go.pool = m->pool.get();
  m->options = go;
  auto gpu = CudaModel::load(m->dir, go);
  if (!gpu.ok()) {
    m->error = "CUDA load: " + gpu.error().message;
    return m.get();
  }
  m->gpu = std::move(*gpu);
  std::printf("[ model    ] %s: %s, cuBLASLt %s, wo_a on the device as %s, options %s\n", profile.c_str(),
              m->dir.c_str(),
              m->gpu->has_cublas() ? "loaded (BF16 prefill GEMMs)" : "missing (gemv_bf16 for every BF16 linear)",
              m->gpu->wo_a_fp8() ? "FP8" : "BF16", describe_cuda_options(go).c_str());
  return m.get();
}

// The second GPU model of a profile: wo_a uploaded as BF16 values (the loop before wo_a_fp8), the routed
// experts' item tables and the shared expert's GEMV scratch sized for 128 rows, and the default expert copies
// (plain + tiles, no packed copy).
// Null (with the reason in `error`) if it fails to load.
inline CudaModel* variant_for(Model& m, std::string* error) {
  if (m.gpu_bf16_wo_a) return m.gpu_bf16_wo_a.get();
  CudaModelOptions o = m.options;
  o.wo_a_fp8 = false;
  o.paths.moe_items_max_rows = 128;
  o.paths.gemv_max_rows = 128;
  o.packed_experts = CudaModelOptions().packed_experts;
  auto g = CudaModel::load(m.dir, o);
  if (!g.ok()) {
    *error = "CUDA load (wo_a_fp8=0, moe_items_max_rows=128, gemv_max_rows=128): " + g.error().message;
    return nullptr;
  }
  m.gpu_bf16_wo_a = std::move(*g);
  return m.gpu_bf16_wo_a.get();
}

// Restores a model's kernel paths at scope exit (the tests share one loaded model per profile).
struct PathsGuard {
  CudaModel& g;
  CudaKernelPaths saved;
  explicit PathsGuard(CudaModel& m) : g(m), saved(m.options().paths) {}
  ~PathsGuard() { g.set_paths(saved); }
};

#define CEDAR_REQUIRE_MODEL(var, profile) \
  CEDAR_REQUIRE_GPU();                    \
  Model* var = model_for(profile);        \
  ASSERT_TRUE(var->error.empty()) << var->error;

// ---- CPU side ----------------------------------------------------------------------------------

inline int64_t layer_of(std::string_view name, std::string_view suffix) {
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

inline bool traced(std::string_view name) {
  for (const char* s : {".attn_in", ".attn_out", ".ffn_in", ".ffn_out", ".engram_out"})
    if (name.size() > std::strlen(s) && name.substr(name.size() - std::strlen(s)) == s) return true;
  return false;
}

// One CPU forward call: logits and the decisions of its rows.
inline Logits cpu_call(Model& m, SequenceState& st, std::span<const int64_t> tokens, LogitRows rows, Decisions* dec,
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
        for (int64_t k = 0; k < routing->topk; ++k)
          e.push_back(static_cast<int32_t>(routing->experts[i * routing->topk + k]));
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

// One decode step's inputs for seqs[0, n): sequence i takes token base + mult·i + step.
struct StepInputs {
  std::vector<int64_t> toks;
  std::vector<CudaSequence*> ptrs;
};
inline StepInputs step_inputs(std::vector<CudaSequence>& seqs, int64_t n, int64_t base, int64_t mult, int step) {
  StepInputs in;
  for (int64_t i = 0; i < n; ++i) {
    in.toks.push_back(base + mult * i + step);
    in.ptrs.push_back(&seqs[static_cast<size_t>(i)]);
  }
  return in;
}

inline Logits gpu_logits(const CudaModel& g, const CudaStepOutput& out) {
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
inline void gpu_decisions(const CudaModel& g, const std::vector<int64_t>& row_pos, Decisions& dec) {
  auto s = g.last_selections(static_cast<int64_t>(row_pos.size()));
  ASSERT_TRUE(s.ok()) << s.error().message;
  for (size_t l = 0; l < s->topk.size(); ++l)
    for (size_t r = 0; r < row_pos.size(); ++r) {
      const int64_t L = static_cast<int64_t>(l);
      if (!s->topk[l].empty())
        dec.topk[{L, row_pos[r]}] =
            std::vector<int32_t>(s->topk[l].begin() + r * s->index_topk, s->topk[l].begin() + (r + 1) * s->index_topk);
      std::vector<int32_t> e(s->experts[l].begin() + r * s->experts_per_token,
                             s->experts[l].begin() + (r + 1) * s->experts_per_token);
      std::sort(e.begin(), e.end());
      dec.experts[{L, row_pos[r]}] = e;
    }
}

inline Logits gpu_prefill(CudaModel& g, CudaSequence& s, std::span<const int64_t> tokens, LogitRows rows, Decisions* dec) {
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
// `valid` (optional): only decisions it also has count (the CPU's: a GPU buffer holds stale values for
// the layers a CED pre-tail row does not run).
inline int64_t first_flip(const Decisions& a, const Decisions& b, int64_t* flips, int64_t* total,
                   const Decisions* valid = nullptr) {
  int64_t first = std::numeric_limits<int64_t>::max();
  for (const auto* maps : {&a.topk, &a.experts}) {
    const auto& other = maps == &a.topk ? b.topk : b.experts;
    const auto* ok = valid ? (maps == &a.topk ? &valid->topk : &valid->experts) : nullptr;
    for (const auto& [key, ids] : *maps) {
      auto it = other.find(key);
      if (it == other.end() || (ok && !ok->count(key))) continue;
      ++*total;
      if (it->second != ids) {
        ++*flips;
        first = std::min(first, key.second);
      }
    }
  }
  return first;
}

// Per-position comparison of two runs of one prompt: positions before the first decision flip (all
// earlier calls of the sequence included: a flipped decision changes every later position through the
// caches) are the "tight" rows.
struct Stats {
  int64_t rows = 0, tight_rows = 0, strict_top1 = 0, robust_top1 = 0, bit_equal_rows = 0;
  double min_cos_tight = 1, max_nmse_tight = 0, mean_cos = 0, mean_nmse = 0;
  int64_t flips = 0, decisions = 0;
  int64_t first_flip = std::numeric_limits<int64_t>::max();
  double flip_fraction() const { return decisions ? static_cast<double>(flips) / static_cast<double>(decisions) : 0; }
};

// One sequence's run: every logit row it produced and every decision it made, over all its calls.
struct Track {
  Logits logits;
  Decisions dec;
  void add(const Logits& l) {
    logits.vocab = l.vocab;
    logits.values.insert(logits.values.end(), l.values.begin(), l.values.end());
    logits.positions.insert(logits.positions.end(), l.positions.begin(), l.positions.end());
  }
};

inline Stats compare(const std::string& what, const Track& got, const Track& want, const Decisions* valid = nullptr) {
  Stats r;
  r.first_flip = first_flip(want.dec, got.dec, &r.flips, &r.decisions, valid);
  const int64_t V = want.logits.vocab;
  for (int64_t pos : want.logits.positions) {
    const float* w = want.logits.row(pos);
    const float* g = got.logits.row(pos);
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
    r.mean_cos += std::isfinite(cos) ? cos : -10;
    r.mean_nmse += nmse;
    if (pos < r.first_flip) {
      ++r.tight_rows;
      r.min_cos_tight = std::min(r.min_cos_tight, cos);
      r.max_nmse_tight = std::max(r.max_nmse_tight, nmse);
    }
  }
  if (r.rows) {
    r.mean_cos /= static_cast<double>(r.rows);
    r.mean_nmse /= static_cast<double>(r.rows);
  }
  std::printf(
      "MODEL %-40s rows=%lld | before the first flip: %lld rows, min cos %.6f, max NMSE %.3e | all rows: mean cos "
      "%.5f, mean NMSE %.3e, top-1 strict %.1f%% robust %.1f%%, bit-equal rows %lld | decision flips %lld/%lld "
      "(%.1f%%), first at position %s\n",
      what.c_str(), static_cast<long long>(r.rows), static_cast<long long>(r.tight_rows), r.min_cos_tight,
      r.max_nmse_tight, r.mean_cos, r.mean_nmse, r.rows ? 100.0 * r.strict_top1 / r.rows : 0.0,
      r.rows ? 100.0 * r.robust_top1 / r.rows : 0.0, static_cast<long long>(r.bit_equal_rows),
      static_cast<long long>(r.flips), static_cast<long long>(r.decisions), 100 * r.flip_fraction(),
      r.first_flip == std::numeric_limits<int64_t>::max() ? "none" : std::to_string(r.first_flip).c_str());
  return r;
}

// The GPU against the CPU (tolerances: file comment). `paths` is GPU vs GPU over two kernel paths (GEMV
// vs GEMM summation orders) of the same prompt: a measurement of how far pure rounding differences carry
// in this model, which bounds how many decisions the GPU may flip against the CPU.
// The GPU paths can agree bit for bit (small: chunked == one-shot over all 35 ced rows, legacy == default
// paths), and then measure no sensitivity at all; the ceiling keeps the bound at what rounding alone has
// produced on the small profile in every device run since phase 2 (31-32% exact, 20-21% ced), with margin.
inline constexpr double kFlipCeiling = 0.4;

inline void expect_close(const std::string& what, const Stats& s, const Stats* paths = nullptr) {
  EXPECT_GT(s.rows, 0) << what << ": no common logit rows";
  EXPECT_TRUE(s.tight_rows == 0 || (s.min_cos_tight >= 0.99 && s.max_nmse_tight <= 2e-2))
      << what << ": before any decision flipped the logits differ beyond rounding (min cosine " << s.min_cos_tight
      << ", max NMSE " << s.max_nmse_tight << ")";
  EXPECT_GE(s.robust_top1, (9 * s.rows + 9) / 10)
      << what << ": top-1 agrees (tie-robust) on " << s.robust_top1 << " of " << s.rows << " rows";
  EXPECT_GE(s.mean_cos, 0.9) << what << ": mean logit cosine";
  if (paths) {
    EXPECT_LE(s.flip_fraction(), std::max(3 * paths->flip_fraction() + 0.1, kFlipCeiling))
        << what << ": " << s.flips << " of " << s.decisions << " decisions flipped vs the CPU, while two GPU kernel "
        << "paths flip " << paths->flips << " of " << paths->decisions << " against each other";
  }
}

// Layer-by-layer comparison of the GPU's tensors with the CPU's over positions [pos0, limit): the first
// tensor that drifts tells where a difference starts. Prints one TRACE line per tensor; returns
// (name, NMSE, bit-equal fraction) per tensor.
struct TraceLine {
  std::string name;
  double nmse = 0, equal = 0;
};
inline std::vector<TraceLine> print_trace(const std::string& what, const Tensors& gpu, const Tensors& cpu, int64_t limit) {
  std::vector<TraceLine> out;
  for (const std::string& name : cpu.order) {
    auto g = gpu.values.find(name);
    if (g == gpu.values.end()) {
      std::printf("TRACE %s %-24s missing on the GPU\n", what.c_str(), name.c_str());
      out.push_back({name, 1e30, 0});
      continue;
    }
    const std::vector<float>& c = cpu.values.at(name);
    const int64_t w = cpu.width.at(name), p0 = cpu.pos0.at(name);
    const int64_t rows =
        std::min<int64_t>({static_cast<int64_t>(c.size()) / w, static_cast<int64_t>(g->second.size()) / w,
                           std::max<int64_t>(limit - p0, 0)});
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
    const double nmse = e2 / std::max(cc, 1e-300), eq = rows ? static_cast<double>(equal) / (rows * w) : 1.0;
    std::printf("TRACE %s %-24s rows=%lld cos=%.7f nmse=%.3e max_abs=%.3e bit-equal=%.2f%%\n", what.c_str(),
                name.c_str(), static_cast<long long>(rows), dot / std::sqrt(std::max(gg * cc, 1e-300)), nmse, max_abs,
                100 * eq);
    out.push_back({name, nmse, eq});
  }
  return out;
}

// One prompt three ways: the CPU (one call), GPU A (one call: the GEMM path above 8 rows) and GPU B (chunks
// of <= 8 rows: the GEMV path), then `steps` decode steps on all three with the CPU's greedy token.
struct Scenario {
  Track cpu, a, b;
  Tensors trace_cpu, trace_a;
  int64_t argmax_agree = 0, steps = 0;
};

inline Scenario run_scenario(Model& m, const std::vector<int64_t>& ids, const SequenceOptions& so, int steps, bool trace,
                      CudaModel* gpu = nullptr) {
  Scenario sc;
  CudaModel& G = gpu ? *gpu : *m.gpu;
  auto cs = m.cpu->new_sequence(so);
  EXPECT_TRUE(cs.ok()) << cs.error().message;
  auto ga = G.new_sequence(so);
  auto gb = G.new_sequence(so);
  EXPECT_TRUE(ga.ok() && gb.ok());
  if (!cs.ok() || !ga.ok() || !gb.ok()) return sc;
  sc.cpu.add(cpu_call(m, *cs, ids, LogitRows::All, &sc.cpu.dec, trace ? &sc.trace_cpu : nullptr));
  if (trace) G.set_debug_sink([&](const TensorRecord& r) { sc.trace_a.add(r); });
  sc.a.add(gpu_prefill(G, *ga, ids, LogitRows::All, &sc.a.dec));
  G.set_debug_sink({});
  for (size_t at = 0, i = 0; at < ids.size(); ++i) {  // 5, 3, 1, then 8s: the GEMV path, crossing every boundary
    const size_t len = std::min<size_t>(ids.size() - at, i == 0 ? 5 : i == 1 ? 3 : i == 2 ? 1 : 8);
    sc.b.add(gpu_prefill(G, *gb, std::span<const int64_t>(ids).subspan(at, len), LogitRows::All, &sc.b.dec));
    at += len;
  }
  for (int step = 0; step < steps; ++step) {
    const Logits& last = sc.cpu.logits;
    const float* w = last.values.data() + (last.positions.size() - 1) * last.vocab;
    const int64_t tok = std::max_element(w, w + last.vocab) - w;
    const Logits want = cpu_call(m, *cs, std::span<const int64_t>(&tok, 1), LogitRows::All, &sc.cpu.dec);
    sc.cpu.add(want);
    for (auto [seq, track] : {std::pair{&*ga, &sc.a}, std::pair{&*gb, &sc.b}}) {
      CudaSequence* one[] = {seq};
      CudaStepOutput out;
      const Status st = G.decode_step(one, std::span<const int64_t>(&tok, 1), out);
      EXPECT_TRUE(st.ok()) << st.error().message;
      if (!st.ok()) return sc;
      gpu_decisions(G, out.positions, track->dec);
      const Logits got = gpu_logits(G, out);
      track->add(got);
      if (track == &sc.a && !want.values.empty()) {
        const float* g = got.values.data();
        EXPECT_EQ(out.argmax[0], std::max_element(g, g + got.vocab) - g) << "device argmax vs the downloaded logits";
        sc.argmax_agree +=
            out.argmax[0] == std::max_element(want.values.data(), want.values.data() + want.vocab) - want.values.data();
      }
    }
    ++sc.steps;
  }
  return sc;
}

inline void check_scenario(const std::string& what, const Scenario& sc) {
  const Stats paths = compare(what + " gpu chunked vs one-shot", sc.b, sc.a, &sc.cpu.dec);
  const Stats a = compare(what + " gpu one-shot vs cpu", sc.a, sc.cpu);
  const Stats b = compare(what + " gpu chunked vs cpu", sc.b, sc.cpu);
  expect_close(what + " gpu one-shot vs cpu", a, &paths);
  expect_close(what + " gpu chunked vs cpu", b, &paths);
  // The two GPU paths are the same arithmetic up to summation order: the same bounds apply between them.
  expect_close(what + " gpu chunked vs one-shot", paths);
  if (sc.steps > 0)
    std::printf("MODEL %s greedy decode: GPU argmax = CPU argmax in %lld of %lld steps\n", what.c_str(),
                static_cast<long long>(sc.argmax_agree), static_cast<long long>(sc.steps));
}

// ---- kernel-path switches (CudaKernelPaths, wo_a_fp8) --------------------------------------------

// Every logit of one fixed GPU workload, for bitwise comparisons of two configurations: a prefill in one
// call (77 rows: the GEMM path; cuBLASLt for the BF16 linears and wo_a above 64 rows), the same prompt in
// chunks of 5, 3, 1, 8, ... (the GEMV path) as a second sequence, then 3 decode steps of both together
// (batch 2) and 2 of the first alone (batch 1): graphs capture on the second step of a shape, replay after.
inline std::vector<float> gpu_workload(CudaModel& g, const std::vector<int64_t>& ids) {
  std::vector<float> all;
  auto append = [&](const Logits& l) { all.insert(all.end(), l.values.begin(), l.values.end()); };
  auto a = g.new_sequence({});
  auto b = g.new_sequence({});
  EXPECT_TRUE(a.ok() && b.ok());
  if (!a.ok() || !b.ok()) return all;
  append(gpu_prefill(g, *a, ids, LogitRows::All, nullptr));
  for (size_t at = 0, i = 0; at < ids.size(); ++i) {
    const size_t len = std::min<size_t>(ids.size() - at, i == 0 ? 5 : i == 1 ? 3 : i == 2 ? 1 : 8);
    append(gpu_prefill(g, *b, std::span<const int64_t>(ids).subspan(at, len), LogitRows::All, nullptr));
    at += len;
  }
  for (int step = 0; step < 5; ++step) {
    std::vector<CudaSequence*> seqs = {&*a, &*b};
    std::vector<int64_t> toks = {int64_t{800} + step, int64_t{1800} + step};
    if (step >= 3) {
      seqs.pop_back();
      toks.pop_back();
    }
    CudaStepOutput out;
    const Status st = g.decode_step(seqs, toks, out);
    EXPECT_TRUE(st.ok()) << "decode step " << step << ": " << st.error().message;
    if (!st.ok()) return all;
    append(gpu_logits(g, out));
  }
  return all;
}

// Bit-for-bit equality of two workloads' logits; the message names the first difference.
inline void expect_bitwise(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                    int64_t vocab) {
  ASSERT_EQ(got.size(), want.size()) << what << ": the two runs produced different numbers of logits";
  ASSERT_FALSE(want.empty()) << what << ": no logits";
  size_t diff = 0, first = 0;
  double max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0) {
      if (diff++ == 0) first = i;
      max_abs = std::max(max_abs, std::fabs(double(got[i]) - want[i]));
    }
  std::printf("MODEL %-60s %zu of %zu logits differ", what.c_str(), diff, want.size());
  if (diff)
    std::printf(" (first: logit row %zu, token %zu: %.9g vs %.9g; max |diff| %.3e)", first / vocab, first % vocab,
                got[first], want[first], max_abs);
  std::printf("\n");
  EXPECT_EQ(diff, 0u) << what << ": must be bit-identical (the switch changes launches, not arithmetic); first "
                      << "difference at logit row " << (diff ? first / vocab : 0) << " (rows: 77 one-call prefill, 77 "
                      << "chunked, then decode batch 2 ×3, batch 1 ×2)";
}

inline CudaKernelPaths with(CudaKernelPaths p, const std::string& spec) {
  CudaModelOptions o;
  o.paths = p;
  const Status st = apply_cuda_options(spec, o);
  EXPECT_TRUE(st.ok()) << st.error().message;
  return o.paths;
}

}  // namespace cedar::cuda::model_testing
