// The pre-tokenisation of tiktoken's cl100k_base, which Llama 3 also uses: text is cut into
// pieces by the pattern
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// (first alternative that matches wins), found by a scanner over the character classes of
// data/char_class.h instead of a regex engine; tested against ICU's regex on the same pattern
// and against tiktoken and Hugging Face's tokenizers.
#pragma once

#include <cstddef>
#include <string_view>

namespace ptrain {

// The length of (?i:'s|'t|'re|'ve|'m|'ll|'d) at `i` of `text`, 0 if none is there (also
// o200k_base's). Case-insensitive as the references' regex engines fold case: 's' also
// matches U+017F (long s).
size_t contraction_length(std::string_view text, size_t i);

// The end of the piece that starts at `begin` of valid UTF-8 `text` (begin < text.size()).
size_t cl100k_piece_end(std::string_view text, size_t begin);

// The end of the piece \p{N}{1,3} that starts at `begin` (a number), also o200k_base's: a run
// of numbers is cut in threes from its start.
size_t number_piece_end(std::string_view text, size_t begin);

// The end of the piece \s*[\r\n]+|\s+(?!\S)|\s+ that starts at `begin` (white space), the
// last alternatives of cl100k_base's and o200k_base's patterns.
size_t space_piece_end(std::string_view text, size_t begin);

// The first place at or after `from` where `text` may be cut with no piece crossing it (and
// no piece before it reading past it), text.size() if there is none. Before a character h that
// is not white space, after a character p where
// - p is a carriage return or line feed (no piece runs from a line break into text), or
// - p is a letter and h is not (runs of letters end there, and so do contractions), or
// - p is a number and h is not, or p is neither letter, number nor white space and h is a number.
size_t cl100k_safe_cut(std::string_view text, size_t from);

}  // namespace ptrain
