#include "kv/block_pool.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace cedar {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

Result<std::shared_ptr<BlockPool>> BlockPool::create(const BlockPoolOptions& options) {
  if (options.capacity_bytes <= 0)
    return make_error("KV block pool: capacity " + str(options.capacity_bytes) + " B must be positive");
  auto pool = std::make_shared<BlockPool>(options);
  pool->stats_.capacity_bytes = options.capacity_bytes;
  return pool;
}

Result<int32_t> BlockPool::size_class(int64_t block_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (block_bytes <= 0 || block_bytes > options_.capacity_bytes)
    return make_error("KV block pool: block size " + str(block_bytes) + " B is not in (0, capacity " +
                      str(options_.capacity_bytes) + " B]");
  for (size_t c = 0; c < classes_.size(); ++c)
    if (classes_[c].bytes == block_bytes) return static_cast<int32_t>(c);
  classes_.push_back({block_bytes, {}});
  return static_cast<int32_t>(classes_.size() - 1);
}

int64_t BlockPool::class_bytes(int32_t size_class) const {
  std::lock_guard<std::mutex> lock(mu_);
  return size_class >= 0 && size_class < static_cast<int32_t>(classes_.size()) ? classes_[size_class].bytes : 0;
}

bool BlockPool::reclaim_locked(int64_t bytes, int32_t keep_class) {
  for (size_t c = 0; c < classes_.size() && reserved_bytes_ + bytes > options_.capacity_bytes; ++c) {
    if (static_cast<int32_t>(c) == keep_class) continue;
    SizeClass& sc = classes_[c];
    while (!sc.free.empty() && reserved_bytes_ + bytes > options_.capacity_bytes) {
      const BlockId id = sc.free.back();
      sc.free.pop_back();
      blocks_[static_cast<size_t>(id)].memory.reset();
      blocks_[static_cast<size_t>(id)].size_class = -1;
      spare_ids_.push_back(id);
      reserved_bytes_ -= sc.bytes;
    }
  }
  return reserved_bytes_ + bytes <= options_.capacity_bytes;
}

Result<BlockId> BlockPool::allocate(int32_t size_class) {
  std::lock_guard<std::mutex> lock(mu_);
  if (size_class < 0 || size_class >= static_cast<int32_t>(classes_.size()))
    return make_error("KV block pool: unknown size class " + str(size_class));
  SizeClass& sc = classes_[static_cast<size_t>(size_class)];
  BlockId id = -1;
  if (!sc.free.empty()) {
    id = sc.free.back();
    sc.free.pop_back();
  } else {
    if (!reclaim_locked(sc.bytes, size_class)) {
      ++stats_.failed_allocations;
      return make_error("KV block pool is full: a block of " + str(sc.bytes) + " B does not fit (capacity " +
                        str(options_.capacity_bytes) + " B, " + str(stats_.used_bytes) + " B in use)");
    }
    if (!spare_ids_.empty()) {
      id = spare_ids_.back();
      spare_ids_.pop_back();
    } else {
      if (blocks_.size() >= static_cast<size_t>(INT32_MAX))
        return make_error("KV block pool: more than 2^31 blocks");
      id = static_cast<BlockId>(blocks_.size());
      blocks_.emplace_back();
    }
    Block& b = blocks_[static_cast<size_t>(id)];
    b.size_class = size_class;
    if (!options_.dry_run) b.memory.reset(new uint8_t[static_cast<size_t>(sc.bytes)]);
    reserved_bytes_ += sc.bytes;
  }
  blocks_[static_cast<size_t>(id)].refs = 1;
  ++stats_.used_blocks;
  ++stats_.allocations;
  stats_.used_bytes += sc.bytes;
  stats_.peak_used_bytes = std::max(stats_.peak_used_bytes, stats_.used_bytes);
  return id;
}

Status BlockPool::check_in_use_locked(BlockId id, const char* op) const {
  if (id < 0 || id >= static_cast<BlockId>(blocks_.size()))
    return make_error(std::string("KV block pool: ") + op + " of unknown block " + str(id));
  if (blocks_[static_cast<size_t>(id)].refs <= 0)
    return make_error(std::string("KV block pool: ") + op + " of block " + str(id) + ", which is not in use");
  return Status::Ok();
}

Status BlockPool::retain(BlockId id) {
  std::lock_guard<std::mutex> lock(mu_);
  CEDAR_RETURN_IF_ERROR(check_in_use_locked(id, "retain"));
  ++blocks_[static_cast<size_t>(id)].refs;
  return Status::Ok();
}

Status BlockPool::release(BlockId id) {
  std::lock_guard<std::mutex> lock(mu_);
  CEDAR_RETURN_IF_ERROR(check_in_use_locked(id, "release"));
  Block& b = blocks_[static_cast<size_t>(id)];
  if (--b.refs == 0) {
    SizeClass& sc = classes_[static_cast<size_t>(b.size_class)];
    sc.free.push_back(id);
    --stats_.used_blocks;
    stats_.used_bytes -= sc.bytes;
  }
  return Status::Ok();
}

int32_t BlockPool::ref_count(BlockId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (id < 0 || id >= static_cast<BlockId>(blocks_.size())) return 0;
  return blocks_[static_cast<size_t>(id)].refs;
}

Result<int64_t> BlockPool::block_bytes(BlockId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  CEDAR_RETURN_IF_ERROR(check_in_use_locked(id, "adoption"));
  return classes_[static_cast<size_t>(blocks_[static_cast<size_t>(id)].size_class)].bytes;
}

uint8_t* BlockPool::data(BlockId id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id < 0 || id >= static_cast<BlockId>(blocks_.size()) || blocks_[static_cast<size_t>(id)].refs <= 0)
    return nullptr;
  return blocks_[static_cast<size_t>(id)].memory.get();
}

