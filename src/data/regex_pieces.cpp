#include "data/regex_pieces.h"

#include <unicode/regex.h>
#include <unicode/utext.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <set>
#include <vector>

#include "core/error.h"
#include "data/unicode16_additions.h"

namespace ptrain {

namespace {

constexpr int32_t kStackBytes = 256 << 20;

// The general categories a property of \p{..} names, matched loosely as the regex engines match
// names (case, spaces, '_' and '-' ignored; "gc=" allowed); empty when it names none.
std::string loose_name(const std::string& property) {
  std::string name;
  for (const char c : property)
    if (c != ' ' && c != '_' && c != '-') name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

std::set<std::string> categories_named(const std::string& property) {
  std::string name = loose_name(property);
  for (const char* prefix : {"gc=", "generalcategory="})
    if (name.rfind(prefix, 0) == 0) name.erase(0, std::string(prefix).size());
  // Each category's short and long names, then each group's.
  static const std::map<std::string, std::set<std::string>> kNames = [] {
    const std::vector<std::pair<std::string, std::string>> categories = {
        {"Lu", "uppercaseletter"},      {"Ll", "lowercaseletter"},    {"Lt", "titlecaseletter"},
        {"Lm", "modifierletter"},       {"Lo", "otherletter"},        {"Mn", "nonspacingmark"},
        {"Mc", "spacingmark"},          {"Me", "enclosingmark"},      {"Nd", "decimalnumber"},
        {"Nl", "letternumber"},         {"No", "othernumber"},        {"Pc", "connectorpunctuation"},
        {"Pd", "dashpunctuation"},      {"Ps", "openpunctuation"},    {"Pe", "closepunctuation"},
        {"Pi", "initialpunctuation"},   {"Pf", "finalpunctuation"},   {"Po", "otherpunctuation"},
        {"Sm", "mathsymbol"},           {"Sc", "currencysymbol"},     {"Sk", "modifiersymbol"},
        {"So", "othersymbol"},          {"Zs", "spaceseparator"},     {"Zl", "lineseparator"},
        {"Zp", "paragraphseparator"},   {"Cc", "control"},            {"Cf", "format"},
        {"Co", "privateuse"},           {"Cn", "unassigned"}};
    const std::vector<std::pair<std::string, std::string>> groups = {
        {"l", "letter"}, {"m", "mark"}, {"n", "number"}, {"p", "punctuation"}, {"s", "symbol"},
        {"z", "separator"}, {"c", "other"}};
    std::map<std::string, std::set<std::string>> names;
    for (const auto& [code, long_name] : categories) {
      std::string lower = code;
      lower[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(lower[0])));
      names[lower] = names[long_name] = {code};
      for (const auto& [letter, group] : groups)
        if (letter[0] == lower[0]) names[letter].insert(code), names[group].insert(code);
    }
    names["lc"] = names["casedletter"] = {"Lu", "Ll", "Lt"};
    names["combiningmark"] = names["m"];
    names["digit"] = names["nd"];
    names["punct"] = names["p"];
    return names;
  }();
  const auto it = kNames.find(name);
  return it == kNames.end() ? std::set<std::string>{} : it->second;
}

bool is_white_space_name(const std::string& property) {
  const std::string name = loose_name(property);
  return name == "whitespace" || name == "space";
}

// `set` (an ICU set expression such as \p{L}, of `categories`) as Unicode 16.0 has it, negated
// when `negate`: ICU 72 knows Unicode 15.0, so the code points 15.1 and 16.0 assigned to these
// categories join it, and where the set holds unassigned code points (Cn), those assigned to
// others leave it.
std::string with_additions(const std::string& set, const std::set<std::string>& categories, bool negate) {
  std::string joining, leaving;
  char hex[40];
  for (const UnicodeAddition& a : kUnicode16Additions) {
    std::snprintf(hex, sizeof hex, "\\x{%X}-\\x{%X}", static_cast<unsigned>(a.first), static_cast<unsigned>(a.last));
    if (categories.count(a.category)) joining += hex;
    else if (categories.count("Cn")) leaving += hex;
  }
  if (joining.empty() && leaving.empty() && !negate) return set;
  std::string out = "[" + set + joining + "]";
  if (!leaving.empty()) out = "[" + out + "--[" + leaving + "]]";
  return negate ? "[^" + out + "]" : out;
}

// The pattern in ICU's dialect: \s -> \p{White_Space}, \S -> \P{White_Space}, inside classes
// too; \p{..}, \P{..} of a general category and \d, \D with Unicode 16.0's additions; other
// escapes unchanged. What the additions cannot mend is refused: other properties (scripts,
// Alphabetic), \w and \b (which the engines also define otherwise), POSIX classes. ^ and $ outside a class are refused: Oniguruma (Hugging Face's
// engine) takes them at every line, ICU at the text's ends only.
std::string icu_pattern(const std::string& pattern, const std::string& what) {
  const auto refuse = [&](const std::string& part) {
    throw UserError(what + ": the pattern \"" + pattern + "\" uses " + part +
                    ", which ptrain cannot match as Hugging Face's and tiktoken's engines do (ICU 72 knows Unicode "
                    "15.0, or reads it otherwise); expected general categories such as \\p{L}, \\p{Lu}, \\p{N}, "
                    "\\p{P}, and \\s, \\d");
  };
  std::string out;
  int class_depth = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '[') {
      if (i + 1 < pattern.size() && pattern[i + 1] == ':') refuse("a POSIX class [:...:]");
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
      if (next == 's') {
        out += "\\p{White_Space}";
      } else if (next == 'S') {
        out += "\\P{White_Space}";
      } else if (next == 'd' || next == 'D') {
        out += with_additions("\\d", {"Nd"}, next == 'D');
      } else if (next == 'w' || next == 'W' || next == 'b' || next == 'B') {
        refuse(std::string("\\") + next);
      } else if (next == 'p' || next == 'P') {
        // \p{Name}, \p{^Name}, or \pN with a one-letter name.
        const size_t close = pattern.find('}', i);
        const bool braced = i + 1 < pattern.size() && pattern[i + 1] == '{' && close != std::string::npos;
        if (!braced && i + 1 >= pattern.size()) refuse(std::string("\\") + next + " without a name");
        std::string name = braced ? pattern.substr(i + 2, close - i - 2) : pattern.substr(i + 1, 1);
        i = braced ? close : i + 1;
        bool negate = next == 'P';
        if (!name.empty() && name[0] == '^') {  // \p{^L}: not a letter
          negate = !negate;
          name.erase(0, 1);
        }
        const std::set<std::string> categories = categories_named(name);
        if (categories.empty() && !is_white_space_name(name)) refuse("\\p{" + name + "}");
        out += with_additions("\\p{" + name + "}", categories, negate);
      } else {
        out += {'\\', next};
      }
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

PiecePattern::PiecePattern(const std::string& pattern, const std::string& what) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError where{};
  const std::string icu_form = icu_pattern(pattern, what);
  compiled_.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(icu_form), 0, where, status));
  // An offset into the rewritten pattern would point nowhere in the user's.
  if (U_FAILURE(status))
    throw UserError(what + ": the pattern \"" + pattern + "\" does not compile (" + u_errorName(status) +
                    (icu_form == pattern ? " near offset " + std::to_string(where.offset) : std::string()) + ")");
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
  last_match_end_ = kNoMatch;
  UErrorCode status = U_ZERO_ERROR;
  text_->text = utext_openUTF8(text_->text, text.data(), static_cast<int64_t>(text.size()), &status);
  PTRAIN_CHECK(U_SUCCESS(status), "ICU could not open UTF-8 text");
  matcher_->reset(text_->text);
}

