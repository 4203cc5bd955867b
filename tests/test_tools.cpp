// The commands around a checkpoint: llm.c export and import (identical logits), eval, sample
// and inspect, and the errors a foreign or mismatched model file gives.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <cstring>
#include <sstream>

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/llmc.h"
#include "model/transformer.h"
#include "test_util.h"

using namespace ptrain;
using namespace ptrain::test;
namespace fs = std::filesystem;

namespace {

std::string run_yaml(int vocab) {
  const std::string v = std::to_string(vocab);
  return "run: {name: r, out_dir: runs}\n"
         "model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 16, vocab_size: " + v + "}\n"
         "data: {synthetic: {vocab: " + v + ", order: 1, branching: 3, tokens: 50000, seed: 5}}\n"
         "training: {steps: 6, batch_tokens: 128, micro_batch: 8, eval_every: 0, eval_batches: 2}\n";
}

// A trained run to work on: vocabulary 200 (56 padded rows) unless bytes are asked for.
struct Trained {
  fs::path dir = make_temp_dir("tools");
  fs::path checkpoint;
  explicit Trained(int vocab = 200) {
    write_file(dir / "run.yaml", run_yaml(vocab));
    const CommandResult r = run_ptrain("train run.yaml", dir);
    if (r.exit_code != 0) throw std::runtime_error(r.output);
    checkpoint = dir / "runs/r/checkpoints/step_00000006";
  }
  ~Trained() { fs::remove_all(dir); }
};

double last_val_loss(const fs::path& metrics) {
  double v = NAN;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) v = j["val_loss"].get<double>();
  }
  return v;
}

}  // namespace

TEST_CASE("llm.c export and re-import give identical logits", "[tools]") {
  Trained t;
  const CommandResult r = run_ptrain("export --checkpoint " + t.checkpoint.string() + " --format llmc --out m.bin", t.dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);

  const LlmcModel file = read_llmc((t.dir / "m.bin").string(), "test");
  CHECK(file.version == 3);
  CHECK(file.vocab_size == 200);
  CHECK(file.padded_vocab == 256);
  CHECK(file.n_layer == 2);

  auto backend = make_cpu_backend(0);
  const ModelShape shape{2, 2, 32, 16, 200, 256};  // 56 padded vocabulary rows
  Transformer from_checkpoint(shape, *backend, DType::f32, 1, 16), from_file(shape, *backend, DType::f32, 1, 16);
  load_weights(load_checkpoint(t.checkpoint.string()).weights, from_checkpoint);
  backend->upload(from_file.master_flat(), file.params.data());
  std::vector<int32_t> tokens(16);
  for (int i = 0; i < 16; ++i) tokens[i] = (i * 37) % 200;
  for (int length : {1, 8, 16})
    CHECK(from_checkpoint.start_decoding(tokens.data(), length) == from_file.start_decoding(tokens.data(), length));

  SECTION("a vocabulary other than bytes samples token ids") {
    const CommandResult ids = run_ptrain("sample --checkpoint " + t.checkpoint.string() + " --prompt '1 2' --tokens 5", t.dir);
    INFO(ids.output);
    REQUIRE(ids.exit_code == 0);
    std::istringstream in(ids.output);
    int id, count = 0;
    while (in >> id) {
      CHECK(id < 200);
      ++count;
    }
    CHECK(count == 5);
    const CommandResult bad = run_ptrain("sample --checkpoint " + t.checkpoint.string() + " --prompt 300", t.dir);
    CHECK(bad.exit_code == 2);
    CHECK(bad.output.find("--prompt") != std::string::npos);
  }
  SECTION("bf16 files hold the weights rounded to bf16") {
    REQUIRE(run_ptrain("export --checkpoint " + t.checkpoint.string() + " --out b.bin --dtype bf16", t.dir).exit_code == 0);
    const LlmcModel bf16 = read_llmc((t.dir / "b.bin").string(), "test");
    CHECK(bf16.version == 5);
    CHECK(fs::file_size(t.dir / "b.bin") == 1024 + 2 * file.params.size());
    for (size_t i = 0; i < file.params.size(); ++i) REQUIRE(bf16.params[i] == round_to_format(file.params[i], Format::bf16, false));
  }
  SECTION("training from the exported file starts where the checkpoint ended") {
    const CommandResult init = run_ptrain(
        "train run.yaml --set run.name=init --set model.init_from=m.bin --set training.eval_every=3", t.dir);
    INFO(init.output);
    REQUIRE(init.exit_code == 0);
    CHECK(init.output.find("initialised from m.bin") != std::string::npos);
    // Its step-0 evaluation is the original run's final one: same weights, same val batches.
    std::ifstream in(t.dir / "runs/init/metrics.jsonl");
    std::string first;
    std::getline(in, first);
    CHECK(nlohmann::json::parse(first)["val_loss"].get<double>() == last_val_loss(t.dir / "runs/r/metrics.jsonl"));
  }
}

