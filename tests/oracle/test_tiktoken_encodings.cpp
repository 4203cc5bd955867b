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
#include <unicode/uchar.h>

#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ptrain;
using ptrain::test::read_file;
using ptrain::test::TempDir;
using ptrain::test::write_file;

namespace {

const char* const kEncodings[] = {"cl100k_base", "o200k_base"};

void run_oracle(const std::string& encoding, const std::string& args) {
  const std::string script = (ptrain::test::source_dir() / "tests/oracle/tiktoken.js").string();
  const ptrain::test::CommandResult r =
      ptrain::test::run_shell("TIKTOKEN_ENCODING=" + encoding + " node '" + script + "' " + args);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
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

// ptrain's character classes are ICU's (Debian 12: ICU 72, Unicode 15.0); tiktoken's Rust regex
// knows Unicode 16.0. A code point assigned since (CJK extension I, new scripts) is no letter,
// number or mark to ptrain, so text around it may split otherwise: every difference must be
// at such a code point, and on all the others the ids must be equal.
TEST_CASE("tiktoken oracle: cl100k_base and o200k_base on every code point in context", "[oracle]") {
  TempDir dir("oracle");
  std::vector<std::string> strings;
  std::vector<char32_t> points;
  for (char32_t c = 0; c <= 0x10FFFF; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;  // surrogates are not characters
    points.push_back(c);
    const std::string s = utf8(c);
    // Beside letters of each case, a digit, punctuation, spaces and line breaks, doubled, around
    // an apostrophe and a slash.
    strings.push_back("a" + s + "1 " + s + "x" + s + s + "!" + s + "\n" + s + " '" + s + "  " + s + "A" + s +
                      "b's" + s + "/\n" + s + "'S" + s + "\r\n" + s);
  }
  for (const char* encoding : kEncodings) {
    int newer = 0, assigned = 0;
    for (size_t begin = 0; begin < strings.size(); begin += 200000) {
      const std::vector<std::string> part(strings.begin() + begin,
                                          strings.begin() + std::min(strings.size(), begin + 200000));
      for (const size_t i : differences(encoding, part, dir.dir)) {
        const char32_t c = points[begin + i];
        if (u_charType(static_cast<UChar32>(c)) == U_UNASSIGNED) {
          ++newer;
        } else if (++assigned <= 5) {
          UNSCOPED_INFO(encoding << " differs at U+" << std::hex << static_cast<uint32_t>(c) << std::dec << ": "
                                 << nlohmann::json(part[i]).dump());
        }
      }
    }
    INFO(encoding << ": " << newer << " differences at code points Unicode 15.0 leaves unassigned");
    CHECK(assigned == 0);
    CHECK(newer < 6000);  // Unicode 15.1 and 16.0 assigned 5,812 characters
  }
}

TEST_CASE("tiktoken oracle: cl100k_base and o200k_base on random text", "[oracle]") {
  TempDir dir("oracle");
  std::mt19937 rng(2027);
  const std::vector<std::string> alphabet = {
      "a", "Z", "s", "S", "t", "l", "L", "e", "D", "'", "\xE2\x80\x99", " ", " ", "  ", "\n", "\r\n", "\r", "\t",
      "\xC2\xA0", "\xE3\x80\x80", "\xC2\x85", "\x0B", "9", "0", "123", "\xD9\xA3", "\xC2\xBD", ".", "!", "?", "/",
      "-", "_", "\xC3\xA9", "\xC3\x89", "\xCC\x81", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xE2\x80\x8D",
      "\xEF\xBB\xBF", "\xE1\xA0\x8E", "\xC5\xBF", "\xCA\xB0", "\xC7\x85", "\xE0\xA4\x95\xE0\xA5\x8D",
      "<|endoftext|>"};
  std::vector<std::string> random;
  for (int i = 0; i < 5000; ++i) {
    std::string s;
    for (int n = 1 + static_cast<int>(rng() % 60); n > 0; --n) s += alphabet[rng() % alphabet.size()];
    random.push_back(s);
  }
  for (const char* encoding : kEncodings) expect_same(encoding, random, dir.dir);
}

TEST_CASE("tiktoken oracle: data prepare with cl100k_base and o200k_base into uint32 shards", "[oracle]") {
  const fs::path text = fs::path(data_cache_dir()) / "text";
  std::vector<std::string> files = {(text / "moby-dick.txt").string()};
  for (const auto& e : fs::directory_iterator(text / "sotu")) files.push_back(e.path().string());
  std::sort(files.begin() + 1, files.end());
  REQUIRE(files.size() == 234);
  for (const char* encoding : kEncodings) {
    TempDir dir("oracle");
    PrepareOptions o;
    o.tokenizer = encoding;
    o.inputs = {(text / "moby-dick.txt").string(), (text / "sotu").string()};
    o.out_dir = (dir.dir / "real").string();
    o.val_fraction = 0.1;
    const PrepareResult r = prepare_text(o);
    std::string ours;
    for (const char* split : {"train", "val"})
      for (const std::string& f : r.files) {
        if (f.find(std::string("_") + split + "_") == std::string::npos) continue;
        CHECK(&TokenShard(f).format() == &kUint32Shards);
        ours += read_file(f).substr(1024);  // the tokens after llm.c's header
      }
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
