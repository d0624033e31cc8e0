// Resuming a DeepSeek-V4.1 sequence from a cached prefix (docs/prefix_cache.md, "Resuming a sequence
// (model)") on make-tiny checkpoints of several seeds (sliding_window 8, ratio-2 encoder sources, a
// ratio-1 boundary source), with 16 and 32 tokens per block so prompts span many blocks.
//
// The invariant is the uncached run: a continuation resumed from the blocks and a ring snapshot of an
// earlier sequence must give the uncached run's final hidden states and logits bit for bit (exact
// mode at every restorable R; ced mode for R <= N − tail); SWA bounded replay without a snapshot is
// measured against the uncached ced run and bounded. The block pool's reference counts and allocation
// counter prove that the cached blocks are shared, never copied or written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/deepseek_v41.h"
#include "model/tiny_checkpoint.h"
#include "test_support/tiny_model.h"

namespace cedar {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kSeeds[] = {0, 1, 2};
constexpr int64_t kWindow = 8;  // the tiny profile's sliding_window

std::vector<int64_t> tokens(int64_t n, uint64_t seed) { return test_support::xorshift_prompt(n, seed, 777); }

// Final hidden states ("final_norm", the head's input) and logits, by absolute position.
struct Rows {
  std::map<int64_t, std::vector<float>> hidden, logits;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string describe(const char* fmt, int64_t a, int64_t b = 0, int64_t c = 0, int64_t d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, static_cast<long long>(a), static_cast<long long>(b), static_cast<long long>(c),
                static_cast<long long>(d));
  return buf;
}

class ResumeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(fs::temp_directory_path() / ("cedar-resume-test-" + std::to_string(::getpid())));
    fs::remove_all(*root_);
    fs::create_directories(*root_);
    for (uint64_t seed : kSeeds) {
      TinyCheckpointOptions o;
      o.seed = seed;
      o.tokenizer_files = false;
      const fs::path dir = *root_ / ("seed" + std::to_string(seed));
      const Status st = make_tiny_checkpoint(o, dir, false);
      ASSERT_TRUE(st.ok()) << st.error().message;
      auto m = DeepseekV41Model::load(dir);
      ASSERT_TRUE(m.ok()) << m.error().message;
      models_.push_back(new DeepseekV41Model(std::move(*m)));
    }
  }
  static void TearDownTestSuite() {
    for (auto* m : models_) delete m;
    models_.clear();
    std::error_code ec;
    fs::remove_all(*root_, ec);
    delete root_;
  }

  static SequenceOptions options(ForwardMode mode, int64_t prompt, int64_t tpb, std::shared_ptr<BlockPool> pool,
                                 int64_t swa_history, CedBoundary boundary = CedBoundary::ExactSource) {
    SequenceOptions so;
    so.mode = mode;
    so.prompt_length = mode == ForwardMode::Ced ? prompt : 0;
    so.ced_boundary = boundary;
    so.kv.tokens_per_block = tpb;
    so.kv.pool = std::move(pool);
    so.swa_history = swa_history;
    return so;
  }

  // Feeds ids[state.length(), end) in chunks of `chunk` (0 = one call, 1 = token by token). Logits:
  // `all` every computed row, else the last row of the last chunk.
  static void feed(const DeepseekV41Model& m, SequenceState& st, const std::vector<int64_t>& ids, int64_t end,
                   int64_t chunk, Rows* rows, bool all = false) {
    ForwardOptions fo;
    if (rows != nullptr)
      fo.sink = [rows](const TensorRecord& r) {
        if (r.name != "final_norm") return;
        for (int64_t i = 0; i < r.rows; ++i)
          rows->hidden[r.pos0 + i].assign(r.data.begin() + i * r.width, r.data.begin() + (i + 1) * r.width);
      };
    while (st.length() < end) {
      const int64_t p = st.length(), len = chunk > 0 ? std::min(chunk, end - p) : end - p;
      fo.logits = rows == nullptr  ? LogitRows::None
                  : all            ? LogitRows::All
                  : p + len == end ? LogitRows::Last
                                   : LogitRows::None;
      auto out =
          m.forward(std::span<const int64_t>(ids).subspan(static_cast<size_t>(p), static_cast<size_t>(len)), st, fo);
      ASSERT_TRUE(out.ok()) << out.error().message;
      ASSERT_EQ(st.length(), p + len);
      for (size_t i = 0; i < out->positions.size(); ++i)
        rows->logits[out->positions[i]].assign(out->logits.begin() + static_cast<int64_t>(i) * out->vocab,
                                               out->logits.begin() + static_cast<int64_t>(i + 1) * out->vocab);
    }
  }

  // An uncached run over ids[0, ends.back()) fed in chunks that end at each of `ends`: every row's
  // hidden state, the logits of each chunk's last row (a chunk split is exact).
  static Rows reference_at(const DeepseekV41Model& m, const std::vector<int64_t>& ids, std::vector<int64_t> ends,
                           const SequenceOptions& so) {
    Rows rows;
    auto st = m.new_sequence(so);
    EXPECT_TRUE(st.ok()) << st.error().message;
    if (!st.ok()) return rows;
    std::sort(ends.begin(), ends.end());
    for (int64_t end : ends) feed(m, *st, ids, end, 0, &rows);
    return rows;
  }

  // Every row `got` computed in [from, to) equals the reference's, it computed all of them, and its
  // logits equal the reference's.
  static void expect_rows_equal(const Rows& ref, const Rows& got, int64_t from, int64_t to, const std::string& what) {
    int64_t want = 0;
    for (const auto& [pos, h] : ref.hidden) want += pos >= from && pos < to;
    int64_t seen = 0;
    for (const auto& [pos, h] : got.hidden) {
      if (pos < from || pos >= to) continue;
      ++seen;
      auto it = ref.hidden.find(pos);
      ASSERT_TRUE(it != ref.hidden.end()) << what << ": position " << pos << " is not a reference row";
      ASSERT_TRUE(same_bits(it->second, h)) << what << ": final hidden state of position " << pos << " differs";
    }
    EXPECT_EQ(seen, want) << what << ": rows computed from " << from;
    ASSERT_FALSE(got.logits.empty()) << what << ": no logits";
    for (const auto& [pos, l] : got.logits) {
      auto it = ref.logits.find(pos);
      ASSERT_TRUE(it != ref.logits.end()) << what << ": logits of position " << pos << " not in the reference";
      ASSERT_TRUE(same_bits(it->second, l)) << what << ": logits of position " << pos << " differ";
    }
  }

  struct Source {  // a sequence that cached its prefix: snapshots at chosen lengths, its state
    std::map<int64_t, SwaSnapshot> snapshots;
    std::optional<SequenceState> state;
  };
  // Runs ids[0, end) uncached, taking an SWA snapshot at each length in `at`.
  static Source source(const DeepseekV41Model& m, const std::vector<int64_t>& ids, int64_t end,
                       const SequenceOptions& so, std::vector<int64_t> at, int64_t chunk = 7) {
    Source s;
    auto st = m.new_sequence(so);
    EXPECT_TRUE(st.ok()) << st.error().message;
    if (!st.ok()) return s;
    std::sort(at.begin(), at.end());
    for (int64_t len : at) {
      feed(m, *st, ids, len, chunk, nullptr);
      auto snap = m.snapshot_swa(*st);
      EXPECT_TRUE(snap.ok()) << snap.error().message;
      if (snap.ok()) s.snapshots.emplace(len, std::move(*snap));
    }
    feed(m, *st, ids, end, chunk, nullptr);
    s.state.emplace(std::move(*st));
    return s;
  }

  static Result<SequenceState> resume(const DeepseekV41Model& m, const SequenceOptions& so, const SequenceState& from,
                                      int64_t P, int64_t R, const SwaSnapshot* snap, const std::vector<int64_t>& ids,
                                      bool prefix_exact = true) {
    CEDAR_ASSIGN_OR_RETURN(auto blocks, m.prefix_blocks(from, P));
    ResumeSpec spec;
    spec.cached_tokens = P;
    spec.blocks = std::move(blocks);
    spec.restart = R;
    spec.swa = snap;
    spec.history = std::span<const int64_t>(ids).first(static_cast<size_t>(R));
    spec.prefix_exact = prefix_exact;
    return m.resume_sequence(so, spec);
  }

  static std::vector<DeepseekV41Model*> models_;
  static fs::path* root_;
};
std::vector<DeepseekV41Model*> ResumeTest::models_;
fs::path* ResumeTest::root_ = nullptr;

