#include "engine/fake_model.h"

#include <algorithm>
#include <cstring>
#include <deque>

namespace cedar::engine {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr uint64_t kApproximateSalt = 0xA5A5F00DCAFE1234ull;
constexpr int64_t kExactModeLayers = 2, kCedLayers = 1;  // "rings" a restore needs per mode

struct FakeSnapshot final : SequenceSnapshot {
  std::vector<uint64_t> hashes;  // history hash at lengths [earliest_restore, length]
};

struct FakeStream {
  int64_t ratio = 0, entries_per_block = 0, record_bytes = 0;
  int32_t size_class = -1;
  std::vector<BlockId> ids;
};

// Record layout: the history hash at position (j+1)·ratio, then 1 if the KV is approximate.
struct Record {
  uint64_t hash = 0, approximate = 0;
};

class FakeSequence final : public ModelSequence {
 public:
  FakeSequence(std::shared_ptr<int64_t> live, const FakeModelOptions& options, const SequenceSpec& spec,
               std::vector<FakeStream> streams)
      : live_(std::move(live)), options_(&options), spec_(spec), streams_(std::move(streams)) {
    ++*live_;
    spec_.resume = nullptr;
  }
  ~FakeSequence() override {
    --*live_;
    for (FakeStream& s : streams_)
      for (BlockId id : s.ids) (void)options_->pool->release(id);
  }
  int64_t length() const override { return length_; }
  int64_t kv_bytes_allocated() const override {
    int64_t bytes = 0;
    for (const FakeStream& s : streams_)
      bytes += static_cast<int64_t>(s.ids.size()) * s.entries_per_block * s.record_bytes;
    return bytes;
  }

  Status resume(const SequenceResume& r) {
    const int64_t B = options_->layout.tokens_per_block;
    if (r.cached_tokens <= 0 || r.cached_tokens % B != 0 || r.restart < 0 || r.restart > r.cached_tokens ||
        static_cast<int64_t>(r.history.size()) != r.restart || r.blocks.size() != streams_.size())
      return make_error("fake model: malformed resume (P " + std::to_string(r.cached_tokens) + ", R " +
                        std::to_string(r.restart) + ")");
    cached_ = r.cached_tokens;
    if (!r.prefix_exact) {
      if (spec_.mode == ForwardMode::Exact) return make_error("fake model: exact mode from an approximate prefix");
      approximate_ = true;
    }
    for (size_t s = 0; s < streams_.size(); ++s) {
      const size_t need = static_cast<size_t>(r.cached_tokens / B);
      if (r.blocks[s].size() != need) return make_error("fake model: resume with a wrong number of blocks");
      for (BlockId id : r.blocks[s]) {
        CEDAR_RETURN_IF_ERROR(options_->pool->retain(id));
        streams_[s].ids.push_back(id);
      }
    }
    for (int64_t t : r.history) CEDAR_RETURN_IF_ERROR(advance(t, /*replay_only=*/true));
    if (r.snapshot != nullptr) {
      const auto* snap = dynamic_cast<const FakeSnapshot*>(r.snapshot.get());
      if (snap == nullptr || r.restart < snap->earliest_restore || r.restart > snap->length)
        return make_error("fake model: the snapshot cannot restore length " + std::to_string(r.restart));
      if (snap->hashes[static_cast<size_t>(r.restart - snap->earliest_restore)] != hash_)
        return make_error("fake model: the snapshot belongs to another token history");
      if (spec_.mode == ForwardMode::Exact && snap->exact_layers < kExactModeLayers)
        return make_error("fake model: an exact-mode resume from a snapshot without every layer");
      const int64_t tail = spec_.ced_tail > 0 ? spec_.ced_tail : options_->sliding_window;
      if (spec_.mode == ForwardMode::Ced && r.restart > spec_.prompt_length - tail) approximate_ = true;
    } else if (r.restart > 0) {
      const bool exact = spec_.mode == ForwardMode::Exact;
      const int64_t tail = spec_.ced_tail > 0 ? spec_.ced_tail : options_->sliding_window;
      const int64_t t = exact ? r.cached_tokens : std::min(r.cached_tokens, spec_.prompt_length - tail);
      const int64_t rows = exact ? options_->exact_mode_replay_rows : options_->ced_replay_rows;
      if (r.restart > t - rows) {
        if (exact) return make_error("fake model: exact mode refuses an inexact SWA replay");
        approximate_ = true;
      } else {
        rings_exact_from_ = r.restart + rows + 1;
      }
    }
    recent_.assign(1, hash_);  // the rings are rebuilt from R on
    return Status::Ok();
  }

