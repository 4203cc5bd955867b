// What the README promises about resuming, and about the numbers a run reports: checkpoints of
// an abandoned branch are set aside, a changed loss-scaling mode or FP8 history length restarts
// that state (and an unchanged one continues it), the FLOP count is 6N + 6LCT, and the step
// records' tokens_per_s, memory_mib and mfu mean what they say.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <regex>

#include "bad_input.h"
#include "train/run_spec.h"
#include "train/trainer.h"

using namespace ptrain;
using namespace ptrain::test;
namespace fs = std::filesystem;

namespace {

// The loss_scale of each step record after the last resume record.
std::vector<double> scales_after_resume(const fs::path& metrics) {
  std::vector<double> scales;
  for (const auto& r : read_metrics(metrics)) {
    if (r.contains("resume")) scales.clear();
    if (r.contains("loss_scale")) scales.push_back(r["loss_scale"].get<double>());
  }
  return scales;
}

// The last resume record's "resume" object: the step and checkpoint a run's newest invocation resumed from.
nlohmann::json last_resume(const fs::path& metrics) {
  const std::vector<nlohmann::json> resumes = records_with(metrics, "resume");
  REQUIRE(!resumes.empty());
  return resumes.back()["resume"];
}

// The log's line of that resume, as far as its step.
std::string resume_line(const nlohmann::json& resume) {
  return "resumed from " + resume["from"].get<std::string>() + " after step " +
         std::to_string(resume["step"].get<int64_t>());
}

}  // namespace

TEST_CASE("resuming from an earlier checkpoint sets the later ones aside, and auto never returns to them", "[resume]") {
  BadInputWorkspace ws;
  REQUIRE(ws.train("--set training.steps=4 --set checkpoint.every=1 --set checkpoint.keep_last=10").exit_code == 0);
  const fs::path ck = ws.run() / "checkpoints";
  const std::string step4 = read_file(ck / "step_00000004/weights.safetensors");
  const CommandResult r =
      ws.train("--set training.steps=4 --set checkpoint.every=1 --set checkpoint.keep_last=10 "
               "--set checkpoint.resume=" + (ck / "step_00000002").string() + " --stop-at 3");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // The first run's checkpoints after the one resumed from (step 2's), as its records name them,
  // are set aside.
  std::vector<int64_t> superseded;
  for (const auto& m : read_metrics(ws.run() / "metrics.jsonl")) {
    if (m.contains("resume")) break;  // the first run's records end here
    if (m.contains("checkpoint") && m["checkpoint"]["step"] > 2) {
      superseded.push_back(m["checkpoint"]["step"].get<int64_t>());
      CHECK(r.output.find("set aside " + m["checkpoint"]["path"].get<std::string>() + ".superseded") !=
            std::string::npos);
    }
  }
  CHECK(superseded == std::vector<int64_t>{3, 4});
  CHECK(read_file(ck / "step_00000004.superseded/weights.safetensors") == step4);  // kept, not deleted
  CHECK(fs::exists(ck / "step_00000003"));  // the new branch's
  CHECK_FALSE(fs::exists(ck / "step_00000004"));
  // A second branch abandoned at the same step keeps the first one's set-aside copy.
  const CommandResult branch = ws.train("--set training.steps=4 --set checkpoint.every=1 --set checkpoint.keep_last=10 "
                                        "--set checkpoint.resume=" + (ck / "step_00000002").string() + " --stop-at 3");
  INFO(branch.output);
  REQUIRE(branch.exit_code == 0);
  CHECK(fs::exists(ck / "step_00000003.superseded"));
  CHECK(fs::exists(ck / "step_00000003.superseded.2"));
  const CommandResult again = ws.train("--set training.steps=4 --set checkpoint.resume=auto");
  INFO(again.output);
  REQUIRE(again.exit_code == 0);
  const nlohmann::json resume = last_resume(ws.run() / "metrics.jsonl");
  CHECK(resume["step"] == 3);  // the new branch's newest, not the set-aside step 4
  CHECK(resume["from"] == "runs/r/checkpoints/step_00000003");
  CHECK(again.output.find(resume_line(resume)) != std::string::npos);
}

