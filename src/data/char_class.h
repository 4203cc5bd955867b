// The character classes the pre-tokenisers' patterns tell apart, from ICU's Unicode data
// (Debian 12: ICU 72, Unicode 15.0), the Basic Multilingual Plane looked up in a table.
#pragma once

#include <cstddef>
#include <string_view>

namespace ptrain {

// \p{L}, \p{N}, \s (Unicode's White_Space) and everything else: disjoint.
enum class CharClass : unsigned char { letter, number, space, other };

// The class of the character at byte `i` of valid UTF-8 `text`; `length` gets its bytes.
CharClass char_class_at(std::string_view text, size_t i, int& length);

}  // namespace ptrain
