// The tokenizers ptrain prepares data with and decodes samples by: `bytes` (each byte is a
// token, vocab 256, no end-of-text token) and `gpt2` (tiktoken-exact byte-level BPE, 50,257
// tokens, <|endoftext|> = 50256). GPT-2's vocabulary is not in the repository: it is read from
// the cache scripts/fetch-data.sh fills, or from a user's own files.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/paths.h"
#include "data/gpt2_vocabulary.h"

namespace ptrain {

// The GPT-2 vocabulary read when none is named: <cache>/gpt2/r50k_base.tiktoken.
std::string default_gpt2_vocabulary();

class Tokenizer {
 public:
  // "bytes" or "gpt2". For gpt2, `vocabulary` is a .tiktoken file or a directory holding
  // vocab.json and merges.txt; empty means default_gpt2_vocabulary(). Throws UserError naming
  // the file, and how to fetch it, when it is missing or damaged.
  static Tokenizer load(const std::string& name, const std::string& vocabulary = "");

  const std::string& name() const { return name_; }
  int vocab_size() const { return gpt2_ ? gpt2_->size() : 256; }
  bool has_end_of_text() const { return gpt2_ != nullptr; }
  uint16_t end_of_text() const { return gpt2_ ? gpt2_->end_of_text() : 0; }
  // The SHA-256 of the vocabulary's files ("" for bytes).
  std::string vocabulary_sha256() const { return gpt2_ ? gpt2_->sha256() : ""; }
  const Gpt2Vocabulary* gpt2() const { return gpt2_.get(); }

  // The ids of `text`. gpt2 needs valid UTF-8: anything else is a UserError giving `what` and
  // the byte offset of the first invalid byte.
  std::vector<uint16_t> encode(std::string_view text, const std::string& what) const;
  // The bytes ids stand for (gpt2: <|endoftext|> as its text).
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  std::string name_;
  std::shared_ptr<const Gpt2Vocabulary> gpt2_;
};

}  // namespace ptrain
