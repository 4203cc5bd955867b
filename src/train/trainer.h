// `ptrain train`: from a validated config to a finished run directory. `train()` plans the run
// (train/run_plan.h), chooses the device, makes the run directory and runs a Trainer. The Trainer
// is public so that tests build one in-process over a backend of their choice, with the faults
// they need put in its plan (RunPlan::faults), instead of driving a run into divergence.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/op_profile.h"
#include "config/config.h"
#include "dist/communicator.h"
#include "metrics/device_peak.h"
#include "metrics/run_log.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/divergence_guard.h"
#include "optim/schedule.h"
#include "precision/loss_scaler.h"
#include "train/precision_phases.h"
#include "train/run_plan.h"
#include "train/run_report.h"
#include "train/sampling.h"

namespace ptrain {

struct TrainOptions {
  bool dry_run = false;  // validate, print the plan, write nothing
  int planned_ranks = 0;  // dry run: plan this many data-parallel ranks without a launcher (0: the launcher's)
  int64_t stop_at = 0;   // > 0: after this step, save a checkpoint and stop as if interrupted
  OpProfile* profile = nullptr;  // per-op times of each step (CPU backend; bench --profile)
  std::string fit;  // dry run: the GpuKind key (capacity_plan.h) whose capacity to plan, or empty
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
  AttentionPath attention = AttentionPath::fallback;  // the path model.attention took
  std::optional<MfuPeaks> mfu_peaks;  // what MFU was quoted against; absent for a GPU not in the table
};

// Runs training. Throws UserError for problems a user can fix (data, run directory); nothing is
// written before the config and the data have been validated.
TrainResult train(const Config& config, const TrainOptions& options);

// Where a Trainer runs: the backend run.device gave (and why), model.attention's path on it, and
// the communicator of the ranks.
struct TrainerDevices {
  std::unique_ptr<Backend> backend;
  std::string device_choice;
  AttentionChoice attention;
  std::unique_ptr<Communicator> comm;
};

// A checked plan carried out on `devices`: prepare_run, then a Trainer over them, which first
// logs the plan's warnings. What train() does after its dry-run
// branch; tests call it in-process with faults put into the plan.
TrainResult run_planned(RunPlan& plan, TrainerDevices devices, const TrainOptions& options);

// Rank 0 makes (or replaces, or continues) the run directory and everything the plan puts there
// before training (the synthetic corpus, config.yaml), then every rank opens a synthetic
// corpus's shards. A step that fails is the machine's (exit 1); what this call created is removed
// again, so a corrected rerun is not refused. The plan's superseded checkpoints stay where they
// are: the first checkpoint this run publishes sets them aside (Trainer::save), so a run that
// fails before it leaves them, and `latest`, as they were.
void prepare_run(RunPlan& plan, Communicator& comm);

// model.attention's path for the plan's model and batch on `backend`, and why.
AttentionChoice choose_attention(const RunPlan& plan, Backend& backend);

class Trainer {
 public:
  // `plan` (prepared by prepare_run) outlives the trainer, which reads its config, spec and data.
  Trainer(RunPlan& plan, TrainerDevices devices, const TrainOptions& options);
  // The communicator goes first: a GPU one orders its work against the backend's stream and may
  // have collectives in flight.
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains from the plan's resume checkpoint (released once restored: its host copies of the
  // weights and moments are not kept for the whole run) or its init_from weights.
  TrainResult run();

  void warn(const std::string& message) { log_.warn(message); }
  void log_only(const std::string& message) { log_.file_only("warning: " + message); }

 private:
  // One optimizer step up to the update: its micro-batches, the losses summed over ranks, the
  // guard's verdict, the gradients reduced, the loss scaler's, and the update unless skipped.
  struct StepOutcome {
    double loss = 0, grad_norm = 0, loss_scale = 1;
    bool signalled = false;  // a rank received SIGINT/SIGTERM
    // A stop request between two micro-batches left the step unfinished after this many of them
    // (0: the step ran to its end); nothing of it is kept.
    int abandoned_after = 0;
    DivergenceGuard::Finding finding;
  };
  // `may_abandon`: a stop request may end the step between micro-batches (not in a step whose
  // set-up, a new precision phase or a rollback's, the last completed step's checkpoint lacks).
  StepOutcome train_step(int64_t step, double lr, bool may_abandon);
  bool stop_requested_by_any_rank();
  void stop_mid_step(int64_t step, int micro_batches_run);
  [[noreturn]] void stop_diverged(int64_t step, const std::string& why);
  bool overlaps_all_reduce() const;
  void reduce_fp8_amax();
  void evaluate(int64_t step);
  void announce();

  // Precision phases (trainer_phases.cpp).
  void enter_slot(const PrecisionSlot& slot, int64_t step);
  void restart_scaler(int64_t skipped);
  PrecisionSlot slot_at(int64_t step) const { return phases_.at(step, guard_.rollback()); }

  // Checkpoints, resume and rollback (trainer_checkpoints.cpp).
  int64_t resume(const LoadedCheckpoint& ckpt, const DivergenceGuard::Rollback* rolling_back = nullptr);
  bool save(int64_t step, bool final_save);
  int64_t roll_back(int64_t step, const DivergenceGuard::Finding& finding);

  RunPlan& plan_;
  const Config& cfg_;
  const RunSpec& spec_;
  TrainOptions options_;
  std::filesystem::path checkpoint_dir_;
  PrecisionPhases phases_;
  PrecisionSlot slot_;      // what the model and loss scaler are set up for
  PrecisionPolicy policy_;  // that slot's
  std::unique_ptr<Communicator> comm_;
  RunLog log_;
  TrainSampler train_sampler_;  // over the plan's shards
  ValSampler val_sampler_;
  std::optional<TrainingSamples> samples_;  // logging.sample_every's, on rank 0
  std::string device_choice_;  // which device run.device gave, and why (for the log)
  std::string resumed_from_;   // the checkpoint this invocation resumed from, if any
  // The checkpoint of this run's checkpoint directory that holds the state in memory, and its
  // step (0: none).
  int64_t saved_step_ = 0;
  std::string saved_checkpoint_;
  std::vector<std::string> to_set_aside_;  // the plan's superseded checkpoints, until the first save
  std::unique_ptr<Backend> backend_;
  AttentionChoice attention_;  // the path model.attention gave on this backend, and why
  RunReport report_;
  Transformer model_;
  AdamW optimizer_;
  LossScaler scaler_;
  DivergenceGuard guard_;
  LrSchedule lr_schedule_;
  std::vector<int32_t> inputs_, targets_;
  Tensor loss_sums_;  // f64 per micro-batch of a step, in backend memory: each one's summed token losses
  bool recording_failure_logged_ = false;
  TrainResult result_;
};

}  // namespace ptrain
