// A tokenizer.json's normalizer: what Hugging Face's tokenizers does to text before it is
// pre-tokenized, step by step in the file's order. Unicode normalization runs on ICU's
// Normalizer2; lowercasing maps each character alone, as Rust's char::to_lowercase does
// (Unicode 17.0's full mapping without context, as tokenizers 0.23.2's build has it, which the
// oracle tests check: data/unicode_lowercase.h); stripping removes White_Space; a replacement
// finds a literal left to right, without overlaps; a prefix is prepended to text that is not
// empty.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ptrain {

struct NormalizerStep {
  enum class Kind { nfc, nfd, nfkc, nfkd, lowercase, replace, strip, prepend };
  Kind kind = Kind::nfc;
  std::string text;                  // replace: the literal found (not empty); prepend: the prefix
  std::string replacement;           // replace
  bool left = false, right = false;  // strip: at which ends
};

using Normalizer = std::vector<NormalizerStep>;

// Valid UTF-8 `text` after each step of `steps`, in order.
std::string normalize_text(std::string_view text, const Normalizer& steps);

}  // namespace ptrain
