// The CPU's practical single-precision ceiling: the rate of a large sgemm through the same
// BLAS and thread count the CPU backend uses. MFU on a CPU is reported against this.
#pragma once

#include <string>
#include <vector>

namespace ptrain {

struct GemmRate {
  int size = 0;
  int threads = 0;
  std::vector<double> rates;  // FLOP/s of each timed run, ascending
  double median_flops() const;
  double min_flops() const { return rates.empty() ? 0 : rates.front(); }
  double max_flops() const { return rates.empty() ? 0 : rates.back(); }
  // Both sets of runs, as one (a benchmark measures before and after what it times).
  GemmRate merged(const GemmRate& other) const;
};

// Times `repeats` square sgemms of side `size` after one warm-up.
GemmRate measure_sgemm_rate(int size, int repeats);

// The CPU's peak for MFU in training logs: the median of a short sgemm measurement (5 of
// 1024^3, about a tenth of a second on 2 cores), made once per machine and kept in
// <data_cache_dir()>/cpu-peak.json under a key of the CPU's model name, the thread count and
// OpenBLAS's kernel (each changes the rate). A cache that cannot be read or written is
// measured again, never an error.
struct CpuPeak {
  double flops = 0;
  bool cached = false;  // read from the cache, not measured by this process
  std::string key;      // "Intel(R) Xeon(R) ... | 2 threads | SkylakeX"
  std::string cache_file;
};
// `cache` false: measure, and neither read nor write the cache (other ranks share the machine).
CpuPeak cpu_sgemm_peak(bool cache = true);

}  // namespace ptrain
