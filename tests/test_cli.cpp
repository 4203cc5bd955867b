// The ptrain binary as a user drives it: every bad input ends with a message naming the
// key or file and what was expected, exit code 2, and no run directory.
#include <catch2/catch.hpp>

#include <cstring>

#include "backend/device.h"
#include "data/shard.h"
#include "test_util.h"

using namespace ptrain;
using namespace ptrain::test;
namespace fs = std::filesystem;

namespace {

// A temp directory with small valid train/val shards and a config pointing at them.
struct Workspace {
  fs::path dir = make_temp_dir("cli");
  Workspace() {
    fs::create_directories(dir / "data");
    std::vector<uint16_t> tokens(5000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 64);
    write_shard((dir / "data/train_000000.bin").string(), tokens);
    write_shard((dir / "data/val_000000.bin").string(), tokens);
  }
  ~Workspace() { fs::remove_all(dir); }

  std::string config(const std::string& extra_model = "", const std::string& extra = "") const {
    return "run: {name: r, out_dir: runs}\n"
           "model:\n  n_layer: 1\n  n_head: 2\n  n_embd: 16\n  seq_len: 16\n  vocab_size: 64\n" + extra_model +
           "data: {train: \"data/train_*.bin\", val: \"data/val_*.bin\"}\n"
           "training: {steps: 2, batch_tokens: 64, micro_batch: 4, eval_batches: 2, eval_every: 0}\n" + extra;
  }
  CommandResult train(const std::string& yaml, const std::string& flags = "") const {
    write_file(dir / "run.yaml", yaml);
    return run_ptrain("train run.yaml " + flags, dir);
  }
  bool run_dir_exists() const { return fs::exists(dir / "runs/r"); }
};

void expect_bad_input(const CommandResult& r, std::initializer_list<const char*> fragments) {
  INFO(r.output);
  CHECK(r.exit_code == 2);
  for (const char* f : fragments) CHECK(r.output.find(f) != std::string::npos);
}

// A Llama-3-8B-shaped model (7,391,678,464 parameters with GPT-2's vocabulary) for GPU memory
// plans: the run, model and data lines of its config.
constexpr const char* kLlama8b =
    "run: {name: l8b, out_dir: runs, device: cuda}\n"
    "model: {arch: llama, n_layer: 32, n_head: 32, n_kv_head: 8, n_embd: 4096, mlp_hidden: 14336, "
    "seq_len: 8192, vocab_size: 50257, rope_theta: 500000}\n"
    "data: {synthetic: {tokens: 2000000}}\n";

void corrupt_int(const fs::path& file, int index, int32_t value) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(index * 4);
  f.write(reinterpret_cast<const char*>(&value), 4);
}

}  // namespace

TEST_CASE("a valid config trains and writes the run directory", "[cli]") {
  Workspace ws;
  const CommandResult r = ws.train(ws.config());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (const char* f : {"config.yaml", "log.txt", "metrics.jsonl", "summary.json"})
    CHECK(fs::exists(ws.dir / "runs/r" / f));
  const std::map<int64_t, double> losses = losses_by_step(ws.dir / "runs/r/metrics.jsonl");
  REQUIRE(losses.size() == 2);  // training.steps: 2
  CHECK(losses.rbegin()->first == 2);
  CHECK(nlohmann::json::parse(read_file(ws.dir / "runs/r/summary.json"))["steps_this_run"] == 2);
  CHECK(r.output.find("done:") != std::string::npos);

  SECTION("an existing run directory is not overwritten unless asked") {
    const CommandResult again = ws.train(ws.config());
    expect_bad_input(again, {"already exists", "run.overwrite"});
    const CommandResult forced = ws.train(ws.config(), "--set run.overwrite=true");
    CHECK(forced.exit_code == 0);
  }
  SECTION("overwrite never deletes a directory ptrain did not make") {
    fs::create_directories(ws.dir / "runs/mine");
    write_file(ws.dir / "runs/mine/config.yaml", "a user's own file\n");
    const CommandResult r2 = ws.train(ws.config(), "--set run.name=mine --set run.overwrite=true");
    expect_bad_input(r2, {"not made by ptrain", "runs/mine"});
    CHECK(read_file(ws.dir / "runs/mine/config.yaml") == "a user's own file\n");
  }
  SECTION("a run name that is a path is refused") {
    expect_bad_input(ws.train(ws.config(), "--set run.name=../elsewhere"), {"run.name", "plain directory name"});
    expect_bad_input(ws.train(ws.config(), "--set run.name=.."), {"run.name"});
  }
}

TEST_CASE("dry run validates and writes nothing", "[cli]") {
  Workspace ws;
  const CommandResult r = ws.train(ws.config(), "--dry-run");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("parameters:") != std::string::npos);
  CHECK(r.output.find("memory estimate:") != std::string::npos);
  CHECK(r.output.find("n_embd: 16") != std::string::npos);
  CHECK_FALSE(fs::exists(ws.dir / "runs"));
}