TEST_CASE("a resume from an earlier checkpoint that fails before its first checkpoint leaves the later ones and "
          "latest as they were",
          "[resume]") {
  BadInputWorkspace ws;
  const std::string flags = "--set training.steps=4 --set checkpoint.every=1 --set checkpoint.keep_last=10 ";
  REQUIRE(ws.train(flags).exit_code == 0);
  const fs::path ck = ws.run() / "checkpoints";
  // The checkpoint directory's every file and `latest` before the failing run.
  const auto checkpoints_now = [&] {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(ck))
      if (e.is_regular_file()) files[fs::relative(e.path(), ck).string()] = read_file(e.path());
    return files;
  };
  const std::map<std::string, std::string> before = checkpoints_now();
  REQUIRE(before.at("latest") == "step_00000004\n");
  // Resumed from step 2, the run stops at step 3 (a non-finite loss, by construction), before any save.
  const CommandResult failed =
      ws.train(flags + "--set checkpoint.resume=" + (ck / "step_00000002").string(), "PTRAIN_TEST_FAULT=loss:3:nan");
  INFO(failed.output);
  REQUIRE(failed.exit_code == 4);
  CHECK(checkpoints_now() == before);
  CHECK(failed.output.find("set aside") == std::string::npos);
  // resume: auto still finds the newest checkpoint, as before the failed run.
  const CommandResult again = ws.train(flags + "--set training.steps=5 --set checkpoint.resume=auto");
  INFO(again.output);
  REQUIRE(again.exit_code == 0);
  CHECK(last_resume(ws.run() / "metrics.jsonl")["step"] == 4);
}

TEST_CASE("the loss scaler continues across a resume, and restarts when its mode changes", "[resume]") {
  BadInputWorkspace ws;
  // A scale of 1024 cannot overflow this model's gradients: it doubles every 2 steps, by construction.
  const std::string fp16 = "--set precision.mode=fp16 --set precision.loss_scaling.growth_interval=2 "
                           "--set precision.loss_scaling.init=1024 ";
  REQUIRE(ws.train(fp16 + "--set training.steps=6 --stop-at 5").exit_code == 0);
  const nlohmann::json state =
      nlohmann::json::parse(read_file(ws.run() / "checkpoints/step_00000005/state.json"));
  const double saved = state["loss_scaler"]["scale"].get<double>();
  REQUIRE(saved == 4096);  // it grew after steps 2 and 4: a restart would show
  SECTION("same mode: the scale goes on from the checkpoint's") {
    const CommandResult r = ws.train(fp16 + "--set training.steps=6 --set checkpoint.resume=auto");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("loss scaler starts afresh") == std::string::npos);
    const std::vector<double> scales = scales_after_resume(ws.run() / "metrics.jsonl");
    REQUIRE(scales.size() == 1);
    CHECK(scales[0] == saved);
  }
  SECTION("another mode: it starts afresh, and says so") {
    const CommandResult r = ws.train(fp16 + "--set training.steps=6 --set checkpoint.resume=auto "
                                     "--set precision.loss_scaling.mode=static --set precision.loss_scaling.init=128");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("loss scaling was dynamic in the checkpoint and is static now: the loss scaler starts afresh") !=
          std::string::npos);
    const std::vector<double> scales = scales_after_resume(ws.run() / "metrics.jsonl");
    REQUIRE(scales.size() == 1);
    CHECK(scales[0] == 128);
  }
}

TEST_CASE("the tokens trained go on from a resumed checkpoint's count when training.batch_tokens changes",
          "[resume]") {
  BadInputWorkspace ws;
  REQUIRE(ws.train("--set training.steps=6 --stop-at 2").exit_code == 0);  // 2 steps of 64 tokens
  const auto tokens_in = [&](const std::string& checkpoint) {
    return nlohmann::json::parse(read_file(ws.run() / "checkpoints" / checkpoint / "state.json"))["tokens"].get<int64_t>();
  };
  REQUIRE(tokens_in("step_00000002") == 128);
  const CommandResult r = ws.train("--set training.steps=6 --set checkpoint.resume=auto --set training.batch_tokens=128");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("training.batch_tokens is 128 now and was 64 in the checkpoint") != std::string::npos);
  const int64_t trained = 128 + 4 * 128;  // then 4 steps of 128
  CHECK(tokens_in("step_00000006") == trained);
  CHECK(nlohmann::json::parse(read_file(ws.run() / "summary.json"))["tokens"].get<int64_t>() == trained);
  CHECK(r.output.find("done: 6 steps, 640 tokens") != std::string::npos);
}

TEST_CASE("a checkpoint whose spent hysteresis counter fell below 0 (as earlier versions saved it) resumes",
          "[resume]") {
  BadInputWorkspace ws;
  const std::string fp16 = "--set precision.mode=fp16 --set precision.loss_scaling.init=1024 --set training.steps=4 ";
  REQUIRE(ws.train(fp16 + "--stop-at 2").exit_code == 0);
  const fs::path state = ws.run() / "checkpoints/step_00000002/state.json";
  nlohmann::json j = nlohmann::json::parse(read_file(state));
  j["loss_scaler"]["hysteresis_left"] = -1;
  write_file(state, j.dump(2));
  const CommandResult r = ws.train(fp16 + "--set checkpoint.resume=auto");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json resume = last_resume(ws.run() / "metrics.jsonl");
  CHECK(resume["step"] == 2);
  CHECK(resume["from"] == "runs/r/checkpoints/step_00000002");
  CHECK(r.output.find(resume_line(resume)) != std::string::npos);
}

