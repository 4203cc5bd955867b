#include "train/trainer.h"

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "backend/backend.h"
#include "backend/device.h"
#include "core/format.h"
#include "metrics/cpu_peak.h"
#include "metrics/device_peak.h"
#include "backend/nvtx.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/llmc.h"
#include "core/error.h"
#include "core/output_file.h"
#include "data/dataset.h"
#include "data/synthetic.h"
#include "data/tokenizer.h"
#include "data/utf8.h"
#include "dist/communicator.h"
#include "metrics/run_log.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "optim/divergence_guard.h"
#include "optim/schedule.h"
#include "precision/loss_scaler.h"
#include "precision/policy.h"
#include "train/gpu_memory_plan.h"
#include "train/run_plan.h"
#include "train/run_spec.h"
#include "train/sampling.h"

namespace fs = std::filesystem;

namespace ptrain {

// Samples printed during training: warm enough to show what the model has learned, not its
// single most likely path (which repeats itself).
constexpr double kSampleTemperature = 0.8;
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// SIGINT/SIGTERM: the first asks the loop to finish its step, save and exit; the second
// (the handler is then back to the default) ends the process at once. Checkpoints are written
// atomically, so neither can leave a damaged one behind.
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
  std::signal(sig, SIG_DFL);
}

struct StopSignalScope {
  StopSignalScope() {
    g_stop_signal = 0;
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignalScope() {
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
  }
};

// The keys that shape the rest of a run: a resume with other values continues, with a warning.
nlohmann::json schedule_json(const Config& c) {
  return {{"training.steps", c.training.steps},
          {"training.batch_tokens", c.training.batch_tokens},
          {"training.micro_batch", c.training.micro_batch},
          {"training.seq_len", c.training.effective_seq_len(c.model)},
          {"run.seed", c.run.seed},
          {"optimizer.lr", c.optimizer.lr},
          {"schedule.warmup_steps", c.schedule.warmup_steps},
          {"schedule.decay", c.schedule.decay},
          {"schedule.min_lr_ratio", c.schedule.min_lr_ratio}};
}



class Trainer {
 public:
  // `train` and `val` are the opened shards; `synthetic` the source of a synthetic corpus.
  Trainer(const Config& config, TokenStream train, TokenStream val, std::optional<SyntheticInfo> synthetic,
          const DataPlan& text, const fs::path& run_dir, const fs::path& checkpoint_dir,
          const TrainOptions& options, std::unique_ptr<Backend> backend, std::string device_choice,
          AttentionChoice attention, std::unique_ptr<Communicator> comm, StepFaults faults, const RunSpec& spec)
      : cfg_(config),
        spec_(spec),
        options_(options),
        checkpoint_dir_(checkpoint_dir),
        phases_(spec.precision),
        fallback_(spec.fallback),
        policy_(phases_.phases.front().policy),
        comm_(std::move(comm)),
        log_(comm_->is_main() ? RunLog(run_dir.string()) : RunLog::silent()),
        shape_(spec.shape),
        B_(spec.batch.micro_batch),
        T_(spec.batch.seq_len),
        accum_(spec.batch.accumulation),
        train_stream_(std::move(train)),
        val_stream_(std::move(val)),
        train_sampler_(train_stream_, static_cast<uint64_t>(config.run.seed), T_),
        val_sampler_(val_stream_, "data.val", config.training.eval_batches, B_, T_),
        synthetic_(std::move(synthetic)),
        tokenizer_name_(text.tokenizer),
        sample_tokenizer_(text.sample_tokenizer),
        sample_prompt_(text.sample_prompt),
        device_choice_(std::move(device_choice)),
        backend_(std::move(backend)),
        attention_(std::move(attention)),
        model_(shape_, *backend_, DType::f32, B_, T_, policy_, attention_.path, config.model.fused_gelu,
               spec.recompute),
        optimizer_(model_, *backend_,
                   spec.adamw, comm_.get(), config.distributed.zero_stage),
        scaler_(policy_.loss_scaling),
        guard_(config.training.guard),
        faults_(std::move(faults)),
        schedule_(spec.lr),
        inputs_(static_cast<size_t>(B_) * T_),
        targets_(static_cast<size_t>(B_) * T_) {
    flops_per_token_ = spec.flops_per_token;
    comm_->set_compute_stream(backend_->stream());
    // bench refuses --profile before training where the backend cannot profile.
    if (options.profile) PTRAIN_CHECK(backend_->set_profile(options.profile), "this backend cannot profile its ops");
    loss_sums_ = Tensor(backend_->allocate(sizeof(double) * static_cast<size_t>(accum_)), DType::f64, {accum_},
                        backend_->device());
  }

