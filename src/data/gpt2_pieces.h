// GPT-2's pre-tokenisation: text is cut into pieces, and byte-pair merges never cross a piece's
// edge. The pieces are those of tiktoken's pattern for gpt2/r50k_base,
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// found by a scanner over Unicode character classes (Unicode 16.0's: data/char_class.h) instead
// of a regex engine: it makes the same cuts (tested against ICU's regex and against tiktoken
// itself) at a multiple of the speed. \s is Unicode's White_Space property, as in tiktoken's
// Rust regex.
#pragma once

#include <cstddef>
#include <string_view>

#include "data/char_class.h"

namespace ptrain {

// The end of the piece that starts at `begin` of valid UTF-8 `text` (begin < text.size()).
size_t gpt2_piece_end(std::string_view text, size_t begin);

// The first place at or after `from` where `text` may be cut with no piece crossing it, so
// that the halves tokenize independently to the same ids; text.size() if there is none. Two
// kinds of place qualify, both before a character that is not white space:
// - after a lone white-space character other than the space (a line feed between two lines):
//   it is a piece of its own ("\s+"); a longer run would give its last character to the run's
//   end when cut there ("\s+(?!\S)" matches up to the end of the text);
// - between two characters of different classes, neither white space, the first not an
//   apostrophe: runs of one class end there, and no contraction spans it.
size_t gpt2_safe_cut(std::string_view text, size_t from);

}  // namespace ptrain
