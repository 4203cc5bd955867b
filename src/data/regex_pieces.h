// Pre-tokenisation by a regular expression, for the patterns ptrain has no scanner for (a
// Hugging Face tokenizer.json's Split, o200k_base's pattern). ICU's regex engine runs it over
// the UTF-8 text; the pattern is written for Rust's regex and Oniguruma, whose \s is Unicode's
// White_Space property, so \s and \S are rewritten to it (ICU's own \s leaves out U+000B and
// U+0085). Every match is a piece, and so is any text between matches (Hugging Face's Split
// with behavior "Isolated").
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include <unicode/uversion.h>

U_NAMESPACE_BEGIN
class RegexPattern;
class RegexMatcher;
U_NAMESPACE_END

namespace ptrain {

// A compiled pattern: immutable, shared by threads. Throws UserError naming `what` when ICU
// cannot compile it.
class PiecePattern {
 public:
  PiecePattern(const std::string& pattern, const std::string& what);
  ~PiecePattern();
  const std::string& text() const { return text_; }
  const icu::RegexPattern& compiled() const { return *compiled_; }

 private:
  std::string text_;
  std::unique_ptr<icu::RegexPattern> compiled_;
};

// One thread's matcher of a PiecePattern.
class RegexPieces {
 public:
  explicit RegexPieces(const PiecePattern& pattern);
  RegexPieces(RegexPieces&&) noexcept;
  ~RegexPieces();

  // Calls `piece(begin, end)` for each piece of valid UTF-8 `text`, in order.
  template <typename F>
  void for_each(std::string_view text, F&& piece) {
    size_t at = 0;
    start(text);
    for (size_t begin, end; next_match(begin, end);) {
      if (begin > at) piece(at, begin);
      if (end > begin) piece(begin, end);
      at = end;
    }
    if (at < text.size()) piece(at, text.size());
  }

 private:
  void start(std::string_view text);
  bool next_match(size_t& begin, size_t& end);

  std::unique_ptr<icu::RegexMatcher> matcher_;
  struct UTextHolder;
  std::unique_ptr<UTextHolder> text_;
};

}  // namespace ptrain