  // Feeds one token. Positions inside the cached prefix check the cached records instead of writing.
  Status advance(int64_t token, bool replay_only = false) {
    hash_ = FakeModelRunner::extend_hash(hash_, token);
    ++length_;
    recent_.push_back(hash_);
    while (static_cast<int64_t>(recent_.size()) > spec_.swa_history + 1) recent_.pop_front();
    for (FakeStream& s : streams_) {
      if (length_ % s.ratio != 0) continue;
      const int64_t j = length_ / s.ratio - 1;
      const size_t b = static_cast<size_t>(j / s.entries_per_block);
      const int64_t offset = (j % s.entries_per_block) * s.record_bytes;
      if (length_ <= cached_) {
        Record rec;
        std::memcpy(&rec, options_->pool->data(s.ids[b]) + offset, sizeof rec);
        if (rec.hash != hash_)
          return make_error("fake model: cached block record " + std::to_string(j) +
                            " does not continue this token history");
        approximate_ = approximate_ || rec.approximate != 0;
        continue;
      }
      if (replay_only) return make_error("fake model: history past the cached prefix");
      if (b >= s.ids.size()) {
        CEDAR_ASSIGN_OR_RETURN(const BlockId id, options_->pool->allocate(s.size_class));
        s.ids.push_back(id);
      }
      const Record rec{hash_, approximate_ ? 1u : 0u};
      std::memcpy(options_->pool->data(s.ids[b]) + offset, &rec, sizeof rec);
    }
    return Status::Ok();
  }

  uint64_t logits_hash() const { return approximate_ ? mix(hash_ ^ kApproximateSalt) : hash_; }

  Result<std::vector<std::vector<BlockId>>> prefix_blocks(int64_t tokens) const override {
    const int64_t B = options_->layout.tokens_per_block;
    if (tokens % B != 0 || tokens > length_)
      return make_error("fake model: prefix_blocks of " + std::to_string(tokens));
    std::vector<std::vector<BlockId>> out;
    for (const FakeStream& s : streams_) {
      const auto n = static_cast<size_t>(tokens / B);
      if (s.ids.size() < n) return make_error("fake model: fewer blocks than the prefix");
      out.emplace_back(s.ids.begin(), s.ids.begin() + static_cast<long>(n));
    }
    return out;
  }

  Result<std::shared_ptr<const SequenceSnapshot>> snapshot() const override {
    auto s = std::make_shared<FakeSnapshot>();
    s->length = length_;
    const int64_t held = length_ - static_cast<int64_t>(recent_.size()) + 1;
    s->earliest_restore = std::min(length_, std::max(held, rings_exact_from_));
    s->hashes.assign(recent_.begin() + (s->earliest_restore - held), recent_.end());
    s->exact_layers = approximate_ || rings_exact_from_ > length_ ? 0
                      : spec_.mode == ForwardMode::Exact      ? kExactModeLayers
                                                              : kCedLayers;
    s->bytes = static_cast<int64_t>(8 * s->hashes.size()) + 64;
    return std::shared_ptr<const SequenceSnapshot>(std::move(s));
  }
  bool global_kv_exact() const override { return !approximate_; }

 private:
  std::shared_ptr<int64_t> live_;
  const FakeModelOptions* options_;
  SequenceSpec spec_;
  std::vector<FakeStream> streams_;
  uint64_t hash_ = FakeModelRunner::kInitialHash;
  int64_t length_ = 0;
  int64_t cached_ = 0;  // P of a resume
  int64_t rings_exact_from_ = 0;  // after an exact replay: snapshots restore from here on
  bool approximate_ = false;
  std::deque<uint64_t> recent_{FakeModelRunner::kInitialHash};  // hashes at the last lengths, up to length_
};

}  // namespace

uint64_t FakeModelRunner::extend_hash(uint64_t hash, int64_t token) {
  return mix(hash ^ mix(static_cast<uint64_t>(token)));
}

