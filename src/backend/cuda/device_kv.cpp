// Device KV pools, block tables and rings (device_kv.h).
#include "backend/cuda/device_kv.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_buffer.h"

namespace cedar::cuda {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Result<DeviceKvGeometry> DeviceKvGeometry::create(const ModelConfig& c, const LayerPlan& plan,
                                                  const DeviceKvOptions& o) {
  if (c.arch != Arch::DeepseekV41)
    return make_error("device KV: deepseek_v41 only (config is " + std::string(arch_name(c.arch)) + ")");
  if (o.max_sequences < 1 || o.max_context < 1 || o.token_capacity < 0 || o.swa_slots < 0)
    return make_error("device KV: max_sequences and max_context must be >= 1, token_capacity and swa_slots >= 0");
  DeviceKvGeometry g;
  const KvDims dims{c.arch, c.head_dim, c.index_head_dim, c.qk_rope_head_dim};
  CEDAR_ASSIGN_OR_RETURN(const KvFormats formats, kv_formats(dims, KvStorage::Packed));
  CEDAR_ASSIGN_OR_RETURN(g.streams, global_kv_streams(plan, formats, o.tokens_per_block));
  g.layers = plan.num_layers();
  g.max_sequences = o.max_sequences;
  g.tokens_per_block = o.tokens_per_block;
  g.blocks_per_table = ceil_div(o.max_context, o.tokens_per_block);
  g.swa_slots = o.swa_slots > 0 ? o.swa_slots : c.sliding_window;
  g.swa_record_bytes = formats.swa.record_bytes();
  const int64_t capacity = o.token_capacity > 0 ? o.token_capacity : o.max_sequences * o.max_context;
  for (size_t s = 0; s < g.streams.size(); ++s) {
    const KvStreamSpec& spec = g.streams[s];
    const int64_t block_bytes = spec.entries_per_block * spec.format.record_bytes();
    int32_t a = -1;
    for (size_t i = 0; i < g.arenas.size(); ++i)
      if (g.arenas[i].block_bytes == block_bytes) a = static_cast<int32_t>(i);
    if (a < 0) {
      g.arenas.push_back({block_bytes, 0, {}});
      a = static_cast<int32_t>(g.arenas.size() - 1);
    }
    // Full blocks of the capacity's entries, plus one partial last block per live sequence.
    g.arenas[static_cast<size_t>(a)].blocks +=
        ceil_div(capacity / spec.ratio, spec.entries_per_block) + o.max_sequences;
    g.arenas[static_cast<size_t>(a)].streams.push_back(static_cast<int64_t>(s));
    g.arena_of.push_back(a);
  }
  for (const LayerRole& r : plan.layers)
    if (r.owns_compressor) {
      g.source_layers.push_back(r.layer);
      g.pending_floats = std::max(g.pending_floats, std::max<int64_t>(r.compress_ratio - 1, 0) * c.head_dim);
    }
  for (const Arena& a : g.arenas)
    if (a.blocks > INT32_MAX) return make_error("device KV: arena of " + str(a.blocks) + " blocks exceeds int32 ids");
  return g;
}

int64_t DeviceKvGeometry::blocks_for(int64_t s, int64_t positions) const {
  const KvStreamSpec& spec = streams[static_cast<size_t>(s)];
  return ceil_div(positions / spec.ratio, spec.entries_per_block);
}

int64_t DeviceKvGeometry::bytes_for(int64_t positions) const {
  int64_t bytes = 0;
  for (size_t s = 0; s < streams.size(); ++s)
    bytes += blocks_for(static_cast<int64_t>(s), positions) * arenas[static_cast<size_t>(arena_of[s])].block_bytes;
  return bytes;
}

DeviceMemoryPlan DeviceKvGeometry::memory_plan() const {
  DeviceMemoryPlan p;
  for (const Arena& a : arenas)
    p.add("kv pools", static_cast<uint64_t>(a.blocks * a.block_bytes), false, "top-k + indexer keys");
  const auto seqs = static_cast<uint64_t>(max_sequences);
  p.add("kv block tables", seqs * streams.size() * static_cast<uint64_t>(blocks_per_table) * sizeof(int32_t), false,
        "rows");
  p.add("swa rings", seqs * static_cast<uint64_t>(layers * swa_slots) * (static_cast<uint64_t>(swa_record_bytes) + 8),
        false, "window");
  p.add("compressor state", seqs * source_layers.size() * 2 * static_cast<uint64_t>(pending_floats) * sizeof(float),
        false, "rows");
  return p;
}

// The arenas, the tables' device and pinned host copies, the rings and the free lists.
struct DeviceKvPool::Impl {
  DeviceKvGeometry g;
  std::vector<DeviceBuffer<uint8_t>> arenas;
  DeviceBuffer<int32_t> tables;          // [max_sequences, streams, blocks_per_table]
  int32_t* tables_host = nullptr;        // pinned mirror
  DeviceBuffer<uint8_t> ring_records;    // [max_sequences, layers, slots, record_bytes]
  DeviceBuffer<int64_t> ring_positions;  // [max_sequences, layers, slots]
  DeviceBuffer<float> pending;           // [max_sequences, sources, 2 (kv, gate), pending_floats]
  mutable std::mutex mu;
  std::vector<std::vector<int32_t>> free_blocks;  // per arena (a stack)
  std::vector<std::vector<int32_t>> refs;         // per arena, per block
  std::vector<int64_t> free_slots;

