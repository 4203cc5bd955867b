// PTRAIN_TEST_FAULT (tests only): faults put into chosen steps of a run, so that the tests of
// what ptrain does about a loss spike, a non-finite loss or an overflowing gradient make those
// events happen where the test says, on any CPU, instead of finding them where one machine's
// rounding happened to take a diverging run (another CPU's BLAS would take it elsewhere).
//
//   PTRAIN_TEST_FAULT=KIND:STEP:FACTOR[:TIMES][,...]
//     KIND    loss  the step's loss as the guard, the log and metrics.jsonl see it is multiplied
//                   by FACTOR (the gradients are the step's own)
//             grad  the step's gradients are multiplied by FACTOR (the loss gradient's seed is;
//                   inf overflows them, as an fp16 overflow would)
//             signal  SIGINT is raised in the process after micro-batch FACTOR (from 1) of the
//                   step: a Ctrl-C arriving exactly then (two such items: a second Ctrl-C
//                   right behind the first)
//     STEP    the optimizer step, from 1
//     FACTOR  a number, inf or nan (signal: a micro-batch, an integer from 1)
//     TIMES   how often the fault fires when the step is trained again after a guard rollback
//             (default 1: the replayed step is clean)
//
// Unset or empty: no faults. A malformed value is bad input (UserError), found before anything
// is written. Faults fire in the process that trains the step: a resumed run fires those of the
// steps it trains.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ptrain {

class StepFaults {
 public:
  static StepFaults from_environment();
  // The same from a spec in PTRAIN_TEST_FAULT's form (a test's own, for a run trained in-process).
  static StepFaults parse(const std::string& spec);

  // The factor for this pass of `step` (1 when no fault fires); each call that returns a
  // fault's factor uses up one of its TIMES.
  double loss_factor(int64_t step) { return fire(Kind::loss, step); }
  double grad_factor(int64_t step) { return fire(Kind::grad, step); }
  // Whether to raise SIGINT now, after micro-batch `micro` (from 1) of `step`.
  bool signal_after(int64_t step, int micro);
  bool empty() const { return faults_.empty(); }

 private:
  enum class Kind { loss, grad, signal };
  struct Fault {
    Kind kind;
    int64_t step;
    double factor;
    int times_left;
  };
  double fire(Kind kind, int64_t step);
  std::vector<Fault> faults_;
};

}  // namespace ptrain
