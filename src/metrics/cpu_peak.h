// The CPU's practical single-precision ceiling: the rate of a large sgemm through the same
// BLAS and thread count the CPU backend uses. MFU on a CPU is reported against this.
#pragma once

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

}  // namespace ptrain
