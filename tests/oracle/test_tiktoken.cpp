// ptrain's GPT-2 tokenizer against tiktoken itself (its WebAssembly build under node): every
// Unicode code point in the contexts GPT-2's pattern distinguishes, random text, the golden
// file's edge cases (so the committed ids cannot go stale), a book and 233 speeches through
// `data prepare`, and invalid UTF-8 as `--invalid-utf8 replace` treats it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "core/utf8.h"
#include "gpt2_ids.h"
#include "oracle_texts.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ptrain;
using ptrain::test::gpt2;
using ptrain::test::gpt2_ids;
using ptrain::test::read_file;
using ptrain::test::TempDir;
using ptrain::test::write_file;

namespace {

void run_oracle(const std::string& args) { ptrain::test::run_node("tiktoken.js", args); }

// tiktoken's ids for each string.
std::vector<std::vector<int32_t>> tiktoken_ids(const std::vector<std::string>& strings, const fs::path& dir) {
  write_file(dir / "in.json", nlohmann::json(strings).dump());
  run_oracle("strings '" + (dir / "in.json").string() + "' '" + (dir / "out.json").string() + "'");
  return nlohmann::json::parse(read_file(dir / "out.json")).get<std::vector<std::vector<int32_t>>>();
}


// Compares ptrain with tiktoken on each string; reports the first few that differ.
void expect_same(const std::vector<std::string>& strings, const fs::path& dir) {
  const std::vector<std::vector<int32_t>> expected = tiktoken_ids(strings, dir);
  REQUIRE(expected.size() == strings.size());
  int differ = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    if (gpt2_ids(strings[i]) == expected[i]) continue;
    if (++differ <= 5) {
      UNSCOPED_INFO("differs on " << nlohmann::json(strings[i]).dump());
    }
  }
  CHECK(differ == 0);
}

}  // namespace

TEST_CASE("tiktoken oracle: every code point in the contexts the pattern tells apart", "[oracle]") {
  TempDir dir("oracle");
  std::vector<std::string> strings;
  for (char32_t c = 0; c <= 0x10FFFF; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;  // surrogates are not characters
    const std::string s = encode_utf8(c);
    // Before and after a letter, a digit, punctuation, a space, a line feed; doubled; after an
    // apostrophe.
    strings.push_back("a" + s + "1 " + s + "x" + s + s + "!" + s + "\n" + s + " '" + s + "  " + s);
  }
  for (size_t begin = 0; begin < strings.size(); begin += 200000) {
    const std::vector<std::string> part(strings.begin() + begin,
                                        strings.begin() + std::min(strings.size(), begin + 200000));
    expect_same(part, dir.dir);
  }
}

TEST_CASE("tiktoken oracle: random text and the golden file's edge cases", "[oracle]") {
  TempDir dir("oracle");
  const nlohmann::json golden =
      nlohmann::json::parse(read_file(ptrain::test::source_dir() / "tests/fixtures/gpt2-golden.json"));
  std::vector<std::string> texts;
  for (const auto& entry : golden) texts.push_back(entry["text"].get<std::string>());
  const std::vector<std::vector<int32_t>> live = tiktoken_ids(texts, dir.dir);
  for (size_t i = 0; i < texts.size(); ++i) {
    INFO("golden text " << nlohmann::json(texts[i]).dump());
    CHECK(golden[i]["ids"].get<std::vector<int32_t>>() == live[i]);
  }

  std::mt19937 rng(2026);
  const std::vector<std::string> alphabet = {"a", "Z", "s", "t", "l", "e", "'", "\xE2\x80\x99", " ", " ", "  ", "\n",
                                             "\r\n", "\t", "\xC2\xA0", "\xE3\x80\x80", "\xC2\x85", "\x0B", "9", "0",
                                             "\xD9\xA3", "\xC2\xBD", ".", "!", "?", "-", "_", "\xC3\xA9",
                                             "\xCC\x81", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xE2\x80\x8D",
                                             "\xEF\xBB\xBF", "\xE1\xA0\x8E", "<|endoftext|>"};
  std::vector<std::string> random;
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    for (int n = 1 + static_cast<int>(rng() % 60); n > 0; --n) s += alphabet[rng() % alphabet.size()];
    random.push_back(s);
  }
  expect_same(random, dir.dir);
}

TEST_CASE("tiktoken oracle: data prepare on Moby-Dick and 233 State of the Union addresses", "[oracle]") {
  TempDir dir("oracle");
  const std::vector<std::string> files = ptrain::test::corpus_files();
  const ptrain::test::PreparedCorpus prepared = ptrain::test::prepared_corpus("gpt2", dir.dir, kUint16Shards);
  const PrepareResult& r = prepared.result;
  const std::string& ours = prepared.ids;

  std::string args = "documents '" + (dir.dir / "tiktoken.bin").string() + "'";
  for (const std::string& f : files) args += " '" + f + "'";
  run_oracle(args);
  const std::string theirs = read_file(dir.dir / "tiktoken.bin");
  CHECK(theirs.size() / 2 == static_cast<size_t>(r.train_tokens + r.val_tokens));
  CHECK(theirs.size() / 2 > 2300000);
  CHECK(ours == theirs);
}

TEST_CASE("tiktoken oracle: invalid UTF-8 replaced as node's TextDecoder does", "[oracle]") {
  TempDir dir("oracle");
  std::mt19937 rng(9);
  int compared = 0;
  for (int i = 0; i < 60; ++i) {
    std::string bytes;
    for (int n = 1 + static_cast<int>(rng() % 80); n > 0; --n) {
      const uint32_t r = rng() % 8;
      bytes += r < 4 ? static_cast<char>('a' + rng() % 26) : r < 5 ? ' ' : static_cast<char>(0x80 + rng() % 0x80);
    }
    write_file(dir.dir / "in.bin", bytes);
    run_oracle("bytes '" + (dir.dir / "in.bin").string() + "' '" + (dir.dir / "out.json").string() + "'");
    const auto theirs = nlohmann::json::parse(read_file(dir.dir / "out.json")).get<std::vector<int32_t>>();
    INFO("bytes " << i);
    CHECK(gpt2_ids(replace_invalid_utf8(bytes)) == theirs);
    ++compared;
  }
  CHECK(compared == 60);
}
