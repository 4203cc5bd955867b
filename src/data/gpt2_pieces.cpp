#include "data/gpt2_pieces.h"

#include <cstdint>
#include <vector>

#include "core/utf8.h"
#include "data/char_class.h"

namespace ptrain {

namespace {

struct Scanner {
  std::string_view text;

  CharClass class_at(size_t i, int& length) const { return char_class_at(text, i, length); }
  // The end of the run of class `k` that starts at i.
  size_t run_end(size_t i, CharClass k) const {
    int length;
    while (i < text.size() && class_at(i, length) == k) i += length;
    return i;
  }
  // 's 't 're 've 'm 'll 'd at i (an apostrophe there): the contraction's length, or 0.
  size_t contraction(size_t i) const {
    if (i + 1 >= text.size()) return 0;
    const char a = text[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= text.size()) return 0;
    const char b = text[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
  }
};

}  // namespace

size_t gpt2_piece_end(std::string_view text, size_t begin) {
  const Scanner s{text};
  if (text[begin] == '\'') {
    if (const size_t n = s.contraction(begin)) return begin + n;
  }
  int length;
  const CharClass first = s.class_at(begin, length);
  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": one space may lead a run of another class.
  if (text[begin] == ' ' && begin + 1 < text.size()) {
    int next_length;
    const CharClass next = s.class_at(begin + 1, next_length);
    if (next != CharClass::space) return s.run_end(begin + 1, next);
  }
  if (first != CharClass::space) return s.run_end(begin, first);
  // "\s+(?!\S)": a run of white space, less its last character when a non-space follows (that
  // character may lead the next piece); "\s+" when the run is that one character.
  size_t last = begin, end = begin;
  while (end < text.size()) {
    if (s.class_at(end, length) != CharClass::space) break;
    last = end;
    end += length;
  }
  if (end == text.size() || last == begin) return end;
  return last;
}

size_t gpt2_safe_cut(std::string_view text, size_t from) {
  const Scanner s{text};
  size_t i = from;
  if (i == 0) ++i;  // a cut at 0 cuts nothing off
  while (i < text.size() && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80) ++i;  // to a character's start
  if (i >= text.size()) return text.size();
  // The character before i, and whether white space precedes it.
  size_t prev = i - 1;
  while (prev > 0 && (static_cast<uint8_t>(text[prev]) & 0xC0) == 0x80) --prev;
  int length;
  CharClass before = s.class_at(prev, length);
  bool space_before_prev = false;
  if (prev > 0) {
    size_t pp = prev - 1;
    while (pp > 0 && (static_cast<uint8_t>(text[pp]) & 0xC0) == 0x80) --pp;
    space_before_prev = s.class_at(pp, length) == CharClass::space;
  }
  while (i < text.size()) {
    const CharClass here = s.class_at(i, length);
    if (here != CharClass::space) {
      const char p = text[prev];
      if (before == CharClass::space ? (p != ' ' && !space_before_prev) : (before != here && p != '\'')) return i;
    }
    space_before_prev = before == CharClass::space;
    before = here;
    prev = i;
    i += length;
  }
  return text.size();
}

}  // namespace ptrain