// (a) Exact mode with a snapshot: P at several block boundaries, snapshots at even and odd lengths L,
// odd and even N, one-shot / chunked / token-by-token continuation; every R of the restorable range for
// one (P, L) per block size of the first model, the range's ends (and middle, first model) elsewhere
// (each row of the tiny model costs milliseconds, tens under ASan).
TEST_F(ResumeTest, ExactModeWithSnapshotEqualsUncachedAtEveryRestorableR) {
  int64_t resumed = 0;
  for (size_t mi = 0; mi < models_.size(); ++mi) {
    const DeepseekV41Model& m = *models_[mi];
    for (int64_t tpb : {16, 32}) {
      const int64_t H = kWindow + tpb;  // swa_history of the design note: window + B
      const std::vector<int64_t> Ps = tpb == 16 ? std::vector<int64_t>{16, 32, 48} : std::vector<int64_t>{32, 64};
      const int64_t n_max = Ps.back() + 6;
      const auto ids = tokens(n_max, 100 + mi);
      std::vector<int64_t> ends, lengths;
      for (int64_t P : Ps) {
        ends.insert(ends.end(), {P + 5, P + 6});
        lengths.insert(lengths.end(), {P, P + 3});
      }
      // The reference has no swa_history and 64-token blocks: neither changes the numerics.
      const Rows ref = reference_at(m, ids, ends, {});
      auto pool = BlockPool::create({});
      ASSERT_TRUE(pool.ok());
      const SequenceOptions so = options(ForwardMode::Exact, 0, tpb, *pool, H);
      const Source src = source(m, ids, n_max, so, lengths);
      ASSERT_TRUE(src.state.has_value());
      for (int64_t P : Ps) {
        for (int64_t L : {P, P + 3}) {
          const SwaSnapshot& snap = src.snapshots.at(L);
          EXPECT_EQ(snap.exact_layers, m.plan().num_layers());
          EXPECT_EQ(snap.earliest_restore(kWindow), L > kWindow + H ? L - H : 0);
          const int64_t lo = snap.earliest_restore(kWindow), hi = P, mid = (lo + hi) / 2;
          const bool sweep = mi == 0 && P == 2 * tpb && L == P + 3;
          std::vector<int64_t> rs;
          for (int64_t R = lo; R <= hi; ++R)
            if (sweep || R == lo || R == hi || (mi == 0 && R == mid)) rs.push_back(R);
          for (int64_t R : rs) {
            const int64_t N = P + 5 + (R + L) % 2;  // odd and even
            const int64_t chunk = R % 3 == 0 ? 0 : R % 3 == 1 ? 5 : 1;
            const std::string what =
                describe("seed %lld, tpb %lld, P %lld, L %lld", static_cast<int64_t>(kSeeds[mi]), tpb, P, L) +
                describe(", R %lld, N %lld, chunk %lld", R, N, chunk);
            auto st = resume(m, so, *src.state, P, R, &snap, ids);
            ASSERT_TRUE(st.ok()) << what << ": " << st.error().message;
            EXPECT_EQ(st->length(), R);
            EXPECT_EQ(st->cached_end(), P);
            EXPECT_TRUE(st->global_kv_exact());
            EXPECT_EQ(st->exact_swa_layers(), m.plan().num_layers());
            Rows got;
            feed(m, *st, ids, N, chunk, &got);
            expect_rows_equal(ref, got, R, N, what);
            ++resumed;
          }
        }
      }
    }
  }
  std::printf("[resume exact] %lld resumed continuations bitwise equal to the uncached run\n",
              static_cast<long long>(resumed));
}

