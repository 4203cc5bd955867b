// Pre-tokenisation by regular expressions, for the patterns ptrain has no scanner for (a
// Hugging Face tokenizer.json's Splits). ICU's regex engine runs them over the UTF-8 text; the
// patterns are written for Rust's regex and Oniguruma, whose \s is Unicode's White_Space
// property, so \s and \S are rewritten to it (ICU's own \s leaves out U+000B and U+0085), and
// whose Unicode is 16.0, so letter, mark and number properties get 15.1's and 16.0's additions
// (ICU 72 knows 15.0). A Split cuts text into its matches and the text between them, then keeps,
// drops or joins them as its behavior says; several Splits apply in turn, each to the pieces of
// the one before, as Hugging Face's Sequence does.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
  const icu::RegexPattern& compiled() const { return *compiled_; }

 private:
  std::unique_ptr<icu::RegexPattern> compiled_;
};

// What a Split does with its pattern's matches (Hugging Face's SplitDelimiterBehavior): drops
// them, keeps each as a piece, joins each to the piece before or after it, or joins runs of
// matches and runs of text between them. `invert` swaps matches and the text between them.
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct SplitRule {
  std::string pattern;  // a regex
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
};

using Span = std::pair<size_t, size_t>;  // [begin, end) in bytes

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

  // Appends the pieces a Split by this matcher's pattern with `behavior` and `invert` cuts
  // `text` into, offset by `offset`, empty ones left out.
  void split(std::string_view text, SplitBehavior behavior, bool invert, size_t offset, std::vector<Span>& out);

 private:
  void start(std::string_view text);
  bool next_match(size_t& begin, size_t& end);

  static constexpr size_t kNoMatch = static_cast<size_t>(-1);
  std::unique_ptr<icu::RegexMatcher> matcher_;
  size_t last_match_end_ = kNoMatch;  // where the last match reported ended
  struct UTextHolder;
  std::unique_ptr<UTextHolder> text_;
};

// A `prefix_space_at` that puts no space before pieces (RegexSplitter).
inline constexpr size_t kNoPrefixSpace = static_cast<size_t>(-1);

// One thread's matchers of a chain of Splits; none leaves the text one piece. With
// `prefix_space_at` k, each piece the first k Splits leave gets a space in front unless it
// starts with one (ByteLevel's add_prefix_space) before the rest split it.
class RegexSplitter {
 public:
  RegexSplitter(const std::vector<SplitRule>& rules, const std::vector<std::shared_ptr<const PiecePattern>>& patterns,
                size_t prefix_space_at = kNoPrefixSpace);

  // Calls `piece(text)` for each piece of valid UTF-8 `text`, in order (a prefixed piece is
  // valid only during the call).
  template <typename F>
  void for_each(std::string_view text, F&& piece) {
    const auto of = [&](std::string_view whole) {
      return [&piece, whole](size_t begin, size_t end) { piece(whole.substr(begin, end - begin)); };
    };
    if (prefix_space_at_ == kNoPrefixSpace) {
      if (rules_.size() == 1 && rules_[0].behavior == SplitBehavior::isolated && !rules_[0].invert) {
        matchers_[0].for_each(text, of(text));  // the common case, streamed
        return;
      }
      for (const Span& s : pieces(text, 0, rules_.size())) of(text)(s.first, s.second);
      return;
    }
    for (const Span& s : pieces(text, 0, prefix_space_at_)) {
      const std::string_view p = text.substr(s.first, s.second - s.first);
      prefixed_.assign(p.front() == ' ' ? "" : " ");
      prefixed_.append(p);
      for (const Span& t : pieces(prefixed_, prefix_space_at_, rules_.size())) of(prefixed_)(t.first, t.second);
    }
  }

 private:
  // The pieces rules [first, last) cut `text` into.
  std::vector<Span> pieces(std::string_view text, size_t first, size_t last);

  std::vector<SplitRule> rules_;
  std::vector<RegexPieces> matchers_;
  size_t prefix_space_at_;
  std::string prefixed_;
};

}  // namespace ptrain
