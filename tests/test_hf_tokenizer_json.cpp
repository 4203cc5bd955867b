// Reading Hugging Face's tokenizer.json: Llama 3's loads as 128,256 ids with cl100k_base's
// pattern (its scanner), GPT-2's as exported gives GPT-2's ids, a Unicode normalizer applies,
// and what ptrain cannot run exactly is refused by name, by `data prepare` with exit 2 and
// nothing written. (tests/oracle compares the ids with Hugging Face's tokenizers.)
#include <catch2/catch.hpp>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/utf8.h"
#include "data/hf_tokenizer_files.h"
#include "data/tokenizer.h"
#include "test_util.h"
#include "user_error.h"

namespace fs = std::filesystem;
using namespace ptrain;
using nlohmann::json;
using ptrain::test::TempDir;
using ptrain::test::user_error;
using ptrain::test::write_file;

namespace {

const Tokenizer& gpt2() {
  static const Tokenizer t = Tokenizer::load("gpt2");
  return t;
}

// GPT-2's tokenizer.json as ptrain's export writes it.
json gpt2_json() {
  static const json j = [] {
    const BpeVocabulary& v = *gpt2().bpe();
    return json::parse(gpt2_tokenizer_json(bpe_vocab_json(v), bpe_merges_txt(v), 50256));
  }();
  return j;
}

std::string written(const TempDir& dir, const json& j) {
  static int n = 0;
  const fs::path file = dir.dir / ("tokenizer" + std::to_string(n++) + ".json");
  write_file(file, j.dump());
  return file.string();
}

}  // namespace

TEST_CASE("tokenizer.json: Llama 3's loads with cl100k_base's pattern and marks documents by <|begin_of_text|>",
          "[tokenizer]") {
  if (!fs::exists(default_vocabulary("llama3")))
    FAIL("Llama 3's tokenizer.json is not at " << default_vocabulary("llama3") << "; run ./scripts/fetch-data.sh");
  const Tokenizer llama3 = Tokenizer::load("llama3");
  CHECK(llama3.vocab_size() == 128256);
  CHECK(tokenizer_ids("llama3") == 128256);
  CHECK(llama3.end_of_text() == 128000);
  CHECK(llama3.pretokenizer()->kind() == Pretokenizer::Kind::cl100k);
  CHECK(llama3.decode({128000, 9906, 128009}) == "<|begin_of_text|>Hello<|eot_id|>");
  CHECK(llama3.encode("Hello world", "t") == std::vector<uint32_t>{9906, 1917});
  std::mt19937 rng(4);
  for (int i = 0; i < 100; ++i) {
    std::string text;
    for (int n = 0; n < 80; ++n) text += " aZ9'\n\xC3\xA9\xE4\xB8\xAD!"[rng() % 12];
    if (first_invalid_utf8(text) != kValidUtf8) continue;
    const std::vector<uint32_t> ids = llama3.encode(text, "t");
    CHECK(llama3.decode(std::vector<int32_t>(ids.begin(), ids.end())) == text);
  }
}

TEST_CASE("tokenizer.json: GPT-2's as exported gives GPT-2's ids, and a normalizer applies", "[tokenizer]") {
  TempDir dir("tokjson");
  json j = gpt2_json();
  const Tokenizer hf = Tokenizer::load("hf", written(dir, j));
  CHECK(hf.vocab_size() == 50257);
  CHECK(hf.end_of_text() == 50256);
  CHECK(hf.pretokenizer()->kind() == Pretokenizer::Kind::gpt2);
  const std::string book = ptrain::test::read_file(fs::path(data_cache_dir()) / "text/moby-dick.txt");
  CHECK(hf.encode(book, "moby-dick.txt") == gpt2().encode(book, "moby-dick.txt"));

  j["normalizer"] = {{"type", "NFKC"}};
  const Tokenizer nfkc = Tokenizer::load("hf", written(dir, j));
  // U+FB01 (the fi ligature) and U+FF11 (fullwidth 1) are "fi" and "1" under NFKC.
  CHECK(nfkc.encode("\xEF\xAC\x81le \xEF\xBC\x91", "t") == gpt2().encode("file 1", "t"));
  CHECK(nfkc.pretokenizer()->safe_cut("a b\nc.d", 1) == 7);  // normalized text is not cut
  j["normalizer"] = {{"type", "NFC"}};
  CHECK(Tokenizer::load("hf", written(dir, j)).encode("e\xCC\x81", "t") == gpt2().encode("\xC3\xA9", "t"));
}

