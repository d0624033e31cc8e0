#include "engine/fake_model.h"

namespace cedar::engine {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class FakeSequence final : public ModelSequence {
 public:
  explicit FakeSequence(std::shared_ptr<int64_t> live) : live_(std::move(live)) { ++*live_; }
  ~FakeSequence() override { --*live_; }
  int64_t length() const override { return length_; }
  uint64_t hash = 0x12345;
  int64_t length_ = 0;

 private:
  std::shared_ptr<int64_t> live_;
};

}  // namespace

uint64_t FakeModelRunner::extend_hash(uint64_t hash, int64_t token) { return mix(hash ^ mix(static_cast<uint64_t>(token))); }

std::vector<float> FakeModelRunner::logits_for(uint64_t hash) const {
  std::vector<float> logits(static_cast<size_t>(options_.vocab));
  for (int64_t i = 0; i < options_.vocab; ++i) {
    const uint64_t h = mix(hash + static_cast<uint64_t>(i) * 0x632BE59BD9B4E019ull);
    logits[static_cast<size_t>(i)] = static_cast<float>(static_cast<double>(h >> 40) / static_cast<double>(1ull << 24) * 8.0 - 4.0);
  }
  if (options_.eos >= 0) logits[static_cast<size_t>(options_.eos)] += static_cast<float>(options_.eos_bias);
  return logits;
}

Result<std::unique_ptr<ModelSequence>> FakeModelRunner::create_sequence(const SequenceSpec& spec) {
  if (spec.prompt_length <= 0) return make_error("fake model: prompt_length must be > 0");
  return std::unique_ptr<ModelSequence>(std::make_unique<FakeSequence>(live_));
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
    if (options_.fail_at_length >= 0 && seq->length_ + static_cast<int64_t>(item.tokens.size()) >= options_.fail_at_length) {
      item.status = make_error("fake model: injected failure at length " + std::to_string(options_.fail_at_length));
      continue;
    }
    item.status = Status::Ok();
    for (int64_t t : item.tokens) {
      if (t < 0 || t >= options_.vocab) {
        item.status = make_error("fake model: token " + std::to_string(t) + " out of range");
        break;
      }
      seq->hash = extend_hash(seq->hash, t);
      ++seq->length_;
    }
    if (!item.status.ok()) continue;
    tokens_processed_ += static_cast<int64_t>(item.tokens.size());
    if (item.want_logits) item.logits = logits_for(seq->hash);
  }
}

}  // namespace cedar::engine
