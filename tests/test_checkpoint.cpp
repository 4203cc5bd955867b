// Checkpoints as a user meets them: the files follow the published safetensors layout, a run
// stopped and resumed equals an uninterrupted one bit for bit in every precision, corrupt or
// incomplete checkpoints are caught, and Ctrl-C saves before exiting.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "core/sha256.h"
#include "core/error.h"
#include "test_util.h"

using namespace ptrain;
using namespace ptrain::test;
namespace fs = std::filesystem;

namespace {

const char* kRun =
    "run: {name: r, out_dir: runs}\n"
    "model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 16, vocab_size: 64}\n"
    "data: {synthetic: {vocab: 64, order: 2, branching: 3, tokens: 50000, seed: 5}}\n"
    "training: {steps: 8, batch_tokens: 256, micro_batch: 8, eval_every: 4, eval_batches: 2}\n"
    "optimizer: {lr: 3.0e-3}\n"
    "schedule: {warmup_steps: 2}\n"
    "logging: {numerics_every: 3}\n";

// (step, loss) and (step, val_loss) pairs: what must match between a resumed and a straight run.
std::vector<std::pair<int64_t, double>> loss_trace(const fs::path& file) {
  std::vector<std::pair<int64_t, double>> out;
  for (const auto& r : read_metrics(file)) {
    if (r.contains("loss")) out.emplace_back(r["step"].get<int64_t>(), r["loss"].get<double>());
    if (r.contains("val_loss")) out.emplace_back(-r["step"].get<int64_t>(), r["val_loss"].get<double>());
  }
  return out;
}

std::string bytes_of(const fs::path& p) { return read_file(p); }

void flip_a_bit(const fs::path& p, size_t offset) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

struct Workspace {
  fs::path dir = make_temp_dir("ckpt");
  Workspace() { write_file(dir / "run.yaml", kRun); }
  ~Workspace() { fs::remove_all(dir); }
  CommandResult train(const std::string& flags, const std::string& env = "") const {
    return run_ptrain("train run.yaml " + flags, dir, env);
  }
  fs::path run(const std::string& name) const { return dir / "runs" / name; }
};

}  // namespace

TEST_CASE("sha256 matches the FIPS 180-4 test vectors", "[checkpoint]") {
  auto hex = [](const std::string& s) {
    Sha256 h;
    h.update(s.data(), s.size());
    return h.hex_digest();
  };
  CHECK(hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("safetensors files follow the published layout", "[checkpoint]") {
  const fs::path dir = make_temp_dir("st");
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-1.5f};
  write_safetensors((dir / "x.safetensors").string(), {{"a", {2, 3}, a.data()}, {"b.bias", {1}, b.data()}},
                    {{"producer", "ptrain"}});
  const std::string raw = read_file(dir / "x.safetensors");
  // 8-byte little-endian header length, a JSON header, then the tensors' bytes.
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<uint8_t>(raw[i])} << (8 * i);
  REQUIRE(n % 8 == 0);
  REQUIRE(8 + n + 7 * sizeof(float) == raw.size());
  const auto header = nlohmann::json::parse(raw.substr(8, n));
  CHECK(header["__metadata__"]["producer"] == "ptrain");
  CHECK(header["a"]["dtype"] == "F32");
  CHECK(header["a"]["shape"] == nlohmann::json::array({2, 3}));
  CHECK(header["a"]["data_offsets"] == nlohmann::json::array({0, 24}));
  CHECK(header["b.bias"]["data_offsets"] == nlohmann::json::array({24, 28}));
  float first;
  std::memcpy(&first, raw.data() + 8 + n, sizeof first);
  CHECK(first == 1.0f);

  const SafetensorsFile file = SafetensorsFile::read((dir / "x.safetensors").string());
  std::vector<float> back(6);
  file.copy_to("a", back.data(), 6);
  CHECK(back == a);
  CHECK_THROWS_AS(file.copy_to("a", back.data(), 5), UserError);

  // A truncated file is refused, naming it.
  fs::resize_file(dir / "x.safetensors", raw.size() - 2);
  CHECK_THROWS_WITH(SafetensorsFile::read((dir / "x.safetensors").string()), Catch::Contains("x.safetensors"));
  fs::remove_all(dir);
}

