#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "io/safetensors.h"

namespace cedar::io {

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::filesystem::path& path) {
  auto fail = [&](const std::string& what, int err) {
    return make_error("cannot " + what + " " + path.string() + ": " +
                      std::error_code(err, std::generic_category()).message());
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail("open", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return fail("stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error("cannot map " + path.string() + ": not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* data = nullptr;
  if (size > 0) {  // mmap of length 0 is an error; an empty file is simply an empty span
    data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return fail("map", err);
    }
  }
  ::close(fd);  // the mapping keeps the file alive
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->data_ = static_cast<const uint8_t*>(data);
  file->size_ = size;
  file->path_ = path;
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace cedar::io