// GPT-2 124M at 192 sequences of 1024 tokens a micro-batch: about 88 GiB on a GPU, which an
// 80 GB H100's arena cannot hold and a 141 GB H200's can. Planned with or without a GPU here.
TEST_CASE("a dry run of a GPU config plans the GPU's memory and says which GPUs it fits", "[cli]") {
  const TempDir tmp("gpu-plan");
  write_file(tmp.dir / "gpu.yaml",
             "run: {name: g, out_dir: runs, device: cuda}\n"
             "model: {n_layer: 12, n_head: 12, n_embd: 768, seq_len: 1024, vocab_size: 50257}\n"
             "data: {synthetic: {vocab: 50257, order: 2, branching: 4, tokens: 20000000, seed: 5}}\n"
             "training: {steps: 10, batch_tokens: 196608, micro_batch: 192, eval_batches: 1}\n"
             "precision: {mode: bf16}\n");
  const CommandResult r = run_ptrain("train gpu.yaml --dry-run", tmp.dir);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  const size_t plan = r.output.find("GPU memory plan per rank: ");
  REQUIRE(plan != std::string::npos);
  const double mib = std::stod(r.output.substr(plan + std::strlen("GPU memory plan per rank: ")));
  CHECK((mib > 80 * 1024 && mib < 100 * 1024));
  for (const char* part : {"FP32 master weights", "AdamW state", "activations", "backend workspace and scratch"})
    CHECK(r.output.find(part, plan) != std::string::npos);
  CHECK(r.output.find("an 80 GB H100 (79.6 GiB, arena at most 74.7 GiB): does not fit") != std::string::npos);
  CHECK(r.output.find("a 141 GB H200 (140.4 GiB, arena at most 131.6 GiB): fits") != std::string::npos);
  if (probe_cuda().devices.empty()) CHECK(r.output.find("`ptrain train` would stop here") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.dir / "runs"));
}

// A Llama-3-8B-shaped model (GPT-2's vocabulary: 7.39B parameters) at 8192 positions, planned
// for 1 and 8 ranks without mpirun. Megatron's distributed optimizer documents 16 bytes per
// parameter for FP32 training and 18 for BF16 weights with FP32 gradients (AdamW's moments and
// the FP32 master 12 of them, sharded over d ranks: 4 + 4 + 8/d and 6 + 12/d); the plan's
// bytes per parameter without activations must come out at those figures.
TEST_CASE("a dry run plans bytes per parameter for 1 rank and, with --ranks 8, for ZeRO-1's shards", "[cli]") {
  const TempDir tmp("per-parameter");
  write_file(tmp.dir / "8b.yaml",
             std::string(kLlama8b) +
             "training: {steps: 10, micro_batch: 1, batch_tokens: 65536, recompute: block}\n");
  struct Case {
    const char* mode;
    int ranks;
    const char* without_activations;
  };
  for (const Case c : {Case{"fp32", 1, "weights 4.00 + FP32 grads 4.00 + AdamW state 8.00 = 16.00 without activations"},
                       Case{"bf16", 1,
                            "weights 2.00 + FP32 master 4.00 + FP32 grads 4.00 + AdamW state 8.00 = 18.00 without "
                            "activations"},
                       Case{"fp32", 8, "weights 4.00 + FP32 grads 4.00 + AdamW state 1.00 = 9.00 without activations"},
                       Case{"bf16", 8,
                            "weights 2.00 + FP32 master 0.50 + FP32 grads 4.00 + AdamW state 1.00 = 7.50 without "
                            "activations"}}) {
    const std::string args = std::string("train 8b.yaml --dry-run --ranks ") + std::to_string(c.ranks) +
                             " --set precision.mode=" + c.mode + " --set distributed.zero_stage=" +
                             (c.ranks > 1 ? "1" : "0");
    const CommandResult r = run_ptrain(args, tmp.dir);
    INFO(args << "\n" << r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("bytes per parameter (7,391,678,464): " + std::string(c.without_activations)) !=
          std::string::npos);
    CHECK((r.output.find("ranks: 8") != std::string::npos) == (c.ranks == 8));
  }
  // FP8 keeps a byte per parameter of weight codes beside the bf16 weights (the transposes the
  // dgrad GEMMs read are made per layer, into shared blocks): at most 1 byte per parameter
  // more than bf16 in all, the LM head staying bf16.
  {
    const CommandResult r = run_ptrain("train 8b.yaml --dry-run --ranks 1 --set precision.mode=fp8", tmp.dir);
    INFO(r.output);
    CHECK(r.output.find("bytes per parameter (7,391,678,464): weights 2.00 + FP32 master 4.00 + FP32 grads 4.00 + "
                        "AdamW state 8.00 + FP8 weight codes 0.94 = 18.94 without activations") != std::string::npos);
  }
  // With primary FP8 weights the block linears keep their codes only, no bf16 copy: at least
  // 0.8 bytes per parameter below bf16's 18.
  {
    const CommandResult r = run_ptrain(
        "train 8b.yaml --dry-run --ranks 1 --set precision.mode=fp8 --set precision.fp8.primary_weights=true", tmp.dir);
    INFO(r.output);
    CHECK(r.output.find("bytes per parameter (7,391,678,464): weights 0.11 + FP32 master 4.00 + FP32 grads 4.00 + "
                        "AdamW state 8.00 + FP8 weight codes 0.94 = 17.06 without activations") != std::string::npos);
  }
  // On 8 ranks with ZeRO-1 too (each rank casts its part of each layer, the ranks gather the
  // codes): below bf16's 7.50.
  {
    const CommandResult r = run_ptrain("train 8b.yaml --dry-run --ranks 8 --set distributed.zero_stage=1 --set "
                                       "precision.mode=fp8 --set precision.fp8.primary_weights=true",
                                       tmp.dir);
    INFO(r.output);
    CHECK(r.output.find("bytes per parameter (7,391,678,464): weights 0.11 + FP32 master 0.50 + FP32 grads 4.00 + "
                        "AdamW state 1.00 + FP8 weight codes 0.94 = 6.56 without activations") != std::string::npos);
  }
  // On 8 ranks with ZeRO-1 the model fits an 80 GB H100 in bf16 and in FP8 with at least 10% of
  // the arena free.
  for (const char* mode : {"bf16", "fp8"}) {
    const CommandResult r = run_ptrain(std::string("train 8b.yaml --dry-run --ranks 8 --set distributed.zero_stage=1 "
                                                   "--set precision.mode=") + mode, tmp.dir);
    INFO(r.output);
    const std::string fits = "an 80 GB H100 (79.6 GiB, arena at most 74.7 GiB): fits, ";
    const size_t at = r.output.find(fits);
    REQUIRE(at != std::string::npos);
    CHECK(std::stoi(r.output.substr(at + fits.size())) <= 90);  // "N% of the arena"
  }
  CHECK_FALSE(fs::exists(tmp.dir / "runs"));
  // --ranks plans a dry run; it is not a way to train without a launcher.
  expect_bad_input(run_ptrain("train 8b.yaml --ranks 8", tmp.dir), {"--ranks", "--dry-run"});
  expect_bad_input(run_ptrain("train 8b.yaml --dry-run --ranks 0", tmp.dir), {"--ranks"});
  // A batch 3 ranks cannot share is refused as under mpirun.
  expect_bad_input(run_ptrain("train 8b.yaml --dry-run --ranks 3", tmp.dir), {"training.batch_tokens", "3 ranks"});
  CHECK_FALSE(fs::exists(tmp.dir / "runs"));
}

