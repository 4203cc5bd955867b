// `ptrain train`: from a validated config to a finished run directory.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "config/config.h"
#include "metrics/device_peak.h"
#include "backend/op_profile.h"

namespace ptrain {

struct TrainOptions {
  bool dry_run = false;  // validate, print the plan, write nothing
  int64_t stop_at = 0;   // > 0: after this step, save a checkpoint and stop as if interrupted
  OpProfile* profile = nullptr;  // per-op times of each step (CPU backend; bench --profile)
};

struct TrainResult {
  std::vector<double> step_seconds;  // wall time of each optimizer step
  double flops_per_token = 0;        // 6N + 6*L*C*T, N including the padded vocabulary
  int64_t tokens_per_step = 0;
  double final_val_loss = 0;
  bool interrupted = false;        // stopped by a signal or stop_at before training.steps
  std::string last_checkpoint;     // path of the newest checkpoint written, if any
  std::string device;              // the device run.device resolved to, and why
  size_t peak_device_bytes = 0;    // most device memory in use at once (GPU runs; 0 on the CPU)
  std::optional<MfuPeaks> mfu_peaks;  // what MFU was quoted against; absent for a GPU not in the table
};

// Runs training. Throws UserError for problems a user can fix (data, run directory); nothing is
// written before the config and the data have been validated.
TrainResult train(const Config& config, const TrainOptions& options);

}  // namespace ptrain