  // The communicator goes first: a GPU one orders its work against the backend's stream and may
  // have collectives in flight.
  ~Trainer() {
    comm_.reset();
    backend_->release(loss_sums_.data);
  }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // `resume_from` is released once restored: its host copies of the weights and moments are
  // not kept for the whole run.
  TrainResult run(std::optional<LoadedCheckpoint>& resume_from, const std::optional<InitWeights>& init_from) {
    announce();
    model_.init(static_cast<uint64_t>(cfg_.run.seed), cfg_.model.init_std);
    if (init_from && !resume_from) {
      backend_->upload(model_.master_flat(), init_from->params.data());
      model_.sync_params_from_master();
      log_.info("initialised from " + cfg_.model.init_from + " (" + init_from->source + ")");
    }
    int64_t first_step = 1;
    if (resume_from) {
      // The run goes on in the precision of the step after the checkpoint's (a rollback's bf16
      // fallback included).
      const int64_t next = resume_from->state.step + 1;
      guard_.set_rollback(resume_from->state.guard.rollback);
      if (next <= cfg_.training.steps && slot_at(next) != phase_) enter_phase(slot_at(next), next);
      first_step = resume(*resume_from) + 1;
      resume_from.reset();
    }
    optimizer_.adopt_master();  // ZeRO-1: from here on each rank keeps only its shard
    announce_ranks();
    const int64_t steps = cfg_.training.steps;
    if (first_step > steps) {
      log_.info("nothing to train: the checkpoint is at step " + std::to_string(first_step - 1) +
                ", training.steps is " + std::to_string(steps) + " (raise training.steps to train further)");
      return result_;
    }
    const int64_t eval_every = cfg_.training.eval_every;
    if (eval_every > 0 && first_step == 1) evaluate(0);

    StopSignalScope signals;
    const auto run_start = Clock::now();
    double train_seconds = 0, timed_seconds = 0;
    int64_t timed_steps = 0;
    int64_t steps_run = 0;  // a rollback's replayed steps included
    for (int64_t step = first_step; step <= steps; ++step) {
      NvtxRange step_range("step");
      if (slot_at(step) != phase_) enter_phase(slot_at(step), step);
      const auto t0 = Clock::now();
      if (options_.profile) options_.profile->begin_step();
      const double lr = schedule_.at(step - 1);
      model_.zero_grad();
      // One slot per micro-batch of the global batch: each rank fills its own, the sum over
      // ranks gathers them, and they are added in global order, as one rank would. A last slot
      // carries the stop signal, so that every rank stops after the same step (a signal reaches
      // each rank at its own moment, and a rank that stopped alone would leave the others
      // waiting in a collective).
      const int world = comm_->world_size(), rank = comm_->rank();
      const size_t global_micros = static_cast<size_t>(accum_ * world);
      std::vector<double> micro_losses(global_micros + 1, 0.0);
      // The loss is multiplied by the loss scale (1 unless loss scaling is on) so that small
      // gradients survive fp16; the optimizer divides it out again.
      const double loss_scale = scaler_.scale();
      const float dloss = static_cast<float>(loss_scale * cfg_.training.loss_weight * faults_.grad_factor(step) /
                                             static_cast<double>(int64_t{B_} * T_ * accum_ * comm_->world_size()));
      // On GPUs the gradient all-reduce of each block starts as soon as the last micro-batch's
      // backward pass has finished that block (ZeRO-1 reduce-scatters the whole buffer after).
      const bool overlap = overlaps_all_reduce();
      for (int micro = 0; micro < accum_; ++micro) {
        // Rank r trains micro-batches r * accum_ ... of the global batch: disjoint samples, and
        // the same global batch for any number of ranks.
        const int global_micro = rank * accum_ + micro;
        const int64_t first_sample = ((step - 1) * accum_ * world + global_micro) * B_;
        train_sampler_.fill(first_sample, B_, inputs_.data(), targets_.data());
        NvtxRange range("micro-batch");
        const Tensor loss_sum = loss_sums_.range(micro, 1);
        if (overlap && micro == accum_ - 1)
          model_.train_micro_batch(inputs_.data(), targets_.data(), dloss, loss_sum,
                                   [&](int block) { comm_->all_reduce_sum_async(model_.block_grads(block)); });
        else
          model_.train_micro_batch(inputs_.data(), targets_.data(), dloss, loss_sum);
      }
      // The losses stay on the device until all micro-batches are queued: one wait, not one each.
      std::vector<double> loss_sums(static_cast<size_t>(accum_));
      backend_->download_doubles(loss_sums.data(), loss_sums_);
      for (int micro = 0; micro < accum_; ++micro)
        micro_losses[static_cast<size_t>(rank * accum_ + micro)] =
            loss_sums[static_cast<size_t>(micro)] / static_cast<double>(int64_t{B_} * T_);
      if (const std::string& failed = model_.recording_failure(); !failed.empty() && !recording_failure_logged_) {
        log_.warn("training.cuda_graph: recording a micro-batch failed, so micro-batches run as called from here "
                  "on: " + failed);
        recording_failure_logged_ = true;
      }
      micro_losses[global_micros] = g_stop_signal != 0 ? 1.0 : 0.0;
      comm_->all_reduce_sum(micro_losses.data(), micro_losses.size());
      const bool signalled = micro_losses[global_micros] > 0;
      double loss = 0;
      for (size_t i = 0; i < global_micros; ++i) loss += micro_losses[i];
      loss = loss / static_cast<double>(global_micros) * faults_.loss_factor(step);
      const DivergenceGuard::Finding finding = guard_.observe(loss);
      // Before any update a non-finite loss can only come from the weights or the config (an
      // init_std or loss_weight far too large): no skipped update would recover, so it stops.
      if (step == 1 && !std::isfinite(loss))
        stop_diverged(step, "the loss of step 1 is " + format_number("%g", loss) +
                                " before any update: the initial weights or the config (model.init_std, "
                                "training.loss_weight) make the model's output non-finite; nothing was trained");
      if (finding.verdict == DivergenceGuard::Verdict::stop) stop_diverged(step, finding.why);
      const bool guard_skip = finding.verdict == DivergenceGuard::Verdict::skip;
      // A rollback's step is not applied either: the checkpoint it goes back to replaces it.
      const bool rolling_back = finding.verdict == DivergenceGuard::Verdict::rollback;
      // The squares are summed in double, where no float gradient overflows: the norm is finite
      // exactly when every gradient is, so one pass serves clipping and overflow detection.
      double norm;
      {
        NvtxRange range("optimizer");
        {
          NvtxRange comm_range("communication");
          norm = optimizer_.reduce_gradients(overlap) / loss_scale;
          reduce_fp8_amax();
        }
        // The loss scaler sees every step's gradients, a guard-skipped one's too (an overflow
        // still backs its scale off); the update happens when neither skips it.
        const bool overflow = scaler_.update(!std::isfinite(norm));
        if (guard_skip) {
          guard_.count_skip();
          log_.metrics({{"step", step}, {"guard", "skip"}, {"reason", finding.why}});
          log_.warn("guard: step " + std::to_string(step) + ": " + finding.why + "; its update skipped (" +
                    std::to_string(guard_.skipped()) + " so far; training.guard.action: skip)");
          // Skipping cannot end a divergence that the weights already carry: a cap stops it.
          if (guard_.consecutive_skips() >= cfg_.training.guard.max_skips)
            stop_diverged(step, finding.why + ", and " + std::to_string(guard_.consecutive_skips()) +
                                    " updates in a row were skipped (training.guard.max_skips)");
        } else if (!overflow && !rolling_back) {
          optimizer_.step(lr, norm, loss_scale);
        }
        model_.end_step();
      }
      const double seconds = seconds_since(t0);
      if (options_.profile) options_.profile->end_step(seconds);
      train_seconds += seconds;
      ++steps_run;
      if (peaks_) mix_peak_seconds_ += seconds * peaks_->mix;
      result_.step_seconds.push_back(seconds);
      if (step > 1 || steps == 1) {  // the first step warms caches and thread pools
        timed_seconds += seconds;
        ++timed_steps;
      }
      log_step(step, loss, norm, lr, loss_scale, seconds, timed_steps ? timed_seconds / timed_steps : seconds);
      if (rolling_back) {
        step = roll_back(step, finding);  // the loop goes on after the checkpoint's step
        continue;
      }
      if (step % cfg_.logging.numerics_every == 0 || step == steps) log_numerics(step);
      if (eval_every > 0 ? (step % eval_every == 0 || step == steps) : step == steps) evaluate(step);
      if (cfg_.logging.sample_every > 0 && step % cfg_.logging.sample_every == 0) print_sample(step);

      const bool stop = signalled || (options_.stop_at > 0 && step >= options_.stop_at);
      const bool periodic = cfg_.checkpoint.every > 0 && step % cfg_.checkpoint.every == 0;
      const bool final_save = stop || (step == steps && cfg_.checkpoint.save_final);
      const bool saved = (final_save || periodic) && save(step, final_save);
      if (stop && !saved)
        throw EnvironmentError("stopped after step " + std::to_string(step) +
                               " without a checkpoint of it (the save failed); the newest checkpoint is " +
                               (result_.last_checkpoint.empty() ? std::string("an earlier one") : result_.last_checkpoint));
      if (stop && step < steps) {
        log_.info(std::string(signalled ? "stopped by signal" : "stopped as asked (--stop-at)") + " after step " +
                  std::to_string(step) + "; checkpoint " + result_.last_checkpoint +
                  "\nresume with: ptrain train CONFIG --set checkpoint.resume=auto (same run.name)");
        result_.interrupted = true;
        break;
      }
    }
    if (!result_.interrupted) summarize(seconds_since(run_start), train_seconds, steps_run);
    result_.device = device_choice_;
    result_.flops_per_token = flops_per_token_;
    result_.mfu_peaks = peaks_;
    result_.tokens_per_step = cfg_.training.batch_tokens;
    result_.final_val_loss = last_val_;
    return result_;
  }

  // The guard's stop: said in the log and metrics, then exit code 4 (nothing more is saved: the
  // newest checkpoint is from before the divergence).
  [[noreturn]] void stop_diverged(int64_t step, const std::string& why) {
    log_.metrics({{"step", step}, {"guard", "stop"}, {"reason", why}});
    throw DivergedError("training stopped by the divergence guard at step " + std::to_string(step) + ": " + why +
                        "; the newest checkpoint is " +
                        (!result_.last_checkpoint.empty() ? result_.last_checkpoint
                         : !resumed_from_.empty()         ? resumed_from_ + " (resumed from)"
                                                          : std::string("none of this run")) +
                        (cfg_.training.guard.action == GuardAction::stop ? " (training.guard.action: skip skips such steps instead)"
                                                              : ""));
  }

