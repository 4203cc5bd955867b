// ptrain's cl100k_base and o200k_base tokenizers against tiktoken itself (its WebAssembly build
// under node, which carries its own copy of each vocabulary): every Unicode code point in the
// contexts the patterns tell apart, random text, and Moby-Dick with 233 speeches through
// `data prepare` into uint32 shards.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "core/utf8.h"
#include "oracle_texts.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ptrain;
using ptrain::test::read_file;
using ptrain::test::TempDir;
using ptrain::test::write_file;

namespace {

const char* const kEncodings[] = {"cl100k_base", "o200k_base"};

void run_oracle(const std::string& encoding, const std::string& args) {
  ptrain::test::run_node("tiktoken.js", args, "TIKTOKEN_ENCODING=" + encoding + " ");
}


// The indexes of the strings on which ptrain's ids differ from tiktoken's.
std::vector<size_t> differences(const std::string& encoding, const std::vector<std::string>& strings,
                                const fs::path& dir) {
  const Tokenizer tokenizer = Tokenizer::load(encoding);
  write_file(dir / "in.json", nlohmann::json(strings).dump());
  run_oracle(encoding, "strings '" + (dir / "in.json").string() + "' '" + (dir / "out.json").string() + "'");
  const auto expected = nlohmann::json::parse(read_file(dir / "out.json")).get<std::vector<std::vector<uint32_t>>>();
  REQUIRE(expected.size() == strings.size());
  std::vector<size_t> differ;
  for (size_t i = 0; i < strings.size(); ++i)
    if (tokenizer.encode(strings[i], "text") != expected[i]) differ.push_back(i);
  return differ;
}

// Compares ptrain with tiktoken on each string; reports the first few that differ.
void expect_same(const std::string& encoding, const std::vector<std::string>& strings, const fs::path& dir) {
  const std::vector<size_t> differ = differences(encoding, strings, dir);
  for (size_t k = 0; k < differ.size() && k < 5; ++k)
    UNSCOPED_INFO(encoding << " differs on " << nlohmann::json(strings[differ[k]]).dump());
  CHECK(differ.empty());
}

}  // namespace

TEST_CASE("tiktoken oracle: cl100k_base and o200k_base on every code point in context", "[oracle]") {
  TempDir dir("oracle");
  const ptrain::test::CodePointTexts texts = ptrain::test::code_point_texts();
  for (const char* encoding : kEncodings)
    ptrain::test::expect_same_on_every_code_point(
        encoding, texts, [&](const std::vector<std::string>& part) { return differences(encoding, part, dir.dir); });
}

TEST_CASE("tiktoken oracle: cl100k_base and o200k_base on random text", "[oracle]") {
  TempDir dir("oracle");
  const std::vector<std::string> random = ptrain::test::random_strings(2027, 5000, true);
  for (const char* encoding : kEncodings) expect_same(encoding, random, dir.dir);
}

TEST_CASE("tiktoken oracle: data prepare with cl100k_base and o200k_base into uint32 shards", "[oracle]") {
  const std::vector<std::string> files = ptrain::test::corpus_files();
  for (const char* encoding : kEncodings) {
    TempDir dir("oracle");
    const ptrain::test::PreparedCorpus prepared = ptrain::test::prepared_corpus(encoding, dir.dir, kUint32Shards);
    const PrepareResult& r = prepared.result;
    const std::string& ours = prepared.ids;
    std::string args = "documents '" + (dir.dir / "tiktoken.bin").string() + "'";
    for (const std::string& f : files) args += " '" + f + "'";
    run_oracle(encoding, args);
    const std::string theirs = read_file(dir.dir / "tiktoken.bin");
    INFO(encoding);
    CHECK(theirs.size() / 4 == static_cast<size_t>(r.train_tokens + r.val_tokens));
    CHECK(theirs.size() / 4 > 2000000);
    CHECK(ours == theirs);
  }
}