TEST_CASE("stopping and resuming equals an uninterrupted run bit for bit", "[checkpoint]") {
  const std::vector<std::pair<std::string, std::string>> modes = {
      {"fp32", ""},
      {"bf16", "--set precision.mode=bf16"},
      // Steps 1-3 overflow by construction (their gradients made infinite, PTRAIN_TEST_FAULT):
      // skips, hysteresis and back-off happen before the stop, and growth (every 2 clean steps)
      // across it. A scale of 1024 cannot overflow this model's gradients on its own.
      {"fp16", "--set precision.mode=fp16 --set precision.loss_scaling.init=1024 "
               "--set precision.loss_scaling.hysteresis=2 --set precision.loss_scaling.growth_interval=2"},
      // A history of 4 is full at the stop after step 4.
      {"fp8", "--set precision.mode=fp8 --set precision.fp8.recipe=delayed --set precision.fp8.amax_history=4"},
      // The block linears' FP8 codes cast again from the resumed FP32 master.
      {"fp8-primary", "--set precision.mode=fp8 --set precision.fp8.recipe=current "
                      "--set precision.fp8.primary_weights=true"},
      // Llama, one K/V head, its own tensor names in the checkpoint files (QK-norm's weights
      // among them).
      {"llama-bf16", "--set model.arch=llama --set model.n_kv_head=1 --set model.mlp_hidden=48 "
                     "--set model.qk_norm=true --set precision.mode=bf16"},
      // Llama 3's vocabulary size: the corpus in uint32 shards, ids past 65,535 in every batch.
      {"llama-128k", "--set model.arch=llama --set model.n_kv_head=1 --set model.vocab_size=128256 "
                     "--set data.synthetic.vocab=128256 --set precision.mode=bf16"},
  };
  Workspace ws;
  for (const auto& [mode, flags] : modes) {
    CAPTURE(mode);
    const std::string faults = mode == "fp16" ? "PTRAIN_TEST_FAULT=grad:1:inf,grad:2:inf,grad:3:inf" : "";
    const CommandResult straight = ws.train("--set run.name=" + mode + "-straight " + flags, faults);
    INFO(straight.output);
    REQUIRE(straight.exit_code == 0);
    const CommandResult first = ws.train("--set run.name=" + mode + "-resumed --stop-at 4 " + flags, faults);
    INFO(first.output);
    REQUIRE(first.exit_code == 0);
    CHECK(first.output.find("resume with") != std::string::npos);
    const CommandResult second =
        ws.train("--set run.name=" + mode + "-resumed --set checkpoint.resume=auto " + flags, faults);
    INFO(second.output);
    REQUIRE(second.exit_code == 0);
    CHECK(second.output.find("resumed from") != std::string::npos);
    CHECK((straight.output.find("(llm.c's Llama 3 format, uint32 tokens)") != std::string::npos) ==
          (mode == "llama-128k"));

    const auto a = loss_trace(ws.run(mode + "-straight") / "metrics.jsonl");
    const auto b = loss_trace(ws.run(mode + "-resumed") / "metrics.jsonl");
    REQUIRE(a.size() == 8 + 3);  // 8 steps, val at 0, 4, 8
    CHECK(b == a);
    const auto scaler_trace = [&](const std::string& run) {
      std::vector<std::pair<double, int64_t>> out;
      for (const auto& r : read_metrics(ws.run(run) / "metrics.jsonl"))
        if (r.contains("loss")) out.emplace_back(r["loss_scale"].get<double>(), r["skipped"].get<int64_t>());
      return out;
    };
    CHECK(scaler_trace(mode + "-resumed") == scaler_trace(mode + "-straight"));
    if (mode == "fp16") {
      // Step 1 uses up the hysteresis, steps 2 and 3 halve the scale; then 2 clean steps double it.
      const std::vector<std::pair<double, int64_t>> expected = {{1024, 1}, {1024, 2}, {512, 3}, {256, 3},
                                                                {256, 3},  {512, 3},  {512, 3}, {1024, 3}};
      CHECK(scaler_trace(mode + "-straight") == expected);
    }
    for (const char* file : {"weights.safetensors", "optimizer.safetensors"})
      CHECK(bytes_of(ws.run(mode + "-straight") / "checkpoints/step_00000008" / file) ==
            bytes_of(ws.run(mode + "-resumed") / "checkpoints/step_00000008" / file));
  }
}