  // training.guard.action rollback at `step`: reloads the newest checkpoint from before the
  // divergence's first bad step, sets aside the checkpoints after it, and trains on from there in
  // bf16 (for training.guard.fallback_steps steps, or to the end). The data after the checkpoint
  // is replayed: the sampler is a function of the step. Returns the checkpoint's step.
  int64_t roll_back(int64_t step, const DivergenceGuard::Finding& finding) {
    const int64_t first_bad = step - finding.bad_steps + 1;
    // Rank 0 chooses the checkpoint and every rank loads that one: a rank's own search could see
    // another listing of a shared file system.
    double chosen = 0;  // its step + 1; 0: none
    if (comm_->is_main())
      if (const auto found = find_latest_checkpoint(
              checkpoint_dir_.string(), [&](const std::string& m) { log_.warn(m); }, first_bad))
        chosen = static_cast<double>(found->state.step + 1);
    comm_->all_reduce_sum(&chosen, 1);
    if (chosen == 0)
      stop_diverged(step, finding.why + "; no checkpoint from before step " + std::to_string(first_bad) +
                              " to roll back to (checkpoint.every, checkpoint.keep_last)");
    const int64_t to = static_cast<int64_t>(chosen) - 1;
    const DivergenceGuard::Rollback before = guard_.rollback();
    // Back onto (or before) the checkpoint of the last rollback: the same steps would follow.
    if (before.to_step >= 0 && to <= before.to_step) {
      const bool ended = before.fallback_last >= 0 && before.fallback_last < step;
      stop_diverged(step, finding.why + ", again after rolling back to the checkpoint of step " +
                              std::to_string(before.to_step) + ": the bf16 fallback" +
                              (ended ? " (to step " + std::to_string(before.fallback_last) +
                                           ") did not prevent it; a longer training.guard.fallback_steps (0: to the "
                                           "end) might"
                                     : std::string(" did not prevent it")));
    }
    std::optional<LoadedCheckpoint> ckpt = load_checkpoint((checkpoint_dir_ / checkpoint_name(to)).string());
    const int64_t fallback_steps = cfg_.training.guard.fallback_steps;
    const int64_t steps = cfg_.training.steps;
    const DivergenceGuard::Rollback now{
        to, fallback_steps > 0 ? (fallback_steps >= steps - to ? steps : to + fallback_steps) : -1, before.count + 1};
    const std::string until =
        now.fallback_last < 0 || now.fallback_last >= steps ? "to the end of the run" : "to step " + std::to_string(now.fallback_last) + ", then " +
                                                              policy_of(phases_.phase_at(now.fallback_last + 1)).label() +
                                                              " again";
    log_.metrics({{"step", step},
                  {"guard", "rollback"},
                  {"reason", finding.why},
                  {"to_step", to},
                  {"checkpoint", ckpt->path},
                  {"fallback", fallback_.label()},
                  {"fallback_last", now.fallback_last < 0 ? nlohmann::json() : nlohmann::json(now.fallback_last)}});
    log_.warn("guard: step " + std::to_string(step) + ": " + finding.why + "; rolled back to " + ckpt->path +
              " (step " + std::to_string(to) + "): bf16 from step " + std::to_string(to + 1) + " " + until +
              "; the steps after the checkpoint train on the same data again (training.guard.action: rollback)");
    comm_->barrier();  // every rank has read the checkpoint before rank 0 moves the later ones
    if (comm_->is_main()) {
      for (const std::string& p : set_aside_checkpoints(checkpoints_after(checkpoint_dir_.string(), to)))
        log_.warn("set aside " + p + ": it came after the checkpoint the guard rolled back to");
      point_latest_at(checkpoint_dir_.string(), to);  // not at a checkpoint just set aside
    }
    comm_->barrier();
    guard_.set_rollback(now);
    if (slot_at(to + 1) != phase_) enter_phase(slot_at(to + 1), to + 1);
    resume(*ckpt, &now);
    last_val_ = NAN;  // the evaluations after the checkpoint are undone
    result_.last_checkpoint = ckpt->path;
    return to;
  }

  // Where each step's precision comes from: its precision.schedule phase (0 .. n-1), or slot n,
  // the bf16 fallback after a rollback.
  size_t slot_at(int64_t step) const {
    return guard_.rollback().in_fallback(step) ? phases_.phases.size() : phases_.phase_at(step);
  }
  const PrecisionPolicy& policy_of(size_t slot) const {
    return slot == phases_.phases.size() ? fallback_ : phases_.phases[slot].policy;
  }

  // precision.schedule: from `step` on, phase `phase` trains (or the guard's bf16 fallback, slot
  // n). The old phase's FP8 linears and their scaling state go, the new phase's (if any) start
  // fresh, and the loss scaler restarts; every other buffer stays (a schedule's modes store
  // tensors alike). At a phase's first step this is the switch, said in the log and metrics;
  // later (a resume) it only sets the phase up.
  void enter_phase(size_t phase, int64_t step) {
    const std::string from = policy_.label();
    phase_ = phase;
    policy_ = policy_of(phase);
    const std::string unrecorded = model_.switch_fp8(policy_);
    restart_scaler(scaler_.skipped_steps());
    const std::string fp8_gemms = model_.fp8_gemm_summary();
    const std::string mix_peak = gpu_peaks_ ? update_mix_peak() : std::string();
    const std::string of = " of " + std::to_string(phases_.phases.size());
    const DivergenceGuard::Rollback& rollback = guard_.rollback();
    if (phase == phases_.phases.size()) {
      if (step != rollback.to_step + 1)
        log_.info("precision: resuming at step " + std::to_string(step) + " in the guard's bf16 fallback");
    } else if (rollback.fallback_last >= 0 && step == rollback.fallback_last + 1) {
      log_.metrics({{"step", step}, {"precision_phase", {{"phase", phase + 1}, {"from", from}, {"to", policy_.label()}}}});
      log_.info("precision: step " + std::to_string(step) + " ends the guard's bf16 fallback: " +
                (phases_.scheduled() ? "phase " + std::to_string(phase + 1) + of + ", " : std::string()) +
                policy_.label() + " again (" +
                (fp8_gemms.empty() ? "" : "FP8 layers made afresh; ") + "loss scaler restarted)");
    } else if (phase > 0 && step == phases_.phases[phase - 1].last_step + 1) {
      log_.metrics({{"step", step},
                    {"precision_phase", {{"phase", phase + 1}, {"from", from}, {"to", policy_.label()}}}});
      log_.info("precision: step " + std::to_string(step) + " starts phase " + std::to_string(phase + 1) + of + ", " +
                from + " -> " + policy_.label() + " (" + (from.rfind("fp8", 0) == 0 ? "FP8 scaling state dropped; " : "") +
                (fp8_gemms.empty() ? "" : "FP8 layers made afresh; ") + "loss scaler restarted)");
    } else {
      log_.info("precision: resuming at step " + std::to_string(step) + " in phase " + std::to_string(phase + 1) + of +
                ", " + policy_.label());
    }
    if (!fp8_gemms.empty()) log_.info("fp8: " + fp8_gemms);
    if (!mix_peak.empty()) log_.info("MFU: this phase's precision mix peaks at " + mix_peak);
    if (!unrecorded.empty()) log_.warn("training.cuda_graph: micro-batches run as called in this phase: " + unrecorded);
  }

