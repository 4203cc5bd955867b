// A byte-level BPE vocabulary: each token is a byte string, and byte-pair encoding joins the
// parts of a piece of text by a merge priority (lower merges first). Two kinds of rule, as the
// two references apply them:
// - by rank (tiktoken): two adjacent parts may join when their bytes together are a token; the
//   token's rank is the priority. Read from a .tiktoken file (base64 bytes and rank per line).
// - by pair (Hugging Face): two adjacent parts join only when they are the halves of a listed
//   merge; the merge's line is the priority. Read from vocab.json + merges.txt, or a
//   tokenizer.json's model (byte strings spelled by gpt2_byte_to_unicode).
// Special tokens (<|endoftext|> and the like) have ids but never come out of a merge; ids no
// token has (tiktoken's cl100k_base skips some below its specials) are holes. Immutable once
// loaded: threads share one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/huge_pages.h"
#include "data/added_words.h"

namespace ptrain {

constexpr const char* kEndOfText = "<|endoftext|>";

// One line of a Hugging Face merge list: two byte strings in GPT-2's spelling, and where the
// line is (for errors).
struct HfMerge {
  std::string left, right, where;
};

class BpeVocabulary {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  // A .tiktoken file, refused unless its SHA-256 is `sha256` (a corrupted or other vocabulary
  // would give other ids with no error); `what` names it in errors, `hint` says how to get
  // it. The special tokens follow the ranks.
  static BpeVocabulary from_tiktoken_file(const std::string& path, const std::string& what, const std::string& sha256,
                                          const std::vector<AddedToken>& specials, const std::string& hint);
  // A user's vocab.json + merges.txt (GPT-2's layout). <|endoftext|> must be in vocab.json.
  static BpeVocabulary from_hf_files(const std::string& vocab_json, const std::string& merges_txt);
  // A Hugging Face BPE model: `vocab` maps spelled byte strings to ids; the added tokens are
  // special tokens (in `vocab` with the same id, or beside it), and the one whose text is
  // `document_token` marks documents. `words`, added tokens that are not special, are model
  // tokens where `vocab` has their id (with the same bytes), else ids of their own that no
  // merge makes, as special tokens are. `what` names the source in errors.
  static BpeVocabulary from_hf_model(const nlohmann::json& vocab, const std::vector<HfMerge>& merges,
                                     const std::vector<AddedToken>& added, const std::vector<AddedToken>& words,
                                     bool ignore_merges,
                                     const std::string& document_token, const std::string& what,
                                     const std::string& sha256, const std::string& source);

  int size() const { return static_cast<int>(tokens_.size()); }  // one past the largest id
  // The id of the token that marks documents (<|endoftext|> unless said otherwise), or -1 when
  // the vocabulary has none.
  int32_t end_of_text() const { return end_of_text_; }
  // The special tokens, and a tokenizer.json's added words that its model's vocabulary lacks.
  const std::vector<AddedToken>& specials() const { return specials_; }
  // SHA-256 over the files read: it tells whether two runs used the same vocabulary.
  const std::string& sha256() const { return sha256_; }
  const std::string& source() const { return source_; }

  // The id of mergeable byte string `bytes`, or kNone.
  uint32_t id(std::string_view bytes) const;
  // The priority of joining joined[0, split) and joined[split, end), both tokens; kNone when
  // they may not join.
  uint32_t join_priority(std::string_view joined, size_t split) const;
  // Whether a piece that is a token as a whole is that token without merging (tiktoken does
  // this, and so does Hugging Face's BPE with ignore_merges); otherwise it is merged as any
  // other piece, which for a few pieces ends in other parts.
  bool whole_pieces_first() const { return whole_pieces_first_; }
  // The rank or first merge making token `id` (0 for single bytes): the order in which a
  // merges.txt lists them.
  uint32_t priority(uint32_t id) const { return priorities_[id]; }
  // Whether `id` is a token (not a hole).
  bool has(uint32_t id) const { return id < tokens_.size() && !tokens_[id].empty(); }
  // The bytes of token `id` (a special token's as its text).
  std::string_view bytes(uint32_t id) const { return tokens_[id]; }
  bool is_special(uint32_t id) const { return id < special_.size() && special_[id]; }

 private:
  enum class Rule { by_rank, by_pair };
  // Adds the special tokens, checks every mergeable byte string is distinct and every byte has
  // a token, then indexes them. `what` names the files in errors.
  void finish(const std::string& what, const std::vector<AddedToken>& specials,
              const std::string& document_token = kEndOfText);
  // The slot holding `bytes` (whose hash is `hash`), or the empty slot where they would go.
  uint32_t slot_of(std::string_view bytes, uint64_t hash) const;
  static constexpr uint64_t kHashTag = 0xFFFFFFFF00000000;

  Rule rule_ = Rule::by_rank;
  bool whole_pieces_first_ = true;
  std::vector<std::string, HugePageAllocator<std::string>> tokens_;  // by id; "" for a hole
  std::vector<uint32_t> priorities_;
  // Open addressing over the mergeable tokens: (the upper half of the bytes' hash << 32) | id + 1,
  // 0 = empty. A probe compares bytes only where the hashes agree.
  std::vector<uint64_t, HugePageAllocator<uint64_t>> slots_;
  std::unordered_map<uint64_t, uint32_t> pair_priority_;  // by_pair: (left id << 32 | right id) -> line
  std::vector<AddedToken> specials_;
  std::vector<bool> special_;  // by id
  int32_t end_of_text_ = -1;
  std::string sha256_, source_;
};

// GPT-2's map from bytes to printable code points, by which vocab.json and merges.txt spell
// byte strings: bytes printable in Latin-1 stand for themselves, the rest for U+0100 onwards.
char32_t gpt2_byte_to_unicode(uint8_t byte);

}  // namespace ptrain