TEST_CASE("two sources weighted 0.7 and 0.3 give those shares over 200 steps, and a resume in the middle is bit for bit",
          "[checkpoint]") {
  const fs::path dir = make_temp_dir("blend");
  for (const auto& [name, seed] : {std::pair{"web", "1"}, std::pair{"code", "2"}})
    REQUIRE(run_ptrain(std::string("data synth --vocab 64 --tokens 30000 --seed ") + seed + " --out " + name, dir)
                .exit_code == 0);
  write_file(dir / "run.yaml",
             "run: {name: r, out_dir: runs}\n"
             "model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 64}\n"
             "data:\n"
             "  sources: [{train: \"web/train_*.bin\", weight: 0.7}, {train: \"code/train_*.bin\", weight: 0.3}]\n"
             "  val: \"web/val_*.bin\"\n"
             "training: {steps: 200, batch_tokens: 256, micro_batch: 8, eval_every: 50, eval_batches: 2}\n"
             "checkpoint: {every: 0}\n");
  const CommandResult straight = run_ptrain("train run.yaml --set run.name=straight", dir);
  INFO(straight.output);
  REQUIRE(straight.exit_code == 0);
  REQUIRE(run_ptrain("train run.yaml --set run.name=resumed --stop-at 100", dir).exit_code == 0);
  const CommandResult resumed = run_ptrain("train run.yaml --set run.name=resumed --set checkpoint.resume=auto", dir);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("resumed from") != std::string::npos);

  // 200 steps of 16 samples: each source's share of the samples drawn, step by step.
  const auto shares = [&](const std::string& run) {
    std::vector<std::vector<int64_t>> out;
    for (const auto& r : read_metrics(dir / "runs" / run / "metrics.jsonl"))
      if (r.contains("source_samples")) out.push_back(r["source_samples"].get<std::vector<int64_t>>());
    return out;
  };
  const std::vector<std::vector<int64_t>> drawn = shares("straight");
  REQUIRE(drawn.size() == 200);
  CHECK(drawn.back()[0] + drawn.back()[1] == 200 * 16);
  CHECK(std::abs(static_cast<double>(drawn.back()[0]) / (200 * 16) - 0.7) < 0.01);
  const nlohmann::json summary = nlohmann::json::parse(read_file(dir / "runs/straight/summary.json"));
  CHECK(std::abs(summary["sources"][1]["share"].get<double>() - 0.3) < 0.01);
  CHECK(summary["sources"][1]["train"] == "code/train_*.bin");
  CHECK(straight.output.find("data sources, samples drawn over the run's 3,200: \"web/train_*.bin\" 70.0%") !=
        std::string::npos);

  CHECK(loss_trace(dir / "runs/resumed/metrics.jsonl") == loss_trace(dir / "runs/straight/metrics.jsonl"));
  fs::remove_all(dir);
}

TEST_CASE("a checkpoint of one architecture does not resume under the other", "[checkpoint][llama]") {
  Workspace ws;
  const std::string llama = " --set model.arch=llama --set model.n_kv_head=1";
  for (const auto& [trained, resumed] : {std::pair{llama, std::string()}, std::pair{std::string(), llama}}) {
    CAPTURE(trained, resumed);
    REQUIRE(ws.train("--set run.name=a --set run.overwrite=true --stop-at 2" + trained).exit_code == 0);
    const std::string before = bytes_of(ws.run("a") / "checkpoints/step_00000002/weights.safetensors");
    const CommandResult r = ws.train("--set run.name=a --set checkpoint.resume=auto" + resumed);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("model.arch") != std::string::npos);
    CHECK(bytes_of(ws.run("a") / "checkpoints/step_00000002/weights.safetensors") == before);
  }
}