  // A fresh loss scaler of the current phase's settings; the count of skipped steps goes on.
  void restart_scaler(int64_t skipped) {
    scaler_ = LossScaler(policy_.loss_scaling);
    LossScaler::State fresh = scaler_.state();
    fresh.skipped = skipped;
    scaler_.restore(fresh);
  }

  // Whether each block's gradient all-reduce starts during the last micro-batch's backward pass.
  bool overlaps_all_reduce() const {
    return comm_->world_size() > 1 && comm_->overlaps_compute() && !optimizer_.sharded();
  }

  void warn(const std::string& message) { log_.warn(message); }
  void log_only(const std::string& message) { log_.file_only("warning: " + message); }

  // Restores a checkpoint's tensors and state; returns the step it was taken after. A rollback
  // (`rolling_back`) keeps the guard's memory of it, and says so itself.
  int64_t resume(const LoadedCheckpoint& ckpt, const DivergenceGuard::Rollback* rolling_back = nullptr) {
    const CheckpointState& st = ckpt.state;
    restore_tensors(ckpt, model_, optimizer_);
    if (!rolling_back) resumed_from_ = ckpt.path;
    guard_.restore(st.guard);
    if (rolling_back) guard_.set_rollback(*rolling_back);
    // A checkpoint of a phase's last step: the next phase starts its loss scaler and FP8 state
    // afresh, as the uninterrupted run did at the boundary.
    const bool boundary = slot_at(st.step) != slot_at(st.step + 1);
    if (boundary)
      restart_scaler(st.scaler.skipped);
    else if (st.scaler_mode == policy_.loss_scaling.mode)
      scaler_.restore(st.scaler);
    else
      log_.warn(std::string("loss scaling was ") + choice_name(st.scaler_mode) + " in the checkpoint and is " +
                choice_name(policy_.loss_scaling.mode) + " now: the loss scaler starts afresh");
    int64_t restored = 0;
    for (Fp8TensorState* t : boundary ? std::vector<Fp8TensorState*>{} : model_.fp8_tensors())
      for (const Fp8ScalingState& saved : st.fp8)
        if (saved.name == t->name && saved.history.size() == t->delayed.history().size()) {
          t->delayed.restore(saved.history, saved.scale);
          ++restored;
        }
    if (!boundary && restored != static_cast<int64_t>(model_.fp8_tensors().size()) &&
        policy_.fp8.recipe == Fp8Recipe::delayed && policy_.fp8.enabled)
      log_.warn(std::to_string(model_.fp8_tensors().size() - restored) +
                " FP8 tensors start with fresh delayed-scaling state (not in the checkpoint, or another "
                "precision.fp8.amax_history)");
    // The LR schedule and the data order are functions of these keys and the step.
    const nlohmann::json now = schedule_json(cfg_);
    for (const auto& [key, value] : now.items())
      if (!st.schedule.contains(key) || st.schedule[key] != value)
        log_.warn(key + " is " + value.dump() + " now and was " +
                  (st.schedule.contains(key) ? st.schedule[key].dump() : "absent") +
                  " in the checkpoint: the resumed run continues, but not as the original would have");
    if (st.best_val_step >= 0) {
      best_val_ = st.best_val_loss;
      best_val_step_ = st.best_val_step;
    } else {
      best_val_.reset();  // a rollback's: the evaluations after the checkpoint are undone
      best_val_step_ = 0;
    }
    if (rolling_back) return st.step;
    log_.metrics({{"resume", {{"from", ckpt.path}, {"step", st.step}, {"precision", policy_.label()},
                              {"saved_precision", st.precision}}}});
    log_.info("resumed from " + ckpt.path + " after step " + std::to_string(st.step) +
              (st.precision != policy_.label() && !(boundary && phase_ > 0 && st.precision == policy_of(phase_ - 1).label())
                   ? " (saved under precision " + st.precision + ", now " + policy_.label() +
                                                      "; the FP32 master weights carry over)"
                                                : std::string()));
    return st.step;
  }

  // Returns false when a periodic save failed and checkpoint.on_save_error let training continue.
  bool save(int64_t step, bool final_save) {
    CheckpointState st;
    st.step = step;
    st.tokens = step * cfg_.training.batch_tokens;
    st.optimizer_steps = optimizer_.steps_taken();
    st.scaler = scaler_.state();
    st.guard = guard_.state();
    st.scaler_mode = policy_.loss_scaling.mode;
    st.schedule = schedule_json(cfg_);
    for (const Fp8TensorState* t : model_.fp8_tensors()) st.fp8.push_back({t->name, t->delayed.history(), t->delayed.scale()});
    if (best_val_) {
      st.best_val_loss = *best_val_;
      st.best_val_step = best_val_step_;
    }
    st.precision = policy_.label();
    st.tokenizer = tokenizer_name_;
    st.model = model_json(cfg_.model);
    st.data_seed = static_cast<uint64_t>(cfg_.run.seed);
    st.next_sample = step * accum_ * comm_->world_size() * B_;
    try {
      result_.last_checkpoint =
          save_checkpoint(checkpoint_dir_.string(), st, model_, optimizer_, cfg_.checkpoint.keep_last, comm_.get());
    } catch (const EnvironmentError& e) {
      // The earlier checkpoints and `latest` are untouched; the training state is in memory.
      const std::string what = "checkpoint at step " + std::to_string(step) + " failed: " + e.what();
      // A failed final save is never skipped over: the run would end with nothing to show.
      if (cfg_.checkpoint.on_save_error == OnSaveError::continue_ && !final_save) {
        log_.warn(what + "; training continues (checkpoint.on_save_error: continue)");
        return false;
      }
      throw EnvironmentError(what + "; the run stops (" +
                             (final_save ? std::string("the final checkpoint") : "checkpoint.on_save_error: stop") +
                             "); earlier checkpoints are intact");
    }
    log_.metrics({{"checkpoint", {{"step", step}, {"path", result_.last_checkpoint}}}});
    log_.info("checkpoint step " + std::to_string(step) + " -> " + result_.last_checkpoint);
    return true;
  }

 private:
  void announce() {
    const double n = static_cast<double>(model_.num_params());
    log_.info("ptrain " PTRAIN_VERSION " | run " + cfg_.run.name + " | device " + backend_->description() +
              " | precision " + (phases_.scheduled() ? phases_.describe() : policy_.label()));
    log_.info(device_choice_);
    log_.info("attention: " + attention_.reason);
    if (cfg_.training.cuda_graph) {
      const std::string refused = model_.record_micro_batches();
      if (refused.empty())
        log_.info(std::string("cuda graph: each kind of micro-batch runs once as called, then its forward and backward "
                              "are recorded and replayed as one CUDA graph") +
                  (overlaps_all_reduce() ? "; a step's last micro-batch runs as called, beside its per-block all-reduces"
                                         : ""));
      else
        log_.warn("training.cuda_graph: micro-batches run as called: " + refused);
    }
    const std::string fp8_gemms = model_.fp8_gemm_summary();
    if (!fp8_gemms.empty()) log_.info("fp8: " + fp8_gemms);
    for (const std::string& warning : backend_->performance_warnings()) log_.warn(warning);
    const bool llama = shape_.arch == Arch::llama;
    const std::string llama_shape = " KV=" + std::to_string(shape_.kv_heads()) + " F=" + std::to_string(shape_.mlp_width()) +
                                    (shape_.tied_head ? " tied head" : " untied head") + (shape_.qk_norm ? " QK-norm" : "");
    log_.info(std::string("model: ") + (llama ? "Llama" : "GPT-2") + " L=" + std::to_string(shape_.n_layer) +
              " H=" + std::to_string(shape_.n_head) + (llama ? llama_shape : "") + " C=" + std::to_string(shape_.n_embd) +
              " T=" + std::to_string(T_) + " V=" + std::to_string(shape_.vocab) + " (padded " +
              std::to_string(shape_.padded_vocab) + ") | " + format_thousands(n) + " parameters");
    log_.info("batch: " + format_thousands(static_cast<double>(cfg_.training.batch_tokens)) + " tokens/step = " +
              std::to_string(B_) + " x " + std::to_string(T_) + " x " + std::to_string(accum_) + " accumulation steps" +
              (comm_->world_size() > 1 ? " x " + std::to_string(comm_->world_size()) + " ranks" : std::string()) +
              " | " + std::to_string(cfg_.training.steps) + " steps");
    log_.info("data: train " + format_thousands(static_cast<double>(train_stream_.size())) + " tokens in " +
              std::to_string(train_stream_.files().size()) + " shard(s), val " +
              format_thousands(static_cast<double>(val_stream_.size())) + " tokens; eval on " +
              std::to_string(val_sampler_.batches()) + " batches");
    if (synthetic_)
      log_.info("synthetic source: vocab " + std::to_string(synthetic_->spec.vocab) + ", order " +
                std::to_string(synthetic_->spec.order) + ", branching " + std::to_string(synthetic_->spec.branching) +
                " | oracle val loss " + format_number("%.4f", synthetic_->oracle_loss_val) + " (the floor), ln(V) " +
                format_number("%.4f", std::log(shape_.vocab)));
    log_.info("memory: " + plan_memory(spec_).describe() +
              (cfg_.training.recompute == Recompute::none
                   ? ""
                   : " (training.recompute: " + std::string(choice_name(cfg_.training.recompute)) + ")"));
    announce_mfu_peaks();
  }

