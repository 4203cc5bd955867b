// GPT-2's byte-level BPE vocabulary: each token is a byte string with a merge priority (lower
// merges first). Read from tiktoken's r50k_base.tiktoken (base64 bytes and rank per line; the
// rank is both the id and the priority) or from a Hugging Face pair, vocab.json (ids of
// byte-to-unicode-mapped strings) and merges.txt (merge order). Immutable once loaded: threads
// share one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ptrain {

// The SHA-256 of r50k_base.tiktoken as npm's gpt-tokenizer@4.0.0 ships it.
constexpr const char* kR50kBaseSha256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930";
constexpr const char* kEndOfText = "<|endoftext|>";

class Gpt2Vocabulary {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  // r50k_base.tiktoken, refused unless its SHA-256 is kR50kBaseSha256 (a corrupted or other
  // vocabulary would give other ids with no error). <|endoftext|> is 50256.
  static Gpt2Vocabulary from_tiktoken_file(const std::string& path);
  // A user's vocab.json + merges.txt. <|endoftext|> must be in vocab.json. A merge applies by
  // the priority of the string it makes, as tiktoken's gpt2 encoding does; a string that two
  // merges make takes the first one's.
  static Gpt2Vocabulary from_hf_files(const std::string& vocab_json, const std::string& merges_txt);

  int size() const { return static_cast<int>(tokens_.size()); }  // <|endoftext|> included
  uint16_t end_of_text() const { return end_of_text_; }
  // SHA-256 over the files read: it tells whether two runs used the same vocabulary.
  const std::string& sha256() const { return sha256_; }
  const std::string& source() const { return source_; }

  // The id of byte string `bytes`, or kNone.
  uint32_t id(std::string_view bytes) const;
  // The merge priority of token `id`.
  uint32_t priority(uint32_t id) const { return priorities_[id]; }
  // The bytes of token `id` (<|endoftext|> as its text).
  std::string_view bytes(uint32_t id) const { return tokens_[id]; }

 private:
  // Checks the ids are 0..n-1 with <|endoftext|> among them and the byte strings distinct,
  // then indexes them. `what` names the files in errors.
  void finish(const std::string& what);
  uint32_t slot_of(std::string_view bytes) const;

  std::vector<std::string> tokens_;  // by id
  std::vector<uint32_t> priorities_;
  std::vector<uint32_t> slots_;  // open addressing over the mergeable tokens: id + 1, 0 = empty
  uint16_t end_of_text_ = 0;
  std::string sha256_, source_;
};

// GPT-2's map from bytes to printable code points, by which vocab.json and merges.txt spell
// byte strings: bytes printable in Latin-1 stand for themselves, the rest for U+0100 onwards.
char32_t gpt2_byte_to_unicode(uint8_t byte);

}  // namespace ptrain
