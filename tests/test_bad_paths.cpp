// Files and directories as a hostile user sets them up: FIFOs and devices where files belong,
// symbolic-link loops, names too long, a checkpoint directory that is a file or another run's,
// glob characters in a run name. Each ends with exit 2 and a message naming the culprit, and
// nothing written: no earlier run, checkpoint or user file is touched.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include "bad_input.h"
#include "checkpoint/checkpoint.h"
#include "config/config.h"

using namespace ptrain;
using namespace ptrain::test;
namespace fs = std::filesystem;

TEST_CASE("a FIFO is refused by name, never opened to block", "[hardening]") {
  BadInputWorkspace ws;
  REQUIRE(::mkfifo((ws.dir / "data/train_000001.bin").c_str(), 0644) == 0);
  REQUIRE(::mkfifo((ws.dir / "pipe.bin").c_str(), 0644) == 0);
  const auto before = ws.snapshot();
  // `timeout` turns a hang into exit 124 instead of a test that never ends.
  expect_refused(ws, before, ws.ptrain("train run.yaml", "timeout 60"), 2, {"data.train", "train_000001.bin", "FIFO"});
  expect_refused(ws, before, ws.ptrain("train run.yaml --dry-run", "timeout 60"), 2, {"FIFO"});
  expect_refused(ws, before, ws.ptrain("inspect pipe.bin", "timeout 60"), 2, {"pipe.bin", "FIFO"});
  expect_refused(ws, before, ws.ptrain("train run.yaml --set checkpoint.resume=pipe.bin", "timeout 60"), 2,
                 {"checkpoint.resume", "pipe.bin"});
}

TEST_CASE("the config may come from a pipe, but not from a device, a directory or a second document", "[hardening]") {
  BadInputWorkspace ws;
  const auto before = ws.snapshot();
  const CommandResult piped = run_shell("cd '" + ws.dir.string() + "' && cat run.yaml | '" PTRAIN_BINARY "' train /dev/stdin --dry-run");
  INFO(piped.output);
  CHECK(piped.exit_code == 0);
  CHECK(piped.output.find("dry run: nothing written") != std::string::npos);
  expect_refused(ws, before, ws.ptrain("train /dev/zero", "timeout 60"), 2, {"/dev/zero", "character device"});
  expect_refused(ws, before, ws.ptrain("train data"), 2, {"data", "directory"});
  // A directive, markers and a closing "..." around one document are one document.
  write_file(ws.dir / "one.yaml", "%YAML 1.2\n---\n" + BadInputWorkspace::config() + "...\n");
  const CommandResult one = ws.ptrain("train one.yaml --dry-run");
  INFO(one.output);
  CHECK(one.exit_code == 0);
  write_file(ws.dir / "two.yaml", BadInputWorkspace::config() + "---\nrun: {name: other}\n");
  const auto with_two = ws.snapshot();
  expect_refused(ws, with_two, ws.ptrain("train two.yaml"), 2, {"two.yaml", "more than one YAML document"});
  // yaml-cpp would recurse once per level: deep nesting is refused before it parses.
  write_file(ws.dir / "deep.yaml", "run: " + std::string(5000, '[') + std::string(5000, ']') + "\n");
  const auto with_deep = ws.snapshot();
  expect_refused(ws, with_deep, ws.ptrain("train deep.yaml"), 2, {"deep.yaml", "levels deep"});
  // A binary file, or UTF-16 text, is named as such, not shown as text of another encoding.
  std::string utf16;
  for (char ch : BadInputWorkspace::config()) utf16 += std::string{ch, '\0'};
  write_file(ws.dir / "utf16.yaml", "\xff\xfe" + utf16);
  write_file(ws.dir / "binary.yaml", std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10) + "run: x\n");
  write_file(ws.dir / "latin1.yaml", BadInputWorkspace::config() + "# caf\xe9\n");
  const auto with_binary = ws.snapshot();
  expect_refused(ws, with_binary, ws.ptrain("train utf16.yaml"), 2,
                 {"utf16.yaml: the file has a byte that is not UTF-8 at byte 0", "expected a YAML text file in UTF-8"});
  expect_refused(ws, with_binary, ws.ptrain("train binary.yaml"), 2, {"binary.yaml: the file has a NUL byte at byte 7"});
  expect_refused(ws, with_binary, ws.ptrain("train latin1.yaml --dry-run"), 2, {"latin1.yaml", "not UTF-8"});
}

