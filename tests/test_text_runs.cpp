// Runs on tokenized text, through the real binary: `train` checks the shards' tokenizer record
// against data.tokenizer and model.vocab_size (and warns about shards without one), the
// checkpoint records the tokenizer, and `sample` encodes the prompt and decodes with it.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "core/utf8.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ptrain::test;

namespace {

// A directory with Moby-Dick's first 200 kB prepared both ways: bytes/ and gpt2/.
struct TextWorkspace {
  TempDir tmp{"text"};
  const fs::path& dir = tmp.dir;
  TextWorkspace() {
    const std::string book = read_file(fs::path(ptrain::data_cache_dir()) / "text/moby-dick.txt");
    REQUIRE(book.size() > 200000);
    write_file(dir / "book.txt", book.substr(0, 200000));
    for (const char* t : {"bytes", "gpt2"}) {
      const CommandResult r =
          run_ptrain(std::string("data prepare --input book.txt --out ") + t + " --tokenizer " + t, dir);
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
    }
  }
  CommandResult train(const std::string& data, int vocab, const std::string& flags = "",
                      const std::string& logging = "") const {
    write_file(dir / "run.yaml",
               "run: {name: r, out_dir: runs, overwrite: true}\n"
               "model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: " +
                   std::to_string(vocab) + "}\n" + data +
                   "training: {steps: 2, batch_tokens: 64, micro_batch: 4, eval_batches: 2, eval_every: 0}\n" +
                   (logging.empty() ? "" : "logging: {" + logging + "}\n"));
    return run_ptrain("train run.yaml " + flags, dir);
  }
};

std::string shards(const std::string& dir, const std::string& extra = "") {
  return "data: {train: \"" + dir + "/" + dir + "_train_*.bin\", val: \"" + dir + "/" + dir + "_val_*.bin\"" + extra +
         "}\n";
}

void expect_refused(const CommandResult& r, std::initializer_list<const char*> words) {
  INFO(r.output);
  CHECK(r.exit_code == 2);
  for (const char* w : words) CHECK_THAT(r.output, Catch::Contains(w));
}

}  // namespace

TEST_CASE("train checks the shards' tokenizer against data.tokenizer and model.vocab_size", "[text]") {
  TextWorkspace ws;
  expect_refused(ws.train(shards("gpt2", ", tokenizer: bytes"), 50257, "--dry-run"),
                 {"data.tokenizer is bytes", "made by gpt2", "ptrain-tokenizer.json"});
  expect_refused(ws.train(shards("gpt2"), 256, "--dry-run"), {"model.vocab_size is 256", "50257"});
  // A train split of one tokenizer beside a val split of another.
  expect_refused(ws.train("data: {train: \"gpt2/gpt2_train_*.bin\", val: \"bytes/bytes_val_*.bin\"}\n", 50257,
                          "--dry-run"),
                 {"bytes", "gpt2", "one tokenizer"});
  const CommandResult ok = ws.train(shards("gpt2"), 50257, "--dry-run");
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.output, Catch::Contains("tokenizer gpt2"));
  CHECK_FALSE(fs::exists(ws.dir / "runs"));

  // llm.c's shards carry no record: accepted, with a warning saying what was assumed.
  fs::remove(ws.dir / "gpt2/ptrain-tokenizer.json");
  const CommandResult llmc = ws.train(shards("gpt2"), 50257, "--dry-run");
  INFO(llmc.output);
  CHECK(llmc.exit_code == 0);
  CHECK_THAT(llmc.output, Catch::Contains("no ptrain-tokenizer.json") && Catch::Contains("taking them as gpt2"));
}

TEST_CASE("sample encodes the prompt and decodes with the run's tokenizer", "[text]") {
  TextWorkspace ws;
  for (const auto& [tokenizer, vocab] : {std::pair<std::string, int>{"bytes", 256}, {"gpt2", 50257}}) {
    const CommandResult run = ws.train(shards(tokenizer), vocab);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    const fs::path ckpt = ws.dir / "runs/r/checkpoints/step_00000002";
    const nlohmann::json state = nlohmann::json::parse(read_file(ckpt / "state.json"));
    CHECK(state["tokenizer"] == tokenizer);
    const std::string args = "sample --checkpoint " + ckpt.string() + " --prompt 'Call me Ishmael' --tokens 40 --seed 3";
    const CommandResult a = run_ptrain(args, ws.dir), b = run_ptrain(args, ws.dir);
    INFO(a.output);
    REQUIRE(a.exit_code == 0);
    CHECK(a.output == b.output);  // deterministic for a seed
    CHECK(a.output.rfind("Call me Ishmael", 0) == 0);
    // Decoded text, not space-separated ids.
    CHECK(a.output.substr(15).find_first_not_of("0123456789 \n") != std::string::npos);
  }
}

