// GPT-2's tokenizer: ids equal to tiktoken's (a golden file made by tiktoken, so this runs
// without node; tests/oracle runs tiktoken itself), decode(encode(x)) == x, the two merge
// procedures and the safe cuts agree with a plain encode, both vocabulary formats give the
// same ids, and a missing or damaged vocabulary is a clear error.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe_encoder.h"
#include "data/gpt2_pieces.h"
#include "data/tokenizer.h"
#include "core/utf8.h"
#include "test_util.h"
#include "user_error.h"

namespace fs = std::filesystem;
using namespace ptrain;
using ptrain::test::TempDir;
using ptrain::test::user_error;

namespace {

// The vocabulary scripts/fetch-data.sh fetches (the test command runs it): without it these
// tests fail, saying so, rather than pass having checked nothing.
const Tokenizer& gpt2() {
  static const Tokenizer t = [] {
    if (!fs::exists(default_vocabulary("gpt2")))
      FAIL("GPT-2's vocabulary is not at " << default_vocabulary("gpt2") << "; run ./scripts/fetch-data.sh");
    return Tokenizer::load("gpt2");
  }();
  return t;
}

std::vector<int32_t> ids_of(const std::vector<uint32_t>& ids) { return {ids.begin(), ids.end()}; }

std::vector<uint32_t> encode(const std::string& text) { return gpt2().encode(text, "test text"); }

// Random valid UTF-8 drawn from characters that exercise every class: ASCII letters, digits,
// punctuation, white space of several kinds, apostrophes, accented and CJK letters, combining
// marks, emoji.
std::string random_text(std::mt19937& rng, size_t chars) {
  static const std::vector<std::string> alphabet = {
      "a", "b", "e", "s", "t", "l", "d", "m", "r", "v", "Z", "0", "7", "'", "'", "!", ".", ",", "-", " ", " ",
      " ", "  ", "\n", "\n", "\t", "\r", "\xC2\xA0", "\xE3\x80\x80", "\xC3\xA9", "\xE4\xB8\xAD", "\xCC\x81",
      "\xF0\x9F\x98\x80", "\xE2\x80\x8B", "\xC2\x85", "\xD9\xA3", "\xE2\x85\xAB"};
  std::string text;
  for (size_t i = 0; i < chars; ++i) text += alphabet[rng() % alphabet.size()];
  return text;
}

}  // namespace

TEST_CASE("gpt2: ids equal tiktoken's on the golden edge cases", "[tokenizer]") {
  const std::string path = (ptrain::test::source_dir() / "tests/fixtures/gpt2-golden.json").string();
  const nlohmann::json golden = nlohmann::json::parse(ptrain::test::read_file(path));
  REQUIRE(golden.size() > 400);
  int checked = 0;
  for (const auto& entry : golden) {
    const std::string text = entry["text"].get<std::string>();
    INFO("text: " << nlohmann::json(text).dump());
    CHECK(ids_of(encode(text)) == entry["ids"].get<std::vector<int32_t>>());
    ++checked;
  }
  CHECK(checked == static_cast<int>(golden.size()));
}

TEST_CASE("gpt2: decode(encode(x)) == x for valid UTF-8", "[tokenizer]") {
  std::mt19937 rng(11);
  for (int i = 0; i < 300; ++i) {
    const std::string text = random_text(rng, 1 + rng() % 200);
    const std::vector<uint32_t> ids = encode(text);
    CHECK(gpt2().decode(ids_of(ids)) == text);
  }
  CHECK(gpt2().decode({50256}) == "<|endoftext|>");
  CHECK(encode("<|endoftext|>") == std::vector<uint32_t>{27, 91, 437, 1659, 5239, 91, 29});  // text, not the token
}

TEST_CASE("bytes: every byte is its own id, high bytes too", "[tokenizer]") {
  const Tokenizer bytes = Tokenizer::load("bytes");
  CHECK(bytes.vocab_size() == 256);
  CHECK_FALSE(bytes.has_end_of_text());
  CHECK(bytes.encode("a\xE2\xFF", "t") == std::vector<uint32_t>{97, 226, 255});
  CHECK(bytes.decode({97, 226, 255}) == "a\xE2\xFF");
}

