// `ptrain bench`: trains a config for a few steps and reports the medians a user compares
// across machines and precisions, beside the machine's measured ceiling.
#pragma once

#include "config/config.h"

namespace ptrain {

// Measures the sgemm ceiling, trains `config` (its training.steps), and prints median ms/step,
// tokens/s and model FLOP/s over steps 2..N, and that rate as a fraction of the ceiling. With
// `profile` (CPU only), also the median time per op family and the GEMMs' own rate.
void benchmark(const Config& config, bool profile = false);

}  // namespace ptrain
