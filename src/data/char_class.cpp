#include "data/char_class.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "core/utf8.h"
#include "data/unicode16_additions.h"

namespace ptrain {

namespace {

CharKind kind_of_category(std::string_view category) {
  if (category == "Lu" || category == "Lt") return CharKind::upper;
  if (category == "Ll") return CharKind::lower;
  if (category[0] == 'L') return CharKind::caseless;
  if (category[0] == 'M') return CharKind::mark;
  if (category[0] == 'N') return CharKind::number;
  return CharKind::other;
}

// What Unicode 16.0 made of a code point that ICU calls unassigned.
CharKind added_kind(char32_t c) {
  const auto* end = std::end(kUnicode16Additions);
  const auto* at = std::upper_bound(std::begin(kUnicode16Additions), end, c,
                                    [](char32_t x, const UnicodeAddition& a) { return x < a.first; });
  if (at == std::begin(kUnicode16Additions) || c > (--at)->last) return CharKind::other;
  return kind_of_category(at->category);
}

CharKind icu_kind(char32_t c) {
  if (u_isUWhiteSpace(static_cast<UChar32>(c))) return CharKind::space;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_UPPERCASE_LETTER:
    case U_TITLECASE_LETTER: return CharKind::upper;
    case U_LOWERCASE_LETTER: return CharKind::lower;
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER: return CharKind::caseless;
    case U_NON_SPACING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_ENCLOSING_MARK: return CharKind::mark;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER: return CharKind::number;
    case U_UNASSIGNED: return added_kind(c);
    default: return CharKind::other;
  }
}

// The Basic Multilingual Plane's kinds, looked up once: ICU's property trie per character
// would be most of the scanner's time.
const std::vector<CharKind>& bmp_kinds() {
  static const std::vector<CharKind> table = [] {
    std::vector<CharKind> t(0x10000);
    for (char32_t c = 0; c < 0x10000; ++c) t[c] = icu_kind(c);
    return t;
  }();
  return table;
}

}  // namespace

CharKind non_ascii_kind_at(std::string_view text, size_t i, int& length) {
  static const std::vector<CharKind>& bmp = bmp_kinds();
  const char32_t c = decode_utf8(text, i, length);
  return c < 0x10000 ? bmp[c] : icu_kind(c);
}

}  // namespace ptrain
