// The character classes the pre-tokenisers' patterns tell apart. They come from the system's
// ICU (Debian 12: ICU 72, Unicode 15.0) with the letters, marks and numbers Unicode 15.1 and
// 16.0 added (data/unicode16_additions.h), so that they are Unicode 16.0's, as the references'
// regex engines have them. The Basic Multilingual Plane is looked up in a table.
#pragma once

#include <cstddef>
#include <string_view>

namespace ptrain {

// \p{L}, \p{N}, \s (Unicode's White_Space) and everything else: disjoint. GPT-2's and
// cl100k_base's patterns need no more.
enum class CharClass : unsigned char { letter, number, space, other };

// Finer, for o200k_base's pattern, which tells letters by case and counts marks with letters:
// upper \p{Lu}\p{Lt}, lower \p{Ll}, caseless \p{Lm}\p{Lo}, mark \p{M}; the rest as CharClass.
enum class CharKind : unsigned char { upper, lower, caseless, mark, number, space, other };

constexpr CharClass class_of(CharKind k) {
  switch (k) {
    case CharKind::upper:
    case CharKind::lower:
    case CharKind::caseless: return CharClass::letter;
    case CharKind::number: return CharClass::number;
    case CharKind::space: return CharClass::space;
    case CharKind::mark:
    case CharKind::other: break;
  }
  return CharClass::other;
}

// The kind of the character at byte `i` of valid UTF-8 `text`; `length` gets its bytes.
CharKind char_kind_at(std::string_view text, size_t i, int& length);

inline CharClass char_class_at(std::string_view text, size_t i, int& length) {
  return class_of(char_kind_at(text, i, length));
}

// The line breaks the patterns name, [\r\n].
inline bool is_line_break(char c) { return c == '\r' || c == '\n'; }

}  // namespace ptrain