TEST_CASE("resume auto skips a corrupt newest checkpoint and keep_last prunes", "[checkpoint]") {
  Workspace ws;
  REQUIRE(ws.train("--set checkpoint.every=1 --set checkpoint.keep_last=3 --set training.steps=5").exit_code == 0);
  const fs::path ckpts = ws.run("r") / "checkpoints";
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(ckpts))
    if (e.is_directory()) kept.push_back(e.path().filename().string());
  std::sort(kept.begin(), kept.end());
  CHECK(kept == std::vector<std::string>({"step_00000003", "step_00000004", "step_00000005"}));
  CHECK(read_file(ckpts / "latest") == "step_00000005\n");

  flip_a_bit(ckpts / "step_00000005/weights.safetensors", 200);
  fs::remove(ckpts / "step_00000004/state.json");  // an incomplete save
  const CommandResult r = ws.train("--set checkpoint.resume=auto --set training.steps=6");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("step_00000005") != std::string::npos);
  CHECK(r.output.find("SHA-256") != std::string::npos);
  CHECK(r.output.find("no state.json") != std::string::npos);
  const std::vector<nlohmann::json> resumes = records_with(ws.run("r") / "metrics.jsonl", "resume");
  REQUIRE(resumes.size() == 1);
  const nlohmann::json& resume = resumes[0]["resume"];
  CHECK(resume["step"] == 3);  // past the corrupt 5 and the incomplete 4
  CHECK(resume["from"] == "runs/r/checkpoints/step_00000003");
  CHECK(r.output.find("resumed from " + resume["from"].get<std::string>() + " after step " +
                      std::to_string(resume["step"].get<int64_t>())) != std::string::npos);
}

TEST_CASE("bad checkpoints to resume from exit 2 and change nothing", "[checkpoint]") {
  Workspace ws;
  REQUIRE(ws.train("--set training.steps=2").exit_code == 0);
  const fs::path ckpt = ws.run("r") / "checkpoints/step_00000002";
  const std::string before = read_file(ws.run("r") / "metrics.jsonl");
  auto expect_refused = [&](const std::string& flags, std::initializer_list<const char*> fragments) {
    const CommandResult r = ws.train(flags);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    for (const char* f : fragments) CHECK(r.output.find(f) != std::string::npos);
    CHECK(read_file(ws.run("r") / "metrics.jsonl") == before);
  };
  SECTION("a path that is no checkpoint") {
    expect_refused("--set checkpoint.resume=nowhere", {"checkpoint.resume", "nowhere", "does not exist"});
  }
  SECTION("another model shape, naming the keys") {
    expect_refused("--set checkpoint.resume=" + ckpt.string() + " --set model.n_layer=3",
                   {"model.n_layer 2 in the checkpoint vs 3 now"});
  }
  SECTION("a truncated weight file") {
    fs::resize_file(ckpt / "weights.safetensors", 100);
    expect_refused("--set checkpoint.resume=" + ckpt.string(), {"weights.safetensors", "SHA-256"});
  }
  SECTION("a foreign state.json") {
    write_file(ckpt / "state.json", "{\"hello\": 1}\n");
    expect_refused("--set checkpoint.resume=" + ckpt.string(), {"state.json", "not a ptrain checkpoint"});
  }
}

TEST_CASE("a checkpoint directory that cannot be written is reported before training", "[checkpoint]") {
  Workspace ws;
  const CommandResult r = ws.train("--set checkpoint.dir=/proc/ptrain-checkpoints");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("checkpoint.dir") != std::string::npos);
  CHECK(r.output.find("/proc/ptrain-checkpoints") != std::string::npos);
  CHECK(losses_by_step(ws.run("r") / "metrics.jsonl").empty());  // no step trained
}

// Runs a shell script (in the workspace) and returns what it printed.
std::string shell(const Workspace& ws, const std::string& script) {
  FILE* pipe = popen(("cd '" + ws.dir.string() + "' && (" + script + ") 2>&1").c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  pclose(pipe);
  return out;
}

// Resumes the workspace's run from the checkpoint `latest` names and trains one more step.
void resume_one_step(const Workspace& ws) {
  const std::string latest = read_file(ws.run("r") / "checkpoints/latest");
  REQUIRE(latest.size() == 14);  // "step_NNNNNNNN\n"
  const int64_t step = std::stoll(latest.substr(5, 8));
  const CommandResult resumed =
      ws.train("--set training.steps=100000 --set checkpoint.resume=auto --stop-at " + std::to_string(step + 1));
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("resumed from") != std::string::npos);
}

