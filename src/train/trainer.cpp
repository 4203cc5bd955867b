// The Trainer's construction and its step loop. Precision phases are in trainer_phases.cpp,
// checkpoints, resume and rollback in trainer_checkpoints.cpp, what the run reports in
// run_report.cpp, and train() in train.cpp.
#include "train/trainer.h"

#include <chrono>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cmath>

#include "backend/nvtx.h"
#include "core/error.h"
#include "core/format.h"

namespace ptrain {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// SIGINT/SIGTERM: the first asks the loop to stop after the current micro-batch, save the last
// completed step and exit; the second (the handler is then back to the default) ends the process
// at once. Checkpoints are written atomically, so neither can leave a damaged one behind.
volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_acknowledge = 0;  // rank 0 says at once that the request arrived

extern "C" void on_stop_signal(int sig) {
  const int saved_errno = errno;  // the interrupted code may be about to read it
  g_stop_signal = sig;
  std::signal(sig, SIG_DFL);
  if (g_acknowledge) {
    // write(2) is async-signal-safe; the log's sinks are not.
    static const char kAck[] =
        "\nptrain: stop requested: stopping after the current micro-batch and saving the last completed step "
        "(a second signal ends the run at once)\n";
    const ssize_t written = ::write(STDERR_FILENO, kAck, sizeof kAck - 1);
    (void)written;  // nothing to do about a closed stderr inside a handler
  }
  errno = saved_errno;
}

struct StopSignalScope {
  explicit StopSignalScope(bool acknowledge) {
    g_stop_signal = 0;
    g_acknowledge = acknowledge;
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignalScope() {
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
  }
};

// The plan's opened shards: prepare_run opens a synthetic corpus's once rank 0 has made it.
const TokenStream& opened(const std::optional<TokenStream>& stream, const char* key) {
  PTRAIN_CHECK(stream.has_value(), std::string(key) + " is not open: a Trainer needs a plan prepare_run has prepared");
  return *stream;
}

}  // namespace

Trainer::Trainer(RunPlan& plan, TrainerDevices devices, const TrainOptions& options)
    : plan_(plan),
      cfg_(plan.config),
      spec_(plan.spec),
      options_(options),
      checkpoint_dir_(plan.checkpoint_dir),
      phases_(plan.spec.precision, plan.spec.fallback),
      policy_(phases_.policy(slot_)),
      comm_(std::move(devices.comm)),
      log_(comm_->is_main() ? RunLog(plan.run_dir) : RunLog::silent()),
      train_sampler_(plan.data.train_sampler(static_cast<uint64_t>(cfg_.run.seed), spec_.batch.seq_len)),
      val_sampler_(opened(plan.data.val, "data.val"), "data.val", cfg_.training.eval_batches, spec_.batch.micro_batch,
                   spec_.batch.seq_len),
      device_choice_(std::move(devices.device_choice)),
      to_set_aside_(plan.superseded),
      backend_(std::move(devices.backend)),
      attention_(std::move(devices.attention)),
      report_(log_, cfg_, spec_, *comm_, *backend_, plan.data.info),
      model_(spec_.shape, *backend_, DType::f32, spec_.batch.micro_batch, spec_.batch.seq_len, policy_,
             attention_.path, cfg_.model.fused_gelu, spec_.recompute,
             AdamW::master_range(param_count(spec_.shape), cfg_.distributed.zero_stage, comm_->rank(),
                                 comm_->world_size()),
             spec_.fp8_throughout),
      optimizer_(model_, *backend_, spec_.adamw, comm_.get(), cfg_.distributed.zero_stage,
                 cfg_.distributed.grad_reduce_dtype),
      scaler_(policy_.loss_scaling),
      guard_(cfg_.training.guard),
      lr_schedule_(spec_.lr),
      inputs_(static_cast<size_t>(spec_.batch.tokens_per_micro_batch())),
      targets_(static_cast<size_t>(spec_.batch.tokens_per_micro_batch())) {
  if (comm_->is_main() && cfg_.logging.sample_every > 0)
    samples_.emplace(spec_.shape, plan.data.sample_tokenizer, cfg_.logging.sample_prompt,
                     plan.data.sample_prompt, static_cast<uint64_t>(cfg_.run.seed), cfg_.logging.sample_tokens,
                     cfg_.logging.sample_temperature);
  comm_->set_compute_stream(backend_->stream());
  if (model_.has_sharded_params())  // ZeRO-3: the passes gather each block's weights a block ahead
    model_.set_weight_gather({[this](int bucket) { optimizer_.start_weight_gather(bucket); },
                              [this] { optimizer_.wait_weight_gathers(); }});
  // bench refuses --profile before training where the backend cannot profile.
  if (options.profile) PTRAIN_CHECK(backend_->set_profile(options.profile), "this backend cannot profile its ops");
  const int accum = spec_.batch.accumulation;
  loss_sums_ =
      Tensor(backend_->allocate(sizeof(double) * static_cast<size_t>(accum)), DType::f64, {accum}, backend_->device());
}

Trainer::~Trainer() {
  comm_.reset();
  backend_->release(loss_sums_.data);
}

TrainResult Trainer::run() {
  std::optional<LoadedCheckpoint>& resume_from = plan_.resume;
  announce();
  model_.init(static_cast<uint64_t>(cfg_.run.seed), cfg_.model.init_std);
  if (plan_.init_from && !resume_from) {
    int64_t offset = 0;
    for (const ParamSpec& spec : model_.specs()) {
      model_.load_weights(spec.id, plan_.init_from->params.data() + offset);
      offset += shape_numel(spec.shape);
    }
    model_.weights_loaded();
    log_.info("initialised from " + cfg_.model.init_from + " (" + plan_.init_from->source + ")");
  }
  int64_t first_step = 1;
  if (resume_from) {
    // The run goes on in the precision of the step after the checkpoint's (a rollback's bf16
    // fallback included).
    const int64_t next = resume_from->state.step + 1;
    guard_.set_rollback(resume_from->state.guard.rollback);
    if (next <= cfg_.training.steps && slot_at(next) != slot_) enter_slot(slot_at(next), next);
    first_step = resume(*resume_from) + 1;
    resume_from.reset();
  }
  report_.announce_ranks(comm_->all_gather(static_cast<double>(optimizer_.state_bytes())),
                         !optimizer_.master_shard().empty());
  const int64_t steps = cfg_.training.steps;
  if (first_step > steps) {
    log_.info("nothing to train: the checkpoint is at step " + std::to_string(first_step - 1) +
              ", training.steps is " + std::to_string(steps) + " (raise training.steps to train further)");
    return result_;
  }
  const int64_t eval_every = cfg_.training.eval_every;
  if (eval_every > 0 && first_step == 1) evaluate(0);

  StopSignalScope signals(comm_->rank() == 0);
  const auto run_start = Clock::now();
  for (int64_t step = first_step; step <= steps; ++step) {
    NvtxRange step_range("step");
    const bool new_slot = slot_at(step) != slot_;
    if (new_slot) enter_slot(slot_at(step), step);
    const auto t0 = Clock::now();
    if (options_.profile) options_.profile->begin_step();
    const double lr = lr_schedule_.at(step - 1);
    // Not in a step that begins a precision phase, nor in the first after a rollback: the
    // checkpoint of the step before does not hold what the run has set up for them.
    const bool after_rollback = guard_.rollback().count > 0 && step == guard_.rollback().to_step + 1;
    const StepOutcome outcome = train_step(step, lr, !new_slot && !after_rollback);
    if (outcome.abandoned_after > 0) {
      stop_mid_step(step, outcome.abandoned_after);
      break;
    }
    const double seconds = seconds_since(t0);
    if (options_.profile) options_.profile->end_step(seconds);
    report_.step({step, outcome.loss, outcome.grad_norm, lr, outcome.loss_scale, seconds, scaler_.skipped_steps(),
                  guard_.skipped(), policy_.loss_scaling.mode != LossScalingMode::off});
    if (outcome.finding.verdict == DivergenceGuard::Verdict::rollback) {
      step = roll_back(step, outcome.finding);  // the loop goes on after the checkpoint's step
      continue;
    }
    if (step % cfg_.logging.numerics_every == 0 || step == steps)
      report_.numerics(step, policy_.activation_grads, model_.numerics_tensors());
    if (eval_every > 0 ? (step % eval_every == 0 || step == steps) : step == steps) evaluate(step);
    if (cfg_.logging.sample_every > 0 && step % cfg_.logging.sample_every == 0) {
      const std::vector<float> master = optimizer_.master_on_main();  // under ZeRO-1 every rank sends its shard
      if (samples_)
        log_.info("sample step " + std::to_string(step) + " (temperature " +
                  number_text(cfg_.logging.sample_temperature) + "):\n" + samples_->at_step(step, master));
    }

    const bool stop = outcome.signalled || (options_.stop_at > 0 && step >= options_.stop_at);
    const bool periodic = cfg_.checkpoint.every > 0 && step % cfg_.checkpoint.every == 0;
    const bool final_save = stop || (step == steps && cfg_.checkpoint.save_final);
    const bool saved = (final_save || periodic) && save(step, final_save);
    if (stop && !saved)
      throw EnvironmentError("stopped after step " + std::to_string(step) +
                             " without a checkpoint of it (the save failed); the newest checkpoint is " +
                             (result_.last_checkpoint.empty() ? std::string("an earlier one") : result_.last_checkpoint));
    if (stop && step < steps) {
      log_.info(std::string(outcome.signalled ? "stopped by signal" : "stopped as asked (--stop-at)") + " after step " +
                std::to_string(step) + "; checkpoint " + result_.last_checkpoint +
                "\nresume with: ptrain train CONFIG --set checkpoint.resume=auto (same run.name)");
      result_.interrupted = true;
      break;
    }
  }
  if (!result_.interrupted) {
    RunReport::Totals totals{phases_.schedule().label(), phases_.scheduled(), model_.num_params(),
                             scaler_.skipped_steps(), guard_.skipped(), guard_.rollback().count, std::nullopt};
    if (cfg_.training.cuda_graph) totals.cuda_graph_replays = model_.replays();
    result_.peak_device_bytes = report_.summarize(seconds_since(run_start), totals);
  }
  result_.step_seconds = report_.step_seconds();
  result_.device = device_choice_;
  result_.attention = attention_.path;
  result_.flops_per_token = spec_.flops_per_token;
  result_.mfu_peaks = report_.peaks();
  result_.tokens_per_step = cfg_.training.batch_tokens;
  result_.final_val_loss = report_.last_val();
  return result_;
}

Trainer::StepOutcome Trainer::train_step(int64_t step, double lr, bool may_abandon) {
  const int B = spec_.batch.micro_batch, T = spec_.batch.seq_len, accum = spec_.batch.accumulation;
  StepFaults& faults = plan_.faults;
  optimizer_.gather_primary_fp8_weights(true);  // the gradient buffer stages them: before zero_grad
  model_.zero_grad();
  // One slot per micro-batch of the global batch: each rank fills its own, the sum over ranks
  // gathers them, and they are added in global order, as one rank would. A last slot carries
  // the stop signal, so that every rank stops after the same step (a signal reaches each rank at
  // its own moment, and a rank that stopped alone would leave the others waiting in a collective).
  const int world = comm_->world_size(), rank = comm_->rank();
  const size_t global_micros = static_cast<size_t>(accum * world);
  std::vector<double> micro_losses(global_micros + 1, 0.0);
  StepOutcome out;
  // The loss is multiplied by the loss scale (1 unless loss scaling is on) so that small
  // gradients survive fp16; the optimizer divides it out again.
  out.loss_scale = scaler_.scale();
  const float dloss = static_cast<float>(out.loss_scale * cfg_.training.loss_weight * faults.grad_factor(step) /
                                         static_cast<double>(int64_t{B} * T * accum * world));
  // On GPUs the gradient all-reduce of each block starts as soon as the last micro-batch's
  // backward pass has finished that block (ZeRO-1 reduce-scatters the whole buffer after,
  // ZeRO-2 each block's gradients as every micro-batch's backward pass finishes them).
  const bool overlap = overlaps_all_reduce();
  for (int micro = 0; micro < accum; ++micro) {
    // Rank r trains micro-batches r * accum ... of the global batch: disjoint samples, and the
    // same global batch for any number of ranks.
    const int global_micro = rank * accum + micro;
    const int64_t first_sample = ((step - 1) * accum * world + global_micro) * B;
    train_sampler_.fill(first_sample, B, inputs_.data(), targets_.data());
    NvtxRange range("micro-batch");
    const Tensor loss_sum = loss_sums_.range(micro, 1);
    if (model_.has_grad_buckets())  // ZeRO-2: every micro-batch's buckets go to their owners
      model_.train_micro_batch(inputs_.data(), targets_.data(), dloss, loss_sum,
                               [&](int bucket) { optimizer_.reduce_grad_bucket(bucket, micro == 0); });
    else if (overlap && micro == accum - 1)
      model_.train_micro_batch(inputs_.data(), targets_.data(), dloss, loss_sum,
                               [&](int block) { comm_->all_reduce_sum_async(model_.block_grads(block)); });
    else
      model_.train_micro_batch(inputs_.data(), targets_.data(), dloss, loss_sum);
    while (faults.signal_after(step, micro + 1)) std::raise(SIGINT);
    // A stop request ends the step here rather than after the remaining micro-batches (the
    // last one's gradients are reduced as it runs, so from then on the step finishes).
    if (may_abandon && micro + 1 < accum && stop_requested_by_any_rank()) {
      model_.abandon_step();
      out.signalled = true;
      out.abandoned_after = micro + 1;
      return out;
    }
  }
  // The losses stay on the device until all micro-batches are queued: one wait, not one each.
  std::vector<double> loss_sums(static_cast<size_t>(accum));
  backend_->download_doubles(loss_sums.data(), loss_sums_);
  for (int micro = 0; micro < accum; ++micro)
    micro_losses[static_cast<size_t>(rank * accum + micro)] =
        loss_sums[static_cast<size_t>(micro)] / static_cast<double>(int64_t{B} * T);
  if (const std::string& failed = model_.recording_failure(); !failed.empty() && !recording_failure_logged_) {
    log_.warn("training.cuda_graph: recording a micro-batch failed, so micro-batches run as called from here on: " +
              failed);
    recording_failure_logged_ = true;
  }
  micro_losses[global_micros] = g_stop_signal != 0 ? 1.0 : 0.0;
  comm_->all_reduce_sum(micro_losses.data(), micro_losses.size());
  out.signalled = micro_losses[global_micros] > 0;
  double loss = 0;
  for (size_t i = 0; i < global_micros; ++i) loss += micro_losses[i];
  out.loss = loss / static_cast<double>(global_micros) * faults.loss_factor(step);
  out.finding = guard_.observe(out.loss);
  // Before any update a non-finite loss can only come from the weights or the config (an
  // init_std or loss_weight far too large): no skipped update would recover, so it stops.
  if (step == 1 && !std::isfinite(out.loss))
    stop_diverged(step, "the loss of step 1 is " + format_number("%g", out.loss) +
                            " before any update: the initial weights or the config (model.init_std, "
                            "training.loss_weight) make the model's output non-finite; nothing was trained");
  const DivergenceGuard::Verdict verdict = out.finding.verdict;
  if (verdict == DivergenceGuard::Verdict::stop) stop_diverged(step, out.finding.why);
  NvtxRange range("optimizer");
  {
    NvtxRange comm_range("communication");
    // The squares are summed in double, where no float gradient overflows: the norm is finite
    // exactly when every gradient is, so one pass serves clipping and overflow detection.
    out.grad_norm = optimizer_.reduce_gradients(overlap) / out.loss_scale;
    reduce_fp8_amax();
  }
  // The loss scaler sees every step's gradients, a guard-skipped one's too (an overflow still
  // backs its scale off); the update happens when neither skips it. A rollback's step is not
  // applied either: the checkpoint it goes back to replaces it.
  const bool overflow = scaler_.update(!std::isfinite(out.grad_norm));
  if (verdict == DivergenceGuard::Verdict::skip) {
    guard_.count_skip();
    log_.metrics({{"step", step}, {"guard", "skip"}, {"reason", out.finding.why}});
    log_.warn("guard: step " + std::to_string(step) + ": " + out.finding.why + "; its update skipped (" +
              std::to_string(guard_.skipped()) + " so far; training.guard.action: skip)");
    // Skipping cannot end a divergence that the weights already carry: a cap stops it.
    if (guard_.consecutive_skips() >= cfg_.training.guard.max_skips)
      stop_diverged(step, out.finding.why + ", and " + std::to_string(guard_.consecutive_skips()) +
                              " updates in a row were skipped (training.guard.max_skips)");
  } else if (!overflow && verdict != DivergenceGuard::Verdict::rollback) {
    optimizer_.step(lr, out.grad_norm, out.loss_scale);
  }
  model_.end_step();
  return out;
}

// Every rank asks at the same micro-batch, so all of them abandon the same step or none.
bool Trainer::stop_requested_by_any_rank() {
  double requested = g_stop_signal != 0 ? 1.0 : 0.0;
  if (comm_->world_size() > 1) comm_->all_reduce_sum(&requested, 1);
  return requested > 0;
}

// A stop request in the middle of `step`: its micro-batches so far are dropped, and the state in
// memory, that of the step before, is saved unless a checkpoint already holds it.
void Trainer::stop_mid_step(int64_t step, int micro_batches_run) {
  const int64_t completed = step - 1;
  log_.metrics({{"stop", {{"reason", "signal"}, {"last_completed_step", completed}, {"abandoned_step", step},
                          {"micro_batches_run", micro_batches_run}, {"of", spec_.batch.accumulation}}}});
  std::string where;
  if (completed == 0) {
    where = "nothing was trained, so no checkpoint was written";
  } else if (saved_step_ == completed) {
    where = "its checkpoint " + saved_checkpoint_ + " holds it";
  } else {
    if (!save(completed, true))
      throw EnvironmentError("stopped during step " + std::to_string(step) + " without a checkpoint of step " +
                             std::to_string(completed) + " (the save failed)");
    where = "checkpoint " + result_.last_checkpoint;
  }
  log_.info("stopped by signal during step " + std::to_string(step) + ", after micro-batch " +
            std::to_string(micro_batches_run) + " of " + std::to_string(spec_.batch.accumulation) +
            " (that step is dropped); the last completed step is " + std::to_string(completed) + ": " + where +
            (completed > 0 ? "\nresume with: ptrain train CONFIG --set checkpoint.resume=auto (same run.name)"
                           : std::string()));
  result_.interrupted = true;
}

// The guard's stop: said in the log and metrics, then exit code 4 (nothing more is saved: the
// newest checkpoint is from before the divergence).
void Trainer::stop_diverged(int64_t step, const std::string& why) {
  log_.metrics({{"step", step}, {"guard", "stop"}, {"reason", why}});
  throw DivergedError("training stopped by the divergence guard at step " + std::to_string(step) + ": " + why +
                      "; the newest checkpoint is " +
                      (!result_.last_checkpoint.empty() ? result_.last_checkpoint
                       : !resumed_from_.empty()         ? resumed_from_ + " (resumed from)"
                                                        : std::string("none of this run")) +
                      (cfg_.training.guard.action == GuardAction::stop
                           ? " (training.guard.action: skip skips such steps instead)"
                           : ""));
}

// Whether each block's gradient all-reduce starts during the last micro-batch's backward pass.
// A bf16 exchange stages the gradients a chunk at a time after the backward pass.
bool Trainer::overlaps_all_reduce() const {
  return comm_->world_size() > 1 && comm_->overlaps_compute() && !optimizer_.sharded() && !optimizer_.exchanges_bf16();
}

// Delayed FP8 scaling: the amax each rank saw this step, max-reduced across ranks before the
// history moves on, so every rank computes the same scales (TransformerEngine's reduce_amax).
void Trainer::reduce_fp8_amax() {
  if (comm_->world_size() == 1 || policy_.fp8.recipe != Fp8Recipe::delayed) return;
  const std::vector<Fp8TensorState*> tensors = model_.fp8_tensors();
  if (tensors.empty()) return;
  std::vector<float> amax;
  for (const Fp8TensorState* t : tensors) amax.push_back(t->delayed.history()[0]);
  comm_->all_reduce_max(amax.data(), amax.size());
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i]->delayed.record(amax[i]);
}