// The continuation's tokens after P differ from those the snapshot's sequence had after P: the ring
// positions past R are forgotten, the continuation equals an uncached run of its own tokens.
TEST_F(ResumeTest, ExactModeContinuationThatDivergesAfterTheCachedPrefix) {
  const DeepseekV41Model& m = *models_[1];
  const int64_t tpb = 16, H = kWindow + tpb, P = 32, L = 45;
  const auto first = tokens(L, 5);
  auto second = first;
  second.resize(P);
  const auto tail = tokens(20, 6);
  second.insert(second.end(), tail.begin(), tail.end());
  auto pool = BlockPool::create({});
  ASSERT_TRUE(pool.ok());
  const SequenceOptions so = options(ForwardMode::Exact, 0, tpb, *pool, H);
  const Source src = source(m, first, L, so, {L});
  const Rows ref = reference_at(m, second, {static_cast<int64_t>(second.size())}, {});
  for (int64_t R : {L - H, int64_t{26}, P - 1, P}) {
    auto st = resume(m, so, *src.state, P, R, &src.snapshots.at(L), second);
    ASSERT_TRUE(st.ok()) << st.error().message;
    Rows got;
    feed(m, *st, second, static_cast<int64_t>(second.size()), 4, &got);
    expect_rows_equal(ref, got, R, INT64_MAX, "diverging continuation, R " + std::to_string(R));
  }
}

// (b) ced mode with a snapshot (from a ced or an exact sequence) and R <= N − tail: the prompt and the
// decode steps after it equal the uncached ced run.
TEST_F(ResumeTest, CedModeWithSnapshotEqualsUncachedCed) {
  int64_t resumed = 0;
  for (size_t mi = 0; mi < models_.size(); ++mi) {
    const DeepseekV41Model& m = *models_[mi];
    for (int64_t tpb : {16, 32}) {
      if (mi > 0 && tpb == 32) continue;  // runtime: the other seeds at 16 tokens per block
      const int64_t H = kWindow + tpb;
      for (CedBoundary boundary : {CedBoundary::ExactSource, CedBoundary::GlobalKvOnly}) {
        if (mi > 0 && (boundary == CedBoundary::ExactSource) != (mi == 1)) continue;
        const int64_t L1 = 2 * tpb + 5, P = 2 * tpb;  // the first turn's prompt (snapshot at its end)
        const int64_t decode = 3;
        const auto ids = tokens(L1 + 11 + decode, 200 + mi);
        auto pool = BlockPool::create({});
        ASSERT_TRUE(pool.ok());
        const Source ced_src = source(m, ids, L1, options(ForwardMode::Ced, L1, tpb, *pool, H, boundary), {L1});
        const Source exact_src = source(m, ids, L1, options(ForwardMode::Exact, 0, tpb, *pool, H), {L1});
        const int64_t want_layers =
            boundary == CedBoundary::ExactSource ? m.plan().last_kv_source + 1 : m.plan().encoder_layers;
        EXPECT_EQ(ced_src.snapshots.at(L1).exact_layers, want_layers);
        // N − tail beyond P, and N − tail inside the cached prefix (then R reaches N − tail itself).
        for (int64_t N : {L1 + 11, P + 6}) {
          const int64_t s = N - kWindow;
          const SequenceOptions so = options(ForwardMode::Ced, N, tpb, *pool, H, boundary);
          Rows ref;
          {
            auto st = m.new_sequence(options(ForwardMode::Ced, N, 64, nullptr, 0, boundary));
            ASSERT_TRUE(st.ok());
            feed(m, *st, ids, N, 0, &ref, true);
            feed(m, *st, ids, N + decode, 1, &ref, true);
          }
          for (const Source* src : {&ced_src, &exact_src}) {
            const SwaSnapshot& snap = src->snapshots.at(L1);
            const int64_t lo = snap.earliest_restore(kWindow), hi = std::min(P, s);
            const bool sweep =
                mi == 0 && tpb == 16 && boundary == CedBoundary::ExactSource && src == &ced_src && N == P + 6;
            std::vector<int64_t> rs;
            // The exact-mode snapshot (a superset of the layers ced needs) at one configuration.
            if (src == &exact_src && (mi > 0 || tpb != 16)) continue;
            for (int64_t R = lo; R <= hi; ++R)
              if (sweep || R == hi || (R == lo && N == P + 6)) rs.push_back(R);
            for (int64_t R : rs) {
              const std::string what =
                  describe("seed %lld, tpb %lld, boundary %lld, N %lld", static_cast<int64_t>(kSeeds[mi]), tpb,
                           static_cast<int64_t>(boundary), N) +
                  describe(", P %lld, R %lld, ", P, R) + (src == &ced_src ? "ced" : "exact") + " snapshot";
              auto st = resume(m, so, *src->state, P, R, &snap, ids);
              ASSERT_TRUE(st.ok()) << what << ": " << st.error().message;
              EXPECT_EQ(st->replay_start(), s);
              EXPECT_TRUE(st->global_kv_exact());
              EXPECT_EQ(st->exact_swa_layers(), want_layers);
              Rows got;
              feed(m, *st, ids, N, R % 2 == 0 ? 0 : 3, &got);  // logits: the prompt's last row, each decode step
              feed(m, *st, ids, N + decode, 1, &got, true);
              expect_rows_equal(ref, got, s, INT64_MAX, what);
              EXPECT_EQ(static_cast<int64_t>(got.logits.size()), 1 + decode) << what;
              ++resumed;
            }
          }
        }
      }
    }
  }
  std::printf("[resume ced] %lld resumed ced continuations bitwise equal to the uncached ced run\n",
              static_cast<long long>(resumed));
}

