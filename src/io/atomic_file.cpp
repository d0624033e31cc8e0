#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>
#include <vector>

namespace cedar::io {
namespace {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// fsync of the directory makes the rename itself durable.
Status sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return make_error("cannot open directory " + dir.string() + ": " + errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL)  // some filesystems cannot fsync directories; the rename still stands
    return make_error("cannot sync directory " + dir.string() + ": " + errno_text(err));
  return Status::Ok();
}

}  // namespace

Result<AtomicFile> AtomicFile::create(const std::filesystem::path& path) {
  if (path.filename().empty()) return make_error("cannot write " + path.string() + ": not a file name");
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::string tmpl = (dir / ("." + path.filename().string() + ".tmp.XXXXXX")).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const int fd = ::mkostemp(buf.data(), O_CLOEXEC);
  if (fd < 0) return make_error("cannot create a temporary file for " + path.string() + ": " + errno_text(errno));
  AtomicFile f;
  f.path_ = path;
  f.tmp_path_ = std::filesystem::path(buf.data());
  f.fd_ = fd;
  return f;
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : path_(std::move(other.path_)), tmp_path_(std::move(other.tmp_path_)), fd_(other.fd_) {
  other.fd_ = -1;
  other.tmp_path_.clear();
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_path_.empty()) ::unlink(tmp_path_.c_str());
}

Status AtomicFile::append(std::span<const uint8_t> bytes) {
  if (fd_ < 0) return make_error("cannot write " + path_.string() + ": file already committed");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return make_error("cannot write " + tmp_path_.string() + ": " + errno_text(n < 0 ? errno : EIO));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status AtomicFile::write_at(uint64_t offset, std::span<const uint8_t> bytes) {
  if (fd_ < 0) return make_error("cannot write " + path_.string() + ": file already committed");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return make_error("cannot write " + tmp_path_.string() + ": " + errno_text(n < 0 ? errno : EIO));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status AtomicFile::append(std::string_view text) {
  return append(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

Status AtomicFile::commit() {
  if (fd_ < 0) return make_error("cannot commit " + path_.string() + ": already committed");
  if (::fchmod(fd_, 0644) != 0 || ::fsync(fd_) != 0)
    return make_error("cannot sync " + tmp_path_.string() + ": " + errno_text(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) return make_error("cannot close " + tmp_path_.string() + ": " + errno_text(errno));
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    return make_error("cannot rename " + tmp_path_.string() + " to " + path_.string() + ": " + errno_text(errno));
  tmp_path_.clear();
  return sync_directory(path_.has_parent_path() ? path_.parent_path() : std::filesystem::path("."));
}

Status write_file_atomically(const std::filesystem::path& path, std::span<const uint8_t> bytes) {
  CEDAR_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  CEDAR_RETURN_IF_ERROR(f.append(bytes));
  return f.commit();
}

}  // namespace cedar::io
