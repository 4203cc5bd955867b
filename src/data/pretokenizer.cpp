#include "data/pretokenizer.h"

#include "data/char_class.h"
#include "data/cl100k_pieces.h"
#include "data/gpt2_pieces.h"

#include <algorithm>

namespace ptrain {

namespace {

// o200k_base's pattern runs on the regex engine, but where it may be cut is known: after a
// carriage return or line feed, before a character that is neither white space nor '/'. No
// piece runs from a line break into text: the only alternatives that take a line break are
// " ?[^\s\p{L}\p{N}]+[\r\n/]*" (which goes on through '/' and more breaks) and the white-space
// ones (which stop at text); and a piece's end there reads nothing past it.
size_t o200k_safe_cut(std::string_view text, size_t from) {
  for (size_t i = std::max<size_t>(from, 1); i < text.size(); ++i) {
    if ((text[i - 1] != '\n' && text[i - 1] != '\r') || text[i] == '/') continue;
    int length;
    if (char_class_at(text, i, length) != CharClass::space) return i;
  }
  return text.size();
}

}  // namespace

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

Pretokenizer Pretokenizer::from_pattern(const std::string& pattern, const std::string& what,
                                        std::vector<UnicodeForm> normalizer) {
  Pretokenizer p;
  p.pattern_ = pattern;
  p.normalizer_ = std::move(normalizer);
  if (pattern == kGpt2Pattern) {
    p.kind_ = Kind::gpt2;
  } else if (pattern == kCl100kPattern) {
    p.kind_ = Kind::cl100k;
  } else {
    p.kind_ = Kind::regex;
    p.regex_ = std::make_shared<const PiecePattern>(pattern, what);
  }
  return p;
}

size_t Pretokenizer::safe_cut(std::string_view text, size_t from) const {
  if (!normalizer_.empty()) return text.size();
  switch (kind_) {
    case Kind::gpt2: return gpt2_safe_cut(text, from);
    case Kind::cl100k: return cl100k_safe_cut(text, from);
    case Kind::regex: return pattern_ == kO200kPattern ? o200k_safe_cut(text, from) : text.size();
  }
  return text.size();
}

}  // namespace ptrain