  // The peaks MFU is quoted against, stated once: a GPU's from the data-sheet table (the BF16
  // dense peak and the run's precision mix's), a CPU's measured sgemm rate (no BF16 peak: the
  // CPU backend's GEMMs are FP32 sgemm whatever the precision).
  void announce_mfu_peaks() {
    if (!comm_->is_main()) return;  // one rank logs; the others need not measure a CPU's rate
    const std::string per_token = "model FLOPs 6N + 6LCT = " + format_number("%.4g", flops_per_token_) + " per token";
    if (backend_->device() != Device::cuda) {
      // Ranks sharing the machine are busy while rank 0 measures: that figure is not cached.
      const int ranks = comm_->world_size();
      const CpuPeak cpu = cpu_sgemm_peak(ranks == 1 ? PeakCache::use : PeakCache::off);
      peaks_ = MfuPeaks{std::nullopt, cpu.flops * ranks};
      if (ranks == 1) cpu_ceiling_ = cpu;  // under mpirun the other ranks train meanwhile: no recheck
      log_.info("MFU: " + per_token + "; against this CPU's sgemm rate, " + format_number("%.1f", cpu.flops / 1e9) +
                " GFLOP/s" + (ranks > 1 ? " x " + std::to_string(ranks) + " ranks" : "") + " (" + cpu.describe() +
                (ranks > 1 ? "; not cached: the other ranks share the machine" : "") + "); a CPU has no BF16 peak");
      return;
    }
    const CudaProbe probe = probe_cuda();
    const PeakLookup lookup =
        probe.devices.empty() ? PeakLookup{std::nullopt, "the device's properties could not be read: " + probe.why_none}
                              : lookup_device_peaks(probe.devices[0]);
    if (!lookup.device) {
      log_.info("MFU: " + per_token + "; no MFU: " + lookup.why_none);
      return;
    }
    const GemmPeaks& p = lookup.device->peaks;
    gpu_peaks_ = p;
    const double ranks = comm_->world_size();
    const auto tflops = [](double v) { return format_number("%.1f", v / 1e12) + " TFLOP/s"; };
    log_.info("MFU: " + per_token + "; against " + lookup.device->part + "'s dense BF16 peak, " + tflops(p.bf16) +
              (ranks > 1 ? " (x " + format_number("%.0f", ranks) + " ranks in MFU)" : "") + ", and this run's precision mix's, " +
              update_mix_peak() + "; " + lookup.device->source + ", dense");
  }

  // MFU's peaks on a GPU for the precision phase now running (its FP8 GEMMs at the FP8 peak);
  // returns the mixed peak in words.
  std::string update_mix_peak() {
    const GemmPeaks& p = *gpu_peaks_;
    const double fp8_share = 6.0 * static_cast<double>(model_.native_fp8_weights()) / flops_per_token_;
    const bool fp32 = cfg_.precision.mode == PrecisionMode::fp32;
    const double other = fp32 ? (cfg_.precision.tf32 ? p.tf32 : p.fp32) : p.bf16;
    const std::string other_name = fp32 ? (cfg_.precision.tf32 ? "tf32" : "fp32") : "bf16";
    // The step's FLOPs are the global batch's: the peaks are those of all the ranks' devices.
    const double ranks = comm_->world_size();
    peaks_ = MfuPeaks{p.bf16 * ranks, mixed_peak(fp8_share, p.fp8, other) * ranks};
    const auto tflops = [](double v) { return format_number("%.1f", v / 1e12) + " TFLOP/s"; };
    return tflops(peaks_->mix) + " (" + format_number("%.1f", 100 * fp8_share) + "% of the FLOPs in native FP8 GEMMs at " +
           tflops(p.fp8) + ", the rest at " + other_name + "'s " + tflops(other) + ")";
  }

  // A step faster than the CPU's sgemm ceiling means the ceiling was measured too low (cached from
  // a busier moment, say): it is measured again, once per run, and the cache replaced. Under
  // data parallelism the other ranks are training meanwhile, so the figure would be no better.
  void recheck_cpu_ceiling(double flops_per_s) {
    if (!cpu_ceiling_ || ceiling_rechecked_ || flops_per_s <= peaks_->mix) return;
    ceiling_rechecked_ = true;
    const double before = cpu_ceiling_->flops;
    const CpuPeak again = cpu_sgemm_peak(PeakCache::refresh);
    log_.info("MFU: this step's model FLOP/s (" + format_number("%.1f", flops_per_s / 1e9) +
              " G) exceed the sgemm ceiling of " + format_number("%.1f", before / 1e9) + " GFLOP/s (" +
              cpu_ceiling_->describe() + "); measured again: " + format_number("%.1f", again.flops / 1e9) +
              " GFLOP/s (" + again.describe() + ")");
    // A figure already known to be too low is not lowered further by a busier moment.
    const double ceiling = std::max(before, again.flops);
    mix_peak_seconds_ *= ceiling / before;  // the steps so far, quoted against the new figure too
    cpu_ceiling_ = again;
    cpu_ceiling_->flops = ceiling;
    peaks_->mix = ceiling;
  }

