// The pre-tokenisation of tiktoken's o200k_base: text is cut into pieces by the pattern
//   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|...|'d)?|
//   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|...|'d)?|
//   \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// (first alternative that matches wins, each with the backtracking a regex engine does), found
// by a scanner over data/char_class.h's kinds; tested against ICU's regex on the same pattern
// and against tiktoken.
#pragma once

#include <cstddef>
#include <string_view>

namespace ptrain {

// The end of the piece that starts at `begin` of valid UTF-8 `text` (begin < text.size()).
size_t o200k_piece_end(std::string_view text, size_t begin);

// The first place at or after `from` where `text` may be cut with no piece crossing it,
// text.size() if there is none: after a carriage return or line feed, before a character that
// is neither white space nor '/'. No piece runs from a line break into text: the only
// alternatives that take a line break are " ?[^\s\p{L}\p{N}]+[\r\n/]*" (which goes on through
// '/' and more breaks) and the white-space ones (which stop at text); and a piece ending there
// reads nothing past it.
size_t o200k_safe_cut(std::string_view text, size_t from);

}  // namespace ptrain
