#include "data/bpe_vocabulary.h"

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>

#include "core/sha256.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/json_input.h"
#include "core/utf8.h"
#include "config/config.h"

namespace ptrain {

namespace {

constexpr int64_t kMaxVocabularyFileBytes = 64 << 20;
constexpr size_t kMaxTokens = kMaxVocab;

std::string read_vocabulary_file(const std::string& path, const std::string& what) {
  return InputFile(path, what + " \"" + path + "\"").read_all(kMaxVocabularyFileBytes);
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with padding; false on anything else.
bool decode_base64(std::string_view text, std::string& out) {
  out.clear();
  if (text.empty() || text.size() % 4 != 0) return false;
  for (size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + k];
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else if (pad > 0 || (v[k] = base64_value(c)) < 0) {
        return false;
      }
    }
    const uint32_t word = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out.push_back(static_cast<char>(word >> 16));
    if (pad < 2) out.push_back(static_cast<char>((word >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(word & 0xFF));
  }
  return true;
}

}  // namespace

char32_t gpt2_byte_to_unicode(uint8_t byte) {
  const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
  if (printable) return byte;
  int n = 0;  // the bytes that are not printable, in order, take U+0100, U+0101, ...
  for (int b = 0; b < byte; ++b) {
    const bool p = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (!p) ++n;
  }
  return 0x100 + n;
}

BpeVocabulary BpeVocabulary::from_tiktoken_file(const std::string& path, const std::string& what,
                                                const std::string& sha256, const std::vector<AddedToken>& specials,
                                                const std::string& hint) {
  const std::string text = read_vocabulary_file(path, what);
  BpeVocabulary v;
  v.sha256_ = sha256_hex(text.data(), text.size());
  v.source_ = path;
  if (v.sha256_ != sha256)
    throw UserError(what + " \"" + path + "\" has SHA-256 " + v.sha256_ + ", expected " + sha256 +
                    ": the file is damaged or another vocabulary; " + hint);
  // The hash pins the content; the parse below still checks it, so a changed pin cannot
  // silently yield a broken table.
  std::istringstream lines(text);
  std::string line, bytes;
  int line_number = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    const size_t space = line.find(' ');
    const std::string rank_text = space == std::string::npos ? "" : line.substr(space + 1);
    if (space == std::string::npos || rank_text.empty() ||
        rank_text.find_first_not_of("0123456789") != std::string::npos || rank_text.size() > 7 ||
        !decode_base64(std::string_view(line).substr(0, space), bytes))
      throw UserError(what + " \"" + path + "\" line " + std::to_string(line_number) +
                      ": expected \"<base64 bytes> <rank>\"");
    const auto rank = static_cast<uint32_t>(std::stoul(rank_text));
    if (rank >= kMaxTokens)
      throw UserError(what + " \"" + path + "\" line " + std::to_string(line_number) + ": rank " + rank_text +
                      " is too large (ids must be below " + std::to_string(kMaxTokens) + ")");
    if (v.tokens_.size() <= rank) {
      v.tokens_.resize(rank + 1);
      v.priorities_.resize(rank + 1, kNone);
    }
    if (v.priorities_[rank] != kNone)
      throw UserError(what + " \"" + path + "\" line " + std::to_string(line_number) + ": rank " + rank_text +
                      " appears twice");
    v.tokens_[rank] = bytes;
    v.priorities_[rank] = rank;
  }
  v.finish(what + " \"" + path + "\"", specials);
  return v;
}

namespace {

// The inverse of gpt2_byte_to_unicode on a UTF-8 string; false when a character is not one of
// its 256 code points, or the string is empty.
bool unspelled(const std::string& mapped, std::string& out) {
  static const std::vector<int> byte_of = [] {
    std::vector<int> t(0x200, -1);
    for (int b = 0; b < 256; ++b) t[gpt2_byte_to_unicode(static_cast<uint8_t>(b))] = b;
    return t;
  }();
  out.clear();
  for (size_t i = 0; i < mapped.size();) {
    const auto b0 = static_cast<uint8_t>(mapped[i]);
    char32_t c;
    if (b0 < 0x80) {
      c = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < mapped.size()) {
      c = ((b0 & 0x1F) << 6) | (static_cast<uint8_t>(mapped[i + 1]) & 0x3F);
      i += 2;
    } else {
      return false;
    }
    if (c >= byte_of.size() || byte_of[c] < 0) return false;
    out.push_back(static_cast<char>(byte_of[c]));
  }
  return !out.empty();
}

}  // namespace

BpeVocabulary BpeVocabulary::from_hf_files(const std::string& vocab_json, const std::string& merges_txt) {
  const std::string vocab_text = read_vocabulary_file(vocab_json, "vocabulary");
  const std::string merges_text = read_vocabulary_file(merges_txt, "merges");
  const size_t bad = first_invalid_utf8(merges_text);
  if (bad != kValidUtf8)
    throw UserError("merges \"" + merges_txt + "\": invalid UTF-8 at byte offset " + std::to_string(bad) +
                    "; expected Hugging Face's merges.txt (text)");
  std::vector<HfMerge> merges;
  std::istringstream lines(merges_text);
  std::string line;
  int line_number = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos)
      throw UserError("merges \"" + merges_txt + "\" line " + std::to_string(line_number) +
                      ": expected two byte strings in GPT-2's byte-to-unicode spelling, separated by a space");
    merges.push_back({line.substr(0, space), line.substr(space + 1),
                      "merges \"" + merges_txt + "\" line " + std::to_string(line_number)});
  }
  Sha256 hash;
  hash.update(vocab_text.data(), vocab_text.size());
  hash.update(merges_text.data(), merges_text.size());
  const std::string what = "vocabulary \"" + vocab_json + "\"";
  const nlohmann::json vocab = parse_json(vocab_text, what);
  // <|endoftext|> is an entry of vocab.json: a special token with the id given there.
  std::vector<AddedToken> added;
  if (vocab.is_object() && vocab.contains(kEndOfText) && vocab[kEndOfText].is_number_unsigned())
    added.push_back({kEndOfText, vocab[kEndOfText].get<uint32_t>()});
  else
    throw UserError(what + ": expected the token \"<|endoftext|>\"");
  return from_hf_model(vocab, merges, added, {}, false, kEndOfText, what, hash.hex_digest(),
                       vocab_json + " + " + merges_txt);
}

