// The CPU's practical single-precision ceiling: the rate of a large sgemm through the same
// BLAS and thread count the CPU backend uses. MFU on a CPU is reported against this.
#pragma once

namespace ptrain {

struct GemmRate {
  int size = 0;
  int threads = 0;
  double median_flops = 0;  // FLOP/s, median over repeats
};

// Times `repeats` square sgemms of side `size` after one warm-up.
GemmRate measure_sgemm_rate(int size, int repeats);

}  // namespace ptrain
