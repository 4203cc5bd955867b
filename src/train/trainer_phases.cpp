// The Trainer's precision phases: entering a precision.schedule phase or the guard's bf16
// fallback, and the loss scaler that restarts with each.
#include "train/trainer.h"

namespace ptrain {

// From `step` on, `slot` trains. The old slot's FP8 linears and their scaling state go, the new
// one's (if any) start fresh, and the loss scaler restarts; every other buffer stays (a
// schedule's modes store tensors alike). At a phase's first step this is the switch, said in the
// log and metrics; later (a resume) it only sets the slot up.
void Trainer::enter_slot(const PrecisionSlot& slot, int64_t step) {
  const std::string from = policy_.label();
  slot_ = slot;
  policy_ = phases_.policy(slot);
  const std::string unrecorded = model_.switch_fp8(policy_);
  restart_scaler(scaler_.skipped_steps());
  const std::string fp8_gemms = model_.fp8_gemm_summary();
  const std::string mix_peak = report_.phase_peak(model_.native_fp8_weights());
  const std::string of = " of " + std::to_string(phases_.count());
  const std::string phase = std::to_string(slot.phase + 1);
  const nlohmann::json switched = {{"step", step}, {"precision_phase", {{"phase", slot.phase + 1}, {"from", from}, {"to", policy_.label()}}}};
  switch (phases_.entry(slot, step, guard_.rollback())) {
    case SlotEntry::rollback:  // the rollback has said it
      break;
    case SlotEntry::fallback_ends:
      log_.metrics(switched);
      log_.info("precision: step " + std::to_string(step) + " ends the guard's bf16 fallback: " +
                (phases_.scheduled() ? "phase " + phase + of + ", " : std::string()) + policy_.label() + " again (" +
                (fp8_gemms.empty() ? "" : "FP8 layers made afresh; ") + "loss scaler restarted)");
      break;
    case SlotEntry::phase_starts:
      log_.metrics(switched);
      log_.info("precision: step " + std::to_string(step) + " starts phase " + phase + of + ", " + from + " -> " +
                policy_.label() + " (" + (from.rfind("fp8", 0) == 0 ? "FP8 scaling state dropped; " : "") +
                (fp8_gemms.empty() ? "" : "FP8 layers made afresh; ") + "loss scaler restarted)");
      break;
    case SlotEntry::resumed:
      log_.info("precision: resuming at step " + std::to_string(step) +
                (slot.fallback ? " in the guard's bf16 fallback" : " in phase " + phase + of + ", " + policy_.label()));
      break;
  }
  if (!fp8_gemms.empty()) log_.info("fp8: " + fp8_gemms);
  if (!mix_peak.empty()) log_.info("MFU: this phase's precision mix peaks at " + mix_peak);
  if (!unrecorded.empty()) log_.warn("training.cuda_graph: micro-batches run as called in this phase: " + unrecorded);
}

// A fresh loss scaler of the current slot's settings; the count of skipped steps goes on.
void Trainer::restart_scaler(int64_t skipped) {
  scaler_ = LossScaler(policy_.loss_scaling);
  LossScaler::State fresh = scaler_.state();
  fresh.skipped = skipped;
  scaler_.restore(fresh);
}

}  // namespace ptrain
