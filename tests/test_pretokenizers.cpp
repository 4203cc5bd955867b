// The pre-tokenisers of GPT-2, cl100k_base (also Llama 3's) and o200k_base, each a scanner
// written for its pattern, against ICU's regex engine running the same pattern: every code
// point of the Basic Multilingual Plane and some beyond, in the contexts the patterns tell
// apart, and random text; both with Unicode 16.0's character classes.
// Then the cl100k_base and o200k_base tokenizers: safe cuts, both merge procedures, round
// trips, and their vocabularies' errors. (tests/oracle compares the ids with tiktoken's.)
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/utf8.h"
#include "data/bpe_encoder.h"
#include "data/cl100k_pieces.h"
#include "data/char_class.h"
#include "data/gpt2_pieces.h"
#include "data/o200k_pieces.h"
#include "data/regex_pieces.h"
#include "data/tokenizer.h"
#include "test_util.h"
#include "user_error.h"

namespace fs = std::filesystem;
using namespace ptrain;
using ptrain::test::TempDir;
using ptrain::test::user_error;

namespace {

using Pieces = std::vector<std::pair<size_t, size_t>>;

const Tokenizer& loaded(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto found = cache.find(name);
  if (found == cache.end()) {
    if (!fs::exists(default_vocabulary(name)))
      FAIL(name << "'s vocabulary is not at " << default_vocabulary(name) << "; run ./scripts/fetch-data.sh");
    found = cache.emplace(name, Tokenizer::load(name)).first;
  }
  return found->second;
}


// Random valid UTF-8 from characters of every class the patterns tell apart.
std::string random_text(std::mt19937& rng, size_t chars) {
  static const std::vector<std::string> alphabet = {
      "a", "B", "e", "s", "S", "t", "l", "L", "d", "m", "r", "R", "v", "E", "0", "7", "'", "'", "!", ".", "/",
      " ", " ", " ", "  ", "\n", "\n", "\n/", "\r", "\t", "\xC2\xA0", "\xE3\x80\x80", "\xC3\xA9", "\xC3\x89",
      "\xE4\xB8\xAD", "\xCC\x81", "\xF0\x9F\x98\x80", "\xE2\x80\x8B", "\xC2\x85", "\x0B", "\xD9\xA3",
      "\xE2\x85\xAB", "\xC5\xBF", "\xCA\xB0", "\xC7\x85", "\xE1\xB2\x89", "\xE1\xB2\x8A", "\xE0\xA2\x97",
      "\xF0\xAE\xAF\xB0"};  // the last four: Unicode 16.0's Lu, Ll, Mn and CJK extension I's Lo
  std::string text;
  for (size_t i = 0; i < chars; ++i) text += alphabet[rng() % alphabet.size()];
  return text;
}

// Every code point that is a character (no surrogates), the BMP and a sample beyond it.
std::vector<char32_t> code_points() {
  std::vector<char32_t> all;
  for (char32_t c = 1; c < 0x10000; ++c)
    if (c < 0xD800 || c > 0xDFFF) all.push_back(c);
  for (char32_t c = 0x10000; c < 0x110000; c += 97) all.push_back(c);
  for (const char32_t c : {0x10D40, 0x113B8, 0x1612A, 0x2EBF0, 0x2EE5D})  // Unicode 16.0's Nd, Mc, Lo
    all.push_back(c);
  return all;
}

// Each code point in the contexts the patterns distinguish, as one text per kind of context:
// the pieces of a long text are checked, so a wrong cut anywhere shows.
std::vector<std::string> contexts() {
  const std::vector<std::pair<std::string, std::string>> around = {
      {"", ""},   {"a", "b"},   {" ", "a"},   {"'", "s"},  {"x'", "LL"}, {"1", "2"},  {" ", "!"},
      {"\n", "a"}, {"a", "\n"}, {"  ", "a"}, {"!", "\r\n"}, {"'", ""},   {"\t", "\t"}, {"A", "bc"}};
  std::vector<std::string> texts;
  for (const auto& [before, after] : around) {
    std::string text;
    for (const char32_t c : code_points()) text += before + encode_utf8(c) + after + "|";
    texts.push_back(std::move(text));
  }
  return texts;
}

Pieces scanned(const std::string& text, size_t (*piece_end)(std::string_view, size_t)) {
  Pieces pieces;
  for_each_piece(text, piece_end, [&](size_t b, size_t e) { pieces.emplace_back(b, e); });
  return pieces;
}

Pieces matched(const std::string& text, const PiecePattern& pattern) {
  Pieces pieces;
  RegexPieces regex(pattern);
  regex.for_each(text, [&](size_t b, size_t e) { pieces.emplace_back(b, e); });
  return pieces;
}

// Where two piece lists first differ, shown as text.
std::string first_difference(const std::string& text, const Pieces& a, const Pieces& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i] != b[i]) {
      const size_t from = std::min(a[i].first, b[i].first);
      return nlohmann::json(text.substr(from > 20 ? from - 20 : 0, 60)).dump() + ": scanner [" +
             std::to_string(a[i].first) + ", " + std::to_string(a[i].second) + "), regex [" +
             std::to_string(b[i].first) + ", " + std::to_string(b[i].second) + ")";
    }
  return "one list is longer";
}

