// `data prepare`: shards named and split as llm.c's scripts make them, <|endoftext|> before
// each document, ids independent of the thread count and equal to encoding each document
// alone, the tokenizer's record beside the shards, bad input refused with nothing written, and
// memory bounded whatever the corpus size.
#include <catch2/catch.hpp>

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/format.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "data/tokenizer_record.h"
#include "core/utf8.h"
#include "test_util.h"
#include "user_error.h"

namespace fs = std::filesystem;
using namespace ptrain;
using ptrain::test::CommandResult;
using ptrain::test::read_file;
using ptrain::test::run_ptrain;
using ptrain::test::TempDir;
using ptrain::test::user_error;
using ptrain::test::write_file;

extern char** environ;

namespace {

// A prepared shard's ids, which the tokenizers keep below 65,536: the GPT-2 format's uint16.
std::vector<uint32_t> shard_tokens(const std::string& path) {
  const TokenShard shard(path);
  REQUIRE(&shard.format() == &kUint16Shards);
  std::vector<uint32_t> tokens(static_cast<size_t>(shard.size()));
  shard.read(0, shard.size(), tokens.data());
  return {tokens.begin(), tokens.end()};
}

// The val split's tokens followed by the train split's: the corpus in order (val is its end).
std::vector<uint32_t> corpus_of(const PrepareResult& r) {
  std::vector<uint32_t> train, val;
  for (const std::string& f : r.files) {
    std::vector<uint32_t> t = shard_tokens(f);
    auto& split = f.find("_val_") != std::string::npos ? val : train;
    split.insert(split.end(), t.begin(), t.end());
  }
  train.insert(train.end(), val.begin(), val.end());
  return train;
}

const Tokenizer& gpt2() {
  static const Tokenizer t = Tokenizer::load("gpt2");
  return t;
}

PrepareOptions options(std::vector<std::string> inputs, const fs::path& out, const std::string& tokenizer = "gpt2") {
  PrepareOptions o;
  o.inputs = std::move(inputs);
  o.out_dir = out.string();
  o.tokenizer = tokenizer;
  return o;
}

// The peak resident memory of a command, in KiB (wait4's rusage: this child only).
long peak_rss_kib(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  REQUIRE(posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ) == 0);
  int status = 0;
  struct rusage usage {};
  REQUIRE(wait4(pid, &status, 0, &usage) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return usage.ru_maxrss;
}

}  // namespace

TEST_CASE("data prepare (bytes): llm.c's shard names, the val split at the end, a record", "[prepare]") {
  TempDir dir("prepare");
  std::string text;
  for (int i = 0; i < 100; ++i) text += static_cast<char>((i * 37 + 200) % 256);  // any bytes
  write_file(dir.dir / "a.txt", text.substr(0, 60));
  write_file(dir.dir / "b.txt", text.substr(60));
  PrepareOptions o = options({(dir.dir / "a.txt").string(), (dir.dir / "b.txt").string()}, dir.dir / "out/tiny", "bytes");
  o.shard_tokens = 32;
  const PrepareResult r = prepare_text(o);
  CHECK(r.train_tokens == 90);
  CHECK(r.val_tokens == 10);
  CHECK(r.documents == 2);
  const fs::path out = dir.dir / "out/tiny";
  CHECK(r.files == std::vector<std::string>{out / "tiny_val_000000.bin", out / "tiny_train_000000.bin",
                                            out / "tiny_train_000001.bin", out / "tiny_train_000002.bin"});
  CHECK(shard_tokens(out / "tiny_train_000002.bin").size() == 26);
  std::vector<uint32_t> bytes;
  for (const char c : text) bytes.push_back(static_cast<unsigned char>(c));
  CHECK(corpus_of(r) == bytes);
  const auto record = read_tokenizer_record(out.string());
  REQUIRE(record);
  CHECK(record->tokenizer == "bytes");
  CHECK(record->vocab_size == 256);
  CHECK(record->end_of_text == -1);
  CHECK(std::distance(fs::directory_iterator(out), fs::directory_iterator()) == 5);  // no staging left
}