TEST_CASE("gpt2: invalid UTF-8 is refused with its byte offset", "[tokenizer]") {
  for (const std::string bad : {"ab\xFF", "ab\xC0\xAF", "ab\xED\xA0\x80", "ab\xF4\x90\x80\x80", "ab\xE2\x82"}) {
    CHECK(first_invalid_utf8(bad) == 2);
    CHECK_THAT(user_error([&] { encode(bad); }), Catch::Contains("invalid UTF-8 at byte offset 2"));
  }
  // Replacement follows the "maximal subpart" rule (Python's errors="replace", WHATWG).
  CHECK(replace_invalid_utf8("a\xE2\x82z") == "a\xEF\xBF\xBDz");
  CHECK(replace_invalid_utf8("a\xF0\x9F\x98") == "a\xEF\xBF\xBD");
  CHECK(replace_invalid_utf8("\xC0\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(replace_invalid_utf8("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(complete_utf8_prefix("ab\xE2\x82") == 2);
  CHECK(complete_utf8_prefix("ab\xE2\x82\xAC") == 5);
}

TEST_CASE("gpt2: merging by scan and by priority queue agree", "[tokenizer]") {
  BpeEncoder encoder(*gpt2().bpe(), *gpt2().pretokenizer());
  std::mt19937 rng(5);
  std::vector<std::string> pieces = {std::string(1000, ' '), std::string(777, 'a'), "abcabcabcabc",
                                     std::string(500, '!')};
  for (int i = 0; i < 200; ++i) pieces.push_back(random_text(rng, 1 + rng() % 300));
  for (const std::string& piece : pieces) {
    std::vector<uint32_t> scan, queue;
    encoder.merge_by_scan(piece, scan);
    encoder.merge_by_queue(piece, queue);
    INFO("piece of " << piece.size() << " bytes");
    CHECK(scan == queue);
  }
}

// A long text's encoder keeps the ids of short pieces in a small table (BpeEncoder's recent
// pieces); 20,000 distinct words, each drawn many times, fill it past every entry, so pieces
// that share an entry replace each other. The ids must be those of short texts, which go
// without the table.
TEST_CASE("gpt2: a long text encodes as its short parts do", "[tokenizer]") {
  std::mt19937 rng(11);
  std::vector<std::string> words;
  for (int i = 0; i < 20000; ++i) words.push_back(" " + random_text(rng, 1 + rng() % 12));
  std::string text;
  while (text.size() < (400 << 10)) text += words[rng() % words.size()];
  std::vector<uint32_t> parts;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = gpt2_safe_cut(text, std::min(text.size(), begin + (8 << 10)));
    const std::vector<uint32_t> ids = encode(text.substr(begin, end - begin));
    parts.insert(parts.end(), ids.begin(), ids.end());
    begin = end;
  }
  CHECK(encode(text) == parts);
}

TEST_CASE("gpt2: text cut at a safe place encodes to the same ids in parts", "[tokenizer]") {
  std::mt19937 rng(3);
  int cuts = 0;
  for (int i = 0; i < 200; ++i) {
    const std::string text = random_text(rng, 50 + rng() % 150);
    const std::vector<uint32_t> whole = encode(text);
    for (size_t cut = gpt2_safe_cut(text, 1); cut < text.size(); cut = gpt2_safe_cut(text, cut + 1)) {
      std::vector<uint32_t> parts = encode(text.substr(0, cut));
      const std::vector<uint32_t> rest = encode(text.substr(cut));
      parts.insert(parts.end(), rest.begin(), rest.end());
      INFO("text " << nlohmann::json(text).dump() << " cut at " << cut);
      REQUIRE(parts == whole);
      ++cuts;
    }
  }
  CHECK(cuts > 1000);
  // Not safe: inside a white-space run before a word (the run's last space leads the word).
  CHECK(gpt2_safe_cut("a  \nb", 1) == 5);
  CHECK(gpt2_safe_cut("a\nb", 1) == 2);
}

TEST_CASE("gpt2: vocab.json + merges.txt give the same ids as r50k_base.tiktoken", "[tokenizer]") {
  const std::string hf = (fs::path(data_cache_dir()) / "gpt2-hf").string();
  REQUIRE(fs::exists(fs::path(hf) / "vocab.json"));
  const Tokenizer own = Tokenizer::load("gpt2", hf);
  CHECK(own.vocab_size() == 50257);
  CHECK(own.end_of_text() == 50256);
  const std::string book = ptrain::test::read_file(fs::path(data_cache_dir()) / "text/moby-dick.txt");
  REQUIRE(book.size() > 1000000);
  const std::vector<uint32_t> ids = own.encode(book, "moby-dick.txt");
  CHECK(ids == gpt2().encode(book, "moby-dick.txt"));
  CHECK(ids.size() == 317756);  // as tiktoken counts it (tests/oracle compares every id)
}

TEST_CASE("gpt2: a missing or damaged vocabulary is an error naming the file and how to fetch it", "[tokenizer]") {
  TempDir dir("vocab");
  std::string message = user_error([&] { Tokenizer::load("gpt2", (dir.dir / "none.tiktoken").string()); });
  CHECK_THAT(message, Catch::Contains("none.tiktoken") && Catch::Contains("fetch-data.sh"));

  std::string text = ptrain::test::read_file(default_vocabulary("gpt2"));
  text[100] ^= 1;  // one bit
  ptrain::test::write_file(dir.dir / "damaged.tiktoken", text);
  message = user_error([&] { Tokenizer::load("gpt2", (dir.dir / "damaged.tiktoken").string()); });
  CHECK_THAT(message, Catch::Contains("damaged.tiktoken") && Catch::Contains("SHA-256") &&
                          Catch::Contains("fetch-data.sh"));

  fs::create_directories(dir.dir / "hf");
  ptrain::test::write_file(dir.dir / "hf/vocab.json", "{\"a\": 0, \"<|endoftext|>\": 1}");
  ptrain::test::write_file(dir.dir / "hf/merges.txt", "#version: 0.2\n");
  message = user_error([&] { Tokenizer::load("gpt2", (dir.dir / "hf").string()); });
  CHECK_THAT(message, Catch::Contains("vocab.json") && Catch::Contains("byte"));
  ptrain::test::write_file(dir.dir / "hf/vocab.json", "{\"a\": 0, \"a\": 1");
  message = user_error([&] { Tokenizer::load("gpt2", (dir.dir / "hf").string()); });
  CHECK_THAT(message, Catch::Contains("vocab.json"));
}
