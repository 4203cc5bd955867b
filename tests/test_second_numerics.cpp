// The second numerics (PTRAIN_GEMM_ULP_SEED, backend/cpu/gemm.h): every CPU GEMM result moved by
// up to one ulp, as another CPU's BLAS could round it. CI runs every test that runs the CPU backend
// under it a second time (label second-numerics); here, that the mode is on when asked (a run's
// losses move), that it is a pure function (the same seed gives the same losses bit for bit, at
// any thread count and across a resume), and that a malformed seed is bad input.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "test_util.h"

namespace ptrain::test {
namespace {

TEST_CASE("the second numerics moves a run's losses, and the same seed repeats them at any thread count and across "
          "a resume",
          "[second-numerics]") {
  TempDir ws("ulp");
  write_file(ws.dir / "run.yaml",
             "run: {name: r, out_dir: runs, seed: 4, device: cpu}\n"
             "model: {n_layer: 2, n_head: 4, n_embd: 64, seq_len: 32, vocab_size: 64}\n"
             "data: {synthetic: {vocab: 64, order: 2, branching: 4, tokens: 40000, seed: 5}}\n"
             "training: {steps: 8, batch_tokens: 512, micro_batch: 8, eval_every: 0, eval_batches: 2, threads: 1}\n"
             "optimizer: {lr: 3.0e-3}\n"
             "checkpoint: {save_final: false}\n");
  // Each run names its seed itself: CI's second pass sets one for the whole test.
  const auto train = [&](const std::string& name, const std::string& seed, const std::string& flags = "") {
    const CommandResult r =
        run_ptrain("train run.yaml --set run.name=" + name + " " + flags, ws.dir, "PTRAIN_GEMM_ULP_SEED=" + seed);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return losses_by_step(ws.dir / "runs" / name / "metrics.jsonl");
  };
  const auto plain = train("plain", "0");
  const auto shifted = train("shifted", "5");
  REQUIRE(plain.size() == 8);
  REQUIRE(shifted.size() == 8);
  CHECK(shifted != plain);
  CHECK(train("again", "5") == shifted);
  CHECK(train("threads", "5", "--set training.threads=2") == shifted);
  CHECK(train("other-seed", "6") != shifted);
  train("split", "5", "--stop-at 4");
  CHECK(train("split", "5", "--set checkpoint.resume=auto") == shifted);
}

TEST_CASE("a malformed PTRAIN_GEMM_ULP_SEED is bad input, and nothing is written", "[second-numerics]") {
  TempDir ws("ulp");
  for (const char* bad : {"-1", "+1", " 1", "x", "1.5", "99999999999999999999999"}) {
    const CommandResult r = run_ptrain("data synth --out synth --tokens 1000", ws.dir,
                                       std::string("PTRAIN_GEMM_ULP_SEED='") + bad + "'");
    INFO(bad << ": " << r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("PTRAIN_GEMM_ULP_SEED: \"" + std::string(bad) + "\" is not a seed") != std::string::npos);
    CHECK(!std::filesystem::exists(ws.dir / "synth"));
  }
}

}  // namespace
}  // namespace ptrain::test
