// The output rule (src/train/output_policy.h) through the real binary: every command that writes
// a path it is given refuses what it did not make, before any work, leaving every file as it was;
// --force replaces only the same command's earlier output. And where checkpoint.dir and run
// directories may go.
#include <catch2/catch.hpp>

#include <filesystem>

#include "bad_input.h"

using namespace ptrain;
using namespace ptrain::test;
namespace fs = std::filesystem;

namespace {

// A trained run r (checkpoint at step 3), a synthetic corpus, a prepared corpus and a user's file.
struct OutputWorkspace : BadInputWorkspace {
  std::string ck;
  OutputWorkspace() {
    REQUIRE(train().exit_code == 0);
    ck = (run() / "checkpoints/step_00000003").string();
    REQUIRE(ptrain("data synth --out synth --vocab 64 --tokens 4000").exit_code == 0);
    write_file(dir / "text.txt", "The quick brown fox jumps over the lazy dog. Again and again.\n");
    REQUIRE(ptrain("data prepare --input text.txt --out prepared --tokenizer bytes --val-tokens 8").exit_code == 0);
    fs::create_directories(dir / "mine");
    write_file(dir / "mine/notes.txt", "a user's own file");
  }
};

}  // namespace

TEST_CASE("commands that write a path they are given never overwrite what they did not make", "[hardening]") {
  OutputWorkspace ws;
  const auto before = ws.snapshot();
  const std::string run = ws.run().string();
  const std::vector<std::string> not_theirs = {
      ws.ck + "/weights.safetensors", ws.ck + "/state.json", run + "/checkpoints/latest", run + "/log.txt",
      run + "/metrics.jsonl", "data/train_000000.bin", "synth/synthetic.json", "prepared/ptrain-tokenizer.json",
      "run.yaml", "mine/notes.txt"};
  for (const std::string& target : not_theirs) {
    for (const std::string force : {"", " --force"}) {
      INFO(target << force);
      expect_refused(ws, before, ws.ptrain("export --checkpoint " + ws.ck + " --out " + target + force), 2, {"--out"});
      expect_refused(ws, before, ws.ptrain("eval run.yaml --checkpoint " + ws.ck + " --dump-logits " + target + force), 2,
                     {"--dump-logits"});
    }
  }
  // Directories: a run, a checkpoint, a data directory, a user's directory, or a place inside one.
  const std::vector<std::string> dirs = {run, ws.ck, "data", "synth/more", "prepared", "mine", run + "/exported"};
  for (const std::string& target : dirs) {
    for (const std::string force : {"", " --force"}) {
      INFO(target << force);
      expect_refused(ws, before, ws.ptrain("export --checkpoint " + ws.ck + " --format hf --out " + target + force), 2,
                     {"--out"});
      expect_refused(ws, before, ws.ptrain("data synth --out " + target + " --vocab 64 --tokens 4000" + force), 2,
                     {"--out"});
      expect_refused(ws, before, ws.ptrain("compare " + run + " " + run + " --out " + target + force), 2, {"--out"});
      expect_refused(ws, before, ws.ptrain("data hf-tokenizer --tokenizer bytes --out " + target + force), 2,
                     {"--out"});
    }
  }
  expect_refused(ws, before, ws.ptrain("data prepare --input text.txt --out " + ws.ck + "/prepared"), 2,
                 {"--out", "inside the checkpoint"});
  // What the messages say: where it is, and what was expected.
  const CommandResult in_ck = ws.ptrain("export --checkpoint " + ws.ck + " --out " + ws.ck + "/weights.safetensors");
  CHECK_THAT(in_ck.output, Catch::Contains("is inside the checkpoint") &&
                               Catch::Contains("expected a path outside ptrain's checkpoint, run and data directories"));
  const CommandResult mine = ws.ptrain("data synth --out mine --force");
  CHECK_THAT(mine.output, Catch::Contains("--out \"mine\" is not an earlier output of ptrain data synth"));
}