  ~Impl() {
    if (tables_host) cudaFreeHost(tables_host);
  }
  int32_t* table_host(int64_t slot, int64_t s) {
    return tables_host + (slot * static_cast<int64_t>(g.streams.size()) + s) * g.blocks_per_table;
  }
  const int32_t* table_device(int64_t slot, int64_t s) const {
    return tables.get() + (slot * static_cast<int64_t>(g.streams.size()) + s) * g.blocks_per_table;
  }
  KvStreamView stream_view(int64_t slot, int64_t s) const;
  SwaRingView ring_view(int64_t slot, int64_t layer) const;
  float* pending_kv(int64_t slot, int64_t source) const;
  void release_blocks(int64_t arena, const std::vector<int32_t>& ids) {
    std::lock_guard<std::mutex> lock(mu);
    for (int32_t id : ids)
      if (--refs[static_cast<size_t>(arena)][static_cast<size_t>(id)] == 0)
        free_blocks[static_cast<size_t>(arena)].push_back(id);
  }
};

DeviceKvPool::DeviceKvPool() = default;
DeviceKvPool::DeviceKvPool(DeviceKvPool&&) noexcept = default;
DeviceKvPool& DeviceKvPool::operator=(DeviceKvPool&&) noexcept = default;
DeviceKvPool::~DeviceKvPool() = default;

const DeviceKvGeometry& DeviceKvPool::geometry() const { return impl_->g; }

Result<DeviceKvPool> DeviceKvPool::create(const ModelConfig& c, const LayerPlan& plan, const DeviceKvOptions& o) {
  DeviceKvPool pool;
  pool.impl_ = std::make_shared<Impl>();
  Impl& m = *pool.impl_;
  CEDAR_ASSIGN_OR_RETURN(m.g, DeviceKvGeometry::create(c, plan, o));
  const DeviceKvGeometry& g = m.g;
  for (const DeviceKvGeometry::Arena& a : g.arenas) {
    auto buf = DeviceBuffer<uint8_t>::allocate(static_cast<size_t>(a.blocks * a.block_bytes));
    if (!buf.ok())
      return buf.error().with_context("device KV arena of " + str(a.blocks) + " blocks × " + str(a.block_bytes) + " B");
    m.arenas.push_back(std::move(*buf));
    std::vector<int32_t> free(static_cast<size_t>(a.blocks));
    for (int64_t b = 0; b < a.blocks; ++b) free[static_cast<size_t>(b)] = static_cast<int32_t>(a.blocks - 1 - b);
    m.free_blocks.push_back(std::move(free));  // pops give 0, 1, 2, ...
    m.refs.emplace_back(static_cast<size_t>(a.blocks), 0);
  }
  const auto table_entries =
      static_cast<size_t>(g.max_sequences) * g.streams.size() * static_cast<size_t>(g.blocks_per_table);
  CEDAR_ASSIGN_OR_RETURN(m.tables, DeviceBuffer<int32_t>::allocate(std::max<size_t>(table_entries, 1)));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&m.tables_host),
                                           std::max<size_t>(table_entries, 1) * sizeof(int32_t), cudaHostAllocDefault));
  std::fill(m.tables_host, m.tables_host + table_entries, 0);
  CEDAR_RETURN_IF_ERROR(m.tables.zero());
  const auto ring_slots = static_cast<size_t>(g.max_sequences * g.layers * g.swa_slots);
  CEDAR_ASSIGN_OR_RETURN(m.ring_records,
                         DeviceBuffer<uint8_t>::allocate(ring_slots * static_cast<size_t>(g.swa_record_bytes)));
  CEDAR_ASSIGN_OR_RETURN(m.ring_positions, DeviceBuffer<int64_t>::allocate(ring_slots));
  CEDAR_ASSIGN_OR_RETURN(m.pending, DeviceBuffer<float>::allocate(
                                        std::max<size_t>(static_cast<size_t>(g.max_sequences) * g.source_layers.size() *
                                                             2 * static_cast<size_t>(g.pending_floats),
                                                         1)));
  for (int64_t s = g.max_sequences - 1; s >= 0; --s) m.free_slots.push_back(s);
  return pool;
}

