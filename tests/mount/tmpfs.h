// A tmpfs mounted for one test: a disk that fills at a chosen size, or a filesystem remounted
// read-only. Tests run as root, where permissions do not bite, so these are the real faults.
// Mounting needs privileges a machine may not grant: main() then reports every test skipped.
#pragma once

#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "test_util.h"

namespace ptrain::test {

class Tmpfs {
 public:
  // Mounts a tmpfs of `bytes` on a new temporary directory; throws when mounting is refused.
  explicit Tmpfs(size_t bytes) : dir_(make_temp_dir("tmpfs")) {
    const std::string options = "size=" + std::to_string(bytes);
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      std::filesystem::remove(dir_);
      throw std::runtime_error("mount tmpfs: " + why);
    }
  }
  ~Tmpfs() {
    ::umount2(dir_.c_str(), MNT_DETACH);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  Tmpfs(const Tmpfs&) = delete;
  Tmpfs& operator=(const Tmpfs&) = delete;

  void remount_read_only() {
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr) != 0)
      throw std::runtime_error(std::string("remount read-only: ") + std::strerror(errno));
  }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

}  // namespace ptrain::test