struct Agreement {
  double min_cosine = 1, sum_cosine = 0, max_rel_l2 = 0;
  int64_t rows = 0, top1_same = 0;
};
void compare_logits(std::span<const float> a, std::span<const float> b, Agreement& g) {
  double dot = 0, na = 0, nb = 0, diff = 0;
  size_t ia = 0, ib = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += double(a[i]) * b[i];
    na += double(a[i]) * a[i];
    nb += double(b[i]) * b[i];
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    if (a[i] > a[ia]) ia = i;
    if (b[i] > b[ib]) ib = i;
  }
  const double cosine = dot / std::sqrt(na * nb);
  g.min_cosine = std::min(g.min_cosine, cosine);
  g.sum_cosine += cosine;
  g.max_rel_l2 = std::max(g.max_rel_l2, std::sqrt(diff / na));
  ++g.rows;
  g.top1_same += ia == ib;
}

// Tolerances of SWA bounded replay over `window` rows on the tiny random-weight checkpoints (48 logit
// rows, 4 seed/block-size configurations). Measured: min cosine 0.618, mean cosine 0.944, max rel-L2
// 0.872, top-1 17/48; a useless answer (neighbouring rows of the uncached run): mean cosine 0.12, min
// -0.31, rel-L2 up to 1.62, top-1 0/44. The bounds keep a margin below the measurement and stay well
// clear of the useless answer (docs/prefix_cache.md). Random tiny weights: not a prediction for the
// released model.
constexpr double kReplayMinCosine = 0.45;
constexpr double kReplayMeanCosine = 0.85;
constexpr double kReplayMaxRelL2 = 1.1;
constexpr double kReplayMinTop1 = 0.2;

// (c) ced mode, SWA bounded replay without a snapshot, from R = P − k, measured against the uncached
// ced run on the prompt's logit rows [N − tail, N) and 4 decode steps. k = window is the restart policy's
// choice: approximate, bounded below. Truncating the window at R perturbs rows [R, R + W − 1) of layer
// 0, and every further layer reaches W − 1 rows further (its window reads the perturbed rows of its
// input); compressed entries from P on come from those rows. So with k >= (last_kv_source + 1)·(W − 1)
// (exact_replay_rows) nothing perturbed reaches P: the continuation is exact again, bit for bit, and the
// state says so (resume_bounded_replay_test.cpp covers that bound in full). For scale, the same numbers
// for ced vs exact mode.
TEST_F(ResumeTest, CedReplayWithoutSnapshotStaysWithinTolerance) {
  std::map<int64_t, Agreement> by_k;
  Agreement ced_vs_exact, unrelated;  // unrelated: neighbouring rows of the uncached run (a useless answer)
  const int64_t exact_from = (models_[0]->plan().last_kv_source + 1) * (kWindow - 1);
  ASSERT_EQ(exact_from, 49);
  ASSERT_EQ(models_[0]->exact_replay_rows(ForwardMode::Ced), exact_from);
  const std::pair<size_t, int64_t> configs[] = {{0, 16}, {0, 32}, {1, 16}, {2, 32}};
  for (const auto& [mi, tpb] : configs) {
    const DeepseekV41Model& m = *models_[mi];
    const int64_t P = 64, N = P + 16, decode = 4, s = N - kWindow;
    const auto ids = tokens(N + decode, 300 + mi + static_cast<uint64_t>(tpb));
    auto pool = BlockPool::create({});
    ASSERT_TRUE(pool.ok());
    const SequenceOptions so = options(ForwardMode::Ced, N, tpb, *pool, 0);
    Rows ref;
    {
      auto st = m.new_sequence(so);
      ASSERT_TRUE(st.ok());
      feed(m, *st, ids, N, 0, &ref, true);
      feed(m, *st, ids, N + decode, 1, &ref, true);
    }
    for (auto it = ref.logits.begin(); std::next(it) != ref.logits.end(); ++it)
      compare_logits(it->second, std::next(it)->second, unrelated);
    if (mi == 0 && tpb == 16) {
      Rows exact;
      auto ex = m.new_sequence({});
      ASSERT_TRUE(ex.ok());
      feed(m, *ex, ids, s, 0, nullptr);
      feed(m, *ex, ids, N + decode, 0, &exact, true);
      for (const auto& [pos, l] : ref.logits) compare_logits(exact.logits.at(pos), l, ced_vs_exact);
    }
    // The cached prefix: global KV of the first P tokens of a ced sequence (exact global KV).
    const Source src = source(m, ids, P, options(ForwardMode::Ced, P, tpb, *pool, 0), {});
    for (int64_t k : {kWindow, 2 * kWindow, 4 * kWindow, exact_from}) {
      const int64_t R = P - k;
      const std::string what =
          describe("seed %lld, tpb %lld, replay of %lld rows from R %lld", static_cast<int64_t>(kSeeds[mi]), tpb, k, R);
      auto st = resume(m, so, *src.state, P, R, nullptr, ids);
      ASSERT_TRUE(st.ok()) << st.error().message;
      EXPECT_EQ(st->global_kv_exact(), k >= exact_from) << what;
      EXPECT_EQ(st->exact_swa_layers(), k >= exact_from ? exact_from / (kWindow - 1) : 0) << what;
      Rows got;
      feed(m, *st, ids, N, 0, &got, true);
      feed(m, *st, ids, N + decode, 1, &got, true);
      ASSERT_EQ(got.logits.size(), ref.logits.size()) << what;
      if (k >= exact_from) {
        expect_rows_equal(ref, got, s, INT64_MAX, what);
        continue;
      }
      bool differs = false;
      for (const auto& [pos, l] : got.logits) {
        compare_logits(ref.logits.at(pos), l, by_k[k]);
        differs |= !same_bits(ref.logits.at(pos), l);
      }
      EXPECT_TRUE(differs) << what << " gave the uncached logits bit for bit: not a replay";
    }
  }
  for (const auto& [k, g] : by_k)
    std::printf(
        "[resume ced replay] replay of %lld rows vs uncached ced, %lld rows: min cosine %.6f, mean cosine %.6f, max "
        "rel-L2 %.4g, top-1 %lld/%lld\n",
        static_cast<long long>(k), static_cast<long long>(g.rows), g.min_cosine, g.sum_cosine / g.rows, g.max_rel_l2,
        static_cast<long long>(g.top1_same), static_cast<long long>(g.rows));
  std::printf(
      "[resume ced replay] for scale, ced vs exact (seed 0), %lld rows: min cosine %.6f, mean cosine %.6f, max rel-L2 "
      "%.4g, top-1 %lld/%lld\n",
      static_cast<long long>(ced_vs_exact.rows), ced_vs_exact.min_cosine, ced_vs_exact.sum_cosine / ced_vs_exact.rows,
      ced_vs_exact.max_rel_l2, static_cast<long long>(ced_vs_exact.top1_same),
      static_cast<long long>(ced_vs_exact.rows));
  std::printf(
      "[resume ced replay] for scale, neighbouring rows of the uncached run, %lld pairs: min cosine %.6f, mean cosine "
      "%.6f, max rel-L2 %.4g, top-1 %lld/%lld\n",
      static_cast<long long>(unrelated.rows), unrelated.min_cosine, unrelated.sum_cosine / unrelated.rows,
      unrelated.max_rel_l2, static_cast<long long>(unrelated.top1_same), static_cast<long long>(unrelated.rows));
  const Agreement& policy = by_k[kWindow];
  RecordProperty("replay_min_cosine", std::to_string(policy.min_cosine));
  RecordProperty("replay_max_rel_l2", std::to_string(policy.max_rel_l2));
  RecordProperty("replay_top1", std::to_string(policy.top1_same) + "/" + std::to_string(policy.rows));
  // Bounds for k = window: see docs/prefix_cache.md (measured values with a margin).
  EXPECT_GT(policy.min_cosine, kReplayMinCosine);
  EXPECT_GT(policy.sum_cosine / policy.rows, kReplayMeanCosine);
  EXPECT_LT(policy.max_rel_l2, kReplayMaxRelL2);
  EXPECT_GE(static_cast<double>(policy.top1_same), kReplayMinTop1 * static_cast<double>(policy.rows));
}