TEST_CASE("a failed save keeps the earlier checkpoints and stops or continues as configured", "[checkpoint]") {
  Workspace ws;
  REQUIRE(ws.train("--set training.steps=2").exit_code == 0);
  const fs::path ckpts = ws.run("r") / "checkpoints";
  const std::string weights_before = read_file(ckpts / "step_00000002/weights.safetensors");
  // A file-size limit makes writing the 240 KB optimizer file fail with EFBIG, as a full disk
  // would fail it with ENOSPC. ptrain ignores SIGXFSZ itself (the shell does not), so the write
  // returns the error instead of the signal killing the process (exit 153).
  const std::string limited = "ulimit -f 200; '" PTRAIN_BINARY
                              "' train run.yaml --set checkpoint.resume=auto --set training.steps=4 "
                              "--set checkpoint.every=1 ";
  SECTION("stop") {
    const std::string out = shell(ws, limited + "; echo rc=$?");
    INFO(out);
    CHECK(out.find("rc=1") != std::string::npos);
    CHECK(out.find("checkpoint at step 3 failed") != std::string::npos);
    CHECK(out.find("earlier checkpoints are intact") != std::string::npos);
  }
  SECTION("continue covers periodic saves; a failed final save still ends the run with exit 1") {
    const std::string out = shell(ws, limited + "--set checkpoint.on_save_error=continue; echo rc=$?");
    INFO(out);
    CHECK(out.find("checkpoint at step 3 failed") != std::string::npos);
    CHECK(out.find("training continues") != std::string::npos);
    const std::map<int64_t, double> trained = losses_by_step(ws.run("r") / "metrics.jsonl");
    REQUIRE(!trained.empty());
    CHECK(trained.rbegin()->first == 4);  // step 4 trained after step 3's save failed
    CHECK(out.find("checkpoint at step 4 failed") != std::string::npos);
    CHECK(out.find("the final checkpoint") != std::string::npos);
    CHECK(out.find("File too large") != std::string::npos);
    CHECK(out.find("rc=1") != std::string::npos);
  }
  CHECK(read_file(ckpts / "latest") == "step_00000002\n");
  const std::vector<nlohmann::json> saved = checkpoints_saved(ws.run("r") / "metrics.jsonl");
  REQUIRE(!saved.empty());
  CHECK(saved.back()["step"] == 2);  // no save after the first run's
  CHECK(read_file(ckpts / "step_00000002/weights.safetensors") == weights_before);
  CHECK_FALSE(fs::exists(ckpts / "step_00000003"));
  CHECK_FALSE(fs::exists(ckpts / ".step_00000003.tmp"));
  CHECK(ws.train("--set checkpoint.resume=auto --set training.steps=3").exit_code == 0);
}

