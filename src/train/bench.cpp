#include "train/bench.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "metrics/cpu_peak.h"
#include "precision/policy.h"
#include "train/trainer.h"

namespace ptrain {

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void benchmark(const Config& config) {
  if (config.training.steps < 3)
    throw UserError("training.steps: " + std::to_string(config.training.steps) +
                    " is too few to benchmark; expected at least 3 (step 1 is warm-up)");
  // The backend sets the OpenMP and OpenBLAS thread counts; measure the ceiling under them.
  const std::string device = make_cpu_backend(config.training.threads)->description();
  const GemmRate gemm = measure_sgemm_rate(4096, 5);
  std::printf("ceiling: sgemm 4096^3 on %s: median %.1f GFLOP/s over 5 runs\n\n", device.c_str(),
              gemm.median_flops / 1e9);
  std::fflush(stdout);

  const TrainResult result = train(config, TrainOptions{});
  const std::vector<double> timed(result.step_seconds.begin() + 1, result.step_seconds.end());
  const double step_s = median(timed);
  const double tokens_per_s = static_cast<double>(result.tokens_per_step) / step_s;
  const double model_flops = result.flops_per_token * tokens_per_s;
  std::printf("\nbenchmark: %s, %s, %d threads, steps 2-%zu (%zu steps)\n", config.run.name.c_str(),
              PrecisionPolicy::from_config(config.precision).label().c_str(), gemm.threads,
              result.step_seconds.size(), timed.size());
  std::printf("  median step            %10.1f ms\n", step_s * 1e3);
  std::printf("  tokens/s               %10.0f\n", tokens_per_s);
  std::printf("  model FLOP/s           %10.1f GFLOP/s  (%.3g FLOP/token: 6N + 6LCT)\n", model_flops / 1e9,
              result.flops_per_token);
  std::printf("  sgemm ceiling          %10.1f GFLOP/s\n", gemm.median_flops / 1e9);
  std::printf("  model / ceiling        %10.1f %%\n", 100.0 * model_flops / gemm.median_flops);
}

}  // namespace ptrain
