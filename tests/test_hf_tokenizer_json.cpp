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

TEST_CASE("tokenizer.json: Lowercase, Strip, Replace and Prepend do what tokenizers does, in order", "[tokenizer]") {
  using Kind = NormalizerStep::Kind;
  const auto apply = [](const std::string& text, const NormalizerStep& step) { return normalize_text(text, {step}); };
  // Each character alone, by Unicode 17.0: final sigma is σ too; İ is i and a combining dot;
  // U+1C89 (CYRILLIC CAPITAL LETTER TJE) is new in 16.0, U+A7CE (LATIN CAPITAL LETTER PHARYNGEAL
  // VOICED FRICATIVE) in 17.0.
  CHECK(apply("\xC3\x80" "B \xCE\xA3\xCE\xA3 \xC4\xB0 \xE1\xB2\x89x\xEA\x9F\x8E", {Kind::lowercase}) ==
        "\xC3\xA0" "b \xCF\x83\xCF\x83 i\xCC\x87 \xE1\xB2\x8Ax\xEA\x9F\x8F");
  // Unicode's White_Space (here U+3000 and U+00A0 too), at the ends asked.
  const std::string spaced = "\xE3\x80\x80 a b\t\xC2\xA0";
  CHECK(apply(spaced, {Kind::strip, "", "", true, false}) == "a b\t\xC2\xA0");
  CHECK(apply(spaced, {Kind::strip, "", "", false, true}) == "\xE3\x80\x80 a b");
  CHECK(apply(spaced, {Kind::strip, "", "", true, true}) == "a b");
  CHECK(apply(" \t ", {Kind::strip, "", "", false, true}).empty());
  CHECK(apply(" \t ", {Kind::strip, "", "", false, false}) == " \t ");
  // A literal, left to right, without overlaps.
  CHECK(apply("aaab", {Kind::replace, "aa", "b", false, false}) == "bab");
  CHECK(apply("a.b.", {Kind::replace, ".", "", false, false}) == "ab");
  CHECK(apply("", {Kind::prepend, "\xE2\x96\x81", "", false, false}).empty());  // not to empty text
  CHECK(normalize_text("a b", {{Kind::replace, " ", "\xE2\x96\x81", false, false},
                               {Kind::prepend, "\xE2\x96\x81", "", false, false}}) ==
        "\xE2\x96\x81" "a\xE2\x96\x81" "b");

  // In a tokenizer.json, around an added word: each text between words is normalized alone.
  TempDir dir("tokjson");
  json j = gpt2_json();
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                       {{"type", "Lowercase"}},
                       {{"type", "Replace"}, {"pattern", {{"String", "-"}}}, {"content", " - "}},
                       {{"type", "Prepend"}, {"prepend", " "}}}}};
  j["added_tokens"].push_back({{"id", 50257},    {"content", "<W>"},     {"single_word", false}, {"lstrip", false},
                               {"rstrip", false}, {"normalized", false}, {"special", false}});
  const Tokenizer hf = Tokenizer::load("hf", written(dir, j));
  const auto ids = [](std::initializer_list<std::vector<uint32_t>> parts) {
    std::vector<uint32_t> all;
    for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
    return all;
  };
  CHECK(hf.encode("  New-York <W>Hi ", "t") ==
        ids({gpt2().encode(" new - york", "t"), {50257}, gpt2().encode(" hi", "t")}));
  CHECK(hf.encode("<W>  <W>", "t") == std::vector<uint32_t>{50257, 50257});  // stripped to nothing: no prefix
}

TEST_CASE("tokenizer.json: ByteLevel's add_prefix_space puts a space before each piece that lacks one", "[tokenizer]") {
  TempDir dir("tokjson");
  json j = gpt2_json();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  j["added_tokens"].push_back({{"id", 50257},    {"content", "<W>"},     {"single_word", false}, {"lstrip", false},
                               {"rstrip", false}, {"normalized", false}, {"special", false}});
  const Tokenizer hf = Tokenizer::load("hf", written(dir, j));
  CHECK(hf.pretokenizer()->kind() == Pretokenizer::Kind::regex);  // GPT-2's scanner has no prefix
  CHECK(hf.encode("Hello world", "t") == gpt2().encode(" Hello world", "t"));
  CHECK(hf.encode(" Hello", "t") == gpt2().encode(" Hello", "t"));
  std::vector<uint32_t> around = gpt2().encode(" \ta", "t");  // a tab is not a space
  around.push_back(50257);
  around.push_back(gpt2().encode(" b", "t")[0]);
  CHECK(hf.encode("\ta<W>b", "t") == around);
  CHECK(hf.pretokenizer()->safe_cut("a b\nc.d", 1) == 7);  // never cut: each part would get a space
}

