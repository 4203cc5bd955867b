// The Trainer's parts, in this process: which precision trains each step and how a change is
// reported (train/precision_phases.h), what a rollback decides, and the loss scaler as a run
// drives it, with overflows put into chosen steps (train/step_faults.h) and the scale each step
// used held against a LossScaler fed the same overflows.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "in_process.h"
#include "precision/loss_scaler.h"
#include "test_util.h"
#include "train/precision_phases.h"

namespace ptrain::test {
namespace {

namespace fs = std::filesystem;
using Rollback = DivergenceGuard::Rollback;

PrecisionPhases fp8_then_bf16() {
  Config c = parse_config("run: {name: r}\nmodel: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 64}\n"
                          "data: {synthetic: {vocab: 64}}\ntraining: {steps: 20, batch_tokens: 64, micro_batch: 4}\n"
                          "precision:\n  schedule:\n    - {until_step: 8, mode: fp8}\n    - {mode: bf16}\n",
                          "run.yaml");
  const RunSpec spec = resolve_run(c, 1);
  return PrecisionPhases(spec.precision, spec.fallback);
}

// The model keeps its linears' inputs as FP8 codes only when no step can run a block in bf16:
// not with a bf16 phase, bf16 first and last blocks, or a guard that falls back to bf16.
TEST_CASE("a run is FP8 throughout only when every block of every phase runs FP8 and no rollback falls back",
          "[trainer]") {
  const std::string base = "run: {name: r}\nmodel: {n_layer: 2, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 64}\n"
                           "data: {synthetic: {vocab: 64}}\ntraining: {steps: 20, batch_tokens: 64, micro_batch: 4}\n"
                           "checkpoint: {every: 5}\n";
  const auto throughout = [&](const std::vector<std::string>& sets) {
    return resolve_run(parse_config(base, "run.yaml", sets), 1).fp8_throughout;
  };
  CHECK(throughout({"precision.mode=fp8"}));
  CHECK(throughout({"precision.schedule=[{until_step: 8, mode: fp8, fp8: {recipe: current}}, {mode: fp8}]"}));
  CHECK_FALSE(throughout({"precision.mode=bf16"}));
  CHECK_FALSE(throughout({"precision.mode=fp8", "precision.fp8.bf16_first_last=true"}));
  CHECK_FALSE(throughout({"precision.mode=fp8", "training.guard.action=rollback"}));
  CHECK_FALSE(throughout({"precision.schedule=[{until_step: 8, mode: fp8}, {mode: bf16}]"}));
}

TEST_CASE("precision phases: each step's slot, the guard's fallback over them, and how each change is reported",
          "[trainer]") {
  const PrecisionPhases phases = fp8_then_bf16();
  REQUIRE(phases.count() == 2);
  const Rollback none;
  CHECK(phases.at(1, none) == PrecisionSlot{false, 0});
  CHECK(phases.at(8, none) == PrecisionSlot{false, 0});
  CHECK(phases.at(9, none) == PrecisionSlot{false, 1});
  CHECK(phases.policy(phases.at(8, none)).label() == "fp8:delayed");
  CHECK(phases.policy(phases.at(9, none)).label() == "bf16");
  CHECK(phases.entry(PrecisionSlot{false, 1}, 9, none) == SlotEntry::phase_starts);
  CHECK(phases.entry(PrecisionSlot{false, 1}, 12, none) == SlotEntry::resumed);  // a resume inside phase 2
  CHECK(phases.entry(PrecisionSlot{false, 0}, 1, none) == SlotEntry::resumed);

  // Rolled back to step 4's checkpoint with a fallback to step 6: steps 5-6 in bf16, 7-8 fp8 again.
  const Rollback back{4, 6, 1};
  CHECK(phases.at(4, back) == PrecisionSlot{false, 0});
  CHECK(phases.at(5, back) == PrecisionSlot{true, 0});
  CHECK(phases.at(6, back) == PrecisionSlot{true, 0});
  CHECK(phases.at(7, back) == PrecisionSlot{false, 0});
  CHECK(phases.policy(phases.at(5, back)).label() == "bf16");
  CHECK(phases.entry(PrecisionSlot{true, 0}, 5, back) == SlotEntry::rollback);
  CHECK(phases.entry(PrecisionSlot{true, 0}, 6, back) == SlotEntry::resumed);  // a resume inside the fallback
  CHECK(phases.entry(PrecisionSlot{false, 0}, 7, back) == SlotEntry::fallback_ends);
  // A fallback to the end of the run (fallback_last -1) never ends.
  const Rollback to_end{4, -1, 1};
  CHECK(phases.at(20, to_end) == PrecisionSlot{true, 0});
  // Slots compare by what trains: the fallback is one slot whatever phase it interrupted.
  CHECK(PrecisionSlot{true, 0} == PrecisionSlot{true, 1});
  CHECK(PrecisionSlot{false, 0} != PrecisionSlot{true, 0});
}

TEST_CASE("rollback decisions: the checkpoint to go back to, the fallback's last step, and when to stop instead",
          "[trainer]") {
  DivergenceGuard::Finding spike{DivergenceGuard::Verdict::rollback, "loss 9 is a spike", 2};
  // Steps 32 and 33 spiked: the newest checkpoint before step 32 was step 30's.
  RollbackDecision d = decide_rollback(33, spike, 30, Rollback{}, 60, 10);
  CHECK(d.stop.empty());
  CHECK(d.next.to_step == 30);
  CHECK(d.next.fallback_last == 40);
  CHECK(d.next.count == 1);
  // fallback_steps 0: to the end; a fallback reaching past the end ends with the run.
  CHECK(decide_rollback(33, spike, 30, Rollback{}, 60, 0).next.fallback_last == -1);
  CHECK(decide_rollback(33, spike, 30, Rollback{}, 60, 45).next.fallback_last == 60);
  // No checkpoint before the first bad step.
  d = decide_rollback(33, spike, -1, Rollback{}, 60, 10);
  CHECK(d.stop == "loss 9 is a spike; no checkpoint from before step 32 to roll back to (checkpoint.every, "
                  "checkpoint.keep_last)");
  // Back onto the checkpoint of the last rollback: the same steps would follow, so it stops.
  d = decide_rollback(33, spike, 28, Rollback{28, 30, 1}, 60, 2);
  CHECK(d.stop == "loss 9 is a spike, again after rolling back to the checkpoint of step 28: the bf16 fallback (to "
                  "step 30) did not prevent it; a longer training.guard.fallback_steps (0: to the end) might");
  d = decide_rollback(29, spike, 28, Rollback{28, -1, 1}, 60, 0);
  CHECK(d.stop == "loss 9 is a spike, again after rolling back to the checkpoint of step 28: the bf16 fallback did "
                  "not prevent it");
  // A later checkpoint than the last rollback's: a second rollback, counted.
  d = decide_rollback(50, spike, 45, Rollback{28, 30, 1}, 60, 2);
  CHECK(d.stop.empty());
  CHECK(d.next.to_step == 45);
  CHECK(d.next.count == 2);
}

const std::string kFp16Run =
    "run: {name: r, out_dir: runs, seed: 2, device: cpu}\n"
    "model: {n_layer: 1, n_head: 2, n_embd: 32, seq_len: 16, vocab_size: 64}\n"
    "data: {synthetic: {vocab: 64, order: 2, branching: 4, tokens: 20000, seed: 3}}\n"
    "training: {steps: 12, batch_tokens: 64, micro_batch: 4, eval_every: 0, eval_batches: 2, threads: 1}\n"
    "optimizer: {lr: 1.0e-3}\n"
    "precision: {mode: fp16, loss_scaling: {init: 1024, growth_interval: 2, hysteresis: 2}}\n"
    "checkpoint: {every: 1, keep_last: 20, save_final: false}\n";

// Step -> (loss scale the step used, skipped steps after it), from metrics.jsonl (the last record
// of each step).
std::map<int64_t, std::pair<double, int64_t>> scaler_trace(const fs::path& metrics) {
  std::map<int64_t, std::pair<double, int64_t>> out;
  for (const auto& r : read_metrics(metrics))
    if (r.contains("loss"))
      out[r["step"].get<int64_t>()] = {r["loss_scale"].get<double>(), r["skipped"].get<int64_t>()};
  return out;
}

TEST_CASE("the loss scaler in a run: overflows at named steps skip their updates and back the scale off as a "
          "LossScaler fed the same overflows does, and a resume continues it",
          "[trainer]") {
  TempDir ws("trainer");
  write_file(ws.dir / "run.yaml", kFp16Run);
  // Scales from 1024 to 8192 cannot overflow this model's gradients: only the faults do (steps
  // 5, 6 and 9).
  const std::string overflows = "grad:5:inf,grad:6:inf,grad:9:inf";
  const InProcessRun r = train_in_process(ws.dir, "run.yaml", {}, overflows);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);