BpeVocabulary BpeVocabulary::from_hf_model(const nlohmann::json& vocab, const std::vector<HfMerge>& merges,
                                           const std::vector<AddedToken>& specials,
                                           const std::vector<AddedToken>& words, bool ignore_merges,
                                           const std::string& document_token, const std::string& what,
                                           const std::string& sha256, const std::string& source) {
  if (!vocab.is_object() || vocab.empty() || vocab.size() > kMaxTokens)
    throw UserError(what + ": expected a JSON object of at most " + std::to_string(kMaxTokens) +
                    " \"token\": id entries");
  BpeVocabulary v;
  v.rule_ = Rule::by_pair;
  v.whole_pieces_first_ = ignore_merges;
  v.sha256_ = sha256;
  v.source_ = source;
  std::vector<AddedToken> added = specials;  // the words the vocabulary lacks join them below
  auto added_named = [&](const std::string& text) {
    return std::find_if(added.begin(), added.end(), [&](const AddedToken& s) { return s.text == text; });
  };
  std::map<uint32_t, const AddedToken*> word_with_id;
  for (const AddedToken& w : words) word_with_id[w.id] = &w;
  std::vector<bool> seen;
  std::string bytes;
  for (const auto& [key, value] : vocab.items()) {
    if (!value.is_number_unsigned() || value.get<uint64_t>() >= kMaxTokens)
      throw UserError(what + ": \"" + key + "\" has id " + value.dump() + ", expected 0.." +
                      std::to_string(kMaxTokens - 1));
    const auto id = value.get<uint32_t>();
    if (v.tokens_.size() <= id) {
      v.tokens_.resize(id + 1);
      v.priorities_.resize(id + 1, kNone);
    }
    if (seen.size() <= id) seen.resize(id + 1);
    if (seen[id]) throw UserError(what + ": id " + std::to_string(id) + " appears twice");
    seen[id] = true;
    const auto special = added_named(key);
    if (special != added.end()) {
      if (special->id != id)
        throw UserError(what + ": \"" + key + "\" has id " + std::to_string(id) + " in the vocabulary but " +
                        std::to_string(special->id) + " as an added token; expected one id");
    } else if (!unspelled(key, bytes)) {
      throw UserError(what + ": \"" + key + "\" is not a byte string in GPT-2's byte-to-unicode spelling");
    } else {
      v.tokens_[id] = bytes;
      const auto word = word_with_id.find(id);
      if (word != word_with_id.end()) {
        if (word->second->text != bytes)
          throw UserError(what + ": added token \"" + word->second->text + "\" has id " + std::to_string(id) +
                          ", which the vocabulary gives to \"" + key + "\"; expected the same text");
        word_with_id.erase(word);  // a model token too, as in Hugging Face's tokenizers
      }
    }
  }
  for (const auto& [id, word] : word_with_id) added.push_back(*word);
  // Single bytes come first of all; the merges follow in their order.
  for (uint32_t id = 0; id < v.tokens_.size(); ++id)
    if (v.tokens_[id].size() == 1) v.priorities_[id] = 0;
  v.finish(what, added, document_token);

  std::string left, right;
  for (size_t line = 0; line < merges.size(); ++line) {
    const HfMerge& m = merges[line];
    if (!unspelled(m.left, left) || !unspelled(m.right, right))
      throw UserError(m.where + ": expected two byte strings in GPT-2's byte-to-unicode spelling");
    const uint32_t l = v.id(left), r = v.id(right), id = v.id(left + right);
    for (const auto& [part, part_id] : {std::pair{m.left, l}, {m.right, r}, {m.left + m.right, id}})
      if (part_id == kNone) throw UserError(m.where + ": \"" + part + "\" is not a token of " + what);
    const auto priority = static_cast<uint32_t>(line + 1);
    v.pair_priority_[(uint64_t{l} << 32) | r] = priority;  // a repeated pair takes its last line, as in tokenizers
    if (v.priorities_[id] == kNone) v.priorities_[id] = priority;
  }
  // A token no merge makes stays: with ignore_merges a piece may still be it as a whole.
  return v;
}