TEST_CASE("a command's --force replaces its own earlier output and nothing else", "[hardening]") {
  OutputWorkspace ws;
  REQUIRE(ws.ptrain("export --checkpoint " + ws.ck + " --out model.bin").exit_code == 0);
  REQUIRE(ws.ptrain("eval run.yaml --checkpoint " + ws.ck + " --dump-logits logits.json").exit_code == 0);
  REQUIRE(ws.ptrain("data hf-tokenizer --tokenizer bytes --out tok").exit_code == 0);
  const auto before = ws.snapshot();
  expect_refused(ws, before, ws.ptrain("data hf-tokenizer --tokenizer bytes --out tok"), 2, {"not empty", "--force"});
  expect_refused(ws, before, ws.ptrain("data hf-tokenizer --tokenizer bytes --out synth --force"), 2,
                 {"not an earlier output of ptrain data hf-tokenizer"});
  expect_refused(ws, before, ws.ptrain("data hf-tokenizer --tokenizer p50k_base --out fresh"), 2, {"--tokenizer"});
  expect_refused(ws, before, ws.ptrain("export --checkpoint " + ws.ck + " --out model.bin"), 2,
                 {"--out \"model.bin\" exists", "--force"});
  expect_refused(ws, before, ws.ptrain("eval run.yaml --checkpoint " + ws.ck + " --dump-logits logits.json"), 2,
                 {"--dump-logits \"logits.json\" exists", "--force"});
  expect_refused(ws, before, ws.ptrain("data synth --out synth --vocab 64 --tokens 4000"), 2, {"not empty", "--force"});
  // Each command's own output only: an llm.c file is not a logits dump, nor the reverse.
  expect_refused(ws, before, ws.ptrain("export --checkpoint " + ws.ck + " --out logits.json --force"), 2,
                 {"not an earlier output of ptrain export --format llmc"});
  expect_refused(ws, before, ws.ptrain("eval run.yaml --checkpoint " + ws.ck + " --dump-logits model.bin --force"), 2,
                 {"not an earlier output of ptrain eval --dump-logits"});
  expect_refused(ws, before, ws.ptrain("data synth --out prepared --vocab 64 --tokens 4000 --force"), 2,
                 {"not an earlier output of ptrain data synth"});
  expect_refused(ws, before, ws.ptrain("eval run.yaml --checkpoint " + ws.ck + " --force"), 2, {"--force", "--dump-logits"});

  CHECK(ws.ptrain("export --checkpoint " + ws.ck + " --out model.bin --force --dtype bf16").exit_code == 0);
  CHECK(read_file(ws.dir / "model.bin").size() < before.at("model.bin").size());  // now bf16
  CHECK(ws.ptrain("eval run.yaml --checkpoint " + ws.ck + " --dump-logits logits.json --force").exit_code == 0);
  CHECK(read_file(ws.dir / "logits.json") == before.at("logits.json"));  // the same logits again
  CHECK(ws.ptrain("data synth --out synth --vocab 64 --tokens 5000 --force").exit_code == 0);
  CHECK(read_file(ws.dir / "synth/train_000000.bin") != before.at("synth/train_000000.bin"));
  CHECK(ws.ptrain("data hf-tokenizer --tokenizer bytes --out tok --max-length 64 --force").exit_code == 0);
  CHECK_THAT(read_file(ws.dir / "tok/tokenizer_config.json"), Catch::Contains("\"model_max_length\": 64"));
  CHECK_FALSE(before.at("tok/tokenizer_config.json").find("model_max_length") != std::string::npos);
  // A tokenizer from elsewhere with the same file names (a Hub download: more keys in its config).
  fs::create_directories(ws.dir / "hub");
  for (const char* file : {"tokenizer.json", "special_tokens_map.json"}) write_file(ws.dir / "hub" / file, "{}");
  write_file(ws.dir / "hub/tokenizer_config.json",
             R"({"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": false})");
  const auto with_hub = ws.snapshot();
  expect_refused(ws, with_hub, ws.ptrain("data hf-tokenizer --tokenizer bytes --out hub --force"), 2,
                 {"not an earlier output of ptrain data hf-tokenizer"});
  // ... whose config holds a chat template longer than any ptrain writes.
  write_file(ws.dir / "hub/tokenizer_config.json",
             R"({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": ")" + std::string(70000, 'x') + "\"}");
  const auto with_template = ws.snapshot();
  expect_refused(ws, with_template, ws.ptrain("data hf-tokenizer --tokenizer bytes --out hub --force"), 2,
                 {"not an earlier output of ptrain data hf-tokenizer"});
}

