// KvDiskStore: encoding, validation and the LRU bookkeeping of the prefix cache's SSD tier.
#include "kv/kv_disk_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <system_error>

#include "core/checksum.h"
#include "io/atomic_file.h"

namespace cedar {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'C', 'E', 'D', 'A', 'R', 'K', 'V', 'B'};
constexpr uint32_t kVersion = 1;
constexpr int64_t kFixedHeaderBytes = 72;
constexpr size_t kMaxFingerprintBytes = 1024;
constexpr const char* kSuffix = ".kvb";
constexpr uint32_t kFlagExact = 1;

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

int64_t round_up8(int64_t n) { return (n + 7) / 8 * 8; }

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}
timespec to_timespec(int64_t ns) { return timespec{static_cast<time_t>(ns / 1'000'000'000), ns % 1'000'000'000}; }
int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}
std::optional<PrefixKey> key_from_hex(std::string_view hex) {
  if (hex.size() != 32 || !is_hex(hex)) return std::nullopt;
  PrefixKey k;
  for (size_t i = 0; i < 32; ++i) {
    const uint64_t d = static_cast<uint64_t>(hex[i] <= '9' ? hex[i] - '0' : hex[i] - 'a' + 10);
    uint64_t& lane = i < 16 ? k.hi : k.lo;
    lane = (lane << 4) | d;
  }
  return k;
}

// The whole file image of a block (header, records, checksum).
std::vector<uint8_t> encode_block(const StoredPrefixBlock& b, const KvDiskLayout& layout, std::string_view fingerprint,
                                  const KvDiskFileLayout& fl) {
  std::vector<uint8_t> out(static_cast<size_t>(fl.file_bytes), 0);
  uint8_t* p = out.data();
  std::memcpy(p, kMagic, 8);
  put_u32(p + 8, kVersion);
  put_u32(p + 12, static_cast<uint32_t>(fl.header_bytes));
  put_u64(p + 16, static_cast<uint64_t>(fl.record_bytes));
  put_u64(p + 24, b.key.hi);
  put_u64(p + 32, b.key.lo);
  put_u64(p + 40, b.parent.hi);
  put_u64(p + 48, b.parent.lo);
  put_u32(p + 56, static_cast<uint32_t>(layout.tokens_per_block));
  put_u32(p + 60, static_cast<uint32_t>(layout.streams.size()));
  put_u32(p + 64, b.exact ? kFlagExact : 0);
  put_u32(p + 68, static_cast<uint32_t>(fingerprint.size()));
  size_t at = kFixedHeaderBytes;
  std::memcpy(p + at, fingerprint.data(), fingerprint.size());
  at += fingerprint.size();
  for (const KvDiskStreamLayout& s : layout.streams) {
    put_u32(p + at, static_cast<uint32_t>(s.record_bytes));
    put_u32(p + at + 4, static_cast<uint32_t>(s.entries_per_block));
    at += 8;
  }
  for (int64_t t : b.tokens) {
    put_u64(p + at, static_cast<uint64_t>(t));
    at += 8;
  }
  at = static_cast<size_t>(fl.header_bytes);
  for (const auto& s : b.streams) {
    std::memcpy(p + at, s.data(), s.size());
    at += s.size();
  }
  put_u32(p + at, crc32c(std::span<const uint8_t>(p, at)));
  return out;
}

// Reads exactly the iovecs' bytes at `offset` (retrying short reads); false on EOF or error.
bool preadv_all(int fd, std::vector<iovec> iov, off_t offset) {
  size_t first = 0;
  while (first < iov.size()) {
    const ssize_t n =
        ::preadv(fd, iov.data() + first, static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX)), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    offset += n;
    size_t left = static_cast<size_t>(n);
    while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (left > 0) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
    while (first < iov.size() && iov[first].iov_len == 0) ++first;
  }
  return true;
}

}  // namespace