namespace {

// GPT-2's tokenizer.json with added tokens that are not special: found in the text as given
// ("normalized": false) or in the normalized text after those.
json with_added_words(json j) {
  const auto word = [](uint32_t id, const std::string& content, bool normalized) {
    return json{{"id", id},          {"content", content},         {"single_word", false}, {"lstrip", false},
                {"rstrip", false},   {"normalized", normalized},   {"special", false}};
  };
  for (const json& w : {word(50257, "<tool_call>", false), word(50258, "«q", false), word(50259, "«q»", false),
                        word(50260, "q»!", false), word(50261, " «q", true), word(50262, "xy z", true),
                        word(50263, "y z!", false), word(50264, "e\xCC\x81x", true)})
    j["added_tokens"].push_back(w);
  return j;
}

}  // namespace

TEST_CASE("tokenizer.json: added words that are not special are cut out of the text first", "[tokenizer]") {
  TempDir dir("tokjson");
  const Tokenizer hf = Tokenizer::load("hf", written(dir, with_added_words(gpt2_json())));
  const auto gpt2_ids = [](const std::string& text) { return gpt2().encode(text, "text"); };
  const auto join = [](std::vector<std::vector<uint32_t>> parts) {
    std::vector<uint32_t> all;
    for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
    return all;
  };
  CHECK(hf.encode("1<tool_call>2", "t") == join({gpt2_ids("1"), {50257}, gpt2_ids("2")}));
  // The leftmost match, and the longest word starting there; then on from its end.
  CHECK(hf.encode("x«q»!", "t") == join({gpt2_ids("x"), {50259}, gpt2_ids("!")}));
  CHECK(hf.encode("xq»!«q", "t") == join({gpt2_ids("x"), {50260, 50258}}));
  // Words found in the text as given go first: "y z!" before "xy z", which starts earlier.
  CHECK(hf.encode("xy z!", "t") == join({gpt2_ids("x"), {50263}}));
  CHECK(hf.encode("a «q", "t") == join({gpt2_ids("a "), {50258}}));
  CHECK(hf.encode("xy zz", "t") == join({{50262}, gpt2_ids("z")}));
  const std::string text = "a<tool_call> «q»! xy z! e\xCC\x81x";
  const std::vector<uint32_t> ids = hf.encode(text, "t");
  CHECK(hf.decode({ids.begin(), ids.end()}) == text);

  // Under NFC a normalized word is spelled as NFC leaves it and found in the normalized text.
  json nfc = with_added_words(gpt2_json());
  nfc["normalizer"] = {{"type", "NFC"}};
  const Tokenizer composed = Tokenizer::load("hf", written(dir, nfc));
  CHECK(composed.encode("1e\xCC\x81x", "t") == join({gpt2_ids("1"), {50264}}));
  CHECK(composed.encode("1\xC3\xA9x", "t") == join({gpt2_ids("1"), {50264}}));
  CHECK(hf.encode("1\xC3\xA9x", "t") == gpt2_ids("1\xC3\xA9x"));  // without NFC, é is not e + U+0301
}