TEST_CASE("paths the machine would refuse are bad input, found while planning", "[hardening]") {
  BadInputWorkspace ws;
  REQUIRE(ws.train().exit_code == 0);  // an earlier run "r", which nothing below may touch
  fs::create_symlink("loop", ws.dir / "loop");
  write_file(ws.dir / "a-file", "not a directory\n");
  const auto before = ws.snapshot();
  SECTION("a 300-character run.name") {
    expect_refused(ws, before, ws.train("--set run.name=" + std::string(300, 'n')), 2, {"run.name", "300 bytes"});
  }
  SECTION("a checkpoint to resume from that is a symbolic-link loop") {
    expect_refused(ws, before, ws.train("--set checkpoint.resume=loop"), 2, {"checkpoint.resume", "symbolic link loop"});
  }
  SECTION("a `latest` that is a symbolic-link loop") {
    const fs::path latest = ws.run() / "checkpoints/latest";
    fs::remove(latest);
    fs::create_symlink("latest", latest);
    const auto with_loop = ws.snapshot();
    expect_refused(ws, with_loop, ws.train("--set checkpoint.resume=" + latest.string()), 2,
                   {"checkpoint.resume", "symbolic link loop"});
    // resume: auto looks at the checkpoint directories themselves, and the save replaces the link.
    const CommandResult r = ws.train("--set checkpoint.resume=auto --set training.steps=4");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(read_file(latest) == "step_00000004\n");
  }
  SECTION("run.out_dir below a file") {
    expect_refused(ws, before, ws.train("--set run.out_dir=a-file/runs --set run.name=new"), 2,
                   {"run.out_dir", "a-file", "not a directory"});
  }
  SECTION("a checkpoint.dir that cannot be created") {
    expect_refused(ws, before, ws.train("--set run.name=new --set checkpoint.dir=/proc/ptrain-ck"), 2,
                   {"checkpoint.dir", "/proc/ptrain-ck"});
  }
}

TEST_CASE("a checkpoint.dir that is a file is refused before anything is written, even with run.overwrite", "[hardening]") {
  BadInputWorkspace ws;
  REQUIRE(ws.train().exit_code == 0);
  write_file(ws.dir / "ck-file", "a user's file\n");
  const auto before = ws.snapshot();
  // The old run's checkpoints, log.txt, metrics.jsonl and summary.json were deleted before.
  expect_refused(ws, before, ws.train("--set run.overwrite=true --set checkpoint.dir=ck-file"), 2,
                 {"checkpoint.dir", "ck-file", "not a directory"});
  // A new run is refused the same way, and the corrected rerun is not then refused as existing.
  expect_refused(ws, before, ws.train("--set run.name=new --set checkpoint.dir=ck-file"), 2, {"ck-file"});
  const CommandResult fixed = ws.train("--set run.name=new --set checkpoint.dir=ck-new");
  INFO(fixed.output);
  CHECK(fixed.exit_code == 0);
}