int64_t KvDiskLayout::record_bytes() const {
  int64_t total = 0;
  for (const KvDiskStreamLayout& s : streams) total += s.block_bytes();
  return total;
}

KvDiskLayout kv_disk_layout(std::span<const KvStreamSpec> streams, int64_t tokens_per_block) {
  KvDiskLayout layout;
  layout.tokens_per_block = tokens_per_block;
  for (const KvStreamSpec& s : streams) layout.streams.push_back({s.format.record_bytes(), s.entries_per_block});
  return layout;
}

Result<KvDiskLayout> kv_disk_layout_for(const ModelConfig& config, const LayerPlan& plan, int64_t tokens_per_block) {
  const KvDims dims{config.arch, config.head_dim, config.index_head_dim, config.qk_rope_head_dim};
  CEDAR_ASSIGN_OR_RETURN(const KvFormats formats, kv_formats(dims, KvStorage::Packed));
  CEDAR_ASSIGN_OR_RETURN(const std::vector<KvStreamSpec> specs, global_kv_streams(plan, formats, tokens_per_block));
  return kv_disk_layout(specs, tokens_per_block);
}

KvDiskFileLayout kv_disk_file_layout(const KvDiskLayout& layout, std::string_view model_fingerprint) {
  KvDiskFileLayout fl;
  fl.header_bytes = round_up8(kFixedHeaderBytes + static_cast<int64_t>(model_fingerprint.size()) +
                              8 * static_cast<int64_t>(layout.streams.size()) + 8 * layout.tokens_per_block);
  fl.record_bytes = layout.record_bytes();
  fl.file_bytes = fl.header_bytes + fl.record_bytes + 4;
  return fl;
}

Result<std::unique_ptr<KvDiskStore>> KvDiskStore::open(const KvDiskStoreOptions& options) {
  const std::string where = "kv cache dir " + options.dir.string();
  if (options.dir.empty()) return make_error("kv cache dir: no directory given");
  if (options.budget_bytes <= 0)
    return make_error(where + ": the size budget must be positive (got " + std::to_string(options.budget_bytes) + ")");
  if (options.model_fingerprint.empty() || options.model_fingerprint.size() > kMaxFingerprintBytes)
    return make_error(where + ": the model fingerprint must be 1 to " + std::to_string(kMaxFingerprintBytes) +
                      " bytes (got " + std::to_string(options.model_fingerprint.size()) + ")");
  const KvDiskLayout& layout = options.layout;
  if (layout.tokens_per_block <= 0 || layout.tokens_per_block > (1 << 20) || layout.streams.empty() ||
      layout.streams.size() > 4096)
    return make_error(where + ": invalid layout (" + std::to_string(layout.tokens_per_block) + " tokens per block, " +
                      std::to_string(layout.streams.size()) + " streams)");
  for (size_t i = 0; i < layout.streams.size(); ++i) {
    const KvDiskStreamLayout& s = layout.streams[i];
    if (s.record_bytes <= 0 || s.entries_per_block <= 0 || s.record_bytes > UINT32_MAX ||
        s.entries_per_block > UINT32_MAX || s.block_bytes() > (int64_t{1} << 32))
      return make_error(where + ": invalid layout: stream " + std::to_string(i) + " has " +
                        std::to_string(s.entries_per_block) + " records of " + std::to_string(s.record_bytes) +
                        " bytes per block");
  }
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec || !fs::is_directory(options.dir, ec))
    return make_error(where + ": cannot create the directory" + (ec ? ": " + ec.message() : std::string()));
  const fs::path lock_path = options.dir / "lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return make_error(where + ": cannot open " + lock_path.string() + ": " + errno_text(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK)
      return make_error(where + " is in use by another kv cache (" + lock_path.string() +
                        " is locked); give each server its own directory");
    return make_error(where + ": cannot lock " + lock_path.string() + ": " + errno_text(err));
  }
  std::unique_ptr<KvDiskStore> store(new KvDiskStore(options, fd));
  CEDAR_RETURN_IF_ERROR(store->scan());
  return store;
}

