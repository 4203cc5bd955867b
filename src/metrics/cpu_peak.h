// The CPU's practical single-precision ceiling: the rate of a large sgemm through the same
// BLAS and thread count the CPU backend uses. MFU on a CPU is reported against this.
//
// A ceiling is the best a machine does, so it is the best of several runs: a run slowed by
// another process cannot become the figure, only a run that got the cores can. A figure
// measured while the machine was busy is still not believed: when the run on all the threads
// is slower than the same sgemm on one thread, the cores were shared, and that figure is neither
// used nor cached.
#pragma once

#include <string>
#include <vector>

namespace ptrain {

struct GemmRate {
  int size = 0;
  int threads = 0;
  std::vector<double> rates;  // FLOP/s of each timed run, ascending
  double median_flops() const;
  double best_flops() const { return rates.empty() ? 0 : rates.back(); }
  double min_flops() const { return rates.empty() ? 0 : rates.front(); }
  // Both sets of runs, as one (a benchmark measures before and after what it times).
  GemmRate merged(const GemmRate& other) const;
};

// Times `repeats` square sgemms of side `size` after one warm-up, on `threads` threads (0: the
// OpenMP default, which the CPU backend has set).
GemmRate measure_sgemm_rate(int size, int repeats, int threads = 0);

// The CPU's peak for MFU in training logs: the best of 5 sgemms of 1024^3 on the run's threads,
// checked against 5 on one thread (about a third of a second on 2 cores), kept in <data_cache_dir()>/cpu-peak.json under a key of the CPU's model
// name, the thread count and OpenBLAS's kernel (each changes the rate). A cache that cannot be
// read or written is measured again, never an error.
struct CpuPeak {
  double flops = 0;
  bool cached = false;      // read from the cache, not measured by this process
  bool under_load = false;  // all threads were slower than one: `flops` is the 1-thread rate, not cached
  double one_thread_flops = 0;  // the 1-thread rate it was checked against (0: not measured)
  bool saved = false;           // measured now and written to the cache
  std::string key;              // "Intel(R) Xeon(R) ... | 2 threads | SkylakeX"
  std::string cache_file;
  // "best of 5 sgemms of 1024^3, measured now for "...", cached in ..."
  std::string describe() const;
};
enum class PeakCache {
  use,      // read the cached figure, else measure and cache
  refresh,  // measure, and replace the cached figure (a run went faster than it) if the new one is higher
  off,      // measure, neither read nor write (other ranks share the machine)
};
CpuPeak cpu_sgemm_peak(PeakCache cache = PeakCache::use);

// A utilisation (model FLOP/s over a ceiling) as printed: "87.3%", or above 100%
// "123.4% (above 100%: the ceiling is stale)": more than the ceiling can only mean the ceiling was
// measured too low, and is never printed as a fact.
std::string format_utilisation(double ratio);

}  // namespace ptrain
