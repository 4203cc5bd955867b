// What every fuzz target shares. A parser may refuse its input only with UserError (a message
// for the user); any other exception escapes and libFuzzer reports it as a crash, as it does a
// sanitizer report, a hang (-timeout) or an allocation past -rss_limit_mb.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/error.h"

namespace ptrain::fuzz {

// Runs fn; a UserError is an accepted outcome (the input was refused), returns whether it passed.
template <typename Fn>
bool accepted(Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const UserError&) {
    return false;
  }
}

// The input as a file, for parsers that read files: an in-memory file (memfd) named by its
// /proc path, a regular file as far as the parser can tell.
class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) : fd_(::memfd_create("fuzz-input", MFD_CLOEXEC)) {
    if (fd_ < 0) throw std::runtime_error("memfd_create failed");
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) throw std::runtime_error("memfd write failed");
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

}  // namespace ptrain::fuzz