KvDiskStore::KvDiskStore(const KvDiskStoreOptions& options, int lock_fd)
    : options_(options),
      file_layout_(kv_disk_file_layout(options.layout, options.model_fingerprint)),
      lock_fd_(lock_fd) {
  stats_.budget_bytes = options.budget_bytes;
}

KvDiskStore::~KvDiskStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

void KvDiskStore::log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::fprintf(stderr, "cedar: %s\n", line.c_str());
  }
}

fs::path KvDiskStore::path_of(const PrefixKey& key) const {
  const std::string hex = key.hex();
  return options_.dir / hex.substr(0, 2) / (hex + kSuffix);
}

Status KvDiskStore::scan() {
  struct Found {
    PrefixKey key;
    int64_t bytes, mtime;
    std::string name;
  };
  std::vector<Found> found;
  std::error_code ec;
  for (fs::directory_iterator top(options_.dir, ec), end; !ec && top != end; top.increment(ec)) {
    const std::string sub = top->path().filename().string();
    if (sub == "lock") continue;
    std::error_code type_ec;
    if (!(sub.size() == 2 && is_hex(sub) && top->is_directory(type_ec))) {
      ++stats_.foreign_files;
      continue;
    }
    subdir_made_[std::stoul(sub, nullptr, 16)] = true;
    std::error_code sub_ec;
    for (fs::directory_iterator it(top->path(), sub_ec), e; !sub_ec && it != e; it.increment(sub_ec)) {
      const std::string name = it->path().filename().string();
      struct stat st {};
      if (::lstat(it->path().c_str(), &st) != 0) continue;  // vanished
      if (name.starts_with(".") && name.find(".tmp.") != std::string::npos && S_ISREG(st.st_mode)) {
        std::error_code rm;
        fs::remove(it->path(), rm);
        ++stats_.stale_temp_files;
        continue;
      }
      std::optional<PrefixKey> key;
      if (name.size() == 32 + std::strlen(kSuffix) && name.ends_with(kSuffix) && name.starts_with(sub))
        key = key_from_hex(std::string_view(name).substr(0, 32));
      if (!key || !S_ISREG(st.st_mode)) {
        ++stats_.foreign_files;
        continue;
      }
      found.push_back({*key, static_cast<int64_t>(st.st_size), mtime_ns(st), name});
    }
    if (sub_ec)
      return make_error("kv cache dir " + options_.dir.string() + ": cannot list " + sub + ": " + sub_ec.message());
  }
  if (ec) return make_error("kv cache dir " + options_.dir.string() + ": cannot list: " + ec.message());
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime != b.mtime ? a.mtime < b.mtime : a.name < b.name; });
  std::unique_lock files(files_mu_);
  std::unique_lock lock(mu_);
  for (const Found& f : found) {
    touch_locked(f.key, f.bytes, -1);  // oldest first, so the newest ends at the front
    last_stamp_ = std::max(last_stamp_, f.mtime);
  }
  const int64_t evicted_before = stats_.evictions;
  evict_locked(nullptr);
  std::string line = "kv cache dir " + options_.dir.string() + ": " + std::to_string(stats_.files) + " blocks, " +
                     std::to_string(stats_.bytes) + " bytes (budget " + std::to_string(options_.budget_bytes) + ")";
  if (stats_.evictions > evicted_before)
    line += ", evicted " + std::to_string(stats_.evictions - evicted_before) + " over the budget";
  if (stats_.stale_temp_files > 0)
    line += ", deleted " + std::to_string(stats_.stale_temp_files) + " temporary files of interrupted writes";
  if (stats_.foreign_files > 0) line += ", ignored " + std::to_string(stats_.foreign_files) + " other files";
  lock.unlock();
  files.unlock();
  log(line);
  return Status::Ok();
}