TEST_CASE("outputs are planned whole: a missing directory or a link is refused before any work", "[hardening]") {
  OutputWorkspace ws;
  fs::create_symlink("run.yaml", ws.dir / "link.bin");
  const auto before = ws.snapshot();
  for (const std::string force : {"", " --force"}) {
    const CommandResult no_dir = ws.ptrain("eval run.yaml --checkpoint " + ws.ck + " --dump-logits nodir/l.json" + force);
    expect_refused(ws, before, no_dir, 2, {"--dump-logits \"nodir/l.json\"", "does not exist"});
    CHECK(no_dir.output.find("val_loss") == std::string::npos);  // refused before evaluating
    expect_refused(ws, before, ws.ptrain("export --checkpoint " + ws.ck + " --out nodir/m.bin" + force), 2,
                   {"does not exist"});
    expect_refused(ws, before, ws.ptrain("export --checkpoint " + ws.ck + " --out link.bin" + force), 2,
                   {"--out \"link.bin\" is a symbolic link"});
  }
  // The place checked is the place written: ".." after a missing directory lands in runs/, a
  // trailing "/" does not make a link a directory of its own.
  fs::create_directory_symlink("mine", ws.dir / "mine-link");
  const auto with_link = ws.snapshot();
  for (const std::string force : {"", " --force"}) {
    expect_refused(ws, with_link, ws.ptrain("export --checkpoint " + ws.ck + " --format hf --out runs/typo/.." + force), 2,
                   {"--out \"runs/typo/..\""});
    expect_refused(ws, with_link, ws.ptrain("data synth --out runs/typo/.. --vocab 64 --tokens 4000" + force), 2,
                   {"--out \"runs/typo/..\""});
    expect_refused(ws, with_link, ws.ptrain("export --checkpoint " + ws.ck + " --format hf --out mine-link/" + force), 2,
                   {"--out \"mine-link/\" is a symbolic link"});
  }
  // Files with common names are ptrain's only when ptrain wrote them: another tool's state.json
  // and latest in a project directory do not make it a checkpoint.
  fs::create_directories(ws.dir / "project");
  write_file(ws.dir / "project/state.json", "{\"format\": \"another tool\"}");
  write_file(ws.dir / "project/latest", "v2\n");
  CHECK(ws.ptrain("export --checkpoint " + ws.ck + " --out project/model.bin").exit_code == 0);
  // A directory output's missing parents are made.
  CHECK(ws.ptrain("data synth --out new/deeper/synth --vocab 64 --tokens 4000").exit_code == 0);
  CHECK(fs::exists(ws.dir / "new/deeper/synth/synthetic.json"));
}

TEST_CASE("checkpoint.dir and run directories stay out of directories ptrain manages for others", "[hardening]") {
  OutputWorkspace ws;
  const auto before = ws.snapshot();
  const std::string run = ws.run().string();
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--set checkpoint.dir=" + run, "is the run directory, not a checkpoint directory"},
      {"--set checkpoint.dir=" + run + "/mine", "is inside the run directory"},
      {"--set checkpoint.dir=synth", "is the data directory"},
      {"--set checkpoint.dir=prepared/ck", "is inside the data directory"},
      {"--set checkpoint.dir=" + ws.ck + "/more", "is inside the checkpoint"},
      {"--set checkpoint.dir=mine", "is a directory of other files"},
      {"--set run.out_dir=" + run, "is inside the run directory"},
      {"--set run.out_dir=" + ws.ck, "is inside the checkpoint"},
  };
  for (const auto& [flags, words] : refused) {
    for (const std::string dry : {"", " --dry-run"}) {
      INFO(flags << dry);
      expect_refused(ws, before, ws.train("--set run.name=other " + flags + dry), 2, {words});
    }
  }
  // This run's own directory may hold its checkpoint.dir.
  const CommandResult own = ws.train("--set run.name=other --set checkpoint.dir=runs/other/ck");
  INFO(own.output);
  CHECK(own.exit_code == 0);
  CHECK(fs::exists(ws.dir / "runs/other/ck/latest"));
}