void check_scanner(const std::string& name, size_t (*piece_end)(std::string_view, size_t), const char* pattern) {
  const PiecePattern regex(pattern, name);
  std::mt19937 rng(17);
  std::vector<std::string> texts = contexts();
  for (int i = 0; i < 300; ++i) texts.push_back(random_text(rng, 1 + rng() % 300));
  for (const std::string& text : texts) {
    const Pieces a = scanned(text, piece_end), b = matched(text, regex);
    INFO(name << ": " << (a == b ? "" : first_difference(text, a, b)));
    REQUIRE(a == b);
  }
}

}  // namespace

TEST_CASE("pretokenizers: the cl100k_base scanner cuts the pieces ICU's regex cuts", "[tokenizer]") {
  check_scanner("cl100k_base", cl100k_piece_end, kCl100kPattern);
}

TEST_CASE("pretokenizers: the GPT-2 scanner cuts the pieces ICU's regex cuts", "[tokenizer]") {
  check_scanner("gpt2", gpt2_piece_end, kGpt2Pattern);
}

TEST_CASE("pretokenizers: the o200k_base scanner cuts the pieces ICU's regex cuts", "[tokenizer]") {
  check_scanner("o200k_base", o200k_piece_end, kO200kPattern);
}

TEST_CASE("pretokenizers: the characters Unicode 15.1 and 16.0 added are letters, marks and numbers", "[tokenizer]") {
  auto kind = [](char32_t c) {
    int length;
    return char_kind_at(encode_utf8(c), 0, length);
  };
  CHECK(kind(0x1C89) == CharKind::upper);   // CYRILLIC CAPITAL LETTER TJE
  CHECK(kind(0x1C8A) == CharKind::lower);   // CYRILLIC SMALL LETTER TJE
  CHECK(kind(0x0897) == CharKind::mark);    // ARABIC PEPET
  CHECK(kind(0x2EBF0) == CharKind::caseless);  // CJK extension I
  CHECK(kind(0x11BF0) == CharKind::number);    // SUNUWAR DIGIT ZERO
  CHECK(kind(0x2EE5E) == CharKind::other);     // still unassigned
  CHECK(kind(0x0041) == CharKind::upper);
  // The regex engine's \p{..}, \P{..} and \d know them too, named in any of the usual ways.
  const std::string tje = encode_utf8(0x1C89), ext_i = encode_utf8(0x2EBF0), digit = encode_utf8(0x11BF0);
  CHECK(matched("x" + ext_i + "y!", PiecePattern(R"(\p{L}+)", "t")) == Pieces{{0, 6}, {6, 7}});
  CHECK(matched("!" + ext_i, PiecePattern(R"(\P{Letter}+)", "t")) == Pieces{{0, 1}, {1, 5}});
  CHECK(matched("!" + ext_i, PiecePattern(R"([^\p{L}]+)", "t")) == Pieces{{0, 1}, {1, 5}});
  CHECK(matched(tje + "a", PiecePattern(R"(\p{gc=Uppercase_Letter})", "t")) == Pieces{{0, 3}, {3, 4}});
  CHECK(matched(digit + "1x", PiecePattern(R"(\d+)", "t")) == Pieces{{0, 5}, {5, 6}});
  CHECK(matched(digit + "x", PiecePattern(R"(\D+)", "t")) == Pieces{{0, 4}, {4, 5}});
  CHECK(matched("x" + ext_i, PiecePattern(R"(\pL+)", "t")) == Pieces{{0, 5}});
  CHECK(matched("!" + ext_i, PiecePattern(R"(\p{^L}+)", "t")) == Pieces{{0, 1}, {1, 5}});
  // Sets that hold unassigned code points lose those Unicode 16.0 assigned.
  CHECK(matched(ext_i + encode_utf8(0x2EE5E), PiecePattern(R"(\p{Cn}+)", "t")) == Pieces{{0, 4}, {4, 8}});
  CHECK(matched(ext_i + "\x01", PiecePattern(R"([^\P{C}]+)", "t")) == Pieces{{0, 4}, {4, 5}});
  // What the additions cannot mend is refused by name.
  for (const char* pattern : {R"(\p{Han}+)", R"(\w+)", R"(\bx)", R"([[:alpha:]]+)", R"(\p{Alphabetic})"})
    CHECK_THAT(user_error([&] { PiecePattern(pattern, "tokenizer.json"); }),
               Catch::Contains(pattern) && Catch::Contains("general categories"));
}

