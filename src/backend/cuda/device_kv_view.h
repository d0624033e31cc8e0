// What a kernel needs to address one sequence's KV on the device (docs/cuda-log.md "Device KV"; the
// conventions of the issue-8 design): plain views, usable on host and device. C++17.
//
// Global KV is paged like the host's BlockPool: record j of a stream lives at
//   pool + block_table[j / entries_per_block] · block_bytes + (j % entries_per_block) · record_bytes
// in exactly the host's packed record formats (kv/kv_format.h: main KV 288 B, indexer key 68 B), so a
// block is copied byte for byte between the host pool, the device pool and the SSD tier.
// A SWA ring is `slots` records (528 B: FP8 + UE8M0/32) plus one int64 position per slot; the record of
// position p is in slot p % slots, and an empty slot holds position −1.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cedar::cuda {

struct KvStreamView {
  uint8_t* pool = nullptr;               // the stream's block arena (one per block size)
  const int32_t* block_table = nullptr;  // device: this sequence's block indices into `pool`
  int64_t block_bytes = 0;
  int64_t record_bytes = 0;
  int64_t entries_per_block = 0;
  int64_t ratio = 1;  // positions per entry (compress ratio)
};

__host__ __device__ inline int64_t kv_record_offset(int32_t block, int64_t j, const KvStreamView& s) {
  return static_cast<int64_t>(block) * s.block_bytes + (j % s.entries_per_block) * s.record_bytes;
}

// Device only (reads the device block table).
__device__ inline uint8_t* kv_record(const KvStreamView& s, int64_t j) {
  return s.pool + kv_record_offset(s.block_table[j / s.entries_per_block], j, s);
}

// records / positions as attention_kernels.h SwaRingDesc.
struct SwaRingView {
  uint8_t* records = nullptr;    // [slots, record_bytes]
  int64_t* positions = nullptr;  // [slots]; −1 = empty
  int64_t slots = 0;
  int64_t record_bytes = 0;
};

__host__ __device__ inline int64_t swa_slot(const SwaRingView& r, int64_t pos) { return pos % r.slots; }

}  // namespace cedar::cuda
