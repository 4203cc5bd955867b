// training.guard: the divergence guard's decisions against their definition, and on runs trained
// in this process (tests/in_process.h) whose spikes are put into the plan by construction
// (train/step_faults.h) at named steps, so that every assertion
// holds on any CPU: `stop` exits 4 naming the step, `skip` leaves the spiking steps' weights and
// moments as they were and counts them, a resume across a skip equals the uninterrupted run,
// `rollback` goes back to the checkpoint before the spike and trains on in bf16 exactly as a
// resume from that checkpoint in bf16 would, and a guard that never fires changes no loss.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/tensor.h"
#include "optim/divergence_guard.h"
#include "in_process.h"
#include "test_util.h"

namespace ptrain::test {
namespace {

namespace fs = std::filesystem;
using Verdict = DivergenceGuard::Verdict;

GuardConfig guard_config(const std::string& action, double zscore, int window, int steps) {
  GuardConfig g;
  g.action = *parse_choice<GuardAction>(action);
  g.spike_zscore = zscore;
  g.window = window;
  g.spike_steps = steps;
  return g;
}

TEST_CASE("the divergence guard: non-finite losses, and spikes held for K steps against the window", "[guard]") {
  DivergenceGuard stop(guard_config("stop", 0, 4, 1));
  CHECK(stop.observe(3.0).verdict == Verdict::ok);
  const DivergenceGuard::Finding nan = stop.observe(NAN);
  CHECK(nan.verdict == Verdict::stop);
  CHECK(nan.why == "the loss is nan");
  CHECK(stop.observe(INFINITY).verdict == Verdict::stop);
  CHECK(stop.observe(1e30).verdict == Verdict::ok);  // spikes are not watched with spike_zscore 0

  DivergenceGuard g(guard_config("skip", 3, 4, 2));
  for (const double v : {1.0, 1.2, 0.8, 1.0}) REQUIRE(g.observe(v).verdict == Verdict::ok);
  // mean 1.0, standard deviation sqrt(0.02) = 0.1414: 1.5 is 3.54 of them above.
  CHECK(g.observe(1.5).verdict == Verdict::ok);  // one spiking step: not yet
  const DivergenceGuard::Finding spike = g.observe(1.5);
  CHECK(spike.verdict == Verdict::skip);
  CHECK(spike.why.find("3.54 standard deviations above the mean of the last 4 steps (1)") != std::string::npos);
  CHECK(spike.why.find("for 2 steps in a row") != std::string::npos);
  // Spiking losses never entered the window: a normal loss is normal, and the run restarts.
  CHECK(g.observe(1.1).verdict == Verdict::ok);
  CHECK(g.observe(1.5).verdict == Verdict::ok);
  // 1.1 replaced the oldest (1.0): the window is 1.2 0.8 1.0 1.1 now; a restored guard agrees.
  DivergenceGuard copy(guard_config("skip", 3, 4, 2));
  copy.restore(g.state());
  CHECK(g.state().window == std::vector<double>{1.2, 0.8, 1.0, 1.1});
  CHECK(copy.observe(1.6).verdict == g.observe(1.6).verdict);
  CHECK(copy.observe(1.6).verdict == Verdict::skip);
}

// A small model trained at a sane learning rate: its loss falls smoothly, so the guard finds
// nothing but the faults a test puts in (PTRAIN_TEST_FAULT, train/step_faults.h), at the steps the
// test names, on any CPU. A loss multiplied by 1000 lies thousands of standard deviations above a
// window of smoothly falling losses, far past the thresholds used here (30), which a run this
// smooth never reaches on its own.
std::string guarded_config(const std::string& guard) {
  return "run: {name: div, out_dir: runs, seed: 3, device: cpu}\n"
         "model: {n_layer: 2, n_head: 4, n_embd: 64, seq_len: 32, vocab_size: 64}\n"
         "data: {synthetic: {vocab: 64, order: 2, branching: 4, tokens: 60000, seed: 5}}\n"
         "training: {steps: 40, batch_tokens: 256, micro_batch: 8, eval_every: 0, eval_batches: 2, threads: 1,\n"
         "           grad_clip: 1.0, guard: " + guard + "}\n"
         "optimizer: {lr: 3.0e-3, weight_decay: 0}\n"
         "schedule: {warmup_steps: 5, decay: constant}\n"
         "checkpoint: {every: 10, keep_last: 5, save_final: false}\n";
}

// Faults in PTRAIN_TEST_FAULT's form: the loss of each of `steps` multiplied by 1000, `times`
// passes each.
std::string loss_spikes(std::initializer_list<int> steps, int times = 1) {
  std::string spec;
  for (const int step : steps)
    spec += (spec.empty() ? "" : ",") + std::string("loss:") + std::to_string(step) + ":1000:" + std::to_string(times);
  return spec;
}

std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> out;
  for (const auto& r : read_metrics(metrics))
    if (r.contains("loss")) out.push_back(r["loss"].get<double>());
  return out;
}

// The guard's records in metrics.jsonl, in order.
std::vector<nlohmann::json> guard_events(const fs::path& metrics) { return records_with(metrics, "guard"); }

// The guard's stop as the run's error says it: step and reason as its record holds them.
std::string stop_message(const nlohmann::json& stop) {
  return "training stopped by the divergence guard at step " + std::to_string(stop["step"].get<int64_t>()) + ": " +
         stop["reason"].get<std::string>();
}

// The start of the guard's rollback warning, from its record: the checkpoint, its step and the
// first step of the bf16 fallback; the fallback's end follows.
std::string rollback_message(const nlohmann::json& rollback) {
  const int64_t to = rollback["to_step"].get<int64_t>();
  return "rolled back to " + rollback["checkpoint"].get<std::string>() + " (step " + std::to_string(to) +
         "): bf16 from step " + std::to_string(to + 1) + " ";
}

// A resume as the log says it, from its record, with the note of a precision changed since the save.
std::string resume_message(const nlohmann::json& resume) {
  const nlohmann::json& r = resume["resume"];
  return "resumed from " + r["from"].get<std::string>() + " after step " + std::to_string(r["step"].get<int64_t>()) +
         " (saved under precision " + r["saved_precision"].get<std::string>() + ", now " +
         r["precision"].get<std::string>() + "; the FP32 master weights carry over)";
}

// A checkpoint's tensors (weights and AdamW moments), by name.
std::map<std::string, std::vector<float>> checkpoint_tensors(const fs::path& dir) {
  std::map<std::string, std::vector<float>> out;
  for (const char* file : {"weights.safetensors", "optimizer.safetensors"}) {
    const SafetensorsFile st = SafetensorsFile::read((dir / file).string());
    for (const std::string& name : st.names()) {
      const int64_t n = shape_numel(st.shape(name));
      std::vector<float>& v = out[std::string(file) + "/" + name];
      v.resize(static_cast<size_t>(n));
      st.copy_to(name, v.data(), n);
    }
  }
  return out;
}

TEST_CASE("test faults: PTRAIN_TEST_FAULT puts a loss spike where it says, and a malformed one is bad input",
          "[guard]") {
  TempDir ws("guard");
  write_file(ws.dir / "run.yaml", guarded_config("{action: stop}"));
  REQUIRE(run_ptrain("train run.yaml --set training.steps=8 --set run.name=plain", ws.dir).exit_code == 0);
  const CommandResult r =
      run_ptrain("train run.yaml --set training.steps=8 --set run.name=fault", ws.dir, "PTRAIN_TEST_FAULT=loss:6:10");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<double> plain = losses(ws.dir / "runs/plain/metrics.jsonl");
  const std::vector<double> fault = losses(ws.dir / "runs/fault/metrics.jsonl");
  REQUIRE(plain.size() == 8);
  REQUIRE(fault.size() == 8);
  for (size_t i = 0; i < 8; ++i) CHECK(fault[i] == (i == 5 ? plain[i] * 10 : plain[i]));  // a loss fault moves no weight
  for (const char* bad : {"loss:0:10", "loss:3", "spike:3:10", "loss:3:ten", "loss:3:10:0", "loss:x:10", ",",
                          "loss:3:10,", " loss:3:10", "loss:+3:10", "loss:3:0x10"}) {
    const CommandResult refused = run_ptrain("train run.yaml --set run.name=bad", ws.dir,
                                             std::string("PTRAIN_TEST_FAULT='") + bad + "'");
    INFO(bad << ": " << refused.output);
    CHECK(refused.exit_code == 2);
    CHECK(refused.output.find("PTRAIN_TEST_FAULT: ") != std::string::npos);
    CHECK(!fs::exists(ws.dir / "runs/bad"));
  }
}

TEST_CASE("guard stop: a spike held for spike_steps steps exits 4 at its last step, naming it", "[guard]") {
  TempDir ws("guard");
  write_file(ws.dir / "run.yaml", guarded_config("{action: stop, spike_zscore: 30, window: 10, spike_steps: 2}"));
  const InProcessRun r = train_in_process(ws.dir, "run.yaml", {}, loss_spikes({25, 26}));
  INFO(r.output);
  CHECK(r.exit_code == 4);
  const std::vector<nlohmann::json> events = guard_events(ws.dir / "runs/div/metrics.jsonl");
  REQUIRE(events.size() == 1);
  CHECK(events[0]["guard"] == "stop");
  CHECK(events[0]["step"] == 26);
  const std::string why = events[0]["reason"].get<std::string>();
  CHECK(why.rfind("loss ", 0) == 0);
  CHECK(why.find("standard deviations above the mean of the last 10 steps") != std::string::npos);
  CHECK(why.find("for 2 steps in a row") != std::string::npos);
  CHECK(r.output.find(stop_message(events[0])) != std::string::npos);
  // Steps before the stop were trained and logged (the first spiking one too); none after it.
  CHECK(losses(ws.dir / "runs/div/metrics.jsonl").size() == 25);
}

TEST_CASE("guard stop: a non-finite loss stops at once, whatever spike_zscore says", "[guard]") {
  TempDir ws("guard");
  write_file(ws.dir / "run.yaml", guarded_config("{action: stop}"));
  const InProcessRun r = train_in_process(ws.dir, "run.yaml", {}, "loss:17:nan");
  INFO(r.output);
  CHECK(r.exit_code == 4);
  const std::vector<nlohmann::json> events = guard_events(ws.dir / "runs/div/metrics.jsonl");
  REQUIRE(events.size() == 1);
  CHECK(events[0]["guard"] == "stop");
  CHECK(events[0]["step"] == 17);
  CHECK(events[0]["reason"] == "the loss is nan");
  CHECK(r.output.find(stop_message(events[0])) != std::string::npos);
  const std::vector<nlohmann::json> saved = checkpoints_saved(ws.dir / "runs/div/metrics.jsonl");
  REQUIRE(saved.size() == 1);
  CHECK(saved[0]["step"] == 10);
  CHECK(r.output.find("the newest checkpoint is " + saved[0]["path"].get<std::string>()) != std::string::npos);
}

TEST_CASE("guard skip: the spiking steps' updates are skipped and counted, and a resume across them is exact",
          "[guard]") {
  TempDir ws("guard");
  const std::string guard = "{action: skip, spike_zscore: 30, window: 10, spike_steps: 2}";
  write_file(ws.dir / "run.yaml", guarded_config(guard));
  // Checkpoints of every step, so that step 26's can be held against step 25's.
  const std::string faults = loss_spikes({25, 26, 27});
  const InProcessRun r = train_in_process(ws.dir, "run.yaml", {"checkpoint.every=1", "checkpoint.keep_last=20"}, faults);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // Step 25 spikes alone (spike_steps 2): applied. Steps 26 and 27 are the second and third in a row.
  const std::vector<nlohmann::json> events = guard_events(ws.dir / "runs/div/metrics.jsonl");
  REQUIRE(events.size() == 2);
  CHECK(events[0]["guard"] == "skip");
  CHECK(events[0]["step"] == 26);
  CHECK(events[1]["guard"] == "skip");
  CHECK(events[1]["step"] == 27);
  const nlohmann::json summary = nlohmann::json::parse(read_file(ws.dir / "runs/div/summary.json"));
  CHECK(summary["guard_skipped_steps"] == 2);
  CHECK(count_of(r.output, "its update skipped") == events.size());
  // A skipped update leaves the weights and the moments as they were; an applied one does not.
  const fs::path ckpts = ws.dir / "runs/div/checkpoints";
  const auto at = [&](int step) { return checkpoint_tensors(ckpts / ("step_000000" + std::to_string(step))); };
  CHECK(at(26) == at(25));
  CHECK(at(27) == at(25));
  CHECK(at(25) != at(24));
  CHECK(at(28) != at(27));
  const std::vector<double> whole = losses(ws.dir / "runs/div/metrics.jsonl");
  CHECK(whole.size() == 40);

  // The same run stopped at step 20 (its checkpoint keeps the guard's window) and resumed: the
  // resumed run skips the same steps and ends with the same losses.
  write_file(ws.dir / "split.yaml", guarded_config(guard));
  REQUIRE(train_in_process(ws.dir, "split.yaml", {"run.name=split"}, faults, 20).exit_code == 0);
  const InProcessRun resumed = train_in_process(ws.dir, "split.yaml", {"run.name=split", "checkpoint.resume=auto"}, faults);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  std::vector<double> split;
  for (const auto& [step, loss] : losses_by_step(ws.dir / "runs/split/metrics.jsonl")) split.push_back(loss);
  CHECK(split == whole);
  // The skips are the resumed invocation's (steps after 20), the same steps as the whole run's.
  const std::vector<nlohmann::json> split_events = guard_events(ws.dir / "runs/split/metrics.jsonl");
  REQUIRE(split_events.size() == events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    CHECK(split_events[i]["guard"] == events[i]["guard"]);
    CHECK(split_events[i]["step"] == events[i]["step"]);
  }
  CHECK(count_of(resumed.output, "its update skipped") == split_events.size());
}

TEST_CASE("guard skip gives up after max_skips skipped updates in a row, and stops", "[guard]") {
  TempDir ws("guard");
  write_file(ws.dir / "run.yaml",
             guarded_config("{action: skip, spike_zscore: 30, window: 10, spike_steps: 2, max_skips: 2}"));
  const InProcessRun r = train_in_process(ws.dir, "run.yaml", {}, loss_spikes({25, 26, 27, 28}));
  INFO(r.output);
  CHECK(r.exit_code == 4);
  // Steps 26 and 27 skipped, then the stop at 27.
  const std::vector<nlohmann::json> events = guard_events(ws.dir / "runs/div/metrics.jsonl");
  REQUIRE(events.size() == 3);
  CHECK(events[0]["guard"] == "skip");
  CHECK(events[0]["step"] == 26);
  CHECK(events[1]["guard"] == "skip");
  CHECK(events[1]["step"] == 27);
  CHECK(events[2]["guard"] == "stop");
  CHECK(events[2]["step"] == 27);
  const size_t skips = events.size() - 1;
  CHECK(count_of(r.output, "its update skipped") == skips);
  const std::string why = events[2]["reason"].get<std::string>();
  CHECK(why.find(", and " + std::to_string(skips) + " updates in a row were skipped (training.guard.max_skips)") !=
        std::string::npos);
  CHECK(r.output.find(stop_message(events[2])) != std::string::npos);
}

TEST_CASE("a step whose gradients overflow is not applied, counted as skipped, and training goes on", "[guard]") {
  TempDir ws("guard");
  write_file(ws.dir / "run.yaml", guarded_config("{action: skip}"));
  const InProcessRun r =
      train_in_process(ws.dir, "run.yaml", {"checkpoint.every=1", "checkpoint.keep_last=20"}, "grad:30:inf");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // The loss is finite (the fault is in the gradients): the optimizer's overflow check skips it.
  const std::vector<nlohmann::json> records = read_metrics(ws.dir / "runs/div/metrics.jsonl");
  int64_t skipped_at_30 = -1, skipped_at_29 = -1;
  for (const auto& m : records)
    if (m.contains("loss") && m["step"] == 29) skipped_at_29 = m["skipped"].get<int64_t>();
    else if (m.contains("loss") && m["step"] == 30) skipped_at_30 = m["skipped"].get<int64_t>();
  CHECK(skipped_at_29 == 0);
  CHECK(skipped_at_30 == 1);
  const fs::path ckpts = ws.dir / "runs/div/checkpoints";
  CHECK(checkpoint_tensors(ckpts / "step_00000030") == checkpoint_tensors(ckpts / "step_00000029"));
}

// An fp8 run checkpointed every 5 steps, with a fallback to bf16 on a rollback.
std::string rollback_config(const std::string& guard) {
  std::string c = guarded_config(guard);
  c.replace(c.find("steps: 40,"), 10, "steps: 60,");
  c.replace(c.find("every: 10"), 9, "every: 5");
  return c + "precision: {mode: fp8}\n";
}

TEST_CASE("guard rollback: a spiking fp8 run goes back to the checkpoint before the spike and trains on in bf16, "
          "exactly as a resume from it in bf16",
          "[guard]") {
  TempDir ws("guard");
  const std::string guard = "{action: rollback, spike_zscore: 30, window: 10, spike_steps: 1}";
  write_file(ws.dir / "run.yaml", rollback_config(guard));
  const InProcessRun r = train_in_process(ws.dir, "run.yaml", {}, loss_spikes({33}));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<nlohmann::json> events = guard_events(ws.dir / "runs/div/metrics.jsonl");
  REQUIRE(events.size() == 1);
  const nlohmann::json& e = events[0];
  CHECK(e["guard"] == "rollback");
  CHECK(e["step"] == 33);
  CHECK(e["to_step"] == 30);  // the newest checkpoint before the spiking step
  CHECK(e["fallback"] == "bf16");
  CHECK(e["fallback_last"].is_null());
  CHECK(r.output.find(rollback_message(e) + "to the end of the run") != std::string::npos);
  const nlohmann::json summary = nlohmann::json::parse(read_file(ws.dir / "runs/div/summary.json"));
  CHECK(summary["guard_rollbacks"] == 1);
  CHECK(summary["precision"] == "fp8:delayed");

  // The same run without the fault, stopped at the checkpoint, then resumed from it in bf16 (with
  // a guard that stops, had it anything to stop): the rolled-back run's every step's loss, bit for
  // bit. So the rollback restored the checkpoint's state exactly, and replayed the same data.
  write_file(ws.dir / "ref.yaml", rollback_config(guard));
  REQUIRE(train_in_process(ws.dir, "ref.yaml", {"run.name=ref"}, "", 30).exit_code == 0);
  const InProcessRun resumed = train_in_process(
      ws.dir, "ref.yaml", {"run.name=ref", "checkpoint.resume=auto", "precision.mode=bf16", "training.guard.action=stop"});
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const std::map<int64_t, double> rolled = losses_by_step(ws.dir / "runs/div/metrics.jsonl");
  REQUIRE(rolled.size() == 60);
  CHECK(rolled == losses_by_step(ws.dir / "runs/ref/metrics.jsonl"));
  // The spiking branch's step 33 was logged, then trained anew in bf16.
  int64_t records_of_33 = 0;
  for (const auto& m : read_metrics(ws.dir / "runs/div/metrics.jsonl"))
    if (m.contains("loss") && m["step"] == 33) ++records_of_33;
  CHECK(records_of_33 == 2);
}

TEST_CASE("guard rollback: a fallback of N steps returns to fp8, and a resume inside it is exact", "[guard]") {
  TempDir ws("guard");
  const std::string guard = "{action: rollback, spike_zscore: 30, window: 10, spike_steps: 1, fallback_steps: 10}";
  write_file(ws.dir / "run.yaml", rollback_config(guard));
  const std::string faults = loss_spikes({33});
  const InProcessRun r = train_in_process(ws.dir, "run.yaml", {}, faults);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<nlohmann::json> events = guard_events(ws.dir / "runs/div/metrics.jsonl");
  REQUIRE(events.size() == 1);
  CHECK(events[0]["to_step"] == 30);
  CHECK(events[0]["fallback_last"] == 40);
  std::vector<int64_t> back;
  for (const auto& m : read_metrics(ws.dir / "runs/div/metrics.jsonl"))
    if (m.contains("precision_phase")) {
      back.push_back(m["step"].get<int64_t>());
      CHECK(m["precision_phase"]["from"] == "bf16");
      CHECK(m["precision_phase"]["to"] == "fp8:delayed");
    }
  REQUIRE(back.size() == 1);
  CHECK(back[0] == 41);
  CHECK(r.output.find(rollback_message(events[0]) + "to step " +
                      std::to_string(events[0]["fallback_last"].get<int64_t>()) + ", then fp8:delayed again") !=
        std::string::npos);
  CHECK(r.output.find("precision: step " + std::to_string(back[0]) +
                      " ends the guard's bf16 fallback: fp8:delayed again") != std::string::npos);

  // Stopped inside the fallback (after the rollback) and resumed: its checkpoint keeps the
  // fallback, so the resumed run trains in bf16 to its end and then in fp8, as the whole run did.
  write_file(ws.dir / "split.yaml", rollback_config(guard));
  REQUIRE(train_in_process(ws.dir, "split.yaml", {"run.name=split"}, faults, 34).exit_code == 0);
  const std::map<int64_t, double> whole = losses_by_step(ws.dir / "runs/div/metrics.jsonl");
  REQUIRE(whole.size() == 60);
  // The same checkpoint resumed with another guard action goes on in the fallback too (the model
  // then keeps the bf16 inputs a bf16 block reads); primary FP8 weights, which keep no bf16
  // weights, are refused before anything is written.
  const std::string inside = "checkpoint.resume=" + (ws.dir / "runs/split/checkpoints/step_00000034").string();
  const InProcessRun stopped =
      train_in_process(ws.dir, "split.yaml", {"run.name=stop", inside, "training.guard.action=stop"}, faults);
  INFO(stopped.output);
  REQUIRE(stopped.exit_code == 0);
  const std::map<int64_t, double> after_stop = losses_by_step(ws.dir / "runs/stop/metrics.jsonl");
  REQUIRE(after_stop.size() == 26);
  for (const auto& [step, loss] : after_stop) CHECK(loss == whole.at(step));
  const InProcessRun primary = train_in_process(
      ws.dir, "split.yaml",
      {"run.name=primary", inside, "training.guard.action=stop", "precision.fp8.primary_weights=true"}, faults);
  CHECK(primary.exit_code == 2);
  CHECK(primary.output.find("precision.fp8.primary_weights: true, but") != std::string::npos);
  CHECK(primary.output.find("saved in the guard's bf16 fallback (to step 40)") != std::string::npos);
  CHECK_FALSE(fs::exists(ws.dir / "runs/primary"));
  // Nor does the MLP's input as FP8 codes, which a bf16 block keeps in bf16.
  const InProcessRun codes = train_in_process(
      ws.dir, "split.yaml",
      {"run.name=codes", inside, "training.guard.action=stop", "precision.fp8.mlp_input_codes=true"}, faults);
  CHECK(codes.exit_code == 2);
  CHECK(codes.output.find("precision.fp8.mlp_input_codes: true, but") != std::string::npos);
  CHECK_FALSE(fs::exists(ws.dir / "runs/codes"));
  // ZeRO-3 does not switch precision in place (as a precision.schedule would), so neither does it
  // resume into a fallback that ends within the run.
  const InProcessRun sharded = train_in_process(
      ws.dir, "split.yaml", {"run.name=sharded", inside, "training.guard.action=stop", "distributed.zero_stage=3"}, faults);
  CHECK(sharded.exit_code == 2);
  CHECK(sharded.output.find("distributed.zero_stage: 3, but") != std::string::npos);
  CHECK(sharded.output.find("which ends at step 40") != std::string::npos);
  CHECK_FALSE(fs::exists(ws.dir / "runs/sharded"));
  const InProcessRun resumed = train_in_process(ws.dir, "split.yaml", {"run.name=split", "checkpoint.resume=auto"}, faults);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const std::vector<nlohmann::json> split_resumes = records_with(ws.dir / "runs/split/metrics.jsonl", "resume");
  REQUIRE(split_resumes.size() == 1);
  CHECK(split_resumes[0]["resume"]["step"] == 34);
  CHECK(split_resumes[0]["resume"]["precision"] == "bf16");
  CHECK(resumed.output.find("precision: resuming at step " +
                            std::to_string(split_resumes[0]["resume"]["step"].get<int64_t>() + 1) +
                            " in the guard's bf16 fallback") != std::string::npos);
  CHECK(losses_by_step(ws.dir / "runs/split/metrics.jsonl") == whole);

  // Stopped at the fallback's last step and resumed: fp8 from the first step, and the log says
  // that the checkpoint was saved in bf16.
  REQUIRE(train_in_process(ws.dir, "split.yaml", {"run.name=edge"}, faults, 40).exit_code == 0);
  const InProcessRun edge = train_in_process(ws.dir, "split.yaml", {"run.name=edge", "checkpoint.resume=auto"}, faults);
  INFO(edge.output);
  REQUIRE(edge.exit_code == 0);
  const std::vector<nlohmann::json> edge_resumes = records_with(ws.dir / "runs/edge/metrics.jsonl", "resume");
  REQUIRE(edge_resumes.size() == 1);
  CHECK(edge_resumes[0]["resume"]["step"] == 40);
  CHECK(edge_resumes[0]["resume"]["saved_precision"] == "bf16");
  CHECK(edge_resumes[0]["resume"]["precision"] == "fp8:delayed");
  CHECK(edge.output.find(resume_message(edge_resumes[0])) != std::string::npos);
  CHECK(losses_by_step(ws.dir / "runs/edge/metrics.jsonl") == whole);
}

TEST_CASE("guard rollback: diverging again onto the same checkpoint stops (exit 4), the later checkpoints set aside",
          "[guard]") {
  TempDir ws("guard");
  write_file(ws.dir / "run.yaml",
             rollback_config("{action: rollback, spike_zscore: 30, window: 10, spike_steps: 2, fallback_steps: 2}"));
  // Checkpoints every 4 steps; steps 32 and 33 spike on both of their passes: the first pass
  // saves step 32's checkpoint inside the spike and rolls back to 28 at step 33; after the
  // fallback (bf16, steps 29-30) the same spike leads back onto 28, and the run stops.
  const InProcessRun r = train_in_process(ws.dir, "run.yaml", {"checkpoint.every=4"}, loss_spikes({32, 33}, 2));
  INFO(r.output);
  CHECK(r.exit_code == 4);
  const fs::path metrics = ws.dir / "runs/div/metrics.jsonl";
  const std::vector<nlohmann::json> events = guard_events(metrics);
  REQUIRE(events.size() == 2);
  const nlohmann::json &rollback = events[0], &stop = events[1];
  CHECK(rollback["guard"] == "rollback");
  CHECK(rollback["step"] == 33);
  CHECK(rollback["to_step"] == 28);
  CHECK(rollback["fallback_last"] == 30);
  const std::string to = std::to_string(rollback["to_step"].get<int64_t>());
  const std::string last = std::to_string(rollback["fallback_last"].get<int64_t>());
  CHECK(r.output.find(rollback_message(rollback) + "to step " + last + ", then fp8:delayed again") !=
        std::string::npos);
  // The first pass's checkpoints after the one rolled back to (step 32's, inside the spike) are
  // set aside.
  std::vector<std::string> superseded;
  for (const auto& m : read_metrics(metrics)) {
    if (m.contains("guard")) break;
    if (m.contains("checkpoint") && m["checkpoint"]["step"] > rollback["to_step"])
      superseded.push_back(m["checkpoint"]["path"].get<std::string>() + ".superseded");
  }
  REQUIRE(superseded.size() == 1);
  CHECK(superseded[0] == "runs/div/checkpoints/step_00000032.superseded");
  CHECK(r.output.find("set aside " + superseded[0] + ": it came after the checkpoint the guard rolled back to") !=
        std::string::npos);
  CHECK(fs::exists(ws.dir / superseded[0]));
  CHECK(stop["guard"] == "stop");
  CHECK(stop["step"] == 33);
  const std::string again = "again after rolling back to the checkpoint of step " + to +
                            ": the bf16 fallback (to step " + last +
                            ") did not prevent it; a longer training.guard.fallback_steps (0: to the end) might";
  CHECK(stop["reason"].get<std::string>().find(again) != std::string::npos);
  CHECK(r.output.find(stop_message(stop)) != std::string::npos);
  // `latest` names a checkpoint that is there (step 32's of the fallback's branch), not one set aside.
  std::string latest = read_file(ws.dir / "runs/div/checkpoints/latest");
  latest.pop_back();
  CHECK(latest == "step_00000032");
  CHECK(fs::exists(ws.dir / "runs/div/checkpoints" / latest / "state.json"));
  CHECK(r.output.find("(training.guard.action: skip skips such steps instead)") == std::string::npos);
}

TEST_CASE("guard rollback is refused where it cannot work, before anything is written", "[guard]") {
  TempDir ws("guard");
  const auto refusal = [&](const std::string& config, const std::string& sets) {
    write_file(ws.dir / "bad.yaml", config);
    const CommandResult r = run_ptrain("train bad.yaml " + sets, ws.dir);
    CHECK(r.exit_code == 2);
    CHECK(!fs::exists(ws.dir / "runs"));
    return r.output;
  };
  const std::string fp8 = rollback_config("{action: rollback}");
  CHECK(refusal(fp8, "--set checkpoint.every=0")
            .find("checkpoint.every: 0 with training.guard.action rollback, which reloads the newest checkpoint") !=
        std::string::npos);
  CHECK(refusal(fp8, "--set precision.mode=bf16")
            .find("training.guard.action: rollback with precision bf16: a rollback goes on in bf16") != std::string::npos);
  CHECK(refusal(fp8, "--set distributed.zero_stage=1").find("rollback with distributed.zero_stage 1") != std::string::npos);
  CHECK(refusal(fp8, "--set distributed.zero_stage=2").find("rollback with distributed.zero_stage 2") != std::string::npos);
}

TEST_CASE("a guard that never fires changes nothing: bit-identical losses", "[guard]") {
  TempDir ws("guard");
  // The run every test here starts from, watched at the strictest setting they use (a single step
  // 30 standard deviations above the last 10): it never fires without a fault.
  write_file(ws.dir / "watched.yaml", guarded_config("{action: skip, spike_zscore: 30, window: 10, spike_steps: 1}"));
  write_file(ws.dir / "plain.yaml", guarded_config("{action: stop}"));
  REQUIRE(train_in_process(ws.dir, "watched.yaml", {"run.name=watched"}).exit_code == 0);
  REQUIRE(train_in_process(ws.dir, "plain.yaml", {"run.name=plain"}).exit_code == 0);
  const std::vector<double> a = losses(ws.dir / "runs/watched/metrics.jsonl"), b = losses(ws.dir / "runs/plain/metrics.jsonl");
  REQUIRE(a.size() == 40);
  CHECK(a == b);
  CHECK(nlohmann::json::parse(read_file(ws.dir / "runs/watched/summary.json"))["guard_skipped_steps"] == 0);
}

}  // namespace
}  // namespace ptrain::test
