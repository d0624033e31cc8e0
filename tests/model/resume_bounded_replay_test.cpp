// Exact SWA bounded replay (docs/prefix_cache.md "Exact bounded replay"): a resume without a ring
// snapshot from R <= t − exact_replay_rows (t = P in exact mode, min(P, N − tail) in ced mode) must be
// bitwise equal to the uncached run of the same mode, on make-tiny checkpoints of several seeds
// (sliding window 8, ratio-2 encoder sources at layers 2 and 4, the ratio-1 boundary source and
// candidate source at 6, a Reindex layer restricted to its candidate pool, Engram at layers 1 and 4).
//
// Independent of cedar's own numbers: the reference is the uncached run; the reach argument is checked
// at every layer and row (layer l's output may differ from the reference only at rows
// < R + (l + 1)·(W − 1), whatever R), and the bound's tightness is measured one row short of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/config.h"
#include "model/deepseek_v41.h"
#include "model/tiny_checkpoint.h"
#include "test_support/tiny_model.h"

#if defined(__SANITIZE_ADDRESS__)
#define CEDAR_BOUNDED_REPLAY_SHORT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CEDAR_BOUNDED_REPLAY_SHORT 1
#endif
#endif

namespace cedar {
namespace {

#ifdef CEDAR_BOUNDED_REPLAY_SHORT
constexpr uint64_t kSeeds[] = {0};  // ASan: one seed (every mode and case still runs)
#else
constexpr uint64_t kSeeds[] = {0, 1, 2};
#endif
constexpr int64_t kWindow = 8;  // the tiny profile's sliding_window
constexpr int64_t kTail = kWindow;
constexpr int64_t kDecode = 3;

std::vector<int64_t> tokens(int64_t n, uint64_t seed) { return test_support::xorshift_prompt(n, seed, 4242); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// What a run computed, by absolute position: final hidden states, logits, and every layer's output
// streams ("layers.L.out", only where the layer ran its FFN).
struct Trace {
  std::map<int64_t, std::vector<float>> hidden, logits;
  std::map<int64_t, std::map<int64_t, std::vector<float>>> out;  // layer → position → streams
};

// The released V4.1-Flash configs (tests/data/configs): 40 backbone layers, window 128, KV sources at
// layers 2, 8, 14, 20 (the last one is the CED boundary; the encoder is layers [0, 20)).
TEST(ExactReplayRows, FormulaOnTheReleasedAndTinyConfigs) {
  for (const char* name : {"deepseek_v41_flash", "deepseek_v41_flash_inference"}) {
    auto config = load_model_config(std::string(CEDAR_TEST_DATA_DIR) + "/configs/" + name);
    ASSERT_TRUE(config.ok()) << config.error().message;
    auto plan = build_layer_plan(*config);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    ASSERT_EQ(plan->num_layers(), 40) << name;
    ASSERT_EQ(plan->last_kv_source, 20) << name;
    ASSERT_EQ(plan->encoder_layers, 20) << name;
    ASSERT_EQ(config->sliding_window, 128) << name;
    EXPECT_EQ(exact_replay_rows(*plan, 128, ForwardMode::Exact, CedBoundary::ExactSource), 40 * 127) << name;
    EXPECT_EQ(exact_replay_rows(*plan, 128, ForwardMode::Ced, CedBoundary::ExactSource), 21 * 127) << name;
    EXPECT_EQ(exact_replay_rows(*plan, 128, ForwardMode::Ced, CedBoundary::GlobalKvOnly), 20 * 127) << name;
    std::printf("[bounded replay] %s: exact mode %lld rows, ced %lld rows (GlobalKvOnly boundary %lld)\n", name,
                static_cast<long long>(exact_replay_rows(*plan, 128, ForwardMode::Exact, CedBoundary::ExactSource)),
                static_cast<long long>(exact_replay_rows(*plan, 128, ForwardMode::Ced, CedBoundary::ExactSource)),
                static_cast<long long>(exact_replay_rows(*plan, 128, ForwardMode::Ced, CedBoundary::GlobalKvOnly)));
  }
  // A window of one key has no history to truncate.
  auto config = load_model_config(std::string(CEDAR_TEST_DATA_DIR) + "/configs/deepseek_v41_flash");
  ASSERT_TRUE(config.ok());
  auto plan = build_layer_plan(*config);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(exact_replay_rows(*plan, 1, ForwardMode::Exact, CedBoundary::ExactSource), 0);
}

class BoundedReplayTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new test_support::ScratchDir("cedar-bounded-replay-test");
    for (uint64_t seed : kSeeds) {
      TinyCheckpointOptions o = test_support::tensors_only();
      o.seed = seed;
      auto m = test_support::write_and_load<DeepseekV41Model>(o, scratch_->path() / ("seed" + std::to_string(seed)));
      ASSERT_TRUE(m.ok()) << m.error().message;
      models_.push_back(new DeepseekV41Model(std::move(*m)));
    }
  }
  static void TearDownTestSuite() {
    for (auto* m : models_) delete m;
    models_.clear();
    delete scratch_;
    scratch_ = nullptr;
  }

