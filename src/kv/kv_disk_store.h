// The SSD tier of the prefix cache (issue 6): prefix-cache blocks (prefix_block_store.h) kept as one
// file per block in a cache directory, under a size budget, found again after a restart.
//
// Directory: DIR/<h0h1>/<32 hex digits of the key>.kvb (fanned out by the key's first byte, so no
// directory holds more than 1/256 of the files), plus DIR/lock, flock()ed while a store has the
// directory open: one process owns a cache directory at a time.
//
// File format, version 1, little-endian (kv_disk_file_layout gives the sizes):
//    0   8  magic "CEDARKVB"
//    8   4  format version (1)
//   12   4  header bytes H (everything before the records; a multiple of 8)
//   16   8  record bytes P (Σ streams entries_per_block × record_bytes)
//   24  16  key (hi, lo)            40  16  parent key (hi, lo)
//   56   4  tokens per block T      60   4  streams S
//   64   4  flags (bit 0: exact; other bits zero)
//   68   4  fingerprint bytes F     72   F  model fingerprint (model_fingerprint(), hex)
//   ..  8S  per stream: record_bytes u32, entries_per_block u32 (global_kv_streams order)
//   ..  8T  the block's tokens (int64)
//   ..      zero padding to H
//    H   P  the records of every stream, back to back, in stream order
//  H+P   4  CRC-32C (core/checksum.h) of bytes [0, H + P)
// A file is used only if all of it checks: size == H + P + 4, magic, version, H and P equal to what
// this store's fingerprint and layout give, fingerprint, layout, flags, the key equals the file name's
// and prefix_chain(parent, tokens) (prefix_hash.h), and the checksum. Anything else — a truncated or
// bit-flipped file, a file of another model or layout, a foreign file under a block's name — is logged,
// deleted, counted in `corrupt`, and get() returns nullopt (the caller recomputes). Files are validated
// when read (get), not when the directory is opened, so opening a large cache costs one stat per file.
//
// Writes go through io::AtomicFile (temporary file in the same directory, fsync, rename, directory
// fsync): a crash leaves the old file or the new one, and at worst a `.<name>.tmp.XXXXXX` file, which
// open() deletes (the lock guarantees no other live store is writing it).
//
// Budget: Σ file sizes (st_size) of the blocks stays at or below budget_bytes; past it, the least
// recently used files are deleted. Access order is kept in memory and mirrored in the files' mtimes:
// put and every hit set the file's mtime to a store clock (nanoseconds, wall time, strictly increasing
// within a store and continuing from the newest mtime found at open), and open() orders the files by
// mtime (ties by name). The mtime is written with the file itself and moves with it, so no separate
// index file can disagree with the directory after a crash; atime is not used (noatime/relatime mounts).
//
// Thread safety: every method may be called from any thread concurrently. Reads (get) run without a
// lock; renames and deletions are serialized by one mutex, so a damaged file is deleted only if it is
// still the file that was read (a concurrent put's replacement survives).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/kv_layout.h"
#include "kv/prefix_block_store.h"