TEST_CASE("a checkpoint directory belongs to one run", "[hardening]") {
  BadInputWorkspace ws;
  REQUIRE(ws.train("--set checkpoint.dir=shared").exit_code == 0);
  const std::string owner = read_file(ws.dir / "shared/.ptrain-owner");
  CHECK(owner == fs::canonical(ws.run()).string() + "\n");
  const auto before = ws.snapshot();
  SECTION("another run may neither write nor resume there") {
    expect_refused(ws, before, ws.train("--set run.name=other --set checkpoint.dir=shared"), 2,
                   {"checkpoint.dir", "shared", "belongs to the run in"});
    expect_refused(ws, before, ws.train("--set run.name=other --set checkpoint.dir=shared --set checkpoint.resume=auto"),
                   2, {"belongs to the run in"});
  }
  SECTION("another run may not take over a run's default checkpoint directory, marked or not") {
    REQUIRE(ws.train("--set run.name=a").exit_code == 0);
    const auto with_a = ws.snapshot();
    expect_refused(ws, with_a, ws.train("--set run.name=b --set checkpoint.dir=runs/a/checkpoints --set checkpoint.resume=auto"),
                   2, {"belongs to the run in"});
    fs::remove(ws.run("a") / "checkpoints/.ptrain-owner");  // as a run from before owners were recorded
    const auto unmarked = ws.snapshot();
    expect_refused(ws, unmarked, ws.train("--set run.name=b --set checkpoint.dir=runs/a/checkpoints --set checkpoint.resume=auto"),
                   2, {"belongs to the run in", "runs/a"});
  }
  SECTION("run.overwrite never removes the checkpoint it would resume from") {
    fs::remove_all(ws.run());
    fs::create_directories(ws.run());  // e.g. a job script's mkdir -p: empty, no marker
    const auto emptied = ws.snapshot();
    expect_refused(ws, emptied,
                   ws.train("--set checkpoint.dir=shared --set checkpoint.resume=auto --set run.overwrite=true"), 2,
                   {"checkpoint.resume", "run.overwrite would remove"});
  }
  SECTION("its own run resumes there") {
    const CommandResult r = ws.train("--set checkpoint.dir=shared --set checkpoint.resume=auto --set training.steps=4");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("resumed from shared/step_00000003") != std::string::npos);
  }
  SECTION("run.overwrite replaces the run and its checkpoints there") {
    const CommandResult r = ws.train("--set checkpoint.dir=shared --set run.overwrite=true --set training.steps=2");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK_FALSE(fs::exists(ws.dir / "shared/step_00000003"));
    CHECK(read_file(ws.dir / "shared/latest") == "step_00000002\n");
  }
}

TEST_CASE("a directory of checkpoints from before owners were recorded is not taken over by a new run", "[hardening]") {
  BadInputWorkspace ws;
  REQUIRE(ws.train("--set checkpoint.dir=legacy").exit_code == 0);
  fs::remove(ws.dir / "legacy/.ptrain-owner");
  const auto before = ws.snapshot();
  expect_refused(ws, before, ws.train("--set run.name=other --set checkpoint.dir=legacy"), 2,
                 {"legacy", "holds checkpoints of another run"});
}

TEST_CASE("glob characters in run.name never reach a glob", "[hardening]") {
  // The synthetic corpus of run "x[1]" lives in runs/x[1]/data; as a glob that pattern matches
  // runs/x1/data, another run's corpus.
  BadInputWorkspace ws;
  const std::string synthetic =
      "run: {out_dir: runs}\nmodel: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 64}\n"
      "training: {steps: 2, batch_tokens: 64, micro_batch: 4, eval_batches: 2, eval_every: 0}\n";
  write_file(ws.dir / "a.yaml", synthetic + "data: {synthetic: {vocab: 64, tokens: 5000, seed: 1}}\n");
  write_file(ws.dir / "b.yaml", synthetic + "data: {synthetic: {vocab: 64, tokens: 6000, seed: 2}}\n");
  REQUIRE(ws.ptrain("train a.yaml --set run.name=x1").exit_code == 0);
  for (const std::string name : {"x[1]", "x?", "x*"}) {
    const CommandResult r = ws.ptrain("train b.yaml --set 'run.name=" + name + "'");
    INFO(name << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("data: train 5,400 tokens") != std::string::npos);  // b's 6000 x 0.9, not a's 4,500
  }
}

TEST_CASE("a run name that is not UTF-8 still logs and checkpoints", "[hardening]") {
  BadInputWorkspace ws;
  const CommandResult r = ws.train("--set 'run.name=caf\xe9'");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("internal error") == std::string::npos);
  CHECK(fs::exists(ws.dir / "runs/caf\xe9/checkpoints/latest"));
}

