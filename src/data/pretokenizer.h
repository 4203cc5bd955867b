// What a tokenizer does to text before byte-pair merges: added words out (data/added_words.h),
// the normalizer its tokenizer.json sets (data/text_normalizer.h), then cutting into pieces
// (merges never cross a piece's edge). The
// patterns of GPT-2, cl100k_base (also Llama 3's) and o200k_base have scanners of their own;
// any other pattern runs on ICU's regex engine (data/regex_pieces.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include <vector>

#include "data/added_words.h"
#include "data/regex_pieces.h"
#include "data/text_normalizer.h"

namespace ptrain {

// tiktoken's patterns, as its encodings and Hugging Face's tokenizer.json files spell them.
extern const char* const kGpt2Pattern;
extern const char* const kCl100kPattern;
extern const char* const kO200kPattern;

class Pretokenizer {
 public:
  enum class Kind { gpt2, cl100k, o200k, regex };

  // The scanner for a known pattern, else the pattern on ICU's regex (UserError naming
  // `what` when it does not compile).
  static Pretokenizer from_pattern(const std::string& pattern, const std::string& what);
  // Splits in turn, each on the pieces of the one before, after `normalizer`; a space before
  // each piece of the first `prefix_space_at` (RegexSplitter). A single Split keeping its
  // matches with a known pattern, and no prefix space, gets that pattern's scanner.
  static Pretokenizer from_splits(std::vector<SplitRule> splits, const std::string& what, Normalizer normalizer = {},
                                  size_t prefix_space_at = kNoPrefixSpace);
  // With added words: `raw` found in the text as given, `normalized` (spelled as the
  // normalizer leaves them) in the normalized text between.
  Pretokenizer with_added_words(AddedWords raw, AddedWords normalized) &&;

  Kind kind() const { return kind_; }
  // The pattern of a tokenizer with one Split keeping its matches (every tiktoken encoding);
  // empty otherwise.
  const std::string& pattern() const { return pattern_; }
  const std::vector<SplitRule>& splits() const { return splits_; }
  const std::vector<std::shared_ptr<const PiecePattern>>& regexes() const { return regexes_; }
  const Normalizer& normalizer() const { return normalizer_; }
  size_t prefix_space_at() const { return prefix_space_at_; }
  const AddedWords& raw_words() const { return raw_words_; }
  const AddedWords& normalized_words() const { return normalized_words_; }

  // The first place at or after `from` where valid UTF-8 `text` may be cut so that the halves
  // give the pieces the whole does; text.size() when there is none (a regex's pieces are
  // taken whole, as nothing is known about where they may end; so is normalized text, as a cut
  // may fall inside what a normalizer joins or where it strips or prepends). Not near an added
  // word either, where the text between words, pre-tokenized alone, may cut otherwise.
  size_t safe_cut(std::string_view text, size_t from) const;

 private:
  Kind kind_ = Kind::gpt2;
  std::string pattern_;
  std::vector<SplitRule> splits_;
  std::vector<std::shared_ptr<const PiecePattern>> regexes_;  // one per Split, for Kind::regex
  Normalizer normalizer_;
  size_t prefix_space_at_ = kNoPrefixSpace;
  AddedWords raw_words_, normalized_words_;
};

// Calls `piece(begin, end)` for each piece `piece_end` finds in `text`, in order.
template <typename End, typename F>
void for_each_piece(std::string_view text, End&& piece_end, F&& piece) {
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = piece_end(text, begin);
    piece(begin, end);
    begin = end;
  }
}

}  // namespace ptrain
