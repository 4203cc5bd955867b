#include "data/unicode_normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include "core/error.h"

namespace ptrain {

namespace {

const icu::Normalizer2* instance(UnicodeForm form, UErrorCode& status) {
  switch (form) {
    case UnicodeForm::nfc: return icu::Normalizer2::getNFCInstance(status);
    case UnicodeForm::nfd: return icu::Normalizer2::getNFDInstance(status);
    case UnicodeForm::nfkc: return icu::Normalizer2::getNFKCInstance(status);
    case UnicodeForm::nfkd: return icu::Normalizer2::getNFKDInstance(status);
  }
  return nullptr;
}

}  // namespace

std::string normalize_unicode(std::string_view text, const std::vector<UnicodeForm>& forms) {
  std::string current(text);
  for (const UnicodeForm form : forms) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = instance(form, status);
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(current.size()));
    if (U_SUCCESS(status))
      n->normalizeUTF8(0, icu::StringPiece(current.data(), static_cast<int32_t>(current.size())), sink, nullptr,
                       status);
    PTRAIN_CHECK(U_SUCCESS(status), "ICU could not normalize text");
    current = std::move(out);
  }
  return current;
}

}  // namespace ptrain
