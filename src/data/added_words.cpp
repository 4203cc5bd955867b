#include "data/added_words.h"

#include <algorithm>

namespace ptrain {

AddedWords::AddedWords(std::vector<AddedToken> words) : words_(std::move(words)) {
  std::stable_sort(words_.begin(), words_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.text.size() > b.text.size(); });
  for (const AddedToken& w : words_) first_bytes_[static_cast<unsigned char>(w.text[0])] = true;
}

AddedWordMatch AddedWords::find(std::string_view text, size_t from) const {
  if (!words_.empty())
    for (size_t at = from; at < text.size(); ++at) {
      if (!first_bytes_[static_cast<unsigned char>(text[at])]) continue;
      for (const AddedToken& w : words_)  // longest first
        if (starts_at(text, at, w)) return {at, at + w.text.size(), w.id};
    }
  return {text.size(), text.size(), 0};
}

bool AddedWords::near(std::string_view text, size_t at, size_t before, size_t after) const {
  if (words_.empty()) return false;
  if (at + after > text.size()) return true;
  for (size_t s = at > before ? at - before : 0; s < at + after; ++s) {
    if (!first_bytes_[static_cast<unsigned char>(text[s])]) continue;
    for (const AddedToken& w : words_) {
      const size_t seen = std::min(w.text.size(), text.size() - s);
      if (text.compare(s, seen, std::string_view(w.text).substr(0, seen)) == 0) return true;
    }
  }
  return false;
}

}  // namespace ptrain