int64_t KvDiskStore::next_stamp_locked() {
  last_stamp_ = std::max(now_ns(), last_stamp_ + 1);
  return last_stamp_;
}

void KvDiskStore::touch_locked(const PrefixKey& key, int64_t bytes, int exact) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    lru_.push_front(key);
    entries_.emplace(key, Entry{bytes, lru_.begin(), exact});
    ++stats_.files;
    stats_.bytes += bytes;
    return;
  }
  stats_.bytes += bytes - it->second.bytes;
  it->second.bytes = bytes;
  it->second.exact = exact;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
}

void KvDiskStore::erase_locked(const PrefixKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  stats_.bytes -= it->second.bytes;
  --stats_.files;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

void KvDiskStore::evict_locked(const PrefixKey* keep) {
  while (stats_.bytes > options_.budget_bytes && !lru_.empty()) {
    const PrefixKey victim = lru_.back();
    if (keep != nullptr && victim == *keep) break;  // the only file left is the one just written
    std::error_code ec;
    fs::remove(path_of(victim), ec);
    erase_locked(victim);
    ++stats_.evictions;
  }
}

Status KvDiskStore::put(const StoredPrefixBlock& block) {
  const KvDiskLayout& layout = options_.layout;
  auto fail = [&](std::string message) -> Status {
    std::lock_guard lock(mu_);
    ++stats_.put_errors;
    return make_error("kv cache dir " + options_.dir.string() + ": cannot store block " + block.key.hex() + ": " +
                      message);
  };
  if (static_cast<int64_t>(block.tokens.size()) != layout.tokens_per_block)
    return fail(std::to_string(block.tokens.size()) + " tokens, the layout has " +
                std::to_string(layout.tokens_per_block) + " per block");
  if (block.streams.size() != layout.streams.size())
    return fail(std::to_string(block.streams.size()) + " streams, the layout has " +
                std::to_string(layout.streams.size()));
  for (size_t i = 0; i < layout.streams.size(); ++i)
    if (static_cast<int64_t>(block.streams[i].size()) != layout.streams[i].block_bytes())
      return fail("stream " + std::to_string(i) + " has " + std::to_string(block.streams[i].size()) +
                  " bytes, the layout has " + std::to_string(layout.streams[i].block_bytes()));
  if (file_layout_.file_bytes > options_.budget_bytes)
    return fail("a block file is " + std::to_string(file_layout_.file_bytes) + " bytes, more than the budget of " +
                std::to_string(options_.budget_bytes));

  const fs::path path = path_of(block.key);
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(block.key);
    if (it != entries_.end() && (it->second.exact == 1 || !block.exact)) {
      // Same key, same prefix: the stored copy is as good (an approximate copy never replaces a file
      // that may be exact). Only its recency changes.
      const timespec t = to_timespec(next_stamp_locked());
      const timespec times[2] = {t, t};
      ::utimensat(AT_FDCWD, path.c_str(), times, 0);
      touch_locked(block.key, it->second.bytes, it->second.exact);
      ++stats_.puts_skipped;
      return Status::Ok();
    }
  }
  const std::vector<uint8_t> image = encode_block(block, layout, options_.model_fingerprint, file_layout_);
  const size_t sub = static_cast<size_t>(block.key.hi >> 56);
  bool made;
  {
    std::lock_guard lock(mu_);
    made = subdir_made_[sub];
  }
  if (!made) {
    std::error_code ec;
    fs::create_directory(path.parent_path(), ec);
    if (ec) return fail("cannot create " + path.parent_path().string() + ": " + ec.message());
    std::lock_guard lock(mu_);
    subdir_made_[sub] = true;
  }
  auto file = io::AtomicFile::create(path);
  if (!file.ok()) return fail(file.error().message);
  if (Status s = file->append(image); !s.ok()) return fail(s.error().message);

  std::lock_guard files(files_mu_);
  if (Status s = file->commit(); !s.ok()) return fail(s.error().message);
  std::lock_guard lock(mu_);
  const timespec t = to_timespec(next_stamp_locked());
  const timespec times[2] = {t, t};
  ::utimensat(AT_FDCWD, path.c_str(), times, 0);  // best effort: without it the order is the write time's
  touch_locked(block.key, file_layout_.file_bytes, block.exact ? 1 : 0);
  ++stats_.puts;
  stats_.bytes_written += file_layout_.file_bytes;
  evict_locked(&block.key);
  return Status::Ok();
}