namespace cedar {

struct KvDiskStreamLayout {
  int64_t record_bytes = 0, entries_per_block = 0;
  int64_t block_bytes() const { return record_bytes * entries_per_block; }
  bool operator==(const KvDiskStreamLayout&) const = default;
};

// What every block of a store holds: the global-KV streams (global_kv_streams order) and the block span.
struct KvDiskLayout {
  int64_t tokens_per_block = 0;
  std::vector<KvDiskStreamLayout> streams;
  int64_t record_bytes() const;  // P: Σ stream block bytes
  bool operator==(const KvDiskLayout&) const = default;
};
KvDiskLayout kv_disk_layout(std::span<const KvStreamSpec> streams, int64_t tokens_per_block);
// The layout of a model's packed global-KV streams (what the engine's shared block pool holds).
Result<KvDiskLayout> kv_disk_layout_for(const ModelConfig& config, const LayerPlan& plan, int64_t tokens_per_block);

struct KvDiskFileLayout {
  int64_t header_bytes = 0;  // H
  int64_t record_bytes = 0;  // P
  int64_t file_bytes = 0;    // H + P + 4
};
KvDiskFileLayout kv_disk_file_layout(const KvDiskLayout& layout, std::string_view model_fingerprint);

struct KvDiskStoreOptions {
  std::filesystem::path dir;      // created when missing
  int64_t budget_bytes = 0;       // > 0
  std::string model_fingerprint;  // model_fingerprint(model dir); non-empty, at most 1024 bytes
  KvDiskLayout layout;
  // One line per event worth a user's attention (damaged files, evictions at open, stale temporary
  // files); null: "cedar: <line>" on stderr.
  std::function<void(const std::string&)> log;
};

struct KvDiskStoreStats {
  int64_t files = 0, bytes = 0, budget_bytes = 0;  // blocks on disk now, Σ their file sizes
  int64_t puts = 0, put_errors = 0;
  int64_t puts_skipped = 0;                // puts of a block already stored (as exact, or approximate again)
  int64_t gets = 0, hits = 0, misses = 0;  // misses include corrupt files
  int64_t corrupt = 0;                     // files found damaged or foreign by get(), deleted
  int64_t evictions = 0;                   // files deleted for the budget
  int64_t bytes_read = 0, bytes_written = 0;
  int64_t stale_temp_files = 0;  // leftovers of interrupted writes deleted by open()
  int64_t foreign_files = 0;     // other files in the directory at open: never read, never deleted
};

class KvDiskStore final : public PrefixBlockStore {
 public:
  static Result<std::unique_ptr<KvDiskStore>> open(const KvDiskStoreOptions& options);
  ~KvDiskStore() override;
  KvDiskStore(const KvDiskStore&) = delete;
  KvDiskStore& operator=(const KvDiskStore&) = delete;

  // Errors: a block that does not match the layout, a file larger than the budget, I/O failures.
  // A block already stored with the same key is not written again (it only becomes the most recently
  // used), except that an exact copy replaces one that is approximate or not read since open().
  Status put(const StoredPrefixBlock& block) override;
  std::optional<StoredPrefixBlock> get(const PrefixKey& key) override;
  bool contains(const PrefixKey& key) const override;

  KvDiskStoreStats stats() const;
  const KvDiskStoreOptions& options() const { return options_; }
  const KvDiskFileLayout& file_layout() const { return file_layout_; }
  // Where the block of `key` lives (whether or not it exists).
  std::filesystem::path path_of(const PrefixKey& key) const;

 private:
  struct Entry {
    int64_t bytes = 0;
    std::list<PrefixKey>::iterator lru;  // position in lru_ (front = most recently used)
    int exact = -1;                      // the file's exact flag: -1 not known yet (found at open), 0, 1
  };
  KvDiskStore(const KvDiskStoreOptions& options, int lock_fd);
  Status scan();
  void log(const std::string& line) const;
  int64_t next_stamp_locked();
  void touch_locked(const PrefixKey& key, int64_t bytes, int exact);  // insert or move to the front
  void erase_locked(const PrefixKey& key);
  void evict_locked(const PrefixKey* keep);  // needs files_mu_ and mu_
  // Drops a damaged file: deleted if `path` still names the inode that was read.
  void drop_damaged(const PrefixKey& key, const std::string& reason, int fd);
  std::optional<StoredPrefixBlock> read_block(const PrefixKey& key, int fd, std::string& reason);

  KvDiskStoreOptions options_;
  KvDiskFileLayout file_layout_;
  int lock_fd_ = -1;
  std::mutex files_mu_;    // renames and deletions in the directory; taken before mu_
  mutable std::mutex mu_;  // the fields below
  std::list<PrefixKey> lru_;
  std::unordered_map<PrefixKey, Entry, PrefixKeyHash> entries_;
  int64_t last_stamp_ = 0;  // ns
  KvDiskStoreStats stats_;
  std::vector<bool> subdir_made_ = std::vector<bool>(256, false);
};

}  // namespace cedar