  struct Case {
    ForwardMode mode = ForwardMode::Exact;
    CedBoundary boundary = CedBoundary::ExactSource;
    int64_t tpb = 16, P = 0, N = 0;
    int64_t tail = kTail;  // ced
    int64_t replay_start() const { return mode == ForwardMode::Ced ? std::max<int64_t>(0, N - tail) : 0; }
    int64_t t() const { return mode == ForwardMode::Ced ? std::min(P, replay_start()) : P; }
    // The rows a continuation from P computes as the uncached run does (ced: the tail from its start).
    int64_t first_row() const { return mode == ForwardMode::Ced ? std::min(P, replay_start()) : P; }
    std::string name(uint64_t seed) const {
      char buf[160];
      std::snprintf(buf, sizeof buf, "seed %llu, %s%s, tpb %lld, P %lld, N %lld", static_cast<unsigned long long>(seed),
                    std::string(forward_mode_name(mode)).c_str(),
                    mode == ForwardMode::Exact             ? ""
                    : boundary == CedBoundary::ExactSource ? " (ExactSource)"
                                                           : " (GlobalKvOnly)",
                    static_cast<long long>(tpb), static_cast<long long>(P), static_cast<long long>(N));
      return buf;
    }
  };

  static SequenceOptions options(const Case& c, std::shared_ptr<BlockPool> pool) {
    SequenceOptions so;
    so.mode = c.mode;
    so.prompt_length = c.mode == ForwardMode::Ced ? c.N : 0;
    so.ced_boundary = c.boundary;
    so.ced_tail = c.mode == ForwardMode::Ced ? c.tail : 0;
    so.kv.tokens_per_block = c.tpb;
    so.kv.pool = std::move(pool);
    so.swa_history = 2 * kWindow;  // rings hold positions back to before P at the end
    return so;
  }

  // Feeds ids[length, N) in chunks of `chunk` (0: one call), then kDecode tokens one by one; every
  // computed row's records (the logits are a function of the final hidden state: the last row's of
  // every call are kept).
  static void run(const DeepseekV41Model& m, SequenceState& st, const std::vector<int64_t>& ids, int64_t N,
                  int64_t chunk, Trace& trace) {
    ForwardOptions fo;
    fo.logits = LogitRows::Last;
    fo.sink = [&trace](const TensorRecord& r) {
      std::map<int64_t, std::vector<float>>* dst = nullptr;
      if (r.name == "final_norm") {
        dst = &trace.hidden;
      } else if (r.name.starts_with("layers.") && r.name.ends_with(".out")) {
        dst = &trace.out[std::stoll(std::string(r.name.substr(7)))];
      }
      if (dst == nullptr) return;
      for (int64_t i = 0; i < r.rows; ++i)
        (*dst)[r.pos0 + i].assign(r.data.begin() + i * r.width, r.data.begin() + (i + 1) * r.width);
    };
    const int64_t end = N + kDecode;
    while (st.length() < end) {
      const int64_t p = st.length();
      const int64_t len = p >= N ? 1 : chunk > 0 ? std::min(chunk, N - p) : N - p;
      auto out =
          m.forward(std::span<const int64_t>(ids).subspan(static_cast<size_t>(p), static_cast<size_t>(len)), st, fo);
      ASSERT_TRUE(out.ok()) << out.error().message;
      for (size_t i = 0; i < out->positions.size(); ++i)
        trace.logits[out->positions[i]].assign(out->logits.begin() + static_cast<int64_t>(i) * out->vocab,
                                               out->logits.begin() + static_cast<int64_t>(i + 1) * out->vocab);
    }
  }

