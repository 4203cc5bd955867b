// Every file a user hands ptrain (config, token shards, checkpoint files, model files) is opened
// here. Only a regular file is read; anything else is refused by name before a byte is read: a
// FIFO (which would block forever), a device, a socket, a directory, a symbolic-link loop. Reads
// are positional and checked, never memory-mapped: a file that shrinks while ptrain reads it
// gives an error naming it, not SIGBUS.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ptrain {

class InputFile {
 public:
  // `what` names the file in messages, e.g. "shard \"data/x.bin\"" or "model.init_from \"m.bin\"".
  // Throws UserError when the path cannot be opened or is not a regular file.
  InputFile(const std::string& path, const std::string& what);
  ~InputFile();
  InputFile(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  InputFile& operator=(InputFile&&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }  // when opened

  // Reads exactly `bytes` at `offset`. Throws UserError naming the file when fewer bytes are
  // there (it was truncated after it was opened), EnvironmentError on an I/O error.
  void read_at(int64_t offset, void* dst, size_t bytes) const;
  // The whole file; UserError when it is larger than `max_bytes`.
  std::string read_all(int64_t max_bytes) const;

 private:
  int fd_ = -1;
  std::string path_, what_;
  int64_t size_ = 0;
};

// A config file's text: a regular file or a pipe (`ptrain train <(generate-config)`), at most
// `max_bytes`; anything else (a device such as /dev/zero, a directory) is refused by name.
std::string read_config_text(const std::string& path, int64_t max_bytes);

}  // namespace ptrain