TEST_CASE("inputs that lie: control characters and NUL in names and paths, a vocabulary the model cannot hold",
          "[hardening]") {
  BadInputWorkspace ws;
  // A newline in run.name would forge lines in log.txt; a NUL would cut a path short.
  const std::string config = BadInputWorkspace::config();
  const std::string after_run = config.substr(config.find('\n') + 1);
  write_file(ws.dir / "newline.yaml", "run: {name: \"a\\nb\", out_dir: runs}\n" + after_run);
  write_file(ws.dir / "nul.yaml", config + "logging: {sample_prompt: \"x\\0y\"}\n");
  std::string nul_path = config;
  nul_path.replace(nul_path.find("data/train_*.bin"), 16, "data/train_*.bin\\0.x");
  write_file(ws.dir / "nul-path.yaml", nul_path);
  const auto with_configs = ws.snapshot();
  expect_refused(ws, with_configs, ws.ptrain("train newline.yaml"), 2, {"run.name", "control character"});
  expect_refused(ws, with_configs, ws.ptrain("train newline.yaml --dry-run"), 2, {"run.name", "control character"});
  expect_refused(ws, with_configs, ws.ptrain("train nul.yaml"), 2, {"logging.sample_prompt", "NUL byte"});
  expect_refused(ws, with_configs, ws.ptrain("train nul-path.yaml"), 2, {"data.train", "NUL byte"});
  // Shards without a tokenizer record, said to be GPT-2's, for a model of 64 outputs.
  expect_refused(ws, with_configs, ws.train("--set data.tokenizer=gpt2"), 2,
                 {"model.vocab_size is 64", "50257 ids of the gpt2 tokenizer"});
}

TEST_CASE("a FIFO where the CPU's measured sgemm rate is cached does not block a run", "[hardening]") {
  BadInputWorkspace ws;
  fs::create_directories(ws.dir / "cache");
  REQUIRE(::mkfifo((ws.dir / "cache/cpu-peak.json").c_str(), 0644) == 0);
  const CommandResult r = ws.train("", "PTRAIN_CACHE=cache timeout 120");
  INFO(r.output);
  CHECK(r.exit_code == 0);  // 124 would be the hang
  CHECK(r.output.find("done: 3 steps") != std::string::npos);
}

TEST_CASE("model.init_from with a resume is said to be unused, not silently ignored", "[hardening]") {
  BadInputWorkspace ws;
  REQUIRE(ws.train().exit_code == 0);
  REQUIRE(ws.ptrain("export --checkpoint runs/r/checkpoints/step_00000003 --format llmc --out model.bin").exit_code == 0);
  const CommandResult r =
      ws.train("--set training.steps=4 --set checkpoint.resume=auto --set model.init_from=model.bin");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("model.init_from: \"model.bin\" is not used: the run resumes from runs/r/checkpoints/"
                      "step_00000003") != std::string::npos);
}

TEST_CASE("export and compare check what they would write before they write", "[hardening]") {
  BadInputWorkspace ws;
  REQUIRE(ws.train().exit_code == 0);
  fs::create_directory(ws.dir / "out-dir");
  const auto before = ws.snapshot();
  const std::string ck = (ws.run() / "checkpoints/step_00000003").string();
  expect_refused(ws, before, ws.ptrain("export --checkpoint " + ck + " --out out-dir"), 2, {"--out", "out-dir", "directory"});
  REQUIRE(::mkfifo((ws.dir / "out.fifo").c_str(), 0644) == 0);
  const auto with_fifo = ws.snapshot();
  expect_refused(ws, with_fifo, ws.ptrain("export --checkpoint " + ck + " --out out.fifo", "timeout 60"), 2,
                 {"--out", "not a regular file"});
  expect_refused(ws, with_fifo, ws.ptrain("compare run.yaml --modes fp32,fp32 --out cmp"), 2, {"--modes", "already among"});
  expect_refused(ws, with_fifo, ws.ptrain("compare run.yaml --modes fp32,fp8:delayed,fp8 --out cmp"), 2, {"already among"});
  expect_refused(ws, with_fifo, ws.ptrain("compare run.yaml --modes fp32,bf16 --reference fp16 --out cmp"), 2,
                 {"--reference", "fp16", "not among"});
  expect_refused(ws, with_fifo, ws.ptrain("compare run.yaml --modes fp32,bf16 --tolerance nan --out cmp"), 2, {"--tolerance"});
  expect_refused(ws, with_fifo, ws.ptrain("compare run.yaml --modes fp32,bf16 --tolerance -1 --out cmp"), 2, {"--tolerance"});
  // A mode whose run cannot start (its data) is found before the first mode trains.
  expect_refused(ws, with_fifo, ws.ptrain("compare run.yaml --modes fp32,bf16 --out cmp --set data.val=none_*.bin"), 2,
                 {"data.val", "none_*.bin"});
}