// Text is cut for threads where no piece crosses: never within or just before an added word.
TEST_CASE("tokenizer.json: text with added words cut at a safe place encodes to the same ids", "[tokenizer]") {
  TempDir dir("tokjson");
  const Tokenizer hf = Tokenizer::load("hf", written(dir, with_added_words(gpt2_json())));
  std::mt19937 rng(17);
  const std::vector<std::string> alphabet = {"a", "b", "c", "d", "x", "y", "z", " ", "  ", "\n", "!", "e", "\xCC\x81",
                                             "<tool_call>", "<tool", "_call>", "«", "»", "q",
                                             "xy z", "y z!", "1"};
  int cuts = 0;
  for (int i = 0; i < 300; ++i) {
    std::string text;
    for (int n = 20 + static_cast<int>(rng() % 60); n > 0; --n) text += alphabet[rng() % alphabet.size()];
    const std::vector<uint32_t> whole = hf.encode(text, "t");
    for (size_t cut = hf.pretokenizer()->safe_cut(text, 1); cut < text.size();
         cut = hf.pretokenizer()->safe_cut(text, cut + 1)) {
      std::vector<uint32_t> parts = hf.encode(text.substr(0, cut), "t");
      const std::vector<uint32_t> rest = hf.encode(text.substr(cut), "t");
      parts.insert(parts.end(), rest.begin(), rest.end());
      INFO("text " << json(text).dump() << " cut at " << cut);
      REQUIRE(parts == whole);
      ++cuts;
    }
  }
  CHECK(cuts > 300);
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
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}};
  CHECK_THAT(refused(j), Catch::Contains("Replace normalizer's pattern is {\"Regex\"") && Catch::Contains("String"));
  j["normalizer"]["pattern"] = {{"String", ""}};
  CHECK_THAT(refused(j), Catch::Contains("Replace normalizer's pattern is {\"String\":\"\"}"));
  j["normalizer"]["pattern"] = {{"String", "a"}};
  j["normalizer"].erase("content");
  CHECK_THAT(refused(j), Catch::Contains("Replace normalizer's \"content\" is missing"));
  j["normalizer"] = {{"type", "Strip"}, {"strip_left", true}};
  CHECK_THAT(refused(j), Catch::Contains("Strip normalizer's \"strip_right\" is missing"));
  j["normalizer"] = {{"type", "StripAccents"}};
  CHECK_THAT(refused(j), Catch::Contains("normalizer is StripAccents"));
  j = gpt2_json();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}, {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
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
                         {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Isolated"}, {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  CHECK_THAT(refused(j), Catch::Contains("(unclosed") && Catch::Contains("does not compile"));
  j = gpt2_json();
  j["model"]["vocab"]["\xC4\xA0the"] = 7;  // an id twice
  CHECK_THAT(refused(j), Catch::Contains("appears twice"));
  j = gpt2_json();
  j["added_tokens"][0]["special"] = false;  // a word: a document's text would hold the marker
  CHECK_THAT(refused(j), Catch::Contains("which marks documents, is not special"));
  const json word = {{"id", 50257},    {"content", "<w>"},     {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", false}};
  for (const char* option : {"single_word", "lstrip", "rstrip"}) {
    j = gpt2_json();
    j["added_tokens"].push_back(word);
    j["added_tokens"][1][option] = true;
    CHECK_THAT(refused(j), Catch::Contains(std::string("<w>\"'s ") + option) && Catch::Contains("false"));
  }
  // Hugging Face's tokenizers reads no file without these (its loader says "missing field").
  for (const char* key : {"special", "normalized", "single_word", "lstrip", "rstrip"}) {
    j = gpt2_json();
    j["added_tokens"].push_back(word);
    j["added_tokens"][1].erase(key);
    CHECK_THAT(refused(j), Catch::Contains(std::string("<w>\"'s \"") + key + "\" is missing"));
  }
  for (const char* key : {"trim_offsets", "add_prefix_space"}) {
    j = gpt2_json();
    j["pre_tokenizer"].erase(key);
    CHECK_THAT(refused(j), Catch::Contains(std::string("pre_tokenizer's ByteLevel's \"") + key + "\" is missing"));
    // The decoder and the post-processor, which an export copies, likewise (in a Sequence too).
    j = gpt2_json();
    j["decoder"].erase(key);
    CHECK_THAT(refused(j), Catch::Contains(std::string("decoder's ByteLevel's \"") + key + "\" is missing"));
    j = gpt2_json();
    j["post_processor"] = {{"type", "Sequence"}, {"processors", {j["post_processor"]}}};
    CHECK_NOTHROW(Tokenizer::load("hf", written(dir, j)));
    j["post_processor"]["processors"][0].erase(key);
    CHECK_THAT(refused(j), Catch::Contains(std::string("post_processor's ByteLevel's \"") + key + "\" is missing"));
  }
  j = gpt2_json();
  j["version"] = "2.0";
  CHECK_THAT(refused(j), Catch::Contains("\"version\" is \"2.0\"; expected \"1.0\""));
  j.erase("version");
  CHECK_THAT(refused(j), Catch::Contains("\"version\" is missing"));
  j = gpt2_json();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Isolated"}},
                                           {{"type", "Digits"}},
                                           j["pre_tokenizer"]}}};
  CHECK_THAT(refused(j), Catch::Contains("Split's \"invert\" is missing"));
  j["pre_tokenizer"]["pretokenizers"][0]["invert"] = false;
  CHECK_THAT(refused(j), Catch::Contains("Digits's \"individual_digits\" is missing"));
  j["pre_tokenizer"]["pretokenizers"][1]["individual_digits"] = true;
  CHECK_NOTHROW(Tokenizer::load("hf", written(dir, j)));
  j = gpt2_json();
  j["added_tokens"].push_back(word);
  j["added_tokens"][1]["content"] = "";
  CHECK_THAT(refused(j), Catch::Contains("added token with id 50257 is empty"));
  j["added_tokens"][1]["content"] = " \t";
  j["added_tokens"][1]["normalized"] = true;
  j["normalizer"] = {{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}};
  CHECK_THAT(refused(j), Catch::Contains("added token \" \\t\", normalized, is empty"));
  j["normalizer"]["strip_right"] = "yes";
  CHECK_THAT(refused(j), Catch::Contains("Strip normalizer's \"strip_right\" is \"yes\"; expected true or false"));
  j = gpt2_json();
  j["added_tokens"].push_back(word);
  j["added_tokens"][1]["id"] = 397;  // GPT-2's "ab"
  CHECK_THAT(refused(j), Catch::Contains("\"<w>\"'s id is 397; expected 50257, the id Hugging Face gives it"));
  // Hugging Face reads no added token's id from the file: the model's for a text it has, else the
  // next free one, in order.
  j["added_tokens"][1]["content"] = "world";
  j["added_tokens"][1]["id"] = 50257;
  CHECK_THAT(refused(j), Catch::Contains("\"world\"'s id is 50257; expected 6894"));
  j["added_tokens"][1]["content"] = "zzqq";
  j["added_tokens"][1]["id"] = 50300;
  CHECK_THAT(refused(j), Catch::Contains("\"zzqq\"'s id is 50300; expected 50257"));
  j["added_tokens"][1]["id"] = 50257;
  j["added_tokens"].push_back(word);
  j["added_tokens"][2]["id"] = 50258;
  CHECK_NOTHROW(Tokenizer::load("hf", written(dir, j)));
  // A vocabulary with a gap (as cl100k_base's): the ids go on from its size, not from the largest.
  j = gpt2_json();
  j["model"]["vocab"]["<|sp|>"] = 60000;
  j["added_tokens"].push_back(word);
  j["added_tokens"][1]["content"] = "<|sp|>";
  j["added_tokens"][1]["id"] = 60000;
  j["added_tokens"].push_back(word);
  j["added_tokens"][2]["id"] = 60001;
  CHECK_THAT(refused(j), Catch::Contains("\"<w>\"'s id is 60001; expected 50258"));
  j["added_tokens"][2]["id"] = 50258;
  CHECK_NOTHROW(Tokenizer::load("hf", written(dir, j)));
  j = gpt2_json();
  j["added_tokens"].push_back(word);
  j["added_tokens"][1]["id"] = 397;
  j["added_tokens"][1]["content"] = "ab";  // the model's token, also cut out as a word
  const Tokenizer ab = Tokenizer::load("hf", written(dir, j));
  CHECK(ab.encode("xaby", "t") == std::vector<uint32_t>{ab.encode("x", "t")[0], 397, ab.encode("y", "t")[0]});
  CHECK(ab.encode(" abc", "t") == std::vector<uint32_t>{220, 397, 66});  // " ", "ab", "c"
  j = gpt2_json();
  j["added_tokens"][0]["id"] = 4294967296 + 100;
  CHECK_THAT(refused(j), Catch::Contains("added_tokens") && Catch::Contains("below"));
  j = gpt2_json();
  j["model"]["ignore_merges"] = "yes";
  CHECK_THAT(refused(j), Catch::Contains("\"ignore_merges\" is \"yes\"") && Catch::Contains("true or false"));
  j = gpt2_json();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "^\\s+|[^\\s]+"}}}, {"behavior", "Isolated"}, {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
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
