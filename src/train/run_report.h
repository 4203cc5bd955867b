// What a training run tells its user, and what it measured: the opening lines (model, batch,
// data, memory, the peaks MFU is quoted against), each step's line and metrics.jsonl record,
// the numerics reports, the validation losses with the best one, and summary.json. The trainer
// hands it numbers; it keeps the run's timing, the MFU peaks (a precision schedule's phases have
// their own mixed peak) and the CPU ceiling's recheck.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "data/dataset.h"
#include "data/synthetic.h"
#include "dist/communicator.h"
#include "metrics/cpu_peak.h"
#include "metrics/device_peak.h"
#include "metrics/run_log.h"
#include "model/fp8_linear.h"
#include "train/run_plan.h"
#include "train/run_spec.h"

namespace ptrain {

class RunReport {
 public:
  RunReport(RunLog& log, const Config& config, const RunSpec& spec, Communicator& comm, Backend& backend,
            std::optional<SyntheticInfo> synthetic)
      : log_(log), cfg_(config), spec_(spec), comm_(comm), backend_(backend), synthetic_(std::move(synthetic)) {}

  // The model, the batch, the data and the memory plan, in the run's opening lines. A blend of
  // several training sources is remembered: each step's record and the summary count the
  // samples drawn from each.
  void announce_run(int64_t num_params, const DataPlan& data, int eval_batches);
  // The peaks MFU is quoted against, stated once: a GPU's from the data-sheet table (the BF16
  // dense peak and the run's precision mix's), a CPU's measured sgemm rate (no BF16 peak: the
  // CPU backend's GEMMs are FP32 sgemm whatever the precision).
  void announce_peaks(int64_t native_fp8_weights);
  // Data parallelism: the communicator, the global batch's split, and each rank's optimizer
  // state (`state_bytes`, gathered from every rank; ZeRO-1 divides it, with the FP32 master
  // shard when `master_shard`). Nothing for one rank.
  void announce_ranks(const std::vector<double>& state_bytes, bool master_shard);
  // On a GPU, the precision phase now running's mixed peak (its FP8 GEMMs at the FP8 peak), in
  // words; "" elsewhere.
  std::string phase_peak(int64_t native_fp8_weights);

  struct Step {
    int64_t step = 0;
    double loss = 0, grad_norm = 0, lr = 0, loss_scale = 1, seconds = 0;
    int64_t skipped = 0;        // the loss scaler's skipped steps so far
    int64_t guard_skipped = 0;  // the guard's
    bool loss_scaling = false;  // whether the line shows the loss scale
  };
  // A trained step: its time counted, its metrics.jsonl record, and every logging.every steps
  // (and the last) its line.
  void step(const Step& s);

  // What reduced precision did to the numbers since the last report: gradient values that
  // rounding flushed to zero, and per FP8 tensor its amax, scale, underflow and saturation.
  void numerics(int64_t step, Format grads, const std::vector<Fp8TensorState*>& fp8);

  // The tokens trained by the end of `step`: the resumed checkpoint's count, then
  // training.batch_tokens a step (a resume may have changed it).
  int64_t tokens_at(int64_t step) const {
    return resumed_tokens_ + (step - resumed_step_) * cfg_.training.batch_tokens;
  }
  void resumed_from(int64_t step, int64_t tokens) {
    resumed_step_ = step;
    resumed_tokens_ = tokens;
  }

  // A validation loss (every rank's), recorded against the best so far.
  void validation(int64_t step, double val_loss);
  // A checkpoint's best validation loss (-1 as its step: none, a rollback's evaluations after the
  // checkpoint undone).
  void restore_best(double best_val_loss, int64_t best_val_step);
  // A rollback: the evaluations after its checkpoint are undone.
  void forget_last_validation() { last_val_ = NAN; }
  std::optional<double> best_val() const { return best_val_; }
  int64_t best_val_step() const { return best_val_step_; }
  double last_val() const { return last_val_; }

  struct Totals {
    std::string precision;  // the schedule's label
    bool scheduled = false;  // precision.schedule has phases
    int64_t num_params = 0;
    int64_t skipped = 0, guard_skipped = 0, guard_rollbacks = 0;
    std::optional<int64_t> cuda_graph_replays;  // training.cuda_graph's
  };
  // The run's last line and summary.json (rank 0 writes it); returns the device memory's peak.
  size_t summarize(double wall_seconds, const Totals& totals);

  const std::vector<double>& step_seconds() const { return step_seconds_; }
  const std::optional<MfuPeaks>& peaks() const { return peaks_; }

 private:
  void recheck_cpu_ceiling(double flops_per_s);
  // Samples drawn from each source in the steps up to `step` (all ranks).
  std::vector<int64_t> source_samples(int64_t step) const;

  RunLog& log_;
  const Config& cfg_;
  const RunSpec& spec_;
  Communicator& comm_;
  Backend& backend_;
  std::optional<SyntheticInfo> synthetic_;
  std::vector<TrainSource> sources_;    // with several, their blend
  std::optional<SourceBlend> blend_;
  std::optional<MfuPeaks> peaks_;       // absent: a GPU without a known peak
  std::optional<CpuPeak> cpu_ceiling_;  // a one-rank CPU run's sgemm ceiling, for the recheck
  bool ceiling_rechecked_ = false;
  std::optional<GemmPeaks> gpu_peaks_;  // the GPU's, for the mixed peak of each precision phase
  double mix_peak_seconds_ = 0;         // sum over this invocation's steps of seconds x the mixed peak
  std::vector<double> step_seconds_;    // this invocation's steps, a rollback's replayed ones included
  double train_seconds_ = 0, timed_seconds_ = 0;
  int64_t timed_steps_ = 0;
  std::optional<double> best_val_;
  int64_t best_val_step_ = 0;
  double last_val_ = NAN;
  int64_t resumed_step_ = 0, resumed_tokens_ = 0;  // resumed_from's
  CollectiveBytes reported_bytes_;  // comm_.collective_bytes() at the latest step's record
};

}  // namespace ptrain
