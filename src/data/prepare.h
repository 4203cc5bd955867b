// Byte-level tokenization (vocab 256) of text files into llm.c token shards.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ptrain {

struct PrepareResult {
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::vector<std::string> files;  // shards written
};

// Concatenates the input files' bytes (in the given order), puts the last `val_fraction` of
// them in val shards and the rest in train shards of at most `shard_tokens` tokens each:
// <out_dir>/train_NNNNNN.bin, <out_dir>/val_NNNNNN.bin. Throws UserError on unreadable input
// or a val_fraction outside (0, 1).
PrepareResult prepare_bytes(const std::vector<std::string>& inputs, const std::string& out_dir,
                            double val_fraction, int64_t shard_tokens = 100000000);

}  // namespace ptrain
