// training.guard: the divergence guard's decisions against their definition, and on runs made to
// diverge on purpose (a learning rate that warms up far too high): `stop` exits 4 naming the
// step, `skip` skips the spiking steps' updates and counts them, a resume across a skip equals
// the uninterrupted run, `rollback` goes back to the checkpoint before the spike and trains on
// in bf16 exactly as a resume from that checkpoint in bf16 would, and a guard that never fires
// changes no loss.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "optim/divergence_guard.h"
#include "test_util.h"

namespace ptrain::test {
namespace {

namespace fs = std::filesystem;
using Verdict = DivergenceGuard::Verdict;

GuardConfig guard_config(const std::string& action, double zscore, int window, int steps) {
  GuardConfig g;
  g.action = action;
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

// A small model whose learning rate warms up to 1.0 over 40 steps: stable for about 20 steps,
// then its loss climbs away.
std::string diverging_config(const std::string& guard) {
  return "run: {name: div, out_dir: runs, seed: 3, device: cpu}\n"
         "model: {n_layer: 2, n_head: 4, n_embd: 64, seq_len: 32, vocab_size: 64}\n"
         "data: {synthetic: {vocab: 64, order: 2, branching: 4, tokens: 60000, seed: 5}}\n"
         "training: {steps: 40, batch_tokens: 256, micro_batch: 8, eval_every: 0, eval_batches: 2, threads: 1,\n"
         "           grad_clip: 0, guard: " + guard + "}\n"
         "optimizer: {lr: 1.0, weight_decay: 0}\n"
         "schedule: {warmup_steps: 40, decay: constant}\n"
         "checkpoint: {every: 10, keep_last: 5, save_final: false}\n";
}

std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> out;
  for (const auto& r : read_metrics(metrics))
    if (r.contains("loss")) out.push_back(r["loss"].get<double>());
  return out;
}

TEST_CASE("guard stop: a run made to diverge exits 4 at the spike, naming the step", "[guard]") {
  TempDir ws("guard");
  write_file(ws.dir / "run.yaml", diverging_config("{action: stop, spike_zscore: 4, window: 10, spike_steps: 2}"));
  const CommandResult r = run_ptrain("train run.yaml", ws.dir);
  INFO(r.output);
  CHECK(r.exit_code == 4);
  CHECK(r.output.find("training stopped by the divergence guard at step ") != std::string::npos);
  CHECK(r.output.find("standard deviations above the mean of the last 10 steps") != std::string::npos);
  int64_t stop_step = 0;
  for (const auto& m : read_metrics(ws.dir / "runs/div/metrics.jsonl"))
    if (m.contains("guard")) {
      CHECK(m["guard"] == "stop");
      stop_step = m["step"].get<int64_t>();
    }
  REQUIRE(stop_step > 11);  // after a full window
  CHECK(r.output.find("at step " + std::to_string(stop_step) + ":") != std::string::npos);
  // Steps before the spike were trained and logged; none after it.
  CHECK(losses(ws.dir / "runs/div/metrics.jsonl").size() == static_cast<size_t>(stop_step - 1));
}

TEST_CASE("guard skip: the spiking steps' updates are skipped and counted, and a resume across them is exact",
          "[guard]") {
  TempDir ws("guard");
  const std::string guard = "{action: skip, spike_zscore: 4, window: 10, spike_steps: 2}";
  write_file(ws.dir / "run.yaml", diverging_config(guard));
  const CommandResult r = run_ptrain("train run.yaml", ws.dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  int64_t skips = 0, first_skip = 0;
  for (const auto& m : read_metrics(ws.dir / "runs/div/metrics.jsonl"))
    if (m.contains("guard")) {
      CHECK(m["guard"] == "skip");
      if (skips++ == 0) first_skip = m["step"].get<int64_t>();
    }
  REQUIRE(skips > 0);
  const nlohmann::json summary = nlohmann::json::parse(read_file(ws.dir / "runs/div/summary.json"));
  CHECK(summary["guard_skipped_steps"].get<int64_t>() == skips);
  CHECK(count_of(r.output, "its update skipped") == static_cast<size_t>(skips));
  const std::vector<double> whole = losses(ws.dir / "runs/div/metrics.jsonl");
  CHECK(whole.size() == 40);

  // The same run stopped at step 30 (checkpoint 30 keeps the guard's window) and resumed.
  write_file(ws.dir / "split.yaml", diverging_config(guard));
  REQUIRE(run_ptrain("train split.yaml --set run.name=split --stop-at 30", ws.dir).exit_code == 0);
  const CommandResult resumed = run_ptrain("train split.yaml --set run.name=split --set checkpoint.resume=auto", ws.dir);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  std::vector<double> split;  // the last record of each step counts
  std::map<int64_t, double> by_step;
  for (const auto& m : read_metrics(ws.dir / "runs/split/metrics.jsonl"))
    if (m.contains("loss")) by_step[m["step"].get<int64_t>()] = m["loss"].get<double>();
  for (const auto& [step, loss] : by_step) split.push_back(loss);
  CHECK(split == whole);
  CHECK(first_skip > 30);  // decided after the resume, by the window the checkpoint kept
}

TEST_CASE("guard skip gives up after max_skips skipped updates in a row, and stops", "[guard]") {
  TempDir ws("guard");
  write_file(ws.dir / "run.yaml",
             diverging_config("{action: skip, spike_zscore: 4, window: 10, spike_steps: 2, max_skips: 2}"));
  const CommandResult r = run_ptrain("train run.yaml", ws.dir);
  INFO(r.output);
  CHECK(r.exit_code == 4);
  CHECK(count_of(r.output, "its update skipped") == 2);
  CHECK(r.output.find("and 2 updates in a row were skipped (training.guard.max_skips)") != std::string::npos);
  // The same run without the cap skips its first two at the same steps: the stop is the second's.
  int64_t last_skip = 0;
  for (const auto& m : read_metrics(ws.dir / "runs/div/metrics.jsonl"))
    if (m.contains("guard") && m["guard"] == "skip") last_skip = m["step"].get<int64_t>();
  CHECK(r.output.find("at step " + std::to_string(last_skip) + ":") != std::string::npos);
}

// An fp8 run at a learning rate warming up to `lr` over its 60 steps, checkpointed every 5. At
// lr 0.2 its loss spikes 3 standard deviations at one step in the high 30s; at lr 0.6 it
// diverges at step 33, in bf16 as well once the checkpoint of step 30 is reached.
std::string rollback_config(const std::string& lr, const std::string& guard) {
  std::string c = diverging_config(guard);
  c.replace(c.find("lr: 1.0"), 7, "lr: " + lr);
  c.replace(c.find("steps: 40,"), 10, "steps: 60,");
  c.replace(c.find("warmup_steps: 40"), 16, "warmup_steps: 60");
  c.replace(c.find("every: 10"), 9, "every: 5");
  return c + "precision: {mode: fp8}\n";
}

std::map<int64_t, double> losses_by_step(const fs::path& metrics) {  // the last record of a step counts
  std::map<int64_t, double> out;
  for (const auto& m : read_metrics(metrics))
    if (m.contains("loss")) out[m["step"].get<int64_t>()] = m["loss"].get<double>();
  return out;
}

TEST_CASE("guard rollback: a spiking fp8 run goes back to the checkpoint before the spike and trains on in bf16, "
          "exactly as a resume from it in bf16",
          "[guard]") {
  TempDir ws("guard");
  const std::string spike = "spike_zscore: 3, window: 10, spike_steps: 1";
  write_file(ws.dir / "run.yaml", rollback_config("0.2", "{action: rollback, " + spike + "}"));
  const CommandResult r = run_ptrain("train run.yaml", ws.dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::vector<nlohmann::json> events;
  for (const auto& m : read_metrics(ws.dir / "runs/div/metrics.jsonl"))
    if (m.contains("guard")) events.push_back(m);
  REQUIRE(events.size() == 1);
  const nlohmann::json& e = events[0];
  CHECK(e["guard"] == "rollback");
  const int64_t fired = e["step"].get<int64_t>(), to = e["to_step"].get<int64_t>();
  // The newest checkpoint before the spiking step (checkpoints every 5 steps).
  CHECK(to == (fired - 1) / 5 * 5);
  REQUIRE(to > 10);
  CHECK(e["fallback"] == "bf16");
  CHECK(e["fallback_last"].is_null());
  CHECK(r.output.find("rolled back to runs/div/checkpoints/step_000000" + std::to_string(to) + " (step " +
                      std::to_string(to) + "): bf16 from step " + std::to_string(to + 1) + " to the end of the run") !=
        std::string::npos);
  const nlohmann::json summary = nlohmann::json::parse(read_file(ws.dir / "runs/div/summary.json"));
  CHECK(summary["guard_rollbacks"] == 1);
  CHECK(summary["precision"] == "fp8:delayed");

  // The same run stopped at the checkpoint, then resumed from it in bf16 (with a guard that
  // stops, had it anything to stop): the rolled-back run's every step's loss, bit for bit. So
  // the rollback restored the checkpoint's state exactly, and replayed the same data after it.
  write_file(ws.dir / "ref.yaml", rollback_config("0.2", "{action: rollback, " + spike + "}"));
  REQUIRE(run_ptrain("train ref.yaml --set run.name=ref --stop-at " + std::to_string(to), ws.dir).exit_code == 0);
  const CommandResult resumed = run_ptrain(
      "train ref.yaml --set run.name=ref --set checkpoint.resume=auto --set precision.mode=bf16 "
      "--set training.guard.action=stop",
      ws.dir);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const std::map<int64_t, double> rolled = losses_by_step(ws.dir / "runs/div/metrics.jsonl");
  REQUIRE(rolled.size() == 60);
  CHECK(rolled == losses_by_step(ws.dir / "runs/ref/metrics.jsonl"));
  // The spiking branch's loss was another: the fallback trained those steps anew.
  for (const auto& m : read_metrics(ws.dir / "runs/div/metrics.jsonl"))
    if (m.contains("loss") && m["step"] == fired) {
      CHECK(m["loss"].get<double>() != rolled.at(fired));
      break;
    }
}

TEST_CASE("guard rollback: a fallback of N steps returns to fp8, and a resume inside it is exact", "[guard]") {
  TempDir ws("guard");
  const std::string guard = "{action: rollback, spike_zscore: 3, window: 10, spike_steps: 1, fallback_steps: 10}";
  write_file(ws.dir / "run.yaml", rollback_config("0.2", guard));
  const CommandResult r = run_ptrain("train run.yaml", ws.dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  int64_t fired = 0, to = 0, back = 0;
  for (const auto& m : read_metrics(ws.dir / "runs/div/metrics.jsonl")) {
    if (m.contains("guard")) {
      fired = m["step"].get<int64_t>();
      to = m["to_step"].get<int64_t>();
      CHECK(m["fallback_last"] == to + 10);
    }
    if (m.contains("precision_phase")) {
      back = m["step"].get<int64_t>();
      CHECK(m["precision_phase"]["from"] == "bf16");
      CHECK(m["precision_phase"]["to"] == "fp8:delayed");
    }
  }
  REQUIRE(to > 0);
  CHECK(back == to + 11);
  CHECK(r.output.find("bf16 from step " + std::to_string(to + 1) + " to step " + std::to_string(to + 10) +
                      ", then fp8:delayed again") != std::string::npos);
  CHECK(r.output.find("precision: step " + std::to_string(to + 11) + " ends the guard's bf16 fallback: fp8:delayed "
                      "again") != std::string::npos);

  // Stopped inside the fallback (after the rollback) and resumed: its checkpoint keeps the
  // fallback, so the resumed run trains in bf16 to its end and then in fp8, as the whole run did.
  write_file(ws.dir / "split.yaml", rollback_config("0.2", guard));
  const int64_t stop = fired + 1;
  REQUIRE(stop < to + 10);
  REQUIRE(run_ptrain("train split.yaml --set run.name=split --stop-at " + std::to_string(stop), ws.dir).exit_code == 0);
  const CommandResult resumed = run_ptrain("train split.yaml --set run.name=split --set checkpoint.resume=auto", ws.dir);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("precision: resuming at step " + std::to_string(stop + 1) + " in the guard's bf16 fallback") !=
        std::string::npos);
  const std::map<int64_t, double> whole = losses_by_step(ws.dir / "runs/div/metrics.jsonl");
  REQUIRE(whole.size() == 60);
  CHECK(losses_by_step(ws.dir / "runs/split/metrics.jsonl") == whole);
}

TEST_CASE("guard rollback: diverging again onto the same checkpoint stops (exit 4), the later checkpoints set aside",
          "[guard]") {
  TempDir ws("guard");
  // lr 0.6: the fp8 run diverges at step 33; 2 steps of bf16 from step 30 do not change that.
  write_file(ws.dir / "run.yaml",
             rollback_config("0.6", "{action: rollback, spike_zscore: 4, window: 10, spike_steps: 2, fallback_steps: 2}"));
  // Checkpoints every 4 steps: the one of step 32 is inside the spike (steps 32 and 33).
  const CommandResult r = run_ptrain("train run.yaml --set checkpoint.every=4", ws.dir);
  INFO(r.output);
  CHECK(r.exit_code == 4);
  CHECK(r.output.find("rolled back to runs/div/checkpoints/step_00000028 (step 28)") != std::string::npos);
  CHECK(r.output.find("set aside runs/div/checkpoints/step_00000032.superseded: it came after the checkpoint the guard "
                      "rolled back to") != std::string::npos);
  CHECK(fs::exists(ws.dir / "runs/div/checkpoints/step_00000032.superseded"));
  CHECK(r.output.find("again after rolling back to the checkpoint of step 28: the bf16 fallback (to step 30) did not "
                      "prevent it; a longer training.guard.fallback_steps (0: to the end) might") != std::string::npos);
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
  const std::string fp8 = rollback_config("0.2", "{action: rollback}");
  CHECK(refusal(fp8, "--set checkpoint.every=0")
            .find("checkpoint.every: 0 with training.guard.action rollback, which reloads the newest checkpoint") !=
        std::string::npos);
  CHECK(refusal(fp8, "--set precision.mode=bf16")
            .find("training.guard.action: rollback with precision bf16: a rollback goes on in bf16") != std::string::npos);
  CHECK(refusal(fp8, "--set distributed.zero_stage=1").find("rollback with distributed.zero_stage 1") != std::string::npos);
}

TEST_CASE("a guard that never fires changes nothing: bit-identical losses", "[guard]") {
  TempDir ws("guard");
  // lr 1e-3: a sane run, which the guard watches with a tight threshold and never stops.
  std::string sane = diverging_config("{action: skip, spike_zscore: 50, window: 5, spike_steps: 1}");
  sane.replace(sane.find("lr: 1.0"), 7, "lr: 1e-3");
  write_file(ws.dir / "watched.yaml", sane);
  std::string plain = diverging_config("{action: stop}");
  plain.replace(plain.find("lr: 1.0"), 7, "lr: 1e-3");
  write_file(ws.dir / "plain.yaml", plain);
  REQUIRE(run_ptrain("train watched.yaml --set run.name=watched", ws.dir).exit_code == 0);
  REQUIRE(run_ptrain("train plain.yaml --set run.name=plain", ws.dir).exit_code == 0);
  const std::vector<double> a = losses(ws.dir / "runs/watched/metrics.jsonl"), b = losses(ws.dir / "runs/plain/metrics.jsonl");
  REQUIRE(a.size() == 40);
  CHECK(a == b);
  CHECK(nlohmann::json::parse(read_file(ws.dir / "runs/watched/summary.json"))["guard_skipped_steps"] == 0);
}

}  // namespace
}  // namespace ptrain::test