// Hugging Face's documentation of SplitDelimiterBehavior (tokenizers/src/tokenizer/normalizer.rs)
// splits "the-final--countdown" on '-' so.
TEST_CASE("pretokenizers: a Split keeps, drops or joins its matches as Hugging Face's behaviors say", "[tokenizer]") {
  const std::string text = "the-final--countdown";
  const PiecePattern dash("-", "t");
  RegexPieces matcher(dash);
  auto pieces = [&](SplitBehavior behavior, bool invert) {
    std::vector<Span> spans;
    matcher.split(text, behavior, invert, 0, spans);
    std::vector<std::string> out;
    for (const auto& [b, e] : spans) out.push_back(text.substr(b, e - b));
    return out;
  };
  using V = std::vector<std::string>;
  CHECK(pieces(SplitBehavior::removed, false) == V{"the", "final", "countdown"});
  CHECK(pieces(SplitBehavior::isolated, false) == V{"the", "-", "final", "-", "-", "countdown"});
  CHECK(pieces(SplitBehavior::merged_with_previous, false) == V{"the-", "final-", "-", "countdown"});
  CHECK(pieces(SplitBehavior::merged_with_next, false) == V{"the", "-final", "-", "-countdown"});
  CHECK(pieces(SplitBehavior::contiguous, false) == V{"the", "-", "final", "--", "countdown"});
  CHECK(pieces(SplitBehavior::removed, true) == V{"-", "-", "-"});  // inverted: the words go
  // Empty matches as Hugging Face's iteration (the onig crate's) takes them: one where the match
  // before it ended is passed over.
  auto split_by = [](const char* pattern, const std::string& s, SplitBehavior behavior) {
    const PiecePattern p(pattern, "t");
    RegexPieces m(p);
    std::vector<Span> spans;
    m.split(s, behavior, false, 0, spans);
    std::vector<std::string> out;
    for (const auto& [b, e] : spans) out.push_back(s.substr(b, e - b));
    return out;
  };
  CHECK(split_by(R"(\s*)", "a  b", SplitBehavior::merged_with_next) == V{"a", "  b"});
  CHECK(split_by(R"(\d+|(?=x))", "1ax", SplitBehavior::isolated) == V{"1", "a", "x"});
  CHECK(split_by(R"(\d+|(?=x))", "1x", SplitBehavior::merged_with_next) == V{"1x"});
  CHECK(split_by(R"(\d*)", "a1bbb2", SplitBehavior::isolated) == V{"a", "1", "b", "b", "b", "2"});
  // Splits in turn, each on the pieces of the one before; none: the text whole.
  const Pretokenizer two = Pretokenizer::from_splits(
      {{"[0-9]+", SplitBehavior::isolated, false}, {"\\s+", SplitBehavior::removed, false}}, "t");
  CHECK(two.kind() == Pretokenizer::Kind::regex);
  RegexSplitter splitter(two.splits(), two.regexes());
  V got;
  const auto collect = [&](std::string_view p) { got.emplace_back(p); };
  splitter.for_each("ab12 cd  3e", collect);
  CHECK(got == V{"ab", "12", "cd", "3", "e"});
  const Pretokenizer none = Pretokenizer::from_splits({}, "t");
  RegexSplitter whole(none.splits(), none.regexes());
  got.clear();
  whole.for_each("a b", collect);
  CHECK(got == V{"a b"});
  // ByteLevel's add_prefix_space: a space before each piece the Splits before it leave, unless
  // it starts with one (another white space does not count); then the Splits after it.
  RegexSplitter after_both(two.splits(), two.regexes(), 2);
  got.clear();
  after_both.for_each("ab12 cd", collect);
  CHECK(got == V{" ab", " 12", " cd"});
  RegexSplitter before_both(two.splits(), two.regexes(), 0);
  got.clear();
  before_both.for_each("ab12 cd", collect);  // " ab12 cd", then the digits, then no spaces
  CHECK(got == V{"ab", "12", "cd"});
  RegexSplitter text_whole(none.splits(), none.regexes(), 0);
  got.clear();
  text_whole.for_each(" a", collect);
  text_whole.for_each("\ta", collect);
  CHECK(got == V{" a", " \ta"});
  CHECK(Pretokenizer::from_splits({{kGpt2Pattern}}, "t", {}, 0).kind() == Pretokenizer::Kind::regex);
}