  // The uncached run and the cached prefix [0, P) of a sequence of the same options.
  struct Fixture {
    std::vector<int64_t> ids;
    std::shared_ptr<BlockPool> pool;
    Trace ref;
    std::optional<SequenceState> ref_state, source;
  };
  static void prepare(const DeepseekV41Model& m, const Case& c, uint64_t seed, Fixture& f) {
    f.ids = tokens(c.N + kDecode, seed * 131 + static_cast<uint64_t>(c.P * 7 + c.N));
    auto pool = BlockPool::create({});
    ASSERT_TRUE(pool.ok());
    f.pool = *pool;
    const SequenceOptions so = options(c, f.pool);
    auto ref = m.new_sequence(so);
    ASSERT_TRUE(ref.ok()) << ref.error().message;
    run(m, *ref, f.ids, c.N, 0, f.ref);
    f.ref_state.emplace(std::move(*ref));
    auto src = m.new_sequence(so);
    ASSERT_TRUE(src.ok());
    ForwardOptions fo;
    fo.logits = LogitRows::None;
    ASSERT_TRUE(m.forward(std::span<const int64_t>(f.ids).first(static_cast<size_t>(c.P)), *src, fo).ok());
    f.source.emplace(std::move(*src));
  }

  static Result<SequenceState> resume(const DeepseekV41Model& m, const Case& c, Fixture& f, int64_t R) {
    CEDAR_ASSIGN_OR_RETURN(auto blocks, m.prefix_blocks(*f.source, c.P));
    ResumeSpec spec;
    spec.cached_tokens = c.P;
    spec.blocks = std::move(blocks);
    spec.restart = R;
    spec.history = std::span<const int64_t>(f.ids).first(static_cast<size_t>(R));
    return m.resume_sequence(options(c, f.pool), spec);
  }

  // Per layer, the last row whose output differs from the reference (-1: none).
  static std::map<int64_t, int64_t> last_differing_rows(const Trace& ref, const Trace& got) {
    std::map<int64_t, int64_t> last;
    for (const auto& [layer, rows] : got.out) {
      int64_t& l = last.emplace(layer, -1).first->second;
      for (const auto& [pos, v] : rows) {
        auto it = ref.out.find(layer);
        EXPECT_TRUE(it != ref.out.end() && it->second.count(pos)) << "layer " << layer << " row " << pos;
        if (it == ref.out.end() || !it->second.count(pos)) continue;
        if (!same_bits(it->second.at(pos), v)) l = std::max(l, pos);
      }
    }
    return last;
  }

  // Rows >= from of `got` (hidden states, logits) equal the reference's; every one was computed.
  static void expect_rows_equal(const Trace& ref, const Trace& got, int64_t from, const std::string& what) {
    for (const auto* maps : {&ref.hidden, &ref.logits}) {
      const auto& mine = maps == &ref.hidden ? got.hidden : got.logits;
      for (const auto& [pos, v] : *maps) {
        if (pos < from) continue;
        auto it = mine.find(pos);
        ASSERT_TRUE(it != mine.end()) << what << ": row " << pos << " not computed";
        ASSERT_TRUE(same_bits(v, it->second)) << what << ": " << (maps == &ref.hidden ? "final hidden state" : "logits")
                                              << " of row " << pos << " differ";
      }
    }
  }