TEST_CASE("train's samples draw only ids the tokenizer has, from a padded GPT-2 vocabulary", "[text]") {
  TextWorkspace ws;
  // 50304: GPT-2's vocabulary padded as llm.c pads it; ids 50257.. have no text.
  // A prompt that is not UTF-8 (YAML cannot hold one; --set can) is refused before the run starts.
  const CommandResult bad =
      ws.train(shards("gpt2"), 50257, "--set \"logging.sample_prompt=$(printf 'a\\377')\"", "sample_every: 1");
  INFO(bad.output);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("logging.sample_prompt") && Catch::Contains("invalid UTF-8"));
  CHECK_FALSE(fs::exists(ws.dir / "runs"));
  const CommandResult r = ws.train(shards("gpt2"), 50304, "", "sample_every: 1, sample_tokens: 200");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(count_of(r.output, "sample step ") == 2);
}

TEST_CASE("train prints samples every logging.sample_every steps, the losses bit-identical without them", "[text]") {
  TextWorkspace ws;
  auto losses = [&](const std::string& logging, std::string& output) {
    write_file(ws.dir / "run.yaml",
               "run: {name: r, out_dir: runs, overwrite: true}\n"
               "model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 256}\n" + shards("bytes") +
                   "training: {steps: 6, batch_tokens: 64, micro_batch: 4, eval_batches: 2, eval_every: 3}\n"
                   "logging: {every: 1" + logging + "}\n");
    const CommandResult r = run_ptrain("train run.yaml", ws.dir);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    output = r.output;
    std::vector<std::string> out;
    for (const nlohmann::json& m : read_metrics(ws.dir / "runs/r/metrics.jsonl"))
      for (const char* key : {"loss", "val_loss", "grad_norm"})
        if (m.contains(key)) out.push_back(std::string(key) + " " + m[key].dump());
    return out;
  };
  std::string with_output, without_output;
  const std::vector<std::string> with = losses(", sample_every: 2, sample_tokens: 12, sample_prompt: \"Call me\"", with_output);
  const std::vector<std::string> without = losses("", without_output);
  CHECK(with.size() >= 14);  // 6 losses and norms, 3 evaluations
  CHECK(with == without);
  CHECK(count_of(with_output, "sample step ") == 3);
  CHECK_THAT(with_output, Catch::Contains("sample step 4 (temperature 0.8):\nCall me"));
  CHECK(count_of(without_output, "sample step ") == 0);
}

TEST_CASE("logging.sample_temperature 0 prints the greedy continuation: the one `ptrain sample --temperature 0` "
          "gives from that step's checkpoint",
          "[text]") {
  TextWorkspace ws;
  write_file(ws.dir / "run.yaml",
             "run: {name: r, out_dir: runs}\n"
             "model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 256}\n" + shards("bytes") +
                 "training: {steps: 4, batch_tokens: 64, micro_batch: 4, eval_batches: 2, eval_every: 0}\n"
                 "checkpoint: {every: 4}\n"
                 "logging: {sample_every: 4, sample_tokens: 20, sample_temperature: 0, sample_prompt: \"Call me\"}\n");
  const CommandResult r = run_ptrain("train run.yaml", ws.dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string head = "sample step 4 (temperature 0):\n";
  const size_t at = r.output.find(head);
  REQUIRE(at != std::string::npos);
  const CommandResult sampled =
      run_ptrain("sample --checkpoint runs/r/checkpoints/step_00000004 --prompt \"Call me\" --tokens 20 --temperature 0",
                 ws.dir);
  INFO(sampled.output);
  REQUIRE(sampled.exit_code == 0);
  // The log shows the sample with invalid UTF-8 replaced; `sample` writes the bytes as they come.
  const std::string expected = ptrain::replace_invalid_utf8(sampled.output);
  CHECK(expected.size() > std::string("Call me\n").size());
  CHECK(r.output.compare(at + head.size(), expected.size(), expected) == 0);
  // Out of range: bad input naming the key.
  const CommandResult refused = run_ptrain("train run.yaml --set run.name=bad --set logging.sample_temperature=-1", ws.dir);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Contains("logging.sample_temperature"));
  CHECK(!fs::exists(ws.dir / "runs/bad"));
}

TEST_CASE("resuming refuses shards made by another tokenizer than the checkpoint's", "[text]") {
  TextWorkspace ws;
  const CommandResult first = ws.train(shards("gpt2"), 50257);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  // bytes shards fit a 50257-token model too: only the tokenizer tells them apart.
  for (const char* dry : {"--dry-run", ""}) {
    INFO(dry);
    expect_refused(ws.train(shards("bytes"), 50257, std::string("--set run.overwrite=false --set checkpoint.resume=auto ") + dry),
                   {"checkpoint.resume", "trained on gpt2 tokens", "bytes"});
  }
  const CommandResult same = ws.train(shards("gpt2"), 50257, "--set run.overwrite=false --set checkpoint.resume=auto --set training.steps=3");
  INFO(same.output);
  CHECK(same.exit_code == 0);
}

