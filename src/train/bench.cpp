#include "train/bench.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "backend/backend.h"
#include "backend/device.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "metrics/cpu_peak.h"
#include "metrics/device_peak.h"
#include "backend/op_profile.h"
#include "metrics/run_log.h"
#include "precision/policy.h"
#include "train/gpu_memory_plan.h"
#include "train/run_spec.h"
#include "train/trainer.h"

namespace ptrain {

// A run's speed over its timed steps (all but the first, which warms up).
struct StepRate {
  size_t steps = 0;
  double step_s = 0, tokens_per_s = 0, model_flops = 0;
};
static StepRate step_rate(const TrainResult& result) {
  StepRate r;
  r.steps = result.step_seconds.size() - 1;
  r.step_s = median_after_first(result.step_seconds);
  r.tokens_per_s = static_cast<double>(result.tokens_per_step) / r.step_s;
  r.model_flops = result.flops_per_token * r.tokens_per_s;
  return r;
}

// The GPU benchmark: tokens/s, model FLOP/s, MFU against the device's dense BF16 peak and
// against the peak of the run's precision mix (devices not in the table get no MFU), and peak
// device memory.
static void benchmark_gpu(const Config& config, const CudaDeviceInfo& device) {
  const PeakLookup lookup = lookup_device_peaks(device);
  if (lookup.device)
    std::printf("peak: %s (%s), dense bf16 %.1f TFLOP/s, fp8 %.1f TFLOP/s (%s)\n\n", device.name.c_str(),
                lookup.device->part.c_str(), lookup.device->peaks.bf16 / 1e12, lookup.device->peaks.fp8 / 1e12,
                lookup.device->source.c_str());
  else
    std::printf("peak: %s\n\n", lookup.why_none.c_str());
  std::fflush(stdout);
  const TrainResult result = train(config, TrainOptions{});
  const StepRate r = step_rate(result);
  std::printf("\nbenchmark: %s, %s, %s, steps 2-%zu (%zu steps)\n", config.run.name.c_str(),
              resolve_precision(config).label().c_str(), result.device.c_str(),
              result.step_seconds.size(), r.steps);
  std::printf("  median step            %10.1f ms\n", r.step_s * 1e3);
  std::printf("  tokens/s               %10.0f\n", r.tokens_per_s);
  std::printf("  model FLOP/s           %10.1f TFLOP/s  (%.3g FLOP/token: 6N + 6LCT)\n", r.model_flops / 1e12,
              result.flops_per_token);
  if (result.mfu_peaks && result.mfu_peaks->bf16) {
    // An FP8 run may pass the BF16 peak: only the mix's peak bounds it.
    std::printf("  MFU, bf16 peak         %10.1f %%\n", 100.0 * r.model_flops / *result.mfu_peaks->bf16);
    std::printf("  MFU, precision mix     %10s  (peak %.1f TFLOP/s)\n",
                format_utilisation(r.model_flops / result.mfu_peaks->mix).c_str(), result.mfu_peaks->mix / 1e12);
  }
  // Beside it, the dry run's plan for the same run, so that a GPU checks the plan as the
  // simulated device does.
  const GpuMemoryPlan plan = plan_gpu_memory(resolve_run(config, launcher_world_size()), config.distributed,
                                             result.attention);
  std::printf("  peak device memory     %10.2f GiB  (plan %.2f GiB%s)\n",
              static_cast<double>(result.peak_device_bytes) / (1 << 30), static_cast<double>(plan.total()) / (1 << 30),
              plan.cudnn_workspace_unknown ? " and cuDNN's workspace" : "");
}

void benchmark(const Config& config, bool profile) {
  if (config.training.steps < 3)
    throw UserError("training.steps: " + std::to_string(config.training.steps) +
                    " is too few to benchmark; expected at least 3 (step 1 is warm-up)");
  if (config.run.device != DeviceRequest::cpu) {
    const CudaProbe probe = probe_cuda();
    if (!probe.devices.empty()) {
      if (profile)
        throw UserError("--profile: the CUDA backend runs its ops asynchronously, so host times would not say where "
                        "the GPU's time goes; profile it with nsys (ptrain marks NVTX ranges), or benchmark the CPU "
                        "with --set run.device=cpu");
      return benchmark_gpu(config, probe.devices[0]);
    }
    if (config.run.device == DeviceRequest::cuda)
      throw EnvironmentError("run.device: cuda cannot be benchmarked: no usable CUDA device: " + probe.why_none);
  }
  // The backend sets the OpenMP and OpenBLAS thread counts; measure the ceiling under them,
  // before and after training, so that a machine whose speed drifts shows it in the range.
  const std::string device = make_cpu_backend(config.training.threads)->description();
  const GemmRate before = measure_sgemm_rate(4096, 5);
  std::printf("ceiling: sgemm 4096^3 on %s: best %.1f GFLOP/s of 5 runs\n\n", device.c_str(),
              before.best_flops() / 1e9);
  std::fflush(stdout);

  OpProfile op_profile;
  TrainOptions options;
  if (profile) options.profile = &op_profile;
  const TrainResult result = train(config, options);
  const StepRate r = step_rate(result);
  const GemmRate gemm = before.merged(measure_sgemm_rate(4096, 5));
  // A ceiling is the best the machine did: a run slowed by another process cannot lower it.
  const double ceiling = gemm.best_flops();
  std::printf("\nbenchmark: %s, %s, %d threads, steps 2-%zu (%zu steps)\n", config.run.name.c_str(),
              resolve_precision(config).label().c_str(), gemm.threads,
              result.step_seconds.size(), r.steps);
  std::printf("  median step            %10.1f ms\n", r.step_s * 1e3);
  std::printf("  tokens/s               %10.0f\n", r.tokens_per_s);
  std::printf("  model FLOP/s           %10.1f GFLOP/s  (%.3g FLOP/token: 6N + 6LCT)\n", r.model_flops / 1e9,
              result.flops_per_token);
  std::printf("  sgemm ceiling          %10.1f GFLOP/s  (best of %zu runs before and after training; median %.1f, "
              "slowest %.1f)\n",
              ceiling / 1e9, gemm.rates.size(), gemm.median_flops() / 1e9, gemm.min_flops() / 1e9);
  std::printf("  model / ceiling        %10s\n", format_utilisation(r.model_flops / ceiling).c_str());
  if (profile) std::printf("\n%s", format_profile(op_profile.summary(), ceiling).c_str());
}

}  // namespace ptrain
