// training.guard: the divergence guard. Once per step, before the update, it looks at the step's
// loss: a non-finite loss, or a spike (the loss more than `spike_zscore` standard deviations
// above the mean of the last `window` accepted losses) held for `spike_steps` steps in a row,
// makes it act: `stop` (the run ends with exit code 4, saying at which step and why) or `skip`
// (that step's update is not applied, Megatron-style, and counted) or `rollback` (the trainer
// reloads the newest checkpoint from before the spike and trains on in bf16; the guard keeps
// where it rolled back to, so a second divergence back onto the same checkpoint stops). A guard
// that never fires changes nothing: it only reads losses. `skip` gives up after `max_skips`
// skipped updates in a row (weights that already diverged keep spiking) and stops.
#pragma once

#include <cstdint>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/config.h"

namespace ptrain {

// The guard stopped the run (exit code 4).
class DivergedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DivergenceGuard {
 public:
  explicit DivergenceGuard(const GuardConfig& config) : config_(config) {}

  enum class Verdict { ok, skip, stop, rollback };
  struct Finding {
    Verdict verdict = Verdict::ok;
    std::string why;  // "the loss is nan", "loss 7.1 is 9.3 standard deviations above ..."
    int bad_steps = 0;  // the steps, up to this one, that the finding is about (a spike's run)
  };

  // action rollback: the checkpoint step the latest rollback reloaded (-1: none yet), and the
  // last step of the bf16 fallback that followed it (-1: to the end of the run).
  struct Rollback {
    int64_t to_step = -1;
    int64_t fallback_last = -1;
    int64_t count = 0;  // rollbacks so far
    bool in_fallback(int64_t step) const {
      return to_step >= 0 && step > to_step && (fallback_last < 0 || step <= fallback_last);
    }
  };
  // The step's verdict. A non-finite loss and a spiking one never enter the window.
  Finding observe(double loss);

  // What a checkpoint keeps, so a resumed run decides as the uninterrupted one would.
  struct State {
    std::vector<double> window;  // the accepted losses, oldest first
    int spike_run = 0;           // consecutive spiking steps up to the latest
    int64_t skipped = 0;         // updates skipped by the guard
    int consecutive_skips = 0;   // of them, those since the latest step it let through
    Rollback rollback;
  };
  State state() const {
    return {{window_.begin(), window_.end()}, spike_run_, skipped_, consecutive_skips_, rollback_};
  }
  void restore(const State& s);
  // The trainer skipped this step's update, as the verdict said.
  void count_skip() {
    ++skipped_;
    ++consecutive_skips_;
  }
  int64_t skipped() const { return skipped_; }
  int consecutive_skips() const { return consecutive_skips_; }
  const Rollback& rollback() const { return rollback_; }
  void set_rollback(const Rollback& r) { rollback_ = r; }

 private:
  GuardConfig config_;
  std::deque<double> window_;
  int spike_run_ = 0;
  int64_t skipped_ = 0;
  int consecutive_skips_ = 0;
  Rollback rollback_;
};

}  // namespace ptrain
