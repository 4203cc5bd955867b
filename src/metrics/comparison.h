// `ptrain compare`: what reduced precision cost and bought, from finished runs of one config in
// several precision modes. Runs are read back from their directories (config.yaml,
// metrics.jsonl, summary.json); the numbers of the report are computed here, the report itself
// (Markdown, HTML, SVG charts) is written by metrics/report.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ptrain {

// One finished run, as its directory records it.
struct RunRecord {
  std::string dir;       // the run directory
  std::string mode;      // the precision label (PrecisionPolicy::label): "fp32", "bf16", "fp8:current", ...
  nlohmann::json config;  // the keys runs must share, flat: {"model.n_embd": 128, "data.synthetic.seed": 7, ...}
  std::vector<int64_t> steps;      // per training step, in order
  std::vector<double> loss;        // training loss of each step
  std::vector<double> tokens_per_s;
  std::vector<double> step_seconds;  // each step's own time, without evaluations and saves
  int64_t batch_tokens = 0;          // tokens per step
  std::vector<int64_t> val_steps;    // evaluations
  std::vector<double> val_loss;
  int ranks = 1;                               // data-parallel ranks it trained on
  double peak_memory_mib = 0;                  // host resident memory (the CPU backend's)
  std::optional<double> peak_device_memory_mib;  // a GPU's arena peak
  // What the mode holds on a GPU whichever device the run took: the CUDA backend's memory plan
  // per rank for the run's shape, ranks and ZeRO stage (train/gpu_memory_plan.h), in MiB, and
  // its weights, master, gradients and optimizer state in bytes per parameter. Set by compare.
  std::optional<double> gpu_plan_mib, gpu_plan_state_bytes_per_param;
  int64_t skipped_steps = 0;                     // loss scaling's skipped (overflowed) steps
  std::optional<double> oracle_loss;             // synthetic data: the floor of the val loss
  // FP8 telemetry, worst over every tensor and report: fraction of non-zero inputs flushed to
  // zero, and fraction saturated (absent without FP8).
  std::optional<double> fp8_underflow, fp8_saturation;
  // compare --int8-eval: the final checkpoint's val loss computed in FP32 with its masters, and
  // with its block linears' weights in INT8 (train/checkpoint_model.h).
  std::optional<double> final_checkpoint_val_loss, int8_val_loss;
};

// One row of the report: a mode against the reference mode.
struct ModeResult {
  std::string mode;
  double final_loss = 0;                 // the last step's training loss
  std::optional<double> final_val_loss;  // the last evaluation's
  double loss_diff = 0, loss_diff_pct = 0;  // final_loss - the reference's, absolute and in % of it
  std::optional<double> val_diff, val_diff_pct;
  double max_divergence = 0;  // largest |loss - reference loss| over the steps both have
  int64_t max_divergence_step = 0;
  std::optional<double> oracle_gap;  // final_val_loss - oracle loss
  double tokens_per_s = 0;           // median over steps 2..N (step 1 warms up)
  double speedup = 1;                // tokens_per_s / the reference's
  double peak_memory_mib = 0;        // device peak on a GPU, else host peak
  bool device_memory = false;
  std::optional<double> gpu_plan_mib, gpu_plan_state_bytes_per_param;  // as RunRecord's
  int64_t skipped_steps = 0;
  std::optional<double> fp8_underflow, fp8_saturation;
  double train_seconds = 0;  // the sum of the step times (evaluations and saves left out)
  // The first time the val loss reached the comparison's target, interpolated linearly between
  // the evaluations on either side of the crossing: the step (fractional), the training time to
  // it and the tokens. Absent when it never did (or the run has no evaluations).
  std::optional<double> target_step, time_to_target_s, tokens_to_target;
  std::optional<double> target_speedup;  // the reference's time to target / this mode's
  std::optional<double> int8_diff_pct;   // INT8 weights' val loss against the same checkpoint's masters, %
  bool within_tolerance = true;  // |val_diff_pct| (or |loss_diff_pct| without evaluations) <= tolerance
};

struct Comparison {
  std::string reference;   // the mode the others are measured against
  double tolerance_pct = 0;
  // The val loss time-to-target is measured to: --target-loss, else the reference's final val
  // loss; absent when neither exists (the reference ran no evaluation).
  std::optional<double> target_loss;
  bool target_given = false;  // from --target-loss, not the reference's
  bool int8_evaluated = false;  // the runs carry --int8-eval's losses
  std::vector<RunRecord> runs;      // in report order, the reference first
  std::vector<ModeResult> results;  // one per run, same order
  bool any_regressed() const;
};

// Reads a run directory; throws UserError naming the directory and what is missing or malformed.
RunRecord read_run(const std::string& dir);

// The differences that make two runs incomparable (model, data, seed, steps, batch, schedule,
// optimizer), e.g. "model.n_embd: 128 in runs/a, 256 in runs/b"; empty when comparable.
std::vector<std::string> run_mismatches(const RunRecord& a, const RunRecord& b);

// Computes every row. Throws UserError when the runs are not comparable (listing what differs)
// or the reference mode is not among them. `target_loss`: the val loss time-to-target is
// measured to (default: the reference's final val loss).
Comparison compare_runs(std::vector<RunRecord> runs, const std::string& reference, double tolerance_pct,
                        std::optional<double> target_loss = std::nullopt);

// Where `loss` (at `steps`, ascending) first reaches `target` or below: the step itself when the
// first point does, else linearly interpolated between the point before the crossing and the
// first one at or below it. Non-finite points never reach. Absent when no point does.
std::optional<double> first_step_reaching(const std::vector<int64_t>& steps, const std::vector<double>& loss,
                                          double target);

// The training time at a (fractional) step: the step times summed up to it, the step in progress
// counted in proportion (step 0, before any training, is 0 s). `steps` are 1..N in order.
double training_seconds_at(const std::vector<int64_t>& steps, const std::vector<double>& step_seconds, double step);

}  // namespace ptrain