void BpeVocabulary::finish(const std::string& what, const std::vector<AddedToken>& specials,
                           const std::string& document_token) {
  for (const AddedToken& special : specials) {
    if (special.id >= kMaxTokens)
      throw UserError(what + ": special token " + special.text + " has id " + std::to_string(special.id) +
                      ", expected below " + std::to_string(kMaxTokens));
    if (tokens_.size() <= special.id) {
      tokens_.resize(special.id + 1);
      priorities_.resize(special.id + 1, kNone);
    }
    if (!tokens_[special.id].empty() && !(tokens_[special.id] == special.text && is_special(special.id)))
      throw UserError(what + ": special token " + special.text + " has id " + std::to_string(special.id) +
                      ", which another token has");
    if (special.text.empty()) throw UserError(what + ": a special token with id " + std::to_string(special.id) + " is empty");
    tokens_[special.id] = special.text;
    if (special_.size() <= special.id) special_.resize(special.id + 1);
    special_[special.id] = true;
    if (special.text == document_token) end_of_text_ = static_cast<int32_t>(special.id);
  }
  specials_ = specials;
  size_t capacity = 1;
  while (capacity < tokens_.size() * 2) capacity <<= 1;
  slots_.assign(capacity, 0);
  for (uint32_t id = 0; id < tokens_.size(); ++id) {
    if (tokens_[id].empty() || is_special(id)) continue;
    const uint64_t hash = std::hash<std::string_view>{}(tokens_[id]);
    const uint32_t slot = slot_of(tokens_[id], hash);
    if (slots_[slot] != 0)
      throw UserError(what + ": tokens " + std::to_string(static_cast<uint32_t>(slots_[slot]) - 1) + " and " +
                      std::to_string(id) + " are the same bytes");
    slots_[slot] = (hash & kHashTag) | (id + 1);
  }
  std::string byte(1, '\0');
  for (int b = 0; b < 256; ++b) {
    byte[0] = static_cast<char>(b);
    if (id(byte) == kNone) throw UserError(what + ": byte " + std::to_string(b) + " has no token");
  }
}

uint32_t BpeVocabulary::slot_of(std::string_view bytes, uint64_t hash) const {
  const size_t mask = slots_.size() - 1;
  size_t slot = hash & mask;
  for (uint64_t entry; (entry = slots_[slot]) != 0; slot = (slot + 1) & mask)
    if ((entry & kHashTag) == (hash & kHashTag) && tokens_[static_cast<uint32_t>(entry) - 1] == bytes) break;
  return static_cast<uint32_t>(slot);
}

uint32_t BpeVocabulary::id(std::string_view bytes) const {
  const uint64_t entry = slots_[slot_of(bytes, std::hash<std::string_view>{}(bytes))];
  return entry == 0 ? kNone : static_cast<uint32_t>(entry) - 1;
}

uint32_t BpeVocabulary::join_priority(std::string_view joined, size_t split) const {
  if (rule_ == Rule::by_rank) {
    const uint32_t joined_id = id(joined);
    return joined_id == kNone ? kNone : priorities_[joined_id];
  }
  const uint32_t left = id(joined.substr(0, split)), right = id(joined.substr(split));
  const auto found = pair_priority_.find((uint64_t{left} << 32) | right);
  return found == pair_priority_.end() ? kNone : found->second;
}

}  // namespace ptrain
