// Stopping a run by signal, and a closed standard output. A Ctrl-C is put between two chosen
// micro-batches by construction (PTRAIN_TEST_FAULT's signal kind, train/step_faults.h): the run
// must stop there, drop the unfinished step, keep a checkpoint of the last completed one equal to
// the one an uninterrupted run writes at that step, and resume to an uninterrupted run's losses.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "in_process.h"
#include "test_util.h"

namespace ptrain::test {
namespace {

namespace fs = std::filesystem;

// 4 micro-batches a step (1024 tokens = 4 x 8 sequences of 32); checkpoints every 5 steps.
constexpr const char* kRun =
    "run: {name: r, out_dir: runs, seed: 3, device: cpu}\n"
    "model: {n_layer: 2, n_head: 4, n_embd: 64, seq_len: 32, vocab_size: 64}\n"
    "data: {synthetic: {vocab: 64, order: 2, branching: 4, tokens: 60000, seed: 5}}\n"
    "training: {steps: 12, batch_tokens: 1024, micro_batch: 8, eval_every: 0, eval_batches: 2, threads: 1}\n"
    "checkpoint: {every: 5, keep_last: 10}\n";

// The steps of the checkpoints a run saved, in order.
std::vector<int64_t> checkpoint_steps(const fs::path& metrics) {
  std::vector<int64_t> steps;
  for (const auto& c : checkpoints_saved(metrics)) steps.push_back(c["step"].get<int64_t>());
  return steps;
}

// The run's stop records (a stop request that ended a step between micro-batches).
std::vector<nlohmann::json> stops_of(const fs::path& metrics) {
  std::vector<nlohmann::json> out;
  for (const auto& r : records_with(metrics, "stop")) out.push_back(r["stop"]);
  return out;
}

TEST_CASE("a stop request between micro-batches drops the step, keeps the last completed one as an uninterrupted run "
          "saves it, and the resumed run gives the uninterrupted losses",
          "[stop]") {
  // With primary FP8 weights the dropped step had cast them already: the resumed run casts again.
  // The evaluations between steps (an evaluation after step 6, before its checkpoint) leave the
  // scaling state as they find it.
  // The MLP's input as FP8 codes keeps nothing across steps: its run resumes as any FP8 run.
  for (const std::string precision : {"fp32", "fp8", "fp8+primary", "fp8+codes"}) {
    INFO("precision.mode " << precision);
    TempDir ws("stop");
    write_file(ws.dir / "run.yaml", kRun);
    const bool primary = precision == "fp8+primary", codes = precision == "fp8+codes";
    const std::string mode = primary ? "precision.fp8.primary_weights=true"
                             : codes ? "precision.fp8.mlp_input_codes=true"
                                     : "precision.mode=" + precision;
    // The uninterrupted run, with a checkpoint at step 6 to hold the interrupted one's against.
    const std::string fp8 = precision == "fp32" ? "precision.mode=fp32" : "precision.mode=fp8";
    const std::string evaluate = "training.eval_every=3";
    REQUIRE(train_in_process(ws.dir, "run.yaml", {"run.name=whole", fp8, mode, "checkpoint.every=3", evaluate})
                .exit_code == 0);

    const InProcessRun cut = train_in_process(ws.dir, "run.yaml", {"run.name=cut", fp8, mode, evaluate}, "signal:7:2");
    INFO(cut.output);
    REQUIRE(cut.exit_code == 0);
    CHECK(cut.result.interrupted);
    const fs::path cut_metrics = ws.dir / "runs/cut/metrics.jsonl";
    const std::vector<nlohmann::json> stops = stops_of(cut_metrics);
    REQUIRE(stops.size() == 1);
    CHECK(stops[0]["reason"] == "signal");
    CHECK(stops[0]["abandoned_step"] == 7);
    CHECK(stops[0]["last_completed_step"] == 6);
    CHECK(stops[0]["micro_batches_run"] == 2);
    CHECK(stops[0]["of"] == 4);
    CHECK(checkpoint_steps(cut_metrics) == std::vector<int64_t>{5, 6});
    const std::map<int64_t, double> cut_losses = losses_by_step(cut_metrics);
    CHECK(cut_losses.rbegin()->first == 6);  // nothing of step 7 was logged
    CHECK(cut.output.find("stopped by signal during step 7, after micro-batch 2 of 4") != std::string::npos);

    // Step 6's checkpoint is the one the uninterrupted run wrote: weights, moments and the FP8
    // scaling state (the dropped micro-batches' amaxes forgotten).
    const fs::path whole6 = ws.dir / "runs/whole/checkpoints/step_00000006", cut6 = ws.dir / "runs/cut/checkpoints/step_00000006";
    CHECK(read_file(cut6 / "weights.safetensors") == read_file(whole6 / "weights.safetensors"));
    CHECK(read_file(cut6 / "optimizer.safetensors") == read_file(whole6 / "optimizer.safetensors"));
    const nlohmann::json cut_state = nlohmann::json::parse(read_file(cut6 / "state.json"));
    const nlohmann::json whole_state = nlohmann::json::parse(read_file(whole6 / "state.json"));
    CHECK(cut_state["fp8"] == whole_state["fp8"]);
    if (precision != "fp32") CHECK(!cut_state["fp8"].empty());
    CHECK(cut_state["precision"] == (primary ? "fp8:delayed+primary" : codes ? "fp8:delayed+codes" : whole_state["precision"]));

    const InProcessRun resumed =
        train_in_process(ws.dir, "run.yaml", {"run.name=cut", fp8, mode, evaluate, "checkpoint.resume=auto"});
    INFO(resumed.output);
    REQUIRE(resumed.exit_code == 0);
    CHECK(resumed.output.find("resumed from runs/cut/checkpoints/step_00000006 after step 6") != std::string::npos);
    const std::map<int64_t, double> whole = losses_by_step(ws.dir / "runs/whole/metrics.jsonl");
    const std::map<int64_t, double> joined = losses_by_step(cut_metrics);
    REQUIRE(joined.size() == 12);
    for (const auto& [step, loss] : whole) {
      INFO("step " << step);
      CHECK(joined.at(step) == loss);  // bit for bit
    }
  }
}

TEST_CASE("a stop request: in the first step nothing is saved, after a saved step nothing again, in the last "
          "micro-batch the step finishes",
          "[stop]") {
  TempDir ws("stop-edges");
  write_file(ws.dir / "run.yaml", kRun);

  const InProcessRun first = train_in_process(ws.dir, "run.yaml", {"run.name=first"}, "signal:1:1");
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const fs::path first_metrics = ws.dir / "runs/first/metrics.jsonl";
  REQUIRE(stops_of(first_metrics).size() == 1);
  CHECK(stops_of(first_metrics)[0]["last_completed_step"] == 0);
  CHECK(checkpoint_steps(first_metrics).empty());
  CHECK(losses_by_step(first_metrics).empty());
  CHECK(first.output.find("nothing was trained, so no checkpoint was written") != std::string::npos);

  // Step 5's checkpoint already holds the state when step 6 is given up: no second save.
  const InProcessRun held = train_in_process(ws.dir, "run.yaml", {"run.name=held"}, "signal:6:3");
  INFO(held.output);
  REQUIRE(held.exit_code == 0);
  const fs::path held_metrics = ws.dir / "runs/held/metrics.jsonl";
  CHECK(stops_of(held_metrics)[0]["last_completed_step"] == 5);
  CHECK(checkpoint_steps(held_metrics) == std::vector<int64_t>{5});

  // After the last micro-batch the step's gradients are being reduced: it finishes and is saved.
  const InProcessRun last = train_in_process(ws.dir, "run.yaml", {"run.name=last"}, "signal:7:4");
  INFO(last.output);
  REQUIRE(last.exit_code == 0);
  const fs::path last_metrics = ws.dir / "runs/last/metrics.jsonl";
  CHECK(stops_of(last_metrics).empty());
  CHECK(checkpoint_steps(last_metrics) == std::vector<int64_t>{5, 7});
  CHECK(losses_by_step(last_metrics).rbegin()->first == 7);
  CHECK(last.output.find("stopped by signal after step 7") != std::string::npos);
}

TEST_CASE("a stop in the first step after resuming another run's checkpoint saves that state in this run's own "
          "directory",
          "[stop]") {
  TempDir ws("stop-elsewhere");
  write_file(ws.dir / "run.yaml", kRun);
  REQUIRE(train_in_process(ws.dir, "run.yaml", {"run.name=a", "training.steps=5"}).exit_code == 0);
  const InProcessRun b = train_in_process(
      ws.dir, "run.yaml", {"run.name=b", "checkpoint.resume=runs/a/checkpoints/step_00000005"}, "signal:6:2");
  INFO(b.output);
  REQUIRE(b.exit_code == 0);
  const fs::path metrics = ws.dir / "runs/b/metrics.jsonl";
  REQUIRE(stops_of(metrics).size() == 1);
  CHECK(stops_of(metrics)[0]["last_completed_step"] == 5);
  const std::vector<nlohmann::json> saved = checkpoints_saved(metrics);
  REQUIRE(saved.size() == 1);
  CHECK(saved[0]["step"] == 5);
  CHECK(saved[0]["path"] == "runs/b/checkpoints/step_00000005");
  CHECK(read_file(ws.dir / "runs/b/checkpoints/step_00000005/weights.safetensors") ==
        read_file(ws.dir / "runs/a/checkpoints/step_00000005/weights.safetensors"));
}

TEST_CASE("ptrain train: the stop request is acknowledged on stderr when it arrives, before the run stops", "[stop][cli]") {
  TempDir ws("stop-cli");
  write_file(ws.dir / "run.yaml", kRun);
  const CommandResult r = run_ptrain("train run.yaml", ws.dir, "PTRAIN_TEST_FAULT=signal:7:2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const size_t acknowledged = r.output.find("ptrain: stop requested: stopping after the current micro-batch");
  const size_t stopped = r.output.find("stopped by signal during step 7");
  REQUIRE(acknowledged != std::string::npos);
  REQUIRE(stopped != std::string::npos);
  CHECK(acknowledged < stopped);
  CHECK(count_of(r.output, "ptrain: stop requested") == 1);
}

TEST_CASE("ptrain train | head -1: a closed standard output does not stop the run, and its checkpoint resumes",
          "[stop][cli]") {
  TempDir ws("stop-pipe");
  write_file(ws.dir / "run.yaml", kRun);
  // ptrain's exit code, not head's, through a file.
  const CommandResult piped = run_shell("cd '" + ws.dir.string() + "' && { '" + ptrain_binary() +
                                        "' train run.yaml; echo $? > exit-code; } | head -1");
  INFO(piped.output);
  CHECK(count_of(piped.output, "\n") == 1);
  CHECK(read_file(ws.dir / "exit-code") == "0\n");
  const fs::path metrics = ws.dir / "runs/r/metrics.jsonl";
  CHECK(losses_by_step(metrics).size() == 12);
  CHECK(checkpoint_steps(metrics) == std::vector<int64_t>{5, 10, 12});
  CHECK(read_file(ws.dir / "runs/r/log.txt").find("done: 12 steps") != std::string::npos);
  const CommandResult resumed =
      run_ptrain("train run.yaml --set checkpoint.resume=auto --set training.steps=14", ws.dir);
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK(losses_by_step(metrics).size() == 14);
}

TEST_CASE("ptrain sample | head -c 1: a closed standard output ends the generation quietly", "[stop][cli]") {
  TempDir ws("stop-sample");
  write_file(ws.dir / "run.yaml", kRun);
  REQUIRE(run_ptrain("train run.yaml --set training.steps=2", ws.dir).exit_code == 0);
  // A million tokens would take minutes: the first failed write must end it (timeout: 124).
  const CommandResult piped = run_shell("cd '" + ws.dir.string() + "' && { timeout 120 '" + ptrain_binary() +
                                        "' sample --checkpoint runs/r/checkpoints/step_00000002 --tokens 1000000; "
                                        "echo $? > exit-code; } | head -c 1");
  INFO(piped.output);
  CHECK(read_file(ws.dir / "exit-code") == "0\n");
}

}  // namespace
}  // namespace ptrain::test
