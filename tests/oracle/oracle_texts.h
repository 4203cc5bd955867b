// The texts the tokenizer oracle tests compare ptrain with a reference on: every code point in
// the contexts the patterns tell apart (with the rule for comparing on them), random strings
// over the characters they distinguish, and Moby-Dick with 233 State of the Union addresses
// through `data prepare`.
//
// The references' regex engines know Unicode 16.0, and so do ptrain's character classes (ICU
// with data/unicode16_additions.h): the ids must be equal on every code point.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <filesystem>

#include "core/paths.h"
#include "core/utf8.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "test_util.h"

namespace ptrain::test {

// Runs tests/oracle/`script` under node with `args` (and environment settings `env`, "A=b "),
// requiring success; returns what it printed.
inline std::string run_node(const std::string& script, const std::string& args, const std::string& env = "") {
  const std::string path = (source_dir() / "tests/oracle" / script).string();
  const CommandResult r = run_shell(env + "node '" + path + "' " + args);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return r.output;
}

// Each code point (surrogates left out) beside letters of each case, a digit, punctuation,
// spaces and line breaks, doubled, around an apostrophe and a slash.
struct CodePointTexts {
  std::vector<char32_t> points;
  std::vector<std::string> strings;  // one per point
};

inline CodePointTexts code_point_texts() {
  CodePointTexts t;
  for (char32_t c = 0; c <= 0x10FFFF; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    t.points.push_back(c);
    const std::string s = encode_utf8(c);
    t.strings.push_back("a" + s + "1 " + s + "x" + s + s + "!" + s + "\n" + s + " '" + s + "  " + s + "A" + s +
                        "b's" + s + "/\n" + s + "'S" + s + "\r\n" + s);
  }
  return t;
}

// Checks that ptrain and the reference agree on every string; `differences` gives the indexes,
// within a part of at most 200,000 strings, of those on which they differ.
inline void expect_same_on_every_code_point(
    const std::string& name, const CodePointTexts& t,
    const std::function<std::vector<size_t>(const std::vector<std::string>&)>& differences) {
  int differ = 0;
  for (size_t begin = 0; begin < t.strings.size(); begin += 200000) {
    const std::vector<std::string> part(t.strings.begin() + begin,
                                        t.strings.begin() + std::min(t.strings.size(), begin + 200000));
    for (const size_t i : differences(part))
      if (++differ <= 5)
        UNSCOPED_INFO(name << " differs at U+" << std::hex << static_cast<uint32_t>(t.points[begin + i]) << std::dec
                           << ": " << nlohmann::json(part[i]).dump());
  }
  INFO(name << ": " << differ << " code points differ");
  CHECK(differ == 0);
}

// Random strings of 1 to 60 pieces over letters of each case, contractions, digits, white space
// of several kinds, punctuation and '/', marks, ligatures, CJK, emoji, and with `special_text`
// the text "<|endoftext|>" (text to tiktoken's encode_ordinary and to ptrain, a token to
// Hugging Face's tokenizers where the file has it).
inline std::vector<std::string> random_strings(uint32_t seed, int count, bool special_text) {
  std::mt19937 rng(seed);
  std::vector<std::string> alphabet = {
      "a", "Z", "s", "S", "t", "l", "L", "e", "D", "'", "\xE2\x80\x99", " ", " ", "  ", "\n", "\r\n", "\r", "\t",
      "\xC2\xA0", "\xE3\x80\x80", "\xC2\x85", "\x0B", "9", "0", "123", "\xD9\xA3", "\xC2\xBD", ".", "!", "?", "/",
      "-", "_", "\xC3\xA9", "\xC3\x89", "e\xCC\x81", "\xEF\xAC\x81", "\xEF\xBC\x91", "\xE4\xB8\xAD",
      "\xF0\x9F\x98\x80", "\xE2\x80\x8D", "\xEF\xBB\xBF", "\xE1\xA0\x8E", "\xC5\xBF", "\xCA\xB0", "\xC7\x85",
      "\xE0\xA4\x95\xE0\xA5\x8D"};
  if (special_text) alphabet.push_back("<|endoftext|>");
  std::vector<std::string> strings;
  for (int i = 0; i < count; ++i) {
    std::string s;
    for (int n = 1 + static_cast<int>(rng() % 60); n > 0; --n) s += alphabet[rng() % alphabet.size()];
    strings.push_back(s);
  }
  return strings;
}

// Moby-Dick, then the 233 addresses in sorted order: the documents `data prepare` reads from
// {moby-dick.txt, sotu/}.
inline std::vector<std::string> corpus_files() {
  const std::filesystem::path text = std::filesystem::path(data_cache_dir()) / "text";
  std::vector<std::string> files = {(text / "moby-dick.txt").string()};
  for (const auto& e : std::filesystem::directory_iterator(text / "sotu")) files.push_back(e.path().string());
  std::sort(files.begin() + 1, files.end());
  REQUIRE(files.size() == 234);
  return files;
}

// `data prepare --tokenizer NAME` of the corpus into dir/real (10% val): the ids of its shards
// in corpus order (the val split is its end), as the shards hold them, each shard of `format`.
struct PreparedCorpus {
  PrepareResult result;
  std::string ids;
};
inline PreparedCorpus prepared_corpus(const std::string& tokenizer, const std::filesystem::path& dir,
                                      const ShardFormat& format) {
  const std::filesystem::path text = std::filesystem::path(data_cache_dir()) / "text";
  PrepareOptions o;
  o.tokenizer = tokenizer;
  o.inputs = {(text / "moby-dick.txt").string(), (text / "sotu").string()};
  o.out_dir = (dir / "real").string();
  o.val_fraction = 0.1;
  PreparedCorpus c{prepare_text(o), ""};
  for (const char* split : {"train", "val"})
    for (const std::string& f : c.result.files) {
      if (f.find(std::string("_") + split + "_") == std::string::npos) continue;
      CHECK(&TokenShard(f).format() == &format);
      c.ids += read_file(f).substr(1024);  // the ids after llm.c's header
    }
  return c;
}

}  // namespace ptrain::test
