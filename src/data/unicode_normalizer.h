// Unicode normalization of UTF-8 text (ICU's Normalizer2), for tokenizers whose tokenizer.json
// sets a normalizer.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ptrain {

enum class UnicodeForm { nfc, nfd, nfkc, nfkd };

// `text` in each form of `forms`, in order.
std::string normalize_unicode(std::string_view text, const std::vector<UnicodeForm>& forms);

}  // namespace ptrain
