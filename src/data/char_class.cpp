#include "data/char_class.h"

#include <unicode/uchar.h>

#include <vector>

#include "core/utf8.h"

namespace ptrain {

namespace {

CharClass icu_class(char32_t c) {
  if (u_isUWhiteSpace(static_cast<UChar32>(c))) return CharClass::space;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER: return CharClass::letter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER: return CharClass::number;
    default: return CharClass::other;
  }
}

// The Basic Multilingual Plane's classes, looked up once: ICU's property trie per character
// would be most of the scanner's time.
const std::vector<CharClass>& bmp_classes() {
  static const std::vector<CharClass> table = [] {
    std::vector<CharClass> t(0x10000);
    for (char32_t c = 0; c < 0x10000; ++c) t[c] = icu_class(c);
    return t;
  }();
  return table;
}

}  // namespace

CharClass char_class_at(std::string_view text, size_t i, int& length) {
  static const std::vector<CharClass>& bmp = bmp_classes();
  const char32_t c = decode_utf8(text, i, length);
  return c < 0x10000 ? bmp[c] : icu_class(c);
}

}  // namespace ptrain