TEST_CASE("data prepare (gpt2): <|endoftext|> before each document, files of directories sorted", "[prepare]") {
  TempDir dir("prepare");
  fs::create_directories(dir.dir / "docs/sub");
  fs::create_directories(dir.dir / "docs/.hidden");
  write_file(dir.dir / "docs/b.txt", "Second document.\n");
  write_file(dir.dir / "docs/a.txt", "Hello world, it's me.");
  write_file(dir.dir / "docs/sub/c.txt", "Third one===Fourth one======");  // empty documents add nothing
  write_file(dir.dir / "docs/sub/d.txt", "");
  write_file(dir.dir / "docs/.hidden/x.txt", "never read");
  PrepareOptions o = options({(dir.dir / "docs").string()}, dir.dir / "corpus");
  o.val_tokens = 3;
  o.separator = "===";
  const PrepareResult r = prepare_text(o);
  CHECK(r.documents == 4);
  std::vector<uint32_t> expected;
  for (const std::string doc : {"Hello world, it's me.", "Second document.\n", "Third one", "Fourth one"}) {
    expected.push_back(50256);
    const std::vector<uint32_t> ids = gpt2().encode(doc, "doc");
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  CHECK(corpus_of(r) == expected);
  CHECK(r.val_tokens == 3);
  CHECK(shard_tokens((dir.dir / "corpus/corpus_val_000000.bin").string()).size() == 3);
  const auto record = read_tokenizer_record((dir.dir / "corpus").string());
  REQUIRE(record);
  CHECK(record->tokenizer == "gpt2");
  CHECK(record->vocab_size == 50257);
  CHECK(record->end_of_text == 50256);
  CHECK(record->vocabulary_sha256 == kR50kBaseSha256);
}

TEST_CASE("data prepare (gpt2): the same ids on 1 and 2 threads, equal to each document encoded alone", "[prepare]") {
  // 10.8 MB in 233 files: one thread's reads (2 MiB) cut documents, two threads cut reads into parts.
  const fs::path sotu = fs::path(data_cache_dir()) / "text/sotu";
  REQUIRE(fs::exists(sotu));
  TempDir dir("prepare");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(sotu)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::string big;  // the addresses as one document, to cross many reads
  for (const std::string& f : files) big += read_file(f);
  write_file(dir.dir / "all.txt", big);

  PrepareOptions one = options({(dir.dir / "all.txt").string(), sotu.string()}, dir.dir / "one");
  one.threads = 1;
  PrepareOptions two = options({(dir.dir / "all.txt").string(), sotu.string()}, dir.dir / "two");
  two.threads = 2;
  const std::vector<uint32_t> a = corpus_of(prepare_text(one)), b = corpus_of(prepare_text(two));
  std::vector<uint32_t> expected = {50256};
  const std::vector<uint32_t> whole = gpt2().encode(big, "all.txt");
  expected.insert(expected.end(), whole.begin(), whole.end());
  for (const std::string& f : files) {
    expected.push_back(50256);
    const std::vector<uint32_t> ids = gpt2().encode(read_file(f), f);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  CHECK(a.size() == expected.size());
  CHECK(a == expected);
  CHECK(b == expected);
}

TEST_CASE("data prepare: invalid UTF-8 is refused with file and offset, or replaced when asked", "[prepare]") {
  TempDir dir("prepare");
  std::string text(3 << 20, 'a');  // past the first read
  for (size_t i = 100; i < text.size(); i += 100) text[i] = '\n';
  const size_t bad = (2 << 20) + 5;
  text[bad] = '\xFF';
  write_file(dir.dir / "bad.txt", text);
  write_file(dir.dir / "good.txt", "fine text\n");
  PrepareOptions o = options({(dir.dir / "good.txt").string(), (dir.dir / "bad.txt").string()}, dir.dir / "out");
  const std::string message = user_error([&] { prepare_text(o); });
  CHECK_THAT(message, Catch::Contains("bad.txt") && Catch::Contains("byte offset " + std::to_string(bad)) &&
                          Catch::Contains("--invalid-utf8 replace"));
  CHECK_FALSE(fs::exists(dir.dir / "out"));  // nothing written

  o.replace_invalid_utf8 = true;
  const std::vector<uint32_t> ids = corpus_of(prepare_text(o));
  std::vector<uint32_t> expected;
  for (const std::string& doc : {std::string("fine text\n"), replace_invalid_utf8(text)}) {
    expected.push_back(50256);
    const std::vector<uint32_t> part = gpt2().encode(doc, "doc");
    expected.insert(expected.end(), part.begin(), part.end());
  }
  CHECK(ids == expected);
}

TEST_CASE("numbers in messages read back as the value given: --val-fraction 0.9999999 is not shown as 1",
          "[prepare]") {
  CHECK(number_text(0.1) == "0.1");
  CHECK(number_text(0.9999999) == "0.9999999");
  CHECK(number_text(1e-05) == "1e-05");
  for (const double v : {0.9999999, 1.0 / 3.0, 2.5e-300, 123456789.125})
    CHECK(std::strtod(number_text(v).c_str(), nullptr) == v);
  TempDir dir("prepare-fraction");
  write_file(dir.dir / "t.txt", "a few words\n");
  PrepareOptions o = options({(dir.dir / "t.txt").string()}, dir.dir / "o", "bytes");
  o.val_fraction = 0.9999999;
  CHECK_THAT(user_error([&] { prepare_text(o); }), Catch::Contains("--val-fraction 0.9999999"));
}

TEST_CASE("data prepare: the staging directory a killed prepare left behind is named and removed by the next one",
          "[prepare]") {
  TempDir dir("prepare-leftover");
  write_file(dir.dir / "t.txt", "some words here, and more words\n");
  const fs::path out = dir.dir / "shards";
  // What a prepare killed after tokenizing leaves: its hidden staging directory, nothing else.
  fs::create_directories(out / ".prepare-partial");
  write_file(out / ".prepare-partial/tokens.tmp", std::string(4096, 'x'));
  const CommandResult r = run_ptrain("data prepare --input t.txt --out shards --tokenizer bytes", dir.dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("removed shards/.prepare-partial, left by a data prepare that was interrupted") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(out / ".prepare-partial"));
  CHECK(fs::exists(out / "shards_train_000000.bin"));
  // Beside anything else it is not taken for a leftover: the directory is refused, untouched.
  fs::create_directories(dir.dir / "mixed/.prepare-partial");
  write_file(dir.dir / "mixed/notes.txt", "mine");
  const CommandResult mixed = run_ptrain("data prepare --input t.txt --out mixed --tokenizer bytes", dir.dir);
  INFO(mixed.output);
  CHECK(mixed.exit_code == 2);
  CHECK(mixed.output.find("it holds \".prepare-partial\", \"notes.txt\"") != std::string::npos);
  CHECK(fs::exists(dir.dir / "mixed/.prepare-partial"));
}

TEST_CASE("data prepare: bad options and outputs are refused before anything is written", "[prepare]") {
  TempDir dir("prepare");
  write_file(dir.dir / "t.txt", std::string(1000, 'x') + " some words here\n");
  const std::string in = (dir.dir / "t.txt").string();
  auto refused = [&](PrepareOptions o, const std::vector<std::string>& words) {
    const std::string message = user_error([&] { prepare_text(o); });
    for (const std::string& w : words) CHECK_THAT(message, Catch::Contains(w));
  };
  fs::create_directories(dir.dir / "full");
  write_file(dir.dir / "full/old_train_000000.bin", "old");
  refused(options({in}, dir.dir / "full"), {"--out", "not empty (it holds \"old_train_000000.bin\")"});
  CHECK(read_file(dir.dir / "full/old_train_000000.bin") == "old");
  refused(options({(dir.dir / "missing.txt").string()}, dir.dir / "o"), {"missing.txt"});
  PrepareOptions o = options({in}, dir.dir / "o");
  o.val_fraction = 1.5;
  refused(o, {"--val-fraction"});
  o = options({in}, dir.dir / "o", "bytes");
  o.separator = "\n";
  refused(o, {"--separator", "bytes"});
  o = options({in}, dir.dir / "o");
  o.val_tokens = 100000;
  refused(o, {"tokens", "at least 2"});
  o = options({in}, dir.dir / "o");
  o.vocabulary = (dir.dir / "nothing.tiktoken").string();
  refused(o, {"nothing.tiktoken", "fetch-data.sh"});
  CHECK_FALSE(fs::exists(dir.dir / "o"));
  fs::create_directories(dir.dir / "empty");
  CHECK(prepare_text(options({in}, dir.dir / "empty")).files.size() == 2);  // an empty directory will do
}

TEST_CASE("data prepare streams: memory does not grow with the corpus", "[prepare]") {
  // 192 MB of text; the ptrain process's peak memory is compared with its size doing nothing.
  TempDir dir("prepare");
  const std::string sotu = read_file(fs::path(data_cache_dir()) / "text/sotu/1790_george_washington_n.txt");
  {
    std::ofstream big(dir.dir / "big.txt", std::ios::binary);
    for (int64_t written = 0; written < (192 << 20); written += static_cast<int64_t>(sotu.size())) big << sotu;
  }
  const long idle = peak_rss_kib({ptrain::test::ptrain_binary(), "--version"});
  const long busy = peak_rss_kib({ptrain::test::ptrain_binary(), "data", "prepare", "--input",
                                  (dir.dir / "big.txt").string(), "--out", (dir.dir / "big").string()});
  INFO("peak RSS idle " << idle << " KiB, preparing 192 MB " << busy << " KiB");
  CHECK(busy - idle < 64 * 1024);
  CHECK(fs::file_size(dir.dir / "big/big_train_000000.bin") > (20 << 20));
}
