// precision.schedule: phases read and refused as the config's other keys are, the switch at the
// exact boundary step (losses before it are the first phase's mode's, bit for bit), the switch
// in the log and metrics, and a resume on either side of a boundary equal to the uninterrupted
// run, bit for bit. The runs train in this process (tests/in_process.h).
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "precision/policy.h"
#include "in_process.h"
#include "test_util.h"

namespace ptrain::test {
namespace {

namespace fs = std::filesystem;

const std::string kBase =
    "run: {name: r, out_dir: runs, seed: 4, device: cpu}\n"
    "model: {n_layer: 2, n_head: 2, n_embd: 64, seq_len: 32, vocab_size: 64}\n"
    "data: {synthetic: {vocab: 64, order: 2, branching: 4, tokens: 60000, seed: 5}}\n"
    "training: {steps: 20, batch_tokens: 256, micro_batch: 8, eval_every: 10, eval_batches: 2, threads: 1}\n"
    "optimizer: {lr: 3.0e-3}\n"
    "schedule: {warmup_steps: 4}\n"
    "checkpoint: {every: 4, keep_last: 10}\n";

// FP8 (delayed scaling, so there is scaling state to carry) to step 8, then BF16.
const std::string kFp8ThenBf16 =
    "precision:\n"
    "  schedule:\n"
    "    - {until_step: 8, mode: fp8, fp8: {recipe: delayed, margin: 1}}\n"
    "    - {mode: bf16}\n";

std::string problems_of(const std::string& yaml) {
  try {
    parse_config(yaml, "run.yaml");
  } catch (const UserErrors& e) {
    return e.what();
  }
  return "";
}

// Step -> loss, the last record of each step (a resumed run's segments).
std::map<int64_t, double> losses(const fs::path& metrics) {
  std::map<int64_t, double> by_step;
  for (const auto& m : read_metrics(metrics))
    if (m.contains("loss")) by_step[m["step"].get<int64_t>()] = m["loss"].get<double>();
  return by_step;
}

// The log's line for a precision_phase record of a two-phase schedule, up to its parenthesis.
std::string switch_message(const nlohmann::json& record) {
  const nlohmann::json& p = record["precision_phase"];
  return "precision: step " + std::to_string(record["step"].get<int64_t>()) + " starts phase " +
         std::to_string(p["phase"].get<int64_t>()) + " of 2, " + p["from"].get<std::string>() + " -> " +
         p["to"].get<std::string>();
}

TEST_CASE("precision.schedule: phases resolve against training.steps and survive the resolved config", "[precision_schedule]") {
  const Config c = parse_config(kBase +
                                    "precision:\n"
                                    "  fp8: {margin: 2}\n"
                                    "  schedule:\n"
                                    "    - {until_fraction: 0.25, mode: bf16}\n"
                                    "    - {until_step: 15, mode: fp8, fp8: {recipe: current}}\n"
                                    "    - {mode: fp8}\n",
                                "run.yaml");
  REQUIRE(c.precision.schedule.size() == 3);
  CHECK(c.precision.mode == PrecisionMode::bf16);  // the first phase's
  CHECK(c.precision.schedule[1].fp8.recipe == Fp8Recipe::current);
  CHECK(c.precision.schedule[1].fp8.margin == 2);  // precision.fp8 under the phase's own keys
  CHECK(c.precision.schedule[2].fp8.recipe == Fp8Recipe::delayed);
  const PrecisionSchedule s = PrecisionSchedule::from_config(c.precision, c.training.steps);
  CHECK(s.label() == "bf16>fp8:current>fp8:delayed@5,15");
  CHECK(s.describe() == "bf16 for steps 1-5, then fp8:current for steps 6-15, then fp8:delayed for steps 16-20");
  CHECK(s.phase_at(5) == 0);
  CHECK(s.phase_at(6) == 1);
  CHECK(s.phase_at(16) == 2);
  // A fraction's step is the decimal's: 0.29 x 100 is 28.999999999999996 in doubles, and step 29.
  PrecisionPhase phase;
  phase.until_fraction = 0.29;
  CHECK(phase_last_step(phase, 100) == 29);
  phase.until_fraction = 0.57;
  CHECK(phase_last_step(phase, 100) == 57);
  // The resolved config reads back the same, and a --set replaces or removes the schedule.
  CHECK(config_to_yaml(parse_config(config_to_yaml(c), "config.yaml")) == config_to_yaml(c));
  const Config none = parse_config(config_to_yaml(c), "config.yaml", {"precision.schedule=null", "precision.mode=fp32"});
  CHECK(none.precision.schedule.empty());
  CHECK(none.precision.mode == PrecisionMode::fp32);
  const Config other =
      parse_config(kBase, "run.yaml", {"precision.schedule=[{until_fraction: 0.5, mode: fp8}, {mode: bf16}]"});
  CHECK(PrecisionSchedule::from_config(other.precision, other.training.steps).label() == "fp8:delayed>bf16@10");
}

TEST_CASE("precision.schedule: bad phases are named with what was expected", "[precision_schedule]") {
  const auto with = [](const std::string& phases) { return kBase + "precision:\n  schedule: " + phases + "\n"; };
  CHECK_THAT(problems_of(with("[{until_step: 5, mode: fp32}, {mode: bf16}]")),
             Catch::Contains("precision.schedule[1].mode: fp32 is not a valid choice; expected bf16 or fp8, the modes "
                             "that store weights, activations and gradients alike"));
  CHECK_THAT(problems_of(with("[{until_step: 5, mode: bf16}, {until_step: 9, mode: fp8}]")),
             Catch::Contains("precision.schedule[2]: the last phase has an end (until_step)"));
  CHECK_THAT(problems_of(with("[{mode: bf16}, {mode: fp8}]")),
             Catch::Contains("precision.schedule[1]: no end; expected until_step"));
  CHECK_THAT(problems_of(with("[{until_step: 9, mode: bf16}, {until_step: 9, mode: fp8}, {mode: bf16}]")),
             Catch::Contains("precision.schedule[2]: ends at step 9, not after the phase before it (step 9)"));
  CHECK_THAT(problems_of(with("[{until_step: 20, mode: bf16}, {mode: fp8}]")),
             Catch::Contains("precision.schedule[1]: ends at step 20, so the phases after it never run"));
  CHECK_THAT(problems_of(with("[{until_fraction: 0.01, mode: bf16}, {mode: fp8}]")),
             Catch::Contains("ends at step 0 (floor of 0.01 x training.steps 20), before step 1"));
  CHECK_THAT(problems_of(with("[{until_step: 5, mode: bf16, speed: 2}, {mode: fp8}]")),
             Catch::Contains("precision.schedule[1].speed: unknown key"));
  CHECK_THAT(problems_of(with("[{until_step: 5, mode: fp8, fp8: {recipe: fast}}, {mode: bf16}]")),
             Catch::Contains("precision.schedule[1].fp8.recipe: fast is not a valid choice"));
  CHECK_THAT(problems_of(with("[{until_step: 5, mode: fp8, fp8: {recipy: current}}, {mode: bf16}]")),
             Catch::Contains("precision.schedule[1].fp8.recipy: unknown key; expected a key of precision.fp8"));
  CHECK_THAT(problems_of(with("fp8")), Catch::Contains("precision.schedule: got fp8; expected a list of phases"));
  CHECK_THAT(problems_of(kBase + "precision:\n  mode: fp32\n  schedule: [{until_step: 5, mode: fp8}, {mode: bf16}]\n"),
             Catch::Contains("precision.mode: fp32, while precision.schedule starts in fp8; expected precision.mode left "
                             "out (the schedule sets it; --set precision.mode=null)"));
  CHECK_THAT(problems_of(with("[{until_step: 5, mode: bf16, fp8: {margin: 1}, fp8: {recipe: current}}, {mode: fp8}]")),
             Catch::Contains("precision.schedule[1].fp8: duplicate key"));
  // FP8 phases' shape rules apply as precision.mode fp8's do: n_embd 64 is no whole 128 block.
  CHECK_THAT(problems_of(with("[{until_step: 5, mode: bf16}, {mode: fp8, fp8: {recipe: block}}]")),
             Catch::Contains("model.n_embd: 64 is not a multiple of 128 as precision.schedule's FP8 phases with recipe "
                             "block need"));
}

TEST_CASE("precision.schedule switches at the boundary step, says so, and resumes across it bit for bit",
          "[precision_schedule]") {
  TempDir ws("schedule");
  write_file(ws.dir / "run.yaml", kBase + kFp8ThenBf16);
  const InProcessRun r = train_in_process(ws.dir, "run.yaml");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<nlohmann::json> switches = records_with(ws.dir / "runs/r/metrics.jsonl", "precision_phase");
  REQUIRE(switches.size() == 1);
  CHECK(switches[0]["step"] == 9);
  CHECK(switches[0]["precision_phase"]["phase"] == 2);
  CHECK(switches[0]["precision_phase"]["from"] == "fp8:delayed");
  CHECK(switches[0]["precision_phase"]["to"] == "bf16");
  const nlohmann::json summary = nlohmann::json::parse(read_file(ws.dir / "runs/r/summary.json"));
  CHECK(summary["precision"] == "fp8:delayed>bf16@8");
  CHECK(summary["steps"] == 20);
  const int64_t boundary = switches[0]["step"].get<int64_t>();
  CHECK(r.output.find("precision fp8:delayed for steps 1-" + std::to_string(boundary - 1) + ", then bf16 for steps " +
                      std::to_string(boundary) + "-" + std::to_string(summary["steps"].get<int64_t>())) !=
        std::string::npos);
  CHECK(r.output.find(switch_message(switches[0]) + " (FP8 scaling state dropped; loss scaler restarted)") !=
        std::string::npos);
  const std::map<int64_t, double> whole = losses(ws.dir / "runs/r/metrics.jsonl");
  REQUIRE(whole.size() == 20);

  // Steps 1-8 are the plain fp8 run's, bit for bit; from step 9 on (its weights are the same up
  // to step 8's update) the runs part: the switch is at the boundary, not a step early or late.
  const std::string plain_fp8 = "precision: {mode: fp8, fp8: {recipe: delayed, margin: 1}}\n";
  write_file(ws.dir / "fp8.yaml", kBase + plain_fp8);
  REQUIRE(train_in_process(ws.dir, "fp8.yaml", {"run.name=fp8"}).exit_code == 0);
  const std::map<int64_t, double> fp8 = losses(ws.dir / "runs/fp8/metrics.jsonl");
  for (int64_t step = 1; step <= 8; ++step) CHECK(fp8.at(step) == whole.at(step));
  CHECK(fp8.at(10) != whole.at(10));

  // Stopped before the boundary (step 4) and at it (step 8, the first phase's last), then
  // resumed: the same losses, bit for bit, as the run that went through.
  for (const int stop : {4, 8}) {
    const std::string name = "split" + std::to_string(stop);
    REQUIRE(train_in_process(ws.dir, "run.yaml", {"run.name=" + name}, "", stop).exit_code == 0);
    const InProcessRun resumed = train_in_process(ws.dir, "run.yaml", {"run.name=" + name, "checkpoint.resume=auto"});
    INFO(resumed.output);
    REQUIRE(resumed.exit_code == 0);
    CHECK(losses(ws.dir / "runs" / name / "metrics.jsonl") == whole);
    // The switch is recorded once, at the same step as in the run that went through: by the
    // resumed invocation (the first stopped before step 9), at its start (stop 8) or in its loop.
    const std::vector<nlohmann::json> split_switches = records_with(ws.dir / "runs" / name / "metrics.jsonl",
                                                                    "precision_phase");
    REQUIRE(split_switches.size() == 1);
    CHECK(split_switches[0] == switches[0]);
    CHECK(count_of(resumed.output, switch_message(split_switches[0])) == split_switches.size());
  }
}

TEST_CASE("precision.schedule into FP8: its scaling state starts fresh at the boundary, and a resume there agrees",
          "[precision_schedule]") {
  TempDir ws("schedule");
  write_file(ws.dir / "run.yaml", kBase +
                                      "precision:\n"
                                      "  schedule:\n"
                                      "    - {until_step: 8, mode: bf16}\n"
                                      "    - {mode: fp8, fp8: {recipe: delayed}}\n");
  const InProcessRun r = train_in_process(ws.dir, "run.yaml");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<nlohmann::json> switches = records_with(ws.dir / "runs/r/metrics.jsonl", "precision_phase");
  REQUIRE(switches.size() == 1);
  CHECK(switches[0]["step"] == 9);
  CHECK(switches[0]["precision_phase"]["phase"] == 2);
  CHECK(switches[0]["precision_phase"]["from"] == "bf16");
  CHECK(switches[0]["precision_phase"]["to"] == "fp8:delayed");
  CHECK(r.output.find(switch_message(switches[0]) + " (FP8 layers made afresh; loss scaler restarted)") !=
        std::string::npos);
  const std::map<int64_t, double> whole = losses(ws.dir / "runs/r/metrics.jsonl");
  write_file(ws.dir / "bf16.yaml", kBase + "precision: {mode: bf16}\n");
  REQUIRE(train_in_process(ws.dir, "bf16.yaml", {"run.name=bf16"}).exit_code == 0);
  const std::map<int64_t, double> bf16 = losses(ws.dir / "runs/bf16/metrics.jsonl");
  for (int64_t step = 1; step <= 8; ++step) CHECK(bf16.at(step) == whole.at(step));
  CHECK(bf16.at(9) != whole.at(9));  // step 9's forward pass already runs FP8 GEMMs
  // Resumed from step 8's checkpoint (bf16, no FP8 state in it) and from step 12's (FP8 state).
  for (const int stop : {8, 12}) {
    const std::string name = "split" + std::to_string(stop);
    REQUIRE(train_in_process(ws.dir, "run.yaml", {"run.name=" + name}, "", stop).exit_code == 0);
    const InProcessRun resumed = train_in_process(ws.dir, "run.yaml", {"run.name=" + name, "checkpoint.resume=auto"});
    INFO(resumed.output);
    REQUIRE(resumed.exit_code == 0);
    CHECK(losses(ws.dir / "runs" / name / "metrics.jsonl") == whole);
  }
}

}  // namespace
}  // namespace ptrain::test
