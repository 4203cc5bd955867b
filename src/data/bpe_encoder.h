// Byte-pair encoding of text, exact to its reference (tiktoken's encode_ordinary, or Hugging
// Face's tokenizers less its special tokens: "<|endoftext|>" in the text is text; added words
// that are not special are cut out first, data/added_words.h). Text is cut into
// pieces (data/pretokenizer.h); within a piece, the adjacent pair of parts with the lowest
// join priority is joined, the leftmost first on ties, until no pair may join. One encoder per
// thread: it caches the ids of pieces it has seen (most of a corpus is a few thousand words).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/bpe_vocabulary.h"
#include "data/pretokenizer.h"

namespace ptrain {

class BpeEncoder {
 public:
  BpeEncoder(const BpeVocabulary& vocabulary, const Pretokenizer& pretokenizer);

  // Appends the ids of valid UTF-8 `text` to `out` (the caller validates: core/utf8.h).
  void encode(std::string_view text, std::vector<uint32_t>& out);

  // The merges of one piece, by rescanning every pair after each merge (quadratic, fast for
  // words) or by a priority queue (n log n, for long pieces such as runs of one character).
  // Public so that a test can check the two agree.
  void merge_by_scan(std::string_view piece, std::vector<uint32_t>& out) const;
  void merge_by_queue(std::string_view piece, std::vector<uint32_t>& out) const;

 private:
  void encode_pieces(std::string_view text, std::vector<uint32_t>& out);  // text with no added words
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out);
  void encode_uncached_piece(std::string_view piece, std::vector<uint32_t>& out);

  // A short piece that is one token, as the recent-piece table keeps it: its bytes zero-padded
  // into three words, its length and its id.
  struct RecentPiece {
    uint64_t words[3] = {0, 0, 0};
    uint32_t id = 0;
    uint32_t length = 0;  // 0: no piece
  };
  static constexpr size_t kRecentPieceBytes = sizeof(RecentPiece::words);

  const BpeVocabulary& vocabulary_;
  const Pretokenizer& pretokenizer_;
  std::optional<RegexSplitter> regex_;  // this thread's matchers, for a regex pretokenizer
  // Most pieces of a text are a few thousand short words, each one token. This direct-mapped
  // table of them fits a core's L2 cache, where a lookup in the vocabulary's index (several
  // MiB) waits on memory. It costs a quarter MiB, so it is made at the first long text.
  std::vector<RecentPiece> recent_;
  std::unordered_map<std::string, std::vector<uint32_t>> cache_;  // any piece's ids
};

}  // namespace ptrain
