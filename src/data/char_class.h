// The character classes the pre-tokenisers' patterns tell apart. They come from the system's
// ICU (Debian 12: ICU 72, Unicode 15.0) with the letters, marks and numbers Unicode 15.1 and
// 16.0 added (data/unicode16_additions.h), so that they are Unicode 16.0's, as the references'
// regex engines have them. The Basic Multilingual Plane is looked up in a table.
#pragma once

#include <array>
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

// The kind of a character beyond ASCII, at byte `i` of valid UTF-8 `text`; `length` gets its
// bytes.
CharKind non_ascii_kind_at(std::string_view text, size_t i, int& length);

// ASCII's kinds: most of most text is ASCII, and a table the compiler can see makes scanning
// it a load per byte.
constexpr CharKind ascii_kind(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return CharKind::upper;
  if (c >= 'a' && c <= 'z') return CharKind::lower;
  if (c >= '0' && c <= '9') return CharKind::number;
  if (c == ' ' || (c >= '\t' && c <= '\r')) return CharKind::space;  // White_Space's ASCII
  return CharKind::other;
}

inline constexpr std::array<CharKind, 128> kAsciiKinds = [] {
  std::array<CharKind, 128> kinds{};
  for (unsigned char c = 0; c < 128; ++c) kinds[c] = ascii_kind(c);
  return kinds;
}();

// The kind of the character at byte `i` of valid UTF-8 `text`; `length` gets its bytes.
inline CharKind char_kind_at(std::string_view text, size_t i, int& length) {
  const auto c = static_cast<unsigned char>(text[i]);
  if (c < 0x80) {
    length = 1;
    return kAsciiKinds[c];
  }
  return non_ascii_kind_at(text, i, length);
}

inline CharClass char_class_at(std::string_view text, size_t i, int& length) {
  return class_of(char_kind_at(text, i, length));
}

// The line breaks the patterns name, [\r\n].
inline bool is_line_break(char c) { return c == '\r' || c == '\n'; }

}  // namespace ptrain