  void log_step(int64_t step, double loss, double norm, double lr, double loss_scale, double seconds,
                double mean_seconds) {
    const double tokens = static_cast<double>(cfg_.training.batch_tokens);
    const double tok_s = tokens / seconds;
    const int64_t rss = current_rss_bytes();
    const double flops_per_s = flops_per_token_ * tok_s;
    recheck_cpu_ceiling(flops_per_s);
    std::optional<double> mfu, mfu_mix;  // null without a known peak
    if (peaks_ && peaks_->bf16) mfu = flops_per_s / *peaks_->bf16;
    if (peaks_) mfu_mix = flops_per_s / peaks_->mix;
    nlohmann::json record = {{"step", step},
                             {"tokens", static_cast<int64_t>(tokens) * step},
                             {"loss", loss},
                             {"lr", lr},
                             {"grad_norm", norm},
                             {"loss_scale", loss_scale},
                             {"skipped", scaler_.skipped_steps()},
                             {"guard_skipped", guard_.skipped()},
                             {"tokens_per_s", tok_s},
                             {"model_flops_per_s", flops_per_s},
                             {"mfu", mfu ? nlohmann::json(*mfu) : nlohmann::json()},
                             {"mfu_mix", mfu_mix ? nlohmann::json(*mfu_mix) : nlohmann::json()},
                             {"ms", seconds * 1000.0},
                             {"memory_mib", static_cast<double>(rss) / (1024.0 * 1024.0)}};
    const Backend::MemoryUse device_memory = backend_->memory_use();
    if (device_memory.capacity > 0) record["device_memory_peak_mib"] = static_cast<double>(device_memory.peak) / (1 << 20);
    if (mfu_mix && *mfu_mix > 1) record["ceiling_stale"] = true;
    log_.metrics(record);
    if (step % cfg_.logging.every != 0 && step != cfg_.training.steps) return;
    char line[256];
    const int width = static_cast<int>(std::to_string(cfg_.training.steps).size());
    std::snprintf(line, sizeof line, "step %*lld/%lld | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %s tok/s | ETA %s | mem %s",
                  width, static_cast<long long>(step), static_cast<long long>(cfg_.training.steps), loss, norm, lr,
                  seconds * 1000.0, format_thousands(tok_s).c_str(),
                  format_duration(mean_seconds * static_cast<double>(cfg_.training.steps - step)).c_str(),
                  format_mib(rss).c_str());
    std::string text = line;
    if (device_memory.capacity > 0) text += " | gpu mem " + format_mib(static_cast<int64_t>(device_memory.peak));
    text += " | " + format_number("%.3g", flops_per_s / 1e9) + " GFLOP/s";
    // An FP8 run may pass the BF16 peak: only the mix's peak bounds it.
    if (mfu) text += " | MFU " + format_number("%.1f%%", 100.0 * *mfu) + " (mix " + format_utilisation(*mfu_mix) + ")";
    else if (mfu_mix) text += " | MFU " + format_utilisation(*mfu_mix) + " of sgemm";
    // Megatron's convention: loss scale and skipped steps appear when loss scaling is on.
    if (policy_.loss_scaling.mode != LossScalingMode::off)
      text += " | loss scale " + format_number("%g", loss_scale) + " | skipped " + std::to_string(scaler_.skipped_steps());
    log_.info(text);
  }

  // Data parallelism in the log: the communicator, the global batch's split, and each rank's
  // optimizer memory (ZeRO-1 divides it by the number of ranks).
  void announce_ranks() {
    const std::vector<double> state = comm_->all_gather(static_cast<double>(optimizer_.state_bytes()));
    if (comm_->world_size() == 1) return;
    log_.info("data parallel: " + comm_->description() + " | ZeRO stage " + std::to_string(cfg_.distributed.zero_stage));
    std::string line = "optimizer state per rank (AdamW moments" +
                       std::string(optimizer_.master_shard().empty() ? "" : " + FP32 master shard") + "):";
    for (size_t r = 0; r < state.size(); ++r)
      line += (r ? ", " : " ") + std::string("rank ") + std::to_string(r) + " " +
              format_mib(static_cast<int64_t>(state[r]));
    log_.info(line);
    log_.metrics({{"ranks", comm_->world_size()},
                  {"zero_stage", cfg_.distributed.zero_stage},
                  {"optimizer_state_bytes_per_rank", state}});
  }

  // Delayed FP8 scaling: the amax each rank saw this step, max-reduced across ranks before the
  // history moves on, so every rank computes the same scales (TransformerEngine's reduce_amax).
  void reduce_fp8_amax() {
    if (comm_->world_size() == 1 || policy_.fp8.recipe != Fp8Recipe::delayed) return;
    const std::vector<Fp8TensorState*> tensors = model_.fp8_tensors();
    if (tensors.empty()) return;
    std::vector<float> amax;
    for (const Fp8TensorState* t : tensors) amax.push_back(t->delayed.history()[0]);
    comm_->all_reduce_max(amax.data(), amax.size());
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i]->delayed.record(amax[i]);
  }

  // What reduced precision did to the numbers since the last report: gradient values that
  // rounding flushed to zero, and per FP8 tensor its amax, scale, underflow and saturation.
  void log_numerics(int64_t step) {
    const GradNumerics g = backend_->take_grad_numerics();
    const std::vector<Fp8TensorState*> fp8 = model_.fp8_tensors();
    if (g.elements == 0 && fp8.empty()) return;  // nothing reduced-precision to report
    auto fraction = [](int64_t part, int64_t whole) { return whole ? static_cast<double>(part) / whole : 0.0; };
    const double grad_underflow = fraction(g.underflow, g.nonzero);
    nlohmann::json record = {{"step", step},
                             {"numerics", {{"grad_format", format_name(policy_.grads)}, {"grad_underflow", grad_underflow}}}};
    std::string line = "numerics step " + std::to_string(step) + " | " + format_name(policy_.grads) +
                       " grad underflow " + format_number("%.4f%%", 100.0 * grad_underflow);
    const Fp8TensorState* worst_underflow = nullptr;
    const Fp8TensorState* worst_saturation = nullptr;
    for (const Fp8TensorState* t : fp8) {
      const double under = fraction(t->stats.underflow, t->stats.nonzero);
      const double sat = fraction(t->stats.saturated, t->stats.nonzero);
      record["numerics"]["fp8"].push_back({{"tensor", t->name},
                                           {"format", format_name(t->format)},
                                           {"amax", t->stats.amax},
                                           {"scale", t->scale},
                                           {"underflow", under},
                                           {"saturated", sat}});
      if (!worst_underflow || under > fraction(worst_underflow->stats.underflow, worst_underflow->stats.nonzero))
        worst_underflow = t;
      if (!worst_saturation || sat > fraction(worst_saturation->stats.saturated, worst_saturation->stats.nonzero))
        worst_saturation = t;
    }
    if (worst_underflow) {
      line += " | fp8 worst underflow " +
              format_number("%.3f%%", 100.0 * fraction(worst_underflow->stats.underflow, worst_underflow->stats.nonzero)) + " (" +
              worst_underflow->name + "), worst saturation " +
              format_number("%.3f%%", 100.0 * fraction(worst_saturation->stats.saturated, worst_saturation->stats.nonzero)) +
              " (" + worst_saturation->name + ")";
    }
    for (Fp8TensorState* t : fp8) t->reset_stats();
    log_.metrics(record);
    log_.info(line);
  }

  // A sample from the current weights, on rank 0: a copy of them in an FP32 model of
  // micro-batch 1 on the CPU, with its own RNG, so the training run is untouched by it (its
  // losses are the same with samples on or off).
  void print_sample(int64_t step) {
    if (!comm_->is_main()) return;
    if (!sample_model_) {
      sample_backend_ = make_cpu_backend(0);  // 0: the threads training set, unchanged
      sample_model_ = std::make_unique<Gpt>(shape_, *sample_backend_, DType::f32, 1, cfg_.model.seq_len);
    }
    std::vector<float> weights(static_cast<size_t>(model_.num_params()));
    backend_->download(weights.data(), model_.master_flat());
    sample_backend_->upload(sample_model_->master_flat(), weights.data());
    sample_model_->sync_params_from_master();
    const Tokenizer* text = sample_tokenizer_ ? &*sample_tokenizer_ : nullptr;
    std::vector<int32_t> tokens = sample_prompt_;
    if (tokens.empty()) tokens = empty_prompt(text);
    const size_t prompt_tokens = tokens.size();
    Rng rng(static_cast<uint64_t>(cfg_.run.seed), 0x53414D504C45ull + static_cast<uint64_t>(step));
    GenerateOptions g{cfg_.logging.sample_tokens, kSampleTemperature, 0, -1, text ? text->vocab_size() : 0};
    if (text && text->has_end_of_text()) g.stop_token = text->end_of_text();
    generate(*sample_model_, tokens, g, rng, [](int32_t) {});
    const std::vector<int32_t> generated(tokens.begin() + static_cast<std::ptrdiff_t>(prompt_tokens), tokens.end());
    std::string shown;
    if (text) {
      shown = replace_invalid_utf8(cfg_.logging.sample_prompt + text->decode(generated));
    } else {
      for (const int32_t id : generated) shown += (shown.empty() ? "" : " ") + std::to_string(id);
    }
    log_.info("sample step " + std::to_string(step) + " (temperature " + number_text(kSampleTemperature) + "):\n" +
              shown);
  }