TEST_CASE("FP8 delayed-scaling histories continue across a resume, and restart when their length changes", "[resume]") {
  BadInputWorkspace ws;
  const std::string fp8 = "--set precision.mode=fp8 --set precision.fp8.recipe=delayed --set training.steps=4 ";
  REQUIRE(ws.train(fp8 + "--stop-at 3").exit_code == 0);
  SECTION("same length: restored") {
    const CommandResult r = ws.train(fp8 + "--set checkpoint.resume=auto");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("fresh delayed-scaling state") == std::string::npos);
  }
  SECTION("another length: every FP8 tensor starts afresh, and the log says how many") {
    const CommandResult r = ws.train(fp8 + "--set checkpoint.resume=auto --set precision.fp8.amax_history=4");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    // One block: 4 linears x (input, weight, output gradient) = 12 FP8 tensors.
    CHECK(r.output.find("12 FP8 tensors start with fresh delayed-scaling state") != std::string::npos);
  }
}

TEST_CASE("training FLOPs per token are 6N + 6LCT, N counted from GPT-2's tensors", "[accounting]") {
  // Counted by hand: the embeddings (padded vocabulary) and per block 2 layernorms (2C each),
  // qkv (3C^2 + 3C), the attention projection (C^2 + C), fc (4C^2 + 4C) and its projection
  // (4C^2 + C), and the final layernorm (2C).
  for (const auto& [L, C, T, V] : std::vector<std::array<int, 4>>{{1, 16, 16, 64}, {4, 256, 256, 50257}, {12, 768, 1024, 50257}}) {
    ModelConfig m;
    m.n_layer = L, m.n_head = 4, m.n_embd = C, m.seq_len = T, m.vocab_size = V;
    const double Vp = std::ceil(V / 128.0) * 128.0;
    const double N = Vp * C + double(T) * C + L * (12.0 * C * C + 13.0 * C) + 2.0 * C;
    CAPTURE(L, C, T, V);
    CHECK(training_flops_per_token(ModelShape::of(m), T) == 6 * N + 6.0 * L * C * T);
  }
}

TEST_CASE("bench reports model FLOP/s as FLOP/token x tokens/s, and the fraction of the ceiling it measured", "[accounting]") {
  BadInputWorkspace ws;
  const CommandResult r = ws.ptrain("bench run.yaml --set training.steps=4 --set checkpoint.save_final=false");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto number = [&](const std::string& pattern) {
    std::smatch m;
    REQUIRE(std::regex_search(r.output, m, std::regex(pattern)));
    return std::stod(m[1].str());
  };
  const double tokens_per_s = number(R"(tokens/s\s+([0-9.]+))");
  const double model_gflops = number(R"(model FLOP/s\s+([0-9.]+) GFLOP/s)");
  const double flops_per_token = number(R"(\(([0-9.e+]+) FLOP/token: 6N \+ 6LCT\))");
  const double ceiling = number(R"(sgemm ceiling\s+([0-9.]+) GFLOP/s)");
  const double fraction = number(R"(model / ceiling\s+([0-9.]+)%)");
  ModelConfig m;
  m.n_layer = 1, m.n_head = 2, m.n_embd = 16, m.seq_len = 16, m.vocab_size = 64;
  CHECK(flops_per_token == Approx(training_flops_per_token(ModelShape::of(m), 16)).epsilon(0.005));  // printed to 3 digits
  // Each figure is printed rounded (FLOP/token to 3 digits, GFLOP/s and % to 0.1, tokens/s to
  // a whole number): the tolerances are those roundings, no more. FLOP/s is checked against the
  // formula's exact FLOP/token, since Approx takes its margin or its epsilon, not their sum.
  CHECK(model_gflops * 1e9 ==
        Approx(training_flops_per_token(ModelShape::of(m), 16) * tokens_per_s).epsilon(0.0001).margin(0.051e9));
  CHECK(fraction == Approx(100.0 * model_gflops / ceiling).margin(0.051 + 100.0 * 0.051 / ceiling));
}

TEST_CASE("each step record's rate, memory and MFU mean what they say", "[accounting]") {
  BadInputWorkspace ws;
  REQUIRE(ws.train().exit_code == 0);
  int steps = 0;
  for (const auto& rec : read_metrics(ws.run() / "metrics.jsonl")) {
    if (!rec.contains("loss")) continue;
    ++steps;
    CAPTURE(rec.dump());
    // tokens_per_s is the step's tokens over its time.
    CHECK(rec["tokens_per_s"].get<double>() * rec["ms"].get<double>() / 1000.0 == Approx(64).epsilon(1e-9));
    // memory_mib is this process's resident memory: more than the model's parameters, gradients
    // and AdamW state (4 x 4 bytes each of ~5,700 parameters), less than the machine.
    const double mib = rec["memory_mib"].get<double>();
    CHECK(mib > 4.0 * 4 * 5700 / (1 << 20));
    CHECK(mib < 64 * 1024);
    // A CPU has no data-sheet peak: no MFU rather than a made-up one.
    CHECK(rec["mfu"].is_null());
  }
  CHECK(steps == 3);
}
