// ptrain reading Hugging Face's tokenizer.json against Hugging Face's tokenizers on the same
// file: Llama 3's (a Split by cl100k's pattern, then ByteLevel; ignore_merges) on every code
// point in context, random text, and Moby-Dick with 233 speeches through `data prepare`; and
// GPT-2's as ptrain's export writes it (ByteLevel with its own regex; pair merges), also with
// normalizers set (Unicode forms, Lowercase on every code point of the planes with cased
// letters, Strip, Replace, Prepend), and with other pre-tokenizers: several Splits (DeepSeek's
// layout), each Split behavior, inverted, by a literal, Digits, and ByteLevel's prefix space.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/paths.h"
#include "data/hf_tokenizer_files.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "gpt2_ids.h"
#include "core/utf8.h"
#include "oracle_texts.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ptrain;
using ptrain::test::read_file;
using ptrain::test::TempDir;
using ptrain::test::write_file;

namespace {

std::string oracle(const std::string& args) { return ptrain::test::run_node("hf_tokenizers.js", args); }

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


}  // namespace

TEST_CASE("tokenizers oracle: Llama 3's tokenizer.json on every code point in context", "[oracle]") {
  TempDir dir("oracle");
  const Tokenizer llama3 = Tokenizer::load("llama3");
  const fs::path file = default_vocabulary("llama3");
  ptrain::test::expect_same_on_every_code_point(
      "llama3", ptrain::test::code_point_texts(),
      [&](const std::vector<std::string>& part) { return differences(llama3, file, part, dir.dir); });
}