  // The expected trace: the run's own scaler settings, fed overflows at exactly those steps.
  const RunSpec spec = resolve_run(parse_config(kFp16Run, "run.yaml"), 1);
  LossScaler expected(spec.precision.phases.front().policy.loss_scaling);
  const std::map<int64_t, std::pair<double, int64_t>> trace = scaler_trace(ws.dir / "runs/r/metrics.jsonl");
  REQUIRE(trace.size() == 12);
  for (int64_t step = 1; step <= 12; ++step) {
    INFO("step " << step);
    const double scale = expected.scale();
    expected.update(step == 5 || step == 6 || step == 9);
    CHECK(trace.at(step) == std::make_pair(scale, expected.skipped_steps()));
  }
  CHECK(trace.at(12).second == 3);
  // An overflowing step's update is skipped: its checkpoint's tensors are the step before's.
  const fs::path ck = ws.dir / "runs/r/checkpoints";
  const auto weights = [&](int step) { return read_file(ck / ("step_0000000" + std::to_string(step)) / "weights.safetensors"); };
  CHECK(weights(5) == weights(4));
  CHECK(weights(6) == weights(4));
  CHECK(weights(7) != weights(6));

  // Stopped between the two overflows (step 5, hysteresis spent by one) and resumed: the same
  // scales, skipped counts and losses as the run that went through.
  REQUIRE(train_in_process(ws.dir, "run.yaml", {"run.name=split"}, overflows, 5).exit_code == 0);
  const InProcessRun resumed = train_in_process(ws.dir, "run.yaml", {"run.name=split", "checkpoint.resume=auto"}, overflows);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(scaler_trace(ws.dir / "runs/split/metrics.jsonl") == trace);
  CHECK(losses_by_step(ws.dir / "runs/split/metrics.jsonl") == losses_by_step(ws.dir / "runs/r/metrics.jsonl"));
}

}  // namespace
}  // namespace ptrain::test