std::vector<float> FakeModelRunner::logits_for(uint64_t hash) const {
  std::vector<float> logits(static_cast<size_t>(options_.vocab));
  for (int64_t i = 0; i < options_.vocab; ++i) {
    const uint64_t h = mix(hash + static_cast<uint64_t>(i) * 0x632BE59BD9B4E019ull);
    logits[static_cast<size_t>(i)] =
        static_cast<float>(static_cast<double>(h >> 40) / static_cast<double>(1ull << 24) * 8.0 - 4.0);
  }
  if (options_.eos >= 0) logits[static_cast<size_t>(options_.eos)] += static_cast<float>(options_.eos_bias);
  return logits;
}

std::optional<PrefixCacheSupport> FakeModelRunner::prefix_cache() const {
  if (options_.pool == nullptr || options_.layout.streams.empty()) return std::nullopt;
  PrefixCacheSupport s;
  s.pool = options_.pool;
  for (const PoolCacheLayout::Stream& st : options_.layout.streams) {
    Result<int32_t> cls = options_.pool->size_class(st.block_bytes);
    if (!cls.ok()) return std::nullopt;
    s.stream_classes.push_back(*cls);
  }
  s.tokens_per_block = options_.layout.tokens_per_block;
  s.fingerprint = "fake-model";
  s.sliding_window = options_.sliding_window;
  s.exact_mode_layers = kExactModeLayers;
  s.ced_layers = kCedLayers;
  s.exact_mode_replay_rows = options_.exact_mode_replay_rows;
  s.ced_replay_rows = options_.ced_replay_rows;
  return s;
}

Result<std::unique_ptr<ModelSequence>> FakeModelRunner::create_sequence(const SequenceSpec& spec) {
  if (spec.prompt_length <= 0) return make_error("fake model: prompt_length must be > 0");
  std::vector<FakeStream> streams;
  if (options_.pool != nullptr) {
    for (const PoolCacheLayout::Stream& st : options_.layout.streams) {
      FakeStream fs;
      fs.ratio = st.ratio;
      fs.entries_per_block = st.entries_per_block;
      fs.record_bytes = st.block_bytes / st.entries_per_block;
      if (fs.record_bytes < static_cast<int64_t>(sizeof(Record)))
        return make_error("fake model: records of " + std::to_string(fs.record_bytes) + " B are too small");
      CEDAR_ASSIGN_OR_RETURN(fs.size_class, options_.pool->size_class(st.block_bytes));
      streams.push_back(std::move(fs));
    }
  } else if (spec.resume != nullptr) {
    return make_error("fake model: resume without a block pool");
  }
  auto seq = std::make_unique<FakeSequence>(live_, options_, spec, std::move(streams));
  if (spec.resume != nullptr) {
    CEDAR_RETURN_IF_ERROR(seq->resume(*spec.resume));
    ++resumes_;
  }
  return std::unique_ptr<ModelSequence>(std::move(seq));
}

void FakeModelRunner::run_batch(std::span<BatchItem> items) {
  ++batches_;
  max_batch_items_ = std::max<int64_t>(max_batch_items_, static_cast<int64_t>(items.size()));
  for (BatchItem& item : items) {
    auto* seq = dynamic_cast<FakeSequence*>(item.sequence);
    if (seq == nullptr || item.tokens.empty()) {
      item.status = make_error("fake model: bad batch item");
      continue;
    }
    if (options_.fail_at_length >= 0 &&
        seq->length() + static_cast<int64_t>(item.tokens.size()) >= options_.fail_at_length) {
      item.status = make_error("fake model: injected failure at length " + std::to_string(options_.fail_at_length));
      continue;
    }
    item.status = Status::Ok();
    for (int64_t t : item.tokens) {
      if (t < 0 || t >= options_.vocab) {
        item.status = make_error("fake model: token " + std::to_string(t) + " out of range");
        break;
      }
      if (Status st = seq->advance(t); !st.ok()) {
        item.status = st;
        break;
      }
    }
    if (!item.status.ok()) continue;
    tokens_processed_ += static_cast<int64_t>(item.tokens.size());
    if (item.want_logits) item.logits = logits_for(seq->logits_hash());
  }
}

}  // namespace cedar::engine