TEST_CASE("data.vocab names the vocabulary the shards were made with", "[text]") {
  TextWorkspace ws;
  const std::string cache = ptrain::data_cache_dir();
  const CommandResult prepared =
      run_ptrain("data prepare --input book.txt --out hf --tokenizer gpt2 --vocab " + cache + "/gpt2-hf", ws.dir);
  INFO(prepared.output);
  REQUIRE(prepared.exit_code == 0);
  // Without it the samples cannot know the files: they print ids, and say so.
  const CommandResult unnamed = ws.train(shards("hf"), 50257, "--dry-run", "sample_every: 1");
  INFO(unnamed.output);
  CHECK(unnamed.exit_code == 0);
  CHECK_THAT(unnamed.output, Catch::Contains("samples print token ids"));
  const CommandResult named =
      ws.train(shards("hf", ", vocab: " + cache + "/gpt2-hf"), 50257, "--dry-run", "sample_every: 1, sample_prompt: Call");
  INFO(named.output);
  CHECK(named.exit_code == 0);
  CHECK_THAT(named.output, !Catch::Contains("samples print token ids"));
  expect_refused(ws.train(shards("hf", ", vocab: " + cache + "/gpt2/r50k_base.tiktoken"), 50257, "--dry-run"),
                 {"data.vocab", "is not the vocabulary the shards", "ptrain-tokenizer.json"});
  expect_refused(ws.train(shards("bytes", ", vocab: " + cache + "/gpt2-hf"), 256, "--dry-run"),
                 {"data.vocab", "tokenizer is bytes"});
  expect_refused(ws.train(shards("hf", ", vocab: " + cache + "/missing"), 50257, "--dry-run"),
                 {"gpt2 vocabulary", "missing", "not found"});
  CHECK_FALSE(fs::exists(ws.dir / "runs"));
}

TEST_CASE("the checkpoint records its vocabulary's SHA-256: sample, export and resume refuse another by hash",
          "[text]") {
  TextWorkspace ws;
  const std::string cache = ptrain::data_cache_dir();
  // The same tokenizer with its own vocabulary files (GPT-2's, as Hugging Face's vocab.json and
  // merges.txt): another SHA-256 than the default r50k_base.tiktoken.
  REQUIRE(run_ptrain("data prepare --input book.txt --out hf --tokenizer gpt2 --vocab " + cache + "/gpt2-hf", ws.dir)
              .exit_code == 0);
  const CommandResult trained = ws.train(shards("hf"), 50257);
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);
  const fs::path checkpoint = ws.dir / "runs/r/checkpoints/step_00000002";
  const nlohmann::json state = nlohmann::json::parse(read_file(checkpoint / "state.json"));
  const nlohmann::json record = nlohmann::json::parse(read_file(ws.dir / "hf/ptrain-tokenizer.json"));
  CHECK(state["vocabulary_sha256"] == record["vocabulary_sha256"]);

  const std::string hf_sha = record["vocabulary_sha256"];
  expect_refused(run_ptrain("sample --checkpoint " + checkpoint.string() + " --tokens 2", ws.dir),
                 {"the default gpt2 vocabulary", "r50k_base.tiktoken", hf_sha.c_str(), "--vocab"});
  const CommandResult named =
      run_ptrain("sample --checkpoint " + checkpoint.string() + " --tokens 2 --prompt Call --vocab " + cache + "/gpt2-hf",
                 ws.dir);
  INFO(named.output);
  CHECK(named.exit_code == 0);
  expect_refused(run_ptrain("export --format hf --checkpoint " + checkpoint.string() + " --out hf-export", ws.dir),
                 {"SHA-256", hf_sha.c_str()});
  CHECK_FALSE(fs::exists(ws.dir / "hf-export"));

  // Resumed on the shards of the default vocabulary: same tokenizer, other ids.
  const std::string before = read_file(checkpoint / "weights.safetensors");
  expect_refused(ws.train(shards("gpt2"), 50257, "--set checkpoint.resume=auto --set run.overwrite=false"),
                 {"checkpoint.resume", hf_sha.c_str(), "ptrain-tokenizer.json", "the checkpoint's vocabulary"});
  CHECK(read_file(checkpoint / "weights.safetensors") == before);

  // Resumed on its own shards without their record (as llm.c's come): the checkpoints after it
  // still know the vocabulary.
  const std::string record_text = read_file(ws.dir / "hf/ptrain-tokenizer.json");
  fs::remove(ws.dir / "hf/ptrain-tokenizer.json");
  const CommandResult resumed = ws.train(shards("hf", ", tokenizer: gpt2"), 50257,
                                         "--set checkpoint.resume=auto --set run.overwrite=false --set training.steps=3");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const nlohmann::json later =
      nlohmann::json::parse(read_file(ws.dir / "runs/r/checkpoints/step_00000003/state.json"));
  CHECK(later["vocabulary_sha256"] == hf_sha);
  CHECK(later["tokenizer"] == "gpt2");

  // eval measures the checkpoint on val shards of its own tokenizer and vocabulary only.
  write_file(ws.dir / "hf/ptrain-tokenizer.json", record_text);
  const auto eval_on = [&](const std::string& split) {
    write_file(ws.dir / "eval.yaml", read_file(ws.dir / "run.yaml"));
    return run_ptrain("eval eval.yaml --checkpoint " + checkpoint.string() + " --set data.val=\"" + split +
                          "/" + split + "_val_*.bin\"",
                      ws.dir);
  };
  const CommandResult own = eval_on("hf");
  INFO(own.output);
  CHECK(own.exit_code == 0);
  expect_refused(eval_on("gpt2"), {"data.val", "ptrain-tokenizer.json", hf_sha.c_str(), "the checkpoint's vocabulary"});
  expect_refused(eval_on("bytes"), {"data.val", "made by bytes", "trained on gpt2 tokens"});
}

