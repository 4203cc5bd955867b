// Hugging Face's tokenizer.json, read for the tokenizers ptrain can run exactly: a BPE model over
// GPT-2's byte-to-unicode spelling (byte-level BPE), with
// - a pre-tokenizer that is ByteLevel (with or without GPT-2's regex), alone or at the end of a
//   Sequence of Splits (a regex or a literal, any behavior, inverted or not) and Digits (Llama
//   3's layout: one Split, then ByteLevel without its regex; DeepSeek's: several Splits);
// - no normalizer, or a Sequence of, or one of: Unicode normalization (NFC, NFD, NFKC, NFKD),
//   Lowercase, Strip, Prepend, Replace of a literal (data/text_normalizer.h);
// - ByteLevel's add_prefix_space as tokenizers applies it: a space before each piece of the
//   Splits before it (or the text between added words) that does not start with one;
// - ignore_merges as the file says; added tokens: special ones as special tokens, the others as
//   words cut out of the text (data/added_words.h).
// Anything else is refused by name (a Unigram or WordPiece model, byte-fallback BPE as
// SentencePiece converts, a Metaspace pre-tokenizer, a Replace by a regex, an added word's
// single_word, lstrip or rstrip, ...), so that a file ptrain would tokenize differently from
// Hugging Face is never used.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/added_words.h"
#include "data/bpe_vocabulary.h"
#include "data/regex_pieces.h"
#include "data/text_normalizer.h"

namespace ptrain {

struct TokenizerJson {
  std::shared_ptr<const BpeVocabulary> vocabulary;  // its sha256() is the file's
  std::vector<SplitRule> splits;                    // the pre-tokenizer's, in order
  size_t prefix_space_at = kNoPrefixSpace;          // ByteLevel's add_prefix_space (RegexSplitter)
  Normalizer normalizer;                            // empty: none
  AddedWords raw_words, normalized_words;           // added tokens that are not special
};

// Reads `path`; `document_token` names the added token that marks documents ("" picks
// <|endoftext|> when the file has it, else none); a non-empty `sha256` is the only content
// taken (`hint` then says where the right file comes from). Throws UserError naming the file
// and the part of it that ptrain cannot run.
TokenizerJson read_tokenizer_json(const std::string& path, const std::string& document_token,
                                  const std::string& sha256 = "", const std::string& hint = "");

}  // namespace ptrain
