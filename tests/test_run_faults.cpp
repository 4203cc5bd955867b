// What a dry run checks, and faults that come after a run has started: a dry run refuses
// everything the real run refuses before its first write, and writes nothing; a full disk or a
// file-size limit is exit 1 naming the file (never a signal, never a half-made run directory
// left behind); a shard cut short under a running job is an error naming it, not SIGBUS.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include "bad_input.h"

using namespace ptrain;
using namespace ptrain::test;
namespace fs = std::filesystem;

TEST_CASE("a dry run refuses what the real run refuses, and both write nothing", "[hardening]") {
  BadInputWorkspace ws;
  REQUIRE(ws.train().exit_code == 0);  // "r" exists: a new run of that name is refused
  write_file(ws.dir / "ck-file", "x\n");
  write_file(ws.dir / "bad.bin", "not an llm.c model file, though longer than nothing at all\n");
  std::string bad_magic = read_file(ws.dir / "data/train_000000.bin");
  bad_magic[0] = 'X';
  fs::create_directories(ws.dir / "magic");
  write_file(ws.dir / "magic/train_000000.bin", bad_magic);
  REQUIRE(::mkfifo((ws.dir / "fifo_000000.bin").c_str(), 0644) == 0);
  const auto before = ws.snapshot();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--set run.name=n --set data.train=missing_*.bin", "data.train"},
      {"--set run.name=n --set data.train=magic/train_*.bin", "magic"},
      {"", "already exists"},
      {"--set run.name=n --set model.init_from=bad.bin", "model.init_from"},
      {"--set run.name=n --set model.init_from=absent.bin", "absent.bin"},
      {"--set run.name=n --set checkpoint.resume=runs/r/checkpoints/step_00000009", "checkpoint.resume"},
      {"--set run.name=n --set checkpoint.dir=ck-file", "checkpoint.dir"},
      {"--set run.name=n --set data.train=fifo_*.bin", "FIFO"},
      {"--set run.name=" + std::string(260, 'x'), "run.name"},
      {"--set run.name=n --set model.n_layer=1024 --set model.n_embd=65536 --set model.n_head=1", "memory"},
      // The attention buffer's size (L x B x heads x T^2) past 2^63 bytes: an estimate that must not wrap.
      {"--set run.name=n --set model.n_layer=1024 --set model.n_embd=2048 --set model.n_head=2048 "
       "--set model.seq_len=1048576 --set training.batch_tokens=4194304 --set training.micro_batch=4", "memory"},
      {"--set run.name=n --set training.batch_tokens=4294967296", "accumulation steps"},
      {"--set run.name=n --set data=null --set 'data.synthetic={vocab: 64, tokens: 5000, order: 100000}'",
       "data.synthetic.order"},
  };
  for (const auto& [flags, names] : cases) {
    INFO(flags);
    expect_refused(ws, before, ws.train("--dry-run " + flags, "timeout 60"), 2, {names});
    expect_refused(ws, before, ws.train(flags, "timeout 60"), 2, {names});
  }
}

TEST_CASE("a file-size limit while generating the synthetic corpus is exit 1 and leaves no run directory", "[hardening]") {
  BadInputWorkspace ws;
  write_file(ws.dir / "synth.yaml",
             "run: {name: s}\nmodel: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 64}\n"
             "data: {synthetic: {vocab: 64, tokens: 400000}}\n");
  // An 800 KB train shard under a 100 KB limit: the write fails with EFBIG, as a full disk fails
  // it with ENOSPC. SIGXFSZ is ignored here as ptrain ignores it itself.
  const CommandResult r = run_shell("cd '" + ws.dir.string() + "' && ulimit -f 100 && '" PTRAIN_BINARY "' train synth.yaml");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("train_000000.bin") != std::string::npos);
  CHECK(r.output.find("File too large") != std::string::npos);
  CHECK_FALSE(fs::exists(ws.dir / "runs/s"));  // a corrected rerun is not refused as "already exists"
}

TEST_CASE("a log that cannot be written stops the run with exit 1 naming the file", "[hardening]") {
  // metrics.jsonl grows past a 8 KB file-size limit (16 blocks of 512 bytes in sh) after a few
  // dozen steps; config.yaml (under 4 KB) is written first.
  BadInputWorkspace ws;
  const CommandResult r = run_shell("cd '" + ws.dir.string() + "' && ulimit -f 16 && '" PTRAIN_BINARY
                                    "' train run.yaml --set training.steps=400 --set checkpoint.save_final=false");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("cannot write") != std::string::npos);
  CHECK((r.output.find("metrics.jsonl") != std::string::npos || r.output.find("log.txt") != std::string::npos));
  CHECK(r.output.find("File too large") != std::string::npos);
  CHECK(r.output.find("done:") == std::string::npos);
}

TEST_CASE("a corpus of more shards than open files allowed is exit 1, saying which limit", "[hardening]") {
  BadInputWorkspace ws;
  const std::string shard = read_file(ws.dir / "data/train_000000.bin");
  for (int i = 1; i < 40; ++i) write_file(ws.dir / ("data/train_" + std::to_string(100000 + i) + ".bin"), shard);
  const auto before = ws.snapshot();
  const CommandResult r = run_shell("cd '" + ws.dir.string() + "' && ulimit -n 24 && '" PTRAIN_BINARY "' train run.yaml");
  expect_refused(ws, before, r, 1, {"Too many open files", "ulimit -n"});
}

TEST_CASE("a loss that is not finite at step 1 stops the run (the divergence guard, exit 4), saying why",
          "[hardening]") {
  BadInputWorkspace ws;
  // Even with training.guard.action: skip: no skipped update can change the initial weights. The
  // non-finite loss by construction (an init_std that would overflow is refused while planning).
  const CommandResult r = ws.train("--set training.guard.action=skip", "PTRAIN_TEST_FAULT=loss:1:nan");
  INFO(r.output);
  CHECK(r.exit_code == 4);
  CHECK(r.output.find("the loss of step 1 is") != std::string::npos);
  CHECK(r.output.find("model.init_std") != std::string::npos);
  CHECK_FALSE(fs::exists(ws.run() / "checkpoints/latest"));
  const CommandResult huge = ws.train("--set run.name=huge --set model.init_std=1e38");
  CHECK(huge.exit_code == 2);
  CHECK(huge.output.find("model.init_std: 1e38 is out of range") != std::string::npos);
}

TEST_CASE("a shard truncated while training reads it is an error naming it, not SIGBUS", "[hardening]") {
  BadInputWorkspace ws;
  const std::string script =
      "cd '" + ws.dir.string() + "' && ('" PTRAIN_BINARY
      "' train run.yaml --set training.steps=100000 > out.txt 2>&1 & pid=$!; "
      "while ! grep -q '\"loss\"' runs/r/metrics.jsonl 2>/dev/null; do sleep 0.05; done; "
      "truncate -s 1100 data/train_000000.bin; wait $pid; echo rc=$?)";
  const CommandResult r = run_shell(script);
  const std::string log = read_file(ws.dir / "out.txt");
  INFO(r.output << log);
  CHECK(r.output.find("rc=2") != std::string::npos);  // 135 would be SIGBUS
  CHECK(log.find("data.train") != std::string::npos);
  CHECK(log.find("train_000000.bin") != std::string::npos);
  CHECK(log.find("expected it not to change while ptrain reads it") != std::string::npos);
}
