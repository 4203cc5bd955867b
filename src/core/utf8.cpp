#include "core/utf8.h"

namespace ptrain {

namespace {

// The length of the well-formed sequence at text[i], or 0 with `bad_length` set to the length
// of the maximal ill-formed subsequence there (Unicode's "maximal subpart": the longest prefix
// of a well-formed sequence, at least one byte).
int sequence_length(std::string_view text, size_t i, int& bad_length) {
  const auto b0 = static_cast<uint8_t>(text[i]);
  bad_length = 1;
  if (b0 < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte (Unicode Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  for (int k = 1; k < need; ++k) {
    if (i + k >= text.size()) {
      bad_length = k;
      return 0;
    }
    const auto b = static_cast<uint8_t>(text[i + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      bad_length = k;
      return 0;
    }
  }
  return need;
}

}  // namespace

size_t first_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    // ASCII runs 8 bytes at a time: most text is mostly ASCII.
    while (i + 8 <= text.size()) {
      uint64_t word;
      __builtin_memcpy(&word, text.data() + i, 8);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= text.size()) break;
    int bad;
    const int n = sequence_length(text, i, bad);
    if (n == 0) return i;
    i += n;
  }
  return kValidUtf8;
}

size_t complete_utf8_prefix(std::string_view text) {
  // A sequence is at most 4 bytes: look back at most 3 for the last lead byte.
  size_t end = text.size();
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const auto b = static_cast<uint8_t>(text[end - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte
    const int need = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    return need > static_cast<int>(back) ? end - back : end;
  }
  return end;
}

std::string replace_invalid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    int bad;
    const int n = sequence_length(text, i, bad);
    if (n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return out;
}

std::string encode_utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

}  // namespace ptrain