Result<DeviceKvSequence> DeviceKvPool::new_sequence(cudaStream_t stream) {
  Impl& m = *impl_;
  int64_t slot = -1;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.free_slots.empty())
      return make_error("device KV: all " + str(m.g.max_sequences) + " sequence slots are in use");
    slot = m.free_slots.back();
    m.free_slots.pop_back();
  }
  DeviceKvSequence seq;
  seq.pool_ = impl_;
  seq.slot_ = slot;
  seq.tables_.assign(m.g.streams.size(), {});
  seq.uploaded_.assign(m.g.streams.size(), 0);
  const DeviceKvGeometry& g = m.g;
  const auto per_slot = static_cast<size_t>(g.layers * g.swa_slots);
  // −1 in every position (all bytes 0xFF), zero compressor state.
  Status st = cuda_status(cudaMemsetAsync(m.ring_positions.get() + static_cast<size_t>(slot) * per_slot, 0xFF,
                                          per_slot * sizeof(int64_t), stream),
                          "cudaMemsetAsync(ring positions)");
  const size_t pending = g.source_layers.size() * 2 * static_cast<size_t>(g.pending_floats);
  if (st.ok() && pending > 0)
    st = cuda_status(
        cudaMemsetAsync(m.pending.get() + static_cast<size_t>(slot) * pending, 0, pending * sizeof(float), stream),
        "cudaMemsetAsync(compressor state)");
  if (!st.ok()) return st.error();  // seq's destructor gives the slot back
  return seq;
}

