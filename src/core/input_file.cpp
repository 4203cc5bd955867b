#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ptrain {
namespace {

// What an open failure means to the user.
std::string open_error(int err) {
  switch (err) {
    case ENOENT: return "does not exist";
    case ELOOP: return "is a symbolic link loop (or too many links deep)";
    case EACCES: return "is not readable (permission denied)";
    case ENAMETOOLONG: return "has a name too long for the filesystem";
    case ENOTDIR: return "has a path component that is not a directory";
    default: return std::string("cannot be opened (") + std::strerror(err) + ")";
  }
}

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Opens without blocking (a FIFO with no writer would block open() forever) and without
// following the last link into a loop; returns the descriptor and its stat.
int open_nonblocking(const std::string& path, const std::string& what, const std::string& expected, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOMEM))
    throw EnvironmentError(what + " cannot be opened: " + std::strerror(errno) + " (raise the open-file limit, ulimit -n)");
  if (fd < 0) throw UserError(what + " " + open_error(errno) + "; expected " + expected);
  if (::fstat(fd, st) != 0) {
    const int err = errno;
    ::close(fd);
    throw EnvironmentError(what + ": cannot stat: " + std::strerror(err));
  }
  return fd;
}

}  // namespace

InputFile::InputFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  struct stat st {};
  fd_ = open_nonblocking(path, what, "a readable file", &st);
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw UserError(what + " is " + kind_of(st.st_mode) + "; expected a regular file");
  }
  size_ = static_cast<int64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

InputFile::InputFile(InputFile&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), what_(std::move(other.what_)), size_(other.size_) {
  other.fd_ = -1;
}

void InputFile::read_at(int64_t offset, void* dst, size_t bytes) const {
  char* out = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, out, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw EnvironmentError(what_ + ": read failed: " + std::strerror(errno));
    if (n == 0) {
      // Where the file ends now, which is not where this read began when it shrank further.
      struct stat now {};
      const std::string end = ::fstat(fd_, &now) == 0 ? "ends at byte " + std::to_string(now.st_size)
                                                      : "ended before byte " + std::to_string(offset);
      throw UserError(what_ + " " + end + " although it was " + std::to_string(size_) + " bytes when opened (reading byte " +
                      std::to_string(offset) + "); expected it not to change while ptrain reads it");
    }
    out += n;
    offset += n;
    bytes -= static_cast<size_t>(n);
  }
}

std::string InputFile::read_all(int64_t max_bytes) const {
  if (size_ > max_bytes)
    throw UserError(what_ + " is " + std::to_string(size_) + " bytes; expected at most " + std::to_string(max_bytes));
  std::string text(static_cast<size_t>(size_), '\0');
  read_at(0, text.data(), text.size());
  return text;
}

std::string read_config_text(const std::string& path, int64_t max_bytes) {
  const std::string what = "config file \"" + path + "\"";
  struct stat st {};
  const int fd = open_nonblocking(path, what, "a readable YAML file (or a pipe)", &st);
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
    ::close(fd);
    throw UserError(what + " is " + kind_of(st.st_mode) + "; expected a YAML file (or a pipe)");
  }
  // A pipe is read as it fills: blocking from here on.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw EnvironmentError(what + ": read failed: " + std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(text.size()) > max_bytes) {
      ::close(fd);
      throw UserError(what + " is larger than " + std::to_string(max_bytes) + " bytes; expected a run config");
    }
  }
  ::close(fd);
  return text;
}

}  // namespace ptrain
