// Checkpoints and model files as a hostile user makes them: a state.json whose fields are out
// of range, of the wrong type or not a file at all, weights that are NaN. Every command that
// reads a checkpoint (train's resume, eval, sample, export, inspect) refuses it with exit 2,
// naming the field, and writes nothing; none crashes or trains on garbage.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "bad_input.h"
#include "core/sha256.h"

using namespace ptrain;
using namespace ptrain::test;
namespace fs = std::filesystem;

namespace {

// A workspace with one finished run (checkpoint at step 3) whose state.json the test edits.
struct CheckpointWorkspace : BadInputWorkspace {
  fs::path checkpoint;
  CheckpointWorkspace() {
    const CommandResult r = train();
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    checkpoint = run() / "checkpoints/step_00000003";
  }
  nlohmann::json state() const { return nlohmann::json::parse(read_file(checkpoint / "state.json")); }
  void set_state(const nlohmann::json& j) const { write_file(checkpoint / "state.json", j.dump(2)); }
  // A model section edited consistently: its fingerprint recomputed as ptrain computes it (the
  // SHA-256 of the section's JSON, 16 hex digits), so that only the tensors disagree.
  static nlohmann::json rehashed(nlohmann::json j) {
    Sha256 h;
    const std::string dumped = j["model"].dump();
    h.update(dumped.data(), dumped.size());
    j["model_hash"] = h.hex_digest().substr(0, 16);
    return j;
  }
  // Puts a NaN into the first value of `file` and records the file's new SHA-256, so that only
  // the NaN is wrong.
  void poison(const std::string& file) const {
    std::string bytes = read_file(checkpoint / file);
    uint64_t header = 0;
    std::memcpy(&header, bytes.data(), 8);
    const float nan = NAN;
    std::memcpy(bytes.data() + 8 + header, &nan, sizeof nan);
    write_file(checkpoint / file, bytes);
    nlohmann::json j = state();
    j["sha256"][file] = sha256_hex(bytes.data(), bytes.size());
    set_state(j);
  }
  // Every command that reads the checkpoint.
  std::vector<std::string> readers() const {
    const std::string ck = checkpoint.string();
    return {"train run.yaml --set checkpoint.resume=" + ck, "eval run.yaml --checkpoint " + ck,
            "sample --checkpoint " + ck + " --tokens 4", "export --checkpoint " + ck + " --out model.bin",
            "inspect " + ck};
  }
};

}  // namespace

TEST_CASE("state.json fields out of range are refused by every command that reads a checkpoint", "[hardening]") {
  struct Case {
    std::string pointer;
    nlohmann::json value;
    std::string names;
  };
  const std::vector<Case> cases = {
      {"/model/n_head", 0, "model.n_head"},          // was SIGFPE in sample, and an llm.c file from export
      {"/model/n_head", 3, "model.n_head"},          // does not divide n_embd 16
      {"/model/n_head", 64, "model.n_head"},
      {"/model/n_head", -2, "model.n_head"},
      {"/model/n_layer", int64_t{1} << 31, "model.n_layer"},  // was bad_alloc
      {"/model/n_layer", -1, "model.n_layer"},
      {"/model/n_layer", 2, "model_hash"},           // the section edited: its fingerprint no longer matches
      {"/model_hash", "0123456789abcdef", "model_hash"},
      {"/model/n_kv_head", 2, "model.n_kv_head"},     // not a key of a gpt2 model's section (was read by some commands)
      {"/step", nlohmann::json::parse("9223372036854775808"), "field step"},  // resumed "after step -9223372036854775808"
      {"/step", 1e30, "field step"},
      {"/step", -4, "field step"},
      {"/step", 2.5, "field step"},
      {"/optimizer_steps", -1, "optimizer_steps"},
      {"/loss_scaler/scale", 0, "loss_scaler.scale"},
      {"/precision", "fp4", "precision"},
      {"/vocabulary_sha256", "ABC", "vocabulary_sha256"},  // a vocabulary's hash or null
      {"/vocabulary_sha256", std::string(64, 'A'), "vocabulary_sha256"},
      {"/vocabulary_sha256", 7, "vocabulary_sha256"},
      {"/format_version", 99, "newer ptrain"},
      {"/step", nlohmann::json::parse(std::string(5000, '[') + std::string(5000, ']')), "nested more than 64 levels"},
  };
  CheckpointWorkspace ws;
  const nlohmann::json good = ws.state();
  for (const Case& c : cases) {
    nlohmann::json j = good;
    j[nlohmann::json::json_pointer(c.pointer)] = c.value;
    ws.set_state(j);
    const auto before = ws.snapshot();
    for (const std::string& command : ws.readers()) {
      INFO(c.pointer << " = " << c.value.dump() << " | ptrain " << command);
      expect_refused(ws, before, ws.ptrain(command), 2, {c.names});
    }
  }
}

TEST_CASE("a state.json edited consistently is still checked against its tensors, and keys twice are refused",
          "[hardening]") {
  CheckpointWorkspace ws;
  const nlohmann::json good = ws.state();
  // A valid shape the tensors do not have, with the fingerprint recomputed as ptrain computes it.
  nlohmann::json j = good;
  j["model"]["n_layer"] = 2;
  j = CheckpointWorkspace::rehashed(j);
  struct Case {
    std::string text, names;
  };
  std::string twice = good.dump(2);
  twice.insert(twice.find('{') + 1, "\n  \"step\": 1,");  // "step" twice: which value counts is the parser's whim
  for (const Case& c : {Case{j.dump(2), "ln1w"}, Case{twice, "\"step\" twice"}}) {
    write_file(ws.checkpoint / "state.json", c.text);
    const auto before = ws.snapshot();
    for (const std::string& command : ws.readers()) {
      INFO(c.names << " | ptrain " << command);
      expect_refused(ws, before, ws.ptrain(command), 2, {c.names});
    }
  }
}