std::optional<StoredPrefixBlock> KvDiskStore::read_block(const PrefixKey& key, int fd, std::string& reason) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    reason = "cannot stat: " + errno_text(errno);
    return std::nullopt;
  }
  const int64_t size = st.st_size;
  const KvDiskFileLayout& fl = file_layout_;
  const KvDiskLayout& layout = options_.layout;
  const std::string& fingerprint = options_.model_fingerprint;
  std::vector<uint8_t> header(static_cast<size_t>(std::min<int64_t>(size, fl.header_bytes)));
  if (!header.empty() && !preadv_all(fd, {iovec{header.data(), header.size()}}, 0)) {
    reason = "cannot read the header";
    return std::nullopt;
  }
  const uint8_t* h = header.data();
  if (size < kFixedHeaderBytes) {
    reason = "truncated: " + std::to_string(size) + " bytes, shorter than a header";
    return std::nullopt;
  }
  if (std::memcmp(h, kMagic, 8) != 0) {
    reason = "not a cedar kv block (bad magic)";
    return std::nullopt;
  }
  if (get_u32(h + 8) != kVersion) {
    reason =
        "format version " + std::to_string(get_u32(h + 8)) + ", this build reads version " + std::to_string(kVersion);
    return std::nullopt;
  }
  const uint32_t file_fp_len = get_u32(h + 68);
  if (file_fp_len == fingerprint.size() && size < kFixedHeaderBytes + static_cast<int64_t>(file_fp_len)) {
    reason = "truncated: " + std::to_string(size) + " bytes, inside the fingerprint";
    return std::nullopt;
  }
  if (file_fp_len != fingerprint.size() ||
      std::memcmp(h + kFixedHeaderBytes, fingerprint.data(), fingerprint.size()) != 0) {
    reason = "written for another model (fingerprint differs)";
    return std::nullopt;
  }
  bool layout_ok = get_u32(h + 56) == static_cast<uint64_t>(layout.tokens_per_block) &&
                   get_u32(h + 60) == layout.streams.size() && get_u32(h + 12) == fl.header_bytes &&
                   get_u64(h + 16) == static_cast<uint64_t>(fl.record_bytes);
  if (layout_ok && size < fl.header_bytes) {
    reason = "truncated: " + std::to_string(size) + " bytes, the header alone is " + std::to_string(fl.header_bytes);
    return std::nullopt;
  }
  for (size_t i = 0; layout_ok && i < layout.streams.size(); ++i) {
    const uint8_t* s = h + kFixedHeaderBytes + fingerprint.size() + 8 * i;
    layout_ok = get_u32(s) == layout.streams[i].record_bytes && get_u32(s + 4) == layout.streams[i].entries_per_block;
  }
  if (!layout_ok) {
    reason = "written with another cache layout (tokens per block, streams or record sizes differ)";
    return std::nullopt;
  }
  if (size != fl.file_bytes) {
    reason = (size < fl.file_bytes ? "truncated: " : "too long: ") + std::to_string(size) + " bytes, expected " +
             std::to_string(fl.file_bytes);
    return std::nullopt;
  }
  StoredPrefixBlock block;
  block.streams.resize(layout.streams.size());
  std::vector<iovec> iov;
  for (size_t i = 0; i < layout.streams.size(); ++i) {
    block.streams[i].resize(static_cast<size_t>(layout.streams[i].block_bytes()));
    iov.push_back(iovec{block.streams[i].data(), block.streams[i].size()});
  }
  uint8_t stored_crc[4];
  iov.push_back(iovec{stored_crc, 4});
  if (!preadv_all(fd, std::move(iov), static_cast<off_t>(fl.header_bytes))) {
    reason = "cannot read the records";
    return std::nullopt;
  }
  uint32_t crc = crc32c(header);
  for (const auto& s : block.streams) crc = crc32c_extend(crc, s);
  if (crc != get_u32(stored_crc)) {
    reason = "checksum mismatch";
    return std::nullopt;
  }
  block.key = {get_u64(h + 24), get_u64(h + 32)};
  block.parent = {get_u64(h + 40), get_u64(h + 48)};
  const uint32_t flags = get_u32(h + 64);
  if (flags & ~kFlagExact) {
    reason = "unknown flags";
    return std::nullopt;
  }
  block.exact = (flags & kFlagExact) != 0;
  const uint8_t* t = h + kFixedHeaderBytes + fingerprint.size() + 8 * layout.streams.size();
  block.tokens.resize(static_cast<size_t>(layout.tokens_per_block));
  for (int64_t i = 0; i < layout.tokens_per_block; ++i) block.tokens[i] = static_cast<int64_t>(get_u64(t + 8 * i));
  if (block.key != key) {
    reason = "holds block " + block.key.hex() + ", not the one its name says";
    return std::nullopt;
  }
  if (prefix_chain(block.parent, block.tokens) != key) {
    reason = "its key does not chain from its parent key and tokens";
    return std::nullopt;
  }
  return block;
}

