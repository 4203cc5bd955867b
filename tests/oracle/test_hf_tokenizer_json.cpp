// ptrain reading Hugging Face's tokenizer.json against Hugging Face's tokenizers on the same
// file: Llama 3's (a Split by cl100k's pattern, then ByteLevel; ignore_merges) on every code
// point in context, random text, and Moby-Dick with 233 speeches through `data prepare`; and
// GPT-2's as ptrain's export writes it (ByteLevel with its own regex; pair merges), also with a
// Unicode normalizer set.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include "core/paths.h"
#include "data/hf_tokenizer_files.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "gpt2_ids.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ptrain;
using ptrain::test::read_file;
using ptrain::test::TempDir;
using ptrain::test::write_file;

namespace {

std::string oracle(const std::string& args) {
  const std::string script = (ptrain::test::source_dir() / "tests/oracle/hf_tokenizers.js").string();
  const ptrain::test::CommandResult r = ptrain::test::run_shell("node '" + script + "' " + args);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return r.output;
}

// The indexes of the strings on which ptrain's ids differ from Hugging Face's.
std::vector<size_t> differences(const Tokenizer& tokenizer, const fs::path& file,
                                const std::vector<std::string>& strings, const fs::path& dir) {
  write_file(dir / "in.json", nlohmann::json(strings).dump());
  oracle("strings '" + file.string() + "' '" + (dir / "in.json").string() + "' '" + (dir / "out.json").string() + "'");
  const auto expected = nlohmann::json::parse(read_file(dir / "out.json")).get<std::vector<std::vector<uint32_t>>>();
  REQUIRE(expected.size() == strings.size());
  std::vector<size_t> differ;
  for (size_t i = 0; i < strings.size(); ++i)
    if (tokenizer.encode(strings[i], "text") != expected[i]) differ.push_back(i);
  return differ;
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

std::vector<std::string> random_strings(uint32_t seed, int count) {
  std::mt19937 rng(seed);
  const std::vector<std::string> alphabet = {
      "a", "Z", "s", "S", "t", "l", "L", "e", "D", "'", "\xE2\x80\x99", " ", " ", "  ", "\n", "\r\n", "\r", "\t",
      "\xC2\xA0", "\xE3\x80\x80", "\xC2\x85", "\x0B", "9", "0", "123", "\xD9\xA3", "\xC2\xBD", ".", "!", "?", "/",
      "-", "_", "\xC3\xA9", "e\xCC\x81", "\xEF\xAC\x81", "\xEF\xBC\x91", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80",
      "\xE2\x80\x8D", "\xEF\xBB\xBF", "\xC5\xBF", "\xCA\xB0", "\xC7\x85", "\xE0\xA4\x95\xE0\xA5\x8D"};
  std::vector<std::string> strings;
  for (int i = 0; i < count; ++i) {
    std::string s;
    for (int n = 1 + static_cast<int>(rng() % 60); n > 0; --n) s += alphabet[rng() % alphabet.size()];
    strings.push_back(s);
  }
  return strings;
}

}  // namespace

// As with tiktoken (test_tiktoken_encodings.cpp): a difference may only be at a code point
// Unicode 15.0 (ptrain's ICU 72) leaves unassigned.
TEST_CASE("tokenizers oracle: Llama 3's tokenizer.json on every code point in context", "[oracle]") {
  TempDir dir("oracle");
  const Tokenizer& llama3 = Tokenizer::load("llama3");
  const fs::path file = default_vocabulary("llama3");
  std::vector<std::string> strings;
  std::vector<char32_t> points;
  for (char32_t c = 0; c <= 0x10FFFF; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    points.push_back(c);
    const std::string s = utf8(c);
    strings.push_back("a" + s + "1 " + s + "x" + s + s + "!" + s + "\n" + s + " '" + s + "  " + s + "A" + s +
                      "b's" + s + "\r\n" + s);
  }
  int newer = 0, assigned = 0;
  for (size_t begin = 0; begin < strings.size(); begin += 200000) {
    const std::vector<std::string> part(strings.begin() + begin,
                                        strings.begin() + std::min(strings.size(), begin + 200000));
    for (const size_t i : differences(llama3, file, part, dir.dir)) {
      if (u_charType(static_cast<UChar32>(points[begin + i])) == U_UNASSIGNED) {
        ++newer;
      } else if (++assigned <= 5) {
        UNSCOPED_INFO("differs at U+" << std::hex << static_cast<uint32_t>(points[begin + i]) << std::dec << ": "
                                      << nlohmann::json(part[i]).dump());
      }
    }
  }
  INFO(newer << " differences at code points Unicode 15.0 leaves unassigned");
  CHECK(assigned == 0);
  CHECK(newer < 6000);
}

TEST_CASE("tokenizers oracle: Llama 3's tokenizer.json on random text and through data prepare", "[oracle]") {
  TempDir dir("oracle");
  const Tokenizer& llama3 = Tokenizer::load("llama3");
  const fs::path file = default_vocabulary("llama3");
  CHECK(differences(llama3, file, random_strings(2028, 5000), dir.dir).empty());

  const fs::path text = fs::path(data_cache_dir()) / "text";
  std::vector<std::string> files = {(text / "moby-dick.txt").string()};
  for (const auto& e : fs::directory_iterator(text / "sotu")) files.push_back(e.path().string());
  std::sort(files.begin() + 1, files.end());
  PrepareOptions o;
  o.tokenizer = "llama3";
  o.inputs = {(text / "moby-dick.txt").string(), (text / "sotu").string()};
  o.out_dir = (dir.dir / "real").string();
  const PrepareResult r = prepare_text(o);
  std::string ours;
  for (const char* split : {"train", "val"})
    for (const std::string& f : r.files)
      if (f.find(std::string("_") + split + "_") != std::string::npos) {
        CHECK(&TokenShard(f).format() == &kUint32Shards);
        ours += read_file(f).substr(1024);
      }
  std::string args = "documents '" + file.string() + "' 128000 '" + (dir.dir / "hf.bin").string() + "'";
  for (const std::string& f : files) args += " '" + f + "'";
  oracle(args);
  const std::string theirs = read_file(dir.dir / "hf.bin");
  CHECK(theirs.size() / 4 == static_cast<size_t>(r.train_tokens + r.val_tokens));
  CHECK(theirs.size() / 4 > 2000000);
  CHECK(ours == theirs);
}

TEST_CASE("tokenizers oracle: GPT-2's tokenizer.json, as exported and with normalizers", "[oracle]") {
  TempDir dir("oracle");
  const BpeVocabulary& v = *ptrain::test::gpt2().bpe();
  nlohmann::json j = nlohmann::json::parse(gpt2_tokenizer_json(bpe_vocab_json(v), bpe_merges_txt(v), 50256));
  const std::vector<std::string> strings = random_strings(2029, 3000);
  for (const char* normalizer : {"null", R"({"type": "NFC"})", R"({"type": "NFKC"})",
                                 R"({"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "NFKC"}]})",
                                 "repeated merge"}) {
    // A merge listed twice takes its last place, as tokenizers keeps it.
    if (std::string(normalizer) == "repeated merge") j["model"]["merges"].push_back(j["model"]["merges"][0]);
    else j["normalizer"] = nlohmann::json::parse(normalizer);
    const fs::path file = dir.dir / "tokenizer.json";
    write_file(file, j.dump());
    const Tokenizer hf = Tokenizer::load("hf", file.string());
    INFO("normalizer " << normalizer);
    CHECK(differences(hf, file, strings, dir.dir).empty());
    if (std::string(normalizer) == "null") {
      for (const std::string& s : strings) REQUIRE(hf.encode(s, "text") == ptrain::test::gpt2().encode(s, "text"));
    }
  }
}