// SWA replay from R = 0 replays nothing away: exact, in either mode.
TEST_F(ResumeTest, ReplayFromZeroIsExact) {
  const DeepseekV41Model& m = *models_[0];
  const int64_t tpb = 16, P = 48, N = 61;
  const auto ids = tokens(N, 9);
  auto pool = BlockPool::create({});
  ASSERT_TRUE(pool.ok());
  for (ForwardMode mode : {ForwardMode::Exact, ForwardMode::Ced}) {
    const SequenceOptions so = options(mode, N, tpb, *pool, 0);
    const Rows ref = reference_at(m, ids, {N}, so);
    const Source src = source(m, ids, P, so, {});
    auto st = resume(m, so, *src.state, P, 0, nullptr, ids);
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_TRUE(st->global_kv_exact());
    Rows got;
    feed(m, *st, ids, N, 6, &got);
    expect_rows_equal(ref, got, 0, INT64_MAX, std::string(forward_mode_name(mode)) + ", replay from 0");
  }
}

// Bytes of every block of `blocks` (their contents, to prove nobody wrote them).
std::vector<std::vector<uint8_t>> block_bytes(BlockPool& pool, const std::vector<std::vector<BlockId>>& blocks) {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& stream : blocks)
    for (BlockId id : stream) {
      const Result<int64_t> n = pool.block_bytes(id);
      const uint8_t* d = pool.data(id);
      out.emplace_back(d, d + (n.ok() ? *n : 0));
    }
  return out;
}

// (d) The resumed sequence holds the cached blocks themselves (reference counts, no allocation for
// [0, P)); appending past P allocates exactly the new blocks (no copy on write: nothing writes a
// shared block) and leaves the shared bytes and the source sequence intact.
TEST_F(ResumeTest, SharesTheCachedBlocksAndNeverWritesThem) {
  const DeepseekV41Model& m = *models_[0];
  for (int64_t tpb : {16, 32}) {
    SCOPED_TRACE("tokens_per_block " + std::to_string(tpb));
    const int64_t H = kWindow + tpb, P = 2 * tpb, L = P + 5, N = P + 21;
    const auto ids = tokens(N, 11);
    auto pool_r = BlockPool::create({});
    ASSERT_TRUE(pool_r.ok());
    BlockPool& pool = **pool_r;
    const SequenceOptions so = options(ForwardMode::Exact, 0, tpb, *pool_r, H);
    Source src = source(m, ids, L, so, {L});
    auto blocks = m.prefix_blocks(*src.state, P);
    ASSERT_TRUE(blocks.ok()) << blocks.error().message;
    int64_t shared = 0;
    for (const auto& stream : *blocks) {
      shared += static_cast<int64_t>(stream.size());
      for (BlockId id : stream) ASSERT_EQ(pool.ref_count(id), 1);
    }
    ASSERT_GT(shared, 0);
    const auto bytes_before = block_bytes(pool, *blocks);
    const BlockPoolStats before = pool.stats();

    auto st = resume(m, so, *src.state, P, P - 3, &src.snapshots.at(L), ids);
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_EQ(pool.stats().allocations, before.allocations) << "resuming allocated blocks";
    EXPECT_EQ(pool.stats().used_blocks, before.used_blocks);
    for (const auto& stream : *blocks)
      for (BlockId id : stream) EXPECT_EQ(pool.ref_count(id), 2) << "block " << id;
    auto again = m.prefix_blocks(*st, P);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *blocks);

    Rows got;
    feed(m, *st, ids, N, 1, &got);  // token by token: every append goes through the shared table
    auto after = m.prefix_blocks(*st, P);
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(*after, *blocks) << "a shared block was replaced (copy on write)";
    for (const auto& stream : *blocks)
      for (BlockId id : stream) EXPECT_EQ(pool.ref_count(id), 2) << "block " << id;
    EXPECT_TRUE(block_bytes(pool, *blocks) == bytes_before) << "a shared block's bytes changed";
    auto entries = st->attention().global_kv_entries(m.plan());
    ASSERT_TRUE(entries.ok());
    int64_t own = 0;
    for (const KvEntries* e : *entries) own += e->blocks().blocks();
    own -= shared;
    EXPECT_EQ(pool.stats().allocations - before.allocations, own) << "allocations beyond the new blocks (copies)";

    // The source sequence goes on as if nothing happened: its continuation equals the uncached run.
    const Rows ref = reference_at(m, ids, {N}, {});
    expect_rows_equal(ref, got, P - 3, INT64_MAX, "resumed");
    Rows src_rows;
    feed(m, *src.state, ids, N, 4, &src_rows);
    expect_rows_equal(ref, src_rows, L, INT64_MAX, "source after the resumed sequence appended");

    st = Result<SequenceState>(make_error("dropped"));  // releases the resumed state's blocks
    for (const auto& stream : *blocks)
      for (BlockId id : stream) EXPECT_EQ(pool.ref_count(id), 1) << "block " << id;
  }
}

