#include "data/pretokenizer.h"

#include "data/cl100k_pieces.h"
#include "data/gpt2_pieces.h"
#include "data/o200k_pieces.h"

namespace ptrain {

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

Pretokenizer Pretokenizer::from_pattern(const std::string& pattern, const std::string& what) {
  return from_splits({SplitRule{pattern}}, what);
}

Pretokenizer Pretokenizer::from_splits(std::vector<SplitRule> splits, const std::string& what, Normalizer normalizer,
                                       size_t prefix_space_at) {
  Pretokenizer p;
  p.normalizer_ = std::move(normalizer);
  p.splits_ = std::move(splits);
  p.prefix_space_at_ = prefix_space_at;
  const bool one_isolated = p.splits_.size() == 1 && p.splits_[0].behavior == SplitBehavior::isolated &&
                            !p.splits_[0].invert && prefix_space_at == kNoPrefixSpace;
  if (one_isolated) p.pattern_ = p.splits_[0].pattern;
  if (one_isolated && p.pattern_ == kGpt2Pattern) {
    p.kind_ = Kind::gpt2;
  } else if (one_isolated && p.pattern_ == kCl100kPattern) {
    p.kind_ = Kind::cl100k;
  } else if (one_isolated && p.pattern_ == kO200kPattern) {
    p.kind_ = Kind::o200k;
  } else {
    p.kind_ = Kind::regex;
    for (const SplitRule& rule : p.splits_) p.regexes_.push_back(std::make_shared<const PiecePattern>(rule.pattern, what));
  }
  return p;
}

Pretokenizer Pretokenizer::with_added_words(AddedWords raw, AddedWords normalized) && {
  raw_words_ = std::move(raw);
  normalized_words_ = std::move(normalized);
  return std::move(*this);
}

namespace {

// Bytes after a cut kept clear of added words as well, to be safe: the scanners place a cut by
// the characters after it, and the text between words ends where a word starts.
constexpr size_t kScannerLookahead = 16;

}  // namespace

size_t Pretokenizer::safe_cut(std::string_view text, size_t from) const {
  if (!normalizer_.empty()) return text.size();
  const auto cut = [&](size_t at) {
    switch (kind_) {
      case Kind::gpt2: return gpt2_safe_cut(text, at);
      case Kind::cl100k: return cl100k_safe_cut(text, at);
      case Kind::o200k: return o200k_safe_cut(text, at);
      case Kind::regex: break;
    }
    return text.size();
  };
  const auto near_word = [&](size_t at) {
    return raw_words_.near(text, at, raw_words_.longest(), kScannerLookahead) ||
           normalized_words_.near(text, at, normalized_words_.longest(), kScannerLookahead);
  };
  size_t at = cut(from);
  while (at < text.size() && near_word(at)) at = cut(at + 1);
  return at;
}

}  // namespace ptrain
