// Which precision trains each step, as explicit state: a phase of precision.schedule, or the
// divergence guard's bf16 fallback after a rollback (training.guard.action rollback). The trainer
// asks for a step's slot and sets the model up when it changes; how the change is reported (a
// phase starting, the fallback ending, a resume inside either) is decided here too, so the rules
// are tested without training.
#pragma once

#include <cstdint>
#include <string>

#include "optim/divergence_guard.h"
#include "precision/policy.h"

namespace ptrain {

struct PrecisionSlot {
  bool fallback = false;  // the guard's bf16 fallback
  size_t phase = 0;       // else: the schedule's phase (0-based)
  bool operator==(const PrecisionSlot& o) const { return fallback == o.fallback && (fallback || phase == o.phase); }
  bool operator!=(const PrecisionSlot& o) const { return !(*this == o); }
};

// How a step that enters a new slot came to it, for the log and metrics.jsonl.
enum class SlotEntry {
  resumed,           // a resume (or a rollback) starts inside the slot: set up, not a switch
  rollback,          // the guard's fallback starts right after the checkpoint rolled back to
  fallback_ends,     // the step after the fallback's last: the schedule's phase again
  phase_starts,      // the step after the previous phase's last
};

class PrecisionPhases {
 public:
  PrecisionPhases(PrecisionSchedule schedule, PrecisionPolicy fallback)
      : schedule_(std::move(schedule)), fallback_(std::move(fallback)) {}

  PrecisionSlot at(int64_t step, const DivergenceGuard::Rollback& rollback) const {
    if (rollback.in_fallback(step)) return {true, 0};
    return {false, schedule_.phase_at(step)};
  }
  const PrecisionPolicy& policy(const PrecisionSlot& slot) const {
    return slot.fallback ? fallback_ : schedule_.phases[slot.phase].policy;
  }
  SlotEntry entry(const PrecisionSlot& slot, int64_t step, const DivergenceGuard::Rollback& rollback) const;

  const PrecisionSchedule& schedule() const { return schedule_; }
  const PrecisionPolicy& fallback() const { return fallback_; }
  bool scheduled() const { return schedule_.scheduled(); }
  size_t count() const { return schedule_.phases.size(); }

 private:
  PrecisionSchedule schedule_;
  PrecisionPolicy fallback_;
};

// training.guard.action rollback at `step`, for `finding`: where to go back to, or why the run
// must stop instead. `newest_before` is the step of the newest checkpoint from before the
// finding's first bad step (none: -1); `before` the guard's previous rollback.
struct RollbackDecision {
  std::string stop;  // non-empty: the run stops (exit 4) with this reason
  DivergenceGuard::Rollback next;  // else: the rollback to make (next.to_step, its fallback)
};
RollbackDecision decide_rollback(int64_t step, const DivergenceGuard::Finding& finding, int64_t newest_before,
                                 const DivergenceGuard::Rollback& before, int64_t steps, int64_t fallback_steps);

}  // namespace ptrain
