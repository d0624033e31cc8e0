// A stable identity of a model's weights and configuration, for caches that must never mix models
// (the prefix cache's keys and SSD files, issue 6): two checkpoints of the same shapes but different
// values (e.g. make-tiny with different seeds) get different fingerprints, and rewriting a shard
// changes it. It must be cheap on a 500 GB checkpoint, so it reads only small parts:
//   * config.json (whole) and model.safetensors.index.json when present (whole),
//   * every shard's name, file size and safetensors header (8-byte length + JSON),
//   * sampled data bytes: five 64 KiB windows per shard at fixed fractions (0, ¼, ½, ¾, end) of its
//     data section (the whole data section when it is at most five windows long).
// The digest is SHA-256 over a length-prefixed encoding of these, in shard-name order, as 64 hex digits.
// A change confined to unsampled data bytes of a shard whose header and size stay the same is not
// detected; retrained or re-quantized weights change practically every window.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/status.h"

namespace cedar {

inline constexpr uint64_t kFingerprintWindowBytes = 64 << 10;

struct FingerprintRange {
  uint64_t offset = 0, bytes = 0;  // relative to the start of a shard's data section
};
// The data-section ranges hashed for a shard whose data section holds `data_size` bytes.
std::vector<FingerprintRange> fingerprint_sample_ranges(uint64_t data_size);

// `model_dir` holds config.json and model.safetensors.index.json + shards, or a single model.safetensors.
// Errors name the missing or unreadable file.
Result<std::string> model_fingerprint(const std::filesystem::path& model_dir);

}  // namespace cedar