// The validation batches are shared out across ranks (batch j on rank j % world) and their
// losses added in batch order, so the result does not depend on the number of ranks.
void Trainer::evaluate(int64_t step) {
  optimizer_.gather_primary_fp8_weights(false);
  std::vector<double> losses(static_cast<size_t>(val_sampler_.batches()), 0.0);
  const int world = comm_->world_size(), batches = val_sampler_.batches();
  // Under ZeRO-3 every forward pass gathers weights with all ranks, so each rank runs as many:
  // a rank past the last batch runs batch 0 again and keeps nothing of it.
  const int rounds = model_.has_sharded_params() ? (batches + world - 1) / world : 0;
  for (int k = 0, j = comm_->rank(); j < batches || k < rounds; ++k, j += world) {
    val_sampler_.fill(j < batches ? j : 0, inputs_.data(), targets_.data());
    const double loss = model_.forward(inputs_.data(), targets_.data(), 0.0f);
    if (j < batches) losses[static_cast<size_t>(j)] = loss;
  }
  comm_->all_reduce_sum(losses.data(), losses.size());
  double sum = 0;
  for (const double l : losses) sum += l;
  report_.validation(step, sum / val_sampler_.batches());
}

void Trainer::announce() {
  log_.info("ptrain " PTRAIN_VERSION " | run " + cfg_.run.name + " | device " + backend_->description() +
            " | precision " + (phases_.scheduled() ? phases_.schedule().describe() : policy_.label()));
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
  report_.announce_run(model_.num_params(), plan_.data, val_sampler_.batches());
  report_.announce_peaks(model_.native_fp8_weights());
}

}  // namespace ptrain