// (e) Every error names what is wrong, and a refused resume leaves the pool's reference counts alone.
TEST_F(ResumeTest, ErrorsNameWhatIsWrong) {
  const DeepseekV41Model& m = *models_[0];
  const int64_t tpb = 16, H = kWindow + tpb, P = 32, L = 40;
  const auto ids = tokens(64, 13);
  auto pool = BlockPool::create({});
  ASSERT_TRUE(pool.ok());
  const SequenceOptions so = options(ForwardMode::Exact, 0, tpb, *pool, H);
  Source src = source(m, ids, L, so, {L});
  const SwaSnapshot& snap = src.snapshots.at(L);
  auto blocks_r = m.prefix_blocks(*src.state, P);
  ASSERT_TRUE(blocks_r.ok()) << blocks_r.error().message;
  const std::vector<std::vector<BlockId>> blocks = *blocks_r;
  ASSERT_EQ(blocks.size(), 6u);  // layers 2, 4, 6: main KV + indexer keys each

  auto spec = [&](int64_t cached, int64_t R) {
    ResumeSpec s;
    s.cached_tokens = cached;
    s.blocks = blocks;
    s.restart = R;
    s.swa = &snap;
    s.history = std::span<const int64_t>(ids).first(static_cast<size_t>(std::max<int64_t>(R, 0)));
    return s;
  };
  auto expect_error = [&](const SequenceOptions& o, const ResumeSpec& s, const std::string& needle) {
    auto st = m.resume_sequence(o, s);
    ASSERT_FALSE(st.ok()) << "expected an error mentioning '" << needle << "'";
    EXPECT_NE(st.error().message.find(needle), std::string::npos) << st.error().message;
    std::printf("  [error] %s\n", st.error().message.c_str());
  };

  ASSERT_TRUE(m.resume_sequence(so, spec(P, 20)).ok());   // the baseline is valid
  EXPECT_TRUE(m.resume_sequence(so, ResumeSpec{}).ok());  // nothing cached: a new sequence

  expect_error(so, spec(24, 20), "cached_tokens 24 is not a multiple of tokens_per_block 16");
  expect_error(so, spec(P, 33), "restart 33 is outside [0, cached_tokens 32]");
  expect_error(so, spec(P, -1), "restart -1 is outside");
  {
    ResumeSpec s = spec(P, 20);
    s.blocks.pop_back();
    expect_error(so, s, "blocks name 5 global-KV streams, the model has 6");
    s = spec(P, 20);
    s.blocks[0].pop_back();
    expect_error(so, s, "stream 0 (layer 2 main KV) has 1 blocks, cached_tokens 32 needs 2");
    s = spec(P, 20);
    s.blocks[3].push_back(s.blocks[3].back());
    expect_error(so, s, "stream 3 (layer 4 indexer keys) has 3 blocks");
    s = spec(P, 20);
    std::swap(s.blocks[0], s.blocks[1]);  // main KV records (18 B) vs indexer keys (17 B)
    expect_error(so, s, "holds 136 B, the table's blocks 144 B");
  }
  {
    SequenceOptions no_pool = so;
    no_pool.kv.pool = nullptr;
    expect_error(no_pool, spec(P, 20), "cached blocks need options.kv.pool");
    auto other = BlockPool::create({});
    ASSERT_TRUE(other.ok());
    SequenceOptions wrong_pool = so;
    wrong_pool.kv.pool = *other;
    expect_error(wrong_pool, spec(P, 20), "unknown block");
    // A block that was freed (its sequence is gone) is not in use.
    std::vector<std::vector<BlockId>> freed;
    {
      Source gone = source(m, ids, P, so, {});
      freed = *m.prefix_blocks(*gone.state, P);
    }
    ResumeSpec s = spec(P, 20);
    s.blocks = freed;
    expect_error(so, s, "which is not in use");
  }
  {
    SequenceOptions more = so;
    more.swa_history = H + 1;
    expect_error(more, spec(P, 20), "snapshot rings have 32 slots, the sequence's 33");
    expect_error(so, spec(P, 15), "restart 15 is outside the snapshot's restorable range [16, 40]");
    SwaSnapshot short_snap = snap;
    short_snap.length = 19;
    ResumeSpec s = spec(P, 20);
    s.swa = &short_snap;
    expect_error(so, s, "restorable range");
    s = spec(P, 20);
    s.swa = nullptr;
    expect_error(so, s,
                 "exact mode refuses an inexact SWA bounded replay: restart 20 replays 12 rows, exactness needs 70 "
                 "(restart <= 0");
    SwaSnapshot broken = snap;
    broken.rings.pop_back();
    s = spec(P, 20);
    s.swa = &broken;
    expect_error(so, s, "snapshot holds 9 rings for 10 layers");
  }
  {  // A ced snapshot (encoder layers, GlobalKvOnly boundary) does not cover what exact mode needs.
    Source ced = source(m, ids, L, options(ForwardMode::Ced, L, tpb, *pool, H, CedBoundary::GlobalKvOnly), {L});
    ResumeSpec s = spec(P, 20);
    s.swa = &ced.snapshots.at(L);
    expect_error(so, s, "snapshot covers layers [0, 6), exact mode needs [0, 10)");
    expect_error(options(ForwardMode::Ced, 50, tpb, *pool, H), s,
                 "snapshot covers layers [0, 6), ced mode needs [0, 7)");
    // ... but covers the GlobalKvOnly ced mode.
    EXPECT_TRUE(m.resume_sequence(options(ForwardMode::Ced, 50, tpb, *pool, H, CedBoundary::GlobalKvOnly), s).ok());
  }
  {  // Rings of another record format (fp32 storage).
    SequenceOptions f32 = so;
    f32.kv.storage = KvStorage::F32;
    Source other = source(m, ids, L, f32, {L});
    ResumeSpec s = spec(P, 20);
    s.swa = &other.snapshots.at(L);
    expect_error(so, s, "snapshot ring of layer 0 is 32 × fp8_b32_ue8m0/f32");
  }
  {
    ResumeSpec s = spec(P, 20);
    s.history = std::span<const int64_t>(ids).first(19);
    expect_error(so, s, "history holds 19 tokens, expected the sequence's 20 tokens");
    std::vector<int64_t> bad(ids.begin(), ids.begin() + 20);
    bad[7] = 200000;
    s.history = bad;
    expect_error(so, s, "history token 200000 at position 7 is outside the vocabulary");
    s = spec(P, 20);
    s.prefix_exact = false;
    expect_error(so, s, "exact mode cannot resume from a prefix whose global KV is not exact");
  }
  {  // With one token per block, P must still close every ratio-2 group.
    Source one = source(m, ids, 8, options(ForwardMode::Exact, 0, 1, *pool, 0), {});
    ResumeSpec odd;
    odd.cached_tokens = 3;
    expect_error(options(ForwardMode::Exact, 0, 1, *pool, 0), odd,
                 "cached_tokens 3 is not a multiple of compress ratio 2 of KV source layer 2");
    auto pb = m.prefix_blocks(*one.state, 3);
    ASSERT_FALSE(pb.ok());
    EXPECT_NE(pb.error().message.find("compress ratio 2"), std::string::npos) << pb.error().message;
  }
  {  // prefix_blocks: block-aligned, within what the caches hold.
    auto pb = m.prefix_blocks(*src.state, 24);
    ASSERT_FALSE(pb.ok());
    EXPECT_NE(pb.error().message.find("prefix 24 is not a multiple of tokens_per_block 16"), std::string::npos)
        << pb.error().message;
    pb = m.prefix_blocks(*src.state, 48);
    ASSERT_FALSE(pb.ok());
    EXPECT_NE(pb.error().message.find("stream 0 (layer 2 main KV) holds 20 entries, a prefix of 48 tokens needs 24"),
              std::string::npos)
        << pb.error().message;
  }
  // Nothing above left a reference behind.
  for (const auto& stream : blocks)
    for (BlockId id : stream) EXPECT_EQ((*pool)->ref_count(id), 1) << "block " << id;
}