TEST_CASE("tokenizers oracle: Llama 3's tokenizer.json on random text and through data prepare", "[oracle]") {
  TempDir dir("oracle");
  const Tokenizer llama3 = Tokenizer::load("llama3");
  const fs::path file = default_vocabulary("llama3");
  CHECK(differences(llama3, file, ptrain::test::random_strings(2028, 5000, false), dir.dir).empty());

  const std::vector<std::string> files = ptrain::test::corpus_files();
  const ptrain::test::PreparedCorpus prepared = ptrain::test::prepared_corpus("llama3", dir.dir, kUint32Shards);
  const PrepareResult& r = prepared.result;
  const std::string& ours = prepared.ids;
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
  std::vector<std::string> strings = ptrain::test::random_strings(2029, 3000, false);
  strings.push_back("");  // nothing to prepend to
  for (const char* normalizer :
       {"null", R"({"type": "NFC"})", R"({"type": "NFKC"})", R"({"type": "NFKD"})",
        R"({"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "NFKC"}]})", R"({"type": "Lowercase"})",
        R"({"type": "Sequence", "normalizers": [{"type": "Strip", "strip_left": true, "strip_right": false},
             {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
             {"type": "Prepend", "prepend": "\u2581"}]})",
        R"({"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Lowercase"},
             {"type": "Replace", "pattern": {"String": "e\u0301"}, "content": "E"},
             {"type": "Strip", "strip_left": false, "strip_right": true}, {"type": "NFC"}]})",
        "repeated merge"}) {
    // A merge listed twice takes its last place, as tokenizers keeps it.
    const bool repeated_merge = std::string(normalizer) == "repeated merge";
    if (repeated_merge) j["model"]["merges"].push_back(j["model"]["merges"][0]);
    j["normalizer"] = repeated_merge ? nullptr : nlohmann::json::parse(normalizer);
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

// Lowercase follows Rust's char::to_lowercase, whose Unicode is the Rust release's (17.0 in the
// build of tokenizers the tests run) rather than the regex engine's.
TEST_CASE("tokenizers oracle: a Lowercase normalizer on every code point of the planes with cased letters",
          "[oracle]") {
  TempDir dir("oracle");
  const BpeVocabulary& v = *ptrain::test::gpt2().bpe();
  nlohmann::json j = nlohmann::json::parse(gpt2_tokenizer_json(bpe_vocab_json(v), bpe_merges_txt(v), 50256));
  j["normalizer"] = {{"type", "Lowercase"}};
  const fs::path file = dir.dir / "tokenizer.json";
  write_file(file, j.dump());
  const Tokenizer lowercase = Tokenizer::load("hf", file.string());
  ptrain::test::CodePointTexts texts = ptrain::test::code_point_texts();
  // Unicode 17.0 has no cased letter past the Supplementary Multilingual Plane.
  const auto past = std::find_if(texts.points.begin(), texts.points.end(), [](char32_t c) { return c >= 0x20000; });
  texts.strings.resize(static_cast<size_t>(past - texts.points.begin()));
  texts.points.erase(past, texts.points.end());
  ptrain::test::expect_same_on_every_code_point(
      "Lowercase", texts,
      [&](const std::vector<std::string>& part) { return differences(lowercase, file, part, dir.dir); });
}

TEST_CASE("tokenizers oracle: GPT-2's vocabulary under Splits of every behavior, in sequence, and Digits", "[oracle]") {
  TempDir dir("oracle");
  const BpeVocabulary& v = *ptrain::test::gpt2().bpe();
  nlohmann::json j = nlohmann::json::parse(gpt2_tokenizer_json(bpe_vocab_json(v), bpe_merges_txt(v), 50256));
  std::vector<std::string> strings = ptrain::test::random_strings(2030, 2000, false);
  // The literal below, and what an unescaped '.' would also match.
  for (const char* s : {"a.e", "axe a.e", "'s a.e's", "a.ea.e  x", "1ax 22"}) strings.push_back(s);
  const auto split = [](const char* kind, const std::string& pattern, const char* behavior, bool invert = false) {
    return nlohmann::json{{"type", "Split"}, {"pattern", {{kind, pattern}}}, {"behavior", behavior}, {"invert", invert}};
  };
  const auto byte_level = [](bool use_regex, bool prefix_space = false) {
    return nlohmann::json{
        {"type", "ByteLevel"}, {"add_prefix_space", prefix_space}, {"trim_offsets", true}, {"use_regex", use_regex}};
  };
  // DeepSeek-V3's pre-tokenizer: digits in threes, runs of CJK and kana, then a cl100k-like
  // pattern over punctuation and symbols.
  const std::string deepseek_words =
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
      "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
  const std::vector<std::pair<std::string, nlohmann::json>> variants = {
      {"DeepSeek-V3's three Splits",
       {split("Regex", "\\p{N}{1,3}", "Isolated"), split("Regex", "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+", "Isolated"),
        split("Regex", deepseek_words, "Isolated"), byte_level(false)}},
      {"white space removed, then GPT-2's regex", {split("Regex", "\\s+", "Removed"), byte_level(true)}},
      {"merged with the previous piece", {split("Regex", "[.,!?]", "MergedWithPrevious"), byte_level(true)}},
      {"merged with the next piece", {split("Regex", "\\s", "MergedWithNext"), byte_level(false)}},
      {"contiguous", {split("Regex", "\\p{L}", "Contiguous"), byte_level(false)}},
      {"inverted", {split("Regex", "\\p{L}+", "Removed", true), byte_level(true)}},
      {"a literal", {split("String", "'s", "Isolated"), split("String", "a.e", "MergedWithNext"), byte_level(true)}},
      {"empty matches, merged with the next piece", {split("Regex", "\\s*", "MergedWithNext"), byte_level(false)}},
      {"an empty lookahead", {split("Regex", "\\d+|(?=x)", "Isolated"), byte_level(false)}},
      {"digits one by one", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}},
      {"digit runs", {{{"type", "Digits"}, {"individual_digits", false}}, byte_level(false)}},
      {"ByteLevel without a regex: the text whole", nlohmann::json::array({byte_level(false)})},
      {"a prefix space, then GPT-2's regex", nlohmann::json::array({byte_level(true, true)})},
      {"a prefix space, the text whole", nlohmann::json::array({byte_level(false, true)})},
      {"a prefix space on each piece of Splits",
       {split("Regex", "\\p{N}{1,3}", "Isolated"), split("Regex", "[.!?]", "MergedWithPrevious"),
        byte_level(true, true)}},
      {"a prefix space after white space removed", {split("Regex", "\\s+", "Removed"), byte_level(true, true)}},
  };
  for (const auto& [name, steps] : variants) {
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", steps}};
    const fs::path file = dir.dir / "tokenizer.json";
    write_file(file, j.dump());
    const Tokenizer hf = Tokenizer::load("hf", file.string());
    INFO(name);
    CHECK(hf.pretokenizer()->kind() == Pretokenizer::Kind::regex);
    CHECK(differences(hf, file, strings, dir.dir).empty());
  }
}