void KvDiskStore::drop_damaged(const PrefixKey& key, const std::string& reason, int fd) {
  const fs::path path = path_of(key);
  {
    std::lock_guard files(files_mu_);
    struct stat st_read {
    }, st_now{};
    const bool same = ::fstat(fd, &st_read) == 0 && ::stat(path.c_str(), &st_now) == 0 &&
                      st_read.st_dev == st_now.st_dev && st_read.st_ino == st_now.st_ino;
    if (same) ::unlink(path.c_str());
    std::lock_guard lock(mu_);
    ++stats_.corrupt;
    ++stats_.misses;
    if (same) erase_locked(key);
  }
  log("kv cache dir " + options_.dir.string() + ": dropped damaged block file " + path.string() + ": " + reason +
      " (the prefix is recomputed)");
}

std::optional<StoredPrefixBlock> KvDiskStore::get(const PrefixKey& key) {
  {
    std::lock_guard lock(mu_);
    ++stats_.gets;
    if (!entries_.contains(key)) {
      ++stats_.misses;
      return std::nullopt;
    }
  }
  const fs::path path = path_of(key);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    // Evicted meanwhile, or deleted behind the store's back: forget it unless a put brought it back.
    std::lock_guard files(files_mu_);
    std::lock_guard lock(mu_);
    ++stats_.misses;
    if (::access(path.c_str(), F_OK) != 0) erase_locked(key);
    return std::nullopt;
  }
  std::string reason;
  std::optional<StoredPrefixBlock> block = read_block(key, fd, reason);
  if (!block) {
    drop_damaged(key, reason, fd);
    ::close(fd);
    return std::nullopt;
  }
  {
    std::lock_guard lock(mu_);
    const timespec t = to_timespec(next_stamp_locked());
    const timespec times[2] = {t, t};
    ::futimens(fd, times);  // the access order survives a restart
    ++stats_.hits;
    stats_.bytes_read += file_layout_.file_bytes;
    if (entries_.contains(key)) touch_locked(key, file_layout_.file_bytes, block->exact ? 1 : 0);
  }
  ::close(fd);
  return block;
}

bool KvDiskStore::contains(const PrefixKey& key) const {
  std::lock_guard lock(mu_);
  return entries_.contains(key);
}

KvDiskStoreStats KvDiskStore::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace cedar