TEST_CASE("a Llama model on Llama 3's 128,256-token vocabulary trains from uint32 shards, resumes bit-exactly, "
          "samples text and exports its tokenizer",
          "[text]") {
  TempDir tmp("llama3");
  const fs::path& dir = tmp.dir;
  const std::string book = read_file(fs::path(ptrain::data_cache_dir()) / "text/moby-dick.txt");
  write_file(dir / "book.txt", book.substr(0, 100000));
  const CommandResult prepared = run_ptrain("data prepare --input book.txt --out l3 --tokenizer llama3", dir);
  INFO(prepared.output);
  REQUIRE(prepared.exit_code == 0);
  // llm.c's uint32 header: magic 20240801, version 7.
  const std::string shard = read_file(dir / "l3/l3_train_000000.bin");
  int32_t header[2];
  std::memcpy(header, shard.data(), sizeof header);
  CHECK(header[0] == 20240801);
  CHECK(header[1] == 7);

  const auto train = [&](const std::string& name, const std::string& flags) {
    write_file(dir / "run.yaml",
               "run: {name: " + name + ", out_dir: runs}\n"
               "model: {arch: llama, n_layer: 1, n_head: 2, n_kv_head: 1, n_embd: 16, mlp_hidden: 32, seq_len: 16, "
               "vocab_size: 128256}\n"
               "data: {train: \"l3/l3_train_*.bin\", val: \"l3/l3_val_*.bin\", tokenizer: llama3}\n"
               "training: {steps: 4, batch_tokens: 64, micro_batch: 4, eval_batches: 1, eval_every: 0}\n"
               "checkpoint: {every: 2}\n");
    return run_ptrain("train run.yaml " + flags, dir);
  };
  const CommandResult whole = train("whole", "");
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);
  CHECK_THAT(whole.output, Catch::Contains("uint32"));
  const CommandResult first = train("parts", "--set training.steps=2");
  REQUIRE(first.exit_code == 0);
  const CommandResult resumed = train("parts", "--set checkpoint.resume=auto --set run.overwrite=false");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const auto a = losses_by_step(dir / "runs/whole/metrics.jsonl"), b = losses_by_step(dir / "runs/parts/metrics.jsonl");
  REQUIRE(a.size() == 4);
  CHECK(a == b);  // bit for bit: the losses are printed in full

  const fs::path ckpt = dir / "runs/whole/checkpoints/step_00000004";
  CHECK(nlohmann::json::parse(read_file(ckpt / "state.json"))["tokenizer"] == "llama3");
  const CommandResult sampled =
      run_ptrain("sample --checkpoint " + ckpt.string() + " --prompt 'Call me Ishmael' --tokens 20 --seed 3", dir);
  INFO(sampled.output);
  REQUIRE(sampled.exit_code == 0);
  CHECK(sampled.output.rfind("Call me Ishmael", 0) == 0);
  const CommandResult exported = run_ptrain("export --format hf --checkpoint " + ckpt.string() + " --out hf", dir);
  INFO(exported.output);
  REQUIRE(exported.exit_code == 0);
  // The export's tokenizer.json is Llama 3's file itself (tests/oracle loads it in Hugging Face's tokenizers).
  CHECK(read_file(dir / "hf/tokenizer.json") == read_file(ptrain::default_vocabulary("llama3")));
  CHECK(nlohmann::json::parse(read_file(dir / "hf/config.json"))["bos_token_id"] == 128000);
}
