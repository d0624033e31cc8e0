// The KV cache on the device: paged global-KV pools, per-sequence block tables and SWA rings
// (device_kv_view.h for the addressing), with the same page geometry as the host (kv/kv_layout.h:
// tokens_per_block positions per block of every stream, the host's packed record formats). Host-side
// C++20 (included from .cpp files).
//
// Accounting: a device twin of the host BlockPool rather than the host pool itself. The host pool
// hands out host memory per block and reclaims it across size classes; a device pool needs fixed
// arenas whose addresses kernels (and captured graphs) keep. So each block size (main KV at ratio 2
// and 1, indexer keys at ratio 2 and 1) gets one arena sized from a token capacity, with a host free
// list per arena and reference counts (for prefix sharing later). What a sequence of N positions
// holds is exactly what PoolCacheBudget charges for it (bytes_for == measure_kv_bytes's allocated
// bytes, checked by a test), so the engine's budget can sit on top of either pool unchanged.
//
// Per-sequence state outside the pools (in per-slot device arrays, one slot per live sequence):
// SWA rings of every layer and the compressors' pending ratio-r group (fp32 kv and gate projections of
// the ratio − 1 tokens of an open group per KV source, slot = pos % ratio: the CPU's
// KvSourceState::pending_*, the layout attention_kernels.h KvSourceSeq takes).
//
// Everything a sequence's kernels address is fixed by its slot (ring, block-table row, pending state),
// so per-layer descriptor arrays indexed by slot (slot_table) never change while the pool lives: a
// step's rows name their sequence by slot (AttnToken::seq = slot) and a captured decode graph stays
// valid from step to step; only the step's rows and the tables' contents change.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_kv_view.h"
#include "backend/cuda/device_weights.h"
#include "core/status.h"
#include "io/config.h"
#include "kv/kv_layout.h"
#include "model/layer_plan.h"

namespace cedar::cuda {

struct DeviceKvOptions {
  int64_t max_sequences = 64;    // live sequences (slots of rings and block tables)
  int64_t max_context = 131072;  // positions one sequence can reach (width of its block tables)
  int64_t token_capacity = 0;    // positions the pools hold over all sequences; 0: max_sequences × max_context
  int64_t tokens_per_block = 64;
  int64_t swa_slots = 0;  // ring slots per layer; 0: sliding_window
};

// The pools' shape, computed on the host (no device needed).
struct DeviceKvGeometry {
  struct Arena {
    int64_t block_bytes = 0;
    int64_t blocks = 0;            // capacity
    std::vector<int64_t> streams;  // indices into `streams` that allocate from it
  };
  std::vector<KvStreamSpec> streams;  // kv_layout.h global_kv_streams, in layer order
  std::vector<int32_t> arena_of;      // per stream
  std::vector<Arena> arenas;
  int64_t layers = 0;
  int64_t max_sequences = 0, blocks_per_table = 0, tokens_per_block = 0;
  int64_t swa_slots = 0, swa_record_bytes = 0;
  std::vector<int64_t> source_layers;  // KV source layers, in order (the index of pending state)
  int64_t pending_floats = 0;          // per KV source, sequence and kind (kv / gate): (ratio−1)·head_dim

  static Result<DeviceKvGeometry> create(const ModelConfig& c, const LayerPlan& plan, const DeviceKvOptions& o);
  // Pool bytes one sequence of `positions` positions holds (page-rounded, every stream).
  int64_t bytes_for(int64_t positions) const;
  // Blocks stream `s` needs for `positions` positions.
  int64_t blocks_for(int64_t s, int64_t positions) const;
  // Bytes per component (kv pools, block tables, SWA rings, compressor state).
  DeviceMemoryPlan memory_plan() const;
};

class DeviceKvSequence;

class DeviceKvPool {
 public:
  static Result<DeviceKvPool> create(const ModelConfig& c, const LayerPlan& plan, const DeviceKvOptions& o);
  const DeviceKvGeometry& geometry() const;

  // A free sequence slot with empty tables, cleared rings (positions −1) and zeroed compressor state.
  // Errors when all max_sequences slots are live.
  Result<DeviceKvSequence> new_sequence(cudaStream_t stream);

  // Makes `to` (a fresh sequence of this pool) a copy of `from`: grows its tables to from's positions and
  // copies every stream's blocks, the SWA rings and the compressor state (async on `stream`, device to
  // device; the tables are uploaded). A fork of a prefilled prompt (benchmarks, parallel sampling).
  Status copy_sequence(const DeviceKvSequence& from, DeviceKvSequence& to, cudaStream_t stream);

  struct Stats {
    int64_t used_blocks = 0, free_blocks = 0, used_bytes = 0, capacity_bytes = 0, live_sequences = 0;
  };
  Stats stats() const;

  // Views of a slot's state (valid for the pool's lifetime, whichever sequence holds the slot).
  KvStreamView stream_view(int64_t slot, int64_t stream) const;
  SwaRingView ring_view(int64_t slot, int64_t layer) const;
  float* pending_kv(int64_t slot, int64_t source) const;  // [(ratio−1), head_dim] of KV source `source`
  float* pending_gate(int64_t slot, int64_t source) const;

  // A device array [max_sequences] of descriptors, entry s = make(s) (e.g. the attention kernels'
  // SwaRingDesc of one layer, or KvSourceSeq of one KV source), built once: kernels index it by the
  // row's slot.
  template <typename Desc, typename Make>
  Result<DeviceBuffer<Desc>> slot_table(Make&& make) const {
    std::vector<Desc> host;
    for (int64_t s = 0; s < geometry().max_sequences; ++s) host.push_back(make(s));
    return DeviceBuffer<Desc>::from_host(host);
  }

  struct Impl;
  DeviceKvPool(DeviceKvPool&&) noexcept;
  DeviceKvPool& operator=(DeviceKvPool&&) noexcept;
  ~DeviceKvPool();

 private:
  DeviceKvPool();
  std::shared_ptr<Impl> impl_;  // shared with the sequences (a sequence keeps the pool's memory alive)
};

// One sequence's block tables and slot; releases both when destroyed. Move-only.
class DeviceKvSequence {
 public:
  DeviceKvSequence() = default;
  DeviceKvSequence(DeviceKvSequence&&) noexcept;
  DeviceKvSequence& operator=(DeviceKvSequence&&) noexcept;
  DeviceKvSequence(const DeviceKvSequence&) = delete;
  DeviceKvSequence& operator=(const DeviceKvSequence&) = delete;
  ~DeviceKvSequence();

  int64_t slot() const { return slot_; }
  int64_t positions() const { return positions_; }  // positions the tables can hold
  // Grows every stream's table to hold `positions` positions (floor(positions / ratio) entries).
  // All-or-nothing: when a pool runs out, the tables are as before and the error names the arena.
  Status ensure(int64_t positions);
  // Copies table entries added since the last upload to the device (async on `stream`; the host side
  // is pinned, so this is capturable and ordered with the step that reads them).
  Status upload_tables(cudaStream_t stream);
  // Host copy of stream s's block indices.
  const std::vector<int32_t>& blocks(int64_t s) const { return tables_[static_cast<size_t>(s)]; }

  KvStreamView stream_view(int64_t s) const;
  SwaRingView ring_view(int64_t layer) const;

 private:
  friend class DeviceKvPool;
  void release();
  std::shared_ptr<DeviceKvPool::Impl> pool_;
  int64_t slot_ = -1;
  int64_t positions_ = 0;
  std::vector<std::vector<int32_t>> tables_;  // per stream
  std::vector<size_t> uploaded_;              // per stream: entries already on the device
};

}  // namespace cedar::cuda
