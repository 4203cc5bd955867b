// Every file ptrain writes goes through here: each write, sync, close and rename is checked, and
// a failure names the file and the system's error. Failures are EnvironmentError (exit 1): by the
// time ptrain writes, planning has found the run sound and the machine failed it (a full disk,
// a file-size limit, an I/O error). main() ignores SIGXFSZ, so a file-size limit is the error
// EFBIG ("File too large") here instead of a signal that kills the process.
#pragma once

#include <cstddef>
#include <string>

namespace ptrain {

// A new file written in pieces. Destroyed before finish(), it is removed: a failed write never
// leaves a partial file under its name.
class OutputFile {
 public:
  explicit OutputFile(const std::string& path);  // creates or truncates
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(const std::string& text) { write(text.data(), text.size()); }
  // Closes the file, after fsync when `durable` (it then survives a crash of the machine).
  void finish(bool durable = true);
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// A file that appears complete or not at all: written to `<path>.tmp`, fsynced, renamed over
// `path`, and the directory synced. Until commit() the old file (if any) is untouched.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  void write(const void* data, size_t bytes) { tmp_.write(data, bytes); }
  void write(const std::string& text) { tmp_.write(text); }
  void commit();

 private:
  std::string path_;
  OutputFile tmp_;
};

void write_file_atomic(const std::string& path, const std::string& bytes);

// An append-only text file (log.txt, metrics.jsonl), created if absent. Each append is one
// checked write of whole lines; a failed append is cut back off, so no half record stays behind.
class AppendFile {
 public:
  explicit AppendFile(const std::string& path);
  ~AppendFile();
  AppendFile(AppendFile&& other) noexcept;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  AppendFile& operator=(AppendFile&&) = delete;
  void append(const std::string& text);

 private:
  int fd_ = -1;
  std::string path_;
};

// fsync of a directory, so that renames and new entries in it survive a crash.
void sync_directory(const std::string& path);
// rename(2), checked and named.
void rename_path(const std::string& from, const std::string& to);

}  // namespace ptrain