  // The validation batches are shared out across ranks (batch j on rank j % world) and their
  // losses added in batch order, so the result does not depend on the number of ranks.
  void evaluate(int64_t step) {
    std::vector<double> losses(static_cast<size_t>(val_sampler_.batches()), 0.0);
    for (int j = comm_->rank(); j < val_sampler_.batches(); j += comm_->world_size()) {
      val_sampler_.fill(j, inputs_.data(), targets_.data());
      losses[static_cast<size_t>(j)] = model_.forward(inputs_.data(), targets_.data(), 0.0f);
    }
    comm_->all_reduce_sum(losses.data(), losses.size());
    double sum = 0;
    for (const double l : losses) sum += l;
    const double val_loss = sum / val_sampler_.batches();
    if (!best_val_ || val_loss < *best_val_) {
      best_val_ = val_loss;
      best_val_step_ = step;
    }
    last_val_ = val_loss;
    nlohmann::json record = {{"step", step}, {"tokens", cfg_.training.batch_tokens * step}, {"val_loss", val_loss}};
    std::string line = "val  step " + std::to_string(step) + " | val_loss " + format_number("%.6f", val_loss);
    if (synthetic_) {
      const double gap = val_loss - synthetic_->oracle_loss_val;
      record["oracle_gap"] = gap;
      line += " | oracle " + format_number("%.4f", synthetic_->oracle_loss_val) + " | gap " + format_number("%.4f", gap);
    }
    log_.metrics(record);
    log_.info(line);
  }

  // `steps_here`: the steps this invocation trained (fewer than training.steps after a resume,
  // more after a rollback);
  // throughput and times are this invocation's.
  void summarize(double wall_seconds, double train_seconds, int64_t steps_here) {
    const double tokens = static_cast<double>(cfg_.training.batch_tokens * cfg_.training.steps);
    const double tokens_here = static_cast<double>(cfg_.training.batch_tokens * steps_here);
    const double flops_per_s = flops_per_token_ * tokens_here / train_seconds;
    nlohmann::json summary = {{"steps", cfg_.training.steps},
                              {"tokens", static_cast<int64_t>(tokens)},
                              {"steps_this_run", steps_here},
                              {"wall_s", wall_seconds},
                              {"train_s", train_seconds},
                              {"tokens_per_s", tokens_here / train_seconds},
                              {"model_flops_per_s", flops_per_s},
                              {"mfu", nullptr},  // null without a known peak
                              {"mfu_mix", nullptr},
                              {"peak_bf16_flops", nullptr},
                              {"peak_mix_flops", nullptr},
                              {"final_val_loss", last_val_},
                              {"best_val_loss", best_val_ ? *best_val_ : NAN},
                              {"best_val_step", best_val_step_},
                              {"peak_memory_mib", static_cast<double>(peak_rss_bytes()) / (1024.0 * 1024.0)},
                              {"peak_device_memory_mib", static_cast<double>(result_.peak_device_bytes = backend_->memory_use().peak) /
                                                             (1024.0 * 1024.0)},
                              {"precision", phases_.label()},
                              {"skipped_steps", scaler_.skipped_steps()},
                              {"guard_skipped_steps", guard_.skipped()},
                              {"guard_rollbacks", guard_.rollback().count},
                              {"num_params", model_.num_params()}};
    if (peaks_) {
      // A precision schedule's phases (and a rollback's bf16 fallback) have their own mixed peaks:
      // their mean over the time trained.
      const bool mixed = phases_.scheduled() || guard_.rollback().count > 0;
      const double mix = mixed && train_seconds > 0 ? mix_peak_seconds_ / train_seconds : peaks_->mix;
      summary["mfu_mix"] = flops_per_s / mix;
      summary["peak_mix_flops"] = mix;
      if (flops_per_s > mix) summary["ceiling_stale"] = true;
      if (peaks_->bf16) {
        summary["mfu"] = flops_per_s / *peaks_->bf16;
        summary["peak_bf16_flops"] = *peaks_->bf16;
      }
    }
    std::string line = "done: " + std::to_string(cfg_.training.steps) + " steps, " + format_thousands(tokens) +
                       " tokens" + (steps_here < cfg_.training.steps ? " (" + std::to_string(steps_here) + " steps in this run)" : "") +
                       " in " + format_duration(wall_seconds) + " | mean " + format_thousands(tokens_here / train_seconds) +
                       " tok/s | best val_loss " + format_number("%.4f", summary["best_val_loss"].get<double>()) + " at step " +
                       std::to_string(best_val_step_);
    if (synthetic_) {
      const double oracle = synthetic_->oracle_loss_val;
      const double start_gap = std::log(shape_.vocab) - oracle;
      const double gap = *best_val_ - oracle;
      summary["oracle_loss"] = oracle;
      summary["oracle_gap"] = gap;
      line += " | oracle " + format_number("%.4f", oracle) + ", gap " + format_number("%.4f", gap) + " (closed " +
              format_number("%.1f", 100.0 * (1.0 - gap / start_gap)) + "% of the gap from ln(V))";
    }
    log_.info(line);
    if (cfg_.training.cuda_graph) {
      const int64_t micro_batches = steps_here * accum_;
      summary["cuda_graph_replays"] = model_.replays();
      log_.info("cuda graph: " + std::to_string(model_.replays()) + " of " + std::to_string(micro_batches) +
                " micro-batches replayed a recording");
    }
    if (comm_->is_main())
      write_file_atomic((fs::path(cfg_.run.out_dir) / cfg_.run.name / "summary.json").string(), summary.dump(2) + "\n");
  }