TEST_CASE("kill -9 inside a save leaves the newest complete checkpoint, which resume auto takes", "[checkpoint]") {
  Workspace ws;
  const fs::path checkpoints = ws.run("r") / "checkpoints";
  int inside_a_save = 0;
  for (int attempt = 0; attempt < 6 && inside_a_save < 3; ++attempt) {
    CAPTURE(attempt);
    // A checkpoint every step; once one is complete, the kill is sent as soon as a later save's
    // temporary directory appears.
    const std::string out = shell(
        ws, "'" PTRAIN_BINARY "' train run.yaml --set training.steps=100000 --set checkpoint.every=1 "
            "--set checkpoint.resume=auto > /dev/null 2>&1 & pid=$!; "
            "while [ ! -f runs/r/checkpoints/latest ]; do sleep 0.01; done; "
            "while ! ls -a runs/r/checkpoints 2>/dev/null | grep -q '^\\.step_.*\\.tmp$'; do :; done; "
            "kill -9 $pid; wait $pid; echo killed rc=$?");
    INFO(out);
    REQUIRE(out.find("killed rc=137") != std::string::npos);
    int64_t newest = -1;
    bool interrupted_save = false;
    for (const auto& e : fs::directory_iterator(checkpoints)) {
      const std::string name = e.path().filename().string();
      if (name.size() == 13 && name.rfind("step_", 0) == 0) newest = std::max<int64_t>(newest, std::stoll(name.substr(5)));
      interrupted_save = interrupted_save || (name.rfind(".step_", 0) == 0 && name.find(".tmp") != std::string::npos);
    }
    inside_a_save += interrupted_save;
    REQUIRE(newest > 0);
    // Resume takes exactly the newest complete checkpoint: none was damaged, so none is skipped.
    const CommandResult resumed = ws.train("--set training.steps=100000 --set checkpoint.resume=auto --stop-at " +
                                           std::to_string(newest + 1));
    INFO(resumed.output);
    REQUIRE(resumed.exit_code == 0);
    const std::vector<nlohmann::json> resumes = records_with(ws.run("r") / "metrics.jsonl", "resume");
    REQUIRE(!resumes.empty());
    const nlohmann::json& resume = resumes.back()["resume"];
    CHECK(resume["step"] == newest);
    CHECK(fs::path(resume["from"].get<std::string>()).filename().string() == checkpoint_name(newest));
    CHECK(resumed.output.find("resumed from " + resume["from"].get<std::string>() + " after step " +
                              std::to_string(resume["step"].get<int64_t>())) != std::string::npos);
    CHECK(resumed.output.find("not usable") == std::string::npos);
  }
  CHECK(inside_a_save >= 1);  // the kills did land inside saves (a temporary directory was left)
}

TEST_CASE("resume auto in a run directory without checkpoints starts afresh in place", "[checkpoint]") {
  Workspace ws;
  REQUIRE(ws.train("--set training.steps=2 --set checkpoint.save_final=false").exit_code == 0);
  const CommandResult r = ws.train("--set training.steps=2 --set checkpoint.resume=auto");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("no valid checkpoint") != std::string::npos);
  CHECK(fs::exists(ws.run("r") / "checkpoints/step_00000002"));
}

TEST_CASE("a resumed run may change precision and logs it", "[checkpoint]") {
  Workspace ws;
  REQUIRE(ws.train("--stop-at 2").exit_code == 0);
  const CommandResult r = ws.train("--set checkpoint.resume=auto --set precision.mode=bf16");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("saved under precision fp32, now bf16") != std::string::npos);
  bool marked = false;
  for (const auto& m : read_metrics(ws.run("r") / "metrics.jsonl"))
    if (m.contains("resume")) marked = m["resume"]["saved_precision"] == "fp32";
  CHECK(marked);
}

TEST_CASE("a second SIGINT exits at once and damages nothing", "[checkpoint]") {
  Workspace ws;
  REQUIRE(ws.train("--set training.steps=2").exit_code == 0);  // an earlier checkpoint to protect
  // Two Ctrl-Cs right behind each other, after micro-batch 40 of step 3, by construction: the
  // first is acknowledged, the second ends the process before the first is acted on.
  const std::string out = shell(
      ws, "PTRAIN_TEST_FAULT=signal:3:40,signal:3:40 '" PTRAIN_BINARY "' train run.yaml --set training.steps=100000 "
          "--set checkpoint.resume=auto --set training.batch_tokens=65536 --set checkpoint.every=1 > out.txt 2>&1; "
          "echo rc=$?");
  const std::string log = read_file(ws.dir / "out.txt");
  INFO(out << log);
  CHECK(out.find("rc=130") != std::string::npos);  // 128 + SIGINT: ended by the second signal
  CHECK(count_of(log, "ptrain: stop requested") == 1);
  CHECK(log.find("stopped by signal") == std::string::npos);
  resume_one_step(ws);
}

