#include "metrics/run_log.h"

#include <algorithm>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <ctime>

#include "core/error.h"

namespace ptrain {

RunLog::RunLog() {
  logger_ = std::make_shared<spdlog::logger>("ptrain", std::make_shared<spdlog::sinks::stdout_sink_mt>());
  logger_->set_pattern("%v");
  logger_->flush_on(spdlog::level::info);
}

RunLog::RunLog(const std::string& run_dir) : RunLog() {
  file_.emplace(run_dir + "/log.txt");
  metrics_.emplace(run_dir + "/metrics.jsonl");
}

RunLog::~RunLog() = default;

RunLog RunLog::silent() {
  RunLog log;
  log.logger_->sinks().clear();
  return log;
}

void RunLog::to_file(const std::string& line) {
  if (!file_) return;
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "[%Y-%m-%d %H:%M:%S] ", &local);
  file_->append(stamp + line + "\n");
}

void RunLog::info(const std::string& line) {
  logger_->info(line);
  to_file(line);
}

void RunLog::warn(const std::string& line) {
  logger_->warn("warning: " + line);
  to_file("warning: " + line);
}

void RunLog::file_only(const std::string& line) { to_file(line); }

void RunLog::metrics(const nlohmann::json& record) {
  // Paths in records come from the user and need not be UTF-8: replaced, never a throw.
  if (metrics_) metrics_->append(record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

double median_after_first(const std::vector<double>& values) {
  std::vector<double> v(values.size() > 1 ? values.begin() + 1 : values.begin(), values.end());
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int64_t current_rss_bytes() {
  long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  const int got = std::fscanf(f, "%ld %ld", &pages_total, &pages_resident);
  std::fclose(f);
  return got == 2 ? static_cast<int64_t>(pages_resident) * sysconf(_SC_PAGESIZE) : 0;
}

int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

}  // namespace ptrain
