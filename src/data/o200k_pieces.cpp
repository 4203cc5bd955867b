#include "data/o200k_pieces.h"

#include <algorithm>

#include "data/char_class.h"
#include "data/cl100k_pieces.h"

namespace ptrain {

namespace {

constexpr size_t kNone = static_cast<size_t>(-1);

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}]: caseless letters and marks
// are in both.
bool is_upper_side(CharKind k) { return k == CharKind::upper || k == CharKind::caseless || k == CharKind::mark; }
bool is_lower_side(CharKind k) { return k == CharKind::lower || k == CharKind::caseless || k == CharKind::mark; }

// [^\r\n\p{L}\p{N}] at i.
bool is_prefix(std::string_view text, size_t i, CharKind k) {
  return !is_line_break(text[i]) && class_of(k) != CharClass::letter && k != CharKind::number;
}

size_t lower_run_end(std::string_view text, size_t i) {
  int length;
  while (i < text.size() && is_lower_side(char_kind_at(text, i, length))) i += length;
  return i;
}

// [upper side]*[lower side]+ at i, as a backtracking engine matches it: the upper-side run as
// long as it goes, then the lower-side run after it; failing that, the run given back to its
// last character that is on both sides. kNone when nothing matches.
size_t upper_star_lower_plus(std::string_view text, size_t i) {
  int length;
  size_t last_both = kNone, last_both_length = 0;
  for (CharKind k; i < text.size() && is_upper_side(k = char_kind_at(text, i, length)); i += length)
    if (is_lower_side(k)) last_both = i, last_both_length = length;
  if (i < text.size() && is_lower_side(char_kind_at(text, i, length))) return lower_run_end(text, i);
  return last_both == kNone ? kNone : last_both + last_both_length;
}

// [upper side]+[lower side]* at i; kNone when no upper-side character is there.
size_t upper_plus_lower_star(std::string_view text, size_t i) {
  int length;
  const size_t start = i;
  while (i < text.size() && is_upper_side(char_kind_at(text, i, length))) i += length;
  return i == start ? kNone : lower_run_end(text, i);
}

size_t with_contraction(std::string_view text, size_t end) { return end + contraction_length(text, end); }

}  // namespace

size_t o200k_piece_end(std::string_view text, size_t begin) {
  int length;
  const CharKind first = char_kind_at(text, begin, length);
  const size_t second = begin + length;
  const bool prefix = is_prefix(text, begin, first);
  // The two letter alternatives, each first with the optional prefix character, then without.
  for (size_t (*letters)(std::string_view, size_t) : {upper_star_lower_plus, upper_plus_lower_star}) {
    if (prefix && second < text.size())
      if (const size_t end = letters(text, second); end != kNone) return with_contraction(text, end);
    if (const size_t end = letters(text, begin); end != kNone) return with_contraction(text, end);
  }
  if (first == CharKind::number) return number_piece_end(text, begin);
  // " ?[^\s\p{L}\p{N}]+[\r\n/]*": marks are not letters here.
  auto is_symbol = [](CharKind k) { return k == CharKind::other || k == CharKind::mark; };
  int next_length;
  const size_t run = text[begin] == ' ' && second < text.size() && is_symbol(char_kind_at(text, second, next_length))
                         ? second
                     : is_symbol(first) ? begin
                                        : kNone;
  if (run != kNone) {
    size_t end = run;
    while (end < text.size() && is_symbol(char_kind_at(text, end, length))) end += length;
    while (end < text.size() && (is_line_break(text[end]) || text[end] == '/')) ++end;
    return end;
  }
  return space_piece_end(text, begin);
}

size_t o200k_safe_cut(std::string_view text, size_t from) {
  for (size_t i = std::max<size_t>(from, 1); i < text.size(); ++i) {
    if (!is_line_break(text[i - 1]) || text[i] == '/') continue;
    int length;
    if (char_kind_at(text, i, length) != CharKind::space) return i;
  }
  return text.size();
}

}  // namespace ptrain
