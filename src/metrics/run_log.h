// What a run tells its user: human lines on the console (mirrored to log.txt) and one JSON
// object per step or evaluation in metrics.jsonl. Lines are complete and self-contained (no
// carriage-return progress bars), so they stay readable when stdout is a file or a pipe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/output_file.h"

namespace spdlog {
class logger;
}

namespace ptrain {

class RunLog {
 public:
  // Console only (dry runs, tools).
  RunLog();
  // Console plus <run_dir>/log.txt and <run_dir>/metrics.jsonl, appended to if present. Every
  // write to them is checked: a failed one throws EnvironmentError naming the file, so a full
  // disk ends the run with a message instead of a log cut short without a word.
  explicit RunLog(const std::string& run_dir);
  // Nothing at all: the log of a data-parallel rank other than 0 (rank 0 speaks for the job).
  static RunLog silent();
  RunLog(RunLog&&) = default;
  ~RunLog();

  void info(const std::string& line);
  void warn(const std::string& line);
  // To log.txt only (for lines the console has already shown).
  void file_only(const std::string& line);
  void metrics(const nlohmann::json& record);

 private:
  void to_file(const std::string& line);

  std::shared_ptr<spdlog::logger> logger_;
  std::optional<AppendFile> file_;     // log.txt, when the run has a directory
  std::optional<AppendFile> metrics_;  // metrics.jsonl
};

// The median of per-step values after the first (the step that warms caches up); all of them
// when there is only one, 0 when there are none.
double median_after_first(const std::vector<double>& values);

// Resident memory of this process now and at its peak, in bytes.
int64_t current_rss_bytes();
int64_t peak_rss_bytes();

}  // namespace ptrain