// (f) global_kv_exact / exact_swa_layers: what an uncached run of the mode has; lost by an
// approximate replay, and carried over to a sequence that resumes from such a prefix.
TEST_F(ResumeTest, ExactnessPropagates) {
  const DeepseekV41Model& m = *models_[2];
  const int64_t tpb = 16, H = kWindow + tpb, P = 32, L = 37, N = 60, layers = m.plan().num_layers();
  const int64_t ced_exact = m.plan().last_kv_source + 1, ced_kv_only = m.plan().encoder_layers;
  ASSERT_EQ(ced_exact, 7);
  ASSERT_EQ(ced_kv_only, 6);
  const auto ids = tokens(N, 17);
  auto pool = BlockPool::create({});
  ASSERT_TRUE(pool.ok());
  const SequenceOptions exact = options(ForwardMode::Exact, 0, tpb, *pool, H);
  const SequenceOptions ced = options(ForwardMode::Ced, N, tpb, *pool, H);
  {
    auto a = m.new_sequence(exact);
    auto b = m.new_sequence(ced);
    auto c = m.new_sequence(options(ForwardMode::Ced, N, tpb, *pool, H, CedBoundary::GlobalKvOnly));
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    EXPECT_TRUE(a->global_kv_exact() && b->global_kv_exact() && c->global_kv_exact());
    EXPECT_EQ(a->exact_swa_layers(), layers);
    EXPECT_EQ(b->exact_swa_layers(), ced_exact);
    EXPECT_EQ(c->exact_swa_layers(), ced_kv_only);
  }
  Source src = source(m, ids, L, exact, {L});
  // Approximate replay: both flags drop, stay dropped, and the snapshot is unusable.
  auto replayed = resume(m, ced, *src.state, P, P - kWindow, nullptr, ids);
  ASSERT_TRUE(replayed.ok()) << replayed.error().message;
  EXPECT_FALSE(replayed->global_kv_exact());
  EXPECT_EQ(replayed->exact_swa_layers(), 0);
  feed(m, *replayed, ids, 50, 0, nullptr);
  EXPECT_FALSE(replayed->global_kv_exact());
  auto bad_snap = m.snapshot_swa(*replayed);
  ASSERT_TRUE(bad_snap.ok());
  EXPECT_EQ(bad_snap->exact_layers, 0);
  EXPECT_TRUE(bad_snap->rings.empty());
  {
    auto st = resume(m, ced, *replayed, P, P, &*bad_snap, ids, replayed->global_kv_exact());
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message.find("snapshot covers layers [0, 0)"), std::string::npos) << st.error().message;
  }
  // Its prefix is not exact: a ced sequence resuming from it (even with an exact snapshot) is not
  // exact either; exact mode refuses it.
  auto second = resume(m, ced, *replayed, P, P, &src.snapshots.at(L), ids, replayed->global_kv_exact());
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_FALSE(second->global_kv_exact());
  EXPECT_EQ(second->exact_swa_layers(), 0);
  EXPECT_FALSE(resume(m, exact, *replayed, P, P, &src.snapshots.at(L), ids, replayed->global_kv_exact()).ok());
  // A snapshot resume keeps both; in ced mode past N − tail too (the decoder is truncated at R then,
  // the encoder and boundary rings stay exact).
  auto exact_resume = resume(m, exact, *src.state, P, P, &src.snapshots.at(L), ids);
  ASSERT_TRUE(exact_resume.ok());
  EXPECT_TRUE(exact_resume->global_kv_exact());
  EXPECT_EQ(exact_resume->exact_swa_layers(), layers);
  const SequenceOptions short_ced = options(ForwardMode::Ced, 34, tpb, *pool, H);  // N − tail = 26 < R
  auto late = resume(m, short_ced, *src.state, P, 30, &src.snapshots.at(L), ids);
  ASSERT_TRUE(late.ok()) << late.error().message;
  EXPECT_EQ(late->replay_start(), 30);
  EXPECT_TRUE(late->global_kv_exact());
  EXPECT_EQ(late->exact_swa_layers(), ced_exact);
  feed(m, *late, ids, 40, 3, nullptr);
  auto late_snap = m.snapshot_swa(*late);
  ASSERT_TRUE(late_snap.ok());
  EXPECT_EQ(late_snap->exact_layers, ced_exact);
}