BlockPoolStats BlockPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  BlockPoolStats s = stats_;
  s.free_bytes = reserved_bytes_ - s.used_bytes;
  s.free_blocks = 0;
  for (const SizeClass& c : classes_) s.free_blocks += static_cast<int64_t>(c.free.size());
  return s;
}

// ---- BlockTable ---------------------------------------------------------------------------------

Result<BlockTable> BlockTable::create(std::shared_ptr<BlockPool> pool, int64_t record_bytes,
                                      int64_t entries_per_block) {
  if (pool == nullptr) return make_error("KV block table: no pool");
  if (record_bytes <= 0 || entries_per_block <= 0)
    return make_error("KV block table: record size " + str(record_bytes) + " B and " + str(entries_per_block) +
                      " entries per block must be positive");
  CEDAR_ASSIGN_OR_RETURN(const int32_t cls, pool->size_class(record_bytes * entries_per_block));
  BlockTable t;
  t.pool_ = std::move(pool);
  t.size_class_ = cls;
  t.record_bytes_ = record_bytes;
  t.entries_per_block_ = entries_per_block;
  return t;
}

BlockTable::BlockTable(const BlockTable& other)
    : pool_(other.pool_),
      size_class_(other.size_class_),
      record_bytes_(other.record_bytes_),
      entries_per_block_(other.entries_per_block_),
      ids_(other.ids_),
      data_(other.data_) {
  // The other table holds these blocks, so retaining them cannot fail.
  for (BlockId id : ids_) (void)pool_->retain(id);
}

BlockTable& BlockTable::operator=(const BlockTable& other) {
  if (this != &other) *this = BlockTable(other);
  return *this;
}

BlockTable::BlockTable(BlockTable&& other) noexcept
    : pool_(std::move(other.pool_)),
      size_class_(other.size_class_),
      record_bytes_(other.record_bytes_),
      entries_per_block_(other.entries_per_block_),
      ids_(std::move(other.ids_)),
      data_(std::move(other.data_)) {
  other.ids_.clear();
  other.data_.clear();
}

BlockTable& BlockTable::operator=(BlockTable&& other) noexcept {
  if (this != &other) {
    clear();
    pool_ = std::move(other.pool_);
    size_class_ = other.size_class_;
    record_bytes_ = other.record_bytes_;
    entries_per_block_ = other.entries_per_block_;
    ids_ = std::move(other.ids_);
    data_ = std::move(other.data_);
    other.ids_.clear();
    other.data_.clear();
  }
  return *this;
}

BlockTable::~BlockTable() { clear(); }

Status BlockTable::ensure(int64_t entries) {
  if (entries <= capacity()) return Status::Ok();
  if (pool_ == nullptr) return make_error("KV block table has no pool");
  const size_t before = ids_.size();
  const int64_t need = (entries + entries_per_block_ - 1) / entries_per_block_;
  while (blocks() < need) {
    Result<BlockId> id = pool_->allocate(size_class_);
    if (!id.ok()) {
      shrink(static_cast<int64_t>(before) * entries_per_block_);
      return id.error();
    }
    ids_.push_back(*id);
    data_.push_back(pool_->data(*id));
  }
  return Status::Ok();
}

Result<uint8_t*> BlockTable::writable(int64_t j) {
  const size_t b = static_cast<size_t>(j / entries_per_block_);
  if (pool_->ref_count(ids_[b]) > 1) {  // shared with another table: take a private copy first
    CEDAR_ASSIGN_OR_RETURN(const BlockId copy, pool_->allocate(size_class_));
    uint8_t* mem = pool_->data(copy);
    if (mem != nullptr) std::memcpy(mem, data_[b], static_cast<size_t>(block_bytes()));
    CEDAR_RETURN_IF_ERROR(pool_->release(ids_[b]));
    ids_[b] = copy;
    data_[b] = mem;
  }
  uint8_t* base = data_[b];
  return base == nullptr ? nullptr : base + (j % entries_per_block_) * record_bytes_;
}

Status BlockTable::adopt(std::span<const BlockId> ids) {
  if (pool_ == nullptr) return make_error("KV block table has no pool");
  if (!ids_.empty()) return make_error("KV block table: adopting blocks needs an empty table, it holds " + str(blocks()));
  for (size_t i = 0; i < ids.size(); ++i) {
    Result<int64_t> bytes = pool_->block_bytes(ids[i]);
    if (!bytes.ok())
      return bytes.error().with_context("KV block table: block " + str(static_cast<int64_t>(i)) + " to adopt");
    if (*bytes != block_bytes())
      return make_error("KV block table: block " + str(static_cast<int64_t>(i)) + " to adopt (id " + str(ids[i]) +
                        ") holds " + str(*bytes) + " B, the table's blocks " + str(block_bytes()) + " B");
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    Status st = pool_->retain(ids[i]);  // fails only if another thread freed the block meanwhile
    if (!st.ok()) {
      clear();
      return st.error().with_context("KV block table: block " + str(static_cast<int64_t>(i)) + " to adopt");
    }
    ids_.push_back(ids[i]);
    data_.push_back(pool_->data(ids[i]));
  }
  return Status::Ok();
}

void BlockTable::shrink(int64_t entries) {
  const int64_t keep = std::max<int64_t>(0, entries_per_block_ > 0 ? (entries + entries_per_block_ - 1) / entries_per_block_ : 0);
  // Held blocks are in use, so releasing them cannot fail.
  while (blocks() > keep) {
    (void)pool_->release(ids_.back());
    ids_.pop_back();
    data_.pop_back();
  }
}

}  // namespace cedar