TEST_CASE("SIGINT stops the run, saves its last completed step and exits 0", "[checkpoint]") {
  Workspace ws;
  // Long enough that the signal arrives mid-run; the script waits for the first step's metrics.
  const std::string script = "cd '" + ws.dir.string() + "' && ('" PTRAIN_BINARY
                             "' train run.yaml --set training.steps=100000 > out.txt 2>&1 & pid=$!; "
                             "while ! grep -q '\"loss\"' runs/r/metrics.jsonl 2>/dev/null; do sleep 0.05; done; "
                             "kill -INT $pid; wait $pid; echo rc=$?)";
  FILE* pipe = popen(script.c_str(), "r");
  REQUIRE(pipe);
  char buf[256] = {0};
  std::string out;
  while (fgets(buf, sizeof buf, pipe)) out += buf;
  pclose(pipe);
  const std::string log = read_file(ws.dir / "out.txt");
  INFO(out << log);
  CHECK(out.find("rc=0") != std::string::npos);
  CHECK(log.find("stopped by signal") != std::string::npos);
  CHECK(log.find("checkpoint.resume=auto") != std::string::npos);
  CHECK(fs::exists(ws.run("r") / "checkpoints/latest"));
}

TEST_CASE("fp8 histories holding NaN or inf survive a checkpoint bit for bit", "[checkpoint]") {
  const fs::path dir = make_temp_dir("nan");
  auto backend = make_cpu_backend(0);
  Transformer model(ModelShape{1, 2, 16, 8, 32, 128}, *backend, DType::f32, 1, 8);
  model.init(1);
  AdamW optimizer(model, *backend, AdamWConfig{});
  CheckpointState state;
  state.step = 7;
  state.precision = "fp8:delayed";
  state.fp8.push_back({"h0.qkv.grad", {NAN, INFINITY, 0.5f, -0.0f}, 3.5f});
  state.fp8.push_back({"h0.qkv.input", {1.0f}, 1e-30f});
  ModelConfig shape;
  shape.n_layer = 1, shape.n_head = 2, shape.n_embd = 16, shape.seq_len = 8, shape.vocab_size = 32;
  state.model = model_json(shape);
  state.schedule = nlohmann::json::object();
  const std::string path = save_checkpoint(dir.string(), state, model, optimizer, 3);
  const LoadedCheckpoint loaded = load_checkpoint(path);
  REQUIRE(loaded.state.fp8.size() == 2);
  const auto& h = loaded.state.fp8[0].history;
  CHECK(std::isnan(h[0]));
  CHECK(h[1] == INFINITY);
  CHECK(h[2] == 0.5f);
  CHECK(std::signbit(h[3]));
  CHECK(loaded.state.fp8[0].scale == 3.5f);
  CHECK(loaded.state.fp8[1].scale == 1e-30f);
  // A scale itself is never NaN (a bad amax keeps the previous scale): such a state is refused.
  nlohmann::json j = nlohmann::json::parse(read_file(fs::path(path) / "state.json"));
  j["fp8"][1]["scale_bits"] = 0x7fc00000u;
  CHECK_THROWS_WITH(state_from_json(j), Catch::Contains("fp8[1].scale_bits") && Catch::Contains("finite scale"));
  fs::remove_all(dir);
}

TEST_CASE("the largest FP8 delayed-scaling state a config allows is a state.json ptrain reads back", "[checkpoint]") {
  // The bound the run plan holds configs to is above what save_checkpoint writes for full
  // histories of the widest values, and what it allows fits the read limit.
  for (const int64_t tensors : {int64_t{15}, int64_t{12} * 96 + 3, int64_t{12} * 1024 + 3})
    for (const int64_t window : {int64_t{2}, int64_t{65536}}) {
      const int64_t most = longest_history_within(tensors, window);
      INFO(tensors << " FP8 tensors, a guard window of " << window << ", histories of " << most);
      CHECK(state_bytes_bound(tensors, most, window) <= kMaxStateBytes);
      CHECK(state_bytes_bound(tensors, most + 1, window) > kMaxStateBytes);
    }
  // state.json as save_checkpoint writes it, each history value the widest text it can take.
  CheckpointState state;
  state.step = 1;
  state.model = model_json(ModelConfig{});
  state.guard.window.assign(65536, -1.2345678901234567e-300);
  for (int t = 0; t < 12; ++t)
    state.fp8.push_back({"h1023.mlp_down.grad", std::vector<float>(1024, -3.40282347e38f), -3.40282347e38f});
  CHECK(static_cast<int64_t>(state_to_json(state).dump(2).size() + 1) <= state_bytes_bound(12, 1024, 65536));
}