// Added tokens that are not special: Hugging Face cuts them out of the text before anything
// else, those marked "normalized": false from the text as given, then the others from the
// normalized text; ptrain does the same, also where `data prepare` cuts a document for threads.
TEST_CASE("tokenizers oracle: added words that are not special, on random text and through data prepare", "[oracle]") {
  TempDir dir("oracle");
  const BpeVocabulary& v = *ptrain::test::gpt2().bpe();
  nlohmann::json j = nlohmann::json::parse(gpt2_tokenizer_json(bpe_vocab_json(v), bpe_merges_txt(v), 50256));
  const std::vector<std::pair<std::string, bool>> words = {
      {"<tool_call>", false}, {"</tool_call>", false}, {"«q", false}, {"«q»", false}, {"q»!", false},
      {" «q", true},          {"xy z", true},          {"y z!", false}, {"e\xCC\x81x", true}, {"\n\n", false}};
  uint32_t id = 50257;
  for (const auto& [content, normalized] : words)
    j["added_tokens"].push_back({{"id", id++}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", normalized}, {"special", false}});
  std::vector<std::string> inserts = {"<tool", "call>", "«", "»", "q", "xy", " z", "!", "e", "\xCC\x81", "\n"};
  for (const auto& w : words) inserts.push_back(w.first);
  std::mt19937 rng(2031);
  const auto with_words = [&](const std::string& text, size_t every) {
    std::string out;
    for (size_t at = 0; at < text.size(); ++at) {
      out += text[at];
      const bool boundary = at + 1 == text.size() || (static_cast<uint8_t>(text[at + 1]) & 0xC0) != 0x80;
      if (boundary && rng() % every == 0) out += inserts[rng() % inserts.size()];
    }
    return out;
  };
  std::vector<std::string> strings;
  for (const std::string& s : ptrain::test::random_strings(2031, 2000, false)) strings.push_back(with_words(s, 4));
  const fs::path file = dir.dir / "tokenizer.json";
  for (const char* normalizer :
       {"null", R"({"type": "NFC"})",
        R"({"type": "Sequence", "normalizers": [{"type": "Lowercase"}, {"type": "Prepend", "prepend": " "},
             {"type": "Strip", "strip_left": false, "strip_right": true}]})"}) {
    for (const bool prefix_space : {false, true}) {
      j["normalizer"] = nlohmann::json::parse(normalizer);
      j["pre_tokenizer"]["add_prefix_space"] = prefix_space;
      write_file(file, j.dump());
      INFO("normalizer " << normalizer << ", ByteLevel's add_prefix_space " << prefix_space);
      CHECK(differences(Tokenizer::load("hf", file.string()), file, strings, dir.dir).empty());
    }
  }
  j["pre_tokenizer"]["add_prefix_space"] = false;

  // Without a normalizer `data prepare` cuts the text for its threads: Moby-Dick, twice (past
  // one read), with a word or a part of one every 40 characters or so.
  j["normalizer"] = nullptr;
  write_file(file, j.dump());
  const std::string moby = read_file(fs::path(data_cache_dir()) / "text" / "moby-dick.txt");
  write_file(dir.dir / "doc.txt", with_words(moby + moby, 40));
  PrepareOptions o;
  o.tokenizer = "hf";
  o.vocabulary = file.string();
  o.inputs = {(dir.dir / "doc.txt").string()};
  o.out_dir = (dir.dir / "shards").string();
  o.threads = 2;
  const PrepareResult r = prepare_text(o);
  std::string ours;
  for (const char* split : {"train", "val"})
    for (const std::string& f : r.files)
      if (f.find(std::string("_") + split + "_") != std::string::npos) ours += read_file(f).substr(1024);
  oracle("documents '" + file.string() + "' 50256 '" + (dir.dir / "hf.bin").string() + "' '" +
         (dir.dir / "doc.txt").string() + "'");
  const std::string theirs32 = read_file(dir.dir / "hf.bin");
  std::string theirs;  // as uint16, as the shards hold GPT-2's ids
  for (size_t at = 0; at < theirs32.size(); at += 4) theirs += theirs32.substr(at, 2);
  CHECK(theirs.size() / 2 == static_cast<size_t>(r.train_tokens + r.val_tokens));
  CHECK(theirs.size() / 2 > 500000);
  CHECK(ours == theirs);
}