  // Global KV (every entry of every stream) and the rings of layers [0, exact_layers) at the end, where
  // the resumed state says they are exact (held_from on), equal the reference's.
  static void expect_state_equal(const DeepseekV41Model& m, const SequenceState& ref, const SequenceState& got,
                                 const std::string& what) {
    auto a = ref.attention().global_kv_entries(m.plan());
    auto b = got.attention().global_kv_entries(m.plan());
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->size(), b->size());
    for (size_t s = 0; s < a->size(); ++s) {
      ASSERT_EQ((*a)[s]->size(), (*b)[s]->size()) << what << ": stream " << s;
      for (int64_t j = 0; j < (*a)[s]->size(); ++j)
        ASSERT_TRUE(same_bits((*a)[s]->decoded(j), (*b)[s]->decoded(j))) << what << ": stream " << s << " entry " << j;
    }
    auto snap = m.snapshot_swa(got);
    ASSERT_TRUE(snap.ok());
    ASSERT_EQ(snap->exact_layers, ref.exact_swa_layers()) << what;
    for (int64_t l = 0; l < snap->exact_layers; ++l)
      for (int64_t pos = snap->held_from; pos < got.length(); ++pos) {
        const std::vector<float> want = ref.attention().rings[static_cast<size_t>(l)].decoded(pos);
        ASSERT_FALSE(want.empty()) << what << ": the reference ring of layer " << l << " lacks " << pos;
        ASSERT_TRUE(same_bits(want, snap->rings[static_cast<size_t>(l)].decoded(pos)))
            << what << ": ring of layer " << l << " at position " << pos << " differs";
      }
  }

  // Resumes at R and feeds [R, P): the ring keys of layers [0, layers) at positions [P − W + 1, P) that
  // differ from the uncached run's at P (the cached prefix's source sequence); -1 on failure.
  static int64_t ring_keys_differing_at_p(const DeepseekV41Model& m, const Case& c, Fixture& f, int64_t R,
                                          int64_t layers) {
    auto st = resume(m, c, f, R);
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
    if (!st.ok()) return -1;
    ForwardOptions fo;
    fo.logits = LogitRows::None;
    auto out = m.forward(std::span<const int64_t>(f.ids).subspan(static_cast<size_t>(R), static_cast<size_t>(c.P - R)),
                         *st, fo);
    EXPECT_TRUE(out.ok());
    if (!out.ok()) return -1;
    int64_t differ = 0;
    for (int64_t l = 0; l < layers; ++l)
      for (int64_t pos = c.P - kWindow + 1; pos < c.P; ++pos) {
        const std::vector<float> want = f.source->attention().rings[static_cast<size_t>(l)].decoded(pos);
        const std::vector<float> got = st->attention().rings[static_cast<size_t>(l)].decoded(pos);
        EXPECT_FALSE(want.empty() || got.empty()) << "layer " << l << " position " << pos;
        differ += !same_bits(want, got);
      }
    return differ;
  }

  static std::vector<Case> cases() {
    const ForwardMode E = ForwardMode::Exact, C = ForwardMode::Ced;
    const CedBoundary X = CedBoundary::ExactSource, G = CedBoundary::GlobalKvOnly;
    // clang-format off
    return {
        {E, X, 16, 80, 89},  // bound 70: R = 10
        {E, X, 32, 96, 101},
        {C, X, 16, 64, 90},  // bound 49, tail after P: t = P, R = 15
        {C, X, 16, 64, 68},  // tail inside the cached prefix: t = N − tail = 60, R = 11
        {C, G, 16, 48, 70},  // bound 42: t = P, R = 6
        {C, G, 32, 64, 68},  // t = 60, R = 18
    };
    // clang-format on
  }

  static inline std::vector<DeepseekV41Model*> models_;
  static inline test_support::ScratchDir* scratch_ = nullptr;
};

