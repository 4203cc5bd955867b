#include "data/text_normalizer.h"

#include <algorithm>

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include "core/error.h"
#include "core/utf8.h"
#include "data/char_class.h"
#include "data/unicode_lowercase.h"

namespace ptrain {

namespace {

using Kind = NormalizerStep::Kind;

std::string unicode_form(std::string_view text, Kind form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = form == Kind::nfc    ? icu::Normalizer2::getNFCInstance(status)
                              : form == Kind::nfd  ? icu::Normalizer2::getNFDInstance(status)
                              : form == Kind::nfkc ? icu::Normalizer2::getNFKCInstance(status)
                                                   : icu::Normalizer2::getNFKDInstance(status);
  std::string out;
  icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
  if (U_SUCCESS(status))
    n->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), sink, nullptr, status);
  PTRAIN_CHECK(U_SUCCESS(status), "ICU could not normalize text");
  return out;
}

std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x80) {  // most text: ASCII
      out.push_back(byte >= 'A' && byte <= 'Z' ? static_cast<char>(byte + ('a' - 'A')) : static_cast<char>(byte));
      ++i;
      continue;
    }
    int length = 0;
    const char32_t c = decode_utf8(text, i, length);
    const auto* end = std::end(kUnicodeLowercase);
    const auto* found = std::lower_bound(std::begin(kUnicodeLowercase), end, c,
                                         [](const LowercaseMapping& m, char32_t x) { return m.from < x; });
    if (found != end && found->from == c) {
      out += encode_utf8(found->first);
      if (found->second != 0) out += encode_utf8(found->second);
    } else {
      out.append(text.substr(i, static_cast<size_t>(length)));
    }
    i += static_cast<size_t>(length);
  }
  return out;
}

std::string replace(std::string_view text, const std::string& literal, const std::string& replacement) {
  std::string out;
  size_t at = 0;
  for (size_t found; (found = text.find(literal, at)) != std::string_view::npos; at = found + literal.size()) {
    out.append(text.substr(at, found - at));
    out += replacement;
  }
  out.append(text.substr(at));
  return out;
}

// Without White_Space at the ends `left` and `right` say.
std::string strip(std::string_view text, bool left, bool right) {
  size_t begin = 0, end = 0;  // the first character that is not White_Space, and the end of the last
  bool seen = false;
  for (size_t i = 0; i < text.size();) {
    int length = 0;
    const bool space = char_kind_at(text, i, length) == CharKind::space;
    if (!space && !seen) begin = i;
    if (!space) end = i + static_cast<size_t>(length);
    seen = seen || !space;
    i += static_cast<size_t>(length);
  }
  if (!seen) return (left || right) ? std::string() : std::string(text);
  return std::string(text.substr(left ? begin : 0, (right ? end : text.size()) - (left ? begin : 0)));
}

}  // namespace

std::string normalize_text(std::string_view text, const Normalizer& steps) {
  std::string current(text);
  for (const NormalizerStep& step : steps) {
    switch (step.kind) {
      case Kind::nfc:
      case Kind::nfd:
      case Kind::nfkc:
      case Kind::nfkd: current = unicode_form(current, step.kind); break;
      case Kind::lowercase: current = lowercase(current); break;
      case Kind::replace: current = replace(current, step.text, step.replacement); break;
      case Kind::strip: current = strip(current, step.left, step.right); break;
      case Kind::prepend:
        if (!current.empty()) current.insert(0, step.text);
        break;
    }
  }
  return current;
}

}  // namespace ptrain
