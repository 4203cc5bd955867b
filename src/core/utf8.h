// UTF-8 as text files hold it: validation (naming the first bad byte), replacement of invalid
// sequences, and decoding one code point of text already validated. GPT-2's tokenizer works on
// valid UTF-8 only: tiktoken encodes a Python str, which cannot hold an invalid byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ptrain {

constexpr size_t kValidUtf8 = static_cast<size_t>(-1);

// The byte offset of the first byte that does not begin a well-formed sequence (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF), or kValidUtf8. A sequence cut off
// by the end of `text` is invalid.
size_t first_invalid_utf8(std::string_view text);

// The longest prefix of `text` that ends on a code point boundary: an incomplete sequence at
// the end (text cut mid-character by a read) is left for the next piece.
size_t complete_utf8_prefix(std::string_view text);

// `text` with each maximal ill-formed subsequence replaced by U+FFFD, as Python's
// bytes.decode("utf-8", errors="replace") and the WHATWG decoder (node's TextDecoder) do.
std::string replace_invalid_utf8(std::string_view text);

// The code point starting at text[i] of valid UTF-8, and its length in bytes.
// The UTF-8 bytes of code point `c` (below U+110000, not a surrogate).
std::string encode_utf8(char32_t c);

inline char32_t decode_utf8(std::string_view text, size_t i, int& length) {
  const auto b0 = static_cast<uint8_t>(text[i]);
  if (b0 < 0x80) {
    length = 1;
    return b0;
  }
  auto cont = [&](size_t k) { return static_cast<char32_t>(static_cast<uint8_t>(text[i + k]) & 0x3F); };
  if (b0 < 0xE0) {
    length = 2;
    return (static_cast<char32_t>(b0 & 0x1F) << 6) | cont(1);
  }
  if (b0 < 0xF0) {
    length = 3;
    return (static_cast<char32_t>(b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
  }
  length = 4;
  return (static_cast<char32_t>(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
}

}  // namespace ptrain