// The tiny profile's numbers: 10 layers, the boundary (last KV source) at 6, window 8.
TEST_F(BoundedReplayTest, TinyModelNumbers) {
  const DeepseekV41Model& m = *models_[0];
  ASSERT_EQ(m.plan().num_layers(), 10);
  ASSERT_EQ(m.plan().last_kv_source, 6);
  ASSERT_EQ(m.config().sliding_window, kWindow);
  EXPECT_EQ(m.exact_replay_rows(ForwardMode::Exact), 70);
  EXPECT_EQ(m.exact_replay_rows(ForwardMode::Ced), 49);
  EXPECT_EQ(m.exact_replay_rows(ForwardMode::Ced, CedBoundary::GlobalKvOnly), 42);
}

// At the bound: logits and final hidden states of every row from P on (ced: from the replay start on)
// and of the decode steps, every global-KV entry, the rings where the state says they are exact — all
// equal to the uncached run, bit for bit; the state says it is exact. Prompts fed in one call and in
// chunks of 5.
TEST_F(BoundedReplayTest, AtTheBoundEqualsTheUncachedRun) {
  for (size_t mi = 0; mi < models_.size(); ++mi) {
    const DeepseekV41Model& m = *models_[mi];
    const std::vector<Case> all = cases();
    for (size_t ci = 0; ci < all.size(); ++ci) {
      const Case& c = all[ci];
      const std::string what = c.name(kSeeds[mi]);
      Fixture f;
      prepare(m, c, kSeeds[mi], f);
      const int64_t bound = m.exact_replay_rows(c.mode, c.boundary);
      const int64_t R = c.t() - bound;
      ASSERT_GT(R, 0) << what;
      for (int64_t chunk : {ci % 2 == 0 ? int64_t{0} : int64_t{5}}) {
        auto st = resume(m, c, f, R);
        ASSERT_TRUE(st.ok()) << what << ": " << st.error().message;
        EXPECT_TRUE(st->global_kv_exact()) << what;
        EXPECT_EQ(st->exact_swa_layers(), f.ref_state->exact_swa_layers()) << what;
        Trace got;
        run(m, *st, f.ids, c.N, chunk, got);
        expect_rows_equal(f.ref, got, c.first_row(), what + ", chunk " + std::to_string(chunk));
        expect_state_equal(m, *f.ref_state, *st, what);
        // Where the perturbation stops, layer by layer (all before P).
        for (const auto& [layer, last] : last_differing_rows(f.ref, got))
          EXPECT_LT(last, std::min(c.P, R + (layer + 1) * (kWindow - 1))) << what << ", layer " << layer;
        auto snap = m.snapshot_swa(*st);
        ASSERT_TRUE(snap.ok());
        EXPECT_EQ(snap->held_from,
                  std::max(R + (st->exact_swa_layers() - 1) * (kWindow - 1), st->length() - (kWindow + 2 * kWindow)))
            << what;
      }
      // Every ring the mode keeps exact, at P: the window below P equals the uncached run's.
      EXPECT_EQ(ring_keys_differing_at_p(m, c, f, R, f.ref_state->exact_swa_layers()), 0) << what;
    }
  }
}

