// ptrain-tokenizer.json, written beside the shards `data prepare` makes: which tokenizer made
// them, so that `train` can check it against the config and the model, and `sample` can decode.
// (Not named tokenizer.json: that is Hugging Face's tokenizer file.) llm.c's own scripts write
// none; such shards are accepted with a warning.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/choices.h"

namespace ptrain {

constexpr const char* kTokenizerRecord = "ptrain-tokenizer.json";

struct TokenizerRecord {
  std::string tokenizer;          // a tokenizer_names() name
  int vocab_size = 0;             // token ids are below this
  int end_of_text = -1;           // the document separator's id, -1: none
  std::string vocabulary_sha256;  // "" for bytes
};

void write_tokenizer_record(const std::string& dir, const TokenizerRecord& record);

// The record in `dir`, or nothing if there is none. Throws UserError naming the file when it
// is malformed.
std::optional<TokenizerRecord> read_tokenizer_record(const std::string& dir);

struct ShardTokenizer {
  std::string tokenizer;          // a tokenizer_names() name, or "" when nothing tells
  std::string vocabulary_sha256;  // the records' ("" without a record, and for bytes)
};
// The tokenizer of a run's shards: the records in the directories of `train` and `val` checked
// against each other, `configured` (data.tokenizer) and `vocab_size` (model.vocab_size).
// Shards without a record (llm.c's) are taken as `configured` with a warning, or, under auto,
// as gpt2 when vocab_size is GPT-2's (50257, or padded up to 50304) and bytes when it is 256,
// also with a warning. Throws UserError naming both sides when they disagree.
ShardTokenizer resolve_shard_tokenizer(const std::vector<std::string>& train, const std::vector<std::string>& val,
                                       TokenizerChoice configured, int vocab_size, std::vector<std::string>& warnings);

}  // namespace ptrain
