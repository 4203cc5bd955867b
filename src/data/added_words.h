// The added tokens of a Hugging Face tokenizer.json that are not special tokens: words that
// Hugging Face's tokenizers cuts out of any text before pre-tokenization, each one id. Those
// marked "normalized": false are found in the text as given; the others in the text as the
// normalizer leaves it, once the first kind are out (AddedVocabulary::extract_and_normalize).
// Within each kind the leftmost match wins, and the longest word of those starting there (an
// Aho-Corasick automaton's MatchKind::LeftmostLongest); the search goes on from its end.
// Special tokens are not here: ptrain reads their text as text (tiktoken's encode_ordinary).
// Hugging Face matches them in the same pass, so on text holding a special token's text, a
// word overlapping it may be found where Hugging Face finds the special token instead.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ptrain {

// A token a tokenizer file adds beside its model's: a special token (BpeVocabulary) or a word.
struct AddedToken {
  std::string text;
  uint32_t id = 0;
};

struct AddedWordMatch {
  size_t begin = 0, end = 0;  // begin == the text's size: none
  uint32_t id = 0;
};

class AddedWords {
 public:
  AddedWords() = default;
  explicit AddedWords(std::vector<AddedToken> words);

  bool empty() const { return words_.empty(); }
  const std::vector<AddedToken>& words() const { return words_; }  // longest first
  // The first match in text[from, ...).
  AddedWordMatch find(std::string_view text, size_t from) const;
  // Whether a word may lie near `at`: one starts within `before` bytes before it or `after`
  // bytes after it, or that window passes the text's end (the rest is unknown), counting a
  // word cut off by the end as there.
  bool near(std::string_view text, size_t at, size_t before, size_t after) const;
  size_t longest() const { return words_.empty() ? 0 : words_.front().text.size(); }

 private:
  bool starts_at(std::string_view text, size_t at, const AddedToken& word) const {
    return text.compare(at, word.text.size(), word.text) == 0;
  }

  std::vector<AddedToken> words_;
  std::array<bool, 256> first_bytes_{};  // the bytes a word starts with
};

}  // namespace ptrain