TEST_CASE("pretokenizers: a known pattern gets its scanner, any other the regex engine", "[tokenizer]") {
  CHECK(Pretokenizer::from_pattern(kGpt2Pattern, "t").kind() == Pretokenizer::Kind::gpt2);
  CHECK(Pretokenizer::from_pattern(kCl100kPattern, "t").kind() == Pretokenizer::Kind::cl100k);
  const Pretokenizer o200k = Pretokenizer::from_pattern(kO200kPattern, "t");
  CHECK(o200k.kind() == Pretokenizer::Kind::o200k);
  CHECK(o200k.safe_cut("some text\nmore", 1) == 10);  // o200k_base's: after a line break
  CHECK(o200k.safe_cut("a.\n/b\n c\nd", 1) == 9);    // not before '/' or white space
  const Pretokenizer other = Pretokenizer::from_pattern(R"(\S+|\s+)", "t");
  CHECK(other.safe_cut("some text\nmore", 1) == 14);  // any other regex's pieces are not cut
  // \s is Unicode's White_Space, as in Rust's regex: U+000B and U+0085 are white space.
  const PiecePattern spaces(R"(\s+|\S+)", "t");
  CHECK(matched("a\x0B\xC2\x85z", spaces) == Pieces{{0, 1}, {1, 4}, {4, 5}});
  CHECK_THAT(user_error([] { PiecePattern("(unclosed", "tokenizer.json pre_tokenizer"); }),
             Catch::Contains("tokenizer.json pre_tokenizer") && Catch::Contains("(unclosed"));
}

TEST_CASE("cl100k_base and o200k_base: safe cuts change no id, and both merge procedures agree", "[tokenizer]") {
  std::mt19937 rng(3);
  for (const char* name : {"cl100k_base", "o200k_base"}) {
    const Tokenizer& t = loaded(name);
    BpeEncoder encoder(*t.bpe(), *t.pretokenizer());
    int cuts = 0;
    for (int i = 0; i < 150; ++i) {
      const std::string text = random_text(rng, 50 + rng() % 150);
      const std::vector<uint32_t> whole = t.encode(text, "text");
      CHECK(t.decode(std::vector<int32_t>(whole.begin(), whole.end())) == text);
      for (size_t cut = t.pretokenizer()->safe_cut(text, 1); cut < text.size();
           cut = t.pretokenizer()->safe_cut(text, cut + 1)) {
        std::vector<uint32_t> parts = t.encode(text.substr(0, cut), "left");
        const std::vector<uint32_t> rest = t.encode(text.substr(cut), "right");
        parts.insert(parts.end(), rest.begin(), rest.end());
        INFO(name << ": text " << nlohmann::json(text).dump() << " cut at " << cut);
        REQUIRE(parts == whole);
        ++cuts;
      }
      std::vector<uint32_t> scan, queue;
      encoder.merge_by_scan(text, scan);
      encoder.merge_by_queue(text, queue);
      CHECK(scan == queue);
    }
    CHECK(cuts > (std::string(name) == "cl100k_base" ? 1000 : 100));
  }
}

TEST_CASE("cl100k_base and o200k_base: sizes, end of text, and special tokens as text", "[tokenizer]") {
  const Tokenizer& cl = loaded("cl100k_base");
  CHECK(cl.vocab_size() == 100277);
  CHECK(cl.end_of_text() == 100257);
  CHECK(cl.decode({100257, 100276}) == "<|endoftext|><|endofprompt|>");
  CHECK(cl.decode({100256, 100261}).empty());  // ids no token has
  CHECK(cl.encode("<|endoftext|>", "t").size() > 1);  // text, not the token
  const Tokenizer& o = loaded("o200k_base");
  CHECK(o.vocab_size() == 200019);
  CHECK(o.end_of_text() == 199999);
  CHECK(tokenizer_ids("o200k_base") == o.vocab_size());
  CHECK(tokenizer_ids("cl100k_base") == cl.vocab_size());
}

TEST_CASE("cl100k_base: another vocabulary file or a directory is an error naming it", "[tokenizer]") {
  TempDir dir("vocab");
  std::string text = ptrain::test::read_file(default_vocabulary("cl100k_base"));
  text[200] ^= 1;
  ptrain::test::write_file(dir.dir / "other.tiktoken", text);
  std::string message = user_error([&] { Tokenizer::load("cl100k_base", (dir.dir / "other.tiktoken").string()); });
  CHECK_THAT(message, Catch::Contains("other.tiktoken") && Catch::Contains("SHA-256") &&
                          Catch::Contains("fetch-data.sh"));
  message = user_error([&] { Tokenizer::load("cl100k_base", dir.dir.string()); });
  CHECK_THAT(message, Catch::Contains("is a directory") && Catch::Contains(".tiktoken"));
  message = user_error([&] { Tokenizer::load("cl100k_base", default_vocabulary("gpt2")); });
  CHECK_THAT(message, Catch::Contains("SHA-256"));
  message = user_error([&] { Tokenizer::load("p50k_base"); });
  CHECK_THAT(message, Catch::Contains("p50k_base") && Catch::Contains("cl100k_base"));
}