TEST_CASE("a checkpoint directory whose latest is not a file is refused while planning, not at the first save",
          "[hardening]") {
  BadInputWorkspace ws;
  REQUIRE(ws.train().exit_code == 0);
  const std::filesystem::path latest = ws.run() / "checkpoints/latest";
  std::filesystem::remove(latest);
  std::filesystem::create_directories(latest / "inside");
  const auto before = ws.snapshot();
  expect_refused(ws, before, ws.train("--set training.steps=5 --set checkpoint.resume=auto"), 2,
                 {"runs/r/checkpoints/latest\" is a directory", "move the directory away"});
  expect_refused(ws, before, ws.train("--set training.steps=5 --set checkpoint.resume=auto --dry-run"), 2,
                 {"runs/r/checkpoints/latest\" is a directory"});
}

TEST_CASE("flags out of their range are refused", "[hardening]") {
  BadInputWorkspace ws;
  REQUIRE(ws.train().exit_code == 0);
  const auto before = ws.snapshot();
  const std::string ck = (ws.run() / "checkpoints/step_00000003").string();
  expect_refused(ws, before, ws.ptrain("sample --checkpoint " + ck + " --temperature nan"), 2, {"--temperature"});
  expect_refused(ws, before, ws.ptrain("sample --checkpoint " + ck + " --temperature inf"), 2, {"--temperature"});
  expect_refused(ws, before, ws.ptrain("data prepare --input run.yaml --out '' --tokenizer bytes"), 2,
                 {"--out: an empty path", "expected the directory to write"});
  // A --vocab the checkpoint's data takes no use of (token ids without a tokenizer), never ignored.
  for (const std::string& command : {"sample --checkpoint " + ck, "export --checkpoint " + ck + " --format hf --out x"})
    expect_refused(ws, before, ws.ptrain(command + " --vocab nowhere.json"), 2,
                   {"--vocab nowhere.json", "without a tokenizer", "expected no --vocab"});
  expect_refused(ws, before, ws.train("--set run.name=s --stop-at 0"), 2, {"--stop-at"});
  expect_refused(ws, before, ws.train("--set run.name=s --stop-at -1"), 2, {"--stop-at"});
  // A stop at or before the step resumed from: refused, not one more step and a checkpoint.
  for (const char* stop : {"--stop-at 3", "--stop-at 2", "--stop-at 2 --dry-run"})
    expect_refused(ws, before,
                   ws.train("--set run.name=s --set training.steps=6 --set checkpoint.resume=" + ck + " " + stop), 2,
                   {"--stop-at", "is at step 3", "expected a step after 3"});
  // Every whole-number flag: its name and its range, never a wrapped or silently ignored value.
  const std::string whole = "expected a whole number from ";
  const std::pair<std::string, std::string> cases[] = {
      {"train run.yaml --set run.name=s --stop-at 0", "--stop-at: 0; " + whole + "1 to 9223372036854775807"},
      {"train run.yaml --set run.name=s --stop-at 2.5", "--stop-at: 2.5; " + whole + "1"},
      {"compare run.yaml --modes fp32,bf16 --out cmp --steps 0", "--steps: 0; " + whole + "1"},
      {"compare run.yaml --modes fp32,bf16 --out cmp --steps -3", "--steps: -3; " + whole + "1"},
      {"sample --checkpoint " + ck + " --seed -3", "--seed: -3; " + whole + "0 to 9223372036854775807"},
      {"sample --checkpoint " + ck + " --tokens 0", "--tokens: 0; " + whole + "1 to 1048576"},
      {"sample --checkpoint " + ck + " --tokens 2000000", "--tokens: 2000000; " + whole + "1 to 1048576"},
      {"sample --checkpoint " + ck + " --top-k -1", "--top-k: -1; " + whole + "0"},
      {"data synth --out synth --seed -1", "--seed: -1; " + whole + "0"},
      {"data synth --out synth --vocab 0", "--vocab: 0; " + whole + "2 to 1048576"},
      {"data synth --out synth --tokens 1e6", "--tokens: 1e6; " + whole + "1"},
      {"data prepare --input run.yaml --out prepared --threads 100000", "--threads: 100000; " + whole + "0 to 1024"},
      {"data prepare --input run.yaml --out prepared --threads 010", "--threads: 010; " + whole + "0 to 1024"},
      {"data prepare --input run.yaml --out prepared --threads +4", "--threads: +4; " + whole + "0 to 1024"},
      {"data prepare --input run.yaml --out prepared --val-tokens 0", "--val-tokens: 0; " + whole + "1"},
      {"data prepare --input run.yaml --out prepared --shard-tokens 0", "--shard-tokens: 0; " + whole + "1"},
  };
  for (const auto& [args, message] : cases) {
    INFO(args);
    expect_refused(ws, before, ws.ptrain(args), 2, {message});
  }
  // Config numbers whose extremes broke runs: a margin that makes every scale 0, and amax
  // histories that make a state.json ptrain refuses to read back (resume then lost the run).
  expect_refused(ws, before, ws.train("--set run.name=s --set precision.mode=fp8 --set precision.fp8.margin=1000"), 2,
                 {"precision.fp8.margin: 1000 is out of range", "[0, 32]"});
  expect_refused(ws, before,
                 ws.train("--set run.name=s --set precision.mode=fp8 --set precision.fp8.amax_history=700000"), 2,
                 {"precision.fp8.amax_history: 700000 is out of range", "[1, 1024]"});
  expect_refused(ws, before,
                 ws.train("--set run.name=s --set precision.mode=fp8 --set precision.fp8.amax_history=1024 "
                          "--set model.n_layer=1000"),
                 2,
                 {"precision.fp8.amax_history: 1024 values for each of 12003 FP8 tensors",
                  "expected at most " + std::to_string(longest_history_within(12003, GuardConfig{}.window)) +
                      " for this model"});
}

TEST_CASE("null in a --set flag removes the key, then the config is validated", "[hardening]") {
  BadInputWorkspace ws;
  const auto before = ws.snapshot();
  expect_refused(ws, before, ws.train("--set data=null"), 2, {"data", "no training data given"});
  expect_refused(ws, before, ws.train("--set model.n_layer=null"), 2, {"model.n_layer", "required"});
  write_file(ws.dir / "synth.yaml",
             "model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 64}\n"
             "data: {synthetic: {vocab: 64, tokens: 5000}}\n");
  const auto with_synth = ws.snapshot();
  expect_refused(ws, with_synth, ws.ptrain("train synth.yaml --set data.synthetic=null"), 2, {"no training data given"});
  // A key with a default goes back to it.
  const CommandResult r = ws.train("--dry-run --set training.steps=7 --set training.steps=null");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("steps: 500") != std::string::npos);
}

TEST_CASE("training.threads above the cores is clamped with a warning", "[hardening]") {
  BadInputWorkspace ws;
  const CommandResult r = ws.train("--dry-run --set training.threads=100000");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("training.threads: 100000 is more than the") != std::string::npos);
  CHECK(r.output.find("dry run: nothing written") != std::string::npos);
}