TEST_CASE("resume: auto stops at a checkpoint of a newer format instead of skipping and overwriting it", "[hardening]") {
  CheckpointWorkspace ws;
  nlohmann::json j = ws.state();
  j["format_version"] = 2;
  ws.set_state(j);
  const auto before = ws.snapshot();
  expect_refused(ws, before, ws.train("--set checkpoint.resume=auto --set training.steps=5"), 2,
                 {"format_version 2", "newer ptrain"});
}

TEST_CASE("a state.json that is not a file, or missing fields, is refused with its name", "[hardening]") {
  CheckpointWorkspace ws;
  SECTION("a directory") {
    fs::remove(ws.checkpoint / "state.json");
    fs::create_directory(ws.checkpoint / "state.json");
    const auto before = ws.snapshot();
    for (const std::string& command : ws.readers())
      expect_refused(ws, before, ws.ptrain(command), 2, {"state.json", "directory"});
  }
  SECTION("a field missing") {
    nlohmann::json j = ws.state();
    j["loss_scaler"].erase("growth_tracker");
    ws.set_state(j);
    const auto before = ws.snapshot();
    for (const std::string& command : ws.readers())
      expect_refused(ws, before, ws.ptrain(command), 2, {"loss_scaler.growth_tracker"});
  }
  SECTION("a file name outside the checkpoint") {
    nlohmann::json j = ws.state();
    j["sha256"]["../../run.yaml"] = "00";
    ws.set_state(j);
    const auto before = ws.snapshot();
    for (const std::string& command : ws.readers())
      expect_refused(ws, before, ws.ptrain(command), 2, {"not a checkpoint file name"});
  }
}

TEST_CASE("NaN weights are refused at load, through resume and through init_from", "[hardening]") {
  CheckpointWorkspace ws;
  SECTION("resume, and every other reader of the checkpoint") {
    ws.poison("weights.safetensors");
    const auto before = ws.snapshot();
    for (const std::string& command : ws.readers())
      expect_refused(ws, before, ws.ptrain(command), 2, {"weights.safetensors", "NaN or infinity"});
  }
  SECTION("the optimizer's moments") {
    ws.poison("optimizer.safetensors");
    const auto before = ws.snapshot();
    expect_refused(ws, before, ws.ptrain(ws.readers()[0]), 2, {"optimizer.safetensors", "NaN or infinity"});
  }
  SECTION("an llm.c model file") {
    REQUIRE(ws.ptrain("export --checkpoint " + ws.checkpoint.string() + " --out m.bin").exit_code == 0);
    std::string bytes = read_file(ws.dir / "m.bin");
    const float inf = INFINITY;
    std::memcpy(bytes.data() + 1024 + 4 * 10, &inf, sizeof inf);
    write_file(ws.dir / "m.bin", bytes);
    const auto before = ws.snapshot();
    expect_refused(ws, before, ws.train("--set model.init_from=m.bin --set run.name=from-llmc"), 2,
                   {"model.init_from", "m.bin", "parameter 10", "NaN or infinity"});
    expect_refused(ws, before, ws.ptrain("inspect m.bin"), 2, {"m.bin", "NaN or infinity"});
  }
}

TEST_CASE("an explicit resume whose tensors do not fit changes nothing in the run it would continue", "[hardening]") {
  // Its fault shows only in the tensors (state.json claims another shape that the config also
  // has): the run directory's config.yaml and log stay as they were.
  CheckpointWorkspace ws;
  nlohmann::json j = ws.state();
  j["model"]["n_embd"] = 32;
  ws.set_state(CheckpointWorkspace::rehashed(j));
  const auto before = ws.snapshot();
  expect_refused(ws, before,
                 ws.train("--set checkpoint.resume=" + ws.checkpoint.string() + " --set model.n_embd=32 --set training.steps=5"),
                 2, {"checkpoint.resume", "wte", "has shape (128, 16)", "needs (128, 32)"});
}

TEST_CASE("inspect exits 2 for what it finds invalid, naming the file", "[hardening]") {
  BadInputWorkspace ws;
  const auto before = ws.snapshot();
  SECTION("a path that does not exist blames the path, not a config key") {
    const CommandResult r = ws.ptrain("inspect /nonexistent");
    expect_refused(ws, before, r, 2, {"/nonexistent", "does not exist"});
    CHECK(r.output.find("init_from") == std::string::npos);
  }
  SECTION("a safetensors whose shape product wraps around 64 bits") {
    // 2^32 x 2^32 floats would be 0 bytes after a wrap: the tensor must not read as empty and valid.
    const std::string header = R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
    std::string bytes(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(bytes.data(), &n, 8);
    write_file(ws.dir / "wrap.safetensors", bytes + header);
    const auto with_file = ws.snapshot();
    expect_refused(ws, with_file, ws.ptrain("inspect wrap.safetensors"), 2, {"wrap.safetensors", "overflowing"});
  }
}