// FP8's activations against bf16's on the 8B shape at recompute none (8 ranks, ZeRO-1): the
// activations the plan counts plus the FP8 layers' operand codes (the inputs their backward
// passes read as codes, the output gradients' shared codes). FP8 keeps no bf16 copy of an input
// its layer reads as codes, and with precision.fp8.mlp_input_codes the MLP's pre-activation
// (twice 14,336 wide, the widest activation) as FP8 codes too: at most 0.7 of bf16's.
TEST_CASE("a dry run plans FP8 activations at most 0.7 of bf16's with the MLP's input as FP8 codes", "[cli]") {
  const TempDir tmp("fp8-activations");
  write_file(tmp.dir / "8b.yaml",
             std::string(kLlama8b) + "training: {steps: 10, micro_batch: 1, batch_tokens: 65536, recompute: none}\n");
  // The plan line's "N MiB <what>" (0 when absent).
  const auto mib = [](const std::string& output, const std::string& what) {
    const size_t line = output.find("GPU memory plan per rank: ");
    REQUIRE(line != std::string::npos);
    const size_t end = output.find(" MiB " + what, line), begin = output.rfind(' ', end - 1);
    return end == std::string::npos || end > output.find('\n', line) ? 0.0 : std::stod(output.substr(begin + 1));
  };
  const auto activations = [&](const std::string& precision) {
    const CommandResult r = run_ptrain("train 8b.yaml --dry-run --ranks 8 --set distributed.zero_stage=1 --set "
                                       "precision.mode=" + precision, tmp.dir);
    INFO(precision << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    return mib(r.output, "activations") + mib(r.output, "FP8 operand codes");
  };
  const double bf16 = activations("bf16"), fp8 = activations("fp8"),
               codes = activations("fp8 --set precision.fp8.mlp_input_codes=true");
  INFO("bf16 " << bf16 << " MiB, fp8 " << fp8 << " MiB, fp8 with the MLP's input as codes " << codes << " MiB");
  CHECK(fp8 < bf16);
  CHECK(codes <= 0.7 * bf16);
  // Without recomputation bf16 does not fit an 80 GB H100; FP8 with the MLP's input as codes and
  // primary FP8 weights does, with 10% of the arena free.
  const std::string h100 = "an 80 GB H100 (79.6 GiB, arena at most 74.7 GiB): ";
  const auto on_h100 = [&](const std::string& precision) {
    const CommandResult r = run_ptrain("train 8b.yaml --dry-run --ranks 8 --set distributed.zero_stage=1 --set "
                                       "precision.mode=" + precision, tmp.dir);
    INFO(precision << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    const size_t at = r.output.find(h100);
    REQUIRE(at != std::string::npos);
    return r.output.substr(at + h100.size(), r.output.find('\n', at) - at - h100.size());
  };
  CHECK(on_h100("bf16").rfind("does not fit", 0) == 0);
  const std::string both = on_h100("fp8 --set precision.fp8.mlp_input_codes=true --set precision.fp8.primary_weights=true");
  REQUIRE(both.rfind("fits, ", 0) == 0);
  CHECK(std::stoi(both.substr(6)) <= 90);  // "N% of the arena"
  // --fit plans the recompute settings that keep one layer of the MLP's input without the key,
  // which they refuse, and says so.
  const CommandResult fit = run_ptrain("train 8b.yaml --dry-run --fit h100-80gb --set precision.mode=fp8 --set "
                                       "precision.fp8.mlp_input_codes=true", tmp.dir);
  INFO(fit.output);
  REQUIRE(fit.exit_code == 0);
  for (const char* row : {"    recompute none,  ZeRO-1: ", "    recompute mlp,   ZeRO-1: ", "    recompute block, ZeRO-1: "}) {
    const size_t at = fit.output.find(row);
    REQUIRE(at != std::string::npos);
    const std::string line = fit.output.substr(at, fit.output.find('\n', at) - at);
    CHECK((line.find("without precision.fp8.mlp_input_codes") != std::string::npos) ==
          (std::string(row).find("none") == std::string::npos));
  }
  CHECK_FALSE(fs::exists(tmp.dir / "runs"));
}

// ZeRO-2 and ZeRO-3 on the 8B shape, 8 ranks, bf16. Per parameter: the bf16 weights 2, and
// sharded 16/d (the FP32 master 4, AdamW's moments 8 and the FP32 gradients 4) = 4.00 at d = 8,
// plus ZeRO-2's gradient buckets: two rooms of one block's gradients (218,112,000 elements),
// where the untied head's bucket and the embedding's (206,049,280 and 206,045,184) take turns with the
// blocks': 436,224,000 FP32 values, 0.24 bytes per parameter, so FP32 grads 0.50 + 0.24. ZeRO-3
// keeps 2/d of the weights (0.25) and the rooms they are gathered into, laid out as the
// gradient buckets (436,224,000 bf16 values, 0.12). FP8 layers under ZeRO-3 cast each block's
// weights from the room before each pass into codes the layers of a shape share: one block's
// (218,112,000 bytes, 0.03). Primary FP8 weights are cast from the master once a step, each rank
// keeping its range's block linears as codes (a byte each) and the rest of its range in bf16, and
// the passes gather the codes into two rooms of one block's (218,103,808 bytes) beside bf16 rooms
// of a block's few other weights, the head and embeddings taking a room of their own (206,049,280
// bf16 values): 0.27 bytes per parameter of weights, below bf16's 0.37, as at every stage (what
// the plan then calls FP8 weight scales are the layers' scales alone). And a Llama-3-70B-shaped model with Llama 3's vocabulary
// at T 4096, micro-batch 1, recompute block: with ZeRO-3 it fits 32 80 GB H100s with at least
// 10% of the arena free, and the 8B shape fits 4.
TEST_CASE("a dry run plans ZeRO-2's and ZeRO-3's shards, buckets and rooms, FP8 codes, and a 70B model on 32 H100s",
          "[cli]") {
  const TempDir tmp("zero3-plans");
  write_file(tmp.dir / "8b.yaml",
             std::string(kLlama8b) + "training: {steps: 10, micro_batch: 1, batch_tokens: 65536, recompute: block}\n");
  const std::string per_param = "bytes per parameter (7,391,678,464): ";
  struct Case {
    int stage;
    const char* precision;
    const char* without_activations;
  };
  for (const Case c :
       {Case{2, "bf16", "weights 2.00 + FP32 master 0.50 + FP32 grads 0.74 + AdamW state 1.00 = 4.24 without activations"},
        Case{3, "bf16", "weights 0.37 + FP32 master 0.50 + FP32 grads 0.74 + AdamW state 1.00 = 2.60 without activations"},
        Case{3, "fp8",
             "weights 0.37 + FP32 master 0.50 + FP32 grads 0.74 + AdamW state 1.00 + FP8 weight codes 0.03 = 2.63 "
             "without activations"},
        Case{3, "fp8 --set precision.fp8.primary_weights=true",
             "weights 0.27 + FP32 master 0.50 + FP32 grads 0.74 + AdamW state 1.00 + FP8 weight scales 0.00 = 2.50 "
             "without activations"}}) {
    const std::string args = std::string("train 8b.yaml --dry-run --ranks 8 --set precision.mode=") + c.precision +
                             " --set distributed.zero_stage=" + std::to_string(c.stage);
    const CommandResult r = run_ptrain(args, tmp.dir);
    INFO(args << "\n" << r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find(per_param + c.without_activations) != std::string::npos);
  }
  // FP8 with primary FP8 weights needs no more than bf16 at any stage.
  for (const int stage : {0, 1, 2, 3}) {
    const auto without_activations = [&](const std::string& precision) {
      const std::string args = "train 8b.yaml --dry-run --ranks 8 --set distributed.zero_stage=" +
                               std::to_string(stage) + " --set precision.mode=" + precision;
      const CommandResult r = run_ptrain(args, tmp.dir);
      INFO(args << "\n" << r.output);
      REQUIRE(r.exit_code == 0);
      const size_t end = r.output.find(" without activations");
      REQUIRE(end != std::string::npos);
      return std::stod(r.output.substr(r.output.rfind("= ", end) + 2));
    };
    INFO("ZeRO-" << stage);
    CHECK(without_activations("fp8 --set precision.fp8.primary_weights=true") <= without_activations("bf16"));
  }
  const auto h100_share = [&](const std::string& yaml, const std::string& args) {
    const CommandResult r = run_ptrain("train " + yaml + " --dry-run " + args, tmp.dir);
    INFO(args << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    const std::string fits = "an 80 GB H100 (79.6 GiB, arena at most 74.7 GiB): fits, ";
    const size_t at = r.output.find(fits);
    REQUIRE(at != std::string::npos);
    return std::stoi(r.output.substr(at + fits.size()));  // "N% of the arena"
  };
  CHECK(h100_share("8b.yaml", "--ranks 4 --set precision.mode=bf16 --set distributed.zero_stage=3") <= 100);
  write_file(tmp.dir / "70b.yaml",
             "run: {name: l70b, out_dir: runs, device: cuda}\n"
             "model: {arch: llama, n_layer: 80, n_head: 64, n_kv_head: 8, n_embd: 8192, mlp_hidden: 28672, "
             "seq_len: 4096, vocab_size: 128256, rope_theta: 500000}\n"
             "data: {synthetic: {tokens: 2000000}}\n"
             "training: {steps: 10, micro_batch: 1, batch_tokens: 1048576, recompute: block}\n"
             "precision: {mode: bf16}\n"
             "distributed: {zero_stage: 3}\n");
  CHECK(h100_share("70b.yaml", "--ranks 32") <= 90);
  CHECK_FALSE(fs::exists(tmp.dir / "runs"));
}

// --fit answers from the plan: the fewest ranks it names fit an 80 GB H100 and one rank fewer
// does not, and so for the largest micro-batch; each checked against the dry run's own plan of
// that setting. The batch (720,720 sequences, 8 times that for micro-batches on 8 ranks) lets
// every rank count and micro-batch up to 16 share it.
TEST_CASE("the capacity planner names the fewest ranks and the largest micro-batch that fit a GPU, as the plan "
          "of each says",
          "[cli]") {
  const TempDir tmp("cli-fit");
  write_file(tmp.dir / "8b.yaml",
             std::string(kLlama8b) +
             "training: {steps: 10, micro_batch: 1, batch_tokens: 5904138240, recompute: block, eval_batches: 1}\n"
             "precision: {mode: bf16}\n"
             "distributed: {zero_stage: 1}\n");
  const auto fits_h100 = [&](const std::string& args) {
    const CommandResult r = run_ptrain("train 8b.yaml --dry-run " + args, tmp.dir);
    INFO(args << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    const std::string h100 = "an 80 GB H100 (79.6 GiB, arena at most 74.7 GiB): ";
    const size_t at = r.output.find(h100);
    REQUIRE(at != std::string::npos);
    return r.output.compare(at + h100.size(), 5, "fits,") == 0;
  };
  // "  the largest micro-batch on 8 ranks, ZeRO-1, recompute block: M of at most 720720, ..."
  const std::string batch8 = " --set training.batch_tokens=47233105920";
  const CommandResult on8 = run_ptrain("train 8b.yaml --dry-run --ranks 8 --fit h100-80gb" + batch8, tmp.dir);
  INFO(on8.output);
  REQUIRE(on8.exit_code == 0);
  const std::string largest = "the largest micro-batch on 8 ranks, ZeRO-1, recompute block: ";
  const size_t at = on8.output.find(largest);
  REQUIRE(at != std::string::npos);
  const int m = std::stoi(on8.output.substr(at + largest.size()));
  REQUIRE((m >= 1 && m < 16));
  CHECK(fits_h100("--ranks 8 --set training.micro_batch=" + std::to_string(m) + batch8));
  CHECK_FALSE(fits_h100("--ranks 8 --set training.micro_batch=" + std::to_string(m + 1) + batch8));

  const CommandResult r = run_ptrain("train 8b.yaml --dry-run --fit h100-80gb", tmp.dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_FALSE(fs::exists(tmp.dir / "runs"));
  // "    recompute RECOMPUTE, ZeRO-S: D ranks: ..." for each setting
  int settings = 0;
  for (const char* recompute : {"none", "mlp", "block"}) {
    int fewest[4] = {0, 0, 0, 0};  // per stage; 0: none named
    for (const int stage : {1, 2, 3}) {
      INFO("recompute " << recompute << ", ZeRO-" << stage);
      std::string name = std::string(recompute) + ",";
      name.resize(7, ' ');
      const std::string line = "    recompute " + name + "ZeRO-" + std::to_string(stage) + ": ";
      const size_t l = r.output.find(line);
      REQUIRE(l != std::string::npos);
      const std::string set =
          " --set training.recompute=" + std::string(recompute) + " --set distributed.zero_stage=" + std::to_string(stage);
      if (r.output.compare(l + line.size(), 12, "does not fit") == 0) {  // not on 16 ranks either
        CHECK_FALSE(fits_h100("--ranks 16" + set));
        continue;
      }
      const int d = std::stoi(r.output.substr(l + line.size()));
      REQUIRE((d >= 1 && d <= 16));
      CHECK(fits_h100("--ranks " + std::to_string(d) + set));
      if (d > 1) CHECK_FALSE(fits_h100("--ranks " + std::to_string(d - 1) + set));
      fewest[stage] = d;
      ++settings;
    }
    // Sharding the gradients too, and then the weights, never needs more ranks.
    if (fewest[1] > 0) CHECK((fewest[2] > 0 && fewest[2] <= fewest[1]));
    if (fewest[2] > 0) CHECK((fewest[3] > 0 && fewest[3] <= fewest[2]));
  }
  CHECK(settings >= 6);  // recompute mlp and block fit a few ranks at every stage
  // ZeRO-0 keeps the whole model state (18 bytes a parameter in bf16) on every rank.
  CHECK(r.output.find("    recompute block, ZeRO-0: does not fit at any rank count") != std::string::npos);
  expect_bad_input(run_ptrain("train 8b.yaml --dry-run --fit a100", tmp.dir), {"--fit", "h100-80gb"});
  expect_bad_input(run_ptrain("train 8b.yaml --fit h200", tmp.dir), {"--fit", "--dry-run"});
  for (const char* device : {"cpu", "auto"})
    expect_bad_input(run_ptrain(std::string("train 8b.yaml --dry-run --fit h200 --set run.device=") + device, tmp.dir),
                     {"--fit", "run.device is", "expected run.device cuda"});
  // FP8's block recipe takes micro-batches of whole 128-token blocks only: the search steps over
  // the others (planned with emulated FP8, they once ended it at 64 where 512 fit).
  {
    const std::string fp8 = " --ranks 8 --set model.seq_len=16 --set precision.mode=fp8 --set precision.fp8.recipe=block "
                            "--set distributed.zero_stage=3 --set training.recompute=none "
                            "--set training.batch_tokens=4194304 --set training.micro_batch=8";
    const CommandResult blocks = run_ptrain("train 8b.yaml --dry-run --fit h100-80gb" + fp8, tmp.dir);
    INFO(blocks.output);
    const std::string line = "the largest micro-batch on 8 ranks, ZeRO-3, recompute none: ";
    const size_t l = blocks.output.find(line);
    REQUIRE(l != std::string::npos);
    const int b = std::stoi(blocks.output.substr(l + line.size()));
    CHECK(b % 8 == 0);
    CHECK(fits_h100(fp8 + " --set training.micro_batch=" + std::to_string(b)));
    CHECK_FALSE(fits_h100(fp8 + " --set training.micro_batch=" + std::to_string(2 * b)));
    // At ZeRO-0 none fits: the size quoted is the smallest micro-batch a run takes, 8 x 16 tokens.
    const CommandResult none = run_ptrain("train 8b.yaml --dry-run --fit h100-80gb" + fp8 +
                                              " --set distributed.zero_stage=0", tmp.dir);
    INFO(none.output);
    CHECK(none.output.find("ZeRO-0, recompute none: none fits (micro-batch 8, the smallest a run takes") !=
          std::string::npos);
  }
  // A guard that rolls back runs at ZeRO-0 only: the planner names no sharded setting.
  {
    const CommandResult guarded = run_ptrain("train 8b.yaml --dry-run --fit h100-80gb --set precision.mode=fp8 "
                                             "--set training.guard.action=rollback --set checkpoint.every=100 "
                                             "--set distributed.zero_stage=0",
                                             tmp.dir);
    INFO(guarded.output);
    REQUIRE(guarded.exit_code == 0);
    CHECK(guarded.output.find("    recompute block, ZeRO-1: not with training.guard.action rollback") !=
          std::string::npos);
    CHECK(guarded.output.find("    recompute none,  ZeRO-3: not with training.guard.action rollback") !=
          std::string::npos);
  }
  // A batch of 128 sequences: the ranks named share it.
  {
    const CommandResult small = run_ptrain("train 8b.yaml --dry-run --fit h100-80gb --set training.batch_tokens=1048576",
                                           tmp.dir);
    INFO(small.output);
    const std::string line = "    recompute block, ZeRO-1: ";
    const size_t l = small.output.find(line);
    REQUIRE(l != std::string::npos);
    const int d = std::stoi(small.output.substr(l + line.size()));
    CHECK(128 % d == 0);
  }
  CHECK_FALSE(fs::exists(tmp.dir / "runs"));
}

// The CPU run's memory estimate follows ZeRO-1 as the GPU plan does: a rank keeps AdamW's
// moments and the FP32 master weights of its shard only.
TEST_CASE("the CPU memory estimate counts ZeRO-1's shards of the optimizer state and master weights", "[cli]") {
  const TempDir tmp("cpu-zero1-estimate");
  write_file(tmp.dir / "cpu.yaml",
             "run: {name: c, out_dir: runs, device: cpu}\n"
             "model: {n_layer: 2, n_head: 4, n_embd: 128, seq_len: 64, vocab_size: 256}\n"
             "data: {synthetic: {vocab: 256, tokens: 100000}}\n"
             "training: {steps: 10, batch_tokens: 2048, micro_batch: 8, eval_batches: 1}\n"
             "precision: {mode: bf16}\n");
  // "<total> MiB = <a> MiB params + <b> MiB FP32 master weights + ... + <c> MiB AdamW state"
  const auto estimate = [&](const char* zero) {
    const CommandResult r =
        run_ptrain(std::string("train cpu.yaml --dry-run --ranks 4 --set distributed.zero_stage=") + zero, tmp.dir);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const size_t at = r.output.find("memory estimate: ");
    REQUIRE(at != std::string::npos);
    const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
    const auto mib_before = [&](const std::string& what) {
      const size_t end = line.find(" MiB " + what);
      REQUIRE(end != std::string::npos);
      const size_t start = line.rfind(' ', end - 1) + 1;
      return std::stod(line.substr(start, end - start));
    };
    return std::pair{mib_before("FP32 master weights"), mib_before("AdamW state")};
  };
  const auto [master0, adam0] = estimate("0");
  const auto [master1, adam1] = estimate("1");
  CHECK(master1 == Approx(master0 / 4).margin(0.1));  // printed to 0.1 MiB
  CHECK(adam1 == Approx(adam0 / 4).margin(0.1));
}

TEST_CASE("config errors exit 2 and create no run directory", "[cli]") {
  Workspace ws;
  SECTION("unknown key, with a suggestion") {
    expect_bad_input(ws.train(ws.config("  n_emdb: 16\n")), {"model.n_emdb", "did you mean", "model.n_embd"});
  }
  SECTION("wrong type") {
    expect_bad_input(ws.train(ws.config("", "optimizer: {lr: fast}\n")), {"optimizer.lr", "expected"});
  }
  SECTION("n_embd not divisible by n_head") {
    expect_bad_input(ws.train(ws.config(), "--set model.n_head=3"), {"model.n_embd", "model.n_head"});
  }
  SECTION("training seq_len above the model's") {
    expect_bad_input(ws.train(ws.config(), "--set training.seq_len=32"), {"training.seq_len", "model.seq_len"});
  }
  SECTION("batch_tokens not a multiple of micro_batch x seq_len") {
    expect_bad_input(ws.train(ws.config(), "--set training.batch_tokens=100"), {"training.batch_tokens", "multiple"});
  }
  SECTION("malformed YAML reports line and column") {
    expect_bad_input(ws.train("model:\n  n_layer: [1, 2\n"), {"run.yaml:3:", "malformed YAML"});
  }
  SECTION("every problem at once") {
    const CommandResult r = ws.train(ws.config("  n_emdb: 16\n", "optimizer: {lr: -1, beta1: 2}\n"));
    expect_bad_input(r, {"3 problems", "model.n_emdb", "optimizer.lr", "optimizer.beta1"});
  }
  SECTION("bad --set flag") {
    expect_bad_input(ws.train(ws.config(), "--set model.n_layer"), {"--set", "="});
  }
  SECTION("a synthetic corpus too small for the val batches") {
    const std::string yaml =
        "run: {name: r, out_dir: runs}\n"
        "model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 64}\n"
        "data: {synthetic: {vocab: 64, tokens: 2000}}\n"
        "training: {steps: 2, batch_tokens: 64, micro_batch: 4, eval_batches: 20}\n";
    expect_bad_input(ws.train(yaml), {"data.synthetic", "val split", "eval_batches"});
  }
  SECTION("fp8 block scaling with a model too narrow for 128-wide blocks") {
    expect_bad_input(ws.train(ws.config(), "--set precision.mode=fp8 --set precision.fp8.recipe=block"),
                     {"model.n_embd", "multiple of 128"});
  }
  SECTION("bad fp8 settings") {
    expect_bad_input(ws.train(ws.config(), "--set precision.fp8.recipe=tensorwise"), {"precision.fp8.recipe", "delayed"});
    expect_bad_input(ws.train(ws.config(), "--set precision.fp8.format=e5m2"), {"precision.fp8.format", "hybrid"});
    expect_bad_input(ws.train(ws.config(), "--set precision.fp8.margin=-1"), {"precision.fp8.margin", "expected"});
    expect_bad_input(ws.train(ws.config(), "--set precision.fp8.amax_history=0"),
                     {"precision.fp8.amax_history", "expected"});
    expect_bad_input(ws.train(ws.config(), "--set precision.fp8.block_size=64"), {"precision.fp8.block_size", "128"});
    expect_bad_input(ws.train(ws.config(), "--set precision.mode=fp8 --set training.micro_batch=1 --set training.batch_tokens=16 --set training.seq_len=8"),
                     {"training.micro_batch", "multiple of 16"});
  }
  SECTION("missing config file") {
    expect_bad_input(run_ptrain("train nowhere.yaml", ws.dir), {"nowhere.yaml"});
  }
  CHECK_FALSE(ws.run_dir_exists());
}

TEST_CASE("data errors exit 2 and create no run directory", "[cli]") {
  Workspace ws;
  const fs::path train = ws.dir / "data/train_000000.bin";
  SECTION("no file matches the glob") {
    fs::remove(train);
    expect_bad_input(ws.train(ws.config()), {"data.train", "train_*.bin"});
  }
  SECTION("unreadable file") {
    fs::remove(train);
    fs::create_directory(train);  // a directory where a shard should be: it cannot be read
    expect_bad_input(ws.train(ws.config()), {"data.train", "train_000000.bin"});
  }
  SECTION("wrong magic") {
    corrupt_int(train, 0, 12345);
    expect_bad_input(ws.train(ws.config()), {"train_000000.bin", "magic number 20240520"});
  }
  SECTION("wrong version") {
    corrupt_int(train, 1, 7);
    expect_bad_input(ws.train(ws.config()), {"train_000000.bin", "version", "expected"});
  }
  SECTION("size does not match the header") {
    corrupt_int(train, 2, 6000);
    expect_bad_input(ws.train(ws.config()), {"train_000000.bin", "expected"});
  }
  SECTION("shards of mixed widths in a split") {
    write_shard((ws.dir / "data/train_000001.bin").string(), std::vector<uint32_t>(100, 5));
    expect_bad_input(ws.train(ws.config()), {"data.train", "train_000001.bin", "uint32 tokens", "train_000000.bin",
                                             "uint16 tokens", "expected the shards of one vocabulary"});
  }
  SECTION("a source of data.sources that matches nothing, or is in another format") {
    const std::string blend =
        "data.sources=[{train: \"data/train_*.bin\", weight: 1}, {train: \"data/more_*.bin\", weight: 1}]";
    expect_bad_input(ws.train(ws.config(), "--set data.train=null --set '" + blend + "'"),
                     {"data.sources[2].train: no files match", "data/more_*.bin"});
    write_shard((ws.dir / "data/more_000000.bin").string(), std::vector<uint32_t>(100, 5));
    expect_bad_input(ws.train(ws.config(), "--set data.train=null --set '" + blend + "'"),
                     {"data.sources[2].train", "more_000000.bin", "uint32 tokens", "data.sources[1].train's", "uint16 tokens",
                      "expected every source made with one vocabulary"});
    expect_bad_input(ws.train(ws.config(), "--set data.train=null --set 'data.sources=[{train: a, weight: -1}]'"),
                     {"data.sources[1].weight: -1 is out of range"});
  }
  SECTION("splits of different widths") {
    write_shard((ws.dir / "data/val_000000.bin").string(), std::vector<uint32_t>(5000, 5));
    const CommandResult dry = ws.train(ws.config(), "--dry-run");
    expect_bad_input(dry, {"data.val", "val_000000.bin", "uint32 tokens", "data.train's", "uint16 tokens",
                           "expected both splits made with one vocabulary"});
    expect_bad_input(ws.train(ws.config()), {"data.val", "expected both splits"});
  }
  CHECK_FALSE(ws.run_dir_exists());
}

TEST_CASE("a token id outside the vocabulary is exit 2, naming the shard and position", "[cli]") {
  Workspace ws;
  SECTION("in the val split: found while planning, nothing written") {
    expect_bad_input(ws.train(ws.config(), "--set model.vocab_size=32"),
                     {"data.val", "token id", "at position", "val_000000.bin", "model.vocab_size 32"});
    CHECK_FALSE(ws.run_dir_exists());
  }
  SECTION("in the train split: found as it is read, the run stops before a step completes") {
    // Token ids are checked as they are read (a dry run or a resume makes no pass over a large
    // corpus); the val windows are checked while planning, train windows only when drawn.
    std::vector<uint16_t> tokens(5000, 100);
    write_shard((ws.dir / "data/train_000000.bin").string(), tokens);
    const CommandResult r = ws.train(ws.config());
    expect_bad_input(r, {"data.train", "token id 100", "train_000000.bin", "model.vocab_size 64"});
    CHECK(losses_by_step(ws.dir / "runs/r/metrics.jsonl").empty());
    CHECK_FALSE(fs::exists(ws.dir / "runs/r/checkpoints/latest"));
  }
}

TEST_CASE("help and version output and bad flags", "[cli]") {
  const fs::path cwd = fs::temp_directory_path();
  const CommandResult version = run_ptrain("--version", cwd);
  CHECK(version.exit_code == 0);
  CHECK(version.output.find("ptrain " PTRAIN_VERSION) != std::string::npos);
  for (const char* cmd : {"--help", "train --help", "data synth --help", "data prepare --help", "bench --help"}) {
    const CommandResult help = run_ptrain(cmd, cwd);
    INFO(cmd << "\n" << help.output);
    CHECK(help.exit_code == 0);
    CHECK(help.output.find("xample") != std::string::npos);
  }
  expect_bad_input(run_ptrain("train", cwd), {"config"});
  expect_bad_input(run_ptrain("frobnicate", cwd), {"frobnicate"});
  expect_bad_input(run_ptrain("data synth --out x --vocab", cwd), {"vocab"});
}

TEST_CASE("data commands write shards a run can train on", "[cli]") {
  const fs::path dir = make_temp_dir("datacmd");
  const CommandResult synth = run_ptrain("data synth --out syn --vocab 16 --order 2 --tokens 20000 --seed 3", dir);
  INFO(synth.output);
  REQUIRE(synth.exit_code == 0);
  CHECK(fs::exists(dir / "syn/train_000000.bin"));
  CHECK(fs::exists(dir / "syn/synthetic.json"));
  CHECK(synth.output.find("oracle loss") != std::string::npos);

  write_file(dir / "text.txt", std::string(3000, 'a') + "hello world\n");
  const CommandResult prep = run_ptrain("data prepare --input text.txt --out bytes --tokenizer bytes --val-fraction 0.2", dir);
  INFO(prep.output);
  REQUIRE(prep.exit_code == 0);
  CHECK(fs::exists(dir / "bytes/bytes_val_000000.bin"));
  CHECK(fs::exists(dir / "bytes/ptrain-tokenizer.json"));

  expect_bad_input(run_ptrain("data prepare --input missing.txt --out bytes2", dir), {"missing.txt"});
  expect_bad_input(run_ptrain("data synth --out s2 --vocab 1", dir), {"vocab"});
  fs::remove_all(dir);
}

TEST_CASE("run.device picks the device and says which", "[cli]") {
  Workspace ws;
  const CudaProbe probe = probe_cuda();
  const CommandResult cpu = ws.train(ws.config(), "--set run.device=cpu");
  INFO(cpu.output);
  REQUIRE(cpu.exit_code == 0);
  CHECK(cpu.output.find("device cpu (run.device: cpu)") != std::string::npos);
  if (!probe.devices.empty()) return;  // on a GPU machine, auto and cuda are the gpu tests' business

  // No usable GPU here: auto trains on the CPU and says why; cuda stops before writing anything.
  const CommandResult automatic = ws.train(ws.config(), "--set run.device=auto --set run.name=auto");
  INFO(automatic.output);
  REQUIRE(automatic.exit_code == 0);
  CHECK(automatic.output.find("device cpu (run.device: auto; no usable CUDA device: " + probe.why_none) !=
        std::string::npos);
  const CommandResult cuda = ws.train(ws.config(), "--set run.device=cuda --set run.name=cuda");
  INFO(cuda.output);
  CHECK(cuda.exit_code == 1);
  CHECK(cuda.output.find("run.device: cuda cannot be used: no usable CUDA device: " + probe.why_none) !=
        std::string::npos);
  CHECK(!fs::exists(ws.dir / "runs/cuda"));
}

TEST_CASE("model.attention and precision.tf32 on the CPU: what ran is logged, cudnn is refused", "[cli]") {
  Workspace ws;
  const CommandResult run = ws.train(ws.config(), "--set run.device=cpu --set precision.tf32=true");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("attention: fallback (the CPU backend's reference attention)") != std::string::npos);
  CHECK(run.output.find("precision.tf32 has no effect on the CPU") != std::string::npos);
  // cuDNN attention asked for on the CPU: a user error before anything is written.
  const CommandResult cudnn =
      ws.train(ws.config(), "--set run.device=cpu --set model.attention=cudnn --set run.name=cudnn");
  INFO(cudnn.output);
  CHECK(cudnn.exit_code == 2);
  CHECK(cudnn.output.find("model.attention: cudnn runs on the CUDA backend only") != std::string::npos);
  CHECK(!fs::exists(ws.dir / "runs/cudnn"));
}
