#include "data/regex_pieces.h"

#include <unicode/regex.h>
#include <unicode/utext.h>

#include "core/error.h"

namespace ptrain {

namespace {

constexpr int32_t kStackBytes = 256 << 20;

// The pattern in ICU's dialect: \s -> \p{White_Space}, \S -> \P{White_Space}, inside classes
// too; other escapes unchanged. ^ and $ outside a class are refused: Oniguruma (Hugging Face's
// engine) takes them at every line, ICU at the text's ends only.
std::string icu_pattern(const std::string& pattern, const std::string& what) {
  std::string out;
  int class_depth = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '[') {
      ++class_depth;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];  // negation, not an anchor
      continue;
    } else if (c == ']' && class_depth > 0) {
      --class_depth;
    } else if ((c == '^' || c == '$') && class_depth == 0) {
      throw UserError(what + ": the pattern \"" + pattern + "\" has the anchor " + std::string(1, c) +
                      ", which Hugging Face's regex engine and ICU's read differently; expected a pattern "
                      "without ^ and $");
    }
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's')
        out += "\\p{White_Space}";
      else if (next == 'S')
        out += "\\P{White_Space}";
      else
        out += {'\\', next};
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

PiecePattern::PiecePattern(const std::string& pattern, const std::string& what) : text_(pattern) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError where{};
  compiled_.reset(
      icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(icu_pattern(pattern, what)), 0, where, status));
  if (U_FAILURE(status))
    throw UserError(what + ": the pattern \"" + pattern + "\" does not compile (" + u_errorName(status) +
                    " near offset " + std::to_string(where.offset) + ")");
}

PiecePattern::~PiecePattern() = default;

struct RegexPieces::UTextHolder {
  UText* text = nullptr;
  ~UTextHolder() { utext_close(text); }
};

RegexPieces::RegexPieces(const PiecePattern& pattern) : text_(std::make_unique<UTextHolder>()) {
  UErrorCode status = U_ZERO_ERROR;
  matcher_.reset(pattern.compiled().matcher(status));
  // Backtracking over a long run (of white space, say) may need more than ICU's default 8 MB;
  // a pattern that needs more than kStackBytes is refused. (ICU's time limit would count over
  // the whole text, not per match, so none is set.)
  if (U_SUCCESS(status)) matcher_->setStackLimit(kStackBytes, status);
  PTRAIN_CHECK(U_SUCCESS(status), "ICU could not make a matcher of a compiled pattern");
}

RegexPieces::RegexPieces(RegexPieces&&) noexcept = default;
RegexPieces::~RegexPieces() = default;

void RegexPieces::start(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  text_->text = utext_openUTF8(text_->text, text.data(), static_cast<int64_t>(text.size()), &status);
  PTRAIN_CHECK(U_SUCCESS(status), "ICU could not open UTF-8 text");
  matcher_->reset(text_->text);
}

bool RegexPieces::next_match(size_t& begin, size_t& end) {
  UErrorCode status = U_ZERO_ERROR;
  if (!matcher_->find(status)) {
    if (U_FAILURE(status))
      throw UserError(std::string("the pre-tokenizer's pattern failed on the text (ICU: ") + u_errorName(status) +
                      "): it backtracks too deep; expected a pattern such as tiktoken's and Llama 3's");
    return false;
  }
  // Indexes into UTF-8 UText are byte offsets.
  begin = static_cast<size_t>(matcher_->start64(status));
  end = static_cast<size_t>(matcher_->end64(status));
  PTRAIN_CHECK(U_SUCCESS(status), "ICU's regex failed");
  return true;
}

}  // namespace ptrain
