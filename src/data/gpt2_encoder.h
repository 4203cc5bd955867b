// GPT-2's byte-pair encoding of text, exact to tiktoken's gpt2 encoding (encode_ordinary:
// "<|endoftext|>" in the text is text). Text is cut into pieces (data/gpt2_pieces.h); within a
// piece, the adjacent pair whose joined bytes have the lowest merge priority is joined, the
// leftmost first on ties, until no joined pair is a token. One encoder per thread: it caches
// the ids of pieces it has seen (most of a corpus is a few thousand words).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/gpt2_vocabulary.h"

namespace ptrain {

class Gpt2Encoder {
 public:
  explicit Gpt2Encoder(const Gpt2Vocabulary& vocabulary) : vocabulary_(vocabulary) {}

  // Appends the ids of valid UTF-8 `text` to `out` (the caller validates: data/utf8.h).
  void encode(std::string_view text, std::vector<uint16_t>& out);

  // The merges of one piece, by rescanning every pair after each merge (quadratic, fast for
  // words) or by a priority queue (n log n, for long pieces such as runs of one character).
  // Public so that a test can check the two agree.
  void merge_by_scan(std::string_view piece, std::vector<uint16_t>& out) const;
  void merge_by_queue(std::string_view piece, std::vector<uint16_t>& out) const;

 private:
  void encode_piece(std::string_view piece, std::vector<uint16_t>& out);

  const Gpt2Vocabulary& vocabulary_;
  std::unordered_map<std::string, std::vector<uint16_t>> cache_;
};

}  // namespace ptrain