bool RegexPieces::next_match(size_t& begin, size_t& end) {
  UErrorCode status = U_ZERO_ERROR;
  for (;;) {
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
    // Hugging Face's regex iteration (the onig crate's find_iter, as tokenizers 0.23 has it)
    // passes over an empty match where the match before it ended; ICU reports it. Both then
    // search on from the character after it.
    if (begin == end && end == last_match_end_) continue;
    last_match_end_ = end;
    return true;
  }
}

void RegexPieces::split(std::string_view text, SplitBehavior behavior, bool invert, size_t offset,
                        std::vector<Span>& out) {
  // The matches and the text between them, each marked, as Hugging Face's find_matches gives
  // them (an empty match included: it can part what a join would join).
  struct Part {
    size_t begin, end;
    bool match;
  };
  std::vector<Part> parts;
  size_t at = 0;
  start(text);
  for (size_t begin, end; next_match(begin, end);) {
    if (begin > at) parts.push_back({at, begin, invert});
    parts.push_back({begin, end, !invert});
    at = end;
  }
  if (at < text.size()) parts.push_back({at, text.size(), invert});

  // Hugging Face's folds over them: (begin, end, removed).
  std::vector<Part> kept;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::isolated:
      for (const Part& p : parts) kept.push_back({p.begin, p.end, false});
      break;
    case SplitBehavior::removed: kept = parts; break;
    case SplitBehavior::contiguous:
      for (const Part& p : parts) {
        if (p.match == previous_match && !kept.empty()) kept.back().end = p.end;
        else kept.push_back({p.begin, p.end, false});
        previous_match = p.match;
      }
      break;
    case SplitBehavior::merged_with_previous:
      for (const Part& p : parts) {
        if (p.match && !previous_match && !kept.empty()) kept.back().end = p.end;
        else kept.push_back({p.begin, p.end, false});
        previous_match = p.match;
      }
      break;
    case SplitBehavior::merged_with_next:
      for (auto p = parts.rbegin(); p != parts.rend(); ++p) {
        if (p->match && !previous_match && !kept.empty()) kept.back().begin = p->begin;
        else kept.push_back({p->begin, p->end, false});
        previous_match = p->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  for (const Part& p : kept)
    if (!p.match && p.end > p.begin) out.emplace_back(offset + p.begin, offset + p.end);
}

RegexSplitter::RegexSplitter(const std::vector<SplitRule>& rules,
                             const std::vector<std::shared_ptr<const PiecePattern>>& patterns,
                             size_t prefix_space_at)
    : rules_(rules), prefix_space_at_(prefix_space_at) {
  PTRAIN_CHECK(prefix_space_at == kNoPrefixSpace || prefix_space_at <= rules.size(), "a prefix space past the Splits");
  for (const auto& p : patterns) matchers_.emplace_back(*p);
}

std::vector<Span> RegexSplitter::pieces(std::string_view text, size_t first, size_t last) {
  std::vector<Span> spans, next;
  if (!text.empty()) spans.emplace_back(0, text.size());
  for (size_t k = first; k < last; ++k) {
    next.clear();
    for (const Span& s : spans) matchers_[k].split(text.substr(s.first, s.second - s.first), rules_[k].behavior, rules_[k].invert, s.first,
                         next);
    spans.swap(next);
  }
  return spans;
}

}  // namespace ptrain