Status DeviceKvPool::copy_sequence(const DeviceKvSequence& from, DeviceKvSequence& to, cudaStream_t stream) {
  Impl& m = *impl_;
  if (from.pool_.get() != &m || to.pool_.get() != &m) return make_error("device KV copy: sequences of another pool");
  if (from.slot_ == to.slot_) return make_error("device KV copy: source and destination are the same slot");
  CEDAR_RETURN_IF_ERROR(to.ensure(from.positions_));
  const DeviceKvGeometry& g = m.g;
  for (size_t s = 0; s < g.streams.size(); ++s) {
    const auto a = static_cast<size_t>(g.arena_of[s]);
    const int64_t bb = g.arenas[a].block_bytes;
    uint8_t* arena = m.arenas[a].get();
    for (size_t j = 0; j < from.tables_[s].size(); ++j)
      CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(arena + static_cast<int64_t>(to.tables_[s][j]) * bb,
                                                 arena + static_cast<int64_t>(from.tables_[s][j]) * bb,
                                                 static_cast<size_t>(bb), cudaMemcpyDeviceToDevice, stream));
  }
  const auto per_slot = static_cast<size_t>(g.layers * g.swa_slots);
  CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.ring_records.get() + to.slot_ * per_slot * g.swa_record_bytes,
                                             m.ring_records.get() + from.slot_ * per_slot * g.swa_record_bytes,
                                             per_slot * static_cast<size_t>(g.swa_record_bytes),
                                             cudaMemcpyDeviceToDevice, stream));
  CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.ring_positions.get() + to.slot_ * per_slot,
                                             m.ring_positions.get() + from.slot_ * per_slot, per_slot * sizeof(int64_t),
                                             cudaMemcpyDeviceToDevice, stream));
  const size_t pending = g.source_layers.size() * 2 * static_cast<size_t>(g.pending_floats);
  if (pending > 0)
    CEDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.pending.get() + to.slot_ * pending,
                                               m.pending.get() + from.slot_ * pending, pending * sizeof(float),
                                               cudaMemcpyDeviceToDevice, stream));
  return to.upload_tables(stream);
}

DeviceKvPool::Stats DeviceKvPool::stats() const {
  const Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  Stats s;
  for (size_t a = 0; a < m.g.arenas.size(); ++a) {
    const int64_t free = static_cast<int64_t>(m.free_blocks[a].size());
    const int64_t used = m.g.arenas[a].blocks - free;
    s.used_blocks += used;
    s.free_blocks += free;
    s.used_bytes += used * m.g.arenas[a].block_bytes;
    s.capacity_bytes += m.g.arenas[a].blocks * m.g.arenas[a].block_bytes;
  }
  s.live_sequences = m.g.max_sequences - static_cast<int64_t>(m.free_slots.size());
  return s;
}

DeviceKvSequence::DeviceKvSequence(DeviceKvSequence&& o) noexcept
    : pool_(std::move(o.pool_)),
      slot_(std::exchange(o.slot_, -1)),
      positions_(std::exchange(o.positions_, 0)),
      tables_(std::move(o.tables_)),
      uploaded_(std::move(o.uploaded_)) {}

DeviceKvSequence& DeviceKvSequence::operator=(DeviceKvSequence&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = std::move(o.pool_);
    slot_ = std::exchange(o.slot_, -1);
    positions_ = std::exchange(o.positions_, 0);
    tables_ = std::move(o.tables_);
    uploaded_ = std::move(o.uploaded_);
  }
  return *this;
}

DeviceKvSequence::~DeviceKvSequence() { release(); }

void DeviceKvSequence::release() {
  if (!pool_) return;
  DeviceKvPool::Impl& m = *pool_;
  for (size_t s = 0; s < tables_.size(); ++s) m.release_blocks(m.g.arena_of[s], tables_[s]);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (slot_ >= 0) m.free_slots.push_back(slot_);
  }
  tables_.clear();
  pool_.reset();
  slot_ = -1;
  positions_ = 0;
}

