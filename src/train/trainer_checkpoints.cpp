// The Trainer's checkpoints: saving one, resuming from one, and training.guard.action rollback,
// which goes back to one.
#include "train/trainer.h"

#include <cmath>

#include "checkpoint/checkpoint.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace ptrain {

namespace {

// The keys the LR schedule and the data order are functions of (with the step): a resume with
// other values continues, with a warning. Kept in state.json as "schedule".
nlohmann::json resume_keys(const Config& c) {
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

}  // namespace

// Restores a checkpoint's tensors and state; returns the step it was taken after. A rollback
// (`rolling_back`) keeps the guard's memory of it, and says so itself.
int64_t Trainer::resume(const LoadedCheckpoint& ckpt, const DivergenceGuard::Rollback* rolling_back) {
  const CheckpointState& st = ckpt.state;
  restore_tensors(ckpt, model_, optimizer_);
  // A checkpoint resumed from elsewhere (checkpoint.resume: PATH) is not this run's to resume.
  std::error_code ec;
  const bool ours = fs::equivalent(fs::path(ckpt.path).parent_path(), checkpoint_dir_, ec);
  saved_step_ = ours ? st.step : 0;
  saved_checkpoint_ = ours ? ckpt.path : std::string();
  if (!rolling_back) resumed_from_ = ckpt.path;
  guard_.restore(st.guard);
  if (rolling_back) guard_.set_rollback(*rolling_back);
  // A checkpoint of a slot's last step: the next slot starts its loss scaler and FP8 state
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
  const nlohmann::json now = resume_keys(cfg_);
  for (const auto& [key, value] : now.items())
    if (!st.schedule.contains(key) || st.schedule[key] != value)
      log_.warn(key + " is " + value.dump() + " now and was " +
                (st.schedule.contains(key) ? st.schedule[key].dump() : "absent") +
                " in the checkpoint: the resumed run continues, but not as the original would have");
  report_.restore_best(st.best_val_loss, st.best_val_step);
  report_.resumed_from(st.step, st.tokens);
  if (rolling_back) return st.step;
  log_.metrics({{"resume", {{"from", ckpt.path}, {"step", st.step}, {"precision", policy_.label()},
                            {"saved_precision", st.precision}}}});
  // At a schedule's boundary the checkpoint was saved under the phase before (the fallback
  // counts as the phase after the last): the switch itself says so.
  const size_t index = slot_.fallback ? phases_.count() : slot_.phase;
  const bool said_by_switch =
      boundary && index > 0 && st.precision == phases_.policy(PrecisionSlot{false, index - 1}).label();
  log_.info("resumed from " + ckpt.path + " after step " + std::to_string(st.step) +
            (st.precision != policy_.label() && !said_by_switch
                 ? " (saved under precision " + st.precision + ", now " + policy_.label() +
                       "; the FP32 master weights carry over)"
                 : std::string()));
  return st.step;
}

// Returns false when a periodic save failed and checkpoint.on_save_error let training continue.
bool Trainer::save(int64_t step, bool final_save) {
  CheckpointState st;
  st.step = step;
  st.tokens = report_.tokens_at(step);
  st.optimizer_steps = optimizer_.steps_taken();
  st.scaler = scaler_.state();
  st.guard = guard_.state();
  st.scaler_mode = policy_.loss_scaling.mode;
  st.schedule = resume_keys(cfg_);
  for (const Fp8TensorState* t : model_.fp8_tensors()) st.fp8.push_back({t->name, t->delayed.history(), t->delayed.scale()});
  if (report_.best_val()) {
    st.best_val_loss = *report_.best_val();
    st.best_val_step = report_.best_val_step();
  }
  st.precision = policy_.label();
  st.tokenizer = plan_.data.tokenizer;
  st.vocabulary_sha256 = plan_.data.vocabulary_sha256;
  st.model = model_json(cfg_.model);
  st.data_seed = static_cast<uint64_t>(cfg_.run.seed);
  st.next_sample = step * spec_.batch.accumulation * comm_->world_size() * spec_.batch.micro_batch;
  try {
    // The later (or unusable) checkpoints go aside only once this one is complete: a run that
    // fails before its first checkpoint leaves them, and `latest`, as they were.
    const auto set_aside_superseded = [&] {
      const bool resumed = !resumed_from_.empty();
      for (const std::string& p : set_aside_checkpoints(to_set_aside_))
        log_.warn("set aside " + p + (resumed ? ": it came after the checkpoint resumed from"
                                              : ": it is not usable, and training started afresh"));
      to_set_aside_.clear();
    };
    result_.last_checkpoint = save_checkpoint(checkpoint_dir_.string(), st, model_, optimizer_,
                                              cfg_.checkpoint.keep_last, comm_.get(), set_aside_superseded);
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
  saved_step_ = step;
  saved_checkpoint_ = result_.last_checkpoint;
  log_.metrics({{"checkpoint", {{"step", step}, {"path", result_.last_checkpoint}}}});
  log_.info("checkpoint step " + std::to_string(step) + " -> " + result_.last_checkpoint);
  return true;
}

// training.guard.action rollback at `step`: reloads the newest checkpoint from before the
// divergence's first bad step, sets aside the checkpoints after it, and trains on from there in
// bf16 (for training.guard.fallback_steps steps, or to the end). The data after the checkpoint
// is replayed: the sampler is a function of the step. Returns the checkpoint's step.
int64_t Trainer::roll_back(int64_t step, const DivergenceGuard::Finding& finding) {
  const int64_t first_bad = step - finding.bad_steps + 1;
  // Rank 0 chooses the checkpoint and every rank loads that one: a rank's own search could see
  // another listing of a shared file system.
  double chosen = 0;  // its step + 1; 0: none
  if (comm_->is_main())
    if (const auto found = find_latest_checkpoint(
            checkpoint_dir_.string(), [&](const std::string& m) { log_.warn(m); }, first_bad))
      chosen = static_cast<double>(found->state.step + 1);
  comm_->all_reduce_sum(&chosen, 1);
  const DivergenceGuard::Rollback before = guard_.rollback();
  const RollbackDecision decision = decide_rollback(step, finding, static_cast<int64_t>(chosen) - 1, before,
                                                    cfg_.training.steps, cfg_.training.guard.fallback_steps);
  if (!decision.stop.empty()) stop_diverged(step, decision.stop);
  const DivergenceGuard::Rollback& now = decision.next;
  const int64_t to = now.to_step, steps = cfg_.training.steps;
  std::optional<LoadedCheckpoint> ckpt = load_checkpoint((checkpoint_dir_ / checkpoint_name(to)).string());
  const std::string until =
      now.fallback_last < 0 || now.fallback_last >= steps
          ? "to the end of the run"
          : "to step " + std::to_string(now.fallback_last) + ", then " +
                phases_.policy(phases_.at(now.fallback_last + 1, {})).label() + " again";
  log_.metrics({{"step", step},
                {"guard", "rollback"},
                {"reason", finding.why},
                {"to_step", to},
                {"checkpoint", ckpt->path},
                {"fallback", phases_.fallback().label()},
                {"fallback_last", now.fallback_last < 0 ? nlohmann::json() : nlohmann::json(now.fallback_last)}});
  log_.warn("guard: step " + std::to_string(step) + ": " + finding.why + "; rolled back to " + ckpt->path + " (step " +
            std::to_string(to) + "): bf16 from step " + std::to_string(to + 1) + " " + until +
            "; the steps after the checkpoint train on the same data again (training.guard.action: rollback)");
  comm_->barrier();  // every rank has read the checkpoint before rank 0 moves the later ones
  if (comm_->is_main()) {
    for (const std::string& p : set_aside_checkpoints(checkpoints_after(checkpoint_dir_.string(), to)))
      log_.warn("set aside " + p + ": it came after the checkpoint the guard rolled back to");
    point_latest_at(checkpoint_dir_.string(), to);  // not at a checkpoint just set aside
  }
  comm_->barrier();
  guard_.set_rollback(now);
  if (slot_at(to + 1) != slot_) enter_slot(slot_at(to + 1), to + 1);
  resume(*ckpt, &now);
  report_.forget_last_validation();
  result_.last_checkpoint = ckpt->path;
  return to;
}

}  // namespace ptrain