TEST_CASE("tokenizer.json: what ptrain cannot run exactly is refused by name", "[tokenizer]") {
  TempDir dir("tokjson");
  const auto refused = [&](json j) { return user_error([&] { Tokenizer::load("hf", written(dir, j)); }); };
  json j = gpt2_json();
  j["model"]["type"] = "Unigram";
  CHECK_THAT(refused(j), Catch::Contains("model.type is Unigram") && Catch::Contains("BPE"));
  j["model"]["type"] = "WordPiece";
  CHECK_THAT(refused(j), Catch::Contains("model.type is WordPiece"));
  j = gpt2_json();
  j["model"]["byte_fallback"] = true;
  CHECK_THAT(refused(j), Catch::Contains("model.byte_fallback") && Catch::Contains("SentencePiece"));
  j = gpt2_json();
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}};
  CHECK_THAT(refused(j), Catch::Contains("pre_tokenizer is Metaspace"));
  j = gpt2_json();
  j["normalizer"] = {{"type", "Lowercase"}};
  CHECK_THAT(refused(j), Catch::Contains("normalizer is Lowercase"));
  j = gpt2_json();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}, {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  CHECK_NOTHROW(Tokenizer::load("hf", written(dir, j)));  // any behavior runs
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Splits";
  CHECK_THAT(refused(j), Catch::Contains("behavior is \"Splits\"") && Catch::Contains("MergedWithNext"));
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", ""}};
  CHECK_THAT(refused(j), Catch::Contains("pattern is {\"String\":\"\"}") && Catch::Contains("non-empty String"));
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", "-"}};
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Contiguous";
  std::swap(j["pre_tokenizer"]["pretokenizers"][0], j["pre_tokenizer"]["pretokenizers"][1]);
  CHECK_THAT(refused(j), Catch::Contains("ByteLevel before its end"));
  j["pre_tokenizer"]["pretokenizers"].erase(0);
  CHECK_THAT(refused(j), Catch::Contains("without ByteLevel at its end"));
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Isolated"}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  CHECK_THAT(refused(j), Catch::Contains("(unclosed") && Catch::Contains("does not compile"));
  j = gpt2_json();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  CHECK_THAT(refused(j), Catch::Contains("add_prefix_space"));
  j = gpt2_json();
  j["model"]["vocab"]["\xC4\xA0the"] = 7;  // an id twice
  CHECK_THAT(refused(j), Catch::Contains("appears twice"));
  j = gpt2_json();
  j["added_tokens"][0]["special"] = false;  // Hugging Face would cut it out of ordinary text
  CHECK_THAT(refused(j), Catch::Contains("not special"));
  j = gpt2_json();
  j["added_tokens"][0]["id"] = 4294967296 + 100;
  CHECK_THAT(refused(j), Catch::Contains("added_tokens") && Catch::Contains("below"));
  j = gpt2_json();
  j["model"]["ignore_merges"] = "yes";
  CHECK_THAT(refused(j), Catch::Contains("\"ignore_merges\" is \"yes\"") && Catch::Contains("true or false"));
  j = gpt2_json();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "^\\s+|[^\\s]+"}}}, {"behavior", "Isolated"}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  CHECK_THAT(refused(j), Catch::Contains("anchor ^"));
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "[^\\s$]+|\\s+";  // in a class: no anchor
  CHECK_NOTHROW(Tokenizer::load("hf", written(dir, j)));
  CHECK_THAT(user_error([] { Tokenizer::load("hf"); }), Catch::Contains("tokenizer.json") && Catch::Contains("--vocab"));
}

TEST_CASE("data prepare refuses an unsupported tokenizer.json or another Llama 3 file with exit 2, writing nothing",
          "[tokenizer]") {
  TempDir dir("tokjson");
  write_file(dir.dir / "in.txt", "Some text to tokenize.\n");
  json j = gpt2_json();
  j["model"]["type"] = "Unigram";
  const std::string unigram = written(dir, j);
  ptrain::test::CommandResult r = ptrain::test::run_ptrain(
      "data prepare --tokenizer hf --vocab '" + unigram + "' --input in.txt --out out", dir.dir);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("model.type is Unigram"));
  CHECK_FALSE(fs::exists(dir.dir / "out"));

  std::string llama = ptrain::test::read_file(default_vocabulary("llama3"));
  llama[llama.size() / 2] = llama[llama.size() / 2] == 'a' ? 'b' : 'a';
  write_file(dir.dir / "llama.json", llama);
  r = ptrain::test::run_ptrain("data prepare --tokenizer llama3 --vocab llama.json --input in.txt --out out", dir.dir);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("SHA-256") && Catch::Contains("llama.json"));
  CHECK_FALSE(fs::exists(dir.dir / "out"));
}
