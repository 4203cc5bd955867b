// The BPE tokenizers on any bytes (gpt2, cl100k_base and o200k_base, those with scanners of
// their own):
// invalid UTF-8 is refused (UserError) or replaced into valid UTF-8; valid text encodes to ids
// inside the vocabulary that decode back to it; the scanner cuts the pieces ICU's regex cuts
// with the same pattern; the two merge procedures agree on every piece; and a cut at a safe
// place changes no id.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/utf8.h"
#include "data/bpe_encoder.h"
#include "data/cl100k_pieces.h"
#include "data/gpt2_pieces.h"
#include "data/o200k_pieces.h"
#include "data/regex_pieces.h"
#include "data/tokenizer.h"
#include "fuzz_util.h"

namespace {

struct Subject {
  ptrain::Tokenizer tokenizer;
  size_t (*piece_end)(std::string_view, size_t);
  std::unique_ptr<ptrain::PiecePattern> pattern;
};

// The vocabularies fetch-data.sh fetched.
std::vector<Subject>& subjects() {
  static std::vector<Subject> all = [] {
    std::vector<Subject> s;
    const std::pair<const char*, size_t (*)(std::string_view, size_t)> scanners[] = {
        {"gpt2", ptrain::gpt2_piece_end}, {"cl100k_base", ptrain::cl100k_piece_end}, {"o200k_base", ptrain::o200k_piece_end}};
    for (const auto& [name, piece_end] : scanners) {
      const ptrain::Tokenizer t = ptrain::Tokenizer::load(name);
      s.push_back({t, piece_end, std::make_unique<ptrain::PiecePattern>(t.pretokenizer()->pattern(), name)});
    }
    return s;
  }();
  return all;
}

void fail(const char* what) { throw std::logic_error(what); }

using Pieces = std::vector<std::pair<size_t, size_t>>;

void check(Subject& s, const std::string& input) {
  const ptrain::Tokenizer& t = s.tokenizer;
  std::string text = input;
  if (ptrain::first_invalid_utf8(input) != ptrain::kValidUtf8) {
    if (ptrain::fuzz::accepted([&] { t.encode(input, "input"); })) fail("invalid UTF-8 was encoded");
    text = ptrain::replace_invalid_utf8(input);
    if (ptrain::first_invalid_utf8(text) != ptrain::kValidUtf8) fail("replacement left invalid UTF-8");
  }
  const std::vector<uint32_t> ids = t.encode(text, "input");
  std::vector<int32_t> as_int(ids.begin(), ids.end());
  for (const uint32_t id : ids)
    if (static_cast<int>(id) >= t.vocab_size() || t.bpe()->is_special(id)) fail("an id outside the text vocabulary");
  if (t.decode(as_int) != text) fail("decode(encode(x)) != x");

  Pieces scanned, matched;
  ptrain::for_each_piece(text, s.piece_end, [&](size_t begin, size_t end) { scanned.emplace_back(begin, end); });
  ptrain::RegexPieces regex(*s.pattern);
  regex.for_each(text, [&](size_t begin, size_t end) { matched.emplace_back(begin, end); });
  if (scanned != matched) fail("the scanner and ICU's regex cut different pieces");

  ptrain::BpeEncoder encoder(*t.bpe(), *t.pretokenizer());
  for (const auto& [begin, end] : scanned) {
    std::vector<uint32_t> scan, queue;
    encoder.merge_by_scan(std::string_view(text).substr(begin, end - begin), scan);
    encoder.merge_by_queue(std::string_view(text).substr(begin, end - begin), queue);
    if (scan != queue) fail("merging by scan and by queue disagree");
  }
  const size_t cut = t.pretokenizer()->safe_cut(text, text.size() / 2);
  if (cut < text.size()) {
    std::vector<uint32_t> parts = t.encode(text.substr(0, cut), "left");
    const std::vector<uint32_t> right = t.encode(text.substr(cut), "right");
    parts.insert(parts.end(), right.begin(), right.end());
    if (parts != ids) fail("a safe cut changed the ids");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  for (Subject& s : subjects()) check(s, input);
  return 0;
}
