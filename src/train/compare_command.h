// `ptrain compare`: one config trained in several precision modes with the same seed and data
// order (or runs found finished), then the report of what each mode cost and bought.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "metrics/comparison.h"

namespace ptrain {

struct CompareOptions {
  // fp32, bf16, fp16, fp8 (the config's recipe), fp8:RECIPE, either with +primary (primary FP8
  // weights) and/or +codes (the MLP's input as FP8 codes), schedule, schedule:PRESET
  std::vector<std::string> modes;
  int64_t steps = 0;               // > 0: overrides training.steps
  std::string out_dir;             // the report's directory; the runs go to <out_dir>/runs
  std::string reference;           // empty: the first mode
  double tolerance_pct = 2.0;      // a mode regresses when its final (val) loss is this much worse or better
  std::optional<double> target_loss;  // time-to-target's val loss; absent: the reference's final val loss
  bool int8_eval = false;  // also each run's final checkpoint with INT8 weights (eval --weights int8)
  bool force = false;      // replace an earlier compare's report at out_dir (train/output_policy.h)
};

// The run config of `base` in `mode`: precision.mode (and fp8 recipe) or precision.schedule set, run.name suffixed
// with the mode, runs kept under <out_dir>/runs. Throws UserError for an unknown mode.
Config config_for_mode(const Config& base, const std::string& mode, const CompareOptions& options);

// Trains `base` in every mode of `options` (a finished run of the same config found in
// <out_dir>/runs is reused) and compares them; writes the report into options.out_dir.
Comparison compare_modes(const Config& base, const CompareOptions& options);

// Compares finished runs; writes the report into options.out_dir.
Comparison compare_run_dirs(const std::vector<std::string>& run_dirs, const CompareOptions& options);

}  // namespace ptrain
