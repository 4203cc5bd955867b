#include "data/cl100k_pieces.h"

#include <cstdint>

#include "data/char_class.h"

namespace ptrain {

namespace {

size_t run_end(std::string_view text, size_t i, CharClass k) {
  int length;
  while (i < text.size() && char_class_at(text, i, length) == k) i += length;
  return i;
}

}  // namespace

size_t contraction_length(std::string_view text, size_t i) {
  if (i >= text.size() || text[i] != '\'') return 0;
  auto letter = [&](size_t at, char lower) {
    if (at >= text.size()) return size_t{0};
    const char c = text[at];
    if (c == lower || c == lower - ('a' - 'A')) return size_t{1};
    if (lower == 's' && at + 1 < text.size() && static_cast<uint8_t>(c) == 0xC5 &&
        static_cast<uint8_t>(text[at + 1]) == 0xBF)
      return size_t{2};
    return size_t{0};
  };
  for (const char single : {'s', 't'})
    if (const size_t n = letter(i + 1, single)) return 1 + n;
  for (const char* pair : {"re", "ve"})
    if (letter(i + 1, pair[0]) && letter(i + 2, pair[1])) return 3;
  if (letter(i + 1, 'm')) return 2;
  if (letter(i + 1, 'l') && letter(i + 2, 'l')) return 3;
  if (letter(i + 1, 'd')) return 2;
  return 0;
}

size_t cl100k_piece_end(std::string_view text, size_t begin) {
  if (const size_t n = contraction_length(text, begin)) return begin + n;
  int length;
  const CharClass first = char_class_at(text, begin, length);
  const size_t second = begin + length;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (first == CharClass::letter) return run_end(text, begin, CharClass::letter);
  int second_length = 0;
  const CharClass next = second < text.size() ? char_class_at(text, second, second_length) : CharClass::space;
  if (first != CharClass::number && !is_line_break(text[begin]) && second < text.size() && next == CharClass::letter)
    return run_end(text, second, CharClass::letter);
  if (first == CharClass::number) return number_piece_end(text, begin);
  // " ?[^\s\p{L}\p{N}]+[\r\n]*"
  const size_t run = text[begin] == ' ' && second < text.size() && next == CharClass::other ? second
                     : first == CharClass::other                                            ? begin
                                                                                            : text.size();
  if (run < text.size()) {
    size_t end = run_end(text, run, CharClass::other);
    while (end < text.size() && is_line_break(text[end])) ++end;
    return end;
  }
  return space_piece_end(text, begin);
}

size_t number_piece_end(std::string_view text, size_t begin) {
  int length;
  size_t end = begin;
  for (int n = 0; n < 3 && end < text.size() && char_class_at(text, end, length) == CharClass::number; ++n)
    end += length;
  return end;
}

size_t space_piece_end(std::string_view text, size_t begin) {
  // The run W of white space from here.
  int length;
  size_t end = begin, last = begin, after_break = 0;
  while (end < text.size() && char_class_at(text, end, length) == CharClass::space) {
    if (is_line_break(text[end])) after_break = end + 1;
    last = end;
    end += length;
  }
  if (after_break) return after_break;            // \s*[\r\n]+: up to W's last line break
  if (end == text.size() || last == begin) return end;  // \s+(?!\S) to the end; \s+ of one
  return last;                                    // \s+(?!\S): W less its last character
}

size_t cl100k_safe_cut(std::string_view text, size_t from) {
  size_t i = from == 0 ? 1 : from;
  while (i < text.size() && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80) ++i;  // to a character's start
  if (i >= text.size()) return text.size();
  size_t prev = i - 1;
  while (prev > 0 && (static_cast<uint8_t>(text[prev]) & 0xC0) == 0x80) --prev;
  int length;
  CharClass before = char_class_at(text, prev, length);
  while (i < text.size()) {
    const CharClass here = char_class_at(text, i, length);
    if (here != CharClass::space) {
      const bool cut = is_line_break(text[prev]) || (before == CharClass::letter && here != CharClass::letter) ||
                       (before == CharClass::number && here != CharClass::number) ||
                       (before == CharClass::other && here == CharClass::number);
      if (cut) return i;
    }
    before = here;
    prev = i;
    i += length;
  }
  return text.size();
}

}  // namespace ptrain