Status DeviceKvSequence::ensure(int64_t positions) {
  if (!pool_) return make_error("device KV sequence: not attached to a pool");
  DeviceKvPool::Impl& m = *pool_;
  const DeviceKvGeometry& g = m.g;
  if (positions <= positions_) return Status::Ok();
  if (ceil_div(positions, g.tokens_per_block) > g.blocks_per_table)
    return make_error("device KV: " + str(positions) + " positions exceed the block tables' " +
                      str(g.blocks_per_table * g.tokens_per_block) + " (max_context)");
  // Count first, then take: all-or-nothing.
  std::vector<int64_t> need(g.arenas.size(), 0);
  for (size_t s = 0; s < g.streams.size(); ++s)
    need[static_cast<size_t>(g.arena_of[s])] +=
        g.blocks_for(static_cast<int64_t>(s), positions) - static_cast<int64_t>(tables_[s].size());
  std::lock_guard<std::mutex> lock(m.mu);
  for (size_t a = 0; a < g.arenas.size(); ++a)
    if (need[a] > static_cast<int64_t>(m.free_blocks[a].size()))
      return make_error("device KV: arena " + str(static_cast<int64_t>(a)) + " (" + str(g.arenas[a].block_bytes) +
                        " B blocks) has " + str(static_cast<int64_t>(m.free_blocks[a].size())) + " free blocks, " +
                        str(need[a]) + " needed to grow sequence slot " + str(slot_) + " to " + str(positions) +
                        " positions");
  for (size_t s = 0; s < g.streams.size(); ++s) {
    const auto a = static_cast<size_t>(g.arena_of[s]);
    const int64_t want = g.blocks_for(static_cast<int64_t>(s), positions);
    while (static_cast<int64_t>(tables_[s].size()) < want) {
      const int32_t id = m.free_blocks[a].back();
      m.free_blocks[a].pop_back();
      m.refs[a][static_cast<size_t>(id)] = 1;
      m.table_host(slot_, static_cast<int64_t>(s))[tables_[s].size()] = id;
      tables_[s].push_back(id);
    }
  }
  positions_ = positions;
  return Status::Ok();
}

Status DeviceKvSequence::upload_tables(cudaStream_t stream) {
  if (!pool_) return make_error("device KV sequence: not attached to a pool");
  DeviceKvPool::Impl& m = *pool_;
  for (size_t s = 0; s < tables_.size(); ++s) {
    const size_t from = uploaded_[s], to = tables_[s].size();
    if (to <= from) continue;
    const int32_t* src = m.table_host(slot_, static_cast<int64_t>(s)) + from;
    int32_t* dst = const_cast<int32_t*>(m.table_device(slot_, static_cast<int64_t>(s))) + from;
    CEDAR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, (to - from) * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    uploaded_[s] = to;
  }
  return Status::Ok();
}

KvStreamView DeviceKvPool::Impl::stream_view(int64_t slot, int64_t s) const {
  const KvStreamSpec& spec = g.streams[static_cast<size_t>(s)];
  const auto a = static_cast<size_t>(g.arena_of[static_cast<size_t>(s)]);
  KvStreamView v;
  v.pool = const_cast<uint8_t*>(arenas[a].get());
  v.block_table = table_device(slot, s);
  v.block_bytes = g.arenas[a].block_bytes;
  v.entries_per_block = spec.entries_per_block;
  v.record_bytes = spec.format.record_bytes();
  v.ratio = spec.ratio;
  return v;
}

SwaRingView DeviceKvPool::Impl::ring_view(int64_t slot, int64_t layer) const {
  const int64_t ring = slot * g.layers + layer;
  SwaRingView v;
  v.records = const_cast<uint8_t*>(ring_records.get()) + ring * g.swa_slots * g.swa_record_bytes;
  v.positions = const_cast<int64_t*>(ring_positions.get()) + ring * g.swa_slots;
  v.slots = g.swa_slots;
  v.record_bytes = g.swa_record_bytes;
  return v;
}

float* DeviceKvPool::Impl::pending_kv(int64_t slot, int64_t source) const {
  const auto sources = static_cast<int64_t>(g.source_layers.size());
  return const_cast<float*>(pending.get()) + (slot * sources + source) * 2 * g.pending_floats;
}

KvStreamView DeviceKvPool::stream_view(int64_t slot, int64_t s) const { return impl_->stream_view(slot, s); }
SwaRingView DeviceKvPool::ring_view(int64_t slot, int64_t layer) const { return impl_->ring_view(slot, layer); }
float* DeviceKvPool::pending_kv(int64_t slot, int64_t source) const { return impl_->pending_kv(slot, source); }
float* DeviceKvPool::pending_gate(int64_t slot, int64_t source) const {
  return impl_->pending_kv(slot, source) + impl_->g.pending_floats;
}

KvStreamView DeviceKvSequence::stream_view(int64_t s) const { return pool_->stream_view(slot_, s); }
SwaRingView DeviceKvSequence::ring_view(int64_t layer) const { return pool_->ring_view(slot_, layer); }

}  // namespace cedar::cuda