  const Config& cfg_;
  const RunSpec& spec_;  // the plan's, which outlives the trainer
  TrainOptions options_;
  fs::path checkpoint_dir_;
  PrecisionSchedule phases_;  // precision.schedule's phases (one without a schedule)
  PrecisionPolicy fallback_;  // training.guard.action rollback's bf16
  size_t phase_ = 0;          // the phase (slot_at) the model and loss scaler are set up for
  PrecisionPolicy policy_;    // that phase's
  std::unique_ptr<Communicator> comm_;
  RunLog log_;
  GptShape shape_;
  int B_, T_, accum_;
  TokenStream train_stream_, val_stream_;
  TrainSampler train_sampler_;
  ValSampler val_sampler_;
  std::optional<SyntheticInfo> synthetic_;
  std::string tokenizer_name_;                 // recorded in checkpoints; "" unknown
  std::optional<Tokenizer> sample_tokenizer_;  // logging.sample_every's, when known
  std::vector<int32_t> sample_prompt_;
  std::unique_ptr<Backend> sample_backend_;
  std::unique_ptr<Gpt> sample_model_;
  std::string device_choice_;  // which device run.device gave, and why (for the log)
  std::string resumed_from_;   // the checkpoint this invocation resumed from, if any
  double flops_per_token_ = 0;    // training FLOPs, for model FLOP/s
  std::optional<MfuPeaks> peaks_;  // absent: a GPU without a known peak
  std::optional<CpuPeak> cpu_ceiling_;  // a one-rank CPU run's sgemm ceiling, for recheck_cpu_ceiling
  bool ceiling_rechecked_ = false;
  std::optional<GemmPeaks> gpu_peaks_;  // the GPU's, for the mixed peak of each precision phase
  double mix_peak_seconds_ = 0;         // sum over this invocation's steps of seconds x the mixed peak
  std::unique_ptr<Backend> backend_;
  AttentionChoice attention_;  // the path model.attention gave on this backend, and why
  Gpt model_;
  AdamW optimizer_;
  LossScaler scaler_;
  DivergenceGuard guard_;
  StepFaults faults_;  // PTRAIN_TEST_FAULT (tests only)
  LrSchedule schedule_;
  std::vector<int32_t> inputs_, targets_;
  Tensor loss_sums_;  // f64 per micro-batch of a step, in backend memory: each one's summed token losses
  bool recording_failure_logged_ = false;
  std::optional<double> best_val_;
  double last_val_ = NAN;
  int64_t best_val_step_ = 0;
  TrainResult result_;
};

// Makes (or replaces, or continues) the run directory and everything the plan says goes there
// before training: rank 0 only. A step that fails here is the machine's (exit 1); what this
// invocation created is removed again, so a corrected rerun is not refused as "already exists".
void prepare_directories(const RunPlan& plan, std::vector<std::string>& set_aside) {
  const fs::path run_dir = plan.run_dir;
  const bool fresh = plan.run_dir_action != RunDirAction::continue_run;
  std::error_code ec;
  if (plan.run_dir_action == RunDirAction::replace) {
    fs::remove_all(run_dir, ec);
    if (ec) throw EnvironmentError("run.overwrite: cannot delete " + run_dir.string() + ": " + ec.message());
  }
  try {
    fs::create_directories(run_dir, ec);
    if (ec) throw EnvironmentError("cannot create run directory " + run_dir.string() + ": " + ec.message());
    if (fresh) write_file_atomic((run_dir / kRunMarker).string(), "made by ptrain " PTRAIN_VERSION "\n");
    fs::create_directories(plan.checkpoint_dir, ec);
    if (ec) throw EnvironmentError("checkpoint.dir: cannot create \"" + plan.checkpoint_dir + "\": " + ec.message());
    if (plan.clear_checkpoint_dir) remove_checkpoints(plan.checkpoint_dir);
    claim_checkpoint_dir(plan.checkpoint_dir, plan.run_dir);
    if (plan.data.synthetic) generate_synthetic(*plan.data.synthetic, (run_dir / "data").string());
    // Last, so that a continued run's config.yaml is replaced only once everything else worked.
    write_file_atomic((run_dir / "config.yaml").string(), config_to_yaml(plan.config));
    set_aside = set_aside_checkpoints(plan.superseded);
  } catch (...) {
    if (fresh) fs::remove_all(run_dir, ec);
    throw;
  }
}

}  // namespace


TrainResult train(const Config& config, const TrainOptions& options) {
  RunPlan plan = plan_run(config);
  const bool main_rank = launcher_rank() == 0;
  {
    RunLog console = main_rank ? RunLog() : RunLog::silent();
    for (const auto& w : plan.warnings) console.warn(w);
    for (const auto& w : plan.resume_warnings) console.warn(w);
  }
  // The device, the attention path and the ranks are checks too: a dry run makes them. A dry
  // run of a GPU config on a machine without a GPU plans the GPU's memory instead: what a user
  // asks before renting one.
  const bool cuda = config.run.device == DeviceRequest::cuda;
  const CudaProbe probe = options.dry_run && cuda ? probe_cuda() : CudaProbe{};
  const bool gpu_planned_here = options.dry_run && cuda && probe.devices.empty();
  std::string device_choice;
  std::unique_ptr<Backend> backend;
  if (!gpu_planned_here)
    backend = make_backend(config.run.device, plan.threads, config.precision.tf32, local_rank(), &device_choice);
  const GptShape& shape = plan.spec.shape;
  // The first phase's activations: a precision schedule's phases store them alike (bf16).
  const PrecisionPolicy& policy = plan.spec.precision.phases.front().policy;
  AttentionChoice attention;
  if (backend) {
    attention = backend->choose_attention(config.model.attention, backend->storage_for(policy.activations, DType::f32),
                                          plan.spec.batch.micro_batch, plan.spec.batch.seq_len, shape.n_head,
                                          shape.kv_heads(), shape.head_size());
  } else {
    device_choice = "device cuda: none on this machine (" + probe.why_none +
                    "): `ptrain train` would stop here; below, what a GPU run would take";
    attention.path = expected_gpu_attention(plan.spec, config.model.attention);
    attention.reason = std::string(attention.path == AttentionPath::fused ? "cudnn" : "fallback") +
                       " expected (cuDNN accepts or refuses the shape on the GPU)";
  }
  if (options.dry_run) {
    if (main_rank) {
      RunLog log;
      log.info("# resolved config");
      log.info(config_to_yaml(config));
      log.info(describe_plan(plan) + device_choice + "\nattention: " + attention.reason);
      if (!backend || backend->device() == Device::cuda) {
        const GpuMemoryPlan gpu = plan_gpu_memory(plan.spec, config.distributed.zero_stage, attention.path);
        const CudaProbe gpus = backend ? probe_cuda() : probe;  // run.device: auto may have taken one
        const CudaDeviceInfo* here = gpus.devices.empty() ? nullptr : &gpus.devices.front();
        log.info("GPU memory plan per rank: " + gpu.describe() + "\n" +
                 describe_gpu_fit(gpu, here ? "this " + here->name : "", here ? int64_t(here->memory_bytes) : 0));
      }
      log.info("dry run: nothing written");
    }
    return {};
  }
  std::unique_ptr<Communicator> comm = make_communicator(backend->device());

  // Rank 0 makes the run directory (and the synthetic data); the others wait for it.
  const bool main = comm->is_main();
  std::vector<std::string> set_aside;
  if (main) prepare_directories(plan, set_aside);
  comm->barrier();
  DataPlan& data = plan.data;
  if (data.synthetic) {  // generated just now by rank 0
    data.info = read_synthetic_info((fs::path(plan.run_dir) / "data").string());
    data.train.emplace(data.train_files, "data.train", config.model.vocab_size);
    data.val.emplace(data.val_files, "data.val", config.model.vocab_size);
  }
  const bool restarted_in_place =
      main && !plan.resume && config.checkpoint.resume_auto() && fs::exists(fs::path(plan.run_dir) / "metrics.jsonl");
  Trainer trainer(plan.config, std::move(*data.train), std::move(*data.val), data.info, data, plan.run_dir,
                  plan.checkpoint_dir, options, std::move(backend), std::move(device_choice), std::move(attention),
                  std::move(comm), std::move(plan.faults), plan.spec);
  for (const auto& w : plan.warnings) trainer.log_only(w);
  for (const auto& w : plan.resume_warnings) trainer.log_only(w);
  for (const auto& p : set_aside)
    trainer.warn("set aside " + p + (plan.resume ? ": it came after the checkpoint resumed from"
                                                  : ": it is not usable, and training starts afresh"));
  if (restarted_in_place)
    trainer.warn("no valid checkpoint in " + plan.checkpoint_dir + ": training starts from step 0 in " + plan.run_dir);
  return trainer.run(plan.resume, plan.init_from);
}

}  // namespace ptrain