// llm.c's layout written out by hand (train_gpt2.c: fill_in_parameter_sizes and the header of
// gpt2_build_from_checkpoint), not taken from ptrain's own parameter table: the header's eight
// ints, then each tensor in llm.c's order with its size from (V, Vp, T, L, C).
TEST_CASE("an exported llm.c file has llm.c's header and parameter offsets", "[tools]") {
  Trained t;
  REQUIRE(run_ptrain("export --checkpoint " + t.checkpoint.string() + " --out m.bin", t.dir).exit_code == 0);
  const std::string bytes = read_file(t.dir / "m.bin");
  auto int_at = [&](size_t i) {
    int32_t v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    return v;
  };
  const int32_t T = 16, V = 200, Vp = 256, L = 2, NH = 2, C = 32;
  CHECK(int_at(0) == 20240326);
  CHECK(int_at(1) == 3);
  CHECK(int_at(2) == T);
  CHECK(int_at(3) == V);
  CHECK(int_at(4) == L);
  CHECK(int_at(5) == NH);
  CHECK(int_at(6) == C);
  CHECK(int_at(7) == Vp);
  const std::vector<std::pair<const char*, int64_t>> order = {
      {"wte", int64_t{Vp} * C}, {"wpe", int64_t{T} * C},      {"ln1w", L * C},         {"ln1b", L * C},
      {"qkvw", L * 3 * C * C},  {"qkvb", L * 3 * C},          {"attprojw", L * C * C}, {"attprojb", L * C},
      {"ln2w", L * C},          {"ln2b", L * C},              {"fcw", L * 4 * C * C},  {"fcb", L * 4 * C},
      {"fcprojw", L * C * 4 * C}, {"fcprojb", L * C},         {"lnfw", C},             {"lnfb", C}};
  const LoadedCheckpoint ck = load_checkpoint(t.checkpoint.string());
  size_t offset = 1024;
  for (const auto& [name, count] : order) {
    CAPTURE(name);
    std::vector<float> tensor(static_cast<size_t>(count));
    ck.weights.copy_to(name, tensor.data(), count);
    for (const int64_t i : {int64_t{0}, count / 2, count - 1}) {
      float in_file;
      std::memcpy(&in_file, bytes.data() + offset + 4 * i, 4);
      CHECK(in_file == tensor[static_cast<size_t>(i)]);
    }
    offset += static_cast<size_t>(count) * 4;
  }
  CHECK(offset == bytes.size());
}

