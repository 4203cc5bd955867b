// `ptrain data prepare`: text files to llm.c token shards, streamed in bounded memory. Each file
// (or each part of one, cut at a separator) is a document; with a BPE tokenizer, <|endoftext|>
// precedes each document, as llm.c's data scripts do. The last tokens are held out as the val split.
// Shards are named as llm.c's dev/data scripts name them, <name>_val_000000.bin and
// <name>_train_000000.bin, with <name> the base name of the output directory, and
// ptrain-tokenizer.json beside them records the tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ptrain {

// Tokenizing threads at most: each reads a block of its own (kReadBytes) at a time.
constexpr int kMaxPrepareThreads = 1024;

struct PrepareOptions {
  std::vector<std::string> inputs;  // files, and directories (their files, recursively, sorted)
  std::string out_dir;              // new, or an empty directory
  std::string tokenizer = "gpt2";   // a tokenizer_names() name
  std::string vocabulary;           // its .tiktoken file, or for gpt2 a vocab.json + merges.txt directory
  double val_fraction = 0.1;        // the val split's share of tokens, when val_tokens is 0
  int64_t val_tokens = 0;
  int64_t shard_tokens = 100000000;  // llm.c's fineweb shards hold 100M tokens
  int threads = 0;                   // 0: all the machine's; at most kMaxPrepareThreads
  std::string separator;             // cuts files into documents; "": one document per file
  bool replace_invalid_utf8 = false;  // BPE: U+FFFD for invalid sequences instead of an error
  bool progress = false;              // a progress line on stderr
};

struct PrepareResult {
  int64_t input_bytes = 0;
  int64_t documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  double seconds = 0;              // tokenizing and writing
  std::vector<std::string> files;  // shards written, val first
};

// Checks every option and input before writing anything; a failure part-way (invalid UTF-8
// found in the tenth file) leaves no output. Throws UserError naming the flag or file.
PrepareResult prepare_text(const PrepareOptions& options);

}  // namespace ptrain
