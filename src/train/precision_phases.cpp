#include "train/precision_phases.h"

namespace ptrain {

SlotEntry PrecisionPhases::entry(const PrecisionSlot& slot, int64_t step,
                                 const DivergenceGuard::Rollback& rollback) const {
  if (slot.fallback) return step == rollback.to_step + 1 ? SlotEntry::rollback : SlotEntry::resumed;
  if (rollback.fallback_last >= 0 && step == rollback.fallback_last + 1) return SlotEntry::fallback_ends;
  if (slot.phase > 0 && step == schedule_.phases[slot.phase - 1].last_step + 1) return SlotEntry::phase_starts;
  return SlotEntry::resumed;
}

RollbackDecision decide_rollback(int64_t step, const DivergenceGuard::Finding& finding, int64_t newest_before,
                                 const DivergenceGuard::Rollback& before, int64_t steps, int64_t fallback_steps) {
  const int64_t first_bad = step - finding.bad_steps + 1;
  if (newest_before < 0)
    return {finding.why + "; no checkpoint from before step " + std::to_string(first_bad) +
                " to roll back to (checkpoint.every, checkpoint.keep_last)",
            {}};
  // Back onto (or before) the checkpoint of the last rollback: the same steps would follow.
  if (before.to_step >= 0 && newest_before <= before.to_step) {
    const bool ended = before.fallback_last >= 0 && before.fallback_last < step;
    return {finding.why + ", again after rolling back to the checkpoint of step " + std::to_string(before.to_step) +
                ": the bf16 fallback" +
                (ended ? " (to step " + std::to_string(before.fallback_last) +
                             ") did not prevent it; a longer training.guard.fallback_steps (0: to the end) might"
                       : std::string(" did not prevent it")),
            {}};
  }
  const int64_t to = newest_before;
  const int64_t last = fallback_steps > 0 ? (fallback_steps >= steps - to ? steps : to + fallback_steps) : -1;
  return {"", {to, last, before.count + 1}};
}

}  // namespace ptrain