TEST_CASE("foreign and mismatched llm.c files are refused", "[tools]") {
  Trained t;
  REQUIRE(run_ptrain("export --checkpoint " + t.checkpoint.string() + " --out m.bin", t.dir).exit_code == 0);
  SECTION("a header that disagrees with the config, naming each field") {
    const CommandResult r = run_ptrain("train run.yaml --set run.name=x --set model.init_from=m.bin --set model.n_embd=64", t.dir);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("n_embd 32 in the file vs 64 in model.n_embd") != std::string::npos);
    CHECK_FALSE(fs::exists(t.dir / "runs/x"));
  }
  SECTION("a wrong magic") {
    std::fstream f(t.dir / "m.bin", std::ios::in | std::ios::out | std::ios::binary);
    const int32_t wrong = 1234;
    f.write(reinterpret_cast<const char*>(&wrong), 4);
    f.close();
    const CommandResult r = run_ptrain("train run.yaml --set run.name=x --set model.init_from=m.bin", t.dir);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("does not begin with llm.c's magic number 20240326") != std::string::npos);
    CHECK(r.output.find("1234,") == std::string::npos);  // no bytes of the file shown
    const CommandResult i = run_ptrain("inspect m.bin", t.dir);
    CHECK(i.exit_code == 2);
  }
  SECTION("a truncated file") {
    fs::resize_file(t.dir / "m.bin", 2000);
    const CommandResult r = run_ptrain("inspect m.bin", t.dir);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("file size 2000") != std::string::npos);
  }
}

TEST_CASE("eval sample and inspect read a checkpoint", "[tools]") {
  Trained t(256);  // bytes: sample prints text
  const std::string ck = t.checkpoint.string();

  const CommandResult eval = run_ptrain("eval run.yaml --checkpoint " + ck, t.dir);
  INFO(eval.output);
  REQUIRE(eval.exit_code == 0);
  char expected[64];
  std::snprintf(expected, sizeof expected, "val_loss %.6f", last_val_loss(t.dir / "runs/r/metrics.jsonl"));
  CHECK(eval.output.find(expected) != std::string::npos);
  CHECK(eval.output.find("oracle loss") != std::string::npos);

  const CommandResult a = run_ptrain("sample --checkpoint " + ck + " --prompt ab --tokens 40 --seed 3", t.dir);
  const CommandResult b = run_ptrain("sample --checkpoint " + ck + " --prompt ab --tokens 40 --seed 3", t.dir);
  const CommandResult c = run_ptrain("sample --checkpoint " + ck + " --prompt ab --tokens 40 --seed 4", t.dir);
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  CHECK(a.output.rfind("ab", 0) == 0);
  CHECK(a.output.size() == 2 + 40 + 1);  // prompt, 40 bytes, newline
  CHECK(a.output == b.output);
  CHECK(a.output != c.output);
  // The KV cache changes the work, not the text; with seq_len 16 the window slides as well.
  const CommandResult rerun =
      run_ptrain("sample --checkpoint " + ck + " --prompt ab --tokens 40 --seed 3 --no-kv-cache", t.dir);
  CHECK(rerun.output == a.output);
  const CommandResult greedy = run_ptrain("sample --checkpoint " + ck + " --prompt ab --tokens 5 --temperature 0", t.dir);
  CHECK(greedy.exit_code == 0);

  const CommandResult ok = run_ptrain("inspect " + ck, t.dir);
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  const std::vector<nlohmann::json> saved = checkpoints_saved(t.dir / "runs/r/metrics.jsonl");
  REQUIRE(!saved.empty());  // the last is the checkpoint inspected, the run's final one
  CHECK((t.dir / saved.back()["path"].get<std::string>()).string() == t.checkpoint.string());
  CHECK(ok.output.find("  step " + std::to_string(saved.back()["step"].get<int64_t>()) + ", tokens ") !=
        std::string::npos);
  CHECK(ok.output.find("sha256 ok") != std::string::npos);
  CHECK(ok.output.find("qkvw") != std::string::npos);
  CHECK(ok.output.find("  valid") != std::string::npos);
  fs::resize_file(t.checkpoint / "optimizer.safetensors", 64);
  const CommandResult broken = run_ptrain("inspect " + ck, t.dir);
  CHECK(broken.output.find("sha256 MISMATCH") != std::string::npos);
  CHECK(broken.output.find("NOT valid") != std::string::npos);
  CHECK(broken.exit_code == 2);
  fs::remove(t.checkpoint / "state.json");
  const CommandResult incomplete = run_ptrain("inspect " + ck, t.dir);
  CHECK(incomplete.exit_code == 2);
  CHECK(incomplete.output.find("without state.json") != std::string::npos);
}
