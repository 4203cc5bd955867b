#include "core/output_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ptrain {
namespace {

[[noreturn]] void fail(const char* action, const std::string& path, int err) {
  throw EnvironmentError(std::string("cannot ") + action + " \"" + path + "\": " + std::strerror(err));
}

void write_fully(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    // write(2) returns 0 only for a zero-byte request; treat it as "no space" rather than spin.
    if (n <= 0) fail("write", path, n < 0 ? errno : ENOSPC);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

}  // namespace

OutputFile::OutputFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("create", path, errno);
}

OutputFile::~OutputFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(path_.c_str());
}

void OutputFile::write(const void* data, size_t bytes) { write_fully(fd_, data, bytes, path_); }

void OutputFile::finish(bool durable) {
  if (durable && ::fsync(fd_) != 0) fail("sync", path_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(path_.c_str());
    fail("close", path_, err);
  }
}

AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {}

void AtomicFile::commit() {
  tmp_.finish(true);
  try {
    rename_path(tmp_.path(), path_);
  } catch (...) {
    ::unlink(tmp_.path().c_str());
    throw;
  }
  const size_t slash = path_.rfind('/');
  sync_directory(slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash));
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFile file(path);
  file.write(bytes);
  file.commit();
}

AppendFile::AppendFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("open", path, errno);
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

AppendFile::AppendFile(AppendFile&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }

void AppendFile::append(const std::string& text) {
  const off_t end = ::lseek(fd_, 0, SEEK_END);
  try {
    write_fully(fd_, text.data(), text.size(), path_);
  } catch (...) {
    if (end >= 0 && ::ftruncate(fd_, end) != 0) {
      // The error being reported already names the file; a part-written record stays behind.
    }
    throw;
  }
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail("sync", path, err);
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw EnvironmentError("cannot rename \"" + from + "\" to \"" + to + "\": " + std::strerror(errno));
}

}  // namespace ptrain
