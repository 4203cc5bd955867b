// Whole training runs on synthetic corpora: the model learns toward the known entropy floor,
// and a run is a pure function of its config (bit-identical across runs and thread counts).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "test_util.h"
#include "train/trainer.h"

using namespace ptrain;
using namespace ptrain::test;
namespace fs = std::filesystem;

namespace {

// The fields that must be identical between two runs of one config (times and memory may differ).
std::vector<double> numeric_trace(const std::vector<nlohmann::json>& records) {
  std::vector<double> trace;
  for (const auto& r : records)
    for (const char* key : {"loss", "grad_norm", "lr", "val_loss"})
      if (r.contains(key)) trace.push_back(r[key].get<double>());
  return trace;
}

// Large enough that every CPU op runs multi-threaded (see worth_threads in the CPU backend),
// so the thread-count comparison below compares real thread splits.
const char* kTinyRun =
    "model: {n_layer: 2, n_head: 2, n_embd: 64, seq_len: 64, vocab_size: 64}\n"
    "data: {synthetic: {vocab: 64, order: 1, branching: 3, tokens: 100000, seed: 5}}\n"
    "training: {steps: 12, batch_tokens: 1024, micro_batch: 8, eval_every: 6, eval_batches: 2}\n";

}  // namespace

TEST_CASE("a tiny model closes 90% of the gap to the oracle loss", "[training]") {
  // GPT-2, and Llama with 4 query heads over 2 K/V heads, with and without QK-norm.
  const std::string model =
      GENERATE(as<std::string>{}, "n_layer: 2, n_head: 2, n_embd: 64",
               "arch: llama, n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 64, mlp_hidden: 160",
               "arch: llama, n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 64, mlp_hidden: 160, qk_norm: true");
  CAPTURE(model);
  const fs::path dir = make_temp_dir("learn");
  const std::string yaml =
      "run: {name: learn, out_dir: '" + dir.string() + "', seed: 1}\n"
      "model: {" + model + ", seq_len: 64, vocab_size: 16}\n"
      "data: {synthetic: {vocab: 16, order: 2, branching: 2, tokens: 400000, seed: 3}}\n"
      "training: {steps: 400, batch_tokens: 1024, micro_batch: 16, eval_every: 0, eval_batches: 8}\n"
      "optimizer: {lr: 1.0e-2, weight_decay: 0.0}\n"
      "schedule: {warmup_steps: 20}\n"
      "logging: {every: 50}\n";
  const TrainResult result = train(parse_config(yaml, "learn.yaml"), TrainOptions{});
  const auto summary = nlohmann::json::parse(read_file(dir / "learn/summary.json"));
  const double oracle = summary["oracle_loss"].get<double>();
  const double start = std::log(16.0);
  const double closed = (start - result.final_val_loss) / (start - oracle);
  INFO("val " << result.final_val_loss << " oracle " << oracle << " closed " << closed);
  CHECK(oracle < start);
  CHECK(closed >= 0.9);
  fs::remove_all(dir);
}

TEST_CASE("same config and seed give identical metrics", "[training]") {
  const std::string arch = GENERATE(as<std::string>{}, "",
                                    "--set model.arch=llama --set model.n_kv_head=1 --set model.mlp_hidden=128 ");
  CAPTURE(arch);
  const fs::path dir = make_temp_dir("determinism");
  write_file(dir / "run.yaml", kTinyRun);
  auto run = [&](const std::string& name, const std::string& extra) {
    const CommandResult r = run_ptrain("train run.yaml --set run.name=" + name + " " + arch + extra, dir);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return numeric_trace(read_metrics(dir / "runs" / name / "metrics.jsonl"));
  };
  const std::vector<double> first = run("a", "");
  REQUIRE(first.size() >= 12);
  CHECK(run("b", "") == first);

  SECTION("one and two CPU threads give identical losses") {
    const std::vector<double> one = run("t1", "--set training.threads=1");
    const std::vector<double> two = run("t2", "--set training.threads=2");
    CHECK(one == two);
  }
  SECTION("a different seed gives different losses") { CHECK(run("s", "--set run.seed=2") != first); }
  SECTION("recomputing activations in the backward pass gives identical losses") {
    CHECK(run("mlp", "--set training.recompute=mlp") == first);
    CHECK(run("block", "--set training.recompute=block") == first);
  }
  fs::remove_all(dir);
}

TEST_CASE("gradient accumulation honours batch_tokens", "[training]") {
  // 1024 tokens per step as 8 x 64 x 2 micro-batches or 16 x 64 x 1: the same samples, so the
  // same losses up to float summation order.
  const fs::path dir = make_temp_dir("accum");
  write_file(dir / "run.yaml", kTinyRun);
  auto losses = [&](const std::string& name, int micro) {
    const CommandResult r = run_ptrain("train run.yaml --set run.name=" + name + " --set training.micro_batch=" +
                                           std::to_string(micro),
                                       dir);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    std::vector<double> out;
    for (const auto& rec : read_metrics(dir / "runs" / name / "metrics.jsonl"))
      if (rec.contains("loss")) out.push_back(rec["loss"].get<double>());
    return out;
  };
  const auto two_micro = losses("m8", 8), one_micro = losses("m16", 16);
  REQUIRE(two_micro.size() == one_micro.size());
  for (size_t i = 0; i < two_micro.size(); ++i) CHECK(two_micro[i] == Approx(one_micro[i]).epsilon(1e-4));
  fs::remove_all(dir);
}