// One row short of the bound (R = t − bound + 1): the state is approximate, and every layer still
// differs only inside the reach R + (l + 1)·(W − 1). Exact mode refuses such a resume; its numbers are
// measured through a ced sequence whose tail covers the whole prompt (every row runs every layer with
// untruncated decoder windows: the exact-mode computation, checked against the exact-mode reference).
// Prints where the perturbation's front got to per layer: the bound is tight where a layer's front
// reaches its reach's last row.
TEST_F(BoundedReplayTest, OneRowShortOfTheBound) {
  int64_t differ = 0, configs = 0;
  for (size_t mi = 0; mi < models_.size(); ++mi) {
    const DeepseekV41Model& m = *models_[mi];
    for (const Case& c : cases()) {
      const std::string what = c.name(kSeeds[mi]);
      const int64_t bound = m.exact_replay_rows(c.mode, c.boundary);
      const int64_t R = c.t() - bound + 1;
      Case measured = c;
      if (c.mode == ForwardMode::Exact) {
        measured.mode = ForwardMode::Ced;
        measured.tail = c.N;
      }
      Fixture f;
      prepare(m, measured, kSeeds[mi], f);
      if (c.mode == ForwardMode::Exact) {
        auto refused = resume(m, c, f, R);  // the cached global KV is the same in both modes
        ASSERT_FALSE(refused.ok()) << what;
        EXPECT_NE(refused.error().message.find("exact mode refuses an inexact SWA bounded replay: restart " +
                                               std::to_string(R)),
                  std::string::npos)
            << refused.error().message;
        if (mi == 0) {  // the stand-in computes what exact mode computes
          Fixture e;
          prepare(m, c, kSeeds[mi], e);
          for (const auto& [pos, h] : e.ref.hidden)
            ASSERT_TRUE(same_bits(h, f.ref.hidden.at(pos))) << what << ": " << pos;
        }
      }
      auto st = resume(m, measured, f, R);
      ASSERT_TRUE(st.ok()) << what << ": " << st.error().message;
      EXPECT_FALSE(st->global_kv_exact()) << what;
      EXPECT_EQ(st->exact_swa_layers(), 0) << what;
      Trace got;
      run(m, *st, f.ids, c.N, 0, got);
      std::string fronts;
      const int64_t exact_layers = bound / (kWindow - 1);
      for (const auto& [layer, row] : last_differing_rows(f.ref, got)) {
        const int64_t reach = R + (layer + 1) * (kWindow - 1) - 1;  // the last row the truncation can reach
        EXPECT_LE(row, reach) << what << ", layer " << layer;
        // The layers the bound counts: the perturbation gets all the way (where that row is computed).
        if (layer < exact_layers && got.out.at(layer).count(reach)) {
          EXPECT_EQ(row, reach) << what << ", layer " << layer << ": the bound is not tight";
        }
        fronts += " " + (row < 0 ? std::string("-") : std::to_string(row - R));
      }
      bool differs = false;
      for (const auto* maps : {&f.ref.hidden, &f.ref.logits})
        for (const auto& [pos, v] : *maps) {
          const auto& mine = maps == &f.ref.hidden ? got.hidden : got.logits;
          if (pos >= c.first_row() && mine.count(pos)) differs |= !same_bits(v, mine.at(pos));
        }
      // Global-KV entries (from P on) that differ.
      int64_t entries = 0;
      {
        auto a = f.ref_state->attention().global_kv_entries(m.plan());
        auto b = st->attention().global_kv_entries(m.plan());
        ASSERT_TRUE(a.ok() && b.ok());
        for (size_t k = 0; k < a->size(); ++k)
          for (int64_t j = 0; j < std::min((*a)[k]->size(), (*b)[k]->size()); ++j)
            entries += !same_bits((*a)[k]->decoded(j), (*b)[k]->decoded(j));
      }
      const int64_t keys = ring_keys_differing_at_p(m, measured, f, R, bound / (kWindow - 1));
      // Something an exact state carries differs: the outputs, the global KV written from P on, or the
      // rings at P (which a later snapshot of the state would hand on).
      EXPECT_TRUE(differs || entries > 0 || keys > 0) << what << ": one row short of the bound is exact";
      ++configs;
      differ += differs;
      std::printf(
          "[bounded replay] %s, one row short (R %lld): outputs %s, %lld global-KV entries and %lld ring keys at P "
          "differ; last differing row − R per layer:%s\n",
          what.c_str(), static_cast<long long>(R), differs ? "differ" : "equal", static_cast<long long>(entries),
          static_cast<long long>(keys), fronts.c_str());
    }
  }
  std::printf("[bounded replay] one row short: the outputs differ in %lld of %lld configurations\n",
              static_cast<long long>(differ), static_cast<long long>(configs));
}

}  // namespace
}  // namespace cedar
