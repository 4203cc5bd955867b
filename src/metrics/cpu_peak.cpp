#include "metrics/cpu_peak.h"

#include <cblas.h>
#include <unistd.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/format.h"
#include "core/paths.h"
#include "core/rng.h"

namespace ptrain {

GemmRate measure_sgemm_rate(int size, int repeats, int threads) {
  const size_t n = static_cast<size_t>(size) * size;
  std::vector<float> a(n), b(n), c(n);
  Rng rng(1);
  for (size_t i = 0; i < n; ++i) {
    a[i] = rng.uniform() - 0.5f;
    b[i] = rng.uniform() - 0.5f;
  }
  // OpenBLAS's OpenMP build threads a call over omp_get_max_threads() of the calling thread.
  const int previous = omp_get_max_threads();
  if (threads > 0) omp_set_num_threads(threads);
  GemmRate result{size, omp_get_max_threads(), {}};
  std::vector<double>& rates = result.rates;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, size, size, size, 1.0f, a.data(), size, b.data(), size,
                0.0f, c.data(), size);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) rates.push_back(2.0 * size * static_cast<double>(size) * size / s);  // r = 0 warms up
  }
  omp_set_num_threads(previous);
  std::sort(rates.begin(), rates.end());
  return result;
}

double GemmRate::median_flops() const {
  if (rates.empty()) return 0;
  const size_t n = rates.size();
  return n % 2 ? rates[n / 2] : 0.5 * (rates[n / 2 - 1] + rates[n / 2]);
}

GemmRate GemmRate::merged(const GemmRate& other) const {
  GemmRate m = *this;
  m.rates.insert(m.rates.end(), other.rates.begin(), other.rates.end());
  std::sort(m.rates.begin(), m.rates.end());
  return m;
}

namespace {

constexpr int kPeakSize = 1024, kPeakRuns = 5;

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      const size_t at = line.find_first_not_of(" \t", line.find(':') + 1);
      return at == std::string::npos ? "unknown CPU" : line.substr(at);
    }
  return "unknown CPU";
}


// A temporary of this process's own, renamed over the cache: processes measuring at once (tests,
// several runs) each replace the file whole. A read-only home: measured again next time.
void write_cache(const std::string& file, const nlohmann::json& cache) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(fs::path(file).parent_path(), error);
  const std::string tmp = file + "." + std::to_string(::getpid()) + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << cache.dump(2) << "\n";
    if (!out.flush()) error = std::make_error_code(std::errc::io_error);
  }
  if (!error) fs::rename(tmp, file, error);
  if (error) fs::remove(tmp, error);
}

}  // namespace

CpuPeak cpu_sgemm_peak(PeakCache use) {
  CpuPeak peak;
  const int threads = omp_get_max_threads();
  peak.key = cpu_model_name() + " | " + std::to_string(threads) + " threads | " + openblas_get_corename();
  peak.cache_file = (std::filesystem::path(data_cache_dir()) / "cpu-peak.json").string();
  nlohmann::json cache = nlohmann::json::object();
  // Only a regular file is read (a FIFO there would block the run forever), and at most 1 MiB;
  // anything else counts as no cache, and the measurement's rename replaces it.
  std::error_code ec;
  const bool readable = std::filesystem::is_regular_file(peak.cache_file, ec) && !ec &&
                        std::filesystem::file_size(peak.cache_file, ec) < (1u << 20) && !ec;
  if (readable) {
    std::ifstream in(peak.cache_file);
    std::stringstream text;
    text << in.rdbuf();
    cache = nlohmann::json::parse(text.str(), nullptr, false);
    if (!cache.is_object()) cache = nlohmann::json::object();  // missing or damaged: measure again
  }
  if (use == PeakCache::use && cache.contains(peak.key) && cache[peak.key].is_number() &&
      cache[peak.key].get<double>() > 0) {
    peak.flops = cache[peak.key].get<double>();
    peak.cached = true;
    return peak;
  }
  peak.flops = measure_sgemm_rate(kPeakSize, kPeakRuns).best_flops();
  if (threads > 1) {
    peak.one_thread_flops = measure_sgemm_rate(kPeakSize, kPeakRuns, 1).best_flops();
    if (peak.flops < peak.one_thread_flops) {
      peak.under_load = true;
      peak.flops = peak.one_thread_flops;  // the cores were shared: one thread's rate is the better bound
    }
  }
  if (use == PeakCache::off || peak.under_load) return peak;
  // A refresh replaces a figure a run went faster than: never with a lower one.
  const bool lower = cache.contains(peak.key) && cache[peak.key].is_number() && cache[peak.key].get<double>() >= peak.flops;
  if (use == PeakCache::refresh && lower) return peak;
  cache[peak.key] = peak.flops;
  write_cache(peak.cache_file, cache);
  peak.saved = true;
  return peak;
}

std::string CpuPeak::describe() const {
  std::string text = "best of " + std::to_string(kPeakRuns) + " sgemms of " + std::to_string(kPeakSize) + "^3, ";
  if (cached) return text + "measured earlier for \"" + key + "\", cached in " + cache_file;
  text += "measured now for \"" + key + "\"";
  if (under_load)
    return text + ", but slower on all threads than on one (" + format_number("%.1f", one_thread_flops / 1e9) +
           " GFLOP/s): the machine was busy, so the 1-thread rate stands in and is not cached";
  return saved ? text + ", cached in " + cache_file : text;
}

std::string format_utilisation(double ratio) {
  const std::string percent = format_number("%.1f%%", 100.0 * ratio);
  return ratio > 1.0 ? percent + " (above 100%: the ceiling is stale)" : percent;
}

}  // namespace ptrain
