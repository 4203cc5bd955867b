#include "backend/cuda/library_log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace ptrain {
namespace {

struct LibraryLog {
  std::mutex mutex;
  FILE* file = nullptr;
  bool failed = false;

  LibraryLog() {
    const char* path = std::getenv("PTRAIN_LIBRARY_LOG");
    if (!path || !*path) return;
    file = std::fopen(path, "a");
    if (!file) std::fprintf(stderr, "warning: PTRAIN_LIBRARY_LOG=%s cannot be opened for appending: nothing logged\n", path);
  }
  ~LibraryLog() {
    if (file) std::fclose(file);
  }
};

LibraryLog& instance() {
  static LibraryLog log;
  return log;
}

}  // namespace

bool library_log_enabled() { return instance().file != nullptr; }

void log_library_choice(const nlohmann::json& record) {
  LibraryLog& log = instance();
  if (!log.file) return;
  const std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(log.mutex);
  if ((std::fwrite(line.data(), 1, line.size(), log.file) != line.size() || std::fflush(log.file) != 0) && !log.failed) {
    log.failed = true;
    std::fprintf(stderr, "warning: writing PTRAIN_LIBRARY_LOG failed: the log is incomplete\n");
  }
}

}  // namespace ptrain