// (g) A resumed sequence's own snapshot and prefix blocks resume a third sequence; the chain stays
// bitwise equal to the uncached run, and the first generation's blocks are shared all the way.
TEST_F(ResumeTest, ResumedSequenceCanBeResumedAgain) {
  for (size_t mi : {size_t{0}, size_t{2}}) {
    const DeepseekV41Model& m = *models_[mi];
    SCOPED_TRACE("seed " + std::to_string(kSeeds[mi]));
    const int64_t tpb = 16, H = kWindow + tpb, L1 = 37, P1 = 32, L2 = 70, P2 = 64, N = 90;
    const auto ids = tokens(N, 400 + mi);
    auto pool = BlockPool::create({});
    ASSERT_TRUE(pool.ok());
    const SequenceOptions so = options(ForwardMode::Exact, 0, tpb, *pool, H);
    const Rows ref = reference_at(m, ids, {L2, N}, {});
    Source gen1 = source(m, ids, L1, so, {L1});
    auto gen1_blocks = m.prefix_blocks(*gen1.state, P1);
    ASSERT_TRUE(gen1_blocks.ok());

    auto gen2 = resume(m, so, *gen1.state, P1, 20, &gen1.snapshots.at(L1), ids);
    ASSERT_TRUE(gen2.ok()) << gen2.error().message;
    Rows rows2;
    feed(m, *gen2, ids, L2, 9, &rows2);
    expect_rows_equal(ref, rows2, 20, L2, "generation 2");
    auto snap2 = m.snapshot_swa(*gen2);
    ASSERT_TRUE(snap2.ok());
    EXPECT_EQ(snap2->earliest_restore(kWindow), L2 - H);
    auto gen2_blocks = m.prefix_blocks(*gen2, P2);
    ASSERT_TRUE(gen2_blocks.ok());
    for (size_t k = 0; k < gen2_blocks->size(); ++k)  // gen1's blocks are the first ones of gen2's prefix
      EXPECT_TRUE(std::equal((*gen1_blocks)[k].begin(), (*gen1_blocks)[k].end(), (*gen2_blocks)[k].begin()));

    for (int64_t R : {L2 - H, int64_t{55}, P2}) {
      ResumeSpec spec{.cached_tokens = P2,
                      .blocks = *gen2_blocks,
                      .restart = R,
                      .swa = &*snap2,
                      .history = std::span<const int64_t>(ids).first(static_cast<size_t>(R))};
      auto gen3 = m.resume_sequence(so, spec);
      ASSERT_TRUE(gen3.ok()) << gen3.error().message;
      for (BlockId id : (*gen1_blocks)[0]) EXPECT_EQ((*pool)->ref_count(id), 3) << "block " << id;
      Rows rows3;
      feed(m, *gen3, ids, N, R % 2 ? 1 : 0, &rows3);
      expect_rows_equal(ref, rows3, R, INT64_MAX, "generation 3, R " + std::to_string(R));
    }

    // A sequence resumed before the end of its snapshot and snapshotted before reaching it holds the
    // rings only from the first snapshot's oldest position on: the restorable range says so.
    auto short2 = resume(m, so, *gen1.state, P1, 20, &gen1.snapshots.at(L1), ids);
    ASSERT_TRUE(short2.ok());
    feed(m, *short2, ids, 30, 0, nullptr);
    auto snap_short = m.snapshot_swa(*short2);
    ASSERT_TRUE(snap_short.ok());
    const int64_t slots = kWindow + H;
    EXPECT_EQ(snap_short->held_from, L1 - slots);
    EXPECT_EQ(snap_short->earliest_restore(kWindow), L1 - slots + kWindow);
    auto short_blocks = m.prefix_blocks(*short2, 16);
    ASSERT_TRUE(short_blocks.ok());
    const int64_t earliest = snap_short->earliest_restore(kWindow);
    ResumeSpec ok_spec{.cached_tokens = 16,
                       .blocks = *short_blocks,
                       .restart = earliest,
                       .swa = &*snap_short,
                       .history = std::span<const int64_t>(ids).first(static_cast<size_t>(earliest))};
    auto gen3 = m.resume_sequence(so, ok_spec);
    ASSERT_TRUE(gen3.ok()) << gen3.error().message;
    Rows rows3;
    feed(m, *gen3, ids, N, 5, &rows3);
    expect_rows_equal(ref, rows3, earliest, INT64_MAX, "generation 3 from the short snapshot");
    ResumeSpec early = ok_spec;
    early.restart = earliest - 1;
    early.history = std::span<const int64_t>(ids).first(static_cast<size_t>(earliest - 1));
    EXPECT_FALSE(m.resume_sequence(so, early).ok());
  }
}

}  // namespace
}  // namespace cedar
